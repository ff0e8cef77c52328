//! The end-to-end VLAN lab: the whole product in network namespaces, with
//! real tools only.
//!
//! ```text
//!  vm (dhclient) ──┐                              ┌── pod: 10.0.0.1 (dnsmasq)
//!                  │ vlan: bridge br0             │   control-plane stand-ins
//!  router .1 ──────┤ 192.168.100.0/24             │   10.0.0.11-16 (openssl
//!   │              │                              │   s_server, rcgen certs)
//!   │              └── appliance net1 .2 ─ eth0 10.0.0.2 (default route)
//!  remote 192.168.200.10 (behind the router)
//! ```
//!
//! It proves, in order: a lease for the VM with router, DNS and domain; the
//! hosted cluster's names through causeway DNS; the control plane through
//! the proxy by port and SNI; that a client behind the router is answered
//! only with policy routing on; hot reload with an established connection;
//! and a restart that keeps the VM's lease.
//!
//! Needs root (it prints a SKIP line otherwise). As a demo:
//! `CAUSEWAY_LAB_HOLD=1 cargo test -p causeway --test lab vlan_lab:: -- --nocapture`
//! leaves the lab up after the checks until Enter is pressed (see
//! tests/lab/README.md).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::time::{Duration, Instant};

use support::{
    causeway_bin, metric, poll_until, root_or_skip, tls_cert, tool, wait_for, AdminAt, Appliance,
    Netns, Proc,
};
use tempfile::TempDir;

const ZONE: &str = "hc1.example.com";
const APPLIANCE_IP: &str = "192.168.100.2";
const DEADLINE: Duration = Duration::from_secs(20);
const ADMIN_PORT: u16 = 9090;

/// The control-plane stand-ins: (file, names in the certificate, listen).
/// Each name resolves on the pod network through the lab's dnsmasq.
const STAND_INS: [(&str, &[&str], &str); 6] = [
    (
        "kube-apiserver",
        &["api.hc1.example.com", "api-int.hc1.example.com"],
        "10.0.0.11:6443",
    ),
    ("oauth", &["oauth.hc1.example.com"], "10.0.0.12:6443"),
    ("ignition", &["ignition.hc1.example.com"], "10.0.0.13:443"),
    (
        "konnectivity",
        &["konnectivity.hc1.example.com"],
        "10.0.0.14:8091",
    ),
    (
        "ingress-a",
        &["ingress-a.apps.hc1.example.com", "*.apps.hc1.example.com"],
        "10.0.0.15:443",
    ),
    (
        "ingress-b",
        &["ingress-b.apps.hc1.example.com", "*.apps.hc1.example.com"],
        "10.0.0.16:443",
    ),
];

struct Lab {
    dir: TempDir,
    vm: Netns,
    remote: Netns,
    appl: Netns,
    router: Netns,
    // Kept for their Drop: namespaces go, processes stop.
    _vlan: Netns,
    pod: Netns,
    _servers: Vec<Proc>,
    certs: HashMap<&'static str, PathBuf>,
}

fn sysctl(ns: &Netns, setting: &str) {
    let ok = ns
        .command(tool("sysctl", "procps"))
        .args(["-qw", setting])
        .status()
        .unwrap()
        .success();
    assert!(ok, "sysctl -w {setting} in {}", ns.name());
}

