//! End-to-end DNS: causeway's DNS server against real clients (dig, kdig)
//! and a real forwarding upstream (dnsmasq) that the test starts itself.
//!
//! Most tests run on 127.0.0.0/8 with high ports and need no privileges.
//! The split-horizon test puts the server and two clients in network
//! namespaces of their own and needs root; without it it prints
//! `SKIP <test>: needs root (network namespaces)` and passes.
//!
//! Tools: bind9-dnsutils (dig), knot-dnsutils (kdig), dnsmasq-base
//! (dnsmasq), dnsperf (load across reloads), iproute2 (ip, root test only).
//!
//! Every upstream a server is given is on loopback (a dnsmasq of ours, or a
//! socket of ours that never answers), so no query ever leaves the machine.

// A test reports a broken precondition by panicking, helpers included.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::fs;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dhcproto::v4::DhcpOption;
use support::{
    causeway_bin, metric, poll_until, root_or_skip, tool, wait_for, AdminAt, Appliance, Netns, Proc,
};
use tempfile::TempDir;

/// The cluster zone every config here declares.
const ZONE: &str = "hc1.example.test";
/// The proxy and ingress addresses of the loopback configs.
const PROXY: &str = "10.0.0.10";
const INGRESS: &str = "10.0.0.20";
/// What the dnsmasq upstream answers for `www.example.net`.
const UPSTREAM_ANSWER: &str = "192.0.2.80";
/// How long a test waits for a condition before it fails.
const DEADLINE: Duration = Duration::from_secs(10);

fn tempdir() -> TempDir {
    tempfile::Builder::new()
        .prefix("causeway-dns-e2e-")
        .tempdir()
        .expect("creating a temp dir")
}

fn fqdn(name: &str) -> String {
    format!("{name}.{ZONE}")
}

// ------------------------------------------------------------ dig and kdig

/// One resource record as dig and kdig print it.
#[derive(Debug, Clone)]
struct Rr {
    name: String,
    ttl: u32,
    rtype: String,
    data: String,
}

/// A response as dig or kdig printed it.
#[derive(Debug, Clone)]
struct Reply {
    status: String,
    flags: Vec<String>,
    answer: Vec<Rr>,
    authority: Vec<Rr>,
    query_ms: Option<u64>,
    raw: String,
}

impl Reply {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// The data of the answer records of type `rtype`.
    fn answers(&self, rtype: &str) -> Vec<String> {
        self.answer
            .iter()
            .filter(|r| r.rtype == rtype)
            .map(|r| r.data.clone())
            .collect()
    }
}

/// Parses dig's and kdig's default output (their formats differ in
/// separators: `status: X,` vs `status: X;`, `flags:` vs `Flags:`).
/// `None` when no response was printed (a timeout, say).
fn parse_reply(raw: &str) -> Option<Reply> {
    // dig prints the header of a truncated UDP answer, then the TCP one;
    // the last response printed is the one that counts.
    let start = raw.rfind("->>HEADER<<-")?;
    let text = &raw[start..];
    let field_end = |s: &str| {
        s.split([',', ';', ' ', '\n'])
            .next()
            .unwrap_or_default()
            .to_owned()
    };
    let status = field_end(text.split_once("status: ")?.1.trim_start());
    let flags_line = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(";; flags:")
                .or_else(|| l.strip_prefix(";; Flags:"))
        })
        .unwrap_or_default();
    let flags = flags_line
        .split(';')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let section = |title: &str| -> Vec<Rr> {
        let Some((_, rest)) = text.split_once(title) else {
            return Vec::new();
        };
        rest.lines()
            .skip(1)
            .take_while(|l| !l.trim().is_empty() && !l.starts_with(";;"))
            .filter(|l| !l.starts_with(';'))
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let name = f.next()?.to_owned();
                let ttl = f.next()?.parse().ok()?;
                let _class = f.next()?;
                let rtype = f.next()?.to_owned();
                let data = f.collect::<Vec<_>>().join(" ");
                Some(Rr {
                    name,
                    ttl,
                    rtype,
                    data,
                })
            })
            .collect()
    };
    let query_ms = text
        .split_once(";; Query time: ")
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok());
    Some(Reply {
        status,
        flags,
        answer: section(";; ANSWER SECTION:"),
        authority: section(";; AUTHORITY SECTION:"),
        query_ms,
        raw: raw.to_owned(),
    })
}

/// Runs a dig or kdig command; `None` if it printed no response.
fn ask(mut cmd: Command) -> Option<Reply> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_reply(&text)
}

fn dig_bin() -> PathBuf {
    tool("dig", "bind9-dnsutils")
}

fn kdig_bin() -> PathBuf {
    tool("kdig", "knot-dnsutils")
}

/// `dig @server -p port <args>`, one try of at most `wait_secs`.
fn dig_cmd(mut cmd: Command, server: SocketAddr, wait_secs: u32, args: &[&str]) -> Command {
    cmd.arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string()])
        .arg(format!("+time={wait_secs}"))
        .arg("+tries=1")
        .args(args);
    cmd
}

fn dig(server: SocketAddr, args: &[&str]) -> Option<Reply> {
    ask(dig_cmd(Command::new(dig_bin()), server, 3, args))
}

/// dig that must print a response.
fn dig_ok(server: SocketAddr, args: &[&str]) -> Reply {
    dig(server, args)
        .unwrap_or_else(|| panic!("dig @{server} {args:?} printed no response (timed out?)"))
}

fn kdig_ok(server: SocketAddr, args: &[&str]) -> Reply {
    let mut cmd = Command::new(kdig_bin());
    cmd.arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string()])
        .args(["+timeout=3", "+retry=0"])
        .args(args);
    ask(cmd).unwrap_or_else(|| panic!("kdig @{server} {args:?} printed no response"))
}

// ------------------------------------------------------------- the server

/// A running `causeway dns` (or `causeway appliance`) on loopback.
/// Fields drop in order: the server, then its files.
struct Server {
    app: Appliance,
    dns: SocketAddr,
    _dir: TempDir,
}

impl Server {
    /// `causeway dns` serving the cluster zone on 127.0.0.1:<free port>.
    /// `dns_extra` is more of the `dns:` block, each line indented by two.
    fn dns(dns_extra: &str) -> Server {
        let dir = tempdir();
        let dns = SocketAddr::from((
            Ipv4Addr::LOCALHOST,
            support::reserved_port_on(Ipv4Addr::LOCALHOST),
        ));
        let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, support::reserved_port()));
        let config = format!(
            r#"log: {{level: info}}
admin: {{listen: "{admin}"}}
cluster: {{name: hc1, baseDomain: example.test}}
dns:
  listen: ["{dns}"]
  proxyAddress: {PROXY}
  ingressAddress: {INGRESS}
{dns_extra}"#
        );
        Server::start("dns", dir, dns, admin, &config)
    }

    fn start(
        subcommand: &str,
        dir: TempDir,
        dns: SocketAddr,
        admin: SocketAddr,
        config: &str,
    ) -> Server {
        let path = dir.path().join("causeway.yaml");
        fs::write(&path, config).unwrap();
        let proc = Proc::spawn(
            "causeway",
            dir.path(),
            Command::new(causeway_bin())
                .args([subcommand, "--config"])
                .arg(&path),
        );
        let mut app = Appliance {
            proc,
            config: path,
            admin: AdminAt::Host(admin),
        };
        app.wait_ready();
        Server {
            app,
            dns,
            _dir: dir,
        }
    }

    fn pid(&self) -> u32 {
        self.app.proc.pid()
    }

    /// One sample; an absent sample (a counter never incremented) is 0.
    fn sample(&self, sample: &str) -> f64 {
        metric(&self.app.metrics(), sample).unwrap_or(0.0)
    }

    fn describe(&self) -> String {
        self.app.proc.describe()
    }
}

