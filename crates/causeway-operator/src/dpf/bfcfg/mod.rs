//! The DPU boot template DPF provisions BlueField DPUs with: a live
//! ignition (the value of `BF_CFG_TEMPLATE`) that installs RHCOS onto the
//! DPU's disk with a target ignition carried inside it. Pure: the caller
//! reads HyperShift's ignition and the DPF objects, and publishes the bytes.
//!
//! The target is HyperShift's ignition for the hosted cluster's workers,
//! with the BlueField OS image and what a DPU worker needs added: DPF's
//! agent and its helpers, the DPUFlavor's OVS script and files, and the
//! high-speed MTU. Only trusted mode (`dpuMode: dpu`) is built.

mod encode;
mod resources;
pub mod validate;

use serde_json::{json, Map, Value};

use super::ignition::{override_os_image, IgnitionError};
use encode::{file, gzip_resource, placeholder_url, text_url};
use resources::{File, Unit};

/// DPF refuses a rendered bf.cfg larger than this.
pub const MAX_BF_SIZE: usize = 128 * 1024;
/// The version of the live ignition, which DPF's live image reads.
const LIVE_VERSION: &str = "3.4.0";
/// The version the target is validated as, whatever 3.x it declares.
const VALIDATE_AS: &str = "3.4.0";
const DEFAULT_MTU: u32 = 1500;
const DEFAULT_PERMISSIONS: u32 = 0o644;
/// The ports that carry the high-speed MTU besides pf0vf0.
const MTU_PORTS: &[&str] = &["p0", "p1", "pf0hpf", "pf1hpf"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BfcfgError {
    #[error("HyperShift's ignition: {0}")]
    Ignition(#[from] IgnitionError),
    #[error("DPUFlavor {0} has spec.dpuMode zero-trust, and the BFB registry the DPU installs dpu-agent from could not be found: {1}")]
    NoBfbRegistry(String, String),
    #[error("DPUFlavor {flavor} has spec.dpuMode {mode:?}: a DPU boot template needs dpuMode dpu or zero-trust")]
    UnsupportedDpuMode { flavor: String, mode: String },
    #[error("DPUFlavor {flavor}: {why}")]
    BadFlavor { flavor: String, why: String },
    #[error("DPUFlavor {flavor}: spec.configFiles path {path}: permissions {value:?} is not an octal file mode")]
    BadPermissions {
        flavor: String,
        path: String,
        value: String,
    },
    #[error("{path}: {why}")]
    BadSource { path: String, why: String },
    #[error("the target ignition is not valid: {}", .0.join("; "))]
    Invalid(Vec<String>),
    #[error("the bfcfg template is {size} bytes; DPF takes at most {max}")]
    TooLarge { size: usize, max: usize },
    #[error("{0}")]
    Encode(String),
}

impl BfcfgError {
    /// The IgnitionConfigured reason this error is reported under.
    pub fn reason(&self) -> &'static str {
        let _ = self;
        "IgnitionGenerationFailed"
    }
}

/// What a flavor's config file does to a file of the same path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Override,
    Append,
}

#[derive(Debug, Clone)]
struct ConfigFile {
    path: String,
    operation: Operation,
    raw: String,
    mode: u32,
}

/// How a DPU is provisioned: trusted, talking to DPF's host agent over
/// the rshim link; or zero-trust, where the host is not trusted and the
/// DPU joins with a bootstrap kubeconfig over its OOB network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DpuMode {
    Trusted,
    ZeroTrust,
}

/// The parts of a DPUFlavor the template is built from.
#[derive(Debug, Clone)]
pub struct Flavor {
    name: String,
    mode: DpuMode,
    ovs_script: String,
    config_files: Vec<ConfigFile>,
    /// The flavor as the DPU reads it: apiVersion, kind, name, namespace
    /// and spec.
    document: Value,
}