impl Lab {
    fn up() -> Lab {
        let dir = tempfile::Builder::new()
            .prefix("causeway-lab-")
            .tempdir()
            .unwrap();
        let vlan = Netns::new("vlan");
        let vm = Netns::new("vm");
        let router = Netns::new("router");
        let remote = Netns::new("remote");
        let appl = Netns::new("appl");
        let pod = Netns::new("pod");

        vlan.ip(&["link", "add", "br0", "type", "bridge"]);
        vlan.ip(&["link", "set", "br0", "up"]);
        for (ns, inside, port) in [
            (&vm, "eth0", "p-vm"),
            (&router, "vlan0", "p-router"),
            (&appl, "net1", "p-appl"),
        ] {
            ns.veth_to(inside, None, &vlan, port, None);
            vlan.ip(&["link", "set", port, "master", "br0"]);
        }
        router.ip(&["addr", "add", "192.168.100.1/24", "dev", "vlan0"]);
        router.veth_to("rem0", None, &remote, "eth0", None);
        router.ip(&["addr", "add", "192.168.200.1/24", "dev", "rem0"]);
        sysctl(&router, "net.ipv4.ip_forward=1");
        remote.ip(&["addr", "add", "192.168.200.10/24", "dev", "eth0"]);
        remote.ip(&["route", "add", "default", "via", "192.168.200.1"]);

        appl.ip(&["addr", "add", "192.168.100.2/24", "dev", "net1"]);
        appl.veth_to("eth0", None, &pod, "cp0", None);
        appl.ip(&["addr", "add", "10.0.0.2/24", "dev", "eth0"]);
        // The pod network holds the appliance's default route, as in a pod.
        appl.ip(&["route", "add", "default", "via", "10.0.0.1"]);
        pod.ip(&["addr", "add", "10.0.0.1/24", "dev", "cp0"]);

        let mut servers = Vec::new();
        let mut certs = HashMap::new();
        let mut records = Vec::new();
        for (file, names, listen) in STAND_INS {
            let ip = listen.split(':').next().unwrap();
            pod.ip(&["addr", "add", &format!("{ip}/24"), "dev", "cp0"]);
            let (pem, key) = tls_cert(dir.path(), file, names);
            let mut cmd = pod.command(tool("openssl", "openssl"));
            cmd.args(["s_server", "-quiet", "-www", "-accept", listen, "-cert"])
                .arg(&pem)
                .arg("-key")
                .arg(&key);
            servers.push(Proc::spawn(file, dir.path(), &mut cmd));
            certs.insert(file, pem);
        }
        for (name, ip) in [
            ("kube-apiserver.clusters-hc1.svc", "10.0.0.11"),
            ("oauth-openshift.clusters-hc1.svc", "10.0.0.12"),
            ("ignition-server-proxy.clusters-hc1.svc", "10.0.0.13"),
            ("konnectivity-server.clusters-hc1.svc", "10.0.0.14"),
            ("registry.corp.test", "10.0.0.99"),
        ] {
            records.push(format!("--host-record={name},{ip}"));
        }
        let mut dns = pod.command(tool("dnsmasq", "dnsmasq-base"));
        dns.args(support::DNSMASQ_ALONE)
            .args(["--listen-address=10.0.0.1", "--user=nobody"])
            .arg(format!(
                "--pid-file={}",
                dir.path().join("dnsmasq.pid").display()
            ))
            .args(&records);
        servers.push(Proc::spawn("dnsmasq", dir.path(), &mut dns));

        for (file, _, listen) in STAND_INS {
            wait_for(
                &format!("the {file} stand-in on {listen}"),
                DEADLINE,
                || pod.tcp_open(listen).then_some(()),
                String::new,
            );
        }
        wait_for(
            "dnsmasq on the pod network",
            DEADLINE,
            || {
                dig(&pod, "10.0.0.1", "kube-apiserver.clusters-hc1.svc", 2)
                    .filter(|a| a == "10.0.0.11")
            },
            || servers.last().map(|p| p.describe()).unwrap_or_default(),
        );
        Lab {
            dir,
            vm,
            remote,
            appl,
            router,
            _vlan: vlan,
            pod,
            _servers: servers,
            certs,
        }
    }