/// A UDP socket on loopback that never reads: an upstream that swallows
/// every query.
struct Blackhole {
    socket: UdpSocket,
}

impl Blackhole {
    fn new() -> Blackhole {
        Blackhole {
            socket: UdpSocket::bind("127.0.0.1:0").expect("binding the blackhole socket"),
        }
    }

    fn addr(&self) -> SocketAddr {
        self.socket.local_addr().unwrap()
    }
}

/// dnsmasq as the upstream: answers `www.example.net` from its config
/// with the given TTL, on 127.0.0.<n>:<high port>, nothing else.
struct Dnsmasq {
    proc: Proc,
    addr: SocketAddr,
    // Holds the log and pid file until after the process is gone.
    _dir: TempDir,
}

impl Dnsmasq {
    fn start(ttl: u32) -> Dnsmasq {
        Dnsmasq::answering(ttl, UPSTREAM_ANSWER)
    }

    /// Answers `answer` for `www.example.net` and every name under it.
    fn answering(ttl: u32, answer: &str) -> Dnsmasq {
        let dir = tempdir();
        let ip = Ipv4Addr::new(127, 0, 0, 53);
        let addr = SocketAddr::from((ip, support::reserved_port_on(ip)));
        let mut cmd = Command::new(tool("dnsmasq", "dnsmasq-base"));
        cmd.args(support::DNSMASQ_ALONE)
            .arg("--log-queries")
            .arg(format!("--listen-address={ip}"))
            .arg(format!("--port={}", addr.port()))
            .arg(format!("--local-ttl={ttl}"))
            .arg(format!("--address=/www.example.net/{answer}"))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()));
        if support::is_root() {
            cmd.arg("--user=nobody");
        }
        let mut proc = Proc::spawn("dnsmasq", dir.path(), &mut cmd);
        let started = poll_until(DEADLINE, || {
            if proc.try_status().is_some() {
                return Some(false);
            }
            dig(addr, &["www.example.net", "A"])
                .filter(|r| r.answers("A") == [answer])
                .map(|_| true)
        });
        assert!(
            started == Some(true),
            "dnsmasq did not answer on {addr}\n{}",
            proc.describe()
        );
        Dnsmasq {
            proc,
            addr,
            _dir: dir,
        }
    }
}

// ------------------------------------------------------------------ tests

