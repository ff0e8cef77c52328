//! What a provisioner's reconcile writes, in order: the Secret copies and
//! etcd key, MetalLB, the HostedCluster and NodePool, the kubeconfig
//! hand-off to the DPUCluster; then status, written once per pass.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::ResourceExt;
use serde_json::{json, Value};

use super::crd::{
    BridgeSettings, DPFHCPProvisioner, DPFHCPProvisionerStatus, HostedClusterReference, LocalRef,
    CONFIG_NAME,
};
use super::events::Note;
use super::render::{self, Owner};
use super::spec::{self, Publishing};
use super::status::{self, Check, HostedClusterFacts, Observed};
use crate::error::Error;
use crate::k8s::apply::{get_present, installed, permanent, OnMissing};
use crate::k8s::conditions;
use crate::k8s::events::publish_about;
use crate::k8s::resources::{
    dpu_cluster_resource, hosted_cluster_resource, ip_address_pool_resource,
    l2_advertisement_resource, node_pool_resource,
};

use super::context::{add_finalizer, publish_note, Context, POLL, RESYNC, SHORT_POLL};
use super::observe::{
    blue_field_check, check_dpu_cluster, check_prerequisites, ignition_check, node_port_address,
    read_secrets,
};

pub(super) fn controlled_by(meta: &kube::api::ObjectMeta, uid: &str) -> Option<bool> {
    let refs = meta.owner_references.as_deref().unwrap_or_default();
    let controller = refs.iter().find(|r| r.controller == Some(true))?;
    Some(controller.uid == uid)
}

pub(super) fn labelled_ours(meta: &kube::api::ObjectMeta, owner: &Owner) -> bool {
    let labels = meta.labels.clone().unwrap_or_default();
    labels.get(render::NAME_LABEL) == Some(&owner.name)
        && labels.get(render::NAMESPACE_LABEL) == Some(&owner.namespace)
}

pub(super) fn to_dynamic(v: Value) -> Result<DynamicObject, Error> {
    serde_json::from_value(v).map_err(|e| Error::Render(e.to_string()))
}

