#![allow(clippy::unwrap_used)]

use super::*;
use crate::dpf::ignition::{self, ENCAPSULATED};
use encode::file_bytes;

const OS_IMAGE: &str = "quay.io/example/rhcos-bfb:4.22.0";
const NM_DIR: &str = "/etc/NetworkManager/system-connections";

/// HyperShift's ignition for the hosted cluster's workers: a user, the
/// kubeconfig, the MachineConfig, and a file with a `+` in a text URL.
fn hcp_ignition(version: &str) -> Vec<u8> {
    let mc = json!({
        "apiVersion": "machineconfiguration.openshift.io/v1", "kind": "MachineConfig",
        "metadata": {"name": "rendered-worker"},
        "spec": {"osImageURL": "quay.io/openshift-release-dev/ocp-v4.0-art-dev@sha256:aaaa", "config": {"ignition": {"version": "3.2.0"}}},
    });
    serde_json::to_vec(&json!({
        "ignition": {"version": version},
        "passwd": {"users": [{"name": "core", "sshAuthorizedKeys": ["ssh-ed25519 AAAA core"]}]},
        "storage": {"files": [
            {"path": "/etc/kubernetes/kubeconfig", "contents": {"source": "data:,apiVersion%3A%20v1"}, "mode": 384},
            {"path": "/etc/plus", "contents": {"source": "data:,a+b"}, "mode": 420},
            {"path": ENCAPSULATED, "contents": {"source": encode::text_url(&mc.to_string())}, "mode": 420},
        ]},
        "systemd": {"units": [{"name": "kubelet.service", "enabled": true}]},
    }))
    .unwrap()
}

/// A flavor overriding mlnx-bf.conf and the OVS script, appending to a new
/// and an existing file, with kernel and nvconfig parameters.
fn flavor_with_files() -> Value {
    json!({
        "apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPUFlavor",
        "metadata": {"name": "hbn-ovn", "namespace": "dpf-operator-system", "uid": "u-1", "resourceVersion": "7", "labels": {"a": "b"}},
        "spec": {
            "dpuMode": "dpu",
            "grub": {"kernelParameters": ["hugepages=3072"]},
            "nvconfig": [{"device": "*", "parameters": ["PF_TOTAL_SF=20", "NUM_OF_VFS=46"]}],
            "ovs": {"rawConfigScript": "ovs-vsctl set Open_vSwitch . other_config:doca-init=true\n"},
            "configFiles": [
                {"path": "/etc/mellanox/mlnx-bf.conf", "operation": "override", "raw": "ALLOW_SHARED_RQ=\"no\"\n", "permissions": "0644"},
                {"path": "/etc/sysctl.d/98-dpunet.conf", "operation": "append", "raw": "vm.max_map_count = 262144\n", "permissions": "0600"},
                {"path": "/etc/dpf/extra.conf", "operation": "append", "raw": "extra\n"},
                {"path": "", "operation": "override", "raw": "skipped"},
            ],
        },
    })
}

fn flavor_plain() -> Value {
    json!({
        "apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPUFlavor",
        "metadata": {"name": "plain", "namespace": "dpf-operator-system"},
        "spec": {"dpuMode": "dpu"},
    })
}

fn build(flavor: &Value, mtu: Option<u32>) -> (Value, Value) {
    let hcp = hcp_ignition("3.2.0");
    let flavor = Flavor::from_object(flavor).unwrap();
    let inputs = Inputs {
        hcp_ignition: &hcp,
        flavor: &flavor,
        high_speed_mtu: mtu,
        os_image: OS_IMAGE,
        bfb_registry: None,
    };
    let bytes = template(&inputs).unwrap();
    assert_eq!(bytes.last(), Some(&b'\n'));
    let live: Value = serde_json::from_slice(&bytes).unwrap();
    (target(&inputs).unwrap(), live)
}

fn files(ign: &Value) -> &Vec<Value> {
    ign["storage"]["files"].as_array().unwrap()
}

fn find<'a>(ign: &'a Value, path: &str) -> &'a Value {
    files(ign)
        .iter()
        .find(|f| f["path"] == path)
        .unwrap_or_else(|| panic!("no file {path}"))
}

