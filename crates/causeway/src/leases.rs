//! `causeway leases`: the lease store as the server would load it.

use std::path::Path;

use anyhow::{bail, Context};
use causeway_config::Config;
use causeway_dhcp::{read_log, unix_now, Engine, LeaseRecord, LeaseState};

use crate::out::outln;

pub fn run(config: &Path, json: bool) -> anyhow::Result<()> {
    let cfg = Config::load(config)?;
    let Some(dhcp) = cfg.dhcp else {
        bail!(
            "{}: DHCP is not enabled, so there is no lease store",
            config.display()
        );
    };
    let log = read_log(&dhcp.lease_file)
        .with_context(|| format!("reading {}", dhcp.lease_file.display()))?;
    // The engine's own recovery decides what each record means, so this
    // list is exactly what a restarted server would hold.
    let mut engine = Engine::new(&dhcp);
    engine.restore(&log.records);
    let mut leases: Vec<LeaseRecord> = engine.leases().map(|l| l.to_record()).collect();
    // DHCPv6 leases share the log; the v6 engine's recovery reads them.
    if let Some(v6) = cfg
        .dhcp6
        .as_ref()
        .and_then(|d6| causeway_dhcp::lease6::Leases6::new(d6, Vec::new()))
        .map(|mut v6| {
            v6.restore(&log.records);
            v6
        })
    {
        leases.extend(v6.records());
    }
    leases.sort_by_key(|r| r.ip);
    if json {
        outln!("{}", serde_json::to_string_pretty(&leases)?)?;
        return Ok(());
    }
    let now = unix_now();
    outln!(
        "{:<24} {:<9} {:<12} {:<20} {:<24} HOSTNAME",
        "ADDRESS",
        "STATE",
        "EXPIRES",
        "MAC",
        "CLIENT"
    )?;
    for l in &leases {
        let state = match l.state {
            LeaseState::Active if l.expires <= now => "expired",
            LeaseState::Active => "active",
            LeaseState::Offered => "offered",
            LeaseState::Released => "released",
            LeaseState::Declined => "declined",
        };
        let expires = if l.expires > now {
            format!("in {}", human(l.expires - now))
        } else {
            "-".into()
        };
        outln!(
            "{:<24} {:<9} {:<12} {:<20} {:<24} {}",
            l.ip,
            state,
            expires,
            l.hw,
            l.client,
            l.hostname.as_deref().unwrap_or("-")
        )?;
    }
    if log.corrupt_lines > 0 {
        eprintln!(
            "warning: {} unreadable line(s) in {} were skipped",
            log.corrupt_lines,
            dhcp.lease_file.display()
        );
    }
    Ok(())
}

fn human(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}
