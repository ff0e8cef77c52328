//! Whether a live object already is what the operator wants, so a
//! reconcile in steady state writes nothing. Pure.
//!
//! Two checks, each catching what the other cannot:
//! - every field of the desired object has the same value in the live one
//!   (a subset test: the API server adds defaults and other managers add
//!   fields, neither of which is drift), which catches a field we own
//!   changed by someone else;
//! - the live object carries the hash of the desired object it was last
//!   applied from, which catches a field we used to set and no longer do
//!   (the subset test cannot see a field that is only on the live side).

use std::hash::{Hash, Hasher};

use kube::Resource;
use serde::Serialize;
use serde_json::Value;

/// The annotation holding the hash of what was last applied.
pub const DESIRED_HASH_ANNOTATION: &str = "causeway.io/desired-hash";

/// Sets [`DESIRED_HASH_ANNOTATION`] on `obj` to the hash of the rest of it.
pub fn stamp<K: Resource + Serialize>(obj: &mut K) {
    let meta = obj.meta_mut();
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(DESIRED_HASH_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
    let hash = match serde_json::to_value(&*obj) {
        Ok(value) => hash_of(&value),
        // Typed Kubernetes objects always serialise; were one not to, an
        // empty hash only costs an apply per reconcile.
        Err(_) => String::new(),
    };
    obj.meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(DESIRED_HASH_ANNOTATION.into(), hash);
}

/// The desired-state hash [`stamp`] put on `obj`.
pub fn desired_hash<K: Resource>(obj: &K) -> String {
    obj.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(DESIRED_HASH_ANNOTATION))
        .cloned()
        .unwrap_or_default()
}

fn hash_of(value: &Value) -> String {
    let mut hasher = std::hash::DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Whether `desired` must be applied over `live`.
pub fn needs_apply<K: Serialize>(desired: &K, live: Option<&K>) -> bool {
    let Some(live) = live else { return true };
    match (serde_json::to_value(desired), serde_json::to_value(live)) {
        (Ok(d), Ok(l)) => !contains(&d, &l),
        _ => true,
    }
}

/// An absent field and an empty one are the same to the API server, which
/// drops empty lists and maps of built-in types.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// Whether every field of `desired` is in `live` with the same value.
/// Lists match element by element, each desired element a subset of the
/// live one at the same place, and the lengths equal: an element added by
/// another manager to a list we set is drift too, as our apply would keep
/// only ours in an atomic list.
pub fn contains(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, dv)| match l.get(k) {
            Some(lv) => contains(dv, lv),
            None => is_empty(dv),
        }),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(dv, lv)| contains(dv, lv))
        }
        (d, Value::Null) => is_empty(d),
        (d, l) => d == l,
    }
}

/// The fields under `root` (a top-level field such as `spec`) that managers
/// other than `ours` own and `desired` does not set, as JSON pointers
/// (`/spec/helmChart/values/extra`): what to remove for `root` to be
/// exactly the desired one. Fields the server defaults belong to no
/// manager, so they are never named. Read from `managedFields`' FieldsV1;
/// a list is named whole, and only when `desired` has no such field.
pub fn foreign_fields(
    managed_fields: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry],
    ours: &str,
    root: &str,
    desired: &Value,
) -> Vec<String> {
    let mut out = std::collections::BTreeSet::new();
    for entry in managed_fields {
        if entry.manager.as_deref() == Some(ours) && entry.operation.as_deref() == Some("Apply") {
            continue;
        }
        let Some(fields) = entry.fields_v1.as_ref() else {
            continue;
        };
        if let Some(tree) = fields.0.get(format!("f:{root}")) {
            let path = vec![root.to_string()];
            walk_owned(tree, &path, desired, &mut out);
        }
    }
    out.into_iter().collect()
}

fn pointer(path: &[String]) -> String {
    path.iter()
        .map(|p| format!("/{}", p.replace('~', "~0").replace('/', "~1")))
        .collect()
}