/// MetalLB's pool and advertisement for the VIP, or why not.
pub(super) async fn ensure_metal_lb(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    owner: &Owner,
    settings: &BridgeSettings,
    vip: std::net::IpAddr,
) -> Result<Check, Error> {
    let no = |reason: &str, message: String| {
        Ok(Check::new(
            status::METALLB_CONFIGURED,
            false,
            reason,
            message,
        ))
    };
    if !settings.metal_lb_enabled {
        return Ok(Check::new(
            status::METALLB_CONFIGURED,
            true,
            "MetalLBDisabled",
            "disableMetalLB is set: the VIP is announced by something else",
        ));
    }
    let ns = &settings.metal_lb_namespace;
    let pool_res = ip_address_pool_resource();
    let l2_res = l2_advertisement_resource();
    if !installed(&ctx.client, ns, &pool_res).await? || !installed(&ctx.client, ns, &l2_res).await?
    {
        return no(
            "MetalLBNotInstalled",
            "the MetalLB APIs (ipaddresspools, l2advertisements.metallb.io) are not installed"
                .into(),
        );
    }
    let (pool, l2) = render::metal_lb(owner, ns, vip);
    for (resource, desired, failed) in [
        (&pool_res, pool, "CreatingIPAddressPool"),
        (&l2_res, l2, "L2AdvertisementFailed"),
    ] {
        let name = desired["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, resource);
        let live = api.get_opt(&name).await?;
        if let Some(l) = &live {
            if !labelled_ours(&l.metadata, owner) {
                return no(failed, format!("{} {ns}/{name} exists and was not made for this provisioner (labels {} and {})", resource.kind, render::NAME_LABEL, render::NAMESPACE_LABEL));
            }
        }
        let live_version = live.as_ref().and_then(|l| l.resource_version());
        match ctx
            .applier
            .ensure_dynamic(resource, to_dynamic(desired)?, live)
            .await
        {
            // An object that was there and is now written again had drifted.
            Ok(now) if live_version.is_some() && now.resource_version() != live_version => {
                publish_note(
                    ctx,
                    p,
                    Note::normal(
                        "MetalLBDriftCorrected",
                        format!("Corrected spec drift in {} {ns}/{name}", resource.kind),
                    ),
                )
                .await;
            }
            Ok(_) => {}
            Err(Error::Kube(ke)) if permanent(&ke) => {
                return no(failed, format!("{} {ns}/{name}: {ke}", resource.kind))
            }
            Err(other) => return Err(other),
        }
    }
    Ok(Check::new(
        status::METALLB_CONFIGURED,
        true,
        "MetalLBReady",
        format!("{vip} is announced from IPAddressPool {ns}/{}", owner.name),
    ))
}

/// Copies HyperShift's admin kubeconfig into the DPUCluster's namespace
/// and names it in the DPUCluster.
pub(super) async fn inject_kubeconfig(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    owner: &Owner,
    dpu: &DynamicObject,
) -> Result<Check, Error> {
    let no = |reason: &str, message: String| {
        Ok(Check::new(
            status::KUBECONFIG_INJECTED,
            false,
            reason,
            message,
        ))
    };
    let name = owner.admin_kubeconfig_name();
    let source_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
    let source = source_api.get_opt(&name).await?;
    let Some(kubeconfig) = source
        .as_ref()
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get(render::ADMIN_KUBECONFIG_KEY))
    else {
        return no(
            "KubeconfigPending",
            format!(
                "waiting for HyperShift to write Secret {}/{name} (key kubeconfig)",
                owner.namespace
            ),
        );
    };
    let dpu_ns = dpu.namespace().unwrap_or_default();
    let dest_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &dpu_ns);
    let dest = dest_api.get_opt(&name).await?;
    let copy = match dest
        .as_ref()
        .and_then(|d| d.data.as_ref())
        .and_then(|d| d.get(render::INJECTED_KEY))
    {
        None => status::Copy::Missing,
        Some(v) if v.0 == kubeconfig.0 => status::Copy::Current,
        Some(_) => status::Copy::Stale,
    };
    let field = dpu.data.pointer("/spec/kubeconfig").and_then(Value::as_str);
    match status::injection(copy, field, &name) {
        status::Injection::Conflict(other) => {
            return no("InjectionFailed", format!("DPUCluster {dpu_ns}/{} already names kubeconfig Secret {other:?}, and the field cannot change once set; re-create the DPUCluster, or delete the provisioner that set it", dpu.name_any()));
        }
        status::Injection::Nothing => {}
        status::Injection::Act {
            write_secret,
            set_field,
        } => {
            if write_secret {
                ctx.applier
                    .ensure_live(render::injected_kubeconfig(owner, &dpu_ns, &kubeconfig.0))
                    .await?;
                let note = if copy == status::Copy::Stale {
                    Note::normal(
                        "DriftCorrected",
                        format!("Kubeconfig Secret {dpu_ns}/{name} differed from HyperShift's and was rewritten"),
                    )
                } else {
                    Note::normal(
                        "KubeConfigInjected",
                        format!("Kubeconfig Secret {name} created in namespace {dpu_ns}"),
                    )
                };
                publish_note(ctx, p, note).await;
            }
            if set_field {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(ctx.client.clone(), &dpu_ns, &dpu_cluster_resource());
                let patch = json!({"spec": {"kubeconfig": name}});
                match ctx
                    .applier
                    .patch(
                        &api,
                        "DPUCluster",
                        &dpu.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    Ok(_) => {
                        publish_note(
                            ctx,
                            p,
                            Note::normal(
                                "DPUClusterUpdated",
                                format!(
                                    "DPUCluster {dpu_ns}/{} updated with kubeconfig reference {name}",
                                    dpu.name_any()
                                ),
                            ),
                        )
                        .await;
                    }
                    Err(e) if permanent(&e) => {
                        return no(
                            "InjectionFailed",
                            format!(
                                "setting DPUCluster {dpu_ns}/{} spec.kubeconfig: {e}",
                                dpu.name_any()
                            ),
                        )
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(Check::new(
        status::KUBECONFIG_INJECTED,
        true,
        "Injected",
        format!("Secret {dpu_ns}/{name} (key super-admin.conf) is named in the DPUCluster"),
    ))
}

/// What a reconcile writes to status beyond the conditions.
#[derive(Default)]
pub(super) struct Extra {
    pub(super) hosted_cluster: bool,
    pub(super) kubeconfig: bool,
    pub(super) provisioned_spec: Option<Value>,
    /// The BlueField image found, when looked up.
    pub(super) blue_field_image: Option<String>,
}

/// Whether the provisioner last reported an upgrade in progress.
fn was_upgrading(p: &DPFHCPProvisioner) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == status::UPGRADING && c.status == "True")
    })
}

