//! The only writer of a provisioner's reconcile: [`apply`] reads
//! ([`super::observe::gather`]), decides ([`super::plan::decide`]), then
//! makes the plan's writes in order through the [`Applier`](crate::k8s::apply::Applier)
//! and writes status once, last.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::ResourceExt;

use super::context::{add_finalizer, publish_note, Context, RESYNC};
use super::crd::{DPFHCPProvisioner, DPFHCPProvisionerStatus, HostedClusterReference, LocalRef};
use super::events::Note;
use super::observe::gather;
use super::plan::{decide, Extra, IgnitionJob, OnRefusal, Plan, Step, Then, Write};
use super::render::{self, Owner};
use super::status::{self, Check, HostedClusterFacts, Outcome};
use crate::error::Error;
use crate::k8s::apply::{permanent, OnMissing};
use crate::k8s::conditions;
use crate::k8s::events::publish_about;

/// One pass of a provisioner that is not being deleted.
pub(super) async fn apply(p: &DPFHCPProvisioner, ctx: &Context) -> Result<Action, Error> {
    let owner = Owner::of(p)?;
    let settings = ctx.settings();
    let observed = gather(ctx, p, &owner, &settings).await?;
    let plan = decide(p, &owner, &settings, &observed)?;
    execute(ctx, p, &owner, plan).await
}

/// How a step ended.
enum Done {
    Wrote,
    /// Refused for good: the API server's message, and the condition's
    /// reason when the write knows a better one than its step's.
    Refused {
        reason: Option<&'static str>,
        message: String,
    },
}

async fn execute(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    owner: &Owner,
    plan: Plan,
) -> Result<Action, Error> {
    let Plan {
        steps,
        mut outcome,
        mut extra,
        notes,
        mut requeue,
        ignition_looked_at,
        ignition_follows_kubeconfig,
    } = plan;
    if ignition_looked_at {
        if let (Ok(mut seen), Some(uid)) = (ctx.ignition_checked.lock(), p.uid()) {
            seen.insert(uid);
        }
    }
    for note in notes {
        publish_note(ctx, p, note).await;
    }
    let mut failed: Vec<&'static str> = Vec::new();
    for step in steps {
        if step.needs.is_some_and(|t| failed.contains(&t)) {
            continue;
        }
        match run(ctx, p, owner, &step).await {
            Ok(Done::Wrote) => {
                for note in &step.notes {
                    publish_note(ctx, p, note.clone()).await;
                }
                if let Then::HostedClusterMade { provisioned_spec } = &step.then {
                    extra.hosted_cluster = true;
                    extra.provisioned_spec = Some(provisioned_spec.clone());
                }
            }
            Ok(Done::Refused {
                reason: why,
                message,
            }) => match step.on_refusal {
                OnRefusal::Stop => {
                    tracing::warn!(provisioner = %owner.name, namespace = %owner.namespace, error = %message, "refused by the API server; not retried until something changes");
                    outcome.permanent_error = Some(message.clone());
                    outcome.applied =
                        Some(Check::new(status::APPLIED, false, "ApplyFailed", message));
                    outcome.hosted_cluster = None;
                    outcome.kubeconfig = None;
                    outcome.ignition = None;
                    extra.kubeconfig = false;
                    return finish(ctx, p, outcome, extra, RESYNC).await;
                }
                OnRefusal::Fail { type_, reason } => {
                    failed.push(type_);
                    let check = Check::new(type_, false, why.unwrap_or(reason), message);
                    if let Some(published) = step_failure_note(&step, &check) {
                        publish_note(ctx, p, published).await;
                    }
                    set_check(&mut outcome, check);
                    if type_ == status::KUBECONFIG_INJECTED {
                        extra.kubeconfig = false;
                        if ignition_follows_kubeconfig {
                            outcome.ignition = None;
                        }
                    }
                    if type_ == status::IGNITION_CONFIGURED {
                        requeue = requeue.min(super::context::POLL);
                    }
                }
                OnRefusal::Retry => return Err(Error::Render(message)),
            },
            Err(e) => return Err(e),
        }
    }
    finish(ctx, p, outcome, extra, requeue).await
}

/// A failed template is an event as well as a condition.
fn step_failure_note(step: &Step, check: &Check) -> Option<Note> {
    matches!(step.write, Write::PublishIgnition(_))
        .then(|| Note::warning("IgnitionGenerationFailed", check.message.clone()))
}

fn set_check(outcome: &mut Outcome, check: Check) {
    let slot = match check.type_ {
        status::METALLB_CONFIGURED => &mut outcome.metal_lb,
        status::KUBECONFIG_INJECTED => &mut outcome.kubeconfig,
        status::IGNITION_CONFIGURED => &mut outcome.ignition,
        _ => &mut outcome.applied,
    };
    *slot = Some(check);
}