impl Flavor {
    /// Reads a DPUFlavor object; refuses a mode DPF has no template for.
    pub fn from_object(obj: &Value) -> Result<Flavor, BfcfgError> {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let bad = |why: String| BfcfgError::BadFlavor {
            flavor: name.clone(),
            why,
        };
        let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
        let mode = match spec
            .get("dpuMode")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "dpu" => DpuMode::Trusted,
            "zero-trust" => DpuMode::ZeroTrust,
            other => {
                return Err(BfcfgError::UnsupportedDpuMode {
                    flavor: name,
                    mode: other.to_string(),
                })
            }
        };
        let ovs_script = spec
            .pointer("/ovs/rawConfigScript")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut config_files = Vec::new();
        let listed = match spec.get("configFiles") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(a)) => a.as_slice(),
            Some(_) => return Err(bad("spec.configFiles is not a list".into())),
        };
        for (i, f) in listed.iter().enumerate() {
            let text = |k: &str| f.get(k).and_then(Value::as_str).unwrap_or_default();
            let path = text("path");
            if path.is_empty() {
                continue;
            }
            let operation = match text("operation") {
                "override" => Operation::Override,
                "append" => Operation::Append,
                other => {
                    return Err(bad(format!(
                        "spec.configFiles[{i}] ({path}): operation {other:?} is neither override nor append"
                    )))
                }
            };
            let permissions = text("permissions");
            let mode = if permissions.is_empty() {
                DEFAULT_PERMISSIONS
            } else {
                u32::from_str_radix(permissions, 8)
                    .ok()
                    .filter(|m| *m <= 0o7777)
                    .ok_or_else(|| BfcfgError::BadPermissions {
                        flavor: name.clone(),
                        path: path.to_string(),
                        value: permissions.to_string(),
                    })?
            };
            config_files.push(ConfigFile {
                path: path.to_string(),
                operation,
                raw: text("raw").to_string(),
                mode,
            });
        }
        let meta = |k: &str| obj.pointer(&format!("/metadata/{k}")).cloned();
        let document = json!({
            "apiVersion": obj.get("apiVersion").cloned().unwrap_or(Value::Null),
            "kind": obj.get("kind").cloned().unwrap_or(Value::Null),
            "metadata": {"name": meta("name").unwrap_or(Value::Null), "namespace": meta("namespace").unwrap_or(Value::Null)},
            "spec": spec,
        });
        Ok(Flavor {
            name,
            mode,
            ovs_script,
            config_files,
            document,
        })
    }

    pub fn mode(&self) -> DpuMode {
        self.mode
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Everything a template is made from.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// HyperShift's ignition for the hosted cluster's workers.
    pub hcp_ignition: &'a [u8],
    pub flavor: &'a Flavor,
    /// DPFOperatorConfig `spec.networking.highSpeedMTU`; unset is DPF's
    /// default, 1500.
    pub high_speed_mtu: Option<u32>,
    /// The BlueField OS image the DPU installs.
    pub os_image: &'a str,
    /// Zero-trust only: the BFB registry's URL, where the installed DPU
    /// downloads dpu-agent (resolved by [`bfb_registry_url`]).
    pub bfb_registry: Option<&'a str>,
}

/// What an ignition makes on a machine: its files (path, mode, bytes) and
/// its systemd units (name, contents), in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unpacked {
    pub files: Vec<(String, u32, Vec<u8>)>,
    pub units: Vec<(String, String)>,
}

/// The files and units of an ignition as Ignition writes them: data URLs
/// decoded and gunzipped, modes as given (0644 when absent). For reading a
/// template the way a DPU would (the boot lab runs what it unpacks);
/// other sources (http, s3) are left out, as they need a network.
pub fn unpack(ignition: &Value) -> Result<Unpacked, BfcfgError> {
    let mut out = Unpacked::default();
    for f in ignition
        .pointer("/storage/files")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let path = f["path"].as_str().unwrap_or_default().to_string();
        let source = f["contents"]["source"].as_str().unwrap_or_default();
        if !source.starts_with("data:") {
            continue;
        }
        let mode = f["mode"]
            .as_u64()
            .and_then(|m| u32::try_from(m).ok())
            .unwrap_or(0o644);
        let bytes = encode::file_bytes(&path, &f["contents"])?;
        out.files.push((path, mode, bytes));
    }
    for u in ignition
        .pointer("/systemd/units")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(name) = u["name"].as_str() {
            let contents = u["contents"].as_str().unwrap_or_default().to_string();
            out.units.push((name.to_string(), contents));
        }
    }
    Ok(out)
}