pub(super) async fn apply(p: &DPFHCPProvisioner, ctx: &Context) -> Result<Action, Error> {
    add_finalizer(ctx, p).await?;
    let owner = Owner::of(p)?;
    let ns = owner.namespace.clone();
    let settings = ctx.settings();
    let mut o = Observed {
        wanted_image: p.spec.ocp_release_image.clone(),
        was_upgrading: was_upgrading(p),
        ..Default::default()
    };
    o.notes.push(if settings.from_object {
        Check::new(status::PROVISIONER_CONFIG, true, "Found", format!("settings from DPFHCPProvisionerConfig {CONFIG_NAME}"))
    } else {
        Check::new(status::PROVISIONER_CONFIG, true, "DefaultsUsed", format!(
            "no DPFHCPProvisionerConfig {CONFIG_NAME}: defaults in use (MetalLB on, in namespace {}; BlueField repository {})",
            settings.metal_lb_namespace, settings.blue_field_repo
        ))
    });
    let mut extra = Extra {
        provisioned_spec: p.status.as_ref().and_then(|s| s.provisioned_spec.clone()),
        ..Default::default()
    };
    let hc_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ns, &hosted_cluster_resource());
    let read_hc = get_present(&hc_api, &owner.name);

    // The spec alone, then against what was provisioned.
    let (checked, mut spec_errors) = match spec::check(&p.spec) {
        Ok(checked) => (Some(checked), Vec::new()),
        Err(errors) => (None, errors),
    };
    if let Some(was) = &extra.provisioned_spec {
        spec_errors.extend(spec::changed_immutable(was, &p.spec));
    }
    let spec_check = match (spec_errors.first(), &checked) {
        (None, Some(_)) => Check::new(status::SPEC_VALID, true, "Valid", "the spec is valid"),
        (first, _) => Check::new(
            status::SPEC_VALID,
            false,
            first.map_or("Invalid", |e| e.reason),
            spec_errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    o.validations.push(spec_check);
    let mut dpu = None;
    let mut secrets = None;
    if let (true, Some(_)) = (spec_errors.is_empty(), &checked) {
        let (checks, found) = check_dpu_cluster(ctx, p).await?;
        o.validations.extend(checks);
        dpu = found;
        match read_secrets(&ctx.client, p, &ns).await? {
            Ok(data) => {
                o.validations.push(Check::new(
                    status::SECRETS_VALID,
                    true,
                    "SecretsValid",
                    "the SSH key and pull secret are there and parse",
                ));
                secrets = Some(data);
            }
            Err(check) => o.validations.push(check),
        }
        o.validations.push(check_prerequisites(ctx, p, &ns).await?);
        if let Some(data) = &secrets {
            let (check, image) = blue_field_check(ctx, p, &settings.blue_field_repo, data).await;
            o.notes.push(Check {
                type_: status::BLUEFIELD_IMAGE_AVAILABLE,
                ..check.clone()
            });
            // A registry that does not answer for a moment is noted, not
            // a failed validation: it is asked again on the next pass.
            if check.status || check.reason != "RegistryAccessError" {
                o.validations.push(check);
            } else {
                o.notes.push(check);
            }
            extra.blue_field_image = image;
        }
    }
    let live_hc = read_hc.await?;
    let ours = live_hc
        .as_ref()
        .map(|hc| controlled_by(&hc.metadata, &owner.uid));
    let (Some(checked), Some(secrets)) = (checked, secrets) else {
        return settle_invalid(ctx, p, o, live_hc, ours, extra).await;
    };
    if o.validations.iter().any(|c| !status::holds(c)) {
        return settle_invalid(ctx, p, o, live_hc, ours, extra).await;
    }
    if matches!(ours, Some(None) | Some(Some(false))) {
        o.applied = Some(Check::new(status::APPLIED, false, "Conflict", format!(
            "HostedCluster {ns}/{} exists and is not this provisioner's: it is left alone. Delete it, or give the provisioner another name",
            owner.name
        )));
        return finish(ctx, p, o, None, extra, POLL).await;
    }

    // Everything checks out: make the objects.
    let mut requeue = RESYNC;
    let outcome: Result<(), Error> = async {
        let [pull, ssh] = render::secret_copies(&owner, &secrets.pull_secret, &secrets.ssh_key);
        ctx.applier.ensure_live(pull).await?;
        ctx.applier.ensure_live(ssh).await?;
        let etcd_key: [u8; 32] = rand::random();
        let secrets_api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
        ctx.applier
            .create_if_absent(&secrets_api, &render::etcd_key(&owner, etcd_key))
            .await?;
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        return permanent_or(ctx, p, o, e, extra).await;
    }
    if let Publishing::LoadBalancer { vip } = checked.publishing {
        let check = ensure_metal_lb(ctx, p, &owner, &settings, vip).await?;
        if check.reason == "MetalLBNotInstalled" {
            requeue = SHORT_POLL;
        }
        o.metal_lb = Some(check);
    }
    let node = match checked.publishing {
        Publishing::NodePort => match node_port_address(ctx).await? {
            Ok(address) => Some(address),
            Err(check) => {
                o.applied = Some(check);
                return finish(
                    ctx,
                    p,
                    o,
                    live_hc
                        .as_ref()
                        .map(|h| HostedClusterFacts::from_object(&h.data)),
                    extra,
                    POLL,
                )
                .await;
            }
        },
        Publishing::LoadBalancer { .. } => None,
    };
    let desired_hc = render::desired_hosted_cluster(
        &owner,
        &p.spec,
        &checked,
        live_hc.as_ref().map(|h| &h.data),
        node.as_deref(),
    );
    let hc = match ctx
        .applier
        .ensure_dynamic(&hosted_cluster_resource(), to_dynamic(desired_hc)?, live_hc)
        .await
    {
        Ok(hc) => hc,
        Err(e) => return permanent_or(ctx, p, o, e, extra).await,
    };
    extra.hosted_cluster = true;
    extra
        .provisioned_spec
        .get_or_insert_with(|| spec::immutable_part(&p.spec));
    let facts = HostedClusterFacts::from_object(&hc.data);
    let np_api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ns, &node_pool_resource());
    let live_np = get_present(&np_api, &owner.name).await?;
    // The NodePool follows the control plane's history alone: the hosted
    // cluster's version progressing does not hold it back.
    let rollout = status::rollout(&p.spec.ocp_release_image, &facts, false);
    let desired_np = render::desired_node_pool(
        &owner,
        &p.spec.ocp_release_image,
        rollout,
        live_np.as_ref().map(|np| &np.data),
    );
    if let Err(e) = ctx
        .applier
        .ensure_dynamic(&node_pool_resource(), to_dynamic(desired_np)?, live_np)
        .await
    {
        return permanent_or(ctx, p, o, e, extra).await;
    }
    o.applied = Some(Check::new(
        status::APPLIED,
        true,
        "HostedClusterApplied",
        format!("HostedCluster and NodePool {ns}/{} are applied", owner.name),
    ));
    if rollout == status::Rollout::Upgrading {
        // HyperShift reports progress in status, which the watch delivers;
        // the poll is the backstop.
        requeue = requeue.min(POLL);
    }
    // An upgrade holds the DPU template back until it is over: the
    // control plane on the new release and the hosted cluster's version no
    // longer progressing.
    let upgrade = status::rollout(&p.spec.ocp_release_image, &facts, o.was_upgrading);
    if let Some(dpu) = &dpu {
        let check = inject_kubeconfig(ctx, p, &owner, dpu).await?;
        extra.kubeconfig = check.status;
        o.kubeconfig = Some(check);
        if upgrade == status::Rollout::Upgrading {
            o.ignition = Some(withdraw_template(ctx, p, dpu).await?);
        } else if extra.kubeconfig && facts.is("Available", "True") {
            let os_image = p
                .spec
                .machine_os_url
                .clone()
                .filter(|u| !u.is_empty())
                .or_else(|| extra.blue_field_image.clone());
            let check = ignition_check(ctx, p, &owner, dpu, &facts, rollout, os_image).await?;
            if !check.status {
                requeue = requeue.min(POLL);
            }
            o.ignition = Some(check);
        }
    }
    finish(ctx, p, o, Some(facts), extra, requeue).await
}

