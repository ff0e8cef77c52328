//! The foreign kinds the operator reads or writes without Rust types of
//! its own: HyperShift, DPF, MetalLB and Multus objects.

use kube::core::{ApiResource, GroupVersionKind};

/// A kind by group, version, kind and plural.
pub fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

pub fn nad_resource() -> ApiResource {
    resource(
        "k8s.cni.cncf.io",
        "v1",
        "NetworkAttachmentDefinition",
        "network-attachment-definitions",
    )
}

pub fn hosted_cluster_resource() -> ApiResource {
    resource(
        "hypershift.openshift.io",
        "v1beta1",
        "HostedCluster",
        "hostedclusters",
    )
}

pub fn node_pool_resource() -> ApiResource {
    resource(
        "hypershift.openshift.io",
        "v1beta1",
        "NodePool",
        "nodepools",
    )
}

/// Cluster API Machines: HyperShift's NodePools make them in the hosted
/// cluster's control-plane namespace, with the addresses their workers got.
pub fn machine_resource() -> ApiResource {
    resource("cluster.x-k8s.io", "v1beta1", "Machine", "machines")
}

pub fn dpu_deployment_resource() -> ApiResource {
    resource(
        "svc.dpu.nvidia.com",
        "v1alpha1",
        "DPUDeployment",
        "dpudeployments",
    )
}

pub fn dpu_flavor_resource() -> ApiResource {
    resource(
        "provisioning.dpu.nvidia.com",
        "v1alpha1",
        "DPUFlavor",
        "dpuflavors",
    )
}

pub fn dpf_operator_config_resource() -> ApiResource {
    resource(
        "operator.dpu.nvidia.com",
        "v1alpha1",
        "DPFOperatorConfig",
        "dpfoperatorconfigs",
    )
}

pub fn dpu_cluster_resource() -> ApiResource {
    resource(
        "provisioning.dpu.nvidia.com",
        "v1alpha1",
        "DPUCluster",
        "dpuclusters",
    )
}

pub fn ip_address_pool_resource() -> ApiResource {
    resource("metallb.io", "v1beta1", "IPAddressPool", "ipaddresspools")
}

pub fn l2_advertisement_resource() -> ApiResource {
    resource(
        "metallb.io",
        "v1beta1",
        "L2Advertisement",
        "l2advertisements",
    )
}

pub fn dpu_service_template_resource() -> ApiResource {
    resource(
        "svc.dpu.nvidia.com",
        "v1alpha1",
        "DPUServiceTemplate",
        "dpuservicetemplates",
    )
}

/// OpenShift's ClusterVersion (cluster-scoped; the one object is `version`).
pub fn cluster_version_resource() -> ApiResource {
    resource(
        "config.openshift.io",
        "v1",
        "ClusterVersion",
        "clusterversions",
    )
}
