//! The BlueField image lookup against a real registry: Debian's
//! `docker-registry` (the distribution registry) on loopback with htpasswd
//! authentication, filled by the test through the registry API. Without
//! the package the test prints SKIP (tests/run.sh installs it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use causeway_operator::dpf::bluefield::{
    resolve, Credentials, Lookup, Registry, RegistryPolicy, Resolver,
};

const REGISTRY: &str = "/usr/bin/docker-registry";
const USER: &str = "puller";
const PASSWORD: &str = "s3cret";

/// The registry is on loopback, which the lookup refuses unless told.
fn on_loopback() -> RegistryPolicy {
    RegistryPolicy {
        allow_loopback: true,
        ..RegistryPolicy::default()
    }
}

struct Running {
    child: Child,
    port: u16,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_registry(dir: &Path) -> Running {
    let hash = Command::new("python3")
        .args([
            "-W",
            "ignore",
            "-c",
            &format!("import crypt; print(crypt.crypt('{PASSWORD}', crypt.mksalt(crypt.METHOD_BLOWFISH)))"),
        ])
        .output()
        .expect("python3 for a bcrypt htpasswd entry");
    let hash = String::from_utf8(hash.stdout).unwrap();
    assert!(hash.starts_with("$2"), "no bcrypt hash: {hash:?}");
    std::fs::write(dir.join("htpasswd"), format!("{USER}:{}", hash.trim())).unwrap();
    let port = free_port();
    let config = format!(
        "version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {root}}}\nhttp:\n  addr: 127.0.0.1:{port}\nauth:\n  htpasswd: {{realm: test, path: {htpasswd}}}\n",
        root = dir.join("data").display(),
        htpasswd = dir.join("htpasswd").display()
    );
    std::fs::write(dir.join("config.yml"), config).unwrap();
    let log = std::fs::File::create(dir.join("registry.log")).unwrap();
    let child = Command::new(REGISTRY)
        .arg("serve")
        .arg(dir.join("config.yml"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let running = Running { child, port };
    // Ready when /v2/ answers to the credentials.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = curl(
            port,
            &["-o", "/dev/null", "-w", "%{http_code}", "/v2/"],
            None,
        );
        if out == "200" {
            return running;
        }
        assert!(
            Instant::now() < deadline,
            "the registry did not start: {}",
            std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// curl against the registry with the test's credentials; stdout.
fn curl(port: u16, args: &[&str], body: Option<&[u8]>) -> String {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "10",
        "-u",
        &format!("{USER}:{PASSWORD}"),
    ]);
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    if let Some(last) = args.last_mut() {
        if last.starts_with('/') {
            *last = format!("http://127.0.0.1:{port}{last}");
        }
    }
    cmd.args(&args).stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = cmd.spawn().expect("curl");
    if let Some(b) = body {
        child.stdin.take().unwrap().write_all(b).unwrap();
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sha256(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    format!(
        "sha256:{}",
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
    )
}

/// PUTs `body` to `url` (a path on the registry, or a full URL); the
/// HTTP status.
fn upload(port: u16, content_type: &str, url: &str, body: &[u8]) -> String {
    let header = format!("Content-Type: {content_type}");
    let args = [
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-X",
        "PUT",
        "-H",
        &header,
        "--data-binary",
        "@-",
        url,
    ];
    curl(port, &args, Some(body))
}

/// Pushes an image with no layers whose config carries `labels`; returns
/// the manifest's digest.
fn push(port: u16, repo: &str, tag: &str, labels: serde_json::Value) -> String {
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))
    .unwrap();
    let config_digest = sha256(&config);
    // An upload session, then the blob in one PUT.
    let headers = curl(
        port,
        &[
            "-o",
            "/dev/null",
            "-D",
            "-",
            "-X",
            "POST",
            &format!("/v2/{repo}/blobs/uploads/"),
        ],
        None,
    );
    let location = headers
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("location"))
                .map(|(_, v)| v.trim().to_string())
        })
        .expect("an upload location");
    let sep = if location.contains('?') { '&' } else { '?' };
    let code = upload(
        port,
        "application/octet-stream",
        &format!("{location}{sep}digest={config_digest}"),
        &config,
    );
    assert_eq!(code, "201", "blob upload");
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": [],
    }))
    .unwrap();
    let code = upload(
        port,
        "application/vnd.oci.image.manifest.v1+json",
        &format!("/v2/{repo}/manifests/{tag}"),
        &manifest,
    );
    assert_eq!(code, "201", "manifest upload");
    sha256(&manifest)
}

