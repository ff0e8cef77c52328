//! Two hosted clusters behind one appliance (`clusters:`), in network
//! namespaces, with real tools only.
//!
//! ```text
//!  worker1 192.168.100.21 ──┐ (hc1's workers)      ┌── pod: 10.0.0.1 (dnsmasq)
//!  worker2 192.168.100.33 ──┤ (hc2's workers)      │   hc1: api 10.0.0.11:6443,
//!  stranger 192.168.100.50 ─┤ (in no list)         │        oauth 10.0.0.12:6443,
//!                           │ vlan: bridge br0     │        ingress 10.0.0.15:443/80
//!                           │ 192.168.100.0/24     │   hc2: api 10.0.0.21:6443,
//!                           │                      │        oauth 10.0.0.22:6443
//!                           └── appliance net1 .2 ─ eth0 10.0.0.2
//! ```
//!
//! hc2 has no ingress behind the proxy: its apps are on a load balancer on
//! the VLAN (`appsAddress` 192.168.100.60, which nothing answers here;
//! only DNS is checked for it).
//!
//! It proves, from clients on the VLAN: both clusters' names resolve to
//! the one proxy address, and so do the in-cluster `kubernetes` names; a
//! missing name in the second cluster's zone is NXDOMAIN from causeway,
//! not forwarded; TLS by name reaches each cluster's own API and oauth;
//! a ClientHello with no name goes by the worker's address (a stranger
//! gets no certificate); `kubernetes.default.svc` on 443 goes by the
//! worker's address; a name decides before the address (and, on a
//! listener of the file's own with routes by address, a name whose routes
//! are for other clients falls through to the address, then the
//! default); each cluster's `*.apps` goes where its entry says, and plain
//! HTTP on port 80 by the worker's address; and a reload that swaps the
//! worker lists swaps where name-less connections go.
//!
//! Each proxied check verifies the certificate presented against one
//! stand-in's own self-signed certificate, so reaching the other
//! cluster's stand-in fails the check.
//!
//! Needs root (it prints a SKIP line otherwise).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::{metric, root_or_skip, tls_cert, tool, wait_for, AdminAt, Appliance, Netns, Proc};
use tempfile::TempDir;

const APPLIANCE_IP: &str = "192.168.100.2";
const HC1: &str = "hc1.example.com";
const HC2: &str = "hc2.example.org";
const WORKER1: &str = "192.168.100.21";
const WORKER2: &str = "192.168.100.33";
const STRANGER: &str = "192.168.100.50";
/// hc1's workers: worker1 alone. hc2's: a /29 that holds worker2 (and
/// not the stranger), so a CIDR entry is exercised too.
const HC1_WORKERS: &str = "[192.168.100.21]";
const HC2_WORKERS: &str = "[192.168.100.32/29]";
const DEADLINE: Duration = Duration::from_secs(20);
/// A listener of the file's own (`extraListeners`), routed by address.
const EXTRA_PORT: u16 = 8443;
const ADMIN_PORT: u16 = 9090;
/// An answer the lab's upstream resolver gives for names causeway must
/// answer itself: seeing it means causeway forwarded the question.
const FORWARDED: &str = "10.0.0.98";