/// The value of `BF_CFG_TEMPLATE`: the live ignition, as JSON with a
/// trailing newline, refused when DPF would refuse its size.
pub fn template(inputs: &Inputs) -> Result<Vec<u8>, BfcfgError> {
    let target = target(inputs)?;
    let hcp: Value = serde_json::from_slice(inputs.hcp_ignition)
        .map_err(|e| IgnitionError::NotJson(e.to_string()))?;
    let mut live = live(&hcp, &target, inputs.flavor)?;
    encode::strip_empty(&mut live);
    let mut out = serde_json::to_vec(&live).map_err(|e| BfcfgError::Encode(e.to_string()))?;
    out.push(b'\n');
    if out.len() > MAX_BF_SIZE {
        return Err(BfcfgError::TooLarge {
            size: out.len(),
            max: MAX_BF_SIZE,
        });
    }
    Ok(out)
}

fn resource_file(f: &File) -> Result<Value, BfcfgError> {
    Ok(file(f.path, f.mode, gzip_resource(f.body.as_bytes())?))
}

fn enabled(u: &Unit) -> Value {
    json!({"name": u.name, "enabled": true, "contents": u.body})
}

/// Appends to `ignition`'s `storage.files` or `systemd.units`.
fn push(ignition: &mut Value, section: &str, list: &str, item: Value) {
    let Some(doc) = ignition.as_object_mut() else {
        return;
    };
    let section = doc
        .entry(section)
        .or_insert_with(|| Value::Object(Map::new()));
    if !section.is_object() {
        *section = Value::Object(Map::new());
    }
    let list = &mut section[list];
    if !list.is_array() {
        *list = Value::Array(Vec::new());
    }
    if let Some(items) = list.as_array_mut() {
        items.push(item);
    }
}

fn files_mut(ignition: &mut Value) -> Result<&mut Vec<Value>, BfcfgError> {
    ignition
        .pointer_mut("/storage/files")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| BfcfgError::Encode("storage.files is not a list".into()))
}

