//! The three DPUServiceTemplates as a pure function of what was observed:
//! the DPF version's row of the embedded values table, merged with the
//! overrides ConfigMap's row, the pull secret setting, and for `ovn` the
//! image and versions the controller found. Also the decisions around
//! them: what a namespace needs, whose a live template is, whether the
//! OVN DaemonSet's rollout lets the `ovn` template change.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The label that marks a DPUServiceTemplate as the operator's.
pub const MANAGED_LABEL: &str = "dpfhcpprovisioner.dpu.hcp.io/managed";
/// On the `ovn` template: the host-side (x86) OVN image it was made for.
pub const SOURCE_IMAGE_ANNOTATION: &str = "dpfhcpprovisioner.dpu.hcp.io/source-x86-ovn-image";
pub const API_VERSION: &str = "svc.dpu.nvidia.com/v1alpha1";
pub const KIND: &str = "DPUServiceTemplate";
pub const OVN: &str = "ovn";
pub const DTS: &str = "doca-telemetry-service";
pub const HBN: &str = "hbn";
/// The key of the overrides ConfigMap that holds the overrides.
pub const OVERRIDES_KEY: &str = "overrides.json";

const TABLE: &str = include_str!("values.json");

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValuesError {
    #[error("DPFOperatorConfig has no status.version yet")]
    NoDpfVersion,
    #[error("DPFOperatorConfig status.version {0:?} is not a version such as v26.4.0")]
    BadDpfVersion(String),
    #[error("unsupported DPF version {version}: DPUServiceTemplate values exist for {}; for another version give all of them under \"{version}\" in the ConfigMap dpuservicetemplate-overrides ({OVERRIDES_KEY})", known.join(", "))]
    UnsupportedDpfVersion { version: String, known: Vec<String> },
    #[error("ConfigMap {configmap} key {OVERRIDES_KEY}: {detail}")]
    BadOverrides { configmap: String, detail: String },
    #[error("the values for DPF {version} leave {field} unset")]
    Incomplete {
        version: String,
        field: &'static str,
    },
    #[error("image {0:?} has neither a tag nor a digest")]
    BadImage(String),
    #[error("the embedded values table is not valid: {0}")]
    BadTable(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OvnRow {
    #[serde(rename = "chartRepoURL")]
    pub chart_repo_url: Option<String>,
    pub chart_name: Option<String>,
    pub chart_version: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DtsRow {
    #[serde(rename = "chartRepoURL")]
    pub chart_repo_url: Option<String>,
    pub chart_name: Option<String>,
    pub chart_version: Option<String>,
    #[serde(rename = "imageDTS")]
    pub image_dts: Option<String>,
    pub prometheus_port: Option<u16>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HbnRow {
    #[serde(rename = "chartRepoURL")]
    pub chart_repo_url: Option<String>,
    pub chart_name: Option<String>,
    pub chart_version: Option<String>,
    pub image_repo: Option<String>,
    pub image_tag: Option<String>,
    #[serde(rename = "bfSFCount")]
    pub bf_sf_count: Option<u32>,
}

/// One DPF version's values, as the table and the overrides write them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    #[serde(default)]
    pub ovn: OvnRow,
    #[serde(default)]
    pub dts: DtsRow,
    #[serde(default)]
    pub hbn: HbnRow,
}

fn pick<T: Clone>(over: &Option<T>, base: &Option<T>) -> Option<T> {
    over.clone().or_else(|| base.clone())
}

impl Row {
    /// `self` with every field `over` sets replaced.
    pub fn merged(&self, over: &Row) -> Row {
        Row {
            ovn: OvnRow {
                chart_repo_url: pick(&over.ovn.chart_repo_url, &self.ovn.chart_repo_url),
                chart_name: pick(&over.ovn.chart_name, &self.ovn.chart_name),
                chart_version: pick(&over.ovn.chart_version, &self.ovn.chart_version),
            },
            dts: DtsRow {
                chart_repo_url: pick(&over.dts.chart_repo_url, &self.dts.chart_repo_url),
                chart_name: pick(&over.dts.chart_name, &self.dts.chart_name),
                chart_version: pick(&over.dts.chart_version, &self.dts.chart_version),
                image_dts: pick(&over.dts.image_dts, &self.dts.image_dts),
                prometheus_port: pick(&over.dts.prometheus_port, &self.dts.prometheus_port),
            },
            hbn: HbnRow {
                chart_repo_url: pick(&over.hbn.chart_repo_url, &self.hbn.chart_repo_url),
                chart_name: pick(&over.hbn.chart_name, &self.hbn.chart_name),
                chart_version: pick(&over.hbn.chart_version, &self.hbn.chart_version),
                image_repo: pick(&over.hbn.image_repo, &self.hbn.image_repo),
                image_tag: pick(&over.hbn.image_tag, &self.hbn.image_tag),
                bf_sf_count: pick(&over.hbn.bf_sf_count, &self.hbn.bf_sf_count),
            },
        }
    }
}

/// A Helm chart source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chart {
    pub repo_url: String,
    pub chart: String,
    pub version: String,
}

/// One DPF version's values with every field set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Values {
    pub dpf_version: String,
    pub ovn: Chart,
    pub dts: Chart,
    pub dts_image: String,
    pub dts_prometheus_port: u16,
    pub hbn: Chart,
    pub hbn_image_repo: String,
    pub hbn_image_tag: String,
    pub hbn_bf_sf_count: u32,
}

/// The DPF version's `major.minor`: `v26.4.0` is `26.4`.
pub fn dpf_major_minor(status_version: Option<&str>) -> Result<String, ValuesError> {
    let raw = status_version.map(str::trim).unwrap_or_default();
    if raw.is_empty() {
        return Err(ValuesError::NoDpfVersion);
    }
    let bare = raw.strip_prefix('v').unwrap_or(raw);
    let mut parts = bare.split(['.', '-', '+']);
    let major = parts.next().unwrap_or_default();
    let minor = parts.next().unwrap_or_default();
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !numeric(major) || !numeric(minor) {
        return Err(ValuesError::BadDpfVersion(raw.to_string()));
    }
    Ok(format!("{major}.{minor}"))
}

/// The embedded table, by DPF `major.minor`.
pub fn table() -> Result<BTreeMap<String, Row>, ValuesError> {
    serde_json::from_str(TABLE).map_err(|e| ValuesError::BadTable(e.to_string()))
}

/// The overrides ConfigMap's `overrides.json`, by DPF `major.minor`.
/// Unknown fields are refused, so a typo is not silently ignored.
pub fn parse_overrides(text: &str, configmap: &str) -> Result<BTreeMap<String, Row>, ValuesError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| ValuesError::BadOverrides {
        configmap: configmap.to_string(),
        detail: e.to_string(),
    })
}

