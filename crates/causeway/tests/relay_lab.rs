//! A real DHCP relay agent between causeway and its clients: ISC's
//! `dhcrelay` routed onto the VLAN, relaying for a client segment of its
//! own, with `dhclient` behind it.
//!
//! ```text
//!  client (dhclient) ── 10.88.0.0/24 ── relay .1 | relay 10.77.0.3 ── VLAN 10.77.0.0/24 ── causeway .2
//! ```
//!
//! A relay agent sends to the server from its address on the server's side
//! (10.77.0.3) while `giaddr` names its address on the clients' side
//! (10.88.0.1), which chooses the subnet. causeway takes relayed packets on
//! its VLAN interface only from a relay the chosen subnet lists, by either
//! address, so this is the configuration the docs give for such a relay:
//! `relayAddresses` the giaddr, `relaySources` the source.
//!
//! Needs root (it prints a SKIP line otherwise).

use crate::support;

use std::fs;
use std::time::Duration;

use support::{metric, poll_until, root_or_skip, tool, AdminAt, Appliance, Netns, Proc};

const SRV_IF: &str = "cw-rsrv0";
const RELAY_UP_IF: &str = "cw-rup0";
const RELAY_DOWN_IF: &str = "cw-rdown0";
const CLI_IF: &str = "cw-rcli0";
const ADMIN_PORT: u16 = 9090;
const DEADLINE: Duration = Duration::from_secs(30);

#[test]
fn dhclient_behind_a_real_relay_agent_sending_from_its_server_side_address_is_served() {
    if !root_or_skip(
        "dhclient_behind_a_real_relay_agent_sending_from_its_server_side_address_is_served",
    ) {
        return;
    }
    let dhcrelay = tool("dhcrelay", "isc-dhcp-relay");
    let dir = tempfile::Builder::new()
        .prefix("causeway-relay-")
        .tempdir()
        .unwrap();
    let srv = Netns::new("rsrv");
    let relay = Netns::new("rrly");
    let cli = Netns::new("rcli");
    srv.veth_to(SRV_IF, None, &relay, RELAY_UP_IF, None);
    relay.veth_to(RELAY_DOWN_IF, None, &cli, CLI_IF, None);
    srv.ip(&["addr", "add", "10.77.0.2/24", "dev", SRV_IF]);
    relay.ip(&["addr", "add", "10.77.0.3/24", "dev", RELAY_UP_IF]);
    relay.ip(&["addr", "add", "10.88.0.1/24", "dev", RELAY_DOWN_IF]);
    // causeway answers a relay at its giaddr, behind the relay's router.
    srv.ip(&["route", "add", "10.88.0.0/24", "via", "10.77.0.3"]);

    let config = dir.path().join("causeway.yaml");
    fs::write(
        &config,
        format!(
            r#"log: {{level: info}}
admin: {{listen: "127.0.0.1:{ADMIN_PORT}"}}
network:
  interface: {SRV_IF}
  cidr: 10.77.0.0/24
  gateway: 10.77.0.1
  address: 10.77.0.2
dhcp:
  leaseFile: {lease}
  subnets:
    - pools: [{{start: 10.77.0.100, end: 10.77.0.150}}]
    - cidr: 10.88.0.0/24
      serverId: 10.77.0.2
      router: [10.88.0.1]
      relayAddresses: [10.88.0.1]
      relaySources: [10.77.0.3]
      pools: [{{start: 10.88.0.10, end: 10.88.0.60}}]
"#,
            lease = dir.path().join("leases.jsonl").display()
        ),
    )
    .unwrap();
    let check = support::run(
        std::process::Command::new(support::causeway_bin())
            .args(["check", "--config"])
            .arg(&config),
    );
    assert!(
        !check.contains("no client can reach"),
        "check names a subnet the relay reaches:\n{check}"
    );
    let server = Appliance::start(
        "causeway",
        dir.path(),
        Some(&srv),
        &config,
        AdminAt::Netns {
            ns: srv.name().to_owned(),
            port: ADMIN_PORT,
        },
    );
    // -id: the clients' side, whose address becomes giaddr; -iu: the side
    // it reaches the server on, whose address is the packets' source.
    let _relay_agent = Proc::spawn(
        "dhcrelay",
        dir.path(),
        relay
            .command(&dhcrelay)
            .args(["-4", "-d", "-id", RELAY_DOWN_IF, "-iu", RELAY_UP_IF])
            .arg("-pf")
            .arg(dir.path().join("dhcrelay.pid"))
            .arg("10.77.0.2"),
    );

    let hook_log = dir.path().join("hook.log");
    let hook = dir.path().join("hook.sh");
    support::dhclient_hook(
        &hook,
        &hook_log,
        "$reason ip=$new_ip_address routers=$new_routers server=$new_dhcp_server_identifier",
    );
    let conf = dir.path().join("dhclient.conf");
    fs::write(&conf, "request subnet-mask, routers;\n").unwrap();
    let mut client = Proc::spawn(
        "dhclient",
        dir.path(),
        cli.command(tool("dhclient", "isc-dhcp-client"))
            .args(["-4", "-1", "-d", "-v", "-sf"])
            .arg(&hook)
            .arg("-cf")
            .arg(&conf)
            .arg("-lf")
            .arg(dir.path().join("dhclient.leases"))
            .arg("-pf")
            .arg(dir.path().join("dhclient.pid"))
            .arg(CLI_IF),
    );
    let bound = poll_until(DEADLINE, || {
        let text = fs::read_to_string(&hook_log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.starts_with("BOUND ")) {
            return Some(Ok(line.to_owned()));
        }
        client.try_status().map(Err)
    });
    let metrics = server.metrics();
    let unknown_relay = metric(
        &metrics,
        r#"causeway_dhcp_dropped_total{reason="unknown_relay"}"#,
    )
    .unwrap_or(0.0);
    let line = match bound {
        Some(Ok(line)) => line,
        other => panic!(
            "dhclient behind the relay was not bound ({other:?}); {unknown_relay} packets dropped as unknown_relay\n{}\n{}",
            client.describe(),
            server.proc.describe()
        ),
    };
    assert!(
        line.contains("ip=10.88.0.") && line.contains("routers=10.88.0.1"),
        "the client was not given an address of the relay's subnet: {line}"
    );
    assert!(line.contains("server=10.77.0.2"), "{line}");
    assert_eq!(unknown_relay, 0.0, "relayed packets were dropped");
    // The lease is the server's record too, under the relay's subnet.
    let ip = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("ip="))
        .unwrap()
        .to_owned();
    let held = support::leases(&config);
    assert!(
        held.iter().any(|l| l.ip == ip),
        "{ip} is not in the lease store: {held:?}"
    );
    drop(client);
    server.stop();
}