#[test]
fn vlan_and_other_clients_get_different_answers_for_api() {
    if !root_or_skip("vlan_and_other_clients_get_different_answers_for_api") {
        return;
    }
    let dir = tempdir();
    let srv = Netns::new("dnssrv");
    let vlan = Netns::new("dnsvlan");
    let mgmt = Netns::new("dnsmgmt");
    srv.veth_to("cw-vlan0", None, &vlan, "cw-cli0", None);
    srv.veth_to("cw-mgmt0", None, &mgmt, "cw-cli0", None);
    srv.ip(&["addr", "add", "192.168.100.2/24", "dev", "cw-vlan0"]);
    srv.ip(&["addr", "add", "10.50.0.2/24", "dev", "cw-mgmt0"]);
    vlan.ip(&["addr", "add", "192.168.100.10/24", "dev", "cw-cli0"]);
    mgmt.ip(&["addr", "add", "10.50.0.10/24", "dev", "cw-cli0"]);

    let admin_port = 9090;
    let config = dir.path().join("causeway.yaml");
    fs::write(
        &config,
        format!(
            r#"log: {{level: debug}}
admin: {{listen: "127.0.0.1:{admin_port}"}}
cluster: {{name: hc1, baseDomain: example.test}}
network:
  interface: cw-vlan0
  cidr: 192.168.100.0/24
  gateway: 192.168.100.1
  address: 192.168.100.2
dns:
  listen: ["192.168.100.2:53", "10.50.0.2:53"]
  # Inside the server's namespace, where nothing listens.
  upstreams: ["127.0.0.1:9"]
  views:
    - name: vlan
      clients: [192.168.100.0/24]
    - name: mgmt
      clients: [10.50.0.0/24]
      proxyAddress: 172.30.0.10
"#
        ),
    )
    .unwrap();
    let proc = Proc::spawn(
        "causeway",
        dir.path(),
        srv.command(causeway_bin())
            .args(["dns", "--config"])
            .arg(&config),
    );
    let mut server = Appliance {
        proc,
        config,
        admin: AdminAt::Netns {
            ns: srv.name().to_owned(),
            port: admin_port,
        },
    };
    server.wait_ready();

    let api = fqdn("api");
    let ask_from = |ns: &Netns, server_ip: [u8; 4]| -> Reply {
        let addr = SocketAddr::from((server_ip, 53));
        wait_for(
            &format!("an answer for {api} from {}", ns.name()),
            DEADLINE,
            || ask(dig_cmd(ns.command(dig_bin()), addr, 2, &[&api, "A"])),
            || server.proc.describe(),
        )
    };
    let from_vlan = ask_from(&vlan, [192, 168, 100, 2]);
    let from_mgmt = ask_from(&mgmt, [10, 50, 0, 2]);
    for (who, reply, want) in [
        ("vlan", &from_vlan, "192.168.100.2"),
        ("mgmt", &from_mgmt, "172.30.0.10"),
    ] {
        assert_eq!(reply.status, "NOERROR", "{who}: {}", reply.raw);
        assert_eq!(reply.answers("A"), [want], "{who}: {}", reply.raw);
        assert!(reply.has_flag("aa"), "{who}: {}", reply.raw);
    }
    let metrics = server.metrics();
    for view in ["vlan", "mgmt"] {
        let sample =
            format!(r#"causeway_dns_queries_total{{qtype="A",rcode="NOERROR",view="{view}"}}"#);
        assert!(
            metric(&metrics, &sample).is_some_and(|v| v >= 1.0),
            "no {sample} in:\n{metrics}"
        );
    }
    server.stop();
}

#[test]
fn apps_wildcard_matches_any_depth() {
    let server = Server::dns("  upstreams: [\"127.0.0.1:9\"]\n");
    for name in ["x.apps", "a.b.c.apps", "console-openshift-console.apps"] {
        let q = fqdn(name);
        let reply = kdig_ok(server.dns, &[&q, "A"]);
        assert_eq!(reply.status, "NOERROR", "{q}: {}", reply.raw);
        assert_eq!(reply.answers("A"), [INGRESS], "{q}: {}", reply.raw);
        // The synthesized record carries the name asked, not the wildcard.
        assert_eq!(reply.answer[0].name, format!("{q}."), "{}", reply.raw);
        assert!(reply.has_flag("aa"), "{q}: {}", reply.raw);
    }
    // The wildcard is for names under apps only.
    let api = kdig_ok(server.dns, &[&fqdn("api"), "A"]);
    assert_eq!(api.answers("A"), [PROXY], "{}", api.raw);
}

/// The CPUs in a `Cpus_allowed_list` such as `0-3,6`.
fn cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// The CPUs a task (`/proc/<pid>` or `/proc/<pid>/task/<tid>`) may run on.
fn allowed_cpus(task: &std::path::Path) -> Vec<usize> {
    let status = fs::read_to_string(task.join("status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap();
    cpu_list(line)
}

/// Each `dns-udp-N` thread of a server, with the CPUs it may run on.
fn udp_threads(server: &Server) -> Vec<(String, Vec<usize>)> {
    let mut threads: Vec<(String, Vec<usize>)> =
        fs::read_dir(format!("/proc/{}/task", server.pid()))
            .unwrap()
            .filter_map(|t| {
                let path = t.ok()?.path();
                let name = fs::read_to_string(path.join("comm"))
                    .ok()?
                    .trim()
                    .to_string();
                name.starts_with("dns-udp-")
                    .then(|| (name, allowed_cpus(&path)))
            })
            .collect();
    threads.sort();
    threads
}

#[test]
fn cpu_lists_read_ranges_and_singles() {
    assert_eq!(cpu_list("0-3,6\n"), [0, 1, 2, 3, 6]);
    assert_eq!(cpu_list("5"), [5]);
}

#[test]
fn pinned_udp_threads_run_on_their_steered_cpus_and_unpinned_ones_anywhere() {
    let pinned =
        Server::dns("  upstreams: [\"127.0.0.1:9\"]\n  udpSockets: 2\n  pinUdpThreads: true\n");
    let unpinned = Server::dns("  upstreams: [\"127.0.0.1:9\"]\n  udpSockets: 2\n");
    let usable = allowed_cpus(std::path::Path::new(&format!("/proc/{}", pinned.pid())));
    // Socket N is steered to the N-th usable CPU, wrapping round.
    let expected: Vec<(String, Vec<usize>)> = (0..2)
        .map(|n| (format!("dns-udp-{n}"), vec![usable[n % usable.len()]]))
        .collect();
    assert_eq!(udp_threads(&pinned), expected, "{}", pinned.describe());
    let everywhere: Vec<(String, Vec<usize>)> = (0..2)
        .map(|n| (format!("dns-udp-{n}"), usable.clone()))
        .collect();
    assert_eq!(
        udp_threads(&unpinned),
        everywhere,
        "{}",
        unpinned.describe()
    );
    // Pinned threads still serve, whichever socket the query lands on.
    for _ in 0..4 {
        let reply = dig_ok(pinned.dns, &[&fqdn("api"), "A"]);
        assert_eq!(reply.answers("A"), [PROXY], "{}", reply.raw);
    }
}

#[test]
fn nxdomain_and_nodata_come_back_correctly() {
    let server = Server::dns("  upstreams: [\"127.0.0.1:9\"]\n");
    let soa_of_zone = |r: &Reply| {
        r.authority
            .iter()
            .any(|rr| rr.rtype == "SOA" && rr.name == format!("{ZONE}."))
    };

    let missing = fqdn("no-such-host");
    let nx = dig_ok(server.dns, &[&missing, "A"]);
    assert_eq!(nx.status, "NXDOMAIN", "{}", nx.raw);
    assert!(nx.answer.is_empty(), "{}", nx.raw);
    assert!(
        soa_of_zone(&nx),
        "no SOA of {ZONE} in authority: {}",
        nx.raw
    );
    assert!(nx.has_flag("aa"), "NXDOMAIN without aa: {}", nx.raw);

    let nodata = dig_ok(server.dns, &[&fqdn("api"), "AAAA"]);
    assert_eq!(nodata.status, "NOERROR", "{}", nodata.raw);
    assert!(nodata.answer.is_empty(), "{}", nodata.raw);
    assert!(
        soa_of_zone(&nodata),
        "no SOA of {ZONE} in authority: {}",
        nodata.raw
    );
    assert!(nodata.has_flag("aa"), "NODATA without aa: {}", nodata.raw);
}

#[test]
fn tcp_works_and_truncated_udp_falls_back_to_tcp() {
    // Four TXT strings of 200 bytes: about 850 bytes of answer, more than
    // the 512 a client without EDNS accepts over UDP.
    let texts: Vec<String> = ["a", "b", "c", "d"].iter().map(|c| c.repeat(200)).collect();
    let mut extra = String::from("  upstreams: [\"127.0.0.1:9\"]\n  records:\n");
    for t in &texts {
        extra.push_str(&format!("    - {{name: big, type: TXT, value: {t}}}\n"));
    }
    let server = Server::dns(&extra);
    let big = fqdn("big");
    let quoted: Vec<String> = texts.iter().map(|t| format!("\"{t}\"")).collect();
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };

    let api = dig_ok(server.dns, &["+tcp", &fqdn("api"), "A"]);
    assert_eq!(api.status, "NOERROR", "{}", api.raw);
    assert_eq!(api.answers("A"), [PROXY], "{}", api.raw);
    assert!(api.raw.contains("(TCP)"), "not over TCP: {}", api.raw);

    let over_tcp = dig_ok(server.dns, &["+tcp", &big, "TXT"]);
    assert_eq!(sorted(over_tcp.answers("TXT")), quoted, "{}", over_tcp.raw);

    let truncated = dig_ok(server.dns, &["+noedns", "+ignore", &big, "TXT"]);
    assert!(
        truncated.has_flag("tc"),
        "an {}-byte answer over UDP without EDNS must set tc: {}",
        texts.len() * 200,
        truncated.raw
    );
    assert!(!truncated.raw.contains("(TCP)"), "{}", truncated.raw);

    let fell_back = dig_ok(server.dns, &["+noedns", &big, "TXT"]);
    assert!(
        fell_back.raw.contains("Truncated, retrying in TCP mode"),
        "dig did not get a truncated UDP answer first: {}",
        fell_back.raw
    );
    assert_eq!(fell_back.status, "NOERROR", "{}", fell_back.raw);
    assert!(!fell_back.has_flag("tc"), "{}", fell_back.raw);
    assert_eq!(
        sorted(fell_back.answers("TXT")),
        quoted,
        "{}",
        fell_back.raw
    );
}

#[test]
fn forwarded_names_resolve_through_a_local_upstream_and_are_cached() {
    let upstream = Dnsmasq::start(300);
    let server = Server::dns(&format!("  upstreams: [\"{}\"]\n", upstream.addr));
    let hit = r#"causeway_dns_cache_total{result="hit"}"#;
    let miss = r#"causeway_dns_cache_total{result="miss"}"#;

    let first = dig_ok(server.dns, &["www.example.net", "A"]);
    assert_eq!(
        first.status,
        "NOERROR",
        "{}\n{}",
        first.raw,
        server.describe()
    );
    assert_eq!(first.answers("A"), [UPSTREAM_ANSWER], "{}", first.raw);
    assert!(first.has_flag("ra"), "{}", first.raw);
    let (hits, misses) = (server.sample(hit), server.sample(miss));
    assert!(misses >= 1.0, "the first query was not a miss");

    let second = dig_ok(server.dns, &["www.example.net", "A"]);
    assert_eq!(second.answers("A"), [UPSTREAM_ANSWER], "{}", second.raw);
    assert!(
        second.answer[0].ttl <= 300 && second.answer[0].ttl > 0,
        "{}",
        second.raw
    );
    // Each UDP socket adds its counts to the shared metrics once a second.
    let counted = support::poll_until(Duration::from_secs(3), || {
        (server.sample(hit) >= hits + 1.0).then_some(())
    });
    assert!(
        counted.is_some(),
        "the second query was not a cache hit ({hit} stayed at {hits})"
    );
    assert_eq!(
        server.sample(miss),
        misses,
        "the second query went upstream"
    );
}

/// The wall clock stepped back an hour under a cached answer with a TTL of
/// two seconds: the answer still ends after two seconds of elapsed time.
/// Before, the cache compared the wall clock with the entry's expiry, and
/// the step kept the answer fresh for the hour.
#[test]
fn a_wall_clock_step_back_keeps_no_answer_past_its_ttl() {
    let upstream = Dnsmasq::start(2);
    let dir = tempdir();
    let offset = dir.path().join("offset");
    support::set_clock_offset(&offset, "+0");
    let dns = SocketAddr::from((
        Ipv4Addr::LOCALHOST,
        support::reserved_port_on(Ipv4Addr::LOCALHOST),
    ));
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, support::reserved_port()));
    let path = dir.path().join("causeway.yaml");
    fs::write(
        &path,
        format!(
            r#"log: {{level: info}}
admin: {{listen: "{admin}"}}
cluster: {{name: hc1, baseDomain: example.test}}
dns:
  listen: ["{dns}"]
  proxyAddress: {PROXY}
  ingressAddress: {INGRESS}
  upstreams: ["{}"]
"#,
            upstream.addr
        ),
    )
    .unwrap();
    let mut cmd = Command::new(causeway_bin());
    cmd.args(["dns", "--config"]).arg(&path);
    support::with_faked_wall_clock(&mut cmd, &offset);
    let mut app = Appliance {
        proc: Proc::spawn("causeway", dir.path(), &mut cmd),
        config: path,
        admin: AdminAt::Host(admin),
    };
    app.wait_ready();
    let miss = r#"causeway_dns_cache_total{result="miss"}"#;
    let first = dig_ok(dns, &["www.example.net", "A"]);
    assert_eq!(first.answers("A"), [UPSTREAM_ANSWER], "{}", first.raw);
    let misses = metric(&app.metrics(), miss).unwrap_or(0.0);
    assert!(misses >= 1.0, "the first query was not a miss");

    support::set_clock_offset(&offset, "-1h");
    // Asked again and again: within a few seconds the answer has run out
    // and the next query goes upstream.
    let refetched = poll_until(Duration::from_secs(15), || {
        let again = dig_ok(dns, &["www.example.net", "A"]);
        assert_eq!(again.answers("A"), [UPSTREAM_ANSWER], "{}", again.raw);
        (metric(&app.metrics(), miss).unwrap_or(0.0) > misses).then_some(())
    });
    assert!(
        refetched.is_some(),
        "an answer with a TTL of 2 s was still served from the cache 15 s later, after \
         the wall clock stepped back an hour\n{}",
        app.proc.describe()
    );
}

