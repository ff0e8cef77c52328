//! The appliance's side of high availability: starts the leadership module
//! with this replica's settings; DHCP follows the role in
//! `causeway_dhcp::ha`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use causeway_config::{HaConfig, HaMode};
use causeway_dhcp::ha::HaDhcpSettings;
use causeway_route::FloatingAddresses;
use causeway_runtime::ha::advert::AdvertKey;
use causeway_runtime::ha::{HaMetrics, HaSettings, Leadership, Mode, NoWitness, Timers, VlanPath};

/// The shortest shared key accepted.
const MIN_KEY: usize = 16;

pub struct HaRuntime {
    pub leadership: Leadership,
    /// How DHCP replicates under this role (`causeway_dhcp::ha`).
    pub dhcp: HaDhcpSettings,
}

/// This replica's name: the config's, else `CAUSEWAY_HA_NODE`, else the
/// host name (a StatefulSet pod's name).
fn node_name(cfg: &HaConfig) -> anyhow::Result<String> {
    if let Some(n) = &cfg.node {
        return Ok(n.clone());
    }
    if let Ok(n) = std::env::var("CAUSEWAY_HA_NODE") {
        if !n.is_empty() {
            return Ok(n);
        }
    }
    Ok(nix::unistd::gethostname()
        .context("reading the host name (for ha.node)")?
        .to_string_lossy()
        .into_owned())
}

pub fn read_key(cfg: &HaConfig) -> anyhow::Result<Vec<u8>> {
    let raw = std::fs::read(&cfg.key_file)
        .with_context(|| format!("ha.keyFile {}", cfg.key_file.display()))?;
    let key = raw.trim_ascii().to_vec();
    if key.len() < MIN_KEY {
        anyhow::bail!(
            "ha.keyFile {}: {} bytes; the shared key needs at least {MIN_KEY}",
            cfg.key_file.display(),
            key.len()
        );
    }
    Ok(key)
}

/// Removes the service addresses from the interface, whoever put them
/// there: a replica holds them only once the election gives it the role.
/// Failures are logged, not fatal: the election's own start tries again.
pub async fn release_left_addresses(cfg: &HaConfig) {
    let released = match FloatingAddresses::new(&cfg.interface, cfg.addresses.clone()) {
        Ok(addresses) => addresses
            .with_v6(cfg.addresses_v6.clone())
            .release()
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match released {
        Ok(()) => {
            tracing::info!(interface = %cfg.interface, "service addresses cleared before start")
        }
        Err(e) => {
            tracing::warn!(interface = %cfg.interface, error = %e, "cannot clear the service addresses before start")
        }
    }
}

/// `causeway ha-release`: removes the service addresses named by the
/// config's `ha` section, and says which it removed. Without an `ha`
/// section there is nothing to remove.
pub fn release_now(config: &std::path::Path) -> anyhow::Result<()> {
    let cfg = causeway_config::Config::load(config)
        .map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
    let Some(ha) = cfg.ha else {
        return Ok(());
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a runtime for netlink")?;
    runtime.block_on(async {
        let addresses = FloatingAddresses::new(&ha.interface, ha.addresses.clone())
            .with_context(|| format!("opening netlink for {}", ha.interface))?
            .with_v6(ha.addresses_v6.clone());
        let held = addresses.held().await.unwrap_or_default();
        addresses
            .release()
            .await
            .with_context(|| format!("removing the service addresses from {}", ha.interface))?;
        for net in held {
            println!("removed {net} from {}", ha.interface);
        }
        Ok(())
    })
}

/// Starts the election. The highest term held or heard is kept beside the
/// DHCP lease file (`<lease file>.ha-term`), the state a takeover is about.
pub async fn start(
    cfg: &HaConfig,
    lease_file: Option<&std::path::Path>,
    registry: &prometheus::Registry,
) -> anyhow::Result<HaRuntime> {
    let name = node_name(cfg)?;
    let Some((me, peer)) = cfg.split(&name) else {
        anyhow::bail!(
            "this replica is {name:?}, which is neither ha.replicas[0].name ({}) nor ha.replicas[1].name ({}); set ha.node or CAUSEWAY_HA_NODE",
            cfg.replicas[0].name,
            cfg.replicas[1].name
        );
    };
    let key = read_key(cfg)?;
    let listen = match cfg.listen {
        Some(l) => l,
        None => {
            let port = me
                .address
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .context("ha.replicas: this replica's address has no port")?;
            SocketAddr::from(([0, 0, 0, 0], port))
        }
    };
    causeway_runtime::ha::set_floating(
        cfg.addresses
            .iter()
            .map(|n| IpAddr::V4(n.addr()))
            .chain(cfg.addresses_v6.iter().map(|n| IpAddr::V6(n.addr())))
            .collect(),
    );
    let dead_after = cfg.dead_after();
    let (mode, api_timeout, renew_interval) = match (&cfg.mode, &cfg.lease) {
        (HaMode::Lease, Some(l)) => (Mode::Lease, l.api_timeout, l.renew_interval),
        _ => (Mode::Peer, Duration::from_secs(1), Duration::from_secs(60)),
    };
    let settings = HaSettings {
        mode,
        name: me.name.clone(),
        peer_name: peer.name.clone(),
        peer_address: peer.address.clone(),
        listen,
        listen_interface: cfg.listen_interface.clone(),
        priority: me.priority,
        preempt: cfg.preempt,
        timers: Timers {
            advert: cfg.advert_interval,
            dead_after,
            api_timeout,
            renew_interval,
            degraded_renew: Duration::from_secs(5),
        },
        key: key.clone(),
        replicates_leases: lease_file.is_some(),
        vlan_path: match (me.vlan_address, peer.vlan_address) {
            (Some(listen), Some(peer)) => Some(VlanPath {
                listen,
                peer,
                interface: cfg.interface.clone(),
            }),
            _ => None,
        },
        track_interface: Some(cfg.interface.clone()),
        term_file: lease_file.map(|f| {
            let mut name = f.as_os_str().to_owned();
            name.push(".ha-term");
            std::path::PathBuf::from(name)
        }),
    };
    let metrics = HaMetrics::new(registry).context("registering the HA metrics")?;
    let addresses = Arc::new(
        FloatingAddresses::new(&cfg.interface, cfg.addresses.clone())
            .context("opening netlink for the service addresses")?
            .with_v6(cfg.addresses_v6.clone()),
    );
    let leadership = match mode {
        Mode::Peer => Leadership::start(settings, addresses, None::<Arc<NoWitness>>, metrics).await,
        Mode::Lease => {
            let lease = cfg.lease.as_ref().context("ha.lease")?;
            let witness = crate::witness::LeaseWitness::connect(lease, &me.name)
                .await
                .context("the Kubernetes Lease (ha.lease)")?;
            Leadership::start(settings, addresses, Some(Arc::new(witness)), metrics).await
        }
    }
    .with_context(|| format!("binding the HA advert socket {listen}"))?;
    tracing::info!(
        node = %me.name,
        peer = %peer.name,
        peer_address = %peer.address,
        %listen,
        mode = ?cfg.mode,
        addresses = ?cfg.addresses,
        "high availability: standing by until the election decides"
    );
    Ok(HaRuntime {
        leadership,
        dhcp: HaDhcpSettings {
            share: causeway_dhcp::merge::Share::of(&me.name, &peer.name),
            key: Arc::new(AdvertKey::new(&key)),
            peer_address: peer.address.clone(),
            listen,
            listen_interface: cfg.listen_interface.clone(),
            replication_timeout: cfg.replication_timeout,
        },
    })
}