/// The control-plane stand-ins: (file, names in the certificate, listen).
/// The API stand-ins carry the in-cluster names as a real kube-apiserver
/// certificate does, so a client asking by those names can verify them;
/// the two clusters' certificates are still told apart, each being
/// self-signed and checked against itself alone.
const STAND_INS: [(&str, &[&str], &str); 5] = [
    (
        "hc1-api",
        &[
            "api.hc1.example.com",
            "api-int.hc1.example.com",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        "10.0.0.11:6443",
    ),
    ("hc1-oauth", &["oauth.hc1.example.com"], "10.0.0.12:6443"),
    (
        "hc2-api",
        &[
            "api.hc2.example.org",
            "api-int.hc2.example.org",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        "10.0.0.21:6443",
    ),
    ("hc2-oauth", &["oauth.hc2.example.org"], "10.0.0.22:6443"),
    (
        "hc1-ingress",
        &["ingress.apps.hc1.example.com", "*.apps.hc1.example.com"],
        "10.0.0.15:443",
    ),
];
/// hc1's plain-HTTP ingress, a python3 http.server whose page says so.
const HC1_HTTP: &str = "10.0.0.15:80";
const HC1_HTTP_PAGE: &str = "hc1 ingress over plain HTTP";
/// hc2's load balancer on the VLAN, where its `*.apps` resolves.
const HC2_APPS: &str = "192.168.100.60";

/// The in-cluster names of the API (`KUBERNETES_ALIASES` in
/// causeway-config), spelt out so a change there shows up here.
const ALIASES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

struct Lab {
    dir: TempDir,
    appl: Netns,
    worker1: Netns,
    worker2: Netns,
    stranger: Netns,
    // Kept for their Drop: namespaces go, processes stop.
    _vlan: Netns,
    pod: Netns,
    _servers: Vec<Proc>,
    certs: HashMap<&'static str, PathBuf>,
}

impl Lab {
    fn up() -> Lab {
        let dir = tempfile::Builder::new()
            .prefix("causeway-clusters-lab-")
            .tempdir()
            .unwrap();
        let vlan = Netns::new("vlan");
        let appl = Netns::new("appl");
        let pod = Netns::new("pod");
        let worker1 = Netns::new("worker1");
        let worker2 = Netns::new("worker2");
        let stranger = Netns::new("stranger");

        vlan.ip(&["link", "add", "br0", "type", "bridge"]);
        vlan.ip(&["link", "set", "br0", "up"]);
        for (ns, inside, port, addr) in [
            (&appl, "net1", "p-appl", APPLIANCE_IP),
            (&worker1, "eth0", "p-w1", WORKER1),
            (&worker2, "eth0", "p-w2", WORKER2),
            (&stranger, "eth0", "p-str", STRANGER),
        ] {
            ns.veth_to(inside, None, &vlan, port, None);
            vlan.ip(&["link", "set", port, "master", "br0"]);
            ns.ip(&["addr", "add", &format!("{addr}/24"), "dev", inside]);
        }
        appl.veth_to("eth0", None, &pod, "cp0", None);
        appl.ip(&["addr", "add", "10.0.0.2/24", "dev", "eth0"]);
        // The pod network holds the appliance's default route, as in a pod.
        appl.ip(&["route", "add", "default", "via", "10.0.0.1"]);
        pod.ip(&["addr", "add", "10.0.0.1/24", "dev", "cp0"]);

        let mut servers = Vec::new();
        let mut certs = HashMap::new();
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
        let www = dir.path().join("www");
        fs::create_dir_all(&www).unwrap();
        fs::write(www.join("index.html"), format!("{HC1_HTTP_PAGE}\n")).unwrap();
        let (http_ip, http_port) = HC1_HTTP.split_once(':').unwrap();
        let mut http = pod.command(tool("python3", "python3"));
        http.args([
            "-m",
            "http.server",
            http_port,
            "--bind",
            http_ip,
            "--directory",
        ])
        .arg(&www);
        servers.push(Proc::spawn("hc1-http", dir.path(), &mut http));
        // The Service names the derived routes dial. hc2 lives in a
        // control-plane namespace of its own choosing (hcp-hc2), so the
        // override is what makes its routes resolve. The last three are
        // traps: names causeway must answer itself, here given another
        // answer, which a forwarded question would come back with.
        let records: Vec<String> = [
            ("kube-apiserver.clusters-hc1.svc", "10.0.0.11"),
            ("oauth-openshift.clusters-hc1.svc", "10.0.0.12"),
            ("kube-apiserver.hcp-hc2.svc", "10.0.0.21"),
            ("oauth-openshift.hcp-hc2.svc", "10.0.0.22"),
            ("registry.corp.test", "10.0.0.99"),
            ("nothing.hc2.example.org", FORWARDED),
            ("kubernetes.default.svc", FORWARDED),
            ("kubernetes.default.svc.cluster.local", FORWARDED),
        ]
        .iter()
        .map(|(name, ip)| format!("--host-record={name},{ip}"))
        .collect();
        let mut dns = pod.command(tool("dnsmasq", "dnsmasq-base"));
        dns.args(support::DNSMASQ_ALONE)
            .args(["--listen-address=10.0.0.1", "--user=nobody"])
            .arg(format!(
                "--pid-file={}",
                dir.path().join("dnsmasq.pid").display()
            ))
            .args(&records);
        servers.push(Proc::spawn("dnsmasq", dir.path(), &mut dns));

        let listening = STAND_INS
            .iter()
            .map(|(file, _, listen)| (*file, *listen))
            .chain([("hc1-http", HC1_HTTP)]);
        for (file, listen) in listening {
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
                let a = ask(&pod, "10.0.0.1", "kube-apiserver.hcp-hc2.svc", 2);
                (a.addrs == ["10.0.0.21"]).then_some(())
            },
            || servers.last().map(|p| p.describe()).unwrap_or_default(),
        );
        Lab {
            dir,
            appl,
            worker1,
            worker2,
            stranger,
            _vlan: vlan,
            pod,
            _servers: servers,
            certs,
        }
    }

    /// Writes the appliance config with these worker lists and returns its
    /// path.
    fn config(&self, hc1_workers: &str, hc2_workers: &str) -> PathBuf {
        let path = self.dir.path().join("appliance.yaml");
        let hc1_workers_first = hc1_workers
            .trim_matches(['[', ']'])
            .split(',')
            .next()
            .unwrap()
            .trim();
        let text = format!(
            r#"admin: {{listen: "127.0.0.1:{ADMIN_PORT}"}}
clusters:
  - name: hc1
    baseDomain: example.com
    ingressHttps: "10.0.0.15:443"
    ingressHttp: "{HC1_HTTP}"
    workers: {hc1_workers}
  - name: hc2
    baseDomain: example.org
    controlPlaneNamespace: hcp-hc2
    appsAddress: {HC2_APPS}
    workers: {hc2_workers}
network:
  interface: net1
  cidr: 192.168.100.0/24
  gateway: 192.168.100.1
  address: {APPLIANCE_IP}
dns:
  upstreams: ["10.0.0.1"]
proxy:
  resolvers: ["10.0.0.1"]
  # 443's routes on every address, as a LoadBalancer from off the VLAN
  # reaches them.
  externalPort: 9443
  # Routes by address written in the file, with and without a name.
  extraListeners:
    - port: {EXTRA_PORT}
      routes:
        - {{sni: kubernetes, sources: [{hc1_workers_first}], upstream: "kube-apiserver.clusters-hc1.svc:6443"}}
        - {{sources: {hc2_workers}, upstream: "kube-apiserver.hcp-hc2.svc:6443"}}
      default: "oauth-openshift.clusters-hc1.svc:6443"
"#
        );
        // Replace in one step, so the file watcher never reads half a file.
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, &path).unwrap();
        path
    }

    fn cert(&self, stand_in: &str) -> &Path {
        &self.certs[stand_in]
    }
}