/// Makes one write. A refusal for good comes back as [`Done::Refused`]
/// whatever the step does with it; any other error is the reconcile's.
async fn run(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    owner: &Owner,
    step: &Step,
) -> Result<Done, Error> {
    let refused = |e: Error| match e {
        Error::Kube(ke) if permanent(&ke) => Ok(Done::Refused {
            reason: None,
            message: ke.to_string(),
        }),
        other => Err(other),
    };
    let wrote = |r: Result<(), Error>| r.map(|()| Done::Wrote).or_else(refused);
    match &step.write {
        Write::AddFinalizer => wrote(add_finalizer(ctx, p).await),
        Write::Secret(secret) => wrote(ctx.applier.ensure_live((**secret).clone()).await),
        Write::EtcdKey => {
            let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &owner.namespace);
            let key: [u8; 32] = rand::random();
            wrote(
                ctx.applier
                    .create_if_absent(&api, &render::etcd_key(owner, key))
                    .await
                    .map(drop)
                    .map_err(Error::from),
            )
        }
        Write::Foreign {
            resource,
            desired,
            live,
            rewritten,
        } => {
            let live_version = live.as_ref().and_then(|l| l.resource_version());
            match ctx
                .applier
                .ensure_dynamic(resource, (**desired).clone(), live.clone().map(|l| *l))
                .await
            {
                Ok(now) => {
                    // An object that was there and is now written again
                    // had drifted.
                    if let (Some(note), true) = (
                        rewritten,
                        live_version.is_some() && now.resource_version() != live_version,
                    ) {
                        publish_note(ctx, p, note.clone()).await;
                    }
                    Ok(Done::Wrote)
                }
                Err(e) => refused(e),
            }
        }
        Write::MergePatch {
            resource,
            namespace,
            name,
            patch,
        } => {
            let api: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), namespace, resource);
            wrote(
                ctx.applier
                    .patch(
                        &api,
                        &resource.kind,
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(patch),
                    )
                    .await
                    .map(drop)
                    .map_err(Error::from),
            )
        }
        Write::WithdrawTemplate { namespace, name } => {
            let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
            if !ctx.applier.gone_from(&api, "ConfigMap", name).await? {
                tracing::info!(provisioner = %owner.name, namespace = %owner.namespace, configmap = %name, "DPU template withdrawn for the upgrade");
            }
            Ok(Done::Wrote)
        }
        Write::PublishIgnition(job) => match generate(ctx, owner, job).await {
            Ok(()) => {
                tracing::info!(provisioner = %owner.name, namespace = %owner.namespace, configmap = %super::ignition::configmap_name(&job.inputs.dpu_cluster), why = job.why, "DPU ignition published");
                Ok(Done::Wrote)
            }
            Err((reason, message)) => {
                tracing::warn!(provisioner = %owner.name, namespace = %owner.namespace, error = %message, "DPU ignition");
                Ok(Done::Refused {
                    reason: Some(reason),
                    message,
                })
            }
        },
    }
}

/// Fetches HyperShift's ignition, builds the boot template around it and
/// applies the template ConfigMap; a failure comes with its
/// IgnitionConfigured reason.
async fn generate(
    ctx: &Context,
    owner: &Owner,
    job: &IgnitionJob,
) -> Result<(), (&'static str, String)> {
    let failed = |e: String| ("IgnitionGenerationFailed", e);
    let endpoint = job
        .ignition_endpoint
        .as_deref()
        .ok_or_else(|| failed("the HostedCluster reports no ignitionEndpoint yet".into()))?;
    let cp_ns = owner.control_plane_namespace();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &cp_ns);
    let key = |s: &Secret, k: &str| s.data.as_ref().and_then(|d| d.get(k)).map(|b| b.0.clone());
    let ca = secrets
        .get_opt("ignition-server-ca-cert")
        .await
        .map_err(|e| failed(format!("Secret {cp_ns}/ignition-server-ca-cert: {e}")))?
        .and_then(|s| key(&s, "tls.crt"))
        .ok_or_else(|| {
            failed(format!(
                "no Secret {cp_ns}/ignition-server-ca-cert with tls.crt"
            ))
        })?;
    let prefix = format!("token-{}-", owner.name);
    let listed = secrets
        .list(&ListParams::default())
        .await
        .map_err(|e| failed(format!("Secrets of {cp_ns}: {e}")))?;
    let token = super::ignition::newest_token(&listed.items, &prefix)
        .ok_or_else(|| failed(format!("no Secret {cp_ns}/{prefix}* with a token")))?;
    let ignition = super::ignition::fetch(endpoint, &token, &ca)
        .await
        .map_err(failed)?;
    let template = super::bfcfg::template(&super::bfcfg::Inputs {
        hcp_ignition: &ignition,
        flavor: &job.flavor,
        high_speed_mtu: job.high_speed_mtu,
        os_image: &job.inputs.os_image,
        bfb_registry: job.bfb_registry.as_deref(),
    })
    .map_err(|e| (e.reason(), e.to_string()))?;
    let body = super::ignition::configmap(&job.inputs, &template, &owner.labels());
    let cms: Api<ConfigMap> =
        Api::namespaced(ctx.client.clone(), &job.inputs.dpu_cluster_namespace);
    ctx.applier
        .apply_as(
            &cms,
            "ConfigMap",
            &super::ignition::configmap_name(&job.inputs.dpu_cluster),
            &body,
        )
        .await
        .map_err(|e| failed(format!("applying the bfcfg ConfigMap: {e}")))?;
    Ok(())
}

pub(super) async fn finish(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    o: Outcome,
    extra: Extra,
    requeue: std::time::Duration,
) -> Result<Action, Error> {
    write_status(ctx, p, &o, &extra).await?;
    let requeue = ctx
        .settings_grace_left()
        .map_or(requeue, |left| requeue.min(left));
    Ok(Action::requeue(requeue))
}

pub(super) async fn write_status(
    ctx: &Context,
    p: &DPFHCPProvisioner,
    o: &Outcome,
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
            ..Default::default()
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
