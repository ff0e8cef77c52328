//! The process's descriptor budget under real load: the appliance under an
//! open-files limit of 400, bulk transfers through the proxy until it
//! refuses, while DNS forwards and the lease store compacts.
//!
//! A proxied connection that moves more than 64 KiB each way holds six
//! descriptors (two sockets, a splice pipe per direction). Counted as two,
//! the transfers took every descriptor left, and the failures landed on
//! DNS (SERVFAIL for every forwarded name) and the lease compaction. Now
//! the proxy reserves from the budget as it opens, within a share that
//! leaves the services and the store theirs.
//!
//! No root needed: loopback high ports, `prlimit` from util-linux.

// A test reports a broken precondition by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{
    causeway_bin, metric, poll_until, reserved_port, reserved_port_on, tool, AdminAt, Appliance,
    Proc, Relay,
};

/// Bytes each held connection sends and reads back: past the 64 KiB after
/// which each direction splices through a pipe.
const BULK: usize = 100 * 1024;
/// Connections tried at most; the budget refuses long before.
const MAX_CONNECTIONS: usize = 200;

/// A connection through the proxy that moved `BULK` bytes each way, or
/// `None` when the proxy closed it on arrival.
fn bulk_connection(proxy: SocketAddr) -> Option<TcpStream> {
    let mut s = TcpStream::connect(proxy).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let payload = vec![0x5a_u8; BULK];
    // The echo upstream sends back what it reads: write and read in turns
    // so neither side's buffers fill while the other waits.
    let mut back = vec![0u8; BULK];
    let mut read = 0;
    for chunk in payload.chunks(16 * 1024) {
        s.write_all(chunk).ok()?;
        let want = read + chunk.len();
        while read < want {
            match s.read(&mut back[read..want]) {
                Ok(0) | Err(_) => return None,
                Ok(n) => read += n,
            }
        }
    }
    (back == payload).then_some(s)
}

fn dig_answers(dig: &Path, server: SocketAddr, name: &str) -> bool {
    let out = Command::new(dig)
        .args(["+tries=1", "+time=3", "+short", "-p"])
        .arg(server.port().to_string())
        .arg(format!("@{}", server.ip()))
        .arg(name)
        .arg("A")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    out.status.success() && text.lines().any(|l| l.parse::<Ipv4Addr>().is_ok())
}

#[test]
fn bulk_transfers_fill_the_proxys_share_and_dns_and_the_lease_store_keep_theirs() {
    let dir = tempfile::Builder::new()
        .prefix("causeway-fd-budget-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    let dig = tool("dig", "bind9-dnsutils");
    let prlimit = tool("prlimit", "util-linux");
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    let proxy = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    let echo = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    let dhcp = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    let dns = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port_on(Ipv4Addr::LOCALHOST)));
    let upstream_dns = SocketAddr::from((Ipv4Addr::LOCALHOST, reserved_port()));
    let _echo = support::echo_upstream(d, echo, "300s");
    let _upstream_dns = support::dns_floor_upstream(d, upstream_dns);
    let lease_file = d.join("leases.jsonl");
    support::pad_lease_log(&lease_file, 200_000);
    let config = d.join("causeway.yaml");
    fs::write(
        &config,
        format!(
            r#"log: {{level: info}}
admin: {{listen: "{admin}"}}
cluster: {{name: hc1, baseDomain: example.com}}
dhcp:
  listen: [{{address: "{dhcp}"}}]
  leaseFile: {lease}
  subnets:
    - {{cidr: 10.200.0.0/16, relayAddresses: [127.0.0.1], serverId: 127.0.0.1}}
dns:
  listen: ["{dns}"]
  proxyAddress: 192.0.2.10
  ingressAddress: 192.0.2.11
  upstreams: ["{upstream_dns}"]
  udpSockets: 1
proxy:
  listenAddress: 127.0.0.1
  maxConnectionsPerSource: 1000
  idleTimeout: 5m
  listeners:
    - {{port: {port}, upstream: "{echo}"}}
"#,
            lease = lease_file.display(),
            port = proxy.port(),
        ),
    )
    .unwrap();
    let mut cmd = Command::new(prlimit);
    cmd.arg("--nofile=400:400")
        .arg(causeway_bin())
        .args(["appliance", "--config"])
        .arg(&config);
    let mut app = Appliance {
        proc: Proc::spawn("causeway", d, &mut cmd),
        config: config.clone(),
        admin: AdminAt::Host(admin),
    };
    app.wait_ready();
    let sample = |name: &str| metric(&app.metrics(), name).unwrap_or(0.0);

    // Bulk connections, held open, until the proxy refuses (or for as
    // long as the bound allows: the code before the budget never did).
    let started = Instant::now();
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..MAX_CONNECTIONS {
        match bulk_connection(proxy) {
            Some(s) => held.push(s),
            None => refused += 1,
        }
        if refused >= 3 || started.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    // DNS forwards: each name is new, so each takes an upstream socket.
    for i in 0..20 {
        let name = format!("n{i}.budget.example.net");
        assert!(
            dig_answers(&dig, dns, &name),
            "DNS did not answer {name} with the proxy at its share\n{}",
            app.proc.describe()
        );
    }

    // DHCP: the first lease written starts a compaction of the padded log;
    // it completes, and the lease is acknowledged.
    let mut relay = Relay::new(dhcp);
    let ack = relay.dora([0x02, 0xfd, 0, 0, 0, 1], &[]);
    assert!(!ack.yiaddr().is_unspecified());
    let compacted = poll_until(Duration::from_secs(60), || {
        (sample("causeway_dhcp_store_compactions_total") >= 1.0).then_some(())
    });
    assert!(
        compacted.is_some(),
        "the lease compaction did not complete with the proxy at its share\n{}",
        app.proc.describe()
    );
    assert_eq!(sample("causeway_dhcp_store_compaction_failures_total"), 0.0);
    assert!(!lease_file.with_extension("compacting").exists());

    assert!(
        refused >= 3,
        "the proxy never refused: {} bulk connections held\n{}",
        held.len(),
        app.proc.describe()
    );
    let refused_total = format!(
        r#"causeway_proxy_refused_total{{limit="total",listener="{}"}}"#,
        proxy.port()
    );
    let pipes = sample(r#"causeway_fd_budget_held{holder="proxy_pipe"}"#);
    let connections = sample(r#"causeway_fd_budget_held{holder="proxy_connection"}"#);
    eprintln!(
        "held {} bulk connections; budget: {connections} connection and {pipes} pipe descriptors; \
         {refused_total} {}",
        held.len(),
        sample(&refused_total)
    );
    assert!(pipes >= 2.0, "no transfer spliced through a pipe");
    assert!(sample(&refused_total) >= 1.0, "not refused by the budget");
    let starved = format!(
        r#"causeway_proxy_connect_errors_total{{listener="{}",reason="local_resources"}}"#,
        proxy.port()
    );
    assert_eq!(
        sample(&starved),
        0.0,
        "an upstream connect ran out of descriptors"
    );

    // The held transfers still move bytes.
    for s in held.iter_mut().take(5) {
        s.write_all(b"still here").unwrap();
        let mut back = [0u8; 10];
        s.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"still here");
    }
    drop(held);
    app.stop();
}