/// What `dig` got back from one question.
#[derive(Debug)]
struct Answer {
    /// The header's status: NOERROR, NXDOMAIN, ... (empty: no reply).
    status: String,
    /// The header's flags (`qr aa rd ra`).
    flags: String,
    addrs: Vec<String>,
    /// Owners of the authority section's SOA records.
    soa: Vec<String>,
}

/// Asks `server` for `name` A from inside `ns`, once, within `timeout_s`.
fn ask(ns: &Netns, server: &str, name: &str, timeout_s: u32) -> Answer {
    let out = ns
        .command(tool("dig", "bind9-dnsutils"))
        .arg(format!("@{server}"))
        .args([name, "A", "+tries=1", "+noall", "+comments", "+answer"])
        .arg("+authority")
        .arg(format!("+time={timeout_s}"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let header = |key: &str| {
        text.lines()
            .find_map(|l| l.split_once(key).map(|(_, rest)| rest))
            .map(|rest| rest.split([',', ';']).next().unwrap_or("").trim())
            .unwrap_or("")
            .to_string()
    };
    let records = |kind: &str| -> Vec<Vec<String>> {
        text.lines()
            .filter(|l| !l.starts_with(';'))
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .filter(|f| f.len() >= 5 && f[3] == kind)
            .collect()
    };
    Answer {
        status: header("status: "),
        flags: header(";; flags: "),
        addrs: records("A").into_iter().map(|f| f[4].clone()).collect(),
        soa: records("SOA").into_iter().map(|f| f[0].clone()).collect(),
    }
}

/// The one address `name` resolves to for a client in `ns`, through
/// causeway DNS; panics with the answer otherwise.
fn resolve(ns: &Netns, who: &str, name: &str) -> String {
    let a = ask(ns, APPLIANCE_IP, name, 3);
    assert!(
        a.status == "NOERROR" && a.addrs.len() == 1,
        "{who}: {name} did not resolve to one address: {a:?}"
    );
    a.addrs[0].clone()
}

/// A TLS handshake from `ns` to `ip:port` with `openssl s_client`,
/// sending `sni` as the server name (or none at all), verifying the
/// certificate against `ca` alone (and, with a name and `check_name`, its
/// host name): `Ok(subject)` when it verified, else `Err(everything
/// s_client said)`, whose `depth=0` line names the certificate it got, if
/// any.
fn tls(
    ns: &Netns,
    ip: &str,
    port: u16,
    sni: Option<&str>,
    check_name: bool,
    ca: &Path,
) -> Result<String, String> {
    let mut cmd = ns.command(tool("timeout", "coreutils"));
    // The bound on the whole exchange: a proxy that held the connection
    // without answering would otherwise hold the test.
    cmd.arg("10")
        .arg(tool("openssl", "openssl"))
        .args(["s_client", "-connect", &format!("{ip}:{port}")])
        .args(["-verify_return_error", "-CAfile"])
        .arg(ca);
    match sni {
        Some(name) if check_name => cmd.args(["-servername", name, "-verify_hostname", name]),
        Some(name) => cmd.args(["-servername", name]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let said = format!(
        "exit {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let subject = stdout
        .lines()
        .find_map(|l| l.strip_prefix("subject="))
        // OpenSSL 3.0 writes "CN = x", later versions "CN=x".
        .map(|s| s.replace(' ', ""));
    match subject {
        Some(s) if out.status.success() && stdout.contains("Verify return code: 0 (ok)") => Ok(s),
        _ => Err(said),
    }
}

/// Asserts a handshake verified against `stand_in`'s certificate and
/// presented its subject.
fn reaches(
    lab: &Lab,
    from: &Netns,
    who: &str,
    (ip, port): (&str, u16),
    sni: Option<&str>,
    stand_in: &str,
) {
    let names = STAND_INS
        .iter()
        .find(|(f, _, _)| *f == stand_in)
        .map(|(_, names, _)| *names)
        .unwrap();
    // The host name is checked too whenever the certificate is meant to
    // carry it (a default route may send a name to a stand-in that does
    // not): the certificate itself is checked either way.
    let check_name = sni.is_some_and(|n| {
        names.iter().any(|c| {
            *c == n
                || c.strip_prefix('*').is_some_and(|suffix| {
                    n.ends_with(suffix) && !n[..n.len() - suffix.len()].contains('.')
                })
        })
    });
    let asked = sni.unwrap_or("(no name)");
    match tls(from, ip, port, sni, check_name, lab.cert(stand_in)) {
        Ok(subject) => assert_eq!(
            subject,
            format!("CN={}", names[0]),
            "{who}: {asked} on {port} presented another certificate"
        ),
        Err(said) => panic!(
            "{who}: {asked} on {ip}:{port} did not reach the {stand_in} stand-in \
             (its certificate did not verify, or none came):\n{said}"
        ),
    }
}

/// Asserts the proxy closed a handshake without any certificate.
fn refused(lab: &Lab, from: &Netns, who: &str, port: u16, sni: Option<&str>) {
    let asked = sni.unwrap_or("(no name)");
    match tls(from, APPLIANCE_IP, port, sni, false, lab.cert("hc1-api")) {
        Ok(s) => panic!("{who}: {asked} on {port} was answered by {s}"),
        Err(said) => assert!(
            said.contains("no peer certificate available")
                && !said.contains("Certificate chain")
                && !said.contains("depth="),
            "{who}: {asked} on {port} was not closed before any certificate:\n{said}"
        ),
    }
}

/// A plain HTTP GET from `ns` to the proxy's port 80: the page, or what
/// curl said.
fn http(ns: &Netns) -> Result<String, String> {
    let out = ns
        .command(tool("curl", "curl"))
        .args(["-sS", "--max-time", "5"])
        .arg(format!("http://{APPLIANCE_IP}/"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `causeway_proxy_connect_errors_total{reason="no_route"}` of a listener.
fn no_route(appliance: &Appliance, port: u16) -> f64 {
    metric(
        &appliance.metrics(),
        &format!("causeway_proxy_connect_errors_total{{listener=\"{port}\",reason=\"no_route\"}}"),
    )
    .unwrap_or(0.0)
}

/// Connections a route took, by its label.
fn routed(appliance: &Appliance, port: u16, route: &str) -> f64 {
    metric(
        &appliance.metrics(),
        &format!("causeway_proxy_route_connections_total{{listener=\"{port}\",route=\"{route}\"}}"),
    )
    .unwrap_or(0.0)
}

#[test]
fn two_hosted_clusters_share_one_vlan() {
    if !root_or_skip("two_hosted_clusters_share_one_vlan") {
        return;
    }
    let started = Instant::now();
    let lab = Lab::up();
    let cfg = lab.config(HC1_WORKERS, HC2_WORKERS);
    let appliance = Appliance::start(
        "appliance",
        lab.dir.path(),
        Some(&lab.appl),
        &cfg,
        AdminAt::Netns {
            ns: lab.appl.name().to_string(),
            port: ADMIN_PORT,
        },
    );
    let clients = [
        (&lab.worker1, "worker1"),
        (&lab.worker2, "worker2"),
        (&lab.stranger, "the stranger"),
    ];

    // --- DNS: both zones, and the in-cluster names, point at the one
    // proxy address, for every client on the VLAN.
    for (ns, who) in clients {
        for zone in [HC1, HC2] {
            for name in ["api", "api-int", "oauth", "ignition", "konnectivity"] {
                assert_eq!(
                    resolve(ns, who, &format!("{name}.{zone}")),
                    APPLIANCE_IP,
                    "{who}: {name}.{zone}"
                );
            }
        }
        // The upstream answers two of these otherwise (FORWARDED).
        for alias in ALIASES {
            assert_eq!(resolve(ns, who, alias), APPLIANCE_IP, "{who}: {alias}");
        }
    }
    // A name in hc2's zone that no record has: causeway's own NXDOMAIN,
    // with hc2's SOA, although the upstream has an answer for it.
    let missing = ask(&lab.worker1, APPLIANCE_IP, &format!("nothing.{HC2}"), 3);
    assert_eq!(missing.status, "NXDOMAIN", "nothing.{HC2}: {missing:?}");
    assert!(missing.flags.split(' ').any(|f| f == "aa"), "{missing:?}");
    assert_eq!(missing.soa, [format!("{HC2}.")], "{missing:?}");
    // The control: forwarding works, so the NXDOMAIN above is a decision.
    assert_eq!(
        resolve(&lab.worker1, "worker1", "registry.corp.test"),
        "10.0.0.99"
    );

    // --- By name: the API (6443) and oauth (443) of each cluster, from
    // every client, workers of the other cluster included, each to its
    // own stand-in. The address comes from causeway DNS.
    for (ns, who) in clients {
        for (zone, api, oauth) in [(HC1, "hc1-api", "hc1-oauth"), (HC2, "hc2-api", "hc2-oauth")] {
            for name in [format!("api.{zone}"), format!("api-int.{zone}")] {
                let ip = resolve(ns, who, &name);
                reaches(&lab, ns, who, (&ip, 6443), Some(&name), api);
            }
            let name = format!("oauth.{zone}");
            let ip = resolve(ns, who, &name);
            reaches(&lab, ns, who, (&ip, 443), Some(&name), oauth);
        }
    }

    // --- The external port: 443's routes on the pod network's address,
    // where a LoadBalancer Service sends OAuth from outside.
    for (zone, oauth) in [(HC1, "hc1-oauth"), (HC2, "hc2-oauth")] {
        let name = format!("oauth.{zone}");
        reaches(
            &lab,
            &lab.pod,
            "the pod network",
            ("10.0.0.2", 9443),
            Some(&name),
            oauth,
        );
    }

    // --- No name on 6443 (a client dialling the API by address): the
    // worker's address decides; a stranger's connection is closed.
    let by_address = [
        (&lab.worker1, "worker1", "hc1-api"),
        (&lab.worker2, "worker2", "hc2-api"),
    ];
    let hc1_route = format!("from {WORKER1}/32");
    let before = routed(&appliance, 6443, &hc1_route);
    for (ns, who, api) in by_address {
        reaches(&lab, ns, who, (APPLIANCE_IP, 6443), None, api);
    }
    assert_eq!(
        routed(&appliance, 6443, &hc1_route),
        before + 1.0,
        "the by-address route's series ({hc1_route}) did not count worker1's connection"
    );
    let closed = no_route(&appliance, 6443);
    refused(&lab, &lab.stranger, "the stranger", 6443, None);
    assert_eq!(no_route(&appliance, 6443), closed + 1.0, "no_route on 6443");

    // --- The in-cluster names on 443, resolved through causeway DNS: the
    // worker's address decides; the stranger, whose address no route of
    // those names has, is closed.
    for alias in ALIASES {
        for (ns, who, api) in by_address {
            let ip = resolve(ns, who, alias);
            reaches(&lab, ns, who, (&ip, 443), Some(alias), api);
        }
    }
    let closed = no_route(&appliance, 443);
    refused(
        &lab,
        &lab.stranger,
        "the stranger",
        443,
        Some("kubernetes.default.svc"),
    );
    assert_eq!(no_route(&appliance, 443), closed + 1.0, "no_route on 443");

    // --- A name decides before the address: hc1's worker asking for
    // hc2's API gets hc2's, and hc2's worker hc1's.
    reaches(
        &lab,
        &lab.worker1,
        "worker1",
        (APPLIANCE_IP, 6443),
        Some(&format!("api.{HC2}")),
        "hc2-api",
    );
    reaches(
        &lab,
        &lab.worker2,
        "worker2",
        (APPLIANCE_IP, 6443),
        Some(&format!("api.{HC1}")),
        "hc1-api",
    );

    // --- Routes by address written in the file (port 8443): a name
    // scoped to hc1's worker; hc2's workers by address alone; a default.
    // The whole order: a name a route has for this client; then, for a
    // name whose routes are all for other clients (or no name), the
    // client's address; then the default.
    let extra = (APPLIANCE_IP, EXTRA_PORT);
    reaches(
        &lab,
        &lab.worker1,
        "worker1",
        extra,
        Some("kubernetes"),
        "hc1-api",
    );
    reaches(
        &lab,
        &lab.worker2,
        "worker2",
        extra,
        Some("kubernetes"),
        "hc2-api",
    );
    reaches(&lab, &lab.worker2, "worker2", extra, None, "hc2-api");
    reaches(
        &lab,
        &lab.stranger,
        "the stranger",
        extra,
        Some("kubernetes"),
        "hc1-oauth",
    );
    reaches(
        &lab,
        &lab.stranger,
        "the stranger",
        extra,
        None,
        "hc1-oauth",
    );

    // --- The apps. hc1's go through the proxy by name from anyone, to
    // its ingress; hc2's resolve to its own load balancer on the VLAN, and
    // the proxy has no route for them. Plain HTTP names no cluster: port
    // 80 is hc1's workers' alone.
    for (ns, who) in clients {
        let name = format!("console.apps.{HC1}");
        let ip = resolve(ns, who, &name);
        assert_eq!(ip, APPLIANCE_IP, "{who}: {name}");
        reaches(&lab, ns, who, (&ip, 443), Some(&name), "hc1-ingress");
        assert_eq!(
            resolve(ns, who, &format!("console.apps.{HC2}")),
            HC2_APPS,
            "{who}: console.apps.{HC2}"
        );
    }
    refused(
        &lab,
        &lab.worker2,
        "worker2",
        443,
        Some(&format!("console.apps.{HC2}")),
    );
    let page = http(&lab.worker1).unwrap_or_else(|e| panic!("worker1: port 80: {e}"));
    assert!(page.contains(HC1_HTTP_PAGE), "worker1: port 80: {page}");
    for (ns, who) in [(&lab.worker2, "worker2"), (&lab.stranger, "the stranger")] {
        let closed = no_route(&appliance, 80);
        let got = http(ns);
        assert!(got.is_err(), "{who} reached port 80: {got:?}");
        assert_eq!(
            no_route(&appliance, 80),
            closed + 1.0,
            "{who}: no_route on 80"
        );
    }

    // --- A reload that swaps the worker lists swaps where name-less
    // connections go, and leaves the names alone: the address is what
    // decided above, not anything else about the two clients.
    let swapped_cfg = lab.config(HC2_WORKERS, HC1_WORKERS);
    appliance.proc.signal("HUP");
    wait_for(
        "worker1's name-less connection to go to hc2 after the swap",
        DEADLINE,
        || {
            tls(
                &lab.worker1,
                APPLIANCE_IP,
                6443,
                None,
                false,
                lab.cert("hc2-api"),
            )
            .ok()
        },
        || {
            format!(
                "{}\n{}",
                fs::read_to_string(&swapped_cfg).unwrap(),
                appliance.proc.describe()
            )
        },
    );
    reaches(
        &lab,
        &lab.worker2,
        "worker2 (swapped)",
        (APPLIANCE_IP, 6443),
        None,
        "hc1-api",
    );
    reaches(
        &lab,
        &lab.worker2,
        "worker2 (swapped)",
        (APPLIANCE_IP, 443),
        Some("kubernetes.default.svc"),
        "hc1-api",
    );
    reaches(
        &lab,
        &lab.worker1,
        "worker1 (swapped)",
        (APPLIANCE_IP, 6443),
        Some(&format!("api.{HC1}")),
        "hc1-api",
    );
    refused(&lab, &lab.stranger, "the stranger (swapped)", 6443, None);

    appliance.stop();
    eprintln!(
        "FIGURE clusters lab: set up, every check and the appliance's stop in {} ms",
        started.elapsed().as_millis()
    );
}

/// `/etc/netns/<ns>/resolv.conf`, which `ip netns exec` mounts over the
/// namespace's `/etc/resolv.conf` (a pod's resolver, here the pod
/// network's dnsmasq); removed with the guard, and `/etc/netns` too when
/// this made it.
struct PodResolver {
    dir: PathBuf,
    made_parent: bool,
}

impl PodResolver {
    fn new(ns: &Netns, nameserver: &str) -> PodResolver {
        let parent = Path::new("/etc/netns");
        let made_parent = !parent.exists();
        let dir = parent.join(ns.name());
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("resolv.conf"),
            format!("nameserver {nameserver}\n"),
        )
        .unwrap();
        PodResolver { dir, made_parent }
    }
}

impl Drop for PodResolver {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        if self.made_parent {
            // Only if empty: entries of anyone else's stay.
            let _ = fs::remove_dir("/etc/netns");
        }
    }
}

/// A pod on the VLAN: `net1` on the VLAN bridge with `vlan_ip`, and `eth0`
/// on a link of its own to the pod network (`10.0.<n>.2`, the pod
/// network's side `10.0.<n>.1`), its default route there, as a pod has.
fn vlan_pod(lab: &Lab, role: &str, vlan_ip: &str, n: u8) -> Netns {
    let pod = Netns::new(role);
    let port = format!("p-{role}");
    pod.veth_to("net1", None, &lab._vlan, &port, None);
    lab._vlan.ip(&["link", "set", &port, "master", "br0"]);
    pod.ip(&["addr", "add", &format!("{vlan_ip}/24"), "dev", "net1"]);
    let peer = format!("cp{n}");
    pod.veth_to("eth0", None, &lab.pod, &peer, None);
    pod.ip(&["addr", "add", &format!("10.0.{n}.2/24"), "dev", "eth0"]);
    pod.ip(&["route", "add", "default", "via", &format!("10.0.{n}.1")]);
    lab.pod
        .ip(&["addr", "add", &format!("10.0.{n}.1/24"), "dev", &peer]);
    pod
}

/// The Infra and attachments a user would write for the two clusters,
/// rendered by the operator's own validation and rendering into each
/// component's config, exactly as its pods receive them.
fn operator_rendered(dns_ip: &str, proxy_ip: &str) -> (String, String) {
    use causeway_operator::infra::attachment::{candidate, InfraClusterAttachmentSpec};
    use causeway_operator::infra::plan::Component;
    let infra: causeway_operator::infra::crd::Infra = serde_json::from_value(serde_json::json!({
        "apiVersion": "hostedcluster.densityops.com/v1alpha1", "kind": "Infra",
        "metadata": {"name": "vlan100", "namespace": "tenants"},
        "spec": {
            "networkConfig": {"cidr": "192.168.100.0/24", "gateway": "192.168.100.1",
                "networkAttachmentDefinition": "vlan100", "dnsServers": ["10.0.0.1"]},
            "infraComponents": {"dns": {"serverIP": dns_ip}, "proxy": {"serverIP": proxy_ip}}}}))
    .unwrap();
    let cidr = "192.168.100.0/24".parse().ok();
    let attachment = |name: &str, spec: serde_json::Value| {
        let spec: InfraClusterAttachmentSpec = serde_json::from_value(spec).unwrap();
        candidate(name, &spec, cidr).unwrap()
    };
    let attached = [
        attachment(
            "hc1",
            serde_json::json!({"infraRef": {"name": "vlan100"},
                "hostedClusterRef": {"name": "hc1", "namespace": "clusters"},
                "dns": {"clusterName": "hc1", "baseDomain": "example.com"},
                "workers": [WORKER1]}),
        ),
        attachment(
            "hc2",
            serde_json::json!({"infraRef": {"name": "vlan100"},
                "hostedClusterRef": {"name": "hc2", "namespace": "clusters"},
                "dns": {"clusterName": "hc2", "baseDomain": "example.org"},
                "controlPlaneNamespace": "hcp-hc2",
                "workers": ["192.168.100.32/29"]}),
        ),
    ];
    let no_services =
        |_: &str, _: &str| causeway_operator::infra::validate::ServiceAddress::Missing;
    let plan = causeway_operator::infra::validate::validate(
        &infra.spec,
        "vlan100",
        "tenants",
        None,
        &no_services,
        &attached,
    )
    .unwrap();
    let text = |c: Component| plan.component(c).unwrap().config_text.clone();
    (text(Component::Dns), text(Component::Proxy))
}

/// The same two clusters served by what the operator renders for one
/// Infra with two InfraClusterAttachments: its DNS and proxy configs,
/// unedited, each run in a pod of its own (`net1` on the VLAN at its
/// static address, `eth0` on the pod network, the pod's resolver). From
/// the VLAN: every cluster name resolves to the proxy's address, TLS by
/// name reaches each cluster's own API and OAuth, a ClientHello without a
/// name on 6443 goes by the worker's address, and a stranger gets no
/// certificate.
#[test]
fn the_operators_rendered_configs_serve_two_attachments() {
    if !root_or_skip("the_operators_rendered_configs_serve_two_attachments") {
        return;
    }
    const DNS_IP: &str = "192.168.100.3";
    const PROXY_IP: &str = "192.168.100.4";
    let lab = Lab::up();
    let (dns_config, proxy_config) = operator_rendered(DNS_IP, PROXY_IP);
    let dns_pod = vlan_pod(&lab, "dnspod", DNS_IP, 3);
    let proxy_pod = vlan_pod(&lab, "proxypod", PROXY_IP, 4);
    let _resolver = PodResolver::new(&proxy_pod, "10.0.0.1");
    let mut running = Vec::new();
    for (pod, n, name, config) in [
        (&dns_pod, 3, "dns", dns_config),
        (&proxy_pod, 4, "proxy", proxy_config),
    ] {
        let path = lab.dir.path().join(format!("{name}.yaml"));
        fs::write(&path, &config).unwrap();
        running.push(Appliance::start(
            name,
            lab.dir.path(),
            Some(pod),
            &path,
            AdminAt::NetnsAt {
                ns: pod.name().to_string(),
                host: format!("10.0.{n}.2"),
                port: ADMIN_PORT,
            },
        ));
    }
    let clients = [
        (&lab.worker1, "worker1"),
        (&lab.worker2, "worker2"),
        (&lab.stranger, "the stranger"),
    ];
    for (ns, who) in clients {
        for name in [
            "api.hc1.example.com",
            "api-int.hc1.example.com",
            "oauth.hc1.example.com",
            "api.hc2.example.org",
            "oauth.hc2.example.org",
        ] {
            let a = ask(ns, DNS_IP, name, 3);
            assert_eq!(
                (a.status.as_str(), a.addrs.clone()),
                ("NOERROR", vec![PROXY_IP.to_string()]),
                "{who}: {name}: {a:?}"
            );
        }
    }
    for (ns, who) in [(&lab.worker1, "worker1"), (&lab.worker2, "worker2")] {
        for (name, port, stand_in) in [
            ("api.hc1.example.com", 6443, "hc1-api"),
            ("oauth.hc1.example.com", 443, "hc1-oauth"),
            ("api.hc2.example.org", 6443, "hc2-api"),
            ("oauth.hc2.example.org", 443, "hc2-oauth"),
        ] {
            reaches(&lab, ns, who, (PROXY_IP, port), Some(name), stand_in);
        }
    }
    // No name: the worker's address decides.
    reaches(
        &lab,
        &lab.worker1,
        "worker1",
        (PROXY_IP, 6443),
        None,
        "hc1-api",
    );
    reaches(
        &lab,
        &lab.worker2,
        "worker2",
        (PROXY_IP, 6443),
        None,
        "hc2-api",
    );
    match tls(
        &lab.stranger,
        PROXY_IP,
        6443,
        None,
        false,
        lab.cert("hc1-api"),
    ) {
        Ok(s) => panic!("the stranger without a name on 6443 was answered by {s}"),
        Err(said) => assert!(
            said.contains("no peer certificate available"),
            "the stranger was not closed before any certificate:\n{said}"
        ),
    }
    // Both pods ran throughout.
    drop(running);
}
