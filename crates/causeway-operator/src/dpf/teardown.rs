//! A provisioner's deletion, one step per pass until each is done.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::ResourceExt;
use serde_json::{json, Value};

use super::crd::DPFHCPProvisioner;
use super::render::Owner;
use super::status::{self, Check, Cleanup, HostedClusterFacts, Outcome};
use crate::error::Error;
use crate::k8s::apply::get_present;
use crate::k8s::resources::{
    dpu_cluster_resource, hosted_cluster_resource, ip_address_pool_resource,
    l2_advertisement_resource, node_pool_resource,
};

use super::context::{publish_note, remove_finalizer, Context, FINALIZER, POLL, SHORT_POLL};
use super::events::Note;
use super::execute::write_status;
use super::plan::Extra;
use super::render::{controlled_by, labelled_ours};

/// The deletion, one step per pass until each is done: the kubeconfig
/// copy and the DPUCluster's reference to it; the NodePool, then the
/// HostedCluster, each waited for; the Secret copies; MetalLB.
pub(super) async fn delete(p: &DPFHCPProvisioner, ctx: &Context) -> Result<Action, Error> {
    if !p.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let owner = Owner::of(p)?;
    let ns = owner.namespace.clone();
    let settings = ctx.settings();
    let mut o = Outcome {
        deleting: true,
        wanted_image: p.spec.ocp_release_image.clone(),
        ..Default::default()
    };
    let extra = Extra {
        provisioned_spec: p.status.as_ref().and_then(|s| s.provisioned_spec.clone()),
        ..Default::default()
    };

    // 1. The kubeconfig copy, then the DPUCluster's reference, so another
    // provisioner can inject into it later.
    let deleted = handled(
        ctx,
        p,
        "kubeconfig-injection",
        remove_injection(ctx, p, &owner).await,
    )
    .await?;
    if deleted > 0 {
        publish_note(
            ctx,
            p,
            Note::normal(
                "KubeconfigCleanupSucceeded",
                format!("Deleted {deleted} kubeconfig secret(s)"),
            ),
        )
        .await;
    }

    // 2. The NodePool, then the HostedCluster: HyperShift wants the pools
    // gone first.
    let since = p.metadata.deletion_timestamp.as_ref().map(|t| t.0);
    let waited = since
        .map(|t| {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(t)
                .as_secs()
                .max(0) as u64
        })
        .unwrap_or(0);
    for (resource, kind) in [
        (node_pool_resource(), "NodePool"),
        (hosted_cluster_resource(), "HostedCluster"),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &resource);
        let live = handled(
            ctx,
            p,
            "hostedcluster",
            get_present(&api, &owner.name).await,
        )
        .await?;
        let Some(live) = live else { continue };
        if controlled_by(&live.metadata, &owner.uid) != Some(true) {
            continue;
        }
        if live.metadata.deletion_timestamp.is_none() {
            handled(
                ctx,
                p,
                "hostedcluster",
                ctx.applier.gone_from(&api, kind, &owner.name).await,
            )
            .await?;
        }
        let what = format!("{kind} {ns}/{}", owner.name);
        let timed_out = waited >= u64::from(settings.deletion_timeout_seconds);
        if timed_out {
            tracing::warn!(provisioner = %owner.name, namespace = %ns, "{what} still there after {waited} s");
        }
        o.cleanup = Some(if timed_out {
            Cleanup::Failed {
                what,
                seconds: u64::from(settings.deletion_timeout_seconds),
            }
        } else {
            Cleanup::InProgress { what }
        });
        if kind == "NodePool" {
            o.applied = Some(Check::new(
                status::APPLIED,
                false,
                "NodePoolsExist",
                "the NodePool is deleted before the HostedCluster",
            ));
        }
        o.hosted_cluster =
            (kind == "HostedCluster").then(|| HostedClusterFacts::from_object(&live.data));
        write_status(ctx, p, &o, &extra).await?;
        let left = u64::from(settings.deletion_timeout_seconds).saturating_sub(waited);
        let next = if left > 0 {
            SHORT_POLL.min(Duration::from_secs(left))
        } else {
            POLL
        };
        return Ok(Action::requeue(next));
    }

    // 3. The Secret copies (owned, but not left to the garbage collector,
    // which would only act after the provisioner is gone).
    handled(ctx, p, "hostedcluster", remove_copies(ctx, &owner).await).await?;
    publish_note(
        ctx,
        p,
        Note::normal(
            "HostedClusterCleanupSucceeded",
            "HostedCluster, NodePool, and secrets deleted successfully",
        ),
    )
    .await;

    // 4. MetalLB, only what carries this provisioner's labels.
    handled(
        ctx,
        p,
        "metallb",
        remove_metal_lb(ctx, &owner, &settings.metal_lb_namespace).await,
    )
    .await?;
    publish_note(
        ctx,
        p,
        Note::normal(
            "MetalLBCleanupComplete",
            "MetalLB resources cleaned up successfully",
        ),
    )
    .await;

    o.cleanup = Some(Cleanup::Succeeded);
    o.applied = Some(Check::new(
        status::APPLIED,
        false,
        "Deleted",
        "everything the provisioner made is deleted",
    ));
    write_status(ctx, p, &o, &extra).await?;
    remove_finalizer(ctx, p).await?;
    publish_note(
        ctx,
        p,
        Note::normal("CleanupSucceeded", "All resources cleaned up successfully"),
    )
    .await;
    tracing::info!(provisioner = %owner.name, namespace = %ns, "deleted");
    Ok(Action::await_change())
}