/// During an upgrade the published template is for the old release: a DPU
/// provisioned from it would boot the release being left. It is deleted,
/// as the Go operator does at the start of an upgrade and as DPF's upgrade
/// script checks, and made again when the upgrade is over.
async fn withdraw_template(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    dpu: &DynamicObject,
) -> Result<Check, Error> {
    let dpu_ns = dpu.namespace().unwrap_or_default();
    let name = super::ignition::configmap_name(&dpu.name_any());
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(ctx.client.clone(), &dpu_ns);
    if !ctx.applier.gone_from(&api, "ConfigMap", &name).await? {
        tracing::info!(provisioner = %p.name_any(), namespace = ?p.namespace(), configmap = %name, "DPU template withdrawn for the upgrade");
    }
    Ok(Check::new(
        status::IGNITION_CONFIGURED,
        false,
        "ReleaseImageUpdated",
        format!(
            "ConfigMap {dpu_ns}/{name} is withdrawn during the upgrade to {}; it is made again once the control plane has rolled it out and the hosted cluster's version stopped progressing",
            p.spec.ocp_release_image
        ),
    ))
}

/// A failed check: nothing is written but status. The HostedCluster, if
/// there, is left as it is and still reported.
pub(super) async fn settle_invalid(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    mut o: Observed,
    live_hc: Option<DynamicObject>,
    ours: Option<Option<bool>>,
    mut extra: Extra,
) -> Result<Action, Error> {
    let facts = match (live_hc, ours) {
        (Some(hc), Some(Some(true))) => {
            o.applied = Some(Check::new(
                status::APPLIED,
                true,
                "HostedClusterKept",
                "the HostedCluster is kept as it is and not updated while a check fails",
            ));
            extra.hosted_cluster = true;
            Some(HostedClusterFacts::from_object(&hc.data))
        }
        _ => None,
    };
    extra.kubeconfig = p
        .status
        .as_ref()
        .is_some_and(|s| s.kube_config_secret_ref.is_some());
    // Checks that fail wait for a change to what they read (watched) or
    // a minute; none is a write retried in a loop.
    finish(ctx, p, o, facts, extra, Duration::from_secs(60)).await
}

