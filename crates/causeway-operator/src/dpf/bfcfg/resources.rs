//! The files and units DPF's BlueField boot flow needs on a DPU, as
//! embedded text. T = the installed system (target), C = both the installed
//! and the live system (common), L = the live system only.

/// One file: where it goes, its mode and its text.
#[derive(Debug, Clone, Copy)]
pub(super) struct File {
    pub path: &'static str,
    pub mode: u32,
    pub body: &'static str,
}

/// One systemd unit, enabled wherever it is added.
#[derive(Debug, Clone, Copy)]
pub(super) struct Unit {
    pub name: &'static str,
    pub body: &'static str,
}

pub(super) const NM: &str = "/etc/NetworkManager/system-connections";
pub(super) const PF0VF0: &str = "/etc/NetworkManager/system-connections/pf0vf0.nmconnection";
pub(super) const OVS_SCRIPT: &str = "/usr/local/bin/dpf-ovs-script.sh";
pub(super) const FLAVOR_YAML: &str = "/etc/dpf/dpuflavor.yaml";
pub(super) const FLAVOR_JSON: &str = "/etc/dpf/dpuflavor.json";
pub(super) const TARGET_IGN: &str = "/var/target.ign";
/// Zero-trust: the kubeconfig dpu-agent joins with, filled by DPF.
pub(super) const BOOTSTRAP_KUBECONFIG: &str = "/var/lib/dpf/dpuagent/bootstrap-kubeconfig";
/// The Go template DPF fills with the bootstrap kubeconfig, base64.
pub(super) const BOOTSTRAP_KUBECONFIG_PLACEHOLDER: &str = "{{ .BootstrapKubeconfig | b64enc }}";
/// Zero-trust: where install-dpu-agent finds the BFB registry.
pub(super) const BFB_REGISTRY_FILE: &str = "/etc/dpf/bfb-registry";
/// Zero-trust: dpu-agent's flags beyond the trusted ones.
pub(super) const ZERO_TRUST_AGENT_FLAGS: &str =
    "--zero-trust-mode --bootstrap-kubeconfig=/var/lib/dpf/dpuagent/bootstrap-kubeconfig";
/// What a zero-trust DPU goes without: the host agent's package
/// repository, the link-state and OS-image reports (the host is not
/// trusted with them).
pub(super) const NOT_IN_ZERO_TRUST: &[&str] = &[
    "/etc/yum.repos.d/agentrepo.repo",
    "/usr/local/bin/pf-monitor.sh",
    "/usr/local/bin/report-machineosurl.py",
    "pf-monitor.service",
    "report-machineosurl.service",
];

macro_rules! resource {
    ($path:expr, $mode:expr, $res:literal) => {
        File {
            path: $path,
            mode: $mode,
            body: include_str!(concat!("resources/", $res)),
        }
    };
}

macro_rules! unit {
    ($dir:literal, $name:literal) => {
        Unit {
            name: $name,
            body: include_str!(concat!("resources/", $dir, "/", $name)),
        }
    };
}

/// T files, in the order they are added. pf0vf0 is not here: it is added
/// as editable text (see [`PF0VF0_BODY`]).
pub(super) const TARGET_FILES: &[File] = &[
    resource!("/etc/mellanox/mlnx-bf.conf", 0o644, "target/mlnx-bf.conf"),
    resource!("/etc/mellanox/mlnx-ovs.conf", 0o644, "target/mlnx-ovs.conf"),
    resource!(
        "/etc/NetworkManager/system-connections/br-comm-ch.nmconnection",
        0o600,
        "target/br-comm-ch.nmconnection"
    ),
    resource!(
        "/etc/crio/crio.conf.d/99-ulimits.conf",
        0o644,
        "target/99-ulimits.conf"
    ),
    resource!("/etc/sysctl.d/98-dpunet.conf", 0o644, "target/98-dpunet.conf"),
    resource!(
        "/etc/systemd/system/chrony-wait.service.d/override.conf",
        0o644,
        "target/chrony-wait-override.conf"
    ),
    resource!(
        "/etc/systemd/system/NetworkManager-wait-online.service.d/override.conf",
        0o644,
        "target/nm-wait-online-override.conf"
    ),
    resource!("/etc/yum.repos.d/agentrepo.repo", 0o644, "target/agentrepo.repo"),
    resource!(
        "/etc/systemd/system/machine-config-daemon-firstboot.service.d/10-mcd-firstboot-dpuagent.conf",
        0o644,
        "target/10-mcd-firstboot-dpuagent.conf"
    ),
    resource!(
        "/etc/systemd/system/machine-config-daemon-pull.service.d/10-require-setup-vfs.conf",
        0o644,
        "target/10-require-setup-vfs.conf"
    ),
    resource!(
        "/usr/local/bin/install-dpu-agent.sh",
        0o755,
        "target/install-dpu-agent.sh"
    ),
    resource!(
        "/usr/local/bin/dpu-fw-upgrade.sh",
        0o755,
        "target/dpu-fw-upgrade.sh"
    ),
    resource!("/usr/local/bin/wait-for-sfs.sh", 0o755, "target/wait-for-sfs.sh"),
    resource!(
        "/usr/local/bin/tmfifo-agent-link.sh",
        0o755,
        "target/tmfifo-agent-link.sh"
    ),
    resource!(
        "/usr/local/bin/report-machineosurl.py",
        0o755,
        "target/report-machineosurl.py"
    ),
    resource!("/usr/local/bin/pf-monitor.sh", 0o755, "target/pf-monitor.sh"),
    resource!(
        "/etc/modules-load.d/br_netfilter.conf",
        0o644,
        "target/br_netfilter.conf"
    ),
    resource!("/etc/sysconfig/openvswitch", 0o600, "target/openvswitch"),
    resource!(
        "/etc/tmpfiles.d/99-hugetlbfs-dpf.conf",
        0o644,
        "target/99-hugetlbfs-dpf.conf"
    ),
    resource!(
        "/etc/openshift/kubelet.conf.d/kubelet-dpf-override.conf",
        0o644,
        "target/kubelet-dpf-override.conf"
    ),
];