/// Swaps what [`Server::dns`] was given as `dns_extra` for `dns_extra`, and
/// asks for a reload.
fn reload_with(server: &Server, dns_extra: &str) {
    let path = &server.app.config;
    let current = fs::read_to_string(path).unwrap();
    let base = format!("  ingressAddress: {INGRESS}\n");
    let end = current
        .find(&base)
        .expect("a config written by Server::dns")
        + base.len();
    // Renamed into place, so the file watcher never reads half a config.
    let next = path.with_extension("next");
    fs::write(&next, format!("{}{dns_extra}", &current[..end])).unwrap();
    fs::rename(&next, path).unwrap();
    server.app.proc.signal("HUP");
}

/// dnsperf's count for `label` ("Queries sent:", "Queries lost:", ...).
fn dnsperf_count(report: &str, label: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no `{label}` in dnsperf's report:\n{report}"))
}

/// A reload that names other upstreams is forwarded to them from then on,
/// without a restart. Before, the reload swapped records and views only,
/// reported itself applied, and kept asking the old upstream.
#[test]
fn a_reload_forwards_to_the_new_upstreams_without_a_restart() {
    const OTHER_ANSWER: &str = "192.0.2.77";
    let old = Dnsmasq::start(300);
    let new = Dnsmasq::answering(300, OTHER_ANSWER);
    let server = Server::dns(&format!("  upstreams: [\"{}\"]\n", old.addr));
    let pid = server.pid();
    let before = dig_ok(server.dns, &["www.example.net", "A"]);
    assert_eq!(before.answers("A"), [UPSTREAM_ANSWER], "{}", before.raw);

    let applied = r#"causeway_config_reloads_total{result="applied"}"#;
    // maxUpstreamInFlight only a restart changes: the reload applies the
    // rest and says so.
    reload_with(
        &server,
        &format!(
            "  upstreams: [\"{}\"]\n  maxUpstreamInFlight: 512\n",
            new.addr
        ),
    );
    let reloaded = poll_until(DEADLINE, || (server.sample(applied) >= 1.0).then_some(()));
    assert!(
        reloaded.is_some(),
        "no reload applied\n{}",
        server.describe()
    );
    // A name not cached before the reload (cached answers keep their TTL).
    let after = dig_ok(server.dns, &["after.www.example.net", "A"]);
    assert_eq!(
        after.answers("A"),
        [OTHER_ANSWER],
        "still forwarded to the old upstream after the reload\n{}\n{}",
        after.raw,
        server.describe()
    );
    assert_eq!(server.pid(), pid, "the server restarted");
    assert!(
        server
            .app
            .proc
            .output()
            .contains("dns.cache or dns.maxUpstreamInFlight changed; restart to apply it"),
        "the reload did not say maxUpstreamInFlight needs a restart\n{}",
        server.describe()
    );
    // An answer cached before the reload keeps its TTL: still the old one.
    let cached = dig_ok(server.dns, &["www.example.net", "A"]);
    assert_eq!(cached.answers("A"), [UPSTREAM_ANSWER], "{}", cached.raw);
    let asked = format!(
        "causeway_dns_upstream_seconds_count{{upstream=\"{}\"}}",
        new.addr
    );
    let counted = poll_until(Duration::from_secs(3), || {
        (server.sample(&asked) >= 1.0).then_some(())
    });
    assert!(counted.is_some(), "{asked} stayed 0");
    drop(old);
}

