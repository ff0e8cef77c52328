//! What one pass of a provisioner's reconcile does, decided from what was
//! read: [`decide`] takes the provisioner, its settings and everything
//! [`super::observe::gather`] read, and returns the writes in order, the
//! status they lead to, the events to publish and when to look again.
//! Pure: no client, no clock, no randomness; [`super::execute`] is the
//! only writer.
//!
//! The status in a [`Plan`] is the one every write succeeding leads to. A
//! write the API server refuses for good changes it as its [`Step`] says:
//! the whole pass stops (Applied=False), or one condition turns False and
//! the steps that need it are skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::DynamicObject;
use kube::core::ApiResource;
use serde_json::{json, Value};

use super::bfcfg::Flavor;
use super::context::{POLL, RESYNC, SHORT_POLL};
use super::crd::{BridgeSettings, DPFHCPProvisioner, CONFIG_NAME};
use super::events::Note;
use super::ignition::{self as ign, Inputs};
use super::render::{self, Owner};
use super::spec::{self, Checked, Publishing};
use super::status::{self, Check, HostedClusterFacts, Outcome, Rollout};
use crate::error::Error;
use crate::k8s::resources::{
    dpu_cluster_resource, hosted_cluster_resource, ip_address_pool_resource,
    l2_advertisement_resource, node_pool_resource,
};

// ---- What the pass read: filled by `observe::gather`. ----

/// What the two user Secrets hold, once checked.
pub(super) struct SecretData {
    pub(super) pull_secret: Vec<u8>,
    pub(super) ssh_key: Vec<u8>,
}

/// Everything one pass read.
#[derive(Default)]
pub(super) struct Observed {
    /// The HostedCluster of the provisioner's name, whoever made it.
    pub(super) live_hc: Option<DynamicObject>,
    /// What the checks read; `None` when the spec itself failed.
    pub(super) validated: Option<Validated>,
    /// What making the objects needs; `None` unless every check holds and
    /// the HostedCluster is absent or the provisioner's own.
    pub(super) provisioning: Option<ProvisioningReads>,
}

pub(super) struct Validated {
    /// DPUClusterMissing, and when found ClusterTypeValid and
    /// DPUClusterInUse.
    pub(super) dpu_checks: Vec<Check>,
    pub(super) dpu: Option<DynamicObject>,
    pub(super) secrets: Result<SecretData, Check>,
    pub(super) prerequisites: Check,
    /// The BlueField image lookup and what it found; `None` when the
    /// Secrets (whose pull secret it logs in with) did not check out.
    pub(super) blue_field: Option<(Check, Option<String>)>,
}

#[derive(Default)]
pub(super) struct ProvisioningReads {
    /// `None` in NodePort mode or with MetalLB disabled.
    pub(super) metal_lb: Option<MetalLbRead>,
    /// The node a NodePort publishing points at; `None` in LoadBalancer
    /// mode.
    pub(super) node_address: Option<Result<String, Check>>,
    pub(super) live_np: Option<DynamicObject>,
    /// `None` without a DPUCluster.
    pub(super) kubeconfig: Option<KubeconfigRead>,
    /// Read once the control plane is available and no upgrade runs.
    pub(super) ignition: Option<Result<IgnitionSource, Check>>,
}

pub(super) enum MetalLbRead {
    NotInstalled,
    Live {
        pool: Option<Box<DynamicObject>>,
        l2: Option<Box<DynamicObject>>,
    },
}

/// HyperShift's admin kubeconfig and its copy in the DPUCluster's
/// namespace, each `None` when absent.
pub(super) struct KubeconfigRead {
    pub(super) source: Option<Vec<u8>>,
    pub(super) copy: Option<Vec<u8>>,
}

pub(super) struct IgnitionSource {
    /// Without the OS image, which the plan picks.
    pub(super) inputs: Inputs,
    pub(super) flavor: Flavor,
    pub(super) high_speed_mtu: Option<u32>,
    /// Zero-trust: the BFB registry's URL.
    pub(super) bfb_registry: Option<String>,
    /// The published template's annotations; `None` when there is none.
    pub(super) published: Option<BTreeMap<String, String>>,
    /// This process has not looked at the template before.
    pub(super) first_look: bool,
}

// ---- What the pass does. ----

/// A pass whose checks failed waits this long, or for a change to what it
/// read (watched): none of its checks is a write retried in a loop.
pub(super) const SETTLE_INVALID: Duration = Duration::from_secs(60);

/// One write, in the order the pass makes them.
#[derive(Debug, Clone)]
pub(super) enum Write {
    /// The provisioner's finalizer, before anything it would clean up.
    AddFinalizer,
    /// A Secret applied unless the live one already is it.
    Secret(Box<Secret>),
    /// The etcd encryption key: made once with a fresh random key, never
    /// rewritten.
    EtcdKey,
    /// An object of a foreign kind applied unless `live` already is it;
    /// `rewritten` is published when a live object had drifted.
    Foreign {
        resource: ApiResource,
        desired: Box<DynamicObject>,
        live: Option<Box<DynamicObject>>,
        rewritten: Option<Note>,
    },
    /// A merge patch of a foreign object (the DPUCluster's kubeconfig
    /// field, which cannot be applied without owning the whole spec).
    MergePatch {
        resource: ApiResource,
        namespace: String,
        name: String,
        patch: Value,
    },
    /// The boot template deleted while an upgrade runs.
    WithdrawTemplate { namespace: String, name: String },
    /// The boot template made from HyperShift's ignition, fetched at the
    /// moment of writing: its token is short-lived and its content is the
    /// write's body.
    PublishIgnition(Box<IgnitionJob>),
}

/// What publishing the boot template needs beyond HyperShift's ignition.
#[derive(Debug, Clone)]
pub(super) struct IgnitionJob {
    pub(super) inputs: Inputs,
    pub(super) flavor: Flavor,
    pub(super) high_speed_mtu: Option<u32>,
    pub(super) bfb_registry: Option<String>,
    pub(super) ignition_endpoint: Option<String>,
    /// The reason it is made again, for the log and the condition.
    pub(super) why: &'static str,
}

/// What a refusal for good (a 4xx the same request will get again) does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum OnRefusal {
    /// The pass stops: Applied=False (ApplyFailed) and Health=False until
    /// something changes.
    Stop,
    /// The condition of this type turns False with this reason; steps that
    /// need it are skipped; the rest go on.
    Fail {
        type_: &'static str,
        reason: &'static str,
    },
    /// Not expected for good: retried with backoff like any error.
    Retry,
}

/// What follows a step that wrote.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Then {
    Nothing,
    /// The HostedCluster exists as applied: status names it and records
    /// the spec it was provisioned from.
    HostedClusterMade {
        provisioned_spec: Value,
    },
}

