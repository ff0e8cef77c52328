//! Structural checks of an Ignition config, spec 3.x, judged by the 3.4.0
//! schema: what would make Ignition refuse the config on the DPU, found
//! before it is published. Every problem is reported, not just the first.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::dpf::ignition::data_url_bytes;

/// URL schemes Ignition 3.4 fetches from.
const SCHEMES: &[&str] = &[
    "data:", "http://", "https://", "tftp://", "s3://", "gs://", "arn:",
];
const UNIT_SUFFIXES: &[&str] = &[
    ".service",
    ".socket",
    ".device",
    ".mount",
    ".automount",
    ".swap",
    ".target",
    ".path",
    ".timer",
    ".slice",
    ".scope",
];

/// The problems of `ignition`, each with its JSON path; empty when valid.
pub fn problems(ignition: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match ignition
        .pointer("/ignition/version")
        .and_then(Value::as_str)
    {
        None => out.push("ignition.version: missing".to_string()),
        Some(v) => {
            let mut parts = v.split('.').map(str::parse::<u32>);
            let major = parts.next().and_then(Result::ok);
            let rest_ok = parts.all(|p| p.is_ok());
            if major != Some(3) || !rest_ok || v.split('.').count() != 3 {
                out.push(format!(
                    "ignition.version: {v:?} is not supported; only spec 3.x is"
                ));
            }
        }
    }
    let mut paths = BTreeSet::new();
    for kind in ["files", "directories", "links"] {
        for (i, entry) in list(ignition, &format!("/storage/{kind}"))
            .iter()
            .enumerate()
        {
            let at = format!("storage.{kind}[{i}]");
            let path = entry["path"].as_str().unwrap_or_default();
            if !path.starts_with('/') {
                out.push(format!("{at}.path: {path:?} is not absolute"));
            } else if !paths.insert(path.to_string()) {
                out.push(format!("{at}.path: duplicate path {path}"));
            }
            if let Some(mode) = entry.get("mode").filter(|m| !m.is_null()) {
                if mode.as_u64().is_none_or(|m| m > 0o7777) {
                    out.push(format!("{at}.mode: {mode} is not a file mode"));
                }
            }
            if kind != "files" {
                continue;
            }
            let resources = entry
                .get("contents")
                .into_iter()
                .map(|c| ("contents".to_string(), c))
                .chain(
                    entry["append"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .enumerate()
                        .map(|(j, c)| (format!("append[{j}]"), c)),
                );
            for (field, resource) in resources {
                resource_problems(&format!("{at}.{field}"), resource, &mut out);
            }
        }
    }
    let mut units = BTreeSet::new();
    for (i, unit) in list(ignition, "/systemd/units").iter().enumerate() {
        let at = format!("systemd.units[{i}]");
        let name = unit["name"].as_str().unwrap_or_default();
        if !UNIT_SUFFIXES
            .iter()
            .any(|s| name.len() > s.len() && name.ends_with(s))
        {
            out.push(format!("{at}.name: {name:?} is not a unit name"));
        } else if !units.insert(name.to_string()) {
            out.push(format!("{at}.name: duplicate unit {name}"));
        }
        let mut dropins = BTreeSet::new();
        for (j, d) in unit["dropins"].as_array().into_iter().flatten().enumerate() {
            let dname = d["name"].as_str().unwrap_or_default();
            if !dname.ends_with(".conf") {
                out.push(format!(
                    "{at}.dropins[{j}].name: {dname:?} is not a drop-in name"
                ));
            } else if !dropins.insert(dname.to_string()) {
                out.push(format!("{at}.dropins[{j}].name: duplicate drop-in {dname}"));
            }
        }
    }
    out
}

/// The list at `pointer`; empty when there is none.
pub(super) fn list<'a>(ignition: &'a Value, pointer: &str) -> &'a [Value] {
    ignition
        .pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn resource_problems(at: &str, resource: &Value, out: &mut Vec<String>) {
    match resource.get("compression").and_then(Value::as_str) {
        None | Some("") | Some("gzip") => {}
        Some(c) => out.push(format!("{at}.compression: {c:?} is not supported")),
    }
    let Some(source) = resource.get("source").and_then(Value::as_str) else {
        return;
    };
    if !SCHEMES.iter().any(|s| source.starts_with(s)) {
        out.push(format!("{at}.source: unsupported URL scheme"));
    } else if source.starts_with("data:") {
        if let Err(why) = data_url_bytes(source, false) {
            out.push(format!("{at}.source: {why}"));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(files: Value, units: Value) -> Value {
        json!({"ignition": {"version": "3.2.0"}, "storage": {"files": files}, "systemd": {"units": units}})
    }

    #[test]
    fn a_valid_config_has_no_problems() {
        let ign = config(
            json!([{"path": "/a", "mode": 420, "contents": {"source": "data:,x"}, "append": [{"source": "data:;base64,eA==", "compression": "gzip"}]}]),
            json!([{"name": "a.service", "enabled": true, "dropins": [{"name": "10-a.conf"}]}]),
        );
        assert_eq!(problems(&ign), Vec::<String>::new());
    }

    #[test]
    fn a_duplicate_path_is_fatal() {
        let ign = config(
            json!([{"path": "/a", "contents": {"source": "data:,x"}}, {"path": "/a"}]),
            json!([]),
        );
        assert_eq!(problems(&ign), ["storage.files[1].path: duplicate path /a"]);
        // Files, directories and links share one namespace.
        let mut ign = config(json!([{"path": "/d"}]), json!([]));
        ign["storage"]["directories"] = json!([{"path": "/d"}]);
        assert_eq!(
            problems(&ign),
            ["storage.directories[0].path: duplicate path /d"]
        );
    }

    #[test]
    fn a_duplicate_unit_is_fatal() {
        let ign = config(
            json!([]),
            json!([{"name": "a.service"}, {"name": "b.service"}, {"name": "a.service"}]),
        );
        assert_eq!(
            problems(&ign),
            ["systemd.units[2].name: duplicate unit a.service"]
        );
    }

    #[test]
    fn only_spec_3_is_accepted() {
        for v in ["2.2.0", "4.0.0", "3.x.0", "3"] {
            let mut ign = config(json!([]), json!([]));
            ign["ignition"]["version"] = json!(v);
            assert_eq!(problems(&ign).len(), 1, "{v}");
            assert!(problems(&ign)[0].contains("only spec 3.x"), "{v}");
        }
        assert_eq!(problems(&json!({})), ["ignition.version: missing"]);
    }

    #[test]
    fn bad_files_are_named() {
        let ign = config(
            json!([
                {"path": "rel"},
                {"path": "/m", "mode": 70000},
                {"path": "/c", "contents": {"source": "data:;base64,@@", "compression": "xz"}},
                {"path": "/s", "contents": {"source": "ftp://x"}},
            ]),
            json!([{"name": "noext"}]),
        );
        let p = problems(&ign);
        assert_eq!(p.len(), 6, "{p:?}");
        assert!(p[0].contains("not absolute"));
        assert!(p[1].contains("not a file mode"));
        assert!(p[2].contains("compression"));
        assert!(p[3].contains("base64"));
        assert!(p[4].contains("scheme"));
        assert!(p[5].contains("not a unit name"));
    }
}