/// The values for a DPF `major.minor`: the table's row with the
/// overrides' row for that version merged in.
pub fn resolve(
    table: &BTreeMap<String, Row>,
    overrides: Option<&BTreeMap<String, Row>>,
    major_minor: &str,
) -> Result<Values, ValuesError> {
    // A DPF version the table does not know is served only from a row the
    // overrides give for it, complete: an older version's charts and
    // images, guessed, could break every DPU service of the cluster.
    let row = match (
        table.get(major_minor),
        overrides.and_then(|o| o.get(major_minor)),
    ) {
        (Some(base), Some(over)) => base.merged(over),
        (Some(base), None) => base.clone(),
        (None, Some(over)) => Row::default().merged(over),
        (None, None) => {
            return Err(ValuesError::UnsupportedDpfVersion {
                version: major_minor.to_string(),
                known: table.keys().cloned().collect(),
            })
        }
    };
    let need = |v: &Option<String>, field: &'static str| {
        v.clone().ok_or(ValuesError::Incomplete {
            version: major_minor.to_string(),
            field,
        })
    };
    let missing = |field: &'static str| ValuesError::Incomplete {
        version: major_minor.to_string(),
        field,
    };
    Ok(Values {
        dpf_version: major_minor.to_string(),
        ovn: Chart {
            repo_url: need(&row.ovn.chart_repo_url, "ovn.chartRepoURL")?,
            chart: need(&row.ovn.chart_name, "ovn.chartName")?,
            version: need(&row.ovn.chart_version, "ovn.chartVersion")?,
        },
        dts: Chart {
            repo_url: need(&row.dts.chart_repo_url, "dts.chartRepoURL")?,
            chart: need(&row.dts.chart_name, "dts.chartName")?,
            version: need(&row.dts.chart_version, "dts.chartVersion")?,
        },
        dts_image: need(&row.dts.image_dts, "dts.imageDTS")?,
        dts_prometheus_port: row
            .dts
            .prometheus_port
            .ok_or_else(|| missing("dts.prometheusPort"))?,
        hbn: Chart {
            repo_url: need(&row.hbn.chart_repo_url, "hbn.chartRepoURL")?,
            chart: need(&row.hbn.chart_name, "hbn.chartName")?,
            version: need(&row.hbn.chart_version, "hbn.chartVersion")?,
        },
        hbn_image_repo: need(&row.hbn.image_repo, "hbn.imageRepo")?,
        hbn_image_tag: need(&row.hbn.image_tag, "hbn.imageTag")?,
        hbn_bf_sf_count: row
            .hbn
            .bf_sf_count
            .ok_or_else(|| missing("hbn.bfSFCount"))?,
    })
}