#[derive(Debug, Clone)]
pub(super) struct Step {
    pub(super) write: Write,
    pub(super) on_refusal: OnRefusal,
    /// A condition that must still hold (not turned False by an earlier
    /// step's refusal) for this step to run.
    pub(super) needs: Option<&'static str>,
    /// Published once the step has written.
    pub(super) notes: Vec<Note>,
    pub(super) then: Then,
}

impl Step {
    fn new(write: Write, on_refusal: OnRefusal) -> Self {
        Step {
            write,
            on_refusal,
            needs: None,
            notes: Vec::new(),
            then: Then::Nothing,
        }
    }
    fn needs(mut self, type_: &'static str) -> Self {
        self.needs = Some(type_);
        self
    }
    fn noting(mut self, note: Note) -> Self {
        self.notes.push(note);
        self
    }
    fn then(mut self, then: Then) -> Self {
        self.then = then;
        self
    }
}

/// What status records beyond the conditions.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Extra {
    pub(super) hosted_cluster: bool,
    pub(super) kubeconfig: bool,
    pub(super) provisioned_spec: Option<Value>,
    /// The BlueField image found, when looked up.
    pub(super) blue_field_image: Option<String>,
}

/// One pass, decided.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) steps: Vec<Step>,
    /// The status every step succeeding leads to.
    pub(super) outcome: Outcome,
    /// What status records beyond the conditions, as it stands before the
    /// writes: a step's [`Then`] adds to it once the step has written.
    pub(super) extra: Extra,
    /// Published before the writes (a template about to be made again).
    pub(super) notes: Vec<Note>,
    pub(super) requeue: Duration,
    /// The pass looked at the published template: later passes of this
    /// process no longer make it again for the restart.
    pub(super) ignition_looked_at: bool,
    /// IgnitionConfigured was decided on the kubeconfig being injected: if
    /// that is refused, the template is not looked at after all.
    pub(super) ignition_follows_kubeconfig: bool,
}

/// The spec on its own and against what was provisioned: the checked
/// spec when both hold, and the SpecValid condition either way.
pub(super) fn spec_verdict(p: &DPFHCPProvisioner) -> (Option<Checked>, Check) {
    let (checked, mut errors) = match spec::check(&p.spec) {
        Ok(checked) => (Some(checked), Vec::new()),
        Err(errors) => (None, errors),
    };
    if let Some(was) = p.status.as_ref().and_then(|s| s.provisioned_spec.as_ref()) {
        errors.extend(spec::changed_immutable(was, &p.spec));
    }
    match (errors.first(), checked) {
        (None, Some(checked)) => (
            Some(checked),
            Check::new(status::SPEC_VALID, true, "Valid", "the spec is valid"),
        ),
        (first, _) => (
            None,
            Check::new(
                status::SPEC_VALID,
                false,
                first.map_or("Invalid", |e| e.reason),
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            ),
        ),
    }
}

/// The validation checks from what was read, in the order Ready looks at
/// them, and the BlueField notes.
pub(super) fn validations(spec_check: Check, v: Option<&Validated>) -> (Vec<Check>, Vec<Check>) {
    let mut validations = vec![spec_check];
    let mut notes = Vec::new();
    let Some(v) = v else {
        return (validations, notes);
    };
    validations.extend(v.dpu_checks.iter().cloned());
    validations.push(match &v.secrets {
        Ok(_) => Check::new(
            status::SECRETS_VALID,
            true,
            "SecretsValid",
            "the SSH key and pull secret are there and parse",
        ),
        Err(check) => check.clone(),
    });
    validations.push(v.prerequisites.clone());
    if let Some((check, _)) = &v.blue_field {
        notes.push(Check {
            type_: status::BLUEFIELD_IMAGE_AVAILABLE,
            ..check.clone()
        });
        // A registry that does not answer for a moment is noted, not a
        // failed validation: it is asked again on the next pass.
        if check.status || check.reason != "RegistryAccessError" {
            validations.push(check.clone());
        } else {
            notes.push(check.clone());
        }
    }
    (validations, notes)
}

/// The BlueField image found before, kept without asking the registry
/// again: as the Go operator, the lookup runs only while the provisioner
/// is Pending, Failed or GeneratingIgnition (or has no image yet); and,
/// causeway's addition, whenever the spec changed since the image was
/// found (a new release wants its own image). So a provisioner that is up
/// is never failed by a registry that does not answer for a while.
pub(super) fn blue_field_kept(p: &DPFHCPProvisioner) -> Option<(Check, String)> {
    use super::crd::Phase;
    let s = p.status.as_ref()?;
    if matches!(
        s.phase,
        None | Some(Phase::Pending | Phase::Failed | Phase::Error | Phase::GeneratingIgnition)
    ) {
        return None;
    }
    let image = s.blue_field_container_image.clone()?;
    let found = s
        .conditions
        .iter()
        .find(|c| c.type_ == status::BLUEFIELD_IMAGE_FOUND && c.status == "True")?;
    if found.observed_generation != p.metadata.generation {
        return None;
    }
    Some((
        Check::new(
            status::BLUEFIELD_IMAGE_FOUND,
            true,
            &found.reason,
            found.message.clone(),
        ),
        image,
    ))
}

/// Whether the HostedCluster of the provisioner's name is its own:
/// `None` when there is none, `Some(false)` when another controller (or
/// nothing) controls it.
pub(super) fn hosted_cluster_ours(live: Option<&DynamicObject>, owner: &Owner) -> Option<bool> {
    live.map(|hc| render::controlled_by(&hc.metadata, &owner.uid) == Some(true))
}

/// Whether the pass goes on to make objects: every validation holds and
/// the HostedCluster of its name is absent or its own. The same answer
/// tells `gather` whether to read what making them needs.
pub(super) fn may_provision(validations: &[Check], hc_ours: Option<bool>) -> bool {
    validations.iter().all(status::holds) && hc_ours != Some(false)
}

/// The HostedCluster's facts once the desired object is applied over the
/// live one: the spec as rendered, the status as HyperShift last wrote it.
pub(super) fn facts_after_apply(
    desired: &Value,
    live: Option<&DynamicObject>,
) -> HostedClusterFacts {
    let mut merged = desired.clone();
    if let (Some(status), Some(obj)) = (
        live.and_then(|l| l.data.get("status")),
        merged.as_object_mut(),
    ) {
        obj.insert("status".into(), status.clone());
    }
    HostedClusterFacts::from_object(&merged)
}

fn was_upgrading(p: &DPFHCPProvisioner) -> bool {
    previous_is(p, status::UPGRADING, |c| c.status == "True")
}