/// pf0vf0's profile: the MTU step inserts a line after `[ethernet]`.
pub(super) const PF0VF0_BODY: &str = include_str!("resources/target/pf0vf0.nmconnection");
/// Where pf0vf0 goes among the T files: after mlnx-ovs.conf.
pub(super) const PF0VF0_AT: usize = 2;

/// T units; the build sorts them by name.
pub(super) const TARGET_UNITS: &[Unit] = &[
    unit!("target", "tmfifo-agent-link.service"),
    unit!("target", "setup-vfs-devlink.service"),
    unit!("target", "install-dpu-agent.service"),
    unit!("target", "bfupsignal.service"),
    unit!("target", "dpu-fw-upgrade.service"),
    unit!("target", "dpu-sf-gate.service"),
    unit!("target", "dpf-ovs.service"),
    unit!("target", "pf-monitor.service"),
    unit!("target", "report-machineosurl.service"),
];

/// The agent, added after the sorted T units; zero-trust appends
/// [`ZERO_TRUST_AGENT_FLAGS`].
pub(super) const DPU_AGENT: Unit = unit!("target", "dpu-agent.service");

pub(super) const COMMON_FILES: &[File] = &[
    resource!(
        "/etc/systemd/network/10-tmfifo_net.link",
        0o644,
        "common/10-tmfifo_net.link"
    ),
    resource!(
        "/etc/systemd/network/10-oob_net.link",
        0o644,
        "common/10-oob_net.link"
    ),
    resource!(
        "/etc/NetworkManager/system-connections/tmfifo_net0.nmconnection",
        0o600,
        "common/tmfifo_net0.nmconnection"
    ),
    resource!(
        "/etc/NetworkManager/system-connections/oob_net0.nmconnection",
        0o600,
        "common/oob_net0.nmconnection"
    ),
    resource!(
        "/usr/local/bin/dpuagent-client.py",
        0o755,
        "common/dpuagent-client.py"
    ),
    resource!("/usr/local/bin/bflog.sh", 0o755, "common/bflog.sh"),
    resource!(
        "/usr/local/bin/bfupsignal.sh",
        0o755,
        "common/bfupsignal.sh"
    ),
    resource!(
        "/usr/local/bin/setup-vfs-devlink.sh",
        0o755,
        "common/setup-vfs-devlink.sh"
    ),
];

/// Zero-trust: the OOB port by DHCPv4, the DPU's way to the cluster.
pub(super) const OOB_NET0_ZT: File = resource!(
    "/etc/NetworkManager/system-connections/oob_net0.nmconnection",
    0o600,
    "common/oob_net0_zt.nmconnection"
);

pub(super) const DEVLINK_ACTIVATE: Unit = unit!("common", "devlink-activate.service");

pub(super) const LIVE_SCRIPTS: &[File] = &[
    resource!(
        "/usr/local/bin/install-rhcos-dpf.sh",
        0o755,
        "live/install-rhcos-dpf.sh"
    ),
    resource!(
        "/usr/local/bin/update_ignition.py",
        0o755,
        "live/update_ignition.py"
    ),
];

pub(super) const INSTALL_RHCOS: Unit = unit!("live", "install-rhcos-dpf.service");