#[test]
fn reloads_of_records_and_views_under_load_lose_no_query() {
    let record =
        |last: u8| format!("  records:\n    - {{name: reg, type: A, value: 10.1.0.{last}}}\n");
    let view = "  views:\n    - name: loopback\n      clients: [127.0.0.0/8]\n      proxyAddress: 10.0.0.99\n";
    let server = Server::dns(&record(1));
    let dir = tempdir();
    let queries = dir.path().join("queries.txt");
    let names = ["api", "reg", "x.y.apps", "missing"];
    let lines: Vec<String> = names.iter().map(|n| format!("{} A\n", fqdn(n))).collect();
    fs::write(&queries, lines.concat()).unwrap();
    // A steady 1500 q/s for 12 s, 20 in flight: bounded in count and time,
    // and long enough that six reloads fit inside it on a loaded machine.
    let mut dnsperf = Proc::spawn(
        "dnsperf",
        dir.path(),
        Command::new(tool("dnsperf", "dnsperf"))
            .arg("-s")
            .arg(server.dns.ip().to_string())
            .arg("-p")
            .arg(server.dns.port().to_string())
            .arg("-d")
            .arg(&queries)
            .args(["-l", "12", "-Q", "1500", "-q", "20", "-t", "2"]),
    );

    // Each reload changes a shared record and adds or removes a view that
    // points api elsewhere for loopback clients; the next one starts once
    // dig sees both changes.
    for round in 0..6u8 {
        let with_view = round % 2 == 0;
        let last = if with_view { 2 } else { 1 };
        reload_with(&server, &(record(last) + if with_view { view } else { "" }));
        let (want_reg, want_api) = (
            format!("10.1.0.{last}"),
            if with_view { "10.0.0.99" } else { PROXY },
        );
        wait_for(
            &format!("reload {round} to be answered"),
            DEADLINE,
            || {
                let reg = dig(server.dns, &[&fqdn("reg"), "A"])?;
                let api = dig(server.dns, &[&fqdn("api"), "A"])?;
                (reg.answers("A") == [want_reg.as_str()] && api.answers("A") == [want_api])
                    .then_some(())
            },
            || server.describe(),
        );
    }
    assert!(
        dnsperf.try_status().is_none(),
        "dnsperf ended before the last reload, so the reloads were not under load\n{}",
        dnsperf.describe()
    );
    // Its 12 s, then up to its 2 s timeout for the last queries.
    let status = dnsperf.wait_exit(Duration::from_secs(20));
    let report = dnsperf.output();
    assert!(status.success(), "dnsperf failed: {report}");
    let sent = dnsperf_count(&report, "Queries sent:");
    let completed = dnsperf_count(&report, "Queries completed:");
    let lost = dnsperf_count(&report, "Queries lost:");
    assert!(
        sent >= 8000,
        "only {sent} queries sent: not the load asked for\n{report}"
    );
    assert_eq!(lost, 0, "queries lost across the reloads\n{report}");
    assert_eq!(completed, sent, "{report}");
}

#[test]
fn dead_upstream_gives_servfail_within_the_timeout() {
    let dead = Blackhole::new();
    let server = Server::dns(&format!(
        "  upstreams: [\"{}\"]\n  upstreamTimeout: 1s\n",
        dead.addr()
    ));
    let started = Instant::now();
    let reply = ask(dig_cmd(
        Command::new(dig_bin()),
        server.dns,
        5,
        &["www.example.net", "A"],
    ))
    .expect("no answer within dig's 5 s: the server must SERVFAIL after upstreamTimeout");
    let took = started.elapsed();
    assert_eq!(reply.status, "SERVFAIL", "{}", reply.raw);
    let ms = reply.query_ms.expect("dig reports the query time");
    assert!(ms < 2500, "SERVFAIL after {ms} ms, upstreamTimeout is 1 s");
    assert!(took < Duration::from_millis(3500), "dig took {took:?}");
    let errors = format!(
        r#"causeway_dns_upstream_errors_total{{reason="timeout",upstream="{}"}}"#,
        dead.addr()
    );
    assert!(server.sample(&errors) >= 1.0, "{errors} not counted");
}

#[test]
fn stale_answer_when_every_upstream_fails() {
    let mut upstream = Dnsmasq::start(1);
    let server = Server::dns(&format!(
        "  upstreams: [\"{}\"]\n  upstreamTimeout: 1s\n",
        upstream.addr
    ));
    let fresh = dig_ok(server.dns, &["www.example.net", "A"]);
    assert_eq!(fresh.answers("A"), [UPSTREAM_ANSWER], "{}", fresh.raw);
    assert!(fresh.answer[0].ttl <= 1, "{}", fresh.raw);

    upstream.proc.kill9();
    let mut last = None;
    let stale = poll_until(DEADLINE, || {
        let r = dig(server.dns, &["www.example.net", "A"]);
        last.clone_from(&r);
        r.filter(|r| r.status == "NOERROR" && r.answer.first().is_some_and(|a| a.ttl == 30))
    })
    .unwrap_or_else(|| {
        panic!(
            "no stale answer (NOERROR, TTL 30) within {DEADLINE:?}; last: {last:#?}\n{}",
            server.describe()
        )
    });
    assert_eq!(stale.answers("A"), [UPSTREAM_ANSWER], "{}", stale.raw);
    assert!(
        server.sample(r#"causeway_dns_cache_total{result="stale"}"#) >= 1.0,
        "a stale answer was served but not counted"
    );
}

/// A DNS query for `name`/A with RD set.
fn query_packet(id: u16, name: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(64);
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        p.push(u8::try_from(label.len()).unwrap());
        p.extend_from_slice(label.as_bytes());
    }
    p.extend_from_slice(&[0, 0, 1, 0, 1]);
    p
}