/// The ignition coreos-installer writes to the DPU's disk, before
/// compression: exposed for tests and documentation of the build order.
pub fn target(inputs: &Inputs) -> Result<Value, BfcfgError> {
    let flavor = inputs.flavor;
    let zero_trust = flavor.mode == DpuMode::ZeroTrust;
    let kept = |path: &str| !(zero_trust && resources::NOT_IN_ZERO_TRUST.contains(&path));
    let bfb_registry = match (zero_trust, inputs.bfb_registry) {
        (false, _) => None,
        (true, Some(url)) => Some(url),
        (true, None) => {
            return Err(BfcfgError::NoBfbRegistry(
                flavor.name.clone(),
                "no BFB registry URL was given".into(),
            ))
        }
    };
    // 1-2: HyperShift's ignition, on the BlueField OS image.
    let rewritten = override_os_image(inputs.hcp_ignition, inputs.os_image)?;
    let mut ign: Value =
        serde_json::from_slice(&rewritten).map_err(|e| IgnitionError::NotJson(e.to_string()))?;
    // 3: T files; pf0vf0 as text so the MTU step can edit it.
    for (i, f) in resources::TARGET_FILES.iter().enumerate() {
        if i == resources::PF0VF0_AT {
            push(
                &mut ign,
                "storage",
                "files",
                file(
                    resources::PF0VF0,
                    0o600,
                    json!({"source": text_url(resources::PF0VF0_BODY)}),
                ),
            );
        }
        if kept(f.path) {
            push(&mut ign, "storage", "files", resource_file(f)?);
        }
    }
    if let Some(url) = bfb_registry {
        push(
            &mut ign,
            "storage",
            "files",
            file(
                resources::BFB_REGISTRY_FILE,
                0o644,
                json!({"source": text_url(&format!("BFBRegistryURL={url}\n"))}),
            ),
        );
    }
    // 4: T units, sorted by name.
    let mut units = resources::TARGET_UNITS.to_vec();
    units.retain(|u| kept(u.name));
    units.sort_by_key(|u| u.name);
    for u in &units {
        push(&mut ign, "systemd", "units", enabled(u));
    }
    // 5: the agent.
    if zero_trust {
        let body = resources::DPU_AGENT.body.replace(
            "--kubeadm-secret-name=unused",
            &format!(
                "--kubeadm-secret-name=unused \\\n  {}",
                resources::ZERO_TRUST_AGENT_FLAGS
            ),
        );
        push(
            &mut ign,
            "systemd",
            "units",
            json!({"name": resources::DPU_AGENT.name, "enabled": true, "contents": body}),
        );
    } else {
        push(&mut ign, "systemd", "units", enabled(&resources::DPU_AGENT));
    }
    // 6: C files and devlink-activate.
    add_common(&mut ign, flavor.mode)?;
    // 7: the OVS script, even when empty, so dpf-ovs.service has a file.
    push(
        &mut ign,
        "storage",
        "files",
        file(
            resources::OVS_SCRIPT,
            0o755,
            json!({"source": encode::base64_url(flavor.ovs_script.as_bytes())}),
        ),
    );
    // 8: the flavor's files, merged by path.
    for cf in &flavor.config_files {
        merge_config_file(files_mut(&mut ign)?, cf)?;
    }
    // 9: the flavor for dpu-agent and wait-for-sfs.
    let yaml = serde_saphyr::to_string(&flavor.document).map_err(|e| BfcfgError::BadFlavor {
        flavor: flavor.name.clone(),
        why: format!("as YAML: {e}"),
    })?;
    push(
        &mut ign,
        "storage",
        "files",
        file(
            resources::FLAVOR_YAML,
            0o644,
            json!({"source": text_url(&yaml)}),
        ),
    );
    // 10: MTU.
    let mtu = inputs.high_speed_mtu.unwrap_or(DEFAULT_MTU);
    if mtu != DEFAULT_MTU {
        apply_mtu(&mut ign, mtu)?;
    }
    // 12: validate as 3.4.0, once the declared version is known to be 3.x.
    let mut problems = validate::problems(&ign);
    if problems.is_empty() {
        let mut copy = ign.clone();
        copy["ignition"]["version"] = Value::from(VALIDATE_AS);
        problems = validate::problems(&copy);
    }
    if !problems.is_empty() {
        return Err(BfcfgError::Invalid(problems));
    }
    // 13: gzip.
    encode::compress_files(&mut ign)?;
    Ok(ign)
}

fn add_common(ign: &mut Value, mode: DpuMode) -> Result<(), BfcfgError> {
    for f in resources::COMMON_FILES {
        let f = match mode {
            DpuMode::ZeroTrust if f.path == resources::OOB_NET0_ZT.path => &resources::OOB_NET0_ZT,
            _ => f,
        };
        push(ign, "storage", "files", resource_file(f)?);
    }
    push(
        ign,
        "systemd",
        "units",
        enabled(&resources::DEVLINK_ACTIVATE),
    );
    Ok(())
}

/// Ignition's merge by path: `override` replaces the contents of a file of
/// the same path, `append` keeps them and adds its own; either sets the
/// mode. A new path is added at the end.
fn merge_config_file(files: &mut Vec<Value>, cf: &ConfigFile) -> Result<(), BfcfgError> {
    let resource = gzip_resource(cf.raw.as_bytes())?;
    let at = match files.iter().position(|f| f["path"] == cf.path.as_str()) {
        Some(at) => at,
        None => {
            files.push(json!({"path": cf.path}));
            files.len() - 1
        }
    };
    let entry = &mut files[at];
    entry["mode"] = Value::from(cf.mode);
    match cf.operation {
        Operation::Override => {
            entry["overwrite"] = Value::Bool(true);
            entry["contents"] = resource;
        }
        Operation::Append => {
            if !entry["append"].is_array() {
                entry["append"] = Value::Array(Vec::new());
            }
            if let Some(list) = entry["append"].as_array_mut() {
                list.push(resource);
            }
        }
    }
    Ok(())
}

