//! The CRD in the chart is exactly what the code generates: regenerate it
//! with `causeway operator crd > charts/causeway/templates/crd-infra.yaml`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[test]
fn the_chart_crd_matches_the_generated_one() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../charts/causeway/templates/crd-infra.yaml"
    );
    let generated = causeway_operator::infra::crd::crd_yaml().unwrap();
    if std::env::var_os("UPDATE_CHART_CRDS").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let in_chart = std::fs::read_to_string(path).unwrap();
    assert!(
        in_chart == generated,
        "{path} is stale: regenerate it with `causeway operator crd > charts/causeway/templates/crd-infra.yaml`"
    );
}

#[test]
fn the_crd_has_the_names_and_subresource_the_chart_and_users_expect() {
    use kube::CustomResourceExt;
    let crd = causeway_operator::infra::crd::Infra::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("infras.hostedcluster.densityops.com")
    );
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["infra".to_string()][..])
    );
    let v = &crd.spec.versions[0];
    assert_eq!(v.name, "v1alpha1");
    assert!(v.served && v.storage);
    assert!(v.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Ready", "DHCP", "DNS", "Proxy", "Age"]);
    let annotations = crd.metadata.annotations.unwrap();
    assert_eq!(annotations["helm.sh/resource-policy"], "keep");
}

/// Regenerate with `UPDATE_CHART_CRDS=1 cargo test -p causeway-operator --test offline crd::`, or
/// `causeway operator crd infraclusterattachment > charts/causeway/templates/crd-infraclusterattachment.yaml`.
#[test]
fn the_chart_attachment_crd_matches_the_generated_one() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../charts/causeway/templates/crd-infraclusterattachment.yaml"
    );
    let generated = causeway_operator::infra::attachment::crd_yaml().unwrap();
    if std::env::var_os("UPDATE_CHART_CRDS").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let in_chart = std::fs::read_to_string(path).unwrap_or_default();
    assert!(in_chart == generated, "{path} is stale");
}

#[test]
fn the_attachment_crd_has_the_go_operators_names_and_columns() {
    use kube::CustomResourceExt;
    let crd = causeway_operator::infra::attachment::InfraClusterAttachment::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("infraclusterattachments.hostedcluster.densityops.com")
    );
    assert_eq!(crd.spec.scope, "Namespaced");
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["infraattachment".to_string(), "ica".to_string()][..])
    );
    let v = &crd.spec.versions[0];
    assert!(v.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        ["Infra", "HostedCluster", "Domain", "Ready", "Age"]
    );
}

/// Regenerate with `UPDATE_CHART_CRDS=1 cargo test -p causeway-operator --test offline crd::`.
#[test]
fn the_chart_dpf_crds_match_the_generated_ones() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../charts/causeway/templates"
    );
    let (provisioner, config) = causeway_operator::dpf::crd::chart_templates().unwrap();
    for (file, generated) in [
        ("crd-dpfhcpprovisioner.yaml", provisioner),
        ("crd-dpfhcpprovisionerconfig.yaml", config),
    ] {
        let path = format!("{dir}/{file}");
        if std::env::var_os("UPDATE_CHART_CRDS").is_some() {
            std::fs::write(&path, &generated).unwrap();
        }
        let in_chart = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            in_chart == generated,
            "{path} is stale: regenerate it with `UPDATE_CHART_CRDS=1 cargo test -p causeway-operator --test offline crd::`"
        );
    }
}

#[test]
fn the_provisioner_crd_carries_the_go_operators_names_columns_and_rules() {
    use kube::CustomResourceExt;
    let crd = causeway_operator::dpf::crd::DPFHCPProvisioner::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("dpfhcpprovisioners.provisioning.dpu.hcp.io")
    );
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["dpfhcp".to_string()][..])
    );
    let v = &crd.spec.versions[0];
    assert!(v.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<&str> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Phase", "Ready", "HostedCluster", "Age"]);
    let schema = serde_json::to_value(v.schema.as_ref().unwrap()).unwrap();
    let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
    let required: Vec<&str> = spec["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    for field in ["dpuClusterRef", "baseDomain", "ocpReleaseImage"] {
        assert!(required.contains(&field), "{field} required: {required:?}");
    }
    let rules = |v: &serde_json::Value| -> Vec<String> {
        v["x-kubernetes-validations"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|r| r["rule"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    for immutable in [
        "dpuClusterRef",
        "baseDomain",
        "sshKeySecretRef",
        "pullSecretRef",
        "etcdStorageClass",
        "controlPlaneAvailabilityPolicy",
        "virtualIP",
        "nodeSelector",
        "flannelEnabled",
        "dpuDeploymentRef",
        "networking",
    ] {
        assert!(
            rules(&spec["properties"][immutable]).contains(&"self == oldSelf".to_string()),
            "{immutable} is immutable"
        );
    }
    assert!(rules(&spec["properties"]["ocpReleaseImage"]).is_empty());
    assert!(rules(spec).iter().any(|r| r.contains("HighlyAvailable")));
    let p = &spec["properties"];
    assert_eq!(
        p["controlPlaneAvailabilityPolicy"]["default"],
        "HighlyAvailable"
    );
    assert_eq!(p["flannelEnabled"]["default"], true);
    assert_eq!(p["nodeSelector"]["maxProperties"], 20);
    assert_eq!(
        p["networking"]["properties"]["serviceNetwork"]["maxItems"],
        1
    );
    assert!(p["baseDomain"]["pattern"].is_string());
    let status = &schema["openAPIV3Schema"]["properties"]["status"]["properties"];
    for field in [
        "phase",
        "conditions",
        "hostedClusterRef",
        "kubeConfigSecretRef",
        "blueFieldOCPLayerImage",
        "blueFieldContainerImage",
    ] {
        assert!(status.get(field).is_some(), "status.{field}");
    }
    let phases = status["phase"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| !p.is_null())
        .count();
    assert_eq!(phases, 8);
}

#[test]
fn the_config_crd_carries_the_go_operators_short_name_columns_and_defaults() {
    use kube::CustomResourceExt;
    let crd = causeway_operator::dpf::crd::DPFHCPProvisionerConfig::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("dpfhcpprovisionerconfigs.provisioning.dpu.hcp.io")
    );
    assert_eq!(crd.spec.scope, "Cluster");
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["dpfhcpconfig".to_string()][..])
    );
    let v = &crd.spec.versions[0];
    let columns: Vec<(&str, &str, &str)> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| (c.name.as_str(), c.type_.as_str(), c.json_path.as_str()))
        .collect();
    assert_eq!(
        columns,
        [
            (
                "BlueFieldOCPLayerRepo",
                "string",
                ".spec.blueFieldOCPLayerRepo"
            ),
            ("DisableMetalLB", "boolean", ".spec.disableMetalLB"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ]
    );
    let schema = serde_json::to_value(v.schema.as_ref().unwrap()).unwrap();
    let p = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(
        p["blueFieldOCPLayerRepo"]["default"],
        "registry.redhat.io/dpu-kit-for-nvidia/bluefield-ocp-layer-rhel10"
    );
    assert_eq!(
        p["blueFieldOCPLayerRepo"]["default"],
        causeway_operator::dpf::crd::DEFAULT_BLUEFIELD_REPO
    );
    assert_eq!(p["disableMetalLB"]["default"], false);
    assert_eq!(p["manageDPUServiceTemplates"]["default"], false);
    assert!(p["dpuServicesImagePullSecret"].get("default").is_none());
    assert_eq!(p["dpuServicesImagePullSecret"]["type"], "string");
    let annotations = crd.metadata.annotations.unwrap();
    assert_eq!(annotations["helm.sh/resource-policy"], "keep");
}

