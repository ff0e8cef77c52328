//! Kubernetes events: published when there is a recorder, and a failure to
//! publish is logged, never an error of the reconcile.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

/// An event about the object `about`.
pub async fn publish_about<K: kube::Resource<DynamicType = ()>>(
    recorder: Option<&Recorder>,
    about: &K,
    type_: EventType,
    reason: &str,
    note: String,
) {
    publish_event(recorder, &about.object_ref(&()), type_, reason, note).await;
}

/// An event about `about`.
pub async fn publish_event(
    recorder: Option<&Recorder>,
    about: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    publish_related_event(recorder, about, None, type_, reason, note).await;
}

/// An event about `about` concerning `related` as well: events with a
/// different `related` object are kept apart rather than counted as a
/// series of one.
pub async fn publish_related_event(
    recorder: Option<&Recorder>,
    about: &ObjectReference,
    related: Option<ObjectReference>,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let Some(recorder) = recorder else {
        return;
    };
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: related,
    };
    if let Err(e) = recorder.publish(&event, about).await {
        tracing::warn!(error = %e, "could not publish an event");
    }
}