    fn config(&self, routing: bool, extra: &str, ingress: &str) -> PathBuf {
        let path = self.dir.path().join("appliance.yaml");
        let leases = self.dir.path().join("leases.jsonl");
        let routing = if routing {
            "routing:\n  extraRoutes: [192.168.200.0/24]\n"
        } else {
            ""
        };
        let text = format!(
            r#"admin: {{listen: "127.0.0.1:{ADMIN_PORT}"}}
cluster: {{name: hc1, baseDomain: example.com}}
network:
  interface: net1
  cidr: 192.168.100.0/24
  gateway: 192.168.100.1
  address: {APPLIANCE_IP}
{routing}dhcp:
  leaseFile: {leases}
  subnets:
    - pools: [{{start: 192.168.100.100, end: 192.168.100.150}}]
dns:
  upstreams: ["10.0.0.1"]
  records:
    - {{name: registry, type: A, value: 192.168.100.20}}
{extra}proxy:
  resolvers: ["10.0.0.1"]
  ingressHttps: "{ingress}"
"#,
            leases = leases.display()
        );
        // Replace in one step, so the file watcher never reads half a file.
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, &path).unwrap();
        path
    }

    fn start_appliance(&self, name: &str, config: &Path) -> (Appliance, Duration) {
        let started = Instant::now();
        let admin = AdminAt::Netns {
            ns: self.appl.name().to_string(),
            port: ADMIN_PORT,
        };
        let a = Appliance::start(name, self.dir.path(), Some(&self.appl), config, admin);
        (a, started.elapsed())
    }
}

