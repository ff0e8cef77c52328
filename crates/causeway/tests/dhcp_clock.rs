//! DHCP under a wall clock that steps: the real appliance on 127.0.0.1 high
//! ports, its wall clock moved by libfaketime (a file the test rewrites sets
//! the offset while the process runs; the monotonic clock is left alone,
//! as a real NTP step leaves it).
//!
//! A DPU or a VM without a battery-backed clock boots at its epoch and is
//! set by NTP later; an administrator runs `date -s`. Neither may give an
//! address to a second holder or hold one forever.
//!
//! No root needed. Tools: libfaketime (Debian's `libfaketime`).

// A test reports a broken precondition by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use dhcproto::v4::MessageType;
use support::{causeway_bin, metric, poll_until, AdminAt, Appliance, DhcpLab, Proc, Relay};

/// The one address in the pool: a second holder of it is a failure.
const ONLY: Ipv4Addr = Ipv4Addr::new(10, 200, 0, 10);

/// A one-address pool, leases of an hour, on a relay port of 127.0.0.1.
fn lab() -> DhcpLab {
    DhcpLab::new("causeway-clock-", |dir, admin, dhcp| {
        format!(
            r#"log: {{level: info}}
admin: {{listen: "{admin}"}}
dhcp:
  listen: [{{address: "{dhcp}"}}]
  leaseFile: {}
  leaseTime: 1h
  subnets:
    - cidr: 10.200.0.0/16
      relayAddresses: [127.0.0.1]
      serverId: 127.0.0.1
      pools: [{{start: {ONLY}, end: {ONLY}}}]
"#,
            dir.join("leases.jsonl").display()
        )
    })
}

/// The appliance with its wall clock at the offset in `offset_file`
/// ("+0", "+2d", "-1d"), read again on every clock call.
fn spawn_faked(lab: &DhcpLab, offset_file: &Path, name: &str) -> Appliance {
    let mut cmd = Command::new(causeway_bin());
    cmd.args(["appliance", "--config"]).arg(&lab.config);
    support::with_faked_wall_clock(&mut cmd, offset_file);
    Appliance {
        proc: Proc::spawn(name, lab.dir.path(), &mut cmd),
        config: lab.config.clone(),
        admin: AdminAt::Host(lab.admin),
    }
}

fn mac(n: u8) -> [u8; 6] {
    [0x02, 0xc1, 0x0c, 0, 0, n]
}

fn sample(app: &Appliance, name: &str) -> Option<f64> {
    app.admin
        .get("/metrics")
        .and_then(|(_, body)| metric(&body, name))
}

/// A step forward of two days while a lease of an hour is held: before, the
/// next reclaim took the address from its holder and offered it to the
/// next client (two holders); now the lease runs on the clock the process
/// started with, and the pool stays full.
#[test]
fn a_wall_clock_step_forward_takes_no_lease_from_its_holder() {
    let lab = lab();
    let offset = lab.dir.path().join("offset");
    support::set_clock_offset(&offset, "+0");
    let mut app = spawn_faked(&lab, &offset, "causeway");
    app.wait_ready();
    let mut relay = Relay::new(lab.dhcp);
    let ack = relay.dora(mac(1), &[]);
    assert_eq!(ack.yiaddr(), ONLY);

    support::set_clock_offset(&offset, "+2d");
    // The server has seen the step.
    let seen = poll_until(Duration::from_secs(20), || {
        sample(&app, "causeway_dhcp_clock_wall_offset_seconds").filter(|v| *v >= 172_000.0)
    });
    assert!(
        seen.is_some(),
        "the wall clock step never showed in causeway_dhcp_clock_wall_offset_seconds\n{}",
        app.proc.describe()
    );
    let logged = poll_until(Duration::from_secs(10), || {
        app.proc
            .output()
            .contains("the wall clock stepped while DHCP was serving")
            .then_some(())
    });
    assert!(
        logged.is_some(),
        "the step was not logged\n{}",
        app.proc.describe()
    );
    // Another client: the only address is still held, so no offer (a full
    // pool reclaims what has run out first, on the server's clock).
    let offer = relay.try_exchange(MessageType::Discover, mac(2), &[]);
    assert!(
        offer.is_none(),
        "a second client was offered {:?} two wall-clock days into a one-hour lease: \
         the step took the lease from its holder\n{}",
        offer.map(|o| o.yiaddr()),
        app.proc.describe()
    );
    // The holder renews it as usual.
    let renewed = relay.dora(mac(1), &[]);
    assert_eq!(renewed.yiaddr(), ONLY);
    app.stop();
}

/// A restart with the wall clock a day behind the lease file (a DPU that
/// booted at its epoch, before NTP): the server waits, not ready and
/// answering nothing, and serves from the moment the clock is set, with
/// the lease from before the restart still held.
#[test]
fn a_start_with_the_clock_behind_the_lease_file_waits_for_the_clock() {
    let lab = lab();
    let offset = lab.dir.path().join("offset");
    support::set_clock_offset(&offset, "+0");
    let mut first = spawn_faked(&lab, &offset, "causeway-first");
    first.wait_ready();
    let mut relay = Relay::new(lab.dhcp);
    assert_eq!(relay.dora(mac(1), &[]).yiaddr(), ONLY);
    first.stop();

    support::set_clock_offset(&offset, "-1d");
    let second = spawn_faked(&lab, &offset, "causeway-second");
    let behind = poll_until(Duration::from_secs(30), || {
        sample(&second, "causeway_dhcp_clock_behind_seconds").filter(|v| *v >= 86_000.0)
    });
    assert!(
        behind.is_some(),
        "the server never reported its clock a day behind the lease file\n{}",
        second.proc.describe()
    );
    let ready = second.admin.get("/readyz").map(|(code, _)| code);
    assert_eq!(ready, Some(503), "ready with the clock a day behind");
    let logged = poll_until(Duration::from_secs(10), || {
        second
            .proc
            .output()
            .contains("the wall clock is behind the lease file's last write")
            .then_some(())
    });
    assert!(
        logged.is_some(),
        "the wait was not logged\n{}",
        second.proc.describe()
    );
    // A client asking now gets nothing: the server's idea of the lease
    // times is a day off.
    assert!(relay
        .try_exchange(MessageType::Discover, mac(2), &[])
        .is_none());
    assert!(
        sample(
            &second,
            "causeway_dhcp_dropped_total{reason=\"clock_behind\"}"
        )
        .unwrap_or(0.0)
            >= 1.0
    );

    support::set_clock_offset(&offset, "+0");
    let mut second = second;
    second.wait_ready();
    assert_eq!(
        sample(&second, "causeway_dhcp_clock_behind_seconds"),
        Some(0.0)
    );
    // The lease from before the restart still holds the only address.
    assert!(relay
        .try_exchange(MessageType::Discover, mac(2), &[])
        .is_none());
    assert_eq!(relay.dora(mac(1), &[]).yiaddr(), ONLY);
    second.stop();
}
