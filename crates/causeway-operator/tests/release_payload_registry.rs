//! The DPU's OVN image read from an OpenShift release payload held by a
//! real registry (Debian's `docker-registry` on loopback, htpasswd): the
//! payload's layers are gzip tars built here, pushed through the registry
//! API. Without the package the test prints SKIP (tests/run.sh installs it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use causeway_operator::dpf::service_templates::payload::{
    image_in_release, PayloadError, IMAGE_REFERENCES, OVN_TAG,
};
use causeway_operator::registry::{Credentials, Registry, RegistryError, RegistryPolicy};

use crate::registry;

fn image_references(tags: &[(&str, &str)]) -> Vec<u8> {
    let tags: Vec<serde_json::Value> = tags
        .iter()
        .map(|(name, image)| serde_json::json!({"name": name, "from": {"kind": "DockerImage", "name": image}}))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "kind": "ImageStream",
        "apiVersion": "image.openshift.io/v1",
        "metadata": {"name": "4.22.1"},
        "spec": {"tags": tags},
    }))
    .unwrap()
}

/// A release payload: a base layer, then the layer with the manifests.
fn payload_layers(references: &[u8]) -> Vec<Vec<u8>> {
    vec![
        registry::layer(&[
            ("etc/os-release", b"ID=rhel\n"),
            ("usr/bin/cvo", &[7u8; 4096]),
        ]),
        registry::layer(&[
            (
                "release-manifests/0000_00_cluster-version.yaml",
                b"kind: Namespace\n",
            ),
            (IMAGE_REFERENCES, references),
        ]),
    ]
}

#[tokio::test]
async fn the_ovn_image_is_read_from_a_release_payload_in_a_real_registry() {
    if !registry::installed() {
        eprintln!(
            "SKIP the_ovn_image_is_read_from_a_release_payload_in_a_real_registry: no {} (apt-get install docker-registry; tests/run.sh does)",
            registry::REGISTRY
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let reg = registry::start(dir.path());
    let port = reg.port;
    let creds = Credentials::from_docker_config(registry::docker_config(port).as_bytes());
    let on_loopback = Registry::with_policy(RegistryPolicy {
        allow_loopback: true,
        ..RegistryPolicy::default()
    });

    // A single-architecture payload.
    let ovn = "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:0a1b2c";
    registry::push_image(
        port,
        "ocp/release",
        "4.22.1-aarch64",
        "arm64",
        serde_json::json!({"io.openshift.release": "4.22.1"}),
        &payload_layers(&image_references(&[
            ("cli", "q/cli@sha256:1"),
            (OVN_TAG, ovn),
        ])),
    );
    let release = format!("127.0.0.1:{port}/ocp/release:4.22.1-aarch64");
    assert_eq!(
        image_in_release(&on_loopback, &release, OVN_TAG, &creds)
            .await
            .unwrap(),
        ovn
    );

    // An index: the linux/arm64 image is the one read.
    let arm = registry::push_image(
        port,
        "ocp/release",
        "arm64-only",
        "arm64",
        serde_json::json!({}),
        &payload_layers(&image_references(&[(OVN_TAG, "q/ovn-arm@sha256:aa")])),
    );
    let amd = registry::push_image(
        port,
        "ocp/release",
        "amd64-only",
        "amd64",
        serde_json::json!({}),
        &payload_layers(&image_references(&[(OVN_TAG, "q/ovn-amd@sha256:bb")])),
    );
    let entry = |digest: &str, arch: &str| {
        serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest, "size": 1,
            "platform": {"os": "linux", "architecture": arch},
        })
    };
    registry::push_manifest(
        port,
        "ocp/release",
        "4.22.2-aarch64",
        &serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [entry(&amd, "amd64"), entry(&arm, "arm64")],
        }),
    );
    assert_eq!(
        image_in_release(
            &on_loopback,
            &format!("127.0.0.1:{port}/ocp/release:4.22.2-aarch64"),
            OVN_TAG,
            &creds
        )
        .await
        .unwrap(),
        "q/ovn-arm@sha256:aa"
    );

    // A payload whose image-references lacks the tag.
    registry::push_image(
        port,
        "ocp/release",
        "4.22.3-aarch64",
        "arm64",
        serde_json::json!({}),
        &payload_layers(&image_references(&[("cli", "q/cli@sha256:1")])),
    );
    let e = image_in_release(
        &on_loopback,
        &format!("127.0.0.1:{port}/ocp/release:4.22.3-aarch64"),
        OVN_TAG,
        &creds,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, PayloadError::NoTag { .. }), "{e}");
    assert!(e.to_string().contains("has no tag ovn-kubernetes"), "{e}");

    // An image that is not a payload at all.
    registry::push_image(
        port,
        "ocp/release",
        "not-a-payload",
        "arm64",
        serde_json::json!({}),
        &[registry::layer(&[("etc/os-release", b"ID=rhel\n")])],
    );
    let e = image_in_release(
        &on_loopback,
        &format!("127.0.0.1:{port}/ocp/release:not-a-payload"),
        OVN_TAG,
        &creds,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, PayloadError::NoImageReferences { .. }), "{e}");

    // A release tag the registry does not have.
    let e = image_in_release(
        &on_loopback,
        &format!("127.0.0.1:{port}/ocp/release:9.9.9-aarch64"),
        OVN_TAG,
        &creds,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(e, PayloadError::Registry(RegistryError::Access { .. })),
        "{e}"
    );

    // Wrong credentials are refused as such.
    let wrong = Credentials::from_docker_config(
        format!(
            r#"{{"auths":{{"127.0.0.1:{port}":{{"username":"{}","password":"wrong"}}}}}}"#,
            registry::USER
        )
        .as_bytes(),
    );
    let e = image_in_release(&on_loopback, &release, OVN_TAG, &wrong)
        .await
        .unwrap_err();
    assert!(
        matches!(e, PayloadError::Registry(RegistryError::Auth { .. })),
        "{e}"
    );

    // The operator's own policy never speaks to loopback.
    let e = image_in_release(
        &Registry::with_policy(RegistryPolicy::default()),
        &release,
        OVN_TAG,
        &creds,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(
            e,
            PayloadError::Registry(RegistryError::AddressRefused { .. })
        ),
        "{e}"
    );
}