fn previous_is(
    p: &DPFHCPProvisioner,
    type_: &str,
    test: impl Fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition) -> bool,
) -> bool {
    p.status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == type_ && test(c)))
}

fn to_dynamic(v: Value) -> Result<DynamicObject, Error> {
    serde_json::from_value(v).map_err(|e| Error::Render(e.to_string()))
}

/// Decides one pass of a provisioner that is not being deleted.
pub(super) fn decide(
    p: &DPFHCPProvisioner,
    owner: &Owner,
    settings: &BridgeSettings,
    o: &Observed,
) -> Result<Plan, Error> {
    let mut steps = Vec::new();
    if !p
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == super::context::FINALIZER)
    {
        steps.push(Step::new(Write::AddFinalizer, OnRefusal::Retry));
    }
    let mut outcome = Outcome {
        wanted_image: p.spec.ocp_release_image.clone(),
        was_upgrading: was_upgrading(p),
        ..Default::default()
    };
    outcome.notes.push(if settings.from_object {
        Check::new(status::PROVISIONER_CONFIG, true, "Found", format!("settings from DPFHCPProvisionerConfig {CONFIG_NAME}"))
    } else {
        Check::new(status::PROVISIONER_CONFIG, true, "DefaultsUsed", format!(
            "no DPFHCPProvisionerConfig {CONFIG_NAME}: defaults in use (MetalLB on, in namespace {}; BlueField repository {})",
            settings.metal_lb_namespace, settings.blue_field_repo
        ))
    });
    let mut extra = Extra {
        provisioned_spec: p.status.as_ref().and_then(|s| s.provisioned_spec.clone()),
        blue_field_image: o
            .validated
            .as_ref()
            .and_then(|v| v.blue_field.as_ref())
            .and_then(|(_, image)| image.clone()),
        ..Default::default()
    };
    let (checked, spec_check) = spec_verdict(p);
    let (validations, notes) = validations(spec_check, o.validated.as_ref());
    outcome.validations = validations;
    outcome.notes.extend(notes);
    let live_hc = o.live_hc.as_ref();
    let ours = hosted_cluster_ours(live_hc, owner);
    let plan = |steps, outcome, extra, requeue| Plan {
        steps,
        outcome,
        extra,
        notes: Vec::new(),
        requeue,
        ignition_looked_at: false,
        ignition_follows_kubeconfig: false,
    };

    let (Some(checked), Some(validated), Some(reads)) =
        (checked, o.validated.as_ref(), o.provisioning.as_ref())
    else {
        // A check failed: nothing is written but status. The HostedCluster,
        // if there and ours, is kept as it is and still reported.
        if ours == Some(false) && outcome.validations.iter().all(status::holds) {
            outcome.applied = Some(Check::new(status::APPLIED, false, "Conflict", format!(
                "HostedCluster {}/{} exists and is not this provisioner's: it is left alone. Delete it, or give the provisioner another name",
                owner.namespace, owner.name
            )));
            return Ok(plan(steps, outcome, extra, POLL));
        }
        if let (Some(hc), Some(true)) = (live_hc, ours) {
            outcome.applied = Some(Check::new(
                status::APPLIED,
                true,
                "HostedClusterKept",
                "the HostedCluster is kept as it is and not updated while a check fails",
            ));
            extra.hosted_cluster = true;
            outcome.hosted_cluster = Some(HostedClusterFacts::from_object(&hc.data));
        }
        extra.kubeconfig = p
            .status
            .as_ref()
            .is_some_and(|s| s.kube_config_secret_ref.is_some());
        return Ok(plan(steps, outcome, extra, SETTLE_INVALID));
    };
    let Ok(secrets) = &validated.secrets else {
        return Err(Error::Render(
            "provisioning was read for Secrets that did not check out".into(),
        ));
    };

    // Everything checks out: make the objects.
    let mut requeue = RESYNC;
    let [pull, ssh] = render::secret_copies(owner, &secrets.pull_secret, &secrets.ssh_key);
    steps.push(Step::new(Write::Secret(Box::new(pull)), OnRefusal::Stop));
    steps.push(Step::new(Write::Secret(Box::new(ssh)), OnRefusal::Stop));
    steps.push(Step::new(Write::EtcdKey, OnRefusal::Stop));
    if let Publishing::LoadBalancer { vip } = checked.publishing {
        let check = metal_lb_steps(owner, settings, vip, reads.metal_lb.as_ref(), &mut steps)?;
        if check.reason == "MetalLBNotInstalled" {
            requeue = SHORT_POLL;
        }
        outcome.metal_lb = Some(check);
    }
    let node = match (&checked.publishing, &reads.node_address) {
        (Publishing::NodePort, Some(Ok(address))) => Some(address.as_str()),
        (Publishing::NodePort, Some(Err(check))) => {
            outcome.applied = Some(check.clone());
            outcome.hosted_cluster = live_hc.map(|h| HostedClusterFacts::from_object(&h.data));
            return Ok(plan(steps, outcome, extra, POLL));
        }
        (Publishing::NodePort, None) => {
            return Err(Error::Render(
                "NodePort publishing was decided without the node read".into(),
            ))
        }
        (Publishing::LoadBalancer { .. }, _) => None,
    };
    let desired_hc =
        render::desired_hosted_cluster(owner, &p.spec, &checked, live_hc.map(|h| &h.data), node);
    let facts = facts_after_apply(&desired_hc, live_hc);
    steps.push(
        Step::new(
            Write::Foreign {
                resource: hosted_cluster_resource(),
                desired: Box::new(to_dynamic(desired_hc)?),
                live: live_hc.cloned().map(Box::new),
                rewritten: None,
            },
            OnRefusal::Stop,
        )
        .then(Then::HostedClusterMade {
            provisioned_spec: extra
                .provisioned_spec
                .clone()
                .unwrap_or_else(|| spec::immutable_part(&p.spec)),
        }),
    );
    // The NodePool follows the control plane's history alone: the hosted
    // cluster's version progressing does not hold it back.
    let rollout = status::rollout(&p.spec.ocp_release_image, &facts, false);
    let desired_np = render::desired_node_pool(
        owner,
        &p.spec.ocp_release_image,
        rollout,
        reads.live_np.as_ref().map(|np| &np.data),
    );
    steps.push(Step::new(
        Write::Foreign {
            resource: node_pool_resource(),
            desired: Box::new(to_dynamic(desired_np)?),
            live: reads.live_np.clone().map(Box::new),
            rewritten: None,
        },
        OnRefusal::Stop,
    ));
    outcome.applied = Some(Check::new(
        status::APPLIED,
        true,
        "HostedClusterApplied",
        format!(
            "HostedCluster and NodePool {}/{} are applied",
            owner.namespace, owner.name
        ),
    ));
    if rollout == Rollout::Upgrading {
        // HyperShift reports progress in status, which the watch delivers;
        // the poll is the backstop.
        requeue = requeue.min(POLL);
    }
    let mut plan = plan(steps, outcome, extra, requeue);
    if let (Some(dpu), Some(kubeconfig)) = (&validated.dpu, &reads.kubeconfig) {
        let check = kubeconfig_steps(owner, dpu, kubeconfig, &mut plan.steps);
        plan.extra.kubeconfig = check.status;
        plan.outcome.kubeconfig = Some(check);
        // An upgrade holds the DPU template back until it is over: the
        // control plane on the new release and the hosted cluster's
        // version no longer progressing.
        let upgrade = status::rollout(
            &p.spec.ocp_release_image,
            &facts,
            plan.outcome.was_upgrading,
        );
        if upgrade == Rollout::Upgrading {
            plan.outcome.ignition = Some(withdraw_template(p, dpu, &mut plan.steps));
        } else if plan.extra.kubeconfig && facts.is("Available", "True") {
            let os_image = p
                .spec
                .machine_os_url
                .clone()
                .filter(|u| !u.is_empty())
                .or_else(|| plan.extra.blue_field_image.clone());
            let secrets_digest = ign::secrets_digest(&secrets.pull_secret, &secrets.ssh_key);
            let check = ignition_steps(
                p,
                &facts,
                rollout,
                (os_image, secrets_digest),
                reads.ignition.as_ref(),
                &mut plan,
            );
            plan.ignition_follows_kubeconfig = true;
            if !check.status {
                plan.requeue = plan.requeue.min(POLL);
            }
            plan.outcome.ignition = Some(check);
        }
    }
    plan.outcome.hosted_cluster = Some(facts);
    Ok(plan)
}