/// The high-speed ports' profiles, and pf0vf0 on the same MTU.
fn apply_mtu(ign: &mut Value, mtu: u32) -> Result<(), BfcfgError> {
    for port in MTU_PORTS {
        let profile = format!(
            "[connection]\nid={port}\ntype=ethernet\ninterface-name={port}\n\n[ethernet]\nmtu={mtu}\n"
        );
        push(
            ign,
            "storage",
            "files",
            file(
                &format!("{}/{port}.nmconnection", resources::NM),
                0o600,
                json!({"source": text_url(&profile)}),
            ),
        );
    }
    let files = files_mut(ign)?;
    let Some(entry) = files.iter_mut().find(|f| f["path"] == resources::PF0VF0) else {
        return Ok(());
    };
    let text = encode::file_bytes(resources::PF0VF0, &entry["contents"])?;
    let text = String::from_utf8_lossy(&text);
    let mut out = String::with_capacity(text.len() + 12);
    for line in text.split_inclusive('\n') {
        out.push_str(line);
        if line.trim_end() == "[ethernet]" {
            if !line.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!("mtu={mtu}\n"));
        }
    }
    entry["contents"] = json!({"source": text_url(&out)});
    Ok(())
}

/// The live ignition, before empty objects are stripped.
fn live(hcp: &Value, target: &Value, flavor: &Flavor) -> Result<Value, BfcfgError> {
    let mut ign = json!({"ignition": {"version": LIVE_VERSION}});
    if let Some(passwd) = hcp.get("passwd").filter(|p| !p.is_null()) {
        ign["passwd"] = passwd.clone();
    }
    // Plain text: DPF checks the template holds these words.
    push(
        &mut ign,
        "storage",
        "files",
        file(
            "/etc/temp_bfcfg_strings.env",
            0o644,
            json!({"source": text_url("bfb_pre_install bfb_modify_os bfb_post_install")}),
        ),
    );
    push(
        &mut ign,
        "storage",
        "files",
        file(
            "/etc/hostname",
            0o644,
            json!({"source": placeholder_url("{{.DPUHostName}}")}),
        ),
    );
    push(
        &mut ign,
        "storage",
        "files",
        file(
            "/etc/dpf/environment",
            0o644,
            json!({"source": placeholder_url(&format!(
                "DPUName={{{{.DPUName}}}}\nDPUNamespace={{{{.DPUNamespace}}}}\nDPUUID={{{{.DPUUID}}}}\nDPUMode={}\n",
                match flavor.mode {
                    DpuMode::Trusted => "trusted",
                    DpuMode::ZeroTrust => "zero-trust",
                }
            ))}),
        ),
    );
    if flavor.mode == DpuMode::ZeroTrust {
        // DPF fills the bootstrap kubeconfig the DPU joins with;
        // update_ignition.py carries it into the installed system.
        push(
            &mut ign,
            "storage",
            "files",
            file(
                resources::BOOTSTRAP_KUBECONFIG,
                0o600,
                json!({"source": format!("data:;base64,{}", resources::BOOTSTRAP_KUBECONFIG_PLACEHOLDER)}),
            ),
        );
    }
    for f in resources::LIVE_SCRIPTS {
        push(&mut ign, "storage", "files", resource_file(f)?);
    }
    push(
        &mut ign,
        "systemd",
        "units",
        enabled(&resources::INSTALL_RHCOS),
    );
    add_common(&mut ign, flavor.mode)?;
    let flavor_json =
        serde_json::to_vec(&flavor.document).map_err(|e| BfcfgError::Encode(e.to_string()))?;
    push(
        &mut ign,
        "storage",
        "files",
        file(resources::FLAVOR_JSON, 0o644, gzip_resource(&flavor_json)?),
    );
    let target = serde_json::to_vec(target).map_err(|e| BfcfgError::Encode(e.to_string()))?;
    push(
        &mut ign,
        "storage",
        "files",
        file(resources::TARGET_IGN, 0o644, gzip_resource(&target)?),
    );
    Ok(ign)
}