/// A write refused for good sets Health=False and waits for a change; any
/// other error is retried with backoff.
pub(super) async fn permanent_or(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    mut o: Observed,
    e: Error,
    extra: Extra,
) -> Result<Action, Error> {
    match e {
        Error::Kube(ke) if permanent(&ke) => {
            tracing::warn!(provisioner = %p.name_any(), namespace = ?p.namespace(), error = %ke, "refused by the API server; not retried until something changes");
            o.permanent_error = Some(ke.to_string());
            if o.applied.is_none() {
                o.applied = Some(Check::new(
                    status::APPLIED,
                    false,
                    "ApplyFailed",
                    ke.to_string(),
                ));
            }
            finish(ctx, p, o, None, extra, RESYNC).await
        }
        other => Err(other),
    }
}

pub(super) async fn finish(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    mut o: Observed,
    facts: Option<HostedClusterFacts>,
    extra: Extra,
    requeue: Duration,
) -> Result<Action, Error> {
    o.hosted_cluster = facts;
    write_status(ctx, p, &o, &extra).await?;
    let requeue = ctx
        .settings_grace_left()
        .map_or(requeue, |left| requeue.min(left));
    Ok(Action::requeue(requeue))
}

pub(super) async fn write_status(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    o: &Observed,
    extra: &Extra,
) -> Result<(), Error> {
    let ns = p.namespace().ok_or(Error::NoNamespace)?;
    let previous = p.status.clone().unwrap_or_default();
    let mut checks = status::checks(o);
    checks.extend(status::csr_approval_condition(
        previous.csr_approval.as_ref(),
    ));
    let ready = status::ready(o);
    let phase = status::phase(o, &ready);
    let conditions = status::conditions(
        &previous.conditions,
        &checks,
        p.metadata.generation,
        &conditions::now(),
    );
    let hc = o.hosted_cluster.as_ref();
    let next = DPFHCPProvisionerStatus {
        phase: Some(phase),
        conditions,
        observed_generation: p.metadata.generation,
        hosted_cluster_ref: extra.hosted_cluster.then(|| HostedClusterReference {
            api_version: render::HYPERSHIFT_API_VERSION.into(),
            kind: "HostedCluster".into(),
            name: p.name_any(),
            namespace: ns.clone(),
        }),
        kube_config_secret_ref: extra.kubeconfig.then(|| LocalRef {
            name: format!("{}-admin-kubeconfig", p.name_any()),
        }),
        blue_field_ocp_layer_image: extra
            .blue_field_image
            .clone()
            .or_else(|| previous.blue_field_ocp_layer_image.clone()),
        blue_field_container_image: extra
            .blue_field_image
            .clone()
            .or_else(|| previous.blue_field_container_image.clone()),
        control_plane_endpoint: hc.and_then(|h| h.endpoint.clone()),
        version: hc.and_then(HostedClusterFacts::version),
        provisioned_spec: extra.provisioned_spec.clone(),
        // The approver's part: compared, never written from here.
        csr_approval: previous.csr_approval.clone(),
    };
    let mut written = next.clone();
    written.csr_approval = None;
    let api: Api<DPFHCPProvisioner> = Api::namespaced(ctx.client.clone(), &ns);
    // Deleted under us: there is no status left to write.
    let wrote = ctx
        .applier
        .apply_status(
            &api,
            &p.name_any(),
            &previous,
            &next,
            &written,
            OnMissing::Skip,
        )
        .await?;
    if wrote {
        for note in super::events::condition_notes(&previous.conditions, &next.conditions) {
            publish_note(ctx, p, note).await;
        }
    }
    if wrote && previous.phase != next.phase {
        tracing::info!(provisioner = %p.name_any(), namespace = %ns, phase = ?next.phase, why = %ready.message, "phase");
        let type_ = if matches!(phase, super::crd::Phase::Failed | super::crd::Phase::Error) {
            EventType::Warning
        } else {
            EventType::Normal
        };
        publish_about(
            ctx.recorder.as_ref(),
            p,
            type_,
            &format!("{phase:?}"),
            ready.message.clone(),
        )
        .await;
    }
    Ok(())
}