/// Publishes CleanupHandlerFailed for a clean-up step's error, and passes
/// the result on.
async fn handled<T>(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    handler: &str,
    result: Result<T, Error>,
) -> Result<T, Error> {
    if let Err(e) = &result {
        publish_note(
            ctx,
            p,
            Note::warning(
                "CleanupHandlerFailed",
                format!("Cleanup handler '{handler}' failed: {e}"),
            ),
        )
        .await;
    }
    result
}

/// The kubeconfig copy, then the DPUCluster's reference to it; how many
/// copies were deleted.
async fn remove_injection(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    owner: &Owner,
) -> Result<usize, Error> {
    let dpu_ref = &p.spec.dpu_cluster_ref;
    let mut deleted = 0;
    let copies: Api<Secret> = Api::namespaced(ctx.client.clone(), &dpu_ref.namespace);
    if let Some(copy) = copies.get_opt(&owner.admin_kubeconfig_name()).await? {
        if labelled_ours(&copy.metadata, owner)
            && !ctx
                .applier
                .gone_from(&copies, "Secret", &owner.admin_kubeconfig_name())
                .await?
        {
            deleted += 1;
        }
    }
    let dpus: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &dpu_ref.namespace,
        &dpu_cluster_resource(),
    );
    let dpu = get_present(&dpus, &dpu_ref.name).await?;
    if let Some(dpu) = dpu {
        if dpu.data.pointer("/spec/kubeconfig").and_then(Value::as_str)
            == Some(owner.admin_kubeconfig_name().as_str())
        {
            // Removing the field, unlike changing it, passes DPF's
            // set-once rule.
            let patch = json!({"spec": {"kubeconfig": null}});
            ctx.applier
                .patch(
                    &dpus,
                    "DPUCluster",
                    &dpu_ref.name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
    }
    Ok(deleted)
}

/// The Secret copies the provisioner made.
async fn remove_copies(ctx: &Context, owner: &Owner) -> Result<(), Error> {
    let ns = &owner.namespace;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    for name in [
        owner.pull_secret_name(),
        owner.ssh_key_name(),
        owner.etcd_key_name(),
    ] {
        match secrets.get_opt(&name).await? {
            Some(s) if controlled_by(&s.metadata, &owner.uid) == Some(true) => {
                ctx.applier.gone_from(&secrets, "Secret", &name).await?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The MetalLB objects carrying the provisioner's labels.
async fn remove_metal_lb(ctx: &Context, owner: &Owner, mlb_ns: &str) -> Result<(), Error> {
    for (resource, name) in [
        (ip_address_pool_resource(), owner.name.clone()),
        (l2_advertisement_resource(), owner.l2_advertisement_name()),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), mlb_ns, &resource);
        let live = get_present(&api, &name).await?;
        if live.is_some_and(|l| labelled_ours(&l.metadata, owner)) {
            ctx.applier.gone_from(&api, &resource.kind, &name).await?;
        }
    }
    Ok(())
}