/// The first A answer for `name` from `server`, asked from inside `ns`.
fn dig(ns: &Netns, server: &str, name: &str, timeout_s: u32) -> Option<String> {
    let out = ns
        .command(tool("dig", "bind9-dnsutils"))
        .arg(format!("@{server}"))
        .args([name, "A", "+short", "+tries=1"])
        .arg(format!("+time={timeout_s}"))
        .stdin(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .find(|l| l.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_string)
}

/// An HTTPS GET from `ns` to `name:port` at `ip`, verifying the server's
/// certificate against `ca` (the stand-in's own): success means the
/// connection reached that stand-in. Returns the page.
fn curl(ns: &Netns, ca: &Path, name: &str, port: u16, ip: &str) -> Result<String, String> {
    let out = ns
        .command(tool("curl", "curl"))
        .args(["-sS", "--max-time", "5", "--cacert"])
        .arg(ca)
        .arg("--resolve")
        .arg(format!("{name}:{port}:{ip}"))
        .arg(format!("https://{name}:{port}/"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The certificate subject a TLS client in `ns` sees for `sni` on :443.
fn subject(ns: &Netns, sni: &str) -> String {
    support::s_client_subject(
        ns.command(tool("openssl", "openssl"))
            .args(["s_client", "-connect", &format!("{APPLIANCE_IP}:443")])
            .args(["-servername", sni]),
    )
}

/// dhclient in the VM namespace, with a hook of ours that records what it
/// is given and sets only the leased address on the VM's interface.
struct Dhclient {
    proc: Proc,
    hook_log: PathBuf,
}

impl Dhclient {
    fn start(lab: &Lab, name: &str) -> Dhclient {
        let dir = lab.dir.path().join("dhclient");
        fs::create_dir_all(&dir).unwrap();
        let hook_log = dir.join(format!("{name}.hook.log"));
        let hook = dir.join("hook.sh");
        support::dhclient_hook(
            &hook,
            &hook_log,
            "$reason ip=$new_ip_address routers=$new_routers dns=$new_domain_name_servers domain=$new_domain_name",
        );
        let conf = dir.join("dhclient.conf");
        fs::write(
            &conf,
            "request subnet-mask, routers, domain-name, domain-name-servers;\n",
        )
        .unwrap();
        let mut cmd = lab.vm.command(tool("dhclient", "isc-dhcp-client"));
        cmd.args(["-4", "-1", "-d", "-v", "-sf"])
            .arg(&hook)
            .arg("-cf")
            .arg(&conf)
            .arg("-lf")
            .arg(dir.join("dhclient.leases"))
            .arg("-pf")
            .arg(dir.join(format!("{name}.pid")))
            .arg("eth0");
        Dhclient {
            proc: Proc::spawn(name, lab.dir.path(), &mut cmd),
            hook_log,
        }
    }

    /// The first bound event's line.
    fn bound(&mut self) -> String {
        let log = self.hook_log.clone();
        let proc = &mut self.proc;
        let found = poll_until(DEADLINE, || {
            let text = fs::read_to_string(&log).unwrap_or_default();
            if let Some(l) = text.lines().find(|l| {
                ["BOUND ", "RENEW ", "REBIND ", "REBOOT "]
                    .iter()
                    .any(|p| l.starts_with(p))
            }) {
                return Some(Ok(l.to_string()));
            }
            proc.try_status().map(Err)
        });
        match found {
            Some(Ok(line)) => line,
            other => panic!(
                "dhclient did not bind ({other:?})\n{}",
                self.proc.describe()
            ),
        }
    }
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or("")
}

/// An `openssl s_client` from the VM through the proxy's :6443, held open
/// with its stdin, its output in a file.
struct HeldTls {
    child: Child,
    stdin: Option<ChildStdin>,
    out: PathBuf,
}

impl HeldTls {
    fn open(lab: &Lab) -> HeldTls {
        let out = lab.dir.path().join("held.out");
        let mut child = lab
            .vm
            .command(tool("openssl", "openssl"))
            .args([
                "s_client",
                "-quiet",
                "-connect",
                &format!("{APPLIANCE_IP}:6443"),
            ])
            .args(["-servername", &format!("api.{ZONE}")])
            .stdin(Stdio::piped())
            .stdout(fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        HeldTls { child, stdin, out }
    }

    /// Sends an HTTP request over the held connection; the stand-in's page
    /// comes back only if the connection survived.
    fn request(&mut self) -> String {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        stdin.flush().unwrap();
        let out = self.out.clone();
        poll_until(Duration::from_secs(10), || {
            let text = fs::read_to_string(&out).unwrap_or_default();
            text.contains("s_server").then_some(text)
        })
        .unwrap_or_else(|| fs::read_to_string(&self.out).unwrap_or_default())
    }
}

impl Drop for HeldTls {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn vm_sees_the_control_plane(lab: &Lab, from: &Netns, who: &str) {
    // DNS: the hosted cluster's names point at the proxy.
    for name in [format!("api.{ZONE}"), format!("a.b.apps.{ZONE}")] {
        assert_eq!(
            dig(from, APPLIANCE_IP, &name, 3).as_deref(),
            Some(APPLIANCE_IP),
            "{who}: {name}"
        );
    }
    // The proxy: by port to the kube-apiserver stand-in, by SNI on 443 to
    // the others; each verifies the stand-in's own certificate.
    let api = dig(from, APPLIANCE_IP, &format!("api.{ZONE}"), 3).unwrap();
    let page = curl(
        from,
        &lab.certs["kube-apiserver"],
        &format!("api.{ZONE}"),
        6443,
        &api,
    )
    .unwrap_or_else(|e| panic!("{who}: api through the proxy: {e}"));
    assert!(page.contains("s_server"), "{who}: {page}");
    for (file, name) in [
        ("oauth", format!("oauth.{ZONE}")),
        ("ignition", format!("ignition.{ZONE}")),
        ("konnectivity", format!("konnectivity.{ZONE}")),
    ] {
        curl(from, &lab.certs[file], &name, 443, APPLIANCE_IP)
            .unwrap_or_else(|e| panic!("{who}: {name} through the proxy: {e}"));
    }
}

#[test]
fn the_vlan_lab_end_to_end() {
    if !root_or_skip("the_vlan_lab_end_to_end") {
        return;
    }
    let lab = Lab::up();

    // --- Without policy routing: the VM on the VLAN is served, a client
    // behind the router is not (its replies leave by the pod network).
    let cfg = lab.config(false, "", "10.0.0.15:443");
    let (appliance, _) = lab.start_appliance("appliance-no-routing", &cfg);
    let mut dhclient = Dhclient::start(&lab, "dhclient-1");
    let bound = dhclient.bound();
    let vm_ip = field(&bound, "ip").to_string();
    assert!(vm_ip.starts_with("192.168.100."), "{bound}");
    assert_eq!(field(&bound, "routers"), "192.168.100.1", "{bound}");
    assert_eq!(field(&bound, "dns"), APPLIANCE_IP, "{bound}");
    assert_eq!(field(&bound, "domain"), ZONE, "{bound}");
    vm_sees_the_control_plane(&lab, &lab.vm, "the VM");
    // A forwarded name, answered by the pod network's resolver.
    assert_eq!(
        dig(&lab.vm, APPLIANCE_IP, "registry.corp.test", 3).as_deref(),
        Some("10.0.0.99")
    );
    assert_eq!(
        dig(&lab.remote, APPLIANCE_IP, &format!("api.{ZONE}"), 1),
        None,
        "the routed client was answered without policy routing"
    );
    assert!(
        curl(
            &lab.remote,
            &lab.certs["kube-apiserver"],
            &format!("api.{ZONE}"),
            6443,
            APPLIANCE_IP
        )
        .is_err(),
        "the routed client reached the proxy without policy routing"
    );
    // dhclient goes away without releasing: the lease must outlive the
    // restart below.
    drop(dhclient);
    drop(appliance);

    // --- With policy routing, after a restart.
    let cfg = lab.config(true, "", "10.0.0.15:443");
    let (appliance, to_ready) = lab.start_appliance("appliance", &cfg);
    let rss = support::rss_kib(appliance.proc.pid());
    eprintln!(
        "FIGURE appliance (routing, DHCP, DNS, proxy) start to /readyz 200: {} ms (polled every 50 ms through curl); RSS idle: {:.1} MiB",
        to_ready.as_millis(),
        rss as f64 / 1024.0
    );
    if let Some(line) = appliance
        .proc
        .output()
        .lines()
        .find(|l| l.contains("causeway appliance serving"))
    {
        eprintln!("FIGURE appliance's own startup line: {line}");
    }
    // The lease is on disk; the VM's renewal (INIT-REBOOT) keeps it.
    let leases = lab
        .appl
        .command(causeway_bin())
        .args(["leases", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&leases.stdout).contains(&vm_ip),
        "the lease of {vm_ip} is gone after the restart:\n{}",
        String::from_utf8_lossy(&leases.stdout)
    );
    let mut dhclient = Dhclient::start(&lab, "dhclient-2");
    let again = dhclient.bound();
    assert_eq!(field(&again, "ip"), vm_ip, "{again}");

    wait_for(
        "the routed client to be answered",
        DEADLINE,
        || dig(&lab.remote, APPLIANCE_IP, &format!("api.{ZONE}"), 1),
        || appliance.proc.describe(),
    );
    vm_sees_the_control_plane(&lab, &lab.remote, "the routed client");
    vm_sees_the_control_plane(&lab, &lab.vm, "the VM");

    // --- Hot reload: a new DNS record and a new ingress upstream, while a
    // connection through the proxy stays up.
    assert!(subject(&lab.vm, &format!("x.apps.{ZONE}")).contains("ingress-a"));
    let mut held = HeldTls::open(&lab);
    wait_for(
        "the held connection through :6443",
        DEADLINE,
        || {
            appliance
                .admin
                .get("/metrics")
                .and_then(|(_, m)| {
                    metric(&m, "causeway_proxy_connections_active{listener=\"6443\"}")
                })
                .filter(|v| *v >= 1.0)
        },
        || appliance.proc.describe(),
    );
    lab.config(
        true,
        "    - {name: registry2, type: A, value: 192.168.100.77}\n",
        "10.0.0.16:443",
    );
    appliance.proc.signal("HUP");
    wait_for(
        "the added record",
        DEADLINE,
        || {
            dig(&lab.vm, APPLIANCE_IP, &format!("registry2.{ZONE}"), 1)
                .filter(|a| a == "192.168.100.77")
        },
        || appliance.proc.describe(),
    );
    let moved = subject(&lab.vm, &format!("x.apps.{ZONE}"));
    assert!(moved.contains("ingress-b"), "{moved}");
    let page = held.request();
    assert!(
        page.contains("s_server"),
        "the held connection did not survive the reload: {page:?}"
    );

    if std::env::var_os("CAUSEWAY_LAB_HOLD").is_some() {
        hold(&lab);
    }
    drop(dhclient);
}

/// The demo: print where everything is and wait for Enter.
fn hold(lab: &Lab) {
    eprintln!(
        "\nThe lab is up. Namespaces:\n  VM         {}\n  remote     {}\n  appliance  {}\n  pod        {}\nTry:\n  ip netns exec {} dig @{APPLIANCE_IP} api.{ZONE}\n  ip netns exec {} curl -k https://api.{ZONE}:6443/ --resolve api.{ZONE}:6443:{APPLIANCE_IP}\n  ip netns exec {} causeway route show --config {}\n  ip netns exec {} curl -s 127.0.0.1:{ADMIN_PORT}/metrics\nFiles: {}\nPress Enter to tear it down.",
        lab.vm.name(),
        lab.remote.name(),
        lab.appl.name(),
        lab.pod.name(),
        lab.vm.name(),
        lab.remote.name(),
        lab.appl.name(),
        lab.dir.path().join("appliance.yaml").display(),
        lab.appl.name(),
        lab.dir.path().display(),
    );
    let mut line = String::new();
    if let Ok(tty) = fs::File::open("/dev/tty") {
        let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(tty), &mut line);
    }
}

const APPLIANCE_V6: &str = "fd42:100::2";

/// The first AAAA answer for `name` from `server`, asked from `ns`.
fn dig_aaaa(ns: &Netns, server: &str, name: &str) -> Option<String> {
    let out = ns
        .command(tool("dig", "bind9-dnsutils"))
        .arg(format!("@{server}"))
        .args([name, "AAAA", "+short", "+tries=1", "+time=2"])
        .stdin(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .find(|l| l.parse::<std::net::Ipv6Addr>().is_ok())
        .map(str::to_string)
}

/// The lab on a dual-stack VLAN: the router also routes fd42:200::/64 (the
/// remote) onto fd42:100::/64, the VM takes router advertisements, and the
/// appliance serves both families.
#[test]
fn a_vm_on_the_dual_stack_vlan_resolves_aaaa_and_reaches_the_api_over_v6_and_v4() {
    if !root_or_skip("a_vm_on_the_dual_stack_vlan_resolves_aaaa_and_reaches_the_api_over_v6_and_v4")
    {
        return;
    }
    let lab = Lab::up();
    sysctl(&lab.vm, "net.ipv6.conf.eth0.accept_ra=2");
    lab.appl.ip(&[
        "addr",
        "add",
        &format!("{APPLIANCE_V6}/64"),
        "dev",
        "net1",
        "nodad",
    ]);
    lab.router
        .ip(&["addr", "add", "fd42:100::1/64", "dev", "vlan0", "nodad"]);
    lab.router
        .ip(&["addr", "add", "fd42:200::1/64", "dev", "rem0", "nodad"]);
    sysctl(&lab.router, "net.ipv6.conf.all.forwarding=1");
    lab.remote
        .ip(&["addr", "add", "fd42:200::10/64", "dev", "eth0", "nodad"]);
    lab.remote
        .ip(&["-6", "route", "add", "default", "via", "fd42:200::1"]);
    let leases = lab.dir.path().join("leases.jsonl");
    let config = lab.dir.path().join("dual-stack.yaml");
    fs::write(
        &config,
        format!(
            r#"admin: {{listen: "127.0.0.1:{ADMIN_PORT}"}}
cluster: {{name: hc1, baseDomain: example.com}}
network:
  interface: net1
  cidr: 192.168.100.0/24
  gateway: 192.168.100.1
  address: {APPLIANCE_IP}
routing:
  extraRoutes: [192.168.200.0/24]
  ipv6: {{cidr: "fd42:100::/64", address: "{APPLIANCE_V6}", gateway: "fd42:100::1"}}
dhcp:
  leaseFile: {leases}
  subnets:
    - pools: [{{start: 192.168.100.100, end: 192.168.100.150}}]
dns:
  listen: ["{APPLIANCE_IP}:53", "[{APPLIANCE_V6}]:53"]
  proxyAddressV6: "{APPLIANCE_V6}"
  upstreams: ["10.0.0.1"]
proxy:
  listenAddressV6: "{APPLIANCE_V6}"
  resolvers: ["10.0.0.1"]
routerAdvertisements:
  prefixes: [{{prefix: "fd42:100::/64"}}]
  routerLifetime: 0
  dnsServers: ["{APPLIANCE_V6}"]
"#,
            leases = leases.display()
        ),
    )
    .unwrap();
    let (appliance, _) = lab.start_appliance("causeway", &config);

    // The VM forms its v6 address from causeway's advertisement.
    let vm_v6 = poll_until(Duration::from_secs(10), || {
        let addrs = lab
            .vm
            .ip(&["-6", "-o", "addr", "show", "dev", "eth0", "scope", "global"]);
        (addrs.contains("fd42:100::") && !addrs.contains("tentative")).then_some(addrs)
    })
    .unwrap_or_else(|| {
        panic!(
            "the VM formed no address in fd42:100::/64:\n{}\n{}",
            lab.vm.ip(&["-6", "addr"]),
            appliance.proc.describe()
        )
    });
    assert!(vm_v6.contains("dynamic"), "{vm_v6}");

    // Over v6: AAAA for api at the proxy's v6 address, then TLS to the
    // kube-apiserver stand-in (on the v4 pod network) through the proxy,
    // verified against the stand-in's own certificate.
    let api = dig_aaaa(&lab.vm, APPLIANCE_V6, &format!("api.{ZONE}"));
    assert_eq!(api.as_deref(), Some(APPLIANCE_V6));
    let page = curl(
        &lab.vm,
        &lab.certs["kube-apiserver"],
        &format!("api.{ZONE}"),
        6443,
        &format!("[{APPLIANCE_V6}]"),
    )
    .unwrap_or_else(|e| panic!("api over v6 through the proxy: {e}"));
    assert!(page.contains("s_server"), "{page}");
    // And over v4 from the same VM (its v4 address is static here).
    lab.vm
        .ip(&["addr", "add", "192.168.100.77/24", "dev", "eth0"]);
    assert_eq!(
        dig(&lab.vm, APPLIANCE_IP, &format!("api.{ZONE}"), 3).as_deref(),
        Some(APPLIANCE_IP)
    );
    curl(
        &lab.vm,
        &lab.certs["kube-apiserver"],
        &format!("api.{ZONE}"),
        6443,
        APPLIANCE_IP,
    )
    .unwrap_or_else(|e| panic!("api over v4 through the proxy: {e}"));

    // A client on a routed v6 network: its answers leave through net1 and
    // the VLAN's router only by the v6 policy route (the appliance has no
    // v6 default route of its own).
    let remote_api = dig_aaaa(&lab.remote, APPLIANCE_V6, &format!("api.{ZONE}"));
    assert_eq!(
        remote_api.as_deref(),
        Some(APPLIANCE_V6),
        "the routed v6 client:\n{}",
        lab.appl.ip(&["-6", "route", "show", "table", "all"])
    );
    curl(
        &lab.remote,
        &lab.certs["kube-apiserver"],
        &format!("api.{ZONE}"),
        6443,
        &format!("[{APPLIANCE_V6}]"),
    )
    .unwrap_or_else(|e| panic!("the routed v6 client through the proxy: {e}"));
    // Without the v6 policy rule the routed client is not answered (the
    // appliance puts it back at its next resync, 30 s away).
    lab.appl
        .ip(&["-6", "rule", "del", "from", APPLIANCE_V6, "lookup", "100"]);
    assert_eq!(
        dig_aaaa(&lab.remote, APPLIANCE_V6, &format!("api.{ZONE}")),
        None,
        "answered without the v6 policy rule"
    );
    appliance.stop();
}