/// MetalLB's pool and advertisement for the VIP, or why not.
fn metal_lb_steps(
    owner: &Owner,
    settings: &BridgeSettings,
    vip: std::net::IpAddr,
    read: Option<&MetalLbRead>,
    steps: &mut Vec<Step>,
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
    let Some(MetalLbRead::Live {
        pool: live_pool,
        l2: live_l2,
    }) = read
    else {
        return no(
            "MetalLBNotInstalled",
            "the MetalLB APIs (ipaddresspools, l2advertisements.metallb.io) are not installed"
                .into(),
        );
    };
    let (pool, l2) = render::metal_lb(owner, ns, vip);
    for (resource, desired, live, failed) in [
        (
            ip_address_pool_resource(),
            pool,
            live_pool,
            "CreatingIPAddressPool",
        ),
        (
            l2_advertisement_resource(),
            l2,
            live_l2,
            "L2AdvertisementFailed",
        ),
    ] {
        let name = desired["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if let Some(l) = live {
            if !render::labelled_ours(&l.metadata, owner) {
                return no(failed, format!("{} {ns}/{name} exists and was not made for this provisioner (labels {} and {})", resource.kind, render::NAME_LABEL, render::NAMESPACE_LABEL));
            }
        }
        let rewritten = Note::normal(
            "MetalLBDriftCorrected",
            format!("Corrected spec drift in {} {ns}/{name}", resource.kind),
        );
        steps.push(
            Step::new(
                Write::Foreign {
                    resource,
                    desired: Box::new(to_dynamic(desired)?),
                    live: live.clone(),
                    rewritten: Some(rewritten),
                },
                OnRefusal::Fail {
                    type_: status::METALLB_CONFIGURED,
                    reason: failed,
                },
            )
            .needs(status::METALLB_CONFIGURED),
        );
    }
    Ok(Check::new(
        status::METALLB_CONFIGURED,
        true,
        "MetalLBReady",
        format!("{vip} is announced from IPAddressPool {ns}/{}", owner.name),
    ))
}

/// HyperShift's admin kubeconfig copied into the DPUCluster's namespace
/// and named in the DPUCluster.
fn kubeconfig_steps(
    owner: &Owner,
    dpu: &DynamicObject,
    read: &KubeconfigRead,
    steps: &mut Vec<Step>,
) -> Check {
    let no = |reason: &str, message: String| {
        Check::new(status::KUBECONFIG_INJECTED, false, reason, message)
    };
    let name = owner.admin_kubeconfig_name();
    let Some(kubeconfig) = &read.source else {
        return no(
            "KubeconfigPending",
            format!(
                "waiting for HyperShift to write Secret {}/{name} (key kubeconfig)",
                owner.namespace
            ),
        );
    };
    let dpu_ns = dpu.metadata.namespace.clone().unwrap_or_default();
    let dpu_name = dpu.metadata.name.clone().unwrap_or_default();
    let copy = match &read.copy {
        None => status::Copy::Missing,
        Some(v) if v == kubeconfig => status::Copy::Current,
        Some(_) => status::Copy::Stale,
    };
    let field = dpu.data.pointer("/spec/kubeconfig").and_then(Value::as_str);
    match status::injection(copy, field, &name) {
        status::Injection::Conflict(other) => {
            return no("InjectionFailed", format!("DPUCluster {dpu_ns}/{dpu_name} already names kubeconfig Secret {other:?}, and the field cannot change once set; re-create the DPUCluster, or delete the provisioner that set it"));
        }
        status::Injection::Nothing => {}
        status::Injection::Act {
            write_secret,
            set_field,
        } => {
            if write_secret {
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
                let secret = render::injected_kubeconfig(owner, &dpu_ns, kubeconfig);
                steps.push(
                    Step::new(Write::Secret(Box::new(secret)), OnRefusal::Retry).noting(note),
                );
            }
            if set_field {
                steps.push(
                    Step::new(
                        Write::MergePatch {
                            resource: dpu_cluster_resource(),
                            namespace: dpu_ns.clone(),
                            name: dpu_name.clone(),
                            patch: json!({"spec": {"kubeconfig": name}}),
                        },
                        OnRefusal::Fail {
                            type_: status::KUBECONFIG_INJECTED,
                            reason: "InjectionFailed",
                        },
                    )
                    .noting(Note::normal(
                        "DPUClusterUpdated",
                        format!(
                            "DPUCluster {dpu_ns}/{dpu_name} updated with kubeconfig reference {name}"
                        ),
                    )),
                );
            }
        }
    }
    Check::new(
        status::KUBECONFIG_INJECTED,
        true,
        "Injected",
        format!("Secret {dpu_ns}/{name} (key super-admin.conf) is named in the DPUCluster"),
    )
}