/// The Service DPF's BFB registry is published by, in the
/// DPFOperatorConfig's namespace.
pub const BFB_REGISTRY_SERVICE: &str = "bfb-registry";

/// Where a zero-trust DPU downloads dpu-agent: the DPFOperatorConfig's
/// `spec.provisioningController.registry.loadBalancerAddress`, else its
/// (deprecated) `address`, used as written without a trailing `/`; else
/// the first node port of the `bfb-registry` Service on the first Node's
/// InternalIP. DPF's own rule, except that an IPv6 address is bracketed.
pub fn bfb_registry_url(
    operator_config: &Value,
    service: Option<&k8s_openapi::api::core::v1::Service>,
    nodes: &[k8s_openapi::api::core::v1::Node],
) -> Result<String, String> {
    for field in ["loadBalancerAddress", "address"] {
        let given = operator_config
            .pointer(&format!("/spec/provisioningController/registry/{field}"))
            .and_then(Value::as_str)
            .map(|a| a.trim_end_matches('/'))
            .unwrap_or_default();
        if !given.is_empty() {
            return Ok(given.to_string());
        }
    }
    let service = service.ok_or_else(|| {
        format!(
            "no registry address in the DPFOperatorConfig and no Service {BFB_REGISTRY_SERVICE}"
        )
    })?;
    let port = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .find_map(|p| p.node_port.filter(|n| *n != 0))
        .ok_or_else(|| format!("Service {BFB_REGISTRY_SERVICE} has no node port"))?;
    let ip = nodes
        .iter()
        .find_map(|n| {
            n.status
                .as_ref()?
                .addresses
                .as_ref()?
                .iter()
                .find(|a| a.type_ == "InternalIP")
                .map(|a| a.address.clone())
        })
        .ok_or("no Node has an InternalIP")?;
    Ok(match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(v6)) => format!("http://[{v6}]:{port}"),
        _ => format!("http://{ip}:{port}"),
    })
}

/// The bytes of file `path` in `ignition` as the DPU writes them
/// (gunzipped, appends not included); `None` when there is no such file.
pub fn file_contents(ignition: &Value, path: &str) -> Result<Option<Vec<u8>>, BfcfgError> {
    validate::list(ignition, "/storage/files")
        .iter()
        .find(|f| f["path"] == path)
        .map(|f| encode::file_bytes(path, &f["contents"]))
        .transpose()
}

/// The target ignition a template (the value of `BF_CFG_TEMPLATE`) carries
/// in `/var/target.ign`.
pub fn carried_target(template: &[u8]) -> Result<Value, BfcfgError> {
    let live: Value =
        serde_json::from_slice(template).map_err(|e| IgnitionError::NotJson(e.to_string()))?;
    let target =
        file_contents(&live, resources::TARGET_IGN)?.ok_or_else(|| BfcfgError::BadSource {
            path: resources::TARGET_IGN.into(),
            why: "not in the template".into(),
        })?;
    serde_json::from_slice(&target).map_err(|e| BfcfgError::BadSource {
        path: resources::TARGET_IGN.into(),
        why: format!("not JSON: {e}"),
    })
}

/// A digest of what the template takes from the DPUFlavor and the
/// DPFOperatorConfig: the flavor's spec, the MTU and (zero-trust) the BFB
/// registry's URL. The published template records it, so an edit to any
/// makes the template again.
pub fn content_digest(
    flavor: &Value,
    high_speed_mtu: Option<u32>,
    bfb_registry: Option<&str>,
) -> String {
    let mut canonical = json!({
        "spec": flavor.get("spec").cloned().unwrap_or(Value::Null),
        "highSpeedMTU": high_speed_mtu.unwrap_or(DEFAULT_MTU),
    });
    if let Some(url) = bfb_registry {
        canonical["bfbRegistry"] = Value::from(url);
    }
    let bytes = serde_json::to_vec(&canonical).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