#[test]
fn memory_stays_bounded_when_the_upstream_blackholes() {
    const QUERIES: u16 = 20_000;
    const MAX_IN_FLIGHT: f64 = 100.0;
    const RSS_LIMIT_KIB: u64 = 64 * 1024;
    let hole = Blackhole::new();
    let server = Server::dns(&format!(
        "  upstreams: [\"{}\"]\n  maxUpstreamInFlight: 100\n  upstreamTimeout: 2s\n",
        hole.addr()
    ));
    let in_flight = "causeway_dns_upstream_in_flight";
    let rss_before = support::rss_kib(server.pid());

    let target = server.dns;
    let flood = std::thread::spawn(move || {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let stop = Instant::now() + Duration::from_secs(3);
        let mut sent = 0u32;
        for i in 0..QUERIES {
            if Instant::now() > stop {
                break;
            }
            let name = format!("n{i}.flood.example.net");
            if s.send_to(&query_packet(i, &name), target).is_ok() {
                sent += 1;
            }
        }
        sent
    });
    // Sample while the flood runs and until the upstream queries time out.
    let mut max_in_flight = 0.0f64;
    let mut max_rss = rss_before;
    let mut samples = 0;
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        max_in_flight = max_in_flight.max(server.sample(in_flight));
        max_rss = max_rss.max(support::rss_kib(server.pid()));
        samples += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let sent = flood.join().unwrap();
    assert!(sent >= u32::from(QUERIES) / 2, "only {sent} queries sent");
    // Every upstream query ends by upstreamTimeout.
    wait_for(
        "the upstream queries to time out",
        DEADLINE,
        || (server.sample(in_flight) == 0.0).then_some(()),
        || server.describe(),
    );
    max_rss = max_rss.max(support::rss_kib(server.pid()));

    assert!(
        max_in_flight > 0.0,
        "{in_flight} never rose in {samples} samples: the flood did not reach the upstream"
    );
    assert!(
        max_in_flight <= MAX_IN_FLIGHT,
        "{in_flight} reached {max_in_flight}, maxUpstreamInFlight is {MAX_IN_FLIGHT}"
    );
    assert!(
        max_rss < RSS_LIMIT_KIB,
        "VmRSS rose from {rss_before} KiB to {max_rss} KiB (limit {RSS_LIMIT_KIB} KiB)"
    );
    let api = dig_ok(server.dns, &[&fqdn("api"), "A"]);
    assert_eq!(api.status, "NOERROR", "{}", api.raw);
    assert_eq!(api.answers("A"), [PROXY], "{}", api.raw);
    eprintln!("flood: {sent} queries, VmRSS {rss_before} -> max {max_rss} KiB, in flight max {max_in_flight}");
}

#[test]
fn clients_outside_the_allowed_cidrs_get_refused() {
    // A dead upstream: were the query forwarded, it would SERVFAIL, not
    // be refused.
    let dead = Blackhole::new();
    let server = Server::dns(&format!(
        "  upstreams: [\"{}\"]\n  upstreamTimeout: 1s\n  recursionClients: [10.0.0.0/8]\n",
        dead.addr()
    ));
    let refused = dig_ok(server.dns, &["www.example.net", "A"]);
    assert_eq!(refused.status, "REFUSED", "{}", refused.raw);
    assert!(refused.answer.is_empty(), "{}", refused.raw);
    assert!(
        !refused.has_flag("ra"),
        "recursion is not available to this client: {}",
        refused.raw
    );

    let api = dig_ok(server.dns, &[&fqdn("api"), "A"]);
    assert_eq!(api.status, "NOERROR", "{}", api.raw);
    assert_eq!(api.answers("A"), [PROXY], "{}", api.raw);
    assert!(api.has_flag("aa"), "{}", api.raw);
    assert_eq!(
        server.sample(r#"causeway_dns_cache_total{result="miss"}"#),
        0.0,
        "a refused query reached the forwarder"
    );
}

// ------------------------------------------------------- DHCP names in DNS

fn reverse_of(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("{}.{}.{}.{}.in-addr.arpa.", o[3], o[2], o[1], o[0])
}

#[test]
fn dhcp_names_resolve_and_stop_after_release() {
    let dir = tempdir();
    let dead = Blackhole::new();
    let dns = SocketAddr::from((
        Ipv4Addr::LOCALHOST,
        support::reserved_port_on(Ipv4Addr::LOCALHOST),
    ));
    let dhcp = SocketAddr::from((Ipv4Addr::LOCALHOST, support::reserved_port()));
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, support::reserved_port()));
    let config = format!(
        r#"log: {{level: info}}
admin: {{listen: "{admin}"}}
cluster: {{name: hc1, baseDomain: example.test}}
# The VLAN is never configured on this host: it gives DNS its reverse zone.
network:
  cidr: 10.9.0.0/24
  gateway: 10.9.0.1
  address: 10.9.0.2
dhcp:
  listen: [{{address: "{dhcp}"}}]
  leaseFile: {leases}
  subnets:
    - cidr: 10.9.0.0/24
      relayAddresses: [127.0.0.1]
      serverId: 127.0.0.1
      pools: [{{start: 10.9.0.100, end: 10.9.0.150}}]
dns:
  listen: ["{dns}"]
  upstreams: ["{upstream}"]
  upstreamTimeout: 1s
"#,
        leases = dir.path().join("leases.jsonl").display(),
        upstream = dead.addr(),
    );
    let server = Server::start("appliance", dir, dns, admin, &config);
    let name = fqdn("vm-7");
    let name_dot = format!("{name}.");

    let mut relay = support::Relay::new(dhcp);
    let mac = [0x52, 0x54, 0x00, 0x0c, 0x00, 0x07];
    let ip = relay
        .dora(mac, &[DhcpOption::Hostname("vm-7".into())])
        .yiaddr();
    let ip_text = ip.to_string();

    let forward = wait_for(
        &format!("{name} to resolve"),
        DEADLINE,
        || dig(dns, &[&name, "A"]).filter(|r| r.status == "NOERROR" && !r.answer.is_empty()),
        || server.describe(),
    );
    assert_eq!(forward.answers("A"), [ip_text.as_str()], "{}", forward.raw);
    assert!(forward.has_flag("aa"), "{}", forward.raw);

    let reverse = dig_ok(dns, &["-x", &ip_text]);
    assert_eq!(reverse.status, "NOERROR", "{}", reverse.raw);
    assert_eq!(reverse.answer[0].name, reverse_of(ip), "{}", reverse.raw);
    assert_eq!(
        reverse.answers("PTR"),
        [name_dot.as_str()],
        "{}",
        reverse.raw
    );

    relay.release(mac, ip);
    let mut last = None;
    poll_until(DEADLINE, || {
        let r = dig(dns, &[&name, "A"]);
        last.clone_from(&r);
        r.filter(|r| r.status == "NXDOMAIN")
    })
    .unwrap_or_else(|| {
        panic!(
            "{name} still resolves {DEADLINE:?} after RELEASE; last: {last:#?}\n{}",
            server.describe()
        )
    });
    let reverse = dig_ok(dns, &["-x", &ip_text]);
    assert_eq!(
        reverse.status, "NXDOMAIN",
        "the PTR outlived the release: {}",
        reverse.raw
    );
    server.app.stop();
}