/// `major.minor.patch` of an OpenShift version; a pre-release or build
/// suffix is ignored (`4.22.2-rc.1` is 4.22.2).
pub fn ocp_version(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next().unwrap_or_default();
    let mut parts = core.split('.');
    let mut next = || parts.next().and_then(|p| p.parse::<u64>().ok());
    let version = (next()?, next()?, next()?);
    parts.next().is_none().then_some(version)
}

/// `ovnDaemonsetVersion` for an OpenShift version: 1.2.0 for 4.22.0 only;
/// 1.3.0 from 4.22.1 on, before 4.22, and when the version cannot be read.
pub fn ovn_daemonset_version(ocp: &str) -> &'static str {
    match ocp_version(ocp) {
        Some(v) if v >= (4, 22, 1) => "1.3.0",
        Some(v) if v >= (4, 22, 0) => "1.2.0",
        _ => "1.3.0",
    }
}

/// Whether the OpenShift version has the multi-network and `global`
/// settings (4.22.2 and later; an unreadable version has not).
pub fn has_multi_network(ocp: &str) -> bool {
    ocp_version(ocp).is_some_and(|v| v >= (4, 22, 2))
}

/// An image split as the OVN chart's `image.{repository,tag}` take it: a
/// digest reference gives `repo@sha256` and the hex, so that the chart's
/// `repository:tag` is the digest reference again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChartImage {
    pub repository: String,
    pub tag: String,
}

pub fn chart_image(image: &str) -> Result<ChartImage, ValuesError> {
    let image = image.trim();
    let bad = || ValuesError::BadImage(image.to_string());
    if let Some((repo, digest)) = image.split_once('@') {
        let (algorithm, hex) = digest.split_once(':').ok_or_else(bad)?;
        if repo.is_empty() || algorithm.is_empty() || hex.is_empty() {
            return Err(bad());
        }
        return Ok(ChartImage {
            repository: format!("{repo}@{algorithm}"),
            tag: hex.to_string(),
        });
    }
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) if i + 1 < image.len() - last_slash && last_slash + i > 0 => Ok(ChartImage {
            repository: image[..last_slash + i].to_string(),
            tag: image[last_slash + i + 1..].to_string(),
        }),
        _ => Err(bad()),
    }
}

/// What the `ovn` template is made from, beyond the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OvnInputs {
    /// The DPU-side (aarch64) OVN image.
    pub image: ChartImage,
    pub daemonset_version: String,
    /// The cluster's OpenShift version (ClusterVersion `status.desired`).
    pub ocp_version: String,
    /// The host-side OVN image the template was made for.
    pub source_x86_image: String,
}

