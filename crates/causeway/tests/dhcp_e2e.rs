//! End-to-end DHCP: causeway against real clients (dhclient, udhcpc,
//! dhcpcd), perfdhcp and causeway-bench.
//!
//! The real-client tests run the server and the client in two network
//! namespaces of their own joined by a veth pair, and need root; without it
//! they print `SKIP <test>: needs root (network namespaces)` and pass. The
//! crash and malformed-packet tests run on 127.0.0.1 with high ports and
//! need no privileges.
//!
//! Tools: iproute2, isc-dhcp-client, udhcpc, dhcpcd-base, kea-admin
//! (perfdhcp), curl, util-linux (unshare, mount). causeway-bench must be
//! built first: `cargo build -p causeway-bench`.
//!
//! Every client runs a hook script of ours (`-sf`, `-s`, `-c`): it records
//! what the client was given and configures at most the leased address,
//! inside the client's namespace. resolv.conf, routes and the hostname of
//! the machine are never touched; dhcpcd additionally runs in a private
//! mount namespace with its /run and /var/lib on the test's temp dir.

// A test reports a broken precondition by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::net::{Ipv4Addr, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dhcproto::v4::{DhcpOption, Message, MessageType};
use dhcproto::{Decodable, Decoder, Encodable};
use support::{
    bench_bin, complete_lines, leases, metric, poll_until, root_or_skip, tool, wait_for, AdminAt,
    Appliance, DhcpLab, LeaseView, Netns, Proc,
};
use tempfile::TempDir;

/// Interface names inside the lab namespaces (they never exist on the host).
const SRV_IF: &str = "cw-srv0";
const CLI_IF: &str = "cw-cli0";
/// The admin port inside the server namespace; each lab has its own
/// namespace, so every lab may use the same one.
const NS_ADMIN_PORT: u16 = 9090;
/// Short enough that every client renews within the test (T1 = 5s).
const LAB_LEASE_TIME: &str = "10s";
const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn tempdir() -> TempDir {
    tempfile::Builder::new()
        .prefix("causeway-e2e-")
        .tempdir()
        .expect("creating a temp dir")
}

// ------------------------------------------------------------------ the lab

/// A server namespace and a client namespace joined by a veth pair, with
/// causeway serving the VLAN 10.77.0.0/24 directly on its veth end.
/// Fields drop in order: server, namespaces, then the files.
struct DirectLab {
    server: Option<Appliance>,
    cli: Netns,
    // Held for its Drop: deleting the namespace deletes the veth pair.
    _srv: Netns,
    config: PathBuf,
    dir: TempDir,
}

impl DirectLab {
    fn new(client_mac: &str) -> DirectLab {
        let dir = tempdir();
        let srv = Netns::new("srv");
        let cli = Netns::new("cli");
        srv.veth_to(SRV_IF, None, &cli, CLI_IF, Some(client_mac));
        srv.ip(&["addr", "add", "10.77.0.2/24", "dev", SRV_IF]);
        let config = dir.path().join("causeway.yaml");
        fs::write(
            &config,
            format!(
                r#"log: {{level: debug}}
admin: {{listen: "127.0.0.1:{NS_ADMIN_PORT}"}}
cluster: {{name: hc1, baseDomain: example.test}}
network:
  interface: {SRV_IF}
  cidr: 10.77.0.0/24
  gateway: 10.77.0.1
  address: 10.77.0.2
dhcp:
  leaseFile: {leases}
  leaseTime: {LAB_LEASE_TIME}
  subnets:
    - pools: [{{start: 10.77.0.100, end: 10.77.0.150}}]
      mtu: 1400
      reservations:
        - {{mac: "02:00:00:00:00:42", ip: 10.77.0.42, hostname: reserved-vm}}
"#,
                leases = dir.path().join("leases.jsonl").display()
            ),
        )
        .unwrap();
        let server = Appliance::start(
            "causeway",
            dir.path(),
            Some(&srv),
            &config,
            AdminAt::Netns {
                ns: srv.name().to_owned(),
                port: NS_ADMIN_PORT,
            },
        );
        DirectLab {
            server: Some(server),
            cli,
            _srv: srv,
            config,
            dir,
        }
    }

    fn server(&self) -> &Appliance {
        self.server.as_ref().expect("the server runs")
    }