fn lookup(port: u16, release: &str, creds: &Credentials) -> Lookup {
    Lookup {
        release_image: release.into(),
        repository: format!("127.0.0.1:{port}/org/rhcos-bfb"),
        configured: None,
        configmap_namespace: "causeway-system".into(),
        credentials: creds.clone(),
    }
}

#[tokio::test]
async fn blue_field_images_are_found_in_a_real_registry_with_the_pull_secret() {
    if !Path::new(REGISTRY).exists() {
        eprintln!("SKIP blue_field_images_are_found_in_a_real_registry_with_the_pull_secret: no {REGISTRY} (apt-get install docker-registry; tests/run.sh does)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let reg = start_registry(dir.path());
    let port = reg.port;
    push(port, "org/rhcos-bfb", "4.19.0", serde_json::json!({}));
    let release_digest = push(
        port,
        "ocp/release",
        "4.19.0-x86_64",
        serde_json::json!({"io.openshift.release": "4.19.0"}),
    );

    let creds = Credentials::from_docker_config(
        format!(
            r#"{{"auths":{{"127.0.0.1:{port}":{{"username":"{USER}","password":"{PASSWORD}"}}}}}}"#
        )
        .as_bytes(),
    );
    let registry = Registry::with_policy(on_loopback());

    // The release's tag gives the version; the repository has that tag.
    let found = resolve(
        &registry,
        &lookup(
            port,
            "quay.io/openshift-release-dev/ocp-release:4.19.0-x86_64",
            &creds,
        ),
    )
    .await
    .unwrap();
    assert_eq!(
        found.image,
        format!("127.0.0.1:{port}/org/rhcos-bfb:4.19.0")
    );
    assert_eq!(
        (found.version.as_str(), found.source.as_str()),
        ("4.19.0", "registry")
    );

    // A release pinned by digest: the version comes from its label.
    let pinned = format!("127.0.0.1:{port}/ocp/release@{release_digest}");
    let found = resolve(&registry, &lookup(port, &pinned, &creds))
        .await
        .unwrap();
    assert_eq!(found.version, "4.19.0");

    // No image for the version: the error names the release and both
    // sources searched.
    let e = resolve(
        &registry,
        &lookup(
            port,
            "quay.io/openshift-release-dev/ocp-release:4.20.1-multi",
            &creds,
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(e.reason(), "VersionNotFound");
    let text = e.to_string();
    assert!(
        text.contains("ocp-release:4.20.1-multi")
            && text.contains("causeway-system/ocp-bluefield-images")
            && text.contains("org/rhcos-bfb:4.20.1"),
        "{text}"
    );

    // Credentials for another host are not sent; wrong ones are refused.
    for wrong in [
        Credentials::from_docker_config(
            br#"{"auths":{"quay.io":{"auth":"cHVsbGVyOnMzY3JldA=="}}}"#,
        ),
        Credentials::from_docker_config(
            format!(
                r#"{{"auths":{{"127.0.0.1:{port}":{{"username":"{USER}","password":"wrong"}}}}}}"#
            )
            .as_bytes(),
        ),
    ] {
        let e = resolve(&registry, &lookup(port, "x.io/ocp/release:4.19.0", &wrong))
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "RegistryAuthError", "{e}");
        assert!(!e.transient());
    }

    // The registry stops answering: a resolver that knew the answer gives
    // it within the deadline; one that did not says so, as a transient
    // error.
    let knowing = Resolver::new(Duration::ZERO, on_loopback());
    let l = lookup(
        port,
        "quay.io/openshift-release-dev/ocp-release:4.19.0-x86_64",
        &creds,
    );
    knowing
        .resolve(&l, Some(Duration::from_secs(5)))
        .await
        .unwrap();
    drop(reg);
    let hole =
        TcpListener::bind(("127.0.0.1", port)).expect("the registry's port, for a black hole");
    let started = Instant::now();
    let again = knowing
        .resolve(&l, Some(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(
        again.image,
        format!("127.0.0.1:{port}/org/rhcos-bfb:4.19.0")
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let e = Resolver::new(Duration::from_secs(300), on_loopback())
        .resolve(&l, Some(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "RegistryAccessError");
    assert!(e.transient());
    drop(hole);
}