fn object(namespace: &str, name: &str, annotations: Value, spec: Value) -> Value {
    let mut metadata = json!({
        "name": name,
        "namespace": namespace,
        "labels": {MANAGED_LABEL: "true"},
    });
    if annotations.as_object().is_some_and(|a| !a.is_empty()) {
        metadata["annotations"] = annotations;
    }
    json!({"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec})
}

fn source(chart: &Chart) -> Value {
    json!({"repoURL": chart.repo_url, "chart": chart.chart, "version": chart.version})
}

fn pull_secrets(values: &mut Value, pull_secret: Option<&str>) {
    if let Some(name) = pull_secret.filter(|n| !n.trim().is_empty()) {
        values["imagePullSecrets"] = json!([{"name": name}]);
    }
}

/// The `doca-telemetry-service` template.
pub fn dts(namespace: &str, v: &Values, pull_secret: Option<&str>) -> Value {
    let mut values = json!({
        "configMapData": {"prometheus": {"port": v.dts_prometheus_port}},
        "hostVolumePrefix": "/var/lib",
        "imageDTS": v.dts_image,
    });
    pull_secrets(&mut values, pull_secret);
    object(
        namespace,
        DTS,
        json!({}),
        json!({
            "deploymentServiceName": DTS,
            "helmChart": {"source": source(&v.dts), "values": values},
            "resourceRequirements": {"cpu": "1", "memory": "1Gi", "storage": "1Gi"},
        }),
    )
}

/// The `hbn` template.
pub fn hbn(namespace: &str, v: &Values, pull_secret: Option<&str>) -> Value {
    let mut values = json!({
        "image": {"repository": v.hbn_image_repo, "tag": v.hbn_image_tag},
        "resources": {"memory": "6Gi", "nvidia.com/bf_sf": v.hbn_bf_sf_count},
    });
    pull_secrets(&mut values, pull_secret);
    object(
        namespace,
        HBN,
        json!({}),
        json!({
            "deploymentServiceName": HBN,
            "helmChart": {"source": source(&v.hbn), "values": values},
        }),
    )
}

/// The `ovn` template.
pub fn ovn(namespace: &str, v: &Values, o: &OvnInputs) -> Value {
    let mut dpu = json!({
        "enabled": true,
        "image": {"repository": o.image.repository, "tag": o.image.tag},
        "cniBinDir": "/var/lib/cni/bin/",
        "cniConfDir": "/run/multus/cni/net.d",
    });
    let mut values = json!({
        "commonManifests": {"enabled": true},
        "ovnDaemonsetVersion": o.daemonset_version,
        "leaseNamespace": "openshift-ovn-kubernetes",
        "gatewayOpts": "--gateway-interface=br-dpu",
    });
    if has_multi_network(&o.ocp_version) {
        dpu["ovnMultiNetworkEnable"] = json!("true");
        values["global"] = json!({
            "enableEgressIP": "true",
            "enableEgressFirewall": "true",
            "enableEgressQoS": "true",
            "enableEgressService": "true",
            "enableMultiNetworkPolicy": "true",
            "enableAdminNetworkPolicy": "true",
            "enableNetworkSegmentation": "true",
            "enableMultiNetwork": "false",
            "egressIpHealthCheckPort": "0",
        });
    }
    values["dpuManifests"] = dpu;
    object(
        namespace,
        OVN,
        json!({SOURCE_IMAGE_ANNOTATION: o.source_x86_image}),
        json!({
            "deploymentServiceName": OVN,
            "helmChart": {"source": source(&v.ovn), "values": values},
        }),
    )
}

/// What a DPU cluster namespace needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespacePlan {
    /// Management is off (or the settings object is absent): touch nothing.
    Idle,
    /// A live provisioner uses the namespace: all three templates.
    Ensure,
    /// No live provisioner: the managed templates go.
    Prune,
}

pub fn namespace_plan(manage: Option<bool>, live_provisioner: bool) -> NamespacePlan {
    match (manage, live_provisioner) {
        (Some(true), true) => NamespacePlan::Ensure,
        (Some(true), false) => NamespacePlan::Prune,
        _ => NamespacePlan::Idle,
    }
}

/// Whose a template of one of the three names is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    Absent,
    Managed,
    /// Someone else's, never adopted nor changed.
    Foreign,
}

pub fn ownership(live: Option<&Value>) -> Ownership {
    match live {
        None => Ownership::Absent,
        Some(t) if t["metadata"]["labels"][MANAGED_LABEL].as_str() == Some("true") => {
            Ownership::Managed
        }
        Some(_) => Ownership::Foreign,
    }
}

/// The DaemonSet figures the rollout gate reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rollout {
    pub generation: i64,
    pub observed_generation: i64,
    pub desired: i32,
    pub updated: i32,
    pub available: i32,
}

impl Rollout {
    pub fn complete(&self) -> bool {
        self.observed_generation >= self.generation
            && self.updated == self.desired
            && self.available == self.desired
    }
}

