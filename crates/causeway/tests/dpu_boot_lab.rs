//! The DPU boot lab: the boot template the operator generates, unpacked as
//! a DPU's Ignition would write it, its units run as systemd would run
//! them (EnvironmentFile= then ExecStart) against a stand-in for DPF's host
//! agent on the rshim link (`tests/dpf/host-agent.py`, written from the
//! host agent's protocol and refusing what it would not accept).
//!
//! The template comes from `bfcfg::template`, the function the operator
//! runs for the ConfigMap it publishes, with DPF's placeholders filled in
//! as DPF fills them. The live installer runs first; what it left in
//! `/var/target.ign` (with the DPU's identity added) is unpacked as the
//! installed system, whose host-agent units then run.
//!
//! Needs root (network namespaces, chroot, mounts): without it each test
//! prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use causeway_operator::dpf::bfcfg::{self, Flavor, Inputs};
use serde_json::{json, Value};

const DPU_NAME: &str = "dpu-0";
const DPU_NAMESPACE: &str = "dpf-operator-system";
const DPU_UID: &str = "3f1c9a2e-5b7d-4e8f-9a10-b2c3d4e5f607";
const OS_IMAGE: &str = "quay.io/lab/bf:4.19";
/// Zero-trust only: where the DPU downloads dpu-agent; in the lab the
/// stand-in serves the package index there.
const BFB_REGISTRY: &str = "http://[fe80::1%25tmfifo_net0]:11029";

fn base64_of(bytes: &[u8]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// HyperShift's worker ignition, reduced to what the template wraps: the
/// kubeconfig, and the MachineConfig the MCO encapsulates.
fn hcp_ignition() -> Vec<u8> {
    let machine_config = json!({
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
        "metadata": {"name": "rendered-worker"},
        "spec": {"osImageURL": OS_IMAGE, "config": {"ignition": {"version": "3.2.0"}}},
    });
    let encapsulated = format!(
        "data:,{}",
        machine_config
            .to_string()
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            })
            .collect::<String>()
    );
    serde_json::to_vec(&json!({
        "ignition": {"version": "3.2.0"},
        "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA core"]}]},
        "storage": {"files": [
            {"path": "/etc/kubernetes/kubeconfig", "contents": {"source": "data:,apiVersion%3A%20v1"}, "mode": 384},
            {"path": causeway_operator::dpf::ignition::ENCAPSULATED, "contents": {"source": encapsulated}, "mode": 420},
        ]},
        "systemd": {"units": [{"name": "kubelet.service", "enabled": true}]},
    }))
    .unwrap()
}

const BOOTSTRAP_KUBECONFIG: &str =
    "apiVersion: v1\nkind: Config\n# the lab's bootstrap kubeconfig\n";

/// The template as DPF hands it to a DPU: generated for a flavor of
/// `dpu_mode`, then its placeholders filled with the DPU's identity (and,
/// zero-trust, its bootstrap kubeconfig).
fn template_for_the_dpu(dpu_mode: &str) -> Value {
    let flavor = Flavor::from_object(&json!({
        "apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPUFlavor",
        "metadata": {"name": "lab", "namespace": DPU_NAMESPACE},
        "spec": {
            "dpuMode": dpu_mode,
            "grub": {"kernelParameters": ["console=hvc0", "hugepages=3072"]},
            "nvconfig": [{"device": "*", "parameters": ["NUM_OF_VFS=1", "PF_BAR2_ENABLE=0"]}],
        },
    }))
    .unwrap();
    let hcp = hcp_ignition();
    let bytes = bfcfg::template(&Inputs {
        hcp_ignition: &hcp,
        flavor: &flavor,
        high_speed_mtu: None,
        os_image: OS_IMAGE,
        bfb_registry: Some(BFB_REGISTRY),
    })
    .unwrap();
    let text = String::from_utf8(bytes)
        .unwrap()
        .replace("{{.DPUName}}", DPU_NAME)
        .replace("{{.DPUNamespace}}", DPU_NAMESPACE)
        .replace("{{.DPUUID}}", DPU_UID)
        .replace("{{.DPUHostName}}", DPU_NAME)
        .replace(
            "{{ .BootstrapKubeconfig | b64enc }}",
            &base64_of(BOOTSTRAP_KUBECONFIG.as_bytes()),
        );
    assert!(
        !text.contains("{{."),
        "a placeholder DPF does not fill is left in the template"
    );
    serde_json::from_str(&text).unwrap()
}