    /// Waits until the lease store holds `ip` for `mac` in `state`.
    fn wait_lease(&self, ip: &str, mac: &str, state: &str) -> LeaseView {
        let mut last = Vec::new();
        let found = poll_until(Duration::from_secs(10), || {
            last = leases(&self.config);
            last.iter()
                .find(|l| l.ip == ip && l.hw.eq_ignore_ascii_case(mac) && l.state == state)
                .cloned()
        });
        found.unwrap_or_else(|| {
            panic!(
                "the lease store does not show {ip} {state} for {mac}: {last:#?}\n{}",
                self.server().proc.describe()
            )
        })
    }

    /// A well-behaved client causes no drop and no NAK.
    fn assert_clean_exchange(&self) {
        let metrics = self.server().metrics();
        let bad: Vec<&str> = metrics
            .lines()
            .filter(|l| {
                l.starts_with("causeway_dhcp_dropped_total")
                    || l.starts_with(r#"causeway_dhcp_sent_total{type="nak"}"#)
            })
            // Some drop reasons' series exist from the start, at zero.
            .filter(|l| l.rsplit(' ').next() != Some("0"))
            .collect();
        assert!(
            bad.is_empty(),
            "the server dropped or refused messages from a real client:\n{}\n{}",
            bad.join("\n"),
            self.server().proc.describe()
        );
    }

    fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.stop();
        }
    }
}

// ------------------------------------------------------------- the clients

#[derive(Clone, Copy, Debug, PartialEq)]
enum Client {
    Dhclient,
    Udhcpc,
    Dhcpcd,
}

/// What one client hook invocation received, normalised across clients.
#[derive(Debug, Clone, Default)]
struct Given {
    event: String,
    ip: String,
    router: String,
    dns: String,
    domain: String,
    mtu: String,
    hostname: String,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::Dhclient => "dhclient",
            Client::Udhcpc => "udhcpc",
            Client::Dhcpcd => "dhcpcd",
        }
    }

    fn binary(self) -> PathBuf {
        match self {
            Client::Dhclient => tool("dhclient", "isc-dhcp-client"),
            Client::Udhcpc => tool("udhcpc", "udhcpc"),
            Client::Dhcpcd => tool("dhcpcd", "dhcpcd-base"),
        }
    }

    fn is_bound(self, event: &str) -> bool {
        match self {
            Client::Udhcpc => event == "bound",
            Client::Dhclient | Client::Dhcpcd => event == "BOUND" || event == "REBOOT",
        }
    }

    fn is_renew(self, event: &str) -> bool {
        match self {
            Client::Udhcpc => event == "renew",
            Client::Dhclient | Client::Dhcpcd => event == "RENEW",
        }
    }

    fn given(self, event: &str, env: &HashMap<String, String>) -> Given {
        let get = |k: &str| env.get(k).cloned().unwrap_or_default();
        match self {
            Client::Udhcpc => Given {
                event: event.to_owned(),
                ip: get("ip"),
                router: get("router"),
                dns: get("dns"),
                domain: get("domain"),
                mtu: get("mtu"),
                hostname: get("hostname"),
            },
            Client::Dhclient | Client::Dhcpcd => Given {
                event: event.to_owned(),
                ip: get("new_ip_address"),
                router: get("new_routers"),
                dns: get("new_domain_name_servers"),
                domain: get("new_domain_name"),
                mtu: get("new_interface_mtu"),
                hostname: get("new_host_name"),
            },
        }
    }

    /// The address configuration the hook does itself. dhcpcd configures
    /// the (namespaced) interface on its own.
    fn hook_configures(self, ip: &Path) -> String {
        let ip = ip.display();
        match self {
            Client::Dhclient => format!(
                r#"case "$event" in
  BOUND|RENEW|REBIND|REBOOT) '{ip}' addr replace "$new_ip_address/$new_subnet_mask" dev "$interface" ;;
  EXPIRE|FAIL|RELEASE|STOP) '{ip}' -4 addr flush dev "$interface" ;;
esac"#
            ),
            Client::Udhcpc => format!(
                r#"case "$event" in
  bound|renew) '{ip}' addr replace "$ip/$subnet" dev "$interface" ;;
  deconfig) '{ip}' -4 addr flush dev "$interface" ;;
esac"#
            ),
            Client::Dhcpcd => String::new(),
        }
    }
}

/// A DHCP client running in the lab's client namespace with our hook.
struct RunningClient {
    kind: Client,
    proc: Proc,
    dir: PathBuf,
    hook_log: PathBuf,
}

