//! The metric names the chart's alerts and dashboards read, and the check
//! that a live `/metrics` scrape exports each of them: an alert on a name
//! no binary exports never fires, and a panel on one stays empty, both
//! silently.
//!
//! The names come from the PrometheusRule template and the dashboard JSON
//! files: every `causeway_...` token there is a metric name (a histogram's
//! `_bucket`, `_sum` and `_count` included).
//!
//! Four tests scrape real processes, each for its share of the names
//! ([`Source`]): `ha_lab` the appliance with every service and HA,
//! `monitoring_kube` the operator with the webhook and its objects,
//! `csr_kube` the operator with a hosted cluster's CSR approver, and
//! `dpu_templates_kube` the operator deciding DPUServiceTemplates.

// Each suite uses a part of this.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/causeway")
}

/// The files whose metric names must exist.
pub fn monitored_files() -> Vec<PathBuf> {
    let mut files = vec![chart().join("templates/prometheusrule.yaml")];
    let dashboards = chart().join("files/dashboards");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dashboards)
        .unwrap_or_else(|e| panic!("{}: {e}", dashboards.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    found.sort();
    assert!(
        !found.is_empty(),
        "no dashboards in {}",
        dashboards.display()
    );
    files.extend(found);
    files
}

/// Every `causeway_[a-z0-9_]+` token of `text`.
pub fn names_in(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("causeway_") {
        let start = i + at;
        let preceded = start > 0 && {
            let b = bytes[start - 1];
            b.is_ascii_alphanumeric() || b == b'_'
        };
        let mut end = start + "causeway_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase()
                || bytes[end].is_ascii_digit()
                || bytes[end] == b'_')
        {
            end += 1;
        }
        if !preceded {
            names.insert(text[start..end].to_string());
        }
        i = end;
    }
    names
}

/// Every name the alerts and dashboards read, with the file it is in.
pub fn monitored_names() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for file in monitored_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for name in names_in(&text) {
            out.push((name, file.clone()));
        }
    }
    assert!(
        !out.is_empty(),
        "no metric names in the chart's monitoring files"
    );
    out
}

/// Which test scrapes a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The appliance (`ha_lab`).
    Appliance,
    /// The operator, but for the CSR approver (`monitoring_kube`).
    Operator,
    /// The operator's CSR approver (`csr_kube`).
    CsrApprover,
    /// The operator's DPUServiceTemplate decisions (`dpu_templates_kube`).
    DpuTemplates,
}

pub const ALL_SOURCES: [Source; 4] = [
    Source::Appliance,
    Source::Operator,
    Source::CsrApprover,
    Source::DpuTemplates,
];

pub fn source_of(name: &str) -> Source {
    if name.starts_with("causeway_operator_csr_") {
        Source::CsrApprover
    } else if name.starts_with("causeway_operator_dpu_service_templates_") {
        Source::DpuTemplates
    } else if name.starts_with("causeway_operator_") {
        Source::Operator
    } else {
        Source::Appliance
    }
}

/// The series names a scrape can be asked for: each family's name, and a
/// histogram's `_bucket`, `_sum` and `_count`.
pub fn exported(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        let mut words = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        {
            names.insert(name.to_string());
            if kind == "histogram" || kind == "summary" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    names
}

/// Panics naming every monitored name of `source` that `scrapes` (the
/// processes' `/metrics`, together) do not export.
pub fn assert_exported(source: Source, scrapes: &[&str]) {
    let exported: BTreeSet<String> = scrapes.iter().flat_map(|s| exported(s)).collect();
    let wanted: Vec<(String, PathBuf)> = monitored_names()
        .into_iter()
        .filter(|(n, _)| source_of(n) == source)
        .collect();
    assert!(!wanted.is_empty(), "{source:?}: no monitored names");
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(n, _)| !exported.contains(n))
        .map(|(n, f)| format!("{n} (in {})", f.display()))
        .collect();
    assert!(
        missing.is_empty(),
        "{source:?}: named by an alert or a dashboard but not exported:\n  {}",
        missing.join("\n  ")
    );
    eprintln!("{source:?}: all {} monitored names exported", wanted.len());
}
