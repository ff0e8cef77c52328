//! The DPU boot lab: the boot template the operator generates, unpacked as
//! a DPU's Ignition would write it, its units run as systemd would run
//! them (EnvironmentFile= then ExecStart) against a stand-in for DPF's host
//! agent on the rshim link (`tests/dpf/host-agent.py`, written from the
//! host agent's protocol and refusing what it would not accept).
//!
//! The template comes from `bfcfg::template`, the function the operator
//! runs for the ConfigMap it publishes, with DPF's placeholders filled in
//! as DPF fills them; `dpf_kube` runs the same boot on the ConfigMap the
//! operator published on the real API server (`boot_lab/`, shared). The live installer runs first; what it left in
//! `/var/target.ign` (with the DPU's identity added) is unpacked as the
//! installed system, whose host-agent units then run.
//!
//! Needs root (network namespaces, chroot, mounts): without it each test
//! prints SKIP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::boot_lab;

use std::fs;

use boot_lab::{as_dpf_fills_it, lab, ready, unpack_into, Expected, DPU_NAMESPACE, INSTALL};
use causeway_operator::dpf::bfcfg::{self, Flavor, Inputs};
use serde_json::{json, Value};

const OS_IMAGE: &str = "quay.io/lab/bf:4.19";

/// Zero-trust only: where the DPU downloads dpu-agent; in the lab the
/// stand-in serves the package index there.
const BFB_REGISTRY: &str = "http://[fe80::1%25tmfifo_net0]:11029";

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
    as_dpf_fills_it(&String::from_utf8(bytes).unwrap())
}

/// The live installer, then the installed system's host-agent units, the
/// way a DPU boots: every call is one the host agent accepts, in the
/// order DPF expects them.
#[test]
fn a_dpu_installs_reports_and_joins_through_the_host_agent() {
    if !ready("a_dpu_installs_reports_and_joins_through_the_host_agent") {
        return;
    }
    boot_lab::installs_reports_and_joins(
        &template_for_the_dpu("dpu"),
        &Expected {
            os_image: OS_IMAGE,
            kernel_arguments: &["hugepages=3072"],
        },
    );
}

/// The installed system's pf-monitor tells the host agent each physical
/// port's link state (the ports devlink lists as physical), once, and
/// again only when it changes.
#[test]
fn the_physical_ports_link_state_reaches_the_host_once_per_change() {
    if !ready("the_physical_ports_link_state_reaches_the_host_once_per_change") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = installed_system(dir.path());
    let units = ["tmfifo-agent-link.service", "pf-monitor.service"];
    // pf-monitor polls for good (its sleeps shortened): it runs to its
    // bound, many passes over ports that do not change. Ten seconds: a CI
    // run with a build beside it saw one pass in four (each pass runs
    // stubs that are processes of their own).
    let run = lab(
        &target,
        &dir.path().join("out"),
        &units,
        &[("LAB_PORTS", "p0=up p1=down")],
        10,
    );
    let calls = run.summary();
    assert_eq!(run.rc(units[0]), 0, "{}", run.log(units[0]));
    assert_eq!(run.rc(units[1]), 124, "{}", run.log(units[1]));
    assert!(run.refused().is_empty(), "the host agent refused:\n{calls}");
    assert!(
        run.stubs().matches("devlink port show").count() > 2,
        "pf-monitor made fewer than three passes:\n{}",
        run.stubs()
    );
    let p0 = run.conditions_of_type("PF0LinkDown");
    assert_eq!(p0.len(), 1, "PF0 reported {} times:\n{calls}", p0.len());
    assert_eq!(p0[0]["status"], "False");
    assert_eq!(p0[0]["reason"], "PF0LinkUp");
    assert!(
        p0[0]["message"].as_str().unwrap().contains("p0"),
        "{}",
        p0[0]
    );
    let p1 = run.conditions_of_type("PF1LinkDown");
    assert_eq!(p1.len(), 1, "PF1 reported {} times:\n{calls}", p1.len());
    assert_eq!(p1[0]["status"], "True");
    assert_eq!(p1[0]["reason"], "PF1LinkDown");
    assert!(
        p1[0]["message"].as_str().unwrap().contains("p1"),
        "{}",
        p1[0]
    );
}

/// The installed system unpacked from a trusted template, the live
/// installer having run first.
fn installed_system(dir: &std::path::Path) -> std::path::PathBuf {
    let live = dir.join("live");
    unpack_into(&template_for_the_dpu("dpu"), &live);
    let installed = lab(&live, &dir.join("out-live"), &[INSTALL], &[], 40);
    assert_eq!(installed.rc(INSTALL), 0, "{}", installed.log(INSTALL));
    let target_ign: Value =
        serde_json::from_slice(&fs::read(live.join("var/target.ign")).unwrap()).unwrap();
    let target = dir.join("target");
    unpack_into(&target_ign, &target);
    target
}

const SETUP_VFS: &str = "setup-vfs-devlink.service";