impl RunningClient {
    /// Starts `kind` on the client veth. `one_shot`: exit once bound
    /// (udhcpc only; the others stay to renew and release).
    fn start(lab: &DirectLab, kind: Client, one_shot: bool) -> RunningClient {
        let dir = lab.dir.path().join(kind.name());
        fs::create_dir_all(&dir).unwrap();
        let hook_log = dir.join("hook.log");
        let hook = dir.join("hook.sh");
        fs::write(
            &hook,
            format!(
                r#"#!/bin/sh
# causeway e2e hook: records what the DHCP client passes, and at most sets the
# leased address on the client's interface, inside the test's own network
# namespace. Never touches resolv.conf, routes or the hostname.
event="${{reason:-${{1:-}}}}"
{configure}
log='{log}'
tmp="$log.$$"
{{ echo "--- begin $event"; env; echo "--- end"; }} > "$tmp"
cat "$tmp" >> "$log"
rm -f "$tmp"
exit 0
"#,
                configure = kind.hook_configures(&tool("ip", "iproute2")),
                log = hook_log.display()
            ),
        )
        .unwrap();
        fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();

        let mut cmd = match kind {
            Client::Dhclient => {
                let conf = dir.join("dhclient.conf");
                fs::write(
                    &conf,
                    "request subnet-mask, broadcast-address, routers, domain-name, \
                     domain-name-servers, host-name, interface-mtu;\n",
                )
                .unwrap();
                let mut c = lab.cli.command(kind.binary());
                c.args(["-4", "-1", "-d", "-v"]);
                dhclient_files(&mut c, &dir);
                c.arg(CLI_IF);
                c
            }
            Client::Udhcpc => {
                let mut c = lab.cli.command(kind.binary());
                c.args(["-f", "-R", "-n", "-t", "5", "-T", "2"]);
                c.args(["-O", "mtu", "-O", "hostname", "-O", "domain"]);
                if one_shot {
                    c.arg("-q");
                }
                c.args(["-i", CLI_IF, "-s"]).arg(&hook);
                c.arg("-p").arg(dir.join("udhcpc.pid"));
                c
            }
            Client::Dhcpcd => {
                // dhcpcd keeps its pid files and sockets in /run/dhcpcd and
                // its leases in /var/lib/dhcpcd (fixed at build time): give
                // it a private mount namespace with both on our temp dir.
                let run_dir = dir.join("run");
                let lib_dir = dir.join("lib");
                fs::create_dir_all(&run_dir).unwrap();
                fs::create_dir_all(lib_dir.join("dhcpcd")).unwrap();
                let conf = dir.join("dhcpcd.conf");
                fs::write(
                    &conf,
                    "# causeway e2e: IPv4 only, the MAC as client id, no link-local\n\
                     # fallback, no ARP probing of the offer (it only adds seconds)\n\
                     clientid\nipv4only\nnoipv4ll\nnoarp\n\
                     option domain_name_servers, domain_name, host_name, interface_mtu\n",
                )
                .unwrap();
                let mut c = lab.cli.command(tool("unshare", "util-linux"));
                c.args(["--mount", "--propagation", "private", "sh", "-c"]);
                c.arg(
                    r#"mount --bind "$1" /run && mount --bind "$2" /var/lib && exec "$3" -4 -B -d -f "$4" -c "$5" "$6""#,
                );
                c.arg("sh")
                    .arg(&run_dir)
                    .arg(&lib_dir)
                    .arg(kind.binary())
                    .arg(&conf)
                    .arg(&hook)
                    .arg(CLI_IF);
                c
            }
        };
        let proc = Proc::spawn(kind.name(), lab.dir.path(), &mut cmd);
        RunningClient {
            kind,
            proc,
            dir,
            hook_log,
        }
    }

    fn events(&self) -> Vec<Given> {
        let text = fs::read_to_string(&self.hook_log).unwrap_or_default();
        let mut out = Vec::new();
        let mut current: Option<(String, HashMap<String, String>)> = None;
        for line in text.lines() {
            if let Some(event) = line.strip_prefix("--- begin ") {
                current = Some((event.to_owned(), HashMap::new()));
            } else if line == "--- begin" {
                current = Some((String::new(), HashMap::new()));
            } else if line == "--- end" {
                if let Some((event, env)) = current.take() {
                    out.push(self.kind.given(&event, &env));
                }
            } else if let (Some((_, env)), Some((k, v))) = (current.as_mut(), line.split_once('='))
            {
                env.insert(k.to_owned(), v.to_owned());
            }
        }
        out
    }

