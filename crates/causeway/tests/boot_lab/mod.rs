//! The DPU boot lab's harness, shared by the lab's own suite and by the
//! DPF bridge's on the real API server: a boot template as DPF hands it to
//! a DPU, unpacked as Ignition would write it, its units run as systemd
//! would run them (EnvironmentFile= then ExecStart) by tests/dpf/boot-lab.sh
//! against a stand-in for DPF's host agent (`tests/dpf/host-agent.py`,
//! written from the host agent's protocol and refusing what it would not
//! accept).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use causeway_operator::dpf::bfcfg;
use serde_json::{json, Value};

pub const DPU_NAME: &str = "dpu-0";
pub const DPU_NAMESPACE: &str = "dpf-operator-system";
pub const DPU_UID: &str = "3f1c9a2e-5b7d-4e8f-9a10-b2c3d4e5f607";

pub const BOOTSTRAP_KUBECONFIG: &str =
    "apiVersion: v1\nkind: Config\n# the lab's bootstrap kubeconfig\n";

pub fn base64_of(bytes: &[u8]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A boot template as DPF hands it to one DPU: its placeholders filled
/// with the lab DPU's identity (and, zero-trust, the bootstrap
/// kubeconfig), none left over.
pub fn as_dpf_fills_it(template: &str) -> Value {
    let text = template
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

/// What a template's boot must show beyond the protocol itself.
pub struct Expected<'a> {
    /// The OS image the installed system reports (MachineOSURL).
    pub os_image: &'a str,
    /// Kernel arguments the installer must pass (the flavor's grub ones).
    pub kernel_arguments: &'a [&'a str],
}

/// Writes what `ignition` makes into `root`: files at their paths, units
/// under /etc/systemd/system.
pub fn unpack_into(ignition: &Value, root: &Path) {
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
pub struct Run {
    pub out: PathBuf,
    pub calls: Vec<Value>,
}

impl Run {
    pub fn rc(&self, unit: &str) -> i32 {
        fs::read_to_string(self.out.join(format!("{unit}.rc")))
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or(-1)
    }
    pub fn log(&self, unit: &str) -> String {
        fs::read_to_string(self.out.join(format!("{unit}.log"))).unwrap_or_default()
    }
    pub fn stubs(&self) -> String {
        fs::read_to_string(self.out.join("stubs.log")).unwrap_or_default()
    }
    /// Every call, one line each, for failure messages.
    pub fn summary(&self) -> String {
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
    pub fn refused(&self) -> Vec<&Value> {
        self.calls
            .iter()
            .filter(|c| c["status"].as_u64().unwrap_or(0) >= 400 && c["path"] != "/")
            .collect()
    }
    /// The accepted update-status bodies' agentStatus objects, in order.
    pub fn agent_statuses(&self) -> Vec<&Value> {
        self.calls
            .iter()
            .filter(|c| c["path"] == "/update-status" && c["status"] == 200)
            .map(|c| &c["body"]["agentStatus"])
            .collect()
    }
    pub fn conditions_of_type(&self, type_: &str) -> Vec<&Value> {
        self.agent_statuses()
            .into_iter()
            .flat_map(|a| a["conditions"].as_array().into_iter().flatten())
            .filter(|c| c["type"] == type_)
            .collect()
    }
}

/// Runs `units` of `root` in the lab, each for at most `bound` seconds;
/// `env` sets the stubs' answers.
pub fn lab(root: &Path, out: &Path, units: &[&str], env: &[(&str, &str)], bound: u32) -> Run {
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

pub fn ready(test: &str) -> bool {
    if !crate::support::root_or_skip_for(test, "network namespaces, chroot and mounts") {
        return false;
    }
    crate::support::tool("python3", "python3");
    crate::support::tool("curl", "curl");
    crate::support::tool("ping", "iputils-ping");
    crate::support::tool("jq", "jq");
    true
}

pub const INSTALL: &str = "install-rhcos-dpf.service";

/// The live installer, then the installed system's host-agent units, the
/// way a DPU boots: every call is one the host agent accepts, in the
/// order DPF expects them.
pub fn installs_reports_and_joins(template: &Value, expected: &Expected) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    unpack_into(template, &live);
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
            && stubs.contains("--ignition-file /var/target.ign"),
        "{stubs}"
    );
    for argument in expected.kernel_arguments {
        assert!(stubs.contains(argument), "{argument}: {stubs}");
    }
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
    assert_eq!(url[0]["message"], expected.os_image, "{calls}");
    // dpu-agent from the host agent's repository, unpacked and installed.
    let stubs = run.stubs();
    assert!(
        stubs.contains("dnf download dpu-agent --disablerepo=* --enablerepo=agentrepo"),
        "{stubs}"
    );
}

/// A zero-trust DPU does not trust the host: it installs and reboots
/// without a single call to the host agent, and the installed system
/// joins with DPF's bootstrap kubeconfig and fetches dpu-agent from the
/// BFB registry.
pub fn installs_without_a_word_to_the_host(template: &Value, bfb_registry: &str) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    unpack_into(template, &live);
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
        format!("BFBRegistryURL={bfb_registry}\n")
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