fn text(ign: &Value, path: &str) -> String {
    String::from_utf8(file_bytes(path, &find(ign, path)["contents"]).unwrap()).unwrap()
}

fn unit<'a>(ign: &'a Value, name: &str) -> &'a Value {
    ign["systemd"]["units"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == name)
        .unwrap_or_else(|| panic!("no unit {name}"))
}

fn unit_names(ign: &Value) -> Vec<String> {
    ign["systemd"]["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap().to_string())
        .collect()
}

/// The T and C files in the order they are added, after HyperShift's.
const ADDED: &[(&str, u32)] = &[
    ("/etc/mellanox/mlnx-bf.conf", 0o644),
    ("/etc/mellanox/mlnx-ovs.conf", 0o644),
    ("/etc/NetworkManager/system-connections/pf0vf0.nmconnection", 0o600),
    ("/etc/NetworkManager/system-connections/br-comm-ch.nmconnection", 0o600),
    ("/etc/crio/crio.conf.d/99-ulimits.conf", 0o644),
    ("/etc/sysctl.d/98-dpunet.conf", 0o644),
    ("/etc/systemd/system/chrony-wait.service.d/override.conf", 0o644),
    ("/etc/systemd/system/NetworkManager-wait-online.service.d/override.conf", 0o644),
    ("/etc/yum.repos.d/agentrepo.repo", 0o644),
    ("/etc/systemd/system/machine-config-daemon-firstboot.service.d/10-mcd-firstboot-dpuagent.conf", 0o644),
    ("/etc/systemd/system/machine-config-daemon-pull.service.d/10-require-setup-vfs.conf", 0o644),
    ("/usr/local/bin/install-dpu-agent.sh", 0o755),
    ("/usr/local/bin/dpu-fw-upgrade.sh", 0o755),
    ("/usr/local/bin/wait-for-sfs.sh", 0o755),
    ("/usr/local/bin/tmfifo-agent-link.sh", 0o755),
    ("/usr/local/bin/report-machineosurl.py", 0o755),
    ("/usr/local/bin/pf-monitor.sh", 0o755),
    ("/etc/modules-load.d/br_netfilter.conf", 0o644),
    ("/etc/sysconfig/openvswitch", 0o600),
    ("/etc/tmpfiles.d/99-hugetlbfs-dpf.conf", 0o644),
    ("/etc/openshift/kubelet.conf.d/kubelet-dpf-override.conf", 0o644),
    ("/etc/systemd/network/10-tmfifo_net.link", 0o644),
    ("/etc/systemd/network/10-oob_net.link", 0o644),
    ("/etc/NetworkManager/system-connections/tmfifo_net0.nmconnection", 0o600),
    ("/etc/NetworkManager/system-connections/oob_net0.nmconnection", 0o600),
    ("/usr/local/bin/dpuagent-client.py", 0o755),
    ("/usr/local/bin/bflog.sh", 0o755),
    ("/usr/local/bin/bfupsignal.sh", 0o755),
    ("/usr/local/bin/setup-vfs-devlink.sh", 0o755),
    ("/usr/local/bin/dpf-ovs-script.sh", 0o755),
];

const TARGET_UNITS: &[&str] = &[
    "kubelet.service",
    "bfupsignal.service",
    "dpf-ovs.service",
    "dpu-fw-upgrade.service",
    "dpu-sf-gate.service",
    "install-dpu-agent.service",
    "pf-monitor.service",
    "report-machineosurl.service",
    "setup-vfs-devlink.service",
    "tmfifo-agent-link.service",
    "dpu-agent.service",
    "devlink-activate.service",
];

#[test]
fn the_target_holds_every_file_and_unit_in_build_order() {
    let (target, _) = build(&flavor_with_files(), Some(9000));
    let paths: Vec<(&str, u64)> = files(&target)
        .iter()
        .map(|f| (f["path"].as_str().unwrap(), f["mode"].as_u64().unwrap()))
        .collect();
    let mut want: Vec<(&str, u64)> = vec![
        ("/etc/kubernetes/kubeconfig", 384),
        ("/etc/plus", 420),
        (ENCAPSULATED, 420),
    ];
    want.extend(ADDED.iter().map(|(p, m)| (*p, u64::from(*m))));
    // The appended sysctl file took the flavor's mode in place.
    let sysctl = want
        .iter()
        .position(|w| w.0 == "/etc/sysctl.d/98-dpunet.conf")
        .unwrap();
    want[sysctl].1 = 0o600;
    want.push(("/etc/dpf/extra.conf", 0o644));
    want.push(("/etc/dpf/dpuflavor.yaml", 0o644));
    for port in ["p0", "p1", "pf0hpf", "pf1hpf"] {
        want.push((
            Box::leak(format!("{NM_DIR}/{port}.nmconnection").into_boxed_str()),
            0o600,
        ));
    }
    assert_eq!(paths, want);
    // Every file we add overwrites; every file ends up gzipped.
    for f in files(&target).iter().skip(3) {
        if f["path"] != "/etc/dpf/extra.conf" {
            assert_eq!(f["overwrite"], true, "{}", f["path"]);
        }
    }
    for f in files(&target) {
        if f.get("contents").is_some() {
            assert_eq!(f["contents"]["compression"], "gzip", "{}", f["path"]);
            assert!(f["contents"]["source"]
                .as_str()
                .unwrap()
                .starts_with("data:;base64,H4sI"));
        }
    }
    assert_eq!(unit_names(&target), TARGET_UNITS);
    for u in target["systemd"]["units"].as_array().unwrap() {
        assert_eq!(u["enabled"], true, "{}", u["name"]);
    }
    // HyperShift's files survive, the OS image is the BlueField one, and
    // the form-decoding quirk turned the `+` of a text URL into a space.
    assert_eq!(
        text(&target, "/etc/kubernetes/kubeconfig"),
        "apiVersion: v1"
    );
    assert_eq!(text(&target, "/etc/plus"), "a b");
    let mc: Value = serde_json::from_str(&text(&target, ENCAPSULATED)).unwrap();
    assert_eq!(mc["spec"]["osImageURL"], OS_IMAGE);
    assert_eq!(target["passwd"]["users"][0]["name"], "core");
    assert_eq!(target["ignition"]["version"], "3.2.0");
}

#[test]
fn the_agent_runs_with_its_flags_and_the_resources_are_the_embedded_ones() {
    let (target, _) = build(&flavor_plain(), None);
    let agent = unit(&target, "dpu-agent.service");
    let body = agent["contents"].as_str().unwrap();
    for flag in [
        "--dpu-name=${DPUName}",
        "--dpu-namespace=${DPUNamespace}",
        "--dpu-uid=${DPUUID}",
        "--dpuflavor=/etc/dpf/dpuflavor.yaml",
        "--skip-containerd-config",
        "--skip-dns-config",
        "--skip-kernel-cmd-line",
        "--skip-network-config",
        "--skip-remove-builtin-kubelet",
        "--skip-configure-kubelet",
        "--skip-start-kubelet",
        "--skip-ovs-raw-script",
        "--kubeadm-secret-name=unused",
    ] {
        assert!(body.contains(flag), "{flag}");
    }
    assert!(body.contains(
        "Before=nodeip-configuration.service kubelet-dependencies.target ovs-configuration.service"
    ));
    assert!(body.contains("Restart=on-failure"));
    let ovs = unit(&target, "dpf-ovs.service");
    assert!(ovs["contents"]
        .as_str()
        .unwrap()
        .contains("Requires=openvswitch.service"));
    for f in resources::TARGET_FILES
        .iter()
        .chain(resources::COMMON_FILES)
    {
        assert_eq!(text(&target, f.path), f.body, "{}", f.path);
    }
    // A URL: the zone's "%" is written %25, as dnf reads it.
    assert!(text(&target, "/etc/yum.repos.d/agentrepo.repo")
        .contains("baseurl=http://[fe80::1%25tmfifo_net0]:11029/rpm/"));
}

#[test]
fn flavor_files_override_and_append_by_path() {
    let (target, _) = build(&flavor_with_files(), None);
    // Override: the flavor's text replaces the embedded mlnx-bf.conf.
    let bf = find(&target, "/etc/mellanox/mlnx-bf.conf");
    assert_eq!(bf["overwrite"], true);
    assert_eq!(
        text(&target, "/etc/mellanox/mlnx-bf.conf"),
        "ALLOW_SHARED_RQ=\"no\"\n"
    );
    assert!(bf.get("append").is_none());
    // Append to an embedded file: its contents stay, the flavor's follow.
    let sysctl = find(&target, "/etc/sysctl.d/98-dpunet.conf");
    assert_eq!(
        text(&target, "/etc/sysctl.d/98-dpunet.conf"),
        include_str!("resources/target/98-dpunet.conf")
    );
    assert_eq!(sysctl["append"].as_array().unwrap().len(), 1);
    assert_eq!(sysctl["append"][0]["compression"], "gzip");
    assert_eq!(
        file_bytes("append", &sysctl["append"][0]).unwrap(),
        b"vm.max_map_count = 262144\n"
    );
    assert_eq!(sysctl["mode"], 0o600);
    // Append to a new path: a file with only the append resource.
    let extra = find(&target, "/etc/dpf/extra.conf");
    assert!(extra.get("contents").is_none());
    assert_eq!(
        file_bytes("append", &extra["append"][0]).unwrap(),
        b"extra\n"
    );
    // The OVS script is the flavor's.
    assert_eq!(
        text(&target, "/usr/local/bin/dpf-ovs-script.sh"),
        "ovs-vsctl set Open_vSwitch . other_config:doca-init=true\n"
    );
    // An empty path is skipped: no file holds "skipped".
    assert!(files(&target).iter().all(|f| f["path"] != ""));
}

#[test]
fn an_empty_ovs_script_is_still_a_file() {
    let (target, _) = build(&flavor_plain(), None);
    assert_eq!(text(&target, "/usr/local/bin/dpf-ovs-script.sh"), "");
    assert_eq!(
        find(&target, "/usr/local/bin/dpf-ovs-script.sh")["mode"],
        0o755
    );
}

#[test]
fn dpuflavor_yaml_is_the_flavor_trimmed() {
    let (target, _) = build(&flavor_with_files(), None);
    let yaml = text(&target, "/etc/dpf/dpuflavor.yaml");
    let doc: Value = serde_saphyr::from_str(&yaml).unwrap();
    let original = flavor_with_files();
    assert_eq!(
        doc,
        json!({
            "apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPUFlavor",
            "metadata": {"name": "hbn-ovn", "namespace": "dpf-operator-system"},
            "spec": original["spec"],
        })
    );
    // wait-for-sfs.sh reads PF_TOTAL_SF from this text.
    assert!(yaml.contains("PF_TOTAL_SF=20"));
}

#[test]
fn the_high_speed_mtu_adds_port_profiles_and_sets_pf0vf0() {
    let (target, _) = build(&flavor_plain(), Some(9000));
    for port in ["p0", "p1", "pf0hpf", "pf1hpf"] {
        let path = format!("{NM_DIR}/{port}.nmconnection");
        assert_eq!(find(&target, &path)["mode"], 0o600);
        let t = text(&target, &path);
        assert!(t.contains(&format!("id={port}\n")), "{t}");
        assert!(t.contains(&format!("interface-name={port}\n")), "{t}");
        assert!(t.contains("type=ethernet\n"), "{t}");
        assert!(t.contains("[ethernet]\nmtu=9000\n"), "{t}");
    }
    let pf0vf0 = text(&target, &format!("{NM_DIR}/pf0vf0.nmconnection"));
    assert_eq!(
        pf0vf0,
        resources::PF0VF0_BODY.replace("[ethernet]\n", "[ethernet]\nmtu=9000\n")
    );
    assert!(pf0vf0.contains("master=br-comm-ch"));
    // 1500, or unset, adds nothing and leaves pf0vf0 as it is.
    for mtu in [None, Some(1500)] {
        let (target, _) = build(&flavor_plain(), mtu);
        assert!(files(&target)
            .iter()
            .all(|f| !f["path"].as_str().unwrap().ends_with("/p0.nmconnection")));
        assert_eq!(
            text(&target, &format!("{NM_DIR}/pf0vf0.nmconnection")),
            resources::PF0VF0_BODY
        );
    }
}

#[test]
fn the_live_ignition_carries_placeholders_and_the_target() {
    let (target, live) = build(&flavor_with_files(), Some(9000));
    assert_eq!(live["ignition"]["version"], "3.4.0");
    assert_eq!(
        live["passwd"]["users"][0]["sshAuthorizedKeys"][0],
        "ssh-ed25519 AAAA core"
    );
    let paths: Vec<&str> = files(&live)
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    let mut want = vec![
        "/etc/temp_bfcfg_strings.env",
        "/etc/hostname",
        "/etc/dpf/environment",
        "/usr/local/bin/install-rhcos-dpf.sh",
        "/usr/local/bin/update_ignition.py",
    ];
    want.extend(resources::COMMON_FILES.iter().map(|f| f.path));
    want.extend(["/etc/dpf/dpuflavor.json", "/var/target.ign"]);
    assert_eq!(paths, want);
    assert_eq!(
        unit_names(&live),
        ["install-rhcos-dpf.service", "devlink-activate.service"]
    );
    let install = &live["systemd"]["units"][0]["contents"];
    assert!(install
        .as_str()
        .unwrap()
        .contains("SuccessAction=reboot-force"));
    assert!(install.as_str().unwrap().contains("TTYPath=/dev/hvc0"));
    // Placeholders as DPF names them, in text DPF can still render.
    assert_eq!(
        find(&live, "/etc/hostname")["contents"]["source"],
        "data:,{{.DPUHostName}}"
    );
    assert_eq!(
        text(&live, "/etc/dpf/environment"),
        "DPUName={{.DPUName}}\nDPUNamespace={{.DPUNamespace}}\nDPUUID={{.DPUUID}}\nDPUMode=trusted\n"
    );
    let raw = serde_json::to_string(&live).unwrap();
    assert!(
        raw.contains("bfb_pre_install")
            && raw.contains("bfb_modify_os")
            && raw.contains("bfb_post_install")
    );
    // The only `{{` in the template are the four placeholders.
    let opens = raw.matches("{{").count();
    let placeholders = [
        "{{.DPUHostName}}",
        "{{.DPUName}}",
        "{{.DPUNamespace}}",
        "{{.DPUUID}}",
    ]
    .iter()
    .map(|p| raw.matches(p).count())
    .sum::<usize>();
    assert_eq!((opens, placeholders), (4, 4));
    // The scripts are gzipped, the identity files are not.
    assert_eq!(
        find(&live, "/usr/local/bin/install-rhcos-dpf.sh")["contents"]["compression"],
        "gzip"
    );
    assert_eq!(
        text(&live, "/usr/local/bin/install-rhcos-dpf.sh"),
        include_str!("resources/live/install-rhcos-dpf.sh")
    );
    assert!(find(&live, "/etc/hostname")["contents"]
        .get("compression")
        .is_none());
    // The flavor, as JSON.
    let flavor: Value = serde_json::from_str(&text(&live, "/etc/dpf/dpuflavor.json")).unwrap();
    assert_eq!(
        flavor["spec"]["grub"]["kernelParameters"][0],
        "hugepages=3072"
    );
    assert!(flavor["metadata"].get("uid").is_none());
    // /var/target.ign: the compact target, gzipped, round-trips.
    let ign = find(&live, "/var/target.ign");
    assert_eq!(
        (ign["mode"].as_u64(), &ign["contents"]["compression"]),
        (Some(0o644), &json!("gzip"))
    );
    let decoded = file_bytes("/var/target.ign", &ign["contents"]).unwrap();
    assert_eq!(decoded, serde_json::to_vec(&target).unwrap());
    let bytes = serde_json::to_vec(&live).unwrap();
    assert_eq!(carried_target(&bytes).unwrap(), target);
    assert_eq!(
        file_contents(&target, "/usr/local/bin/dpf-ovs-script.sh")
            .unwrap()
            .unwrap(),
        b"ovs-vsctl set Open_vSwitch . other_config:doca-init=true\n"
    );
    assert_eq!(file_contents(&target, "/nowhere").unwrap(), None);
}

#[test]
fn the_live_ignition_drops_empty_objects() {
    let hcp = serde_json::to_vec(&{
        let mut v: Value = serde_json::from_slice(&hcp_ignition("3.2.0")).unwrap();
        v["passwd"] = json!({});
        v
    })
    .unwrap();
    let flavor = Flavor::from_object(&flavor_plain()).unwrap();
    let out = template(&Inputs {
        hcp_ignition: &hcp,
        flavor: &flavor,
        high_speed_mtu: None,
        os_image: OS_IMAGE,
        bfb_registry: None,
    })
    .unwrap();
    let live: Value = serde_json::from_slice(&out).unwrap();
    assert!(live.get("passwd").is_none());
    assert!(!String::from_utf8(out).unwrap().contains("{}"));
}

#[test]
fn the_template_is_the_same_for_the_same_inputs() {
    assert_eq!(
        build(&flavor_with_files(), Some(9000)),
        build(&flavor_with_files(), Some(9000))
    );
}

fn try_build(hcp: &[u8], flavor: &Value) -> Result<Vec<u8>, BfcfgError> {
    let flavor = Flavor::from_object(flavor)?;
    template(&Inputs {
        hcp_ignition: hcp,
        flavor: &flavor,
        high_speed_mtu: None,
        os_image: OS_IMAGE,
        bfb_registry: None,
    })
}

/// Zero-trust: the DPU joins with DPF's bootstrap kubeconfig over its
/// OOB network and gets dpu-agent from the BFB registry; nothing that
/// reports to the host agent, or reads its repository, is shipped.
#[test]
fn a_zero_trust_template_joins_without_the_host() {
    let mut f = flavor_plain();
    f["spec"]["dpuMode"] = json!("zero-trust");
    let hcp = hcp_ignition("3.2.0");
    let flavor = Flavor::from_object(&f).unwrap();
    assert_eq!(flavor.mode(), DpuMode::ZeroTrust);
    let mut inputs = Inputs {
        hcp_ignition: &hcp,
        flavor: &flavor,
        high_speed_mtu: None,
        os_image: OS_IMAGE,
        bfb_registry: None,
    };
    let err = template(&inputs).unwrap_err();
    assert!(matches!(err, BfcfgError::NoBfbRegistry(..)), "{err}");
    assert_eq!(err.reason(), "IgnitionGenerationFailed");
    inputs.bfb_registry = Some("http://10.0.0.5:30080");
    let live: Value = serde_json::from_slice(&template(&inputs).unwrap()).unwrap();
    let env = text(&live, "/etc/dpf/environment");
    assert!(env.ends_with("DPUMode=zero-trust\n"), "{env}");
    let bootstrap = find(&live, "/var/lib/dpf/dpuagent/bootstrap-kubeconfig");
    assert_eq!(bootstrap["mode"], 0o600);
    assert_eq!(
        bootstrap["contents"]["source"],
        "data:;base64,{{ .BootstrapKubeconfig | b64enc }}"
    );
    let zt = target(&inputs).unwrap();
    assert_eq!(
        text(&zt, "/etc/dpf/bfb-registry"),
        "BFBRegistryURL=http://10.0.0.5:30080\n"
    );
    let paths: Vec<&str> = files(&zt)
        .iter()
        .filter_map(|f| f["path"].as_str())
        .collect();
    for gone in [
        "/etc/yum.repos.d/agentrepo.repo",
        "/usr/local/bin/pf-monitor.sh",
        "/usr/local/bin/report-machineosurl.py",
    ] {
        assert!(!paths.contains(&gone), "{gone}");
    }
    let units = unit_names(&zt);
    assert!(
        !units
            .iter()
            .any(|u| u == "pf-monitor.service" || u == "report-machineosurl.service"),
        "{units:?}"
    );
    let agent = unit(&zt, "dpu-agent.service")["contents"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        agent.contains("--kubeadm-secret-name=unused \\\n  --zero-trust-mode --bootstrap-kubeconfig=/var/lib/dpf/dpuagent/bootstrap-kubeconfig\n"),
        "{agent}"
    );
    assert!(text(
        &zt,
        "/etc/NetworkManager/system-connections/oob_net0.nmconnection"
    )
    .contains("method=auto"));
    // The same flavor, trusted: none of it.
    let trusted = Flavor::from_object(&flavor_plain()).unwrap();
    let t = target(&Inputs {
        flavor: &trusted,
        bfb_registry: None,
        ..inputs.clone()
    })
    .unwrap();
    assert!(file_contents(&t, "/etc/dpf/bfb-registry")
        .unwrap()
        .is_none());
    assert!(text(
        &t,
        "/etc/NetworkManager/system-connections/oob_net0.nmconnection"
    )
    .contains("method=disabled"));
    assert!(!unit(&t, "dpu-agent.service")["contents"]
        .as_str()
        .unwrap()
        .contains("zero-trust"));
}

/// DPF's rule for the BFB registry's URL: the configured addresses first,
/// else the bfb-registry Service's node port on the first Node's
/// InternalIP.
#[test]
fn the_bfb_registry_url_follows_dpfs_rule() {
    use k8s_openapi::api::core::v1::{
        Node, NodeAddress, NodeStatus, Service, ServicePort, ServiceSpec,
    };
    let config =
        |registry: Value| json!({"spec": {"provisioningController": {"registry": registry}}});
    let service = |ports: Vec<Option<i32>>| Service {
        spec: Some(ServiceSpec {
            ports: Some(
                ports
                    .into_iter()
                    .map(|n| ServicePort {
                        port: 80,
                        node_port: n,
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let node = |addresses: &[(&str, &str)]| Node {
        status: Some(NodeStatus {
            addresses: Some(
                addresses
                    .iter()
                    .map(|(t, a)| NodeAddress {
                        type_: (*t).into(),
                        address: (*a).into(),
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    let nodes = [
        node(&[("Hostname", "m0")]),
        node(&[("ExternalIP", "1.2.3.4"), ("InternalIP", "10.0.0.7")]),
        node(&[("InternalIP", "10.0.0.8")]),
    ];
    let svc = service(vec![None, Some(0), Some(30080)]);
    assert_eq!(
        bfb_registry_url(
            &config(
                json!({"loadBalancerAddress": "http://registry.example:8080/", "address": "http://old:1"})
            ),
            Some(&svc),
            &nodes
        ),
        Ok("http://registry.example:8080".into())
    );
    assert_eq!(
        bfb_registry_url(
            &config(json!({"loadBalancerAddress": "", "address": "http://old:1"})),
            Some(&svc),
            &nodes
        ),
        Ok("http://old:1".into())
    );
    assert_eq!(
        bfb_registry_url(&json!({}), Some(&svc), &nodes),
        Ok("http://10.0.0.7:30080".into())
    );
    let v6 = [node(&[("InternalIP", "fd00::7")])];
    assert_eq!(
        bfb_registry_url(&json!({}), Some(&svc), &v6),
        Ok("http://[fd00::7]:30080".into())
    );
    assert!(bfb_registry_url(&json!({}), None, &nodes).is_err());
    assert!(bfb_registry_url(&json!({}), Some(&service(vec![Some(0)])), &nodes).is_err());
    assert!(bfb_registry_url(&json!({}), Some(&svc), &[node(&[("Hostname", "m0")])]).is_err());
}

#[test]
fn nic_empty_and_unknown_modes_are_refused() {
    for mode in [json!("nic"), json!(""), Value::Null, json!("other")] {
        let mut f = flavor_plain();
        f["spec"]["dpuMode"] = mode.clone();
        let err = try_build(&hcp_ignition("3.2.0"), &f).unwrap_err();
        assert!(
            matches!(err, BfcfgError::UnsupportedDpuMode { .. }),
            "{mode}: {err}"
        );
        assert_eq!(err.reason(), "IgnitionGenerationFailed");
    }
}

#[test]
fn a_missing_machine_config_is_refused() {
    let mut hcp: Value = serde_json::from_slice(&hcp_ignition("3.2.0")).unwrap();
    hcp["storage"]["files"].as_array_mut().unwrap().pop();
    let err = try_build(&serde_json::to_vec(&hcp).unwrap(), &flavor_plain()).unwrap_err();
    assert_eq!(
        err,
        BfcfgError::Ignition(ignition::IgnitionError::NoMachineConfig)
    );
    assert!(matches!(
        try_build(b"not json", &flavor_plain()),
        Err(BfcfgError::Ignition(ignition::IgnitionError::NotJson(_)))
    ));
}

#[test]
fn bad_permissions_and_operations_are_refused() {
    for perm in ["rw-r--r--", "0999", "77777", "-1"] {
        let mut f = flavor_plain();
        f["spec"]["configFiles"] =
            json!([{"path": "/etc/x", "operation": "override", "raw": "x", "permissions": perm}]);
        let err = try_build(&hcp_ignition("3.2.0"), &f).unwrap_err();
        assert_eq!(
            err,
            BfcfgError::BadPermissions {
                flavor: "plain".into(),
                path: "/etc/x".into(),
                value: perm.into()
            }
        );
    }
    let mut f = flavor_plain();
    f["spec"]["configFiles"] = json!([{"path": "/etc/x", "operation": "replace", "raw": "x"}]);
    assert!(matches!(
        try_build(&hcp_ignition("3.2.0"), &f),
        Err(BfcfgError::BadFlavor { .. })
    ));
}

#[test]
fn an_ignition_that_is_not_spec_3_is_refused() {
    let err = try_build(&hcp_ignition("2.2.0"), &flavor_plain()).unwrap_err();
    let BfcfgError::Invalid(problems) = err else {
        panic!("{err}")
    };
    assert_eq!(problems.len(), 1);
    assert!(problems[0].contains("only spec 3.x"));
}

#[test]
fn a_unit_or_path_hypershift_already_has_is_fatal() {
    // HyperShift's own dpf-ovs.service collides with ours.
    let mut hcp: Value = serde_json::from_slice(&hcp_ignition("3.2.0")).unwrap();
    hcp["systemd"]["units"] = json!([{"name": "dpf-ovs.service", "enabled": true}]);
    let err = try_build(&serde_json::to_vec(&hcp).unwrap(), &flavor_plain()).unwrap_err();
    assert!(
        err.to_string().contains("duplicate unit dpf-ovs.service"),
        "{err}"
    );
    // So does one of its files.
    let mut hcp: Value = serde_json::from_slice(&hcp_ignition("3.2.0")).unwrap();
    hcp["storage"]["files"]
        .as_array_mut()
        .unwrap()
        .push(json!({"path": "/usr/local/bin/bflog.sh", "contents": {"source": "data:,x"}}));
    let err = try_build(&serde_json::to_vec(&hcp).unwrap(), &flavor_plain()).unwrap_err();
    assert!(
        err.to_string()
            .contains("duplicate path /usr/local/bin/bflog.sh"),
        "{err}"
    );
}

#[test]
fn a_template_over_dpfs_limit_is_refused() {
    // Random bytes do not compress: a script this size cannot fit.
    let mut noise = vec![0u8; MAX_BF_SIZE];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut noise).unwrap();
    let mut f = flavor_plain();
    f["spec"]["ovs"] = json!({"rawConfigScript": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &noise)});
    let err = try_build(&hcp_ignition("3.2.0"), &f).unwrap_err();
    assert!(
        matches!(err, BfcfgError::TooLarge { size, max: MAX_BF_SIZE } if size > MAX_BF_SIZE),
        "{err}"
    );
    // The usual template is well inside it.
    let (_, live) = build(&flavor_with_files(), Some(9000));
    assert!(serde_json::to_vec(&live).unwrap().len() < MAX_BF_SIZE);
}

#[test]
fn the_content_digest_follows_the_flavor_spec_and_the_mtu() {
    let f = flavor_with_files();
    let d = content_digest(&f, None, None);
    assert_eq!(d.len(), 64);
    assert_eq!(d, content_digest(&f, Some(1500), None));
    assert_ne!(d, content_digest(&f, Some(9000), None));
    let mut edited = f.clone();
    edited["spec"]["ovs"]["rawConfigScript"] = json!("ovs-vsctl show\n");
    assert_ne!(d, content_digest(&edited, None, None));
    // Metadata is not content.
    let mut relabelled = f.clone();
    relabelled["metadata"]["resourceVersion"] = json!("8");
    assert_eq!(d, content_digest(&relabelled, None, None));
}