    fn diagnostics(&self) -> String {
        let events: Vec<String> = self.events().iter().map(|g| format!("{g:?}")).collect();
        format!(
            "hook events:\n{}\n{}",
            events.join("\n"),
            self.proc.describe()
        )
    }

    /// Waits for the `n`th event matching `pred`, and returns it with its
    /// position.
    fn wait_event(
        &mut self,
        what: &str,
        after: usize,
        pred: impl Fn(&str) -> bool,
        server: &Appliance,
    ) -> (usize, Given) {
        // Some(Err(status)): the client exited first.
        let found = poll_until(CLIENT_TIMEOUT, || {
            let hit = self
                .events()
                .into_iter()
                .enumerate()
                .skip(after)
                .find(|(_, g)| pred(&g.event));
            if let Some(hit) = hit {
                return Some(Ok(hit));
            }
            self.proc.try_status().map(Err)
        });
        match found {
            Some(Ok(hit)) => hit,
            Some(Err(status)) => panic!(
                "{} exited ({status}) before reporting {what}\n{}\n{}",
                self.kind.name(),
                self.diagnostics(),
                server.proc.describe()
            ),
            None => panic!(
                "{} did not report {what} within {CLIENT_TIMEOUT:?}\n{}\n{}",
                self.kind.name(),
                self.diagnostics(),
                server.proc.describe()
            ),
        }
    }

    /// Releases the lease the way each client does it, and waits for the
    /// client to exit.
    fn release(mut self, lab: &DirectLab) {
        match self.kind {
            Client::Dhclient => {
                // `dhclient -r` stops the running client (by its pid file)
                // and sends DHCPRELEASE.
                let mut c = lab.cli.command(self.kind.binary());
                c.args(["-4", "-r", "-v"]);
                dhclient_files(&mut c, &self.dir);
                c.arg(CLI_IF);
                let mut r = Proc::spawn("dhclient-release", lab.dir.path(), &mut c);
                let status = r.wait_exit(CLIENT_TIMEOUT);
                assert!(status.success(), "dhclient -r: {status}\n{}", r.describe());
            }
            // -R: release on exit.
            Client::Udhcpc => self.proc.signal("TERM"),
            // dhcpcd 9 releases on SIGALRM, then exits.
            Client::Dhcpcd => self.proc.signal("ALRM"),
        }
        let status = self.proc.wait_exit(CLIENT_TIMEOUT);
        if self.kind != Client::Dhclient {
            // dhclient is killed by `dhclient -r`; the others exit by themselves.
            assert!(
                status.success(),
                "{} did not exit cleanly after releasing: {status}\n{}",
                self.kind.name(),
                self.diagnostics()
            );
        }
    }
}

fn dhclient_files(c: &mut Command, dir: &Path) {
    c.arg("-cf")
        .arg(dir.join("dhclient.conf"))
        .arg("-sf")
        .arg(dir.join("hook.sh"))
        .arg("-lf")
        .arg(dir.join("dhclient.leases"))
        .arg("-pf")
        .arg(dir.join("dhclient.pid"));
}

fn assert_vlan_options(client: Client, g: &Given) {
    let ip: Ipv4Addr =
        g.ip.parse()
            .unwrap_or_else(|_| panic!("{}: no address in {g:?}", client.name()));
    assert!(
        (Ipv4Addr::new(10, 77, 0, 100)..=Ipv4Addr::new(10, 77, 0, 150)).contains(&ip),
        "{}: {ip} is outside the pool: {g:?}",
        client.name()
    );
    assert_eq!(g.router, "10.77.0.1", "{}: router in {g:?}", client.name());
    assert_eq!(g.dns, "10.77.0.2", "{}: DNS in {g:?}", client.name());
    assert_eq!(
        g.domain,
        "hc1.example.test",
        "{}: domain in {g:?}",
        client.name()
    );
    assert_eq!(g.mtu, "1400", "{}: MTU in {g:?}", client.name());
}

