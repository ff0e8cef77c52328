//! What every part of a provisioner's reconcile shares: the context (API
//! client, applier, stores, settings), the timings and the finalizer.

//! The DPF bridge's controller. Per reconcile of one provisioner:
//! - observe: the provisioner and the settings singleton from reflector
//!   stores; the DPUCluster, the Secrets, the HostedCluster and NodePool,
//!   the MetalLB objects, read live;
//! - decide: [`spec`], [`render`] and [`status`], pure;
//! - apply: server-side apply under the operator's field manager, only
//!   where the live object differs from the rendering ([`drift`]), so
//!   drift is undone and a steady state writes nothing; status by apply
//!   on `/status`, only when it changed.
//!
//! Nothing is applied while a check fails: a HostedCluster is never half
//! made from a bad spec. A finalizer deletes, in order, the injected
//! kubeconfig (and the DPUCluster's reference to it), the NodePool, the
//! HostedCluster, the Secret copies and the MetalLB objects.
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

use super::crd::{
    BridgeSettings, DPFHCPProvisioner, DPFHCPProvisionerConfig, DPFHCPProvisionerConfigSpec,
    CONFIG_NAME,
};
use crate::error::Error;
use crate::k8s::apply::Applier;
use crate::k8s::events::publish_about;
use crate::k8s::finalizer as finalizers;
use crate::k8s::metrics::OperatorMetrics;

/// The Go operator's finalizer, so provisioners it made are cleaned up the
/// same way after a migration.
pub const FINALIZER: &str = "dpfhcpprovisioner.provisioning.dpu.hcp.io/finalizer";
/// Polls while something outside the operator's watches is awaited
/// (MetalLB or HyperShift being installed, a deletion finishing).
pub(super) const SHORT_POLL: Duration = Duration::from_secs(5);
pub(super) const POLL: Duration = Duration::from_secs(30);
/// How long the settings of a deleted singleton still hold.
pub(super) const CONFIG_GRACE: Duration = Duration::from_secs(30);
/// The backstop resync of a provisioner whose state is settled.
pub(super) const RESYNC: Duration = Duration::from_secs(300);

pub struct Context {
    pub client: Client,
    pub applier: Applier,
    pub provisioners: Store<DPFHCPProvisioner>,
    /// The bridge settings object; until listed, a reconcile waits
    /// rather than act on the defaults.
    pub configs: crate::k8s::watch::OptionalStore<DPFHCPProvisionerConfig>,
    pub operator_namespace: String,
    /// The settings last seen, and when they went: see [`Context::settings`].
    pub last_config: std::sync::Mutex<Option<(DPFHCPProvisionerConfigSpec, Option<Instant>)>>,
    pub recorder: Option<Recorder>,
    pub metrics: Option<OperatorMetrics>,
    /// ConfigMap `ocp-bluefield-images` in the operator's namespace.
    pub blue_field_images: Store<ConfigMap>,
    pub blue_field: super::bluefield::Resolver,
    /// Provisioners whose ignition was checked since this process started:
    /// the first check regenerates it (OperatorRestarted), per provisioner.
    pub ignition_checked: std::sync::Mutex<std::collections::HashSet<String>>,
}

/// The settings object to use: the live one, else for [`CONFIG_GRACE`]
/// after it went the one last seen. `last` remembers it and when it went.
pub(super) fn remembered(
    live: Option<DPFHCPProvisionerConfigSpec>,
    last: &mut Option<(DPFHCPProvisionerConfigSpec, Option<Instant>)>,
    now: Instant,
) -> Option<DPFHCPProvisionerConfigSpec> {
    match live {
        Some(spec) => {
            *last = Some((spec.clone(), None));
            Some(spec)
        }
        None => {
            let (spec, gone) = last.as_mut()?;
            let since = *gone.get_or_insert(now);
            (now.duration_since(since) < CONFIG_GRACE).then(|| spec.clone())
        }
    }
}

impl Context {
    /// The settings in force. The chart's hook deletes and re-creates the
    /// singleton on every upgrade; for a short while after it goes, the
    /// settings it had still hold, so a `disableMetalLB: true` does not
    /// flip to the default and make MetalLB objects in that moment.
    pub(super) fn settings(&self) -> BridgeSettings {
        let live = self
            .configs
            .store()
            .get(&ObjectRef::new(CONFIG_NAME))
            .map(|c| c.spec.clone());
        let mut last = self
            .last_config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let config = remembered(live, &mut last, Instant::now());
        BridgeSettings::resolve(config.as_ref(), &self.operator_namespace)
    }