/// The comparison's reference responder (`causeway-bench dns-floor`)
/// answers real clients as its docs say: one A record for an A question,
/// NODATA for any other type. It drops what is not a query without
/// answering and goes on serving, and on SIGTERM it reports exactly what
/// it answered and dropped, then exits 0.
#[test]
fn dns_floor_answers_dig_drops_garbage_and_reports_its_counts() {
    let dir = tempdir();
    let listen = SocketAddr::from(([127, 0, 0, 1], support::reserved_port()));
    let mut floor = Proc::spawn(
        "dns-floor",
        dir.path(),
        Command::new(support::bench_bin()).args([
            "dns-floor",
            "--listen",
            &listen.to_string(),
            "--sockets",
            "2",
            "--answer",
            "192.0.2.7",
            "--json",
        ]),
    );
    // It says so once every socket of the group is bound.
    wait_for(
        "dns-floor to bind",
        DEADLINE,
        || {
            floor
                .output()
                .contains("dns-floor: answering on")
                .then_some(())
        },
        || floor.describe(),
    );

    let a = dig_ok(listen, &["api.hc1.example.com", "A"]);
    assert_eq!(a.status, "NOERROR", "{}", a.raw);
    assert!(a.has_flag("aa"), "{}", a.raw);
    assert_eq!(a.answers("A"), ["192.0.2.7"], "{}", a.raw);
    let aaaa = dig_ok(listen, &["api.hc1.example.com", "AAAA"]);
    assert_eq!(aaaa.status, "NOERROR", "{}", aaaa.raw);
    assert!(aaaa.answer.is_empty(), "{}", aaaa.raw);

    // Two datagrams that are not queries (too short; a response), then a
    // query: the only reply that comes back is the query's.
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.set_read_timeout(Some(DEADLINE)).unwrap();
    client.send_to(&[0xff; 7], listen).unwrap();
    let mut response = query_packet(0x0102, "x.apps.hc1.example.com");
    response[2] |= 0x80;
    client.send_to(&response, listen).unwrap();
    client
        .send_to(&query_packet(0x0a0b, "x.apps.hc1.example.com"), listen)
        .unwrap();
    let mut buf = [0u8; 512];
    let (len, _) = client.recv_from(&mut buf).expect("no reply to the query");
    assert_eq!(
        &buf[..2],
        [0x0a, 0x0b],
        "a reply to something that was not a query"
    );
    assert_eq!(&buf[6..8], [0, 1], "ANCOUNT of {:?}", &buf[..len]);

    floor.signal("TERM");
    assert!(floor.wait_exit(DEADLINE).success(), "{}", floor.describe());
    let output = floor.output();
    let summary: serde_json::Value = output
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON summary in:\n{output}"));
    assert_eq!(summary["answered"], 3, "{summary}");
    assert_eq!(summary["malformed"], 2, "{summary}");
    assert_eq!(summary["sockets"], 2, "{summary}");
    assert_eq!(summary["stopped_by"], "terminated", "{summary}");
}

// ------------------------------------------------------- hostile upstreams

/// Where a query's question ends (after its name, type and class).
fn question_end(query: &[u8]) -> Option<usize> {
    let mut at = 12;
    loop {
        let len = usize::from(*query.get(at)?);
        if len == 0 {
            return Some(at + 5).filter(|end| *end <= query.len());
        }
        at += 1 + len;
    }
}

/// An upstream on loopback that answers every name: over UDP with TC set
/// (so the server asks again over TCP), over TCP with `records` TXT records
/// of 200 bytes each, TTL one hour, one connection at a time and each
/// answer `tcp_pause` after its query: a slow upstream. Stops when dropped.
struct LargeAnswers {
    addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl LargeAnswers {
    fn start(records: u16, tcp_pause: Duration) -> LargeAnswers {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let port = support::reserved_port_on(Ipv4Addr::LOCALHOST);
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let udp = UdpSocket::bind(addr).unwrap();
        udp.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let tcp = std::net::TcpListener::bind(addr).unwrap();
        tcp.set_nonblocking(true).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let answer = move |query: &[u8], truncated: bool| -> Option<Vec<u8>> {
            let end = question_end(query)?;
            let mut r = Vec::with_capacity(12 + end + usize::from(records) * 213);
            r.extend_from_slice(&query[..2]);
            r.extend_from_slice(&[if truncated { 0x82 } else { 0x80 }, 0x80, 0, 1]);
            let count = if truncated { 0 } else { records };
            r.extend_from_slice(&count.to_be_bytes());
            r.extend_from_slice(&[0, 0, 0, 0]);
            r.extend_from_slice(&query[12..end]);
            for i in 0..count {
                r.extend_from_slice(&[0xC0, 12, 0, 16, 0, 1]);
                r.extend_from_slice(&3600u32.to_be_bytes());
                r.extend_from_slice(&201u16.to_be_bytes());
                r.push(200);
                r.extend_from_slice(format!("{i:0>200}").as_bytes());
            }
            Some(r)
        };
        let udp_stop = stop.clone();
        let udp_thread = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !udp_stop.load(Ordering::Relaxed) {
                if let Ok((n, from)) = udp.recv_from(&mut buf) {
                    if let Some(r) = answer(&buf[..n], true) {
                        let _ = udp.send_to(&r, from);
                    }
                }
            }
        });
        let tcp_stop = stop.clone();
        let tcp_thread = std::thread::spawn(move || {
            while !tcp_stop.load(Ordering::Relaxed) {
                let Ok((mut s, _)) = tcp.accept() else {
                    // Nonblocking accept: nothing waiting; look again soon.
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                };
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                let mut len = [0u8; 2];
                if s.read_exact(&mut len).is_err() {
                    continue;
                }
                let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
                if s.read_exact(&mut q).is_err() {
                    continue;
                }
                // Models a slow upstream, so queries pile up in flight on any
                // machine, however fast.
                std::thread::sleep(tcp_pause);
                if let Some(r) = answer(&q, false) {
                    let mut framed = u16::try_from(r.len()).unwrap().to_be_bytes().to_vec();
                    framed.extend_from_slice(&r);
                    let _ = s.write_all(&framed);
                }
            }
        });
        LargeAnswers {
            addr,
            stop,
            threads: vec![udp_thread, tcp_thread],
        }
    }
}