/// Bind, check the options, renew, release — with one real client.
fn lease_renew_release(client: Client, mac: &str) {
    let lab = DirectLab::new(mac);
    let mut c = RunningClient::start(&lab, client, false);

    let (bound_at, bound) = c.wait_event("a lease", 0, |e| client.is_bound(e), lab.server());
    assert_vlan_options(client, &bound);
    let first = lab.wait_lease(&bound.ip, mac, "active");
    assert!(first.expires > unix_now(), "{first:?} is already expired");

    // T1 is half the 10s lease: the client renews by itself.
    let (_, renewed) = c.wait_event(
        "a renewal",
        bound_at + 1,
        |e| client.is_renew(e),
        lab.server(),
    );
    assert_eq!(renewed.ip, bound.ip, "the renewal changed the address");
    assert_vlan_options(client, &renewed);
    // The ACK that renewed it was sent only once the new expiry was durable.
    let extended = leases(&lab.config)
        .into_iter()
        .find(|l| l.ip == bound.ip && l.hw.eq_ignore_ascii_case(mac) && l.state == "active");
    assert!(
        extended.as_ref().is_some_and(|l| l.expires > first.expires),
        "the renewal did not extend the lease: before {first:?}, after {extended:?}"
    );

    c.release(&lab);
    lab.wait_lease(&bound.ip, mac, "released");
    lab.assert_clean_exchange();
    lab.stop();
}

// ------------------------------------------------------------- the tests

#[test]
fn dhclient_gets_a_lease_with_router_dns_domain_and_mtu() {
    if !root_or_skip("dhclient_gets_a_lease_with_router_dns_domain_and_mtu") {
        return;
    }
    lease_renew_release(Client::Dhclient, "02:00:00:00:01:01");
}

#[test]
fn udhcpc_gets_a_lease_with_router_dns_domain_and_mtu() {
    if !root_or_skip("udhcpc_gets_a_lease_with_router_dns_domain_and_mtu") {
        return;
    }
    lease_renew_release(Client::Udhcpc, "02:00:00:00:01:02");
}

#[test]
fn dhcpcd_gets_a_lease_with_router_dns_domain_and_mtu() {
    if !root_or_skip("dhcpcd_gets_a_lease_with_router_dns_domain_and_mtu") {
        return;
    }
    lease_renew_release(Client::Dhcpcd, "02:00:00:00:01:03");
}

#[test]
fn a_reservation_is_honoured() {
    if !root_or_skip("a_reservation_is_honoured") {
        return;
    }
    let mac = "02:00:00:00:00:42";
    let lab = DirectLab::new(mac);
    let mut c = RunningClient::start(&lab, Client::Udhcpc, true);
    let status = c.proc.wait_exit(CLIENT_TIMEOUT);
    assert!(status.success(), "udhcpc -q: {status}\n{}", c.diagnostics());
    let (_, bound) = c.wait_event("a lease", 0, |e| e == "bound", lab.server());
    assert_eq!(bound.ip, "10.77.0.42", "{bound:?}");
    assert_eq!(bound.hostname, "reserved-vm", "{bound:?}");
    assert_eq!(bound.router, "10.77.0.1", "{bound:?}");
    lab.wait_lease("10.77.0.42", mac, "active");
    lab.assert_clean_exchange();
    lab.stop();
}

/// One direction of a perfdhcp report.
#[derive(Debug, Default)]
struct PerfStats {
    sent: u64,
    received: u64,
    drops: u64,
}