/// During an upgrade the published template is for the old release: a DPU
/// provisioned from it would boot the release being left. It is deleted,
/// as the Go operator does at the start of an upgrade and as DPF's upgrade
/// script checks, and made again when the upgrade is over.
fn withdraw_template(p: &DPFHCPProvisioner, dpu: &DynamicObject, steps: &mut Vec<Step>) -> Check {
    let dpu_ns = dpu.metadata.namespace.clone().unwrap_or_default();
    let name = ign::configmap_name(dpu.metadata.name.as_deref().unwrap_or_default());
    steps.push(Step::new(
        Write::WithdrawTemplate {
            namespace: dpu_ns.clone(),
            name: name.clone(),
        },
        OnRefusal::Retry,
    ));
    Check::new(
        status::IGNITION_CONFIGURED,
        false,
        "ReleaseImageUpdated",
        format!(
            "ConfigMap {dpu_ns}/{name} is withdrawn during the upgrade to {}; it is made again once the control plane has rolled it out and the hosted cluster's version stopped progressing",
            p.spec.ocp_release_image
        ),
    )
}

/// IgnitionConfigured: the boot template is published and made from what
/// the provisioner, its DPUDeployment, DPUFlavor and the DPFOperatorConfig
/// say now, or is made again when it is missing, stale or first looked at
/// by this process.
fn ignition_steps(
    p: &DPFHCPProvisioner,
    facts: &HostedClusterFacts,
    rollout: Rollout,
    (os_image, secrets_digest): (Option<String>, String),
    read: Option<&Result<IgnitionSource, Check>>,
    plan: &mut Plan,
) -> Check {
    let check = |ok: bool, reason: &str, message: String| {
        Check::new(status::IGNITION_CONFIGURED, ok, reason, message)
    };
    let Some(os_image) = os_image else {
        return check(false, "MachineOSURLMissing", "no machineOSURL and no BlueField image found for the release: see BlueFieldContainerImageAvailable".into());
    };
    let source = match read {
        Some(Ok(source)) => source,
        Some(Err(failed)) => {
            if failed.reason == "DependencyDeleted" {
                // A template built from a DPUDeployment or flavor that is
                // gone must not boot new DPUs.
                let r = &p.spec.dpu_cluster_ref;
                plan.steps.push(Step::new(
                    Write::WithdrawTemplate {
                        namespace: r.namespace.clone(),
                        name: ign::configmap_name(&r.name),
                    },
                    OnRefusal::Retry,
                ));
                return Check {
                    message: format!("{}; the DPU boot template is withdrawn", failed.message),
                    ..failed.clone()
                };
            }
            return failed.clone();
        }
        None => {
            return check(
                false,
                "IgnitionGenerationFailed",
                "the boot template's inputs were not read".into(),
            )
        }
    };
    let mut inputs = source.inputs.clone();
    inputs.os_image = os_image.clone();
    inputs.secrets_digest = Some(secrets_digest);
    let name = ign::configmap_name(&inputs.dpu_cluster);
    let dpu_ns = inputs.dpu_cluster_namespace.clone();
    plan.ignition_looked_at = true;
    let failed_before = previous_is(p, status::IGNITION_CONFIGURED, |c| {
        c.reason == "IgnitionGenerationFailed"
    });
    let why = ign::stale(source.published.as_ref(), &inputs)
        .or(source.first_look.then_some("OperatorRestarted"))
        .or(failed_before.then_some("IgnitionGenerationFailed"));
    let Some(why) = why else {
        return check(
            true,
            "IgnitionGenerated",
            format!(
                "ConfigMap {dpu_ns}/{name} holds the ignition for {} with OS image {os_image}",
                inputs.release_image
            ),
        );
    };
    if why == "BFBAnnotationUpdated" {
        // DPF matches templates to BFBs by the annotation; the content
        // does not depend on it, so only the annotation is written.
        let annotations = inputs.bfb_annotations();
        let bfb = inputs
            .bfb
            .as_ref()
            .map_or("none".to_string(), |(n, ns)| format!("{ns}/{n}"));
        plan.steps.push(
            Step::new(
                Write::MergePatch {
                    resource: ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                    namespace: dpu_ns.clone(),
                    name: name.clone(),
                    patch: json!({"metadata": {"annotations": annotations}}),
                },
                OnRefusal::Fail {
                    type_: status::IGNITION_CONFIGURED,
                    reason: "IgnitionGenerationFailed",
                },
            )
            .needs(status::KUBECONFIG_INJECTED)
            .noting(Note::normal(
                "BFBAnnotationUpdated",
                format!("Ignition ConfigMap BFB annotation updated to {bfb}"),
            )),
        );
        return check(
            true,
            "IgnitionGenerated",
            format!(
                "ConfigMap {dpu_ns}/{name} holds the ignition for {} with OS image {os_image} (BFB annotation updated to {bfb})",
                inputs.release_image
            ),
        );
    }
    // A new release's ignition is served once its control plane is on it.
    if why == "ReleaseImageUpdated" && rollout != Rollout::Done {
        return check(
            false,
            why,
            format!(
                "waiting for the control plane to roll out {} before making the ignition again",
                inputs.release_image
            ),
        );
    }
    let was_configured = previous_is(p, status::IGNITION_CONFIGURED, |c| c.status == "True");
    plan.notes
        .extend(super::events::regeneration_note(why, was_configured));
    let release = inputs.release_image.clone();
    plan.steps.push(
        Step::new(
            Write::PublishIgnition(Box::new(IgnitionJob {
                inputs,
                flavor: source.flavor.clone(),
                high_speed_mtu: source.high_speed_mtu,
                bfb_registry: source.bfb_registry.clone(),
                ignition_endpoint: facts.ignition_endpoint.clone(),
                why,
            })),
            OnRefusal::Fail {
                type_: status::IGNITION_CONFIGURED,
                reason: "IgnitionGenerationFailed",
            },
        )
        .needs(status::KUBECONFIG_INJECTED)
        .noting(Note::normal(
            "IgnitionConfigured",
            format!("Ignition ConfigMap {name} configured successfully"),
        )),
    );
    check(true, "IgnitionGenerated", format!("ConfigMap {dpu_ns}/{name} holds the ignition for {release} with OS image {os_image} (made again: {why})"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    const OLD: &str = "quay.io/openshift-release-dev/ocp-release:4.18.0-x86_64";
    const PULL_SECRET: &[u8] = br#"{"auths":{}}"#;
    const SSH_KEY: &[u8] = b"ssh-ed25519 AAAA";

    fn provisioner(spec: super::super::crd::DPFHCPProvisionerSpec) -> DPFHCPProvisioner {
        let mut p = DPFHCPProvisioner::new("prod", spec);
        p.metadata.namespace = Some("dpf".into());
        p.metadata.uid = Some("uid-1".into());
        p.metadata.finalizers = Some(vec![super::super::context::FINALIZER.into()]);
        p
    }

    fn sample() -> DPFHCPProvisioner {
        provisioner(crate::dpf::spec::tests::sample())
    }

    fn settings() -> BridgeSettings {
        BridgeSettings::resolve(None, "causeway")
    }

    fn dynamic(v: Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    fn dpu_cluster(kubeconfig: Option<&str>) -> DynamicObject {
        dynamic(json!({
            "apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPUCluster",
            "metadata": {"name": "my-dpucluster", "namespace": "dpu-clusters"},
            "spec": {"type": "static", "kubeconfig": kubeconfig},
        }))
    }

    fn validated(secrets_ok: bool) -> Validated {
        Validated {
            dpu_checks: vec![
                Check::new(status::DPU_CLUSTER_MISSING, false, "DPUClusterFound", ""),
                Check::new(status::CLUSTER_TYPE_VALID, true, "ClusterTypeValid", ""),
                Check::new(status::DPU_CLUSTER_IN_USE, false, "DPUClusterAvailable", ""),
            ],
            dpu: Some(dpu_cluster(None)),
            secrets: if secrets_ok {
                Ok(SecretData {
                    pull_secret: PULL_SECRET.to_vec(),
                    ssh_key: SSH_KEY.to_vec(),
                })
            } else {
                Err(Check::new(
                    status::SECRETS_VALID,
                    false,
                    "PullSecretMissing",
                    "gone",
                ))
            },
            prerequisites: Check::new(status::PREREQUISITES, true, "AllInstalled", ""),
            blue_field: Some((
                Check::new(status::BLUEFIELD_IMAGE_FOUND, true, "ImageFound", ""),
                Some("quay.io/bf:4.19".into()),
            )),
        }
    }

    /// A HostedCluster controlled by `uid`, whose control plane completed
    /// the releases in `history` (newest first) and is `available`.
    fn hosted_cluster(uid: &str, history: &[&str], available: bool) -> DynamicObject {
        let history: Vec<Value> = history
            .iter()
            .map(|image| json!({"state": "Completed", "image": image, "version": "4.x"}))
            .collect();
        dynamic(json!({
            "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "HostedCluster",
            "metadata": {"name": "prod", "namespace": "dpf", "ownerReferences": [{
                "apiVersion": "provisioning.dpu.hcp.io/v1alpha1", "kind": "DPFHCPProvisioner",
                "name": "prod", "uid": uid, "controller": true}]},
            "spec": {"release": {"image": history.first().map(|h| h["image"].clone())}},
            "status": {
                "conditions": [{"type": "Available", "status": if available {"True"} else {"False"}}],
                "ignitionEndpoint": "ignition.example:443",
                "version": {"history": history},
            },
        }))
    }

    fn flavor() -> Flavor {
        Flavor::from_object(&json!({
            "apiVersion": "provisioning.dpu.nvidia.com/v1alpha1", "kind": "DPUFlavor",
            "metadata": {"name": "plain", "namespace": "dpf-operator-system"},
            "spec": {"dpuMode": "dpu"},
        }))
        .unwrap()
    }

    fn ignition_source(
        p: &DPFHCPProvisioner,
        published_with: Option<&str>,
        first_look: bool,
    ) -> IgnitionSource {
        let inputs = Inputs {
            dpu_cluster: "my-dpucluster".into(),
            dpu_cluster_namespace: "dpu-clusters".into(),
            release_image: p.spec.ocp_release_image.clone(),
            flavor: Some(("plain".into(), "dpf-operator-system".into())),
            content_digest: Some("digest".into()),
            ..Default::default()
        };
        let published = published_with.map(|os| {
            Inputs {
                os_image: os.into(),
                secrets_digest: Some(ign::secrets_digest(PULL_SECRET, SSH_KEY)),
                ..inputs.clone()
            }
            .annotations()
        });
        IgnitionSource {
            inputs,
            flavor: flavor(),
            high_speed_mtu: None,
            published,
            first_look,
            bfb_registry: None,
        }
    }

    fn reads() -> ProvisioningReads {
        ProvisioningReads {
            metal_lb: Some(MetalLbRead::Live {
                pool: None,
                l2: None,
            }),
            node_address: None,
            live_np: None,
            kubeconfig: Some(KubeconfigRead {
                source: Some(b"admin".to_vec()),
                copy: None,
            }),
            ignition: None,
        }
    }

    fn observed(live_hc: Option<DynamicObject>, reads: Option<ProvisioningReads>) -> Observed {
        Observed {
            live_hc,
            validated: Some(validated(true)),
            provisioning: reads,
        }
    }

    fn run(p: &DPFHCPProvisioner, o: &Observed) -> Plan {
        decide(p, &Owner::of(p).unwrap(), &settings(), o).unwrap()
    }

    /// Each step as a short name: the kind written, or what is done.
    fn writes(plan: &Plan) -> Vec<String> {
        plan.steps
            .iter()
            .map(|s| match &s.write {
                Write::AddFinalizer => "finalizer".to_string(),
                Write::Secret(secret) => {
                    format!("Secret {}", secret.metadata.name.clone().unwrap())
                }
                Write::EtcdKey => "etcd key".into(),
                Write::Foreign { resource, .. } => resource.kind.clone(),
                Write::MergePatch {
                    resource, patch, ..
                } => format!("patch {} {patch}", resource.kind),
                Write::WithdrawTemplate { name, .. } => format!("withdraw {name}"),
                Write::PublishIgnition(job) => format!("publish ({})", job.why),
            })
            .collect()
    }

    fn reason(c: &Option<Check>) -> &str {
        c.as_ref().map_or("-", |c| c.reason.as_str())
    }

    #[test]
    fn an_invalid_spec_writes_nothing_but_the_finalizer() {
        let mut spec = crate::dpf::spec::tests::sample();
        spec.base_domain = "not a domain".into();
        let mut p = provisioner(spec);
        p.metadata.finalizers = None;
        let plan = run(&p, &Observed::default());
        assert_eq!(writes(&plan), ["finalizer"]);
        let spec_valid = &plan.outcome.validations[0];
        assert_eq!(
            (spec_valid.type_, spec_valid.status),
            (status::SPEC_VALID, false)
        );
        assert_eq!(plan.requeue, SETTLE_INVALID);
        assert!(plan.outcome.applied.is_none());
    }

    #[test]
    fn a_failed_check_keeps_the_hosted_cluster_as_it_is() {
        let p = sample();
        let o = Observed {
            live_hc: Some(hosted_cluster("uid-1", &[], false)),
            validated: Some(validated(false)),
            provisioning: None,
        };
        let plan = run(&p, &o);
        assert!(writes(&plan).is_empty(), "{:?}", writes(&plan));
        assert_eq!(reason(&plan.outcome.applied), "HostedClusterKept");
        assert!(plan.extra.hosted_cluster);
        assert!(plan.outcome.hosted_cluster.is_some());
        // Another's HostedCluster is neither kept nor reported.
        let o = Observed {
            live_hc: Some(hosted_cluster("someone-else", &[], false)),
            validated: Some(validated(false)),
            provisioning: None,
        };
        let plan = run(&p, &o);
        assert!(plan.outcome.applied.is_none());
        assert!(plan.outcome.hosted_cluster.is_none());
    }

    #[test]
    fn a_hosted_cluster_that_is_not_ours_is_a_conflict_and_left_alone() {
        let p = sample();
        let plan = run(
            &p,
            &observed(Some(hosted_cluster("someone-else", &[], false)), None),
        );
        assert!(writes(&plan).is_empty(), "{:?}", writes(&plan));
        assert_eq!(reason(&plan.outcome.applied), "Conflict");
        assert_eq!(plan.requeue, POLL);
    }

    #[test]
    fn a_valid_provisioner_makes_its_objects_in_order() {
        let p = sample();
        let plan = run(&p, &observed(None, Some(reads())));
        assert_eq!(
            writes(&plan),
            [
                "Secret prod-pull-secret",
                "Secret prod-ssh-key",
                "etcd key",
                "IPAddressPool",
                "L2Advertisement",
                "HostedCluster",
                "NodePool",
                "Secret prod-admin-kubeconfig",
                r#"patch DPUCluster {"spec":{"kubeconfig":"prod-admin-kubeconfig"}}"#,
            ]
        );
        assert_eq!(reason(&plan.outcome.applied), "HostedClusterApplied");
        assert_eq!(reason(&plan.outcome.metal_lb), "MetalLBReady");
        assert_eq!(reason(&plan.outcome.kubeconfig), "Injected");
        // No control plane yet: the template waits.
        assert!(plan.outcome.ignition.is_none());
        // Status names the HostedCluster only once it is written.
        assert!(!plan.extra.hosted_cluster);
        assert!(plan.extra.provisioned_spec.is_none());
        let hc = plan
            .steps
            .iter()
            .find(|s| matches!(s.then, Then::HostedClusterMade { .. }));
        assert!(hc.is_some_and(|s| s.on_refusal == OnRefusal::Stop));
        assert_eq!(plan.requeue, RESYNC);
    }

    #[test]
    fn metal_lb_objects_made_for_something_else_are_left_alone() {
        let p = sample();
        let mut r = reads();
        r.metal_lb = Some(MetalLbRead::Live {
            pool: Some(Box::new(dynamic(json!({
                "apiVersion": "metallb.io/v1beta1", "kind": "IPAddressPool",
                "metadata": {"name": "prod", "namespace": "metallb-system"},
            })))),
            l2: None,
        });
        let plan = run(&p, &observed(None, Some(r)));
        let w = writes(&plan);
        assert!(
            !w.iter()
                .any(|w| w == "IPAddressPool" || w == "L2Advertisement"),
            "{w:?}"
        );
        assert_eq!(reason(&plan.outcome.metal_lb), "CreatingIPAddressPool");
        // The hosted cluster is still made.
        assert!(w.iter().any(|w| w == "HostedCluster"));
    }

    #[test]
    fn metal_lb_not_installed_is_looked_for_again_soon() {
        let p = sample();
        let mut r = reads();
        r.metal_lb = Some(MetalLbRead::NotInstalled);
        let plan = run(&p, &observed(None, Some(r)));
        assert_eq!(reason(&plan.outcome.metal_lb), "MetalLBNotInstalled");
        assert_eq!(plan.requeue, SHORT_POLL);
    }

    #[test]
    fn node_port_without_a_control_plane_node_makes_no_hosted_cluster() {
        let mut spec = crate::dpf::spec::tests::sample();
        spec.control_plane_availability_policy =
            super::super::crd::AvailabilityPolicy::SingleReplica;
        spec.virtual_ip = None;
        let p = provisioner(spec);
        assert_eq!(spec_verdict(&p).0.unwrap().publishing, Publishing::NodePort);
        let mut r = reads();
        r.metal_lb = None;
        r.node_address = Some(Err(Check::new(
            status::APPLIED,
            false,
            "NoControlPlaneNode",
            "",
        )));
        let plan = run(&p, &observed(None, Some(r)));
        assert!(!writes(&plan).iter().any(|w| w == "HostedCluster"));
        assert_eq!(reason(&plan.outcome.applied), "NoControlPlaneNode");
        assert_eq!(plan.requeue, POLL);
    }

    #[test]
    fn an_upgrade_withdraws_the_template_and_holds_the_node_pool_back() {
        let p = sample();
        let mut r = reads();
        r.kubeconfig = Some(KubeconfigRead {
            source: Some(b"admin".to_vec()),
            copy: Some(b"admin".to_vec()),
        });
        r.live_np = Some(dynamic(json!({
            "apiVersion": "hypershift.openshift.io/v1beta1", "kind": "NodePool",
            "metadata": {"name": "prod", "namespace": "dpf"},
            "spec": {"release": {"image": OLD}},
        })));
        let mut o = observed(Some(hosted_cluster("uid-1", &[OLD], true)), Some(r));
        if let Some(v) = o.validated.as_mut() {
            v.dpu = Some(dpu_cluster(Some("prod-admin-kubeconfig")));
        }
        let plan = run(&p, &o);
        let w = writes(&plan);
        let template = ign::configmap_name("my-dpucluster");
        assert!(w.contains(&format!("withdraw {template}")), "{w:?}");
        assert_eq!(reason(&plan.outcome.ignition), "ReleaseImageUpdated");
        assert_eq!(plan.requeue, POLL);
        let np = plan.steps.iter().find_map(|s| match &s.write {
            Write::Foreign {
                resource, desired, ..
            } if resource.kind == "NodePool" => Some(desired.data.clone()),
            _ => None,
        });
        assert_eq!(
            np.unwrap()["spec"]["release"]["image"],
            OLD,
            "workers never run ahead of their control plane"
        );
    }

    /// The template, once the control plane is up: made when missing, at
    /// the first look of a process, or when stale; left alone otherwise.
    #[test]
    fn the_template_is_made_again_exactly_when_it_must_be() {
        let p = sample();
        let wanted = p.spec.ocp_release_image.clone();
        let injected = |source: IgnitionSource| {
            let mut r = reads();
            r.kubeconfig = Some(KubeconfigRead {
                source: Some(b"admin".to_vec()),
                copy: Some(b"admin".to_vec()),
            });
            r.ignition = Some(Ok(source));
            let mut o = observed(Some(hosted_cluster("uid-1", &[&wanted], true)), Some(r));
            if let Some(v) = o.validated.as_mut() {
                v.dpu = Some(dpu_cluster(Some("prod-admin-kubeconfig")));
            }
            run(&p, &o)
        };
        let published = |plan: &Plan| {
            plan.steps.iter().find_map(|s| match &s.write {
                Write::PublishIgnition(job) => Some(job.why),
                _ => None,
            })
        };
        let cases = [
            (None, false, Some("ConfigMapDeleted")),
            (Some("quay.io/bf:4.19"), true, Some("OperatorRestarted")),
            (Some("quay.io/bf:4.18"), false, Some("MachineOSURLChanged")),
            (Some("quay.io/bf:4.19"), false, None),
        ];
        for (published_with, first_look, want) in cases {
            let plan = injected(ignition_source(&p, published_with, first_look));
            assert_eq!(
                published(&plan),
                want,
                "published with {published_with:?}, first look {first_look}"
            );
            assert!(plan.ignition_looked_at);
            let check = plan.outcome.ignition.clone().unwrap();
            assert!(check.status, "{check:?}");
            // Nothing to write: no step needs the kubeconfig.
            assert_eq!(
                writes(&plan)
                    .iter()
                    .filter(|w| w.starts_with("Secret prod-admin"))
                    .count(),
                0
            );
        }
        // A rotated pull secret: made again.
        let mut rotated = ignition_source(&p, Some("quay.io/bf:4.19"), false);
        if let Some(a) = rotated.published.as_mut() {
            a.insert(
                ign::SECRETS_DIGEST_ANNOTATION.into(),
                "before-rotation".into(),
            );
        }
        assert_eq!(published(&injected(rotated)), Some("SecretsChanged"));
        // Another BFB alone: the annotation is patched, nothing made again.
        let mut other_bfb = ignition_source(&p, Some("quay.io/bf:4.19"), false);
        other_bfb.inputs.bfb = Some(("bfb-4.19".into(), "dpf-operator-system".into()));
        let plan = injected(other_bfb);
        assert_eq!(published(&plan), None);
        let w = writes(&plan);
        assert!(
            w.iter()
                .any(|w| w.starts_with("patch ConfigMap") && w.contains("bfb-4.19")),
            "{w:?}"
        );
        assert!(plan
            .steps
            .iter()
            .any(|s| s.notes.iter().any(|n| n.reason == "BFBAnnotationUpdated")));
        // A read that found the DPUDeployment gone is the condition, and
        // the template built from it is withdrawn.
        let mut r = reads();
        r.kubeconfig = Some(KubeconfigRead {
            source: Some(b"admin".to_vec()),
            copy: Some(b"admin".to_vec()),
        });
        r.ignition = Some(Err(Check::new(
            status::IGNITION_CONFIGURED,
            false,
            "DependencyDeleted",
            "",
        )));
        let mut o = observed(Some(hosted_cluster("uid-1", &[&wanted], true)), Some(r));
        if let Some(v) = o.validated.as_mut() {
            v.dpu = Some(dpu_cluster(Some("prod-admin-kubeconfig")));
        }
        let plan = run(&p, &o);
        assert_eq!(reason(&plan.outcome.ignition), "DependencyDeleted");
        let template = ign::configmap_name("my-dpucluster");
        assert!(
            writes(&plan).contains(&format!("withdraw {template}")),
            "{:?}",
            writes(&plan)
        );
        assert_eq!(plan.requeue, POLL);
    }

    #[test]
    fn a_dpu_cluster_naming_another_kubeconfig_is_never_rewritten() {
        let p = sample();
        let mut o = observed(None, Some(reads()));
        if let Some(v) = o.validated.as_mut() {
            v.dpu = Some(dpu_cluster(Some("someone-elses")));
        }
        let plan = run(&p, &o);
        assert!(
            !writes(&plan).iter().any(|w| w.contains("kubeconfig")),
            "{:?}",
            writes(&plan)
        );
        assert_eq!(reason(&plan.outcome.kubeconfig), "InjectionFailed");
        assert!(!plan.extra.kubeconfig);
    }

    /// Once up, the image found is kept and the registry not asked; a
    /// spec edit, or a phase where the Go operator looks, asks again.
    #[test]
    fn a_provisioner_that_is_up_keeps_its_blue_field_image() {
        use super::super::crd::{DPFHCPProvisionerStatus, Phase};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let mut p = sample();
        p.metadata.generation = Some(3);
        let found = |generation: i64| Condition {
            type_: status::BLUEFIELD_IMAGE_FOUND.into(),
            status: "True".into(),
            reason: "ImageFound".into(),
            message: "quay.io/bf:4.19 for OpenShift 4.19.0".into(),
            observed_generation: Some(generation),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        p.status = Some(DPFHCPProvisionerStatus {
            phase: Some(Phase::Ready),
            conditions: vec![found(3)],
            blue_field_container_image: Some("quay.io/bf:4.19".into()),
            ..Default::default()
        });
        let (check, image) = blue_field_kept(&p).unwrap();
        assert_eq!((check.status, image.as_str()), (true, "quay.io/bf:4.19"));
        assert_eq!(check.message, "quay.io/bf:4.19 for OpenShift 4.19.0");
        let mut edited = p.clone();
        edited.metadata.generation = Some(4);
        assert!(blue_field_kept(&edited).is_none(), "a spec edit asks again");
        for phase in [Phase::Pending, Phase::Failed, Phase::GeneratingIgnition] {
            let mut looking = p.clone();
            if let Some(s) = looking.status.as_mut() {
                s.phase = Some(phase);
            }
            assert!(blue_field_kept(&looking).is_none(), "{phase:?}");
        }
        let mut never_found = p.clone();
        if let Some(s) = never_found.status.as_mut() {
            s.blue_field_container_image = None;
        }
        assert!(blue_field_kept(&never_found).is_none());
    }

    /// A registry that does not answer is a note, not a failed check: the
    /// objects are still made.
    #[test]
    fn a_registry_blip_does_not_fail_a_check() {
        let p = sample();
        let mut o = observed(None, Some(reads()));
        if let Some(v) = o.validated.as_mut() {
            v.blue_field = Some((
                Check::new(
                    status::BLUEFIELD_IMAGE_FOUND,
                    false,
                    "RegistryAccessError",
                    "timeout",
                ),
                None,
            ));
        }
        let (validations, _) = validations(spec_verdict(&p).1, o.validated.as_ref());
        assert!(may_provision(&validations, None));
        let plan = run(&p, &o);
        assert!(writes(&plan).iter().any(|w| w == "HostedCluster"));
        assert!(plan
            .outcome
            .notes
            .iter()
            .any(|c| c.reason == "RegistryAccessError"));
    }
}
