//! A real image registry for tests: Debian's `docker-registry` (the
//! distribution registry) on loopback with htpasswd authentication, filled
//! through the registry HTTP API with curl. Shared by the operator's
//! registry tests and, by path, by the kube tests of the `causeway` crate.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const REGISTRY: &str = "/usr/bin/docker-registry";
pub const USER: &str = "puller";
pub const PASSWORD: &str = "s3cret";

pub struct Running {
    child: Child,
    pub port: u16,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the registry binary is installed (tests/run.sh installs it).
pub fn installed() -> bool {
    Path::new(REGISTRY).exists()
}

/// Starts the registry with its data, config and log under `dir`.
pub fn start(dir: &Path) -> Running {
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
    let port = causeway_test_ports::reserved_port();
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

/// The pull secret (`.dockerconfigjson`) for the registry on `port`.
pub fn docker_config(port: u16) -> String {
    format!(r#"{{"auths":{{"127.0.0.1:{port}":{{"username":"{USER}","password":"{PASSWORD}"}}}}}}"#)
}

/// curl against the registry with the test's credentials; stdout.
pub fn curl(port: u16, args: &[&str], body: Option<&[u8]>) -> String {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        "30",
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

pub fn sha256(data: &[u8]) -> String {
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
pub fn upload(port: u16, content_type: &str, url: &str, body: &[u8]) -> String {
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

/// Uploads a blob into `repo`; its digest.
pub fn push_blob(port: u16, repo: &str, data: &[u8]) -> String {
    let digest = sha256(data);
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
        &format!("{location}{sep}digest={digest}"),
        data,
    );
    assert_eq!(code, "201", "blob upload");
    digest
}

/// Uploads a manifest (or index) under `reference`; its digest.
pub fn push_manifest(
    port: u16,
    repo: &str,
    reference: &str,
    manifest: &serde_json::Value,
) -> String {
    let media_type = manifest["mediaType"]
        .as_str()
        .unwrap_or("application/vnd.oci.image.manifest.v1+json")
        .to_string();
    let body = serde_json::to_vec(manifest).unwrap();
    let code = upload(
        port,
        &media_type,
        &format!("/v2/{repo}/manifests/{reference}"),
        &body,
    );
    assert_eq!(code, "201", "manifest upload");
    sha256(&body)
}

/// Pushes an image of `layers` (gzip tars) whose config carries `labels`
/// and says `arch`; the manifest's digest.
pub fn push_image(
    port: u16,
    repo: &str,
    reference: &str,
    arch: &str,
    labels: serde_json::Value,
    layers: &[Vec<u8>],
) -> String {
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch, "os": "linux",
        "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))
    .unwrap();
    let config_digest = push_blob(port, repo, &config);
    let layers: Vec<serde_json::Value> = layers
        .iter()
        .map(|l| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": push_blob(port, repo, l),
                "size": l.len(),
            })
        })
        .collect();
    push_manifest(
        port,
        repo,
        reference,
        &serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
            "layers": layers,
        }),
    )
}

/// A gzip tar of `files` (path, contents), as an image layer.
pub fn layer(files: &[(&str, &[u8])]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (path, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, path, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}