    /// While a deleted settings object still holds, how long until it no
    /// longer does. Nothing is watched that changes when the grace ends,
    /// so a reconcile that used the remembered settings must come back
    /// then, or the old settings would linger until the next resync.
    pub(super) fn settings_grace_left(&self) -> Option<Duration> {
        let last = self
            .last_config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        grace_left(last.as_ref(), Instant::now())
    }
}

/// The rest of the grace of a settings object that went at `gone`, just
/// past its end so the next look sees it over; `None` when none runs.
pub(super) fn grace_left(
    last: Option<&(DPFHCPProvisionerConfigSpec, Option<Instant>)>,
    now: Instant,
) -> Option<Duration> {
    let gone = last?.1?;
    let end = gone + CONFIG_GRACE;
    (now < end).then(|| end - now + Duration::from_millis(100))
}

/// The provisioner's own API, in its namespace.
pub(super) fn api_of(ctx: &Context, p: &DPFHCPProvisioner) -> Api<DPFHCPProvisioner> {
    Api::namespaced(ctx.client.clone(), &p.namespace().unwrap_or_default())
}

pub(super) async fn add_finalizer(ctx: &Context, p: &DPFHCPProvisioner) -> Result<(), Error> {
    finalizers::add(&api_of(ctx, p), p, FINALIZER).await
}

pub(super) async fn remove_finalizer(ctx: &Context, p: &DPFHCPProvisioner) -> Result<(), Error> {
    finalizers::remove(&api_of(ctx, p), p, FINALIZER).await
}

/// Publishes `note` about the provisioner.
pub(super) async fn publish_note(ctx: &Context, p: &DPFHCPProvisioner, note: super::events::Note) {
    use kube::runtime::events::EventType;
    let type_ = if note.warning {
        EventType::Warning
    } else {
        EventType::Normal
    };
    publish_about(ctx.recorder.as_ref(), p, type_, &note.reason, note.message).await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_settings_object_holds_for_the_grace_period_only() {
        let t0 = Instant::now();
        let mut last = None;
        assert_eq!(
            remembered(None, &mut last, t0),
            None,
            "never seen: defaults"
        );
        let off = DPFHCPProvisionerConfigSpec {
            disable_metal_lb: Some(true),
            ..Default::default()
        };
        assert_eq!(
            remembered(Some(off.clone()), &mut last, t0),
            Some(off.clone())
        );
        // Deleted (the hook's delete-and-recreate): still in force.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(remembered(None, &mut last, t1), Some(off.clone()));
        assert_eq!(
            remembered(
                None,
                &mut last,
                t1 + CONFIG_GRACE - Duration::from_millis(1)
            ),
            Some(off.clone())
        );
        // Gone for good: the defaults.
        assert_eq!(remembered(None, &mut last, t1 + CONFIG_GRACE), None);
        // Back: live again, and a later deletion starts a new grace.
        assert_eq!(
            remembered(Some(off.clone()), &mut last, t1 + CONFIG_GRACE * 2),
            Some(off.clone())
        );
        assert_eq!(
            remembered(None, &mut last, t1 + CONFIG_GRACE * 3),
            Some(off)
        );
    }

    #[test]
    fn a_running_grace_says_when_to_look_again() {
        let t0 = Instant::now();
        let mut last = None;
        assert_eq!(grace_left(last.as_ref(), t0), None, "never seen");
        let spec = DPFHCPProvisionerConfigSpec::default();
        remembered(Some(spec), &mut last, t0);
        assert_eq!(grace_left(last.as_ref(), t0), None, "live: no grace");
        remembered(None, &mut last, t0);
        let left = grace_left(last.as_ref(), t0 + Duration::from_secs(10)).unwrap();
        assert!(
            left > CONFIG_GRACE - Duration::from_secs(10) && left < CONFIG_GRACE,
            "{left:?}"
        );
        // At the moment it says, the grace is over.
        let then = t0 + Duration::from_secs(10) + left;
        assert_eq!(remembered(None, &mut last, then), None);
        assert_eq!(grace_left(last.as_ref(), then), None);
    }
}