/// Under a field present in `desired` at `path`: the owned children that
/// `desired` lacks.
fn walk_owned(
    tree: &Value,
    path: &[String],
    desired: &Value,
    out: &mut std::collections::BTreeSet<String>,
) {
    let Some(children) = tree.as_object() else {
        return;
    };
    for key in children.keys() {
        // Set members and list items: the list exists in `desired`,
        // whose apply keeps it as ours.
        let Some(name) = key.strip_prefix("f:") else {
            continue;
        };
        let mut child = path.to_vec();
        child.push(name.to_string());
        match desired.pointer(&pointer(&child)) {
            None => {
                out.insert(pointer(&child));
            }
            Some(_) => walk_owned(&children[key], &child, desired, out),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use serde_json::json;

    fn entry(
        manager: &str,
        operation: &str,
        fields: Value,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                fields,
            )),
            ..Default::default()
        }
    }

    #[test]
    fn fields_others_added_under_the_root_are_named_and_ours_are_not() {
        let desired = json!({"spec": {"name": "a", "values": {"image": {"tag": "1"}, "pullSecrets": [{"name": "p"}]}}});
        let managed = [
            entry(
                "us",
                "Apply",
                json!({"f:spec": {"f:name": {}, "f:values": {"f:image": {"f:tag": {}}}}}),
            ),
            // Another writer: a value we set too, one of its own, a whole
            // map of its own, items of a list we set, and metadata.
            entry(
                "kubectl-edit",
                "Update",
                json!({
                    "f:metadata": {"f:labels": {"f:x": {}}},
                    "f:spec": {
                        "f:name": {},
                        "f:values": {
                            "f:extra": {},
                            "f:image": {"f:tag": {}, "f:registry": {}},
                            "f:mine": {".": {}, "f:a": {}},
                            "f:pullSecrets": {"k:{\"name\":\"q\"}": {}},
                        },
                        "f:odd/key": {},
                    },
                }),
            ),
            // Our own earlier Update (not an apply) counts as someone else's.
            entry("us", "Update", json!({"f:spec": {"f:old": {}}})),
        ];
        assert_eq!(
            foreign_fields(&managed, "us", "spec", &desired),
            [
                "/spec/odd~1key",
                "/spec/old",
                "/spec/values/extra",
                "/spec/values/image/registry",
                "/spec/values/mine",
            ]
        );
        assert!(foreign_fields(&managed[..1], "us", "spec", &desired).is_empty());
    }

    #[test]
    fn server_defaults_and_foreign_fields_are_not_drift() {
        let desired = json!({"spec": {"replicas": 1, "template": {"containers": [{"name": "c"}]}}});
        let live = json!({"spec": {"replicas": 1, "revisionHistoryLimit": 10,
            "template": {"containers": [{"name": "c", "imagePullPolicy": "IfNotPresent"}]}},
            "status": {"readyReplicas": 1}});
        assert!(contains(&desired, &live));
    }

    #[test]
    fn a_changed_value_a_missing_field_or_an_extra_element_is_drift() {
        let desired = json!({"data": {"config.yaml": "a"}, "list": [{"n": 1}]});
        assert!(!contains(
            &desired,
            &json!({"data": {"config.yaml": "b"}, "list": [{"n": 1}]})
        ));
        assert!(!contains(
            &desired,
            &json!({"data": {}, "list": [{"n": 1}]})
        ));
        assert!(!contains(
            &desired,
            &json!({"data": {"config.yaml": "a"}, "list": [{"n": 1}, {"n": 2}]})
        ));
        assert!(!contains(
            &desired,
            &json!({"data": {"config.yaml": "a"}, "list": [{"n": 2}]})
        ));
    }

    #[test]
    fn empty_desired_fields_match_absent_ones() {
        assert!(contains(&json!({"a": [], "b": {}, "c": null}), &json!({})));
        assert!(!contains(&json!({"a": [1]}), &json!({})));
    }

    #[test]
    fn the_stamp_changes_with_the_desired_object_and_catches_removed_fields() {
        let mut a = ConfigMap::default();
        a.metadata.name = Some("x".into());
        a.data = Some([("k".to_string(), "v".to_string())].into());
        let mut b = a.clone();
        b.data = None;
        stamp(&mut a);
        stamp(&mut b);
        let ha = &a.metadata.annotations.as_ref().unwrap()[DESIRED_HASH_ANNOTATION];
        let hb = &b.metadata.annotations.as_ref().unwrap()[DESIRED_HASH_ANNOTATION];
        assert_ne!(ha, hb);
        // Live still holds the field b no longer sets: only the hash tells.
        assert!(needs_apply(&b, Some(&a)));
        assert!(!needs_apply(&a, Some(&a.clone())));
        // Stamping twice gives the same hash.
        let mut again = a.clone();
        stamp(&mut again);
        assert_eq!(again, a);
    }
}
