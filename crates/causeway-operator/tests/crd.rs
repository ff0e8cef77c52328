//! The CRD in the chart is exactly what the code generates: regenerate it
//! with `causeway operator crd > charts/causeway/templates/crd-infra.yaml`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[test]
fn the_chart_crd_matches_the_generated_one() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../charts/causeway/templates/crd-infra.yaml"
    );
    let in_chart = std::fs::read_to_string(path).unwrap();
    let generated = causeway_operator::crd::crd_yaml().unwrap();
    assert!(
        in_chart == generated,
        "{path} is stale: regenerate it with `causeway operator crd > charts/causeway/templates/crd-infra.yaml`"
    );
}

#[test]
fn the_crd_has_the_names_and_subresource_the_chart_and_users_expect() {
    use kube::CustomResourceExt;
    let crd = causeway_operator::crd::Infra::crd();
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