/// Every field path of a CRD's schema with its facts (type, format, enum,
/// default), as tests/dpf/go-operator-schema.py writes them.
fn schema_paths(
    schema: &serde_json::Value,
    prefix: &str,
    out: &mut std::collections::BTreeMap<String, serde_json::Value>,
) {
    let facts: serde_json::Map<String, serde_json::Value> = ["type", "format", "enum", "default"]
        .iter()
        .filter_map(|k| schema.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    out.insert(
        if prefix.is_empty() {
            ".".into()
        } else {
            prefix.into()
        },
        facts.into(),
    );
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        for (name, sub) in props {
            schema_paths(sub, &format!("{prefix}.{name}"), out);
        }
    }
    if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
        schema_paths(items, &format!("{prefix}[]"), out);
    }
    if let Some(extra) = schema.get("additionalProperties").filter(|a| a.is_object()) {
        schema_paths(extra, &format!("{prefix}{{}}"), out);
    }
}

/// The Go operator's shipped CRDs (release-4.22, reduced to field facts in
/// tests/fixtures/go-operator-schema.json): every field of their spec and
/// status is in causeway's CRDs with the same type, so nothing a Go-era
/// manifest or tool sets is pruned; defaults and enums are the same except
/// where causeway differs on purpose, each difference named here.
#[test]
fn every_field_of_the_go_operators_crds_is_in_causeways_with_its_type_and_default() {
    use kube::CustomResourceExt;
    let go: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/go-operator-schema.json")).unwrap();
    // (kind, path, fact): why causeway differs.
    let deliberate = [
        (
            "DPFHCPProvisionerConfig",
            ".spec.blueFieldOCPLayerRepo",
            "default",
            // The product chart sets registry.redhat.io/...; the Go CRD's
            // own default is a development repository.
        ),
        ("DPFHCPProvisioner", ".spec.pullSecretRef.name", "default"),
        ("DPFHCPProvisioner", ".spec.sshKeySecretRef.name", "default"),
        (
            "DPFHCPProvisioner",
            ".status.kubeConfigSecretRef.name",
            "default",
        ),
        // A reference's empty-name default means nothing to causeway,
        // which reports a missing name as SecretsValid=False.
        ("DPFHCPProvisioner", ".status.conditions[].status", "enum"),
        // Written by causeway only, always True or False.
    ];
    for (kind, crd) in [
        (
            "DPFHCPProvisioner",
            causeway_operator::dpf::crd::DPFHCPProvisioner::crd(),
        ),
        (
            "DPFHCPProvisionerConfig",
            causeway_operator::dpf::crd::DPFHCPProvisionerConfig::crd(),
        ),
    ] {
        let want = &go["kinds"][kind];
        assert_eq!(crd.spec.scope, want["scope"].as_str().unwrap(), "{kind}");
        let version = crd.spec.versions.iter().find(|v| v.storage).unwrap();
        assert_eq!(version.name, want["version"].as_str().unwrap(), "{kind}");
        let schema =
            serde_json::to_value(&version.schema.as_ref().unwrap().open_api_v3_schema).unwrap();
        let mut ours = std::collections::BTreeMap::new();
        schema_paths(&schema, "", &mut ours);
        let mut problems = Vec::new();
        for (path, facts) in want["paths"].as_object().unwrap() {
            let Some(have) = ours.get(path) else {
                problems.push(format!("{kind} {path}: missing (Go: {facts})"));
                continue;
            };
            for fact in ["type", "default", "enum"] {
                let (g, o) = (facts.get(fact), have.get(fact));
                if g.is_some() && g != o && !deliberate.contains(&(kind, path.as_str(), fact)) {
                    problems.push(format!("{kind} {path}: {fact} Go {g:?}, causeway {o:?}"));
                }
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