/// How the `ovn` template's image is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OvnPlan {
    /// The template exists and the host OVN DaemonSet is mid-rollout.
    Gated,
    /// Made for the current host image: its image and daemonset version stay.
    Keep {
        image: ChartImage,
        daemonset_version: String,
    },
    /// The DPU image must be found in the release payload.
    Resolve,
}

pub fn ovn_plan(live: Option<&Value>, source_x86_image: &str, rollout: &Rollout) -> OvnPlan {
    let Some(live) = live else {
        return OvnPlan::Resolve;
    };
    if !rollout.complete() {
        return OvnPlan::Gated;
    }
    let annotation = live["metadata"]["annotations"][SOURCE_IMAGE_ANNOTATION].as_str();
    let values = &live["spec"]["helmChart"]["values"];
    let image = &values["dpuManifests"]["image"];
    match (
        annotation,
        image["repository"].as_str(),
        image["tag"].as_str(),
        values["ovnDaemonsetVersion"].as_str(),
    ) {
        (Some(a), Some(repository), Some(tag), Some(version)) if a == source_x86_image => {
            OvnPlan::Keep {
                image: ChartImage {
                    repository: repository.to_string(),
                    tag: tag.to_string(),
                },
                daemonset_version: version.to_string(),
            }
        }
        _ => OvnPlan::Resolve,
    }
}