/// Writes what `ignition` makes into `root`: files at their paths, units
/// under /etc/systemd/system.
fn unpack_into(ignition: &Value, root: &Path) {
    let unpacked = bfcfg::unpack(ignition).unwrap();
    for (path, mode, bytes) in &unpacked.files {
        let at = root.join(path.trim_start_matches('/'));
        fs::create_dir_all(at.parent().unwrap()).unwrap();
        fs::write(&at, bytes).unwrap();
        fs::set_permissions(&at, std::os::unix::fs::PermissionsExt::from_mode(*mode)).unwrap();
    }
    let units = root.join("etc/systemd/system");
    fs::create_dir_all(&units).unwrap();
    for (name, contents) in &unpacked.units {
        if !contents.is_empty() {
            fs::write(units.join(name), contents).unwrap();
        }
    }
}

/// What the lab left: the stand-in's record, the stubs' and each unit's.
struct Run {
    out: PathBuf,
    calls: Vec<Value>,
}

impl Run {
    fn rc(&self, unit: &str) -> i32 {
        fs::read_to_string(self.out.join(format!("{unit}.rc")))
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or(-1)
    }
    fn log(&self, unit: &str) -> String {
        fs::read_to_string(self.out.join(format!("{unit}.log"))).unwrap_or_default()
    }
    fn stubs(&self) -> String {
        fs::read_to_string(self.out.join("stubs.log")).unwrap_or_default()
    }
    /// Every call, one line each, for failure messages.
    fn summary(&self) -> String {
        self.calls
            .iter()
            .map(|c| {
                format!(
                    "{} {} -> {} {}",
                    c["method"].as_str().unwrap_or(""),
                    c["path"].as_str().unwrap_or(""),
                    c["status"],
                    c.get("refused").and_then(Value::as_str).unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
    /// The calls refused with a 4xx or 5xx, other than the link wait's
    /// probe of `/` (any answer there means the host agent is up).
    fn refused(&self) -> Vec<&Value> {
        self.calls
            .iter()
            .filter(|c| c["status"].as_u64().unwrap_or(0) >= 400 && c["path"] != "/")
            .collect()
    }
    /// The accepted update-status bodies' agentStatus objects, in order.
    fn agent_statuses(&self) -> Vec<&Value> {
        self.calls
            .iter()
            .filter(|c| c["path"] == "/update-status" && c["status"] == 200)
            .map(|c| &c["body"]["agentStatus"])
            .collect()
    }
    fn conditions_of_type(&self, type_: &str) -> Vec<&Value> {
        self.agent_statuses()
            .into_iter()
            .flat_map(|a| a["conditions"].as_array().into_iter().flatten())
            .filter(|c| c["type"] == type_)
            .collect()
    }
}

/// Runs `units` of `root` in the lab, each for at most `bound` seconds;
/// `env` sets the stubs' answers.
fn lab(root: &Path, out: &Path, units: &[&str], env: &[(&str, &str)], bound: u32) -> Run {
    let mut cmd = Command::new("bash");
    cmd.arg(repo().join("tests/dpf/boot-lab.sh"))
        .arg(root)
        .arg(out)
        .args([DPU_NAME, DPU_NAMESPACE, DPU_UID])
        .args(units)
        .env("UNIT_TIMEOUT", bound.to_string());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let status = cmd.status().unwrap();
    assert!(status.success(), "boot-lab.sh failed: {status}");
    let calls = fs::read_to_string(out.join("calls.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    Run {
        out: out.to_path_buf(),
        calls,
    }
}

fn ready(test: &str) -> bool {
    if !support::root_or_skip_for(test, "network namespaces, chroot and mounts") {
        return false;
    }
    support::tool("python3", "python3");
    support::tool("curl", "curl");
    support::tool("ping", "iputils-ping");
    support::tool("jq", "jq");
    true
}

const INSTALL: &str = "install-rhcos-dpf.service";

/// The live installer, then the installed system's host-agent units, the
/// way a DPU boots: every call is one the host agent accepts, in the
/// order DPF expects them.
#[test]
fn a_dpu_installs_reports_and_joins_through_the_host_agent() {
    let test = "a_dpu_installs_reports_and_joins_through_the_host_agent";
    if !ready(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    unpack_into(&template_for_the_dpu("dpu"), &live);
    let run = lab(&live, &dir.path().join("out-live"), &[INSTALL], &[], 40);
    let calls = run.summary();
    assert!(
        run.refused().is_empty(),
        "the host agent refused:\n{calls}\n--- {INSTALL}:\n{}",
        run.log(INSTALL)
    );
    assert_eq!(run.rc(INSTALL), 0, "{}\n{calls}", run.log(INSTALL));
    // In order: the reboot method, the start time, then the phase read
    // until DPF says "DPU Config".
    let discovery = run
        .calls
        .iter()
        .position(|c| {
            c["path"] == "/update-status"
                && c["body"]["agentStatus"]["conditions"][0]["type"] == "RebootMethodDiscovery"
        })
        .unwrap_or_else(|| panic!("no RebootMethodDiscovery:\n{calls}"));
    let started = run
        .calls
        .iter()
        .position(|c| {
            c["path"] == "/update-status" && c["body"]["agentStatus"]["lastStartupTime"].is_string()
        })
        .unwrap_or_else(|| panic!("no lastStartupTime:\n{calls}"));
    let phase = run
        .calls
        .iter()
        .rposition(|c| c["path"] == "/get-object" && c["method"] == "GET")
        .unwrap_or_else(|| panic!("no phase read:\n{calls}"));
    assert!(discovery < started && started < phase, "{calls}");
    assert_eq!(run.calls[phase]["phase"], "DPU Config", "{calls}");
    assert_eq!(run.calls[phase]["query"]["kind"], "DPU");
    // Every POST carries the DPU's identity.
    for c in run.calls.iter().filter(|c| c["method"] == "POST") {
        assert_eq!(c["body"]["dpuName"], DPU_NAME, "{c}");
        assert_eq!(c["body"]["dpuUID"], DPU_UID, "{c}");
    }
    // Installed to the disk with the flavor's kernel arguments, booted
    // from it, rebooted into it; no power cycle for an NVConfig that fit.
    let stubs = run.stubs();
    assert!(
        stubs.contains("coreos-installer install /dev/nvme0n1")
            && stubs.contains("hugepages=3072")
            && stubs.contains("--ignition-file /var/target.ign"),
        "{stubs}"
    );
    assert!(stubs.contains("efibootmgr -c -d /dev/nvme0n1"), "{stubs}");
    assert!(stubs.lines().any(|l| l.trim() == "reboot"), "{stubs}");
    assert!(!calls.contains("/trigger-reboot"), "{calls}");

    // The installed system, from the target ignition the installer wrote.
    let target_ign: Value =
        serde_json::from_slice(&fs::read(live.join("var/target.ign")).unwrap()).unwrap();
    let target = dir.path().join("target");
    unpack_into(&target_ign, &target);
    let env = fs::read_to_string(target.join("etc/dpf/environment")).unwrap();
    assert!(env.contains(&format!("DPUUID={DPU_UID}")), "{env}");
    let units = [
        "tmfifo-agent-link.service",
        "report-machineosurl.service",
        "install-dpu-agent.service",
    ];
    let run = lab(&target, &dir.path().join("out-target"), &units, &[], 40);
    let calls = run.summary();
    assert!(
        run.refused().is_empty(),
        "the host agent refused:\n{calls}\n{}",
        units.iter().map(|u| run.log(u)).collect::<String>()
    );
    for unit in units {
        assert_eq!(run.rc(unit), 0, "{unit}: {}\n{calls}", run.log(unit));
    }
    // The link wait asked `/` (any answer will do) before reporting.
    assert_eq!(
        run.calls.first().map(|c| &c["path"]),
        Some(&json!("/")),
        "{calls}"
    );
    let connected = run.conditions_of_type("HostAgentConnected");
    assert_eq!(connected.len(), 1, "{calls}");
    assert_eq!(connected[0]["status"], "True");
    let url = run.conditions_of_type("MachineOSURL");
    assert_eq!(url.len(), 1, "{calls}");
    assert_eq!(url[0]["message"], OS_IMAGE, "{calls}");
    // dpu-agent from the host agent's repository, unpacked and installed.
    let stubs = run.stubs();
    assert!(
        stubs.contains("dnf download dpu-agent --disablerepo=* --enablerepo=agentrepo"),
        "{stubs}"
    );
}

/// A NIC whose NVConfig had to change needs a power cycle, which only the
/// host can give: asked for once the DPU is configured, by the method
/// name the host agent knows.
#[test]
fn a_changed_nvconfig_asks_the_host_for_a_power_cycle() {
    let test = "a_changed_nvconfig_asks_the_host_for_a_power_cycle";
    if !ready(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    unpack_into(&template_for_the_dpu("dpu"), &live);
    let run = lab(
        &live,
        &dir.path().join("out"),
        &[INSTALL],
        &[("LAB_NVCONFIG", "change")],
        // The power cycle is asked for every minute until the host gives
        // it: the unit never ends by itself.
        10,
    );
    assert_eq!(run.rc(INSTALL), 124, "{}", run.log(INSTALL));
    let calls = run.summary();
    let stubs = run.stubs();
    assert!(
        stubs.contains("set SRIOV_EN=1 PF_NUM_OF_VF_VALID=0"),
        "{stubs}"
    );
    assert!(stubs.contains("set NUM_OF_VFS=1"), "{stubs}");
    let reboots: Vec<&Value> = run
        .calls
        .iter()
        .filter(|c| c["path"] == "/trigger-reboot")
        .collect();
    assert!(!reboots.is_empty(), "no power cycle asked for:\n{calls}");
    assert_eq!(reboots[0]["status"], 200, "{calls}");
    assert_eq!(reboots[0]["body"]["rebootMethod"], "PowerCycle");
    assert_eq!(reboots[0]["phase"], "Rebooting");
    // Only after the host configured the DPU.
    let configured = run
        .calls
        .iter()
        .position(|c| c["phase"] == "DPU Config")
        .unwrap();
    let first_reboot = run
        .calls
        .iter()
        .position(|c| c["path"] == "/trigger-reboot")
        .unwrap();
    assert!(configured < first_reboot, "{calls}");
}

/// A failed install is reported to the host agent as the InstallError
/// condition with the step's reason, and the DPU does not reboot into a
/// half-written disk.
#[test]
fn a_failed_install_reaches_the_host_as_an_install_error() {
    let test = "a_failed_install_reaches_the_host_as_an_install_error";
    if !ready(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    unpack_into(&template_for_the_dpu("dpu"), &live);
    let run = lab(
        &live,
        &dir.path().join("out"),
        &[INSTALL],
        &[("LAB_INSTALL", "fail")],
        40,
    );
    let calls = run.summary();
    assert_ne!(run.rc(INSTALL), 0, "{}", run.log(INSTALL));
    let errors = run.conditions_of_type("InstallError");
    assert_eq!(errors.len(), 1, "{calls}");
    assert_eq!(errors[0]["reason"], "RHCOSInstallation", "{calls}");
    assert_eq!(errors[0]["status"], "True");
    assert!(
        !calls.contains("lastStartupTime") && !run.stubs().lines().any(|l| l.trim() == "reboot"),
        "{calls}"
    );
}

/// A zero-trust DPU does not trust the host: it installs and reboots
/// without a single call to the host agent, and the installed system
/// joins with DPF's bootstrap kubeconfig and fetches dpu-agent from the
/// BFB registry.
#[test]
fn a_zero_trust_dpu_installs_without_a_word_to_the_host() {
    let test = "a_zero_trust_dpu_installs_without_a_word_to_the_host";
    if !ready(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    unpack_into(&template_for_the_dpu("zero-trust"), &live);
    let run = lab(&live, &dir.path().join("out-live"), &[INSTALL], &[], 40);
    assert_eq!(run.rc(INSTALL), 0, "{}", run.log(INSTALL));
    assert!(
        run.calls.is_empty(),
        "the host agent was called:\n{}",
        run.summary()
    );
    let stubs = run.stubs();
    assert!(
        stubs.contains("coreos-installer install /dev/nvme0n1"),
        "{stubs}"
    );
    assert!(stubs.lines().any(|l| l.trim() == "reboot"), "{stubs}");

    let target_ign: Value =
        serde_json::from_slice(&fs::read(live.join("var/target.ign")).unwrap()).unwrap();
    let target = dir.path().join("target");
    unpack_into(&target_ign, &target);
    // The installer carried the bootstrap kubeconfig over, private.
    let kubeconfig = target.join("var/lib/dpf/dpuagent/bootstrap-kubeconfig");
    assert_eq!(
        fs::read_to_string(&kubeconfig).unwrap(),
        BOOTSTRAP_KUBECONFIG
    );
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&fs::metadata(&kubeconfig).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    assert_eq!(
        fs::read_to_string(target.join("etc/dpf/bfb-registry")).unwrap(),
        format!("BFBRegistryURL={BFB_REGISTRY}\n")
    );
    let agent = fs::read_to_string(target.join("etc/systemd/system/dpu-agent.service")).unwrap();
    assert!(
        agent.contains(
            "--zero-trust-mode --bootstrap-kubeconfig=/var/lib/dpf/dpuagent/bootstrap-kubeconfig"
        ),
        "{agent}"
    );
    assert!(!target
        .join("etc/systemd/system/pf-monitor.service")
        .exists());
    let units = ["tmfifo-agent-link.service"];
    let run = lab(&target, &dir.path().join("out-target"), &units, &[], 40);
    assert_eq!(run.rc(units[0]), 0, "{}", run.log(units[0]));
    assert!(
        run.calls.is_empty(),
        "the host agent was called:\n{}",
        run.summary()
    );
}