fn perfdhcp_section(report: &str, title: &str) -> Option<PerfStats> {
    let start = report.find(&format!("***Statistics for: {title}***"))?;
    let section = &report[start..];
    // Up to the next section's title line.
    let section = match section.find("\n***") {
        Some(end) => &section[..end],
        None => section,
    };
    let field = |name: &str| -> Option<u64> {
        section
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(PerfStats {
        sent: field("sent packets")?,
        received: field("received packets")?,
        drops: field("drops")?,
    })
}

#[test]
fn perfdhcp_relayed_load_has_no_errors() {
    if !root_or_skip("perfdhcp_relayed_load_has_no_errors") {
        return;
    }
    let perfdhcp = tool("perfdhcp", "kea-admin");
    let dir = tempdir();
    // perfdhcp is the relay: it sends from 127.0.0.2:67 with giaddr
    // 127.0.0.2 (an address it insists is configured on an interface) and
    // expects the replies on port 67.
    let ns = Netns::new("relay");
    ns.ip(&["addr", "add", "127.0.0.2/8", "dev", "lo"]);
    let config = dir.path().join("causeway.yaml");
    fs::write(
        &config,
        format!(
            r#"admin: {{listen: "127.0.0.1:{NS_ADMIN_PORT}"}}
dhcp:
  listen: [{{address: "127.0.0.1:67"}}]
  leaseFile: {}
  leaseTime: 1h
  subnets:
    - cidr: 10.200.0.0/16
      relayAddresses: [127.0.0.2]
      serverId: 127.0.0.1
      router: [10.200.0.1]
      dnsServers: [10.200.0.2]
"#,
            dir.path().join("leases.jsonl").display()
        ),
    )
    .unwrap();
    let server = Appliance::start(
        "causeway",
        dir.path(),
        Some(&ns),
        &config,
        AdminAt::Netns {
            ns: ns.name().to_owned(),
            port: NS_ADMIN_PORT,
        },
    );
    let mut cmd = ns.command(perfdhcp);
    // An answer later than perfdhcp's default 1 s counts as a drop. Every
    // ACK waits for its lease to reach the disk, and with two busy loops
    // sharing the cores a run saw three ACKs come later than that. This test
    // is about every exchange being answered, so a late answer gets 5 s
    // (speed is the bench's business). perfdhcp counts whatever is still
    // unanswered when the test period ends as dropped, so -W has it wait up
    // to 3 s more for those answers, sending nothing new.
    cmd.args([
        "-4",
        "-r",
        "50",
        "-R",
        "200",
        "-p",
        "5",
        "-d",
        "5",
        "-W",
        "3000000",
        "-l",
        "127.0.0.2",
    ])
    .arg("127.0.0.1");
    let mut perf = Proc::spawn("perfdhcp", dir.path(), &mut cmd);
    let status = perf.wait_exit(Duration::from_secs(40));
    let report = perf.output();
    // perfdhcp exits 3 when anything was dropped.
    assert!(status.success(), "perfdhcp: {status}\n{report}");
    for title in ["DISCOVER-OFFER", "REQUEST-ACK"] {
        let s = perfdhcp_section(&report, title)
            .unwrap_or_else(|| panic!("no {title} statistics in:\n{report}"));
        assert!(s.sent >= 100, "{title}: too few sent: {s:?}\n{report}");
        assert_eq!(s.drops, 0, "{title}: drops\n{report}");
        assert_eq!(s.received, s.sent, "{title}: unanswered\n{report}");
    }
    let acked = perfdhcp_section(&report, "REQUEST-ACK").unwrap().received;
    let sent_acks =
        metric(&server.metrics(), r#"causeway_dhcp_sent_total{type="ack"}"#).unwrap_or_default();
    assert!(
        sent_acks >= acked as f64 && sent_acks > 0.0,
        "causeway_dhcp_sent_total{{type=\"ack\"}} is {sent_acks}, perfdhcp got {acked} ACKs"
    );
    server.stop();
}

// --------------------------------------------------- loopback, no root needed

/// causeway in relay mode on 127.0.0.1 with its lease file in the lab.
fn loopback_lab() -> DhcpLab {
    DhcpLab::new("causeway-e2e-", |dir, admin, dhcp| {
        support::loopback_dhcp_config(admin, dhcp, &dir.join("leases.jsonl"))
    })
}

#[test]
fn acknowledged_leases_survive_kill_9() {
    let lab = loopback_lab();
    let bench = bench_bin();
    let mut server = lab.start("causeway-1");
    let acked_file = lab.dir.path().join("acked.txt");
    let mut cmd = Command::new(bench);
    cmd.args([
        "dhcp",
        "--server",
        &lab.dhcp.to_string(),
        "--bind",
        "127.0.0.1:0",
    ])
    .args([
        "--clients",
        "20000",
        "--rate",
        "2000",
        "--duration",
        "20s",
        "--json",
    ])
    .arg("--acked-file")
    .arg(&acked_file);
    let mut load = Proc::spawn("causeway-bench", lab.dir.path(), &mut cmd);

    wait_for(
        "2000 acknowledged leases",
        Duration::from_secs(60),
        || (complete_lines(&acked_file).len() >= 2000).then_some(()),
        || format!("{}\n{}", load.describe(), server.proc.describe()),
    );
    server.proc.kill9();
    load.signal("INT");
    load.wait_exit(Duration::from_secs(15));

    // Only complete lines: each is an ACK the bench received.
    let mut acked: HashMap<String, String> = HashMap::new();
    for line in complete_lines(&acked_file) {
        let (mac, ip) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("bad --acked-file line {line:?}"));
        acked.insert(mac.to_ascii_lowercase(), ip.to_owned());
    }
    assert!(
        acked.len() >= 2000,
        "only {} distinct MACs acked",
        acked.len()
    );

    drop(server);
    let restarted = lab.start("causeway-2");
    let store = leases(&lab.config);
    let active: HashSet<(String, String)> = store
        .iter()
        .filter(|l| l.state == "active")
        .map(|l| (l.hw.to_ascii_lowercase(), l.ip.clone()))
        .collect();
    let missing: Vec<_> = acked
        .iter()
        .filter(|(mac, ip)| !active.contains(&((*mac).clone(), (*ip).clone())))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged leases are not active in the store after kill -9, e.g. {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );

    // The restarted server holds them too.
    let served = match restarted.admin.get("/leases") {
        Some((200, body)) => body,
        other => panic!("/leases: {other:?}"),
    };
    let served: serde_json::Value = serde_json::from_str(&served).unwrap();
    let served: HashSet<(String, String)> = served
        .as_array()
        .expect("/leases is an array")
        .iter()
        .filter(|l| l["state"] == "active")
        .map(|l| {
            (
                l["hw"].as_str().unwrap_or_default().to_ascii_lowercase(),
                l["ip"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let not_served = acked
        .iter()
        .filter(|(mac, ip)| !served.contains(&((*mac).clone(), (*ip).clone())))
        .count();
    assert_eq!(
        not_served, 0,
        "acknowledged leases missing from the restarted server's /leases"
    );
    eprintln!(
        "acknowledged_leases_survive_kill_9: checked {} acknowledged leases ({} ACK lines)",
        acked.len(),
        complete_lines(&acked_file).len()
    );
    restarted.stop();
}

fn discover(xid: u32, mac: [u8; 6]) -> Vec<u8> {
    let mut m = Message::default();
    m.set_xid(xid)
        .set_chaddr(&mac)
        .set_hops(1)
        .set_giaddr(Ipv4Addr::LOCALHOST);
    m.opts_mut()
        .insert(DhcpOption::MessageType(MessageType::Discover));
    m.to_vec().unwrap()
}

#[test]
fn malformed_packets_are_counted_not_fatal() {
    let lab = loopback_lab();
    let server = lab.start("causeway");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let valid = discover(0x0bad_cafe, [2, 0, 0, 0, 7, 1]);

    // Shorter than the 240-byte header.
    sock.send_to(&valid[..100], lab.dhcp).unwrap();
    // A hostname option claiming 50 bytes with 3 left in the packet.
    let mut overrun = valid[..240].to_vec();
    overrun.extend_from_slice(&[53, 1, 1, 12, 50, b'v', b'm', b'1']);
    sock.send_to(&overrun, lab.dhcp).unwrap();
    // hlen 200 (chaddr holds 16).
    let mut hlen = valid.clone();
    hlen[2] = 200;
    sock.send_to(&hlen, lab.dhcp).unwrap();

    for reason in ["truncated", "option_overrun", "bad_hardware_length"] {
        server.wait_metric_at_least(
            &format!(r#"causeway_dhcp_dropped_total{{reason="{reason}"}}"#),
            1.0,
            Duration::from_secs(10),
        );
    }

    // Still serving: a valid DISCOVER gets an OFFER (retransmitted as a
    // relay would, each wait bounded).
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let xid = 0x600d_f00d;
    let deadline = Instant::now() + Duration::from_secs(10);
    let offer = loop {
        assert!(
            Instant::now() < deadline,
            "no OFFER after the malformed packets\n{}",
            server.proc.describe()
        );
        sock.send_to(&discover(xid, [2, 0, 0, 0, 7, 2]), lab.dhcp)
            .unwrap();
        let mut buf = [0u8; 1500];
        if let Ok((n, _)) = sock.recv_from(&mut buf) {
            let m = Message::decode(&mut Decoder::new(&buf[..n])).unwrap();
            if m.xid() == xid {
                break m;
            }
        }
    };
    assert_eq!(offer.opts().msg_type(), Some(MessageType::Offer));
    let yiaddr = offer.yiaddr();
    assert!(
        yiaddr.octets()[..2] == [10, 200],
        "offered {yiaddr}, outside 10.200.0.0/16"
    );
    assert!(
        server
            .proc
            .output()
            .lines()
            .all(|l| !l.contains("panicked")),
        "{}",
        server.proc.describe()
    );
    server.stop();
}