/// The release payload to read the DPU's OVN image from: the desired
/// release's repository, tagged `<version>-aarch64`.
pub fn aarch64_release(desired_image: &str, version: &str) -> Result<String, ValuesError> {
    let image = desired_image.trim();
    let repo = match image.split_once('@') {
        Some((repo, _)) => repo.to_string(),
        None => chart_image(image)?.repository,
    };
    if repo.is_empty() || version.trim().is_empty() {
        return Err(ValuesError::BadImage(image.to_string()));
    }
    Ok(format!("{repo}:{}-aarch64", version.trim()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn values_26_4() -> Values {
        resolve(&table().unwrap(), None, "26.4").unwrap()
    }

    fn ovn_inputs(ocp: &str) -> OvnInputs {
        OvnInputs {
            image: chart_image("quay.io/ocp/ovn@sha256:abc123").unwrap(),
            daemonset_version: ovn_daemonset_version(ocp).into(),
            ocp_version: ocp.into(),
            source_x86_image: "quay.io/ocp/ovn-x86@sha256:def".into(),
        }
    }

    #[test]
    fn the_dpf_version_is_major_minor_without_the_v() {
        assert_eq!(dpf_major_minor(Some("v26.4.0")).unwrap(), "26.4");
        assert_eq!(dpf_major_minor(Some("26.4")).unwrap(), "26.4");
        assert_eq!(dpf_major_minor(Some("v26.4.1-rc.2")).unwrap(), "26.4");
        assert_eq!(dpf_major_minor(None), Err(ValuesError::NoDpfVersion));
        assert_eq!(dpf_major_minor(Some(" ")), Err(ValuesError::NoDpfVersion));
        assert!(matches!(
            dpf_major_minor(Some("latest")),
            Err(ValuesError::BadDpfVersion(_))
        ));
        assert!(matches!(
            dpf_major_minor(Some("v26")),
            Err(ValuesError::BadDpfVersion(_))
        ));
    }

    #[test]
    fn an_unsupported_dpf_version_is_refused_naming_the_known_ones() {
        let e = resolve(&table().unwrap(), None, "25.10").unwrap_err();
        assert_eq!(
            e,
            ValuesError::UnsupportedDpfVersion {
                version: "25.10".into(),
                known: vec!["26.4".into()]
            }
        );
        assert!(
            e.to_string().contains("unsupported DPF version 25.10")
                && e.to_string().contains("dpuservicetemplate-overrides"),
            "{e}"
        );
    }

    /// A newer DPF is served from the overrides alone, when they give
    /// every value for it; a partial row names what is missing.
    #[test]
    fn an_unknown_dpf_version_is_served_only_from_a_complete_override() {
        let table = table().unwrap();
        let known = table.get("26.4").unwrap().clone();
        let complete: BTreeMap<String, Row> = [("26.10".to_string(), known)].into();
        let v = resolve(&table, Some(&complete), "26.10").unwrap();
        assert_eq!(v.dpf_version, "26.10");
        assert_eq!(
            v,
            Values {
                dpf_version: "26.10".into(),
                ..values_26_4()
            }
        );
        let mut partial_row = Row::default();
        partial_row.ovn.chart_version = Some("26.10.0".into());
        let partial: BTreeMap<String, Row> = [("26.10".to_string(), partial_row)].into();
        assert!(matches!(
            resolve(&table, Some(&partial), "26.10"),
            Err(ValuesError::Incomplete {
                field: "ovn.chartRepoURL",
                ..
            })
        ));
    }

    #[test]
    fn the_26_4_doca_telemetry_template() {
        let t = dts("dpf-operator-system", &values_26_4(), None);
        assert_eq!(t["apiVersion"], "svc.dpu.nvidia.com/v1alpha1");
        assert_eq!(t["kind"], "DPUServiceTemplate");
        assert_eq!(t["metadata"]["name"], "doca-telemetry-service");
        assert_eq!(t["metadata"]["namespace"], "dpf-operator-system");
        assert_eq!(t["metadata"]["labels"][MANAGED_LABEL], "true");
        assert_eq!(
            t["spec"],
            json!({
                "deploymentServiceName": "doca-telemetry-service",
                "helmChart": {
                    "source": {"repoURL": "https://helm.ngc.nvidia.com/nvidia/doca", "chart": "doca-telemetry", "version": "1.25.5"},
                    "values": {
                        "configMapData": {"prometheus": {"port": 9189}},
                        "hostVolumePrefix": "/var/lib",
                        "imageDTS": "nvcr.io/nvidia/doca/doca_telemetry:1.25.5-doca3.4.0",
                    },
                },
                "resourceRequirements": {"cpu": "1", "memory": "1Gi", "storage": "1Gi"},
            })
        );
    }

    #[test]
    fn the_26_4_hbn_template() {
        let t = hbn("ns", &values_26_4(), None);
        assert_eq!(t["metadata"]["name"], "hbn");
        assert_eq!(
            t["spec"],
            json!({
                "deploymentServiceName": "hbn",
                "helmChart": {
                    "source": {"repoURL": "https://helm.ngc.nvidia.com/nvidia/doca", "chart": "doca-hbn", "version": "3.4.0"},
                    "values": {
                        "image": {"repository": "nvcr.io/nvidia/doca/doca_hbn", "tag": "3.4.0-doca3.4.0"},
                        "resources": {"memory": "6Gi", "nvidia.com/bf_sf": 3},
                    },
                },
            })
        );
    }

    #[test]
    fn the_26_4_ovn_template_before_4_22_2() {
        let t = ovn("ns", &values_26_4(), &ovn_inputs("4.22.1"));
        assert_eq!(t["metadata"]["name"], "ovn");
        assert_eq!(
            t["metadata"]["annotations"][SOURCE_IMAGE_ANNOTATION],
            "quay.io/ocp/ovn-x86@sha256:def"
        );
        assert_eq!(
            t["spec"],
            json!({
                "deploymentServiceName": "ovn",
                "helmChart": {
                    "source": {"repoURL": "oci://ghcr.io/mellanox/charts", "chart": "ovn-kubernetes-chart", "version": "v26.4-ocp-beta3"},
                    "values": {
                        "commonManifests": {"enabled": true},
                        "dpuManifests": {
                            "enabled": true,
                            "image": {"repository": "quay.io/ocp/ovn@sha256", "tag": "abc123"},
                            "cniBinDir": "/var/lib/cni/bin/",
                            "cniConfDir": "/run/multus/cni/net.d",
                        },
                        "ovnDaemonsetVersion": "1.3.0",
                        "leaseNamespace": "openshift-ovn-kubernetes",
                        "gatewayOpts": "--gateway-interface=br-dpu",
                    },
                },
            })
        );
    }

    #[test]
    fn from_4_22_2_the_ovn_template_enables_multi_network_and_the_global_map() {
        for ocp in ["4.22.2", "4.22.2-rc.1", "4.23.0"] {
            let t = ovn("ns", &values_26_4(), &ovn_inputs(ocp));
            let v = &t["spec"]["helmChart"]["values"];
            assert_eq!(v["dpuManifests"]["ovnMultiNetworkEnable"], "true", "{ocp}");
            assert_eq!(
                v["global"],
                json!({
                    "enableEgressIP": "true", "enableEgressFirewall": "true",
                    "enableEgressQoS": "true", "enableEgressService": "true",
                    "enableMultiNetworkPolicy": "true", "enableAdminNetworkPolicy": "true",
                    "enableNetworkSegmentation": "true", "enableMultiNetwork": "false",
                    "egressIpHealthCheckPort": "0",
                }),
                "{ocp}"
            );
        }
        for ocp in ["4.22.1", "4.21.9", "junk"] {
            let t = ovn("ns", &values_26_4(), &ovn_inputs(ocp));
            let v = &t["spec"]["helmChart"]["values"];
            assert!(v.get("global").is_none(), "{ocp}");
            assert!(
                v["dpuManifests"].get("ovnMultiNetworkEnable").is_none(),
                "{ocp}"
            );
        }
    }

    #[test]
    fn the_ovn_daemonset_version_follows_the_openshift_version() {
        assert_eq!(ovn_daemonset_version("4.21.9"), "1.3.0");
        assert_eq!(ovn_daemonset_version("4.22.0"), "1.2.0");
        assert_eq!(ovn_daemonset_version("4.22.0-ec.3"), "1.2.0");
        assert_eq!(ovn_daemonset_version("4.22.1"), "1.3.0");
        assert_eq!(ovn_daemonset_version("4.22.2-rc.1"), "1.3.0");
        assert_eq!(ovn_daemonset_version("junk"), "1.3.0");
        assert_eq!(ovn_daemonset_version(""), "1.3.0");
        assert_eq!(ocp_version("4.22.2-rc.1"), Some((4, 22, 2)));
        assert_eq!(ocp_version("4.22"), None);
    }

    #[test]
    fn a_digest_image_splits_into_repo_at_sha256_and_the_hex() {
        assert_eq!(
            chart_image("quay.io/ocp/ovn@sha256:0123abcd").unwrap(),
            ChartImage {
                repository: "quay.io/ocp/ovn@sha256".into(),
                tag: "0123abcd".into()
            }
        );
        assert_eq!(
            chart_image("registry:5000/ocp/ovn:4.22.1").unwrap(),
            ChartImage {
                repository: "registry:5000/ocp/ovn".into(),
                tag: "4.22.1".into()
            }
        );
        for bad in [
            "registry:5000/ocp/ovn",
            "ovn:",
            "@sha256:ab",
            "x@sha256",
            "",
        ] {
            assert!(chart_image(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_aarch64_payload_is_the_desired_repository_at_version_aarch64() {
        assert_eq!(
            aarch64_release(
                "quay.io/openshift-release-dev/ocp-release@sha256:aa",
                "4.22.1"
            )
            .unwrap(),
            "quay.io/openshift-release-dev/ocp-release:4.22.1-aarch64"
        );
        assert_eq!(
            aarch64_release("127.0.0.1:5000/ocp/release:4.22.1-multi", "4.22.1").unwrap(),
            "127.0.0.1:5000/ocp/release:4.22.1-aarch64"
        );
        assert!(aarch64_release("quay.io/x/y@sha256:aa", "").is_err());
    }

    #[test]
    fn overrides_replace_only_the_fields_they_set() {
        let over = parse_overrides(
            r#"{"26.4": {"hbn": {"imageTag": "3.4.1", "bfSFCount": 4}, "ovn": {"chartVersion": "v26.4-ocp-ga"}}}"#,
            "ns/cm",
        )
        .unwrap();
        let v = resolve(&table().unwrap(), Some(&over), "26.4").unwrap();
        assert_eq!(v.hbn_image_tag, "3.4.1");
        assert_eq!(v.hbn_bf_sf_count, 4);
        assert_eq!(v.hbn_image_repo, "nvcr.io/nvidia/doca/doca_hbn");
        assert_eq!(v.ovn.version, "v26.4-ocp-ga");
        assert_eq!(v.ovn.chart, "ovn-kubernetes-chart");
        assert_eq!(v.dts, values_26_4().dts);
        // Another version's overrides change nothing here.
        let other = parse_overrides(r#"{"27.1": {"hbn": {"imageTag": "x"}}}"#, "ns/cm").unwrap();
        assert_eq!(
            resolve(&table().unwrap(), Some(&other), "26.4").unwrap(),
            values_26_4()
        );
    }

    #[test]
    fn overrides_with_an_unknown_field_are_refused_with_its_path() {
        let e = parse_overrides(r#"{"26.4": {"hbn": {"imageTags": "x"}}}"#, "ns/cm").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("imageTags"), "{text}");
        assert!(text.contains("26.4.hbn"), "{text}");
        assert!(parse_overrides(r#"{"26.4": {"doca": {}}}"#, "ns/cm").is_err());
        assert!(parse_overrides("not json", "ns/cm").is_err());
    }

    #[test]
    fn the_pull_secret_goes_to_telemetry_and_hbn_only() {
        let v = values_26_4();
        let want = json!([{"name": "nvcr"}]);
        assert_eq!(
            dts("ns", &v, Some("nvcr"))["spec"]["helmChart"]["values"]["imagePullSecrets"],
            want
        );
        assert_eq!(
            hbn("ns", &v, Some("nvcr"))["spec"]["helmChart"]["values"]["imagePullSecrets"],
            want
        );
        let o = ovn("ns", &v, &ovn_inputs("4.22.1"));
        assert!(o["spec"]["helmChart"]["values"]
            .get("imagePullSecrets")
            .is_none());
        assert!(dts("ns", &v, Some(""))["spec"]["helmChart"]["values"]
            .get("imagePullSecrets")
            .is_none());
    }

    #[test]
    fn a_namespace_is_left_alone_unless_management_is_on() {
        assert_eq!(namespace_plan(None, true), NamespacePlan::Idle);
        assert_eq!(namespace_plan(Some(false), true), NamespacePlan::Idle);
        assert_eq!(namespace_plan(Some(false), false), NamespacePlan::Idle);
        assert_eq!(namespace_plan(Some(true), true), NamespacePlan::Ensure);
        assert_eq!(namespace_plan(Some(true), false), NamespacePlan::Prune);
    }

    #[test]
    fn an_unlabelled_template_is_foreign_and_never_adopted() {
        assert_eq!(ownership(None), Ownership::Absent);
        let ours = hbn("ns", &values_26_4(), None);
        assert_eq!(ownership(Some(&ours)), Ownership::Managed);
        let mut theirs = ours.clone();
        theirs["metadata"]["labels"] = json!({});
        assert_eq!(ownership(Some(&theirs)), Ownership::Foreign);
        theirs["metadata"]["labels"] = json!({MANAGED_LABEL: "false"});
        assert_eq!(ownership(Some(&theirs)), Ownership::Foreign);
    }

    #[test]
    fn a_rollout_is_complete_only_when_observed_updated_and_available() {
        let done = Rollout {
            generation: 3,
            observed_generation: 3,
            desired: 2,
            updated: 2,
            available: 2,
        };
        assert!(done.complete());
        assert!(!Rollout {
            observed_generation: 2,
            ..done
        }
        .complete());
        assert!(!Rollout { updated: 1, ..done }.complete());
        assert!(!Rollout {
            available: 1,
            ..done
        }
        .complete());
    }

    #[test]
    fn the_ovn_image_is_kept_gated_or_resolved() {
        let v = values_26_4();
        let inputs = ovn_inputs("4.22.1");
        let live = ovn("ns", &v, &inputs);
        let done = Rollout::default();
        let mid = Rollout {
            generation: 2,
            observed_generation: 2,
            desired: 3,
            updated: 1,
            available: 3,
        };
        // First creation is never gated.
        assert_eq!(ovn_plan(None, "any", &mid), OvnPlan::Resolve);
        assert_eq!(ovn_plan(Some(&live), "any", &mid), OvnPlan::Gated);
        assert_eq!(
            ovn_plan(Some(&live), &inputs.source_x86_image, &done),
            OvnPlan::Keep {
                image: inputs.image.clone(),
                daemonset_version: "1.3.0".into()
            }
        );
        assert_eq!(
            ovn_plan(Some(&live), "quay.io/ocp/ovn-x86@sha256:new", &done),
            OvnPlan::Resolve
        );
    }
}
