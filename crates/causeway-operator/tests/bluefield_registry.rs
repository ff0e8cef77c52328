//! The BlueField image lookup against a real registry: Debian's
//! `docker-registry` (the distribution registry) on loopback with htpasswd
//! authentication, filled by the test through the registry API. Without
//! the package the test prints SKIP (tests/run.sh installs it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use causeway_operator::dpf::bluefield::{resolve, Lookup, Resolver};
use causeway_operator::registry::{Credentials, Registry, RegistryPolicy};

use crate::registry;
use registry::{start as start_registry, PASSWORD, REGISTRY, USER};

/// The registry is on loopback, which the lookup refuses unless told.
fn on_loopback() -> RegistryPolicy {
    RegistryPolicy {
        allow_loopback: true,
        ..RegistryPolicy::default()
    }
}

/// Pushes an image with no layers whose config carries `labels`; returns
/// the manifest's digest.
fn push(port: u16, repo: &str, tag: &str, labels: serde_json::Value) -> String {
    registry::push_image(port, repo, tag, "amd64", labels, &[])
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