impl Drop for LargeAnswers {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[test]
fn a_flood_of_large_answers_stays_within_the_cache_budget() {
    const NAMES: u16 = 12_000;
    const BUDGET: f64 = 4.0 * 1024.0 * 1024.0;
    // Allocator slack, buffers, in-flight answers: what a 4 MiB cache may
    // cost beyond its own count. Without the byte budget the flood would
    // cache about 12,000 x 5.7 KB = 68 MB.
    const MARGIN_KIB: u64 = 24 * 1024;
    // 2 ms per answer: at most 500 answers a second against a flood of
    // about 5,000 names a second, so the in-flight bound (1024) is reached.
    let upstream = LargeAnswers::start(28, Duration::from_millis(2));
    let server = Server::dns(&format!(
        "  upstreams: [\"{}\"]\n  cache: {{maxBytes: {}}}\n",
        upstream.addr, BUDGET as u64
    ));
    let rss_before = support::rss_kib(server.pid());
    let target = server.dns;
    let flood = std::thread::spawn(move || {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let stop = Instant::now() + Duration::from_secs(30);
        let mut sent = 0u32;
        for i in 0..NAMES {
            if Instant::now() > stop {
                break;
            }
            let name = format!("n{i}.large.example.net");
            if s.send_to(&query_packet(i, &name), target).is_ok() {
                sent += 1;
            }
            if i % 50 == 49 {
                // Paced below what a debug build forwards over TCP, so the
                // names are cached rather than refused as overload.
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        sent
    });
    let mut max_rss = rss_before;
    let mut max_in_flight = 0.0f64;
    while !flood.is_finished() {
        max_rss = max_rss.max(support::rss_kib(server.pid()));
        max_in_flight = max_in_flight.max(server.sample("causeway_dns_upstream_in_flight"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let sent = flood.join().unwrap();
    wait_for(
        "the forwarded queries to finish",
        DEADLINE,
        || (server.sample("causeway_dns_upstream_in_flight") == 0.0).then_some(()),
        || server.describe(),
    );
    max_rss = max_rss.max(support::rss_kib(server.pid()));
    let held = server.sample("causeway_dns_cache_bytes");
    let entries = server.sample("causeway_dns_cache_entries");
    assert!(
        held <= BUDGET,
        "causeway_dns_cache_bytes {held} over {BUDGET}"
    );
    assert!(
        held > BUDGET / 2.0 && entries > 300.0,
        "the flood did not fill the cache: {held} bytes, {entries} entries\n{}",
        server.describe()
    );
    assert!(
        max_in_flight >= 512.0,
        "the slow upstream should have kept hundreds of queries in flight, \
         what memory per query would show in; saw at most {max_in_flight}"
    );
    assert!(
        max_rss < rss_before + (BUDGET / 1024.0) as u64 + MARGIN_KIB,
        "VmRSS rose from {rss_before} KiB to {max_rss} KiB, over the 4 MiB budget + {MARGIN_KIB} KiB"
    );
    let api = dig_ok(server.dns, &[&fqdn("api"), "A"]);
    assert_eq!(api.answers("A"), [PROXY], "{}", api.raw);
    eprintln!(
        "large-answer flood: {sent} names, cache {held} bytes in {entries} entries, \
         VmRSS {rss_before} -> max {max_rss} KiB, up to {max_in_flight} upstream queries in flight"
    );
}

// ------------------------------------------------- out of descriptors

/// CPU time `pid` has used, user and system, from /proc/<pid>/stat.
fn cpu_time(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) end with ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second = support::run(Command::new("getconf").arg("CLK_TCK"))
        .trim()
        .parse::<u64>()
        .unwrap();
    Duration::from_millis(ticks * 1000 / per_second)
}

/// A DNS query for `api.<zone>` A over an open TCP stream; the reply's
/// ID, RCODE and answer count.
fn tcp_ask(stream: &mut std::net::TcpStream) -> (u16, u8, u16) {
    use std::io::{Read, Write};
    let mut q = vec![0x4a, 0x17, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in fqdn("api").trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    let mut framed = (q.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&q);
    stream.write_all(&framed).unwrap();
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).unwrap();
    let mut reply = vec![0u8; u16::from_be_bytes(len) as usize];
    stream.read_exact(&mut reply).unwrap();
    (
        u16::from_be_bytes([reply[0], reply[1]]),
        reply[3] & 0x0f,
        u16::from_be_bytes([reply[6], reply[7]]),
    )
}

#[test]
fn out_of_descriptors_the_tcp_accept_loop_backs_off_instead_of_spinning_and_recovers() {
    let server = Server::dns("");
    let pid = server.pid();
    let limits = fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
        .unwrap();
    // No descriptor left: the soft limit down to the lowest free
    // descriptor number (those open above it stay usable).
    support::set_open_files(pid, support::free_descriptor(pid, 0));
    // The kernel completes the handshake and queues the connection;
    // every accept of it fails with EMFILE until the limit is raised.
    let mut client = std::net::TcpStream::connect(server.dns).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let starved_from = Instant::now();
    let cpu_before = cpu_time(pid);
    // A three-second window of the process's own CPU time: spinning on
    // the failing accept would take about a core for all of it.
    std::thread::sleep(Duration::from_secs(3));
    let cpu = cpu_time(pid).saturating_sub(cpu_before);
    support::set_open_files(pid, soft);
    let starved_for = starved_from.elapsed();
    // The queued client is taken at the next try (at most a second on)
    // and answered.
    let asked = Instant::now();
    let (id, rcode, answers) = tcp_ask(&mut client);
    let answered_in = asked.elapsed();
    assert_eq!((id, rcode), (0x4a17, 0), "the queued TCP client's query");
    assert!(answers >= 1, "no answer for api over TCP");
    let starved = server.sample(r#"causeway_dns_dropped_total{reason="tcp_accept_starved"}"#);
    let warnings = server
        .app
        .proc
        .output()
        .matches("backing off until descriptors free up")
        .count();
    eprintln!(
        "accept starved for {starved_for:?}: {starved} failed accepts, {cpu:?} of CPU in 3 s, \
         {warnings} warning(s); the queued client answered {answered_in:?} after the limit was raised"
    );
    assert!(
        cpu < Duration::from_millis(300),
        "the DNS server used {cpu:?} of CPU in 3 s out of descriptors"
    );
    // Backing off from 10 ms, doubling to 1 s: 9 tries in the first 3.3 s,
    // one a second after that.
    assert!(
        (5.0..=20.0).contains(&starved),
        "{starved} failed accepts while out of descriptors for {starved_for:?}"
    );
    assert_eq!(
        warnings,
        1,
        "one warning per episode\n{}",
        server.describe()
    );
    assert!(
        answered_in < Duration::from_millis(1500),
        "the queued client waited {answered_in:?} after descriptors came back"
    );
}

#[test]
fn a_client_over_v6_gets_both_families_and_reverse_names_under_ip6_arpa() {
    let dir = tempdir();
    let port = support::reserved_port_on(Ipv4Addr::LOCALHOST);
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let v6 = SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
    let admin = SocketAddr::from((Ipv4Addr::LOCALHOST, support::reserved_port()));
    let config = format!(
        r#"log: {{level: info}}
admin: {{listen: "{admin}"}}
cluster: {{name: hc1, baseDomain: example.test}}
dns:
  listen: ["{v4}", "{v6}"]
  proxyAddress: {PROXY}
  proxyAddressV6: "fd42:10::2"
  upstreams: ["127.0.0.1:9"]
  records:
    - {{name: registry, type: AAAA, value: "fd42:10::20"}}
    - {{name: "fd42:10::20", type: PTR, value: registry}}
"#
    );
    let server = Server::start("dns", dir, v4, admin, &config);
    for (server_at, transport) in [(v6, "+notcp"), (v6, "+tcp"), (server.dns, "+notcp")] {
        let aaaa = dig_ok(server_at, &[&fqdn("api"), "AAAA", transport]);
        assert_eq!(aaaa.answers("AAAA"), ["fd42:10::2"], "{}", aaaa.raw);
        let a = dig_ok(server_at, &[&fqdn("api-int"), "A", transport]);
        assert_eq!(a.answers("A"), [PROXY], "{}", a.raw);
    }
    let registry = dig_ok(v6, &[&fqdn("registry"), "AAAA"]);
    assert_eq!(
        registry.answers("AAAA"),
        ["fd42:10::20"],
        "{}",
        registry.raw
    );
    let ptr = dig_ok(v6, &["-x", "fd42:10::20"]);
    assert_eq!(
        ptr.answers("PTR"),
        [format!("registry.{ZONE}.")],
        "{}",
        ptr.raw
    );
}