/// The DPU asks the host for its VFs (configure-host-vfs, with its
/// identity) until their representor shows here, then goes on.
#[test]
fn the_host_makes_its_vfs_when_the_dpu_asks() {
    if !ready("the_host_makes_its_vfs_when_the_dpu_asks") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = installed_system(dir.path());
    let units = ["tmfifo-agent-link.service", SETUP_VFS];
    let run = lab(&target, &dir.path().join("out"), &units, &[], 20);
    let calls = run.summary();
    assert_eq!(run.rc(SETUP_VFS), 0, "{}\n{calls}", run.log(SETUP_VFS));
    assert!(run.refused().is_empty(), "the host agent refused:\n{calls}");
    let asked: Vec<&Value> = run
        .calls
        .iter()
        .filter(|c| c["path"] == "/configure-host-vfs")
        .collect();
    assert_eq!(asked.len(), 1, "{calls}");
    assert_eq!(asked[0]["method"], "POST");
    assert_eq!(asked[0]["body"]["dpuName"], boot_lab::DPU_NAME);
    assert_eq!(asked[0]["body"]["dpuUID"], boot_lab::DPU_UID);
    assert!(!calls.contains("/rebind-host-driver"), "{calls}");
}

/// A host that makes no VFs is asked again every pass, and after three
/// passes without one to reload its driver, once (the next only after
/// eight minutes).
#[test]
fn a_host_that_makes_no_vfs_is_asked_to_reload_its_driver_once() {
    if !ready("a_host_that_makes_no_vfs_is_asked_to_reload_its_driver_once") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = installed_system(dir.path());
    let units = ["tmfifo-agent-link.service", SETUP_VFS];
    let run = lab(
        &target,
        &dir.path().join("out"),
        &units,
        &[("LAB_HOST_VFS", "never")],
        // Long enough for passes past the reload on a loaded machine (a
        // CI run gave five in 4 s beside the flood suites, and five in
        // 8 s beside a build).
        12,
    );
    let calls = run.summary();
    assert_eq!(run.rc(SETUP_VFS), 124, "{}\n{calls}", run.log(SETUP_VFS));
    assert!(run.refused().is_empty(), "the host agent refused:\n{calls}");
    let paths: Vec<&str> = run
        .calls
        .iter()
        .filter_map(|c| c["path"].as_str())
        .filter(|p| *p == "/configure-host-vfs" || *p == "/rebind-host-driver")
        .collect();
    let rebinds: Vec<usize> = paths
        .iter()
        .enumerate()
        .filter(|(_, p)| **p == "/rebind-host-driver")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(rebinds, vec![3], "{calls}");
    assert!(paths.len() > 5, "too few passes:\n{calls}");
}

/// The firmware is brought to what the installed DOCA runtime ships (the
/// NIC's image for its PSID, then the BMC over its VLAN with a one-time
/// IPMI user), each step reported to the host agent, and only once per
/// DOCA version.
#[test]
fn the_firmware_follows_the_doca_runtime_once_per_version() {
    if !ready("the_firmware_follows_the_doca_runtime_once_per_version") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let target = installed_system(dir.path());
    let units = ["tmfifo-agent-link.service", "dpu-fw-upgrade.service"];
    let doca = [("LAB_DOCA", "2.9.1-17")];
    let run = lab(&target, &dir.path().join("out"), &units, &doca, 20);
    let calls = run.summary();
    assert_eq!(run.rc(units[1]), 0, "{}\n{calls}", run.log(units[1]));
    assert!(run.refused().is_empty(), "the host agent refused:\n{calls}");
    let states = |type_: &str| -> Vec<(String, String)> {
        run.conditions_of_type(type_)
            .iter()
            .map(|c| {
                (
                    c["status"].as_str().unwrap().to_string(),
                    c["reason"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let expected = vec![
        ("False".to_string(), "Upgrading".to_string()),
        ("True".to_string(), "Upgraded".to_string()),
    ];
    assert_eq!(states("NICFirmwareUpgraded"), expected, "{calls}");
    assert_eq!(states("BMCFirmwareUpgraded"), expected, "{calls}");
    let stubs = run.stubs();
    let order = [
        "bfb-atf-uefi-update",
        "mstflint -y -d 0000:03:00.0 -i /opt/mellanox/mlnx-fw-updater/firmware/fw-ConnectX7-rel-MT_0000000884.bin burn",
        "ip link add link oob_net0 name vlan4040 type vlan id 4040",
        "ipmitool user set name 8 dpfupgrade",
        "bfb-bmc-update --user dpfupgrade --password ",
    ];
    let mut from = 0;
    for step in order {
        let at = stubs[from..]
            .find(step)
            .unwrap_or_else(|| panic!("{step:?} not after the step before it:\n{stubs}"));
        from += at + step.len();
    }
    // The IPMI user is cleared and the VLAN removed last.
    let last: Vec<&str> = stubs.lines().rev().take(2).map(str::trim).collect();
    assert_eq!(
        last,
        ["ip link del vlan4040", "ipmitool user set name 8"],
        "{stubs}"
    );
    assert_eq!(
        fs::read_to_string(target.join("var/dpf/fw-installed-version")).unwrap(),
        "2.9.1-17\n"
    );

    // Booted again at the same version: nothing is flashed or reported.
    let again = lab(&target, &dir.path().join("out-again"), &units, &doca, 20);
    assert_eq!(again.rc(units[1]), 0, "{}", again.log(units[1]));
    assert!(
        !again.stubs().contains("burn") && !again.stubs().contains("bfb-bmc-update"),
        "{}",
        again.stubs()
    );
    assert!(
        again.conditions_of_type("NICFirmwareUpgraded").is_empty(),
        "{}",
        again.summary()
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
    if !ready("a_zero_trust_dpu_installs_without_a_word_to_the_host") {
        return;
    }
    boot_lab::installs_without_a_word_to_the_host(
        &template_for_the_dpu("zero-trust"),
        BFB_REGISTRY,
    );
}
