//! Helm for the suites that install charts for real: the chart copied
//! with the two changes the 1.20 test server needs, and helm and kubectl
//! run against the test cluster with their state kept out of the home
//! directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::SharedCluster;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The chart, copied under `dir` with the two changes the 1.20 server
/// needs; returns the copy's path.
pub fn chart_for_1_20(dir: &Path) -> PathBuf {
    let from = repo_root().join("charts/causeway");
    let to = dir.join("causeway");
    copy_dir(&from, &to);
    let chart_yaml = to.join("Chart.yaml");
    let text = std::fs::read_to_string(&chart_yaml).unwrap();
    assert!(text.contains("kubeVersion: \">=1.27.0-0\""), "{text}");
    std::fs::write(
        &chart_yaml,
        text.replace("kubeVersion: \">=1.27.0-0\"", "kubeVersion: \">=1.20.0-0\""),
    )
    .unwrap();
    for entry in std::fs::read_dir(to.join("templates")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        if text.contains("x-kubernetes-validations") {
            let stripped = without_cel_lines(&text);
            assert!(!stripped.contains("x-kubernetes-validations"));
            std::fs::write(&path, stripped).unwrap();
        }
    }
    to
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A CRD template without its `x-kubernetes-validations` blocks, by lines:
/// the templates hold Helm directives, so they are not YAML to parse. A
/// block is its key line and what follows indented deeper, or at the same
/// depth as list items.
pub fn without_cel_lines(text: &str) -> String {
    let mut out = String::new();
    let mut skipping: Option<usize> = None;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        if let Some(depth) = skipping {
            if !trimmed.is_empty()
                && (indent > depth || (indent == depth && trimmed.starts_with("- ")))
            {
                continue;
            }
            skipping = None;
        }
        if trimmed.starts_with("x-kubernetes-validations:") {
            skipping = Some(indent);
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

pub struct Tools {
    pub helm: PathBuf,
    pub kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Tools {
    pub fn new(c: &SharedCluster) -> Tools {
        Tools {
            helm: c.helm.clone(),
            kubeconfig: c.dir.join("kubeconfig"),
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// helm with its state kept out of the user's home.
    pub fn helm(&self, args: &[&str]) -> Output {
        let h = self.home.path();
        Command::new(&self.helm)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", h.join("cache"))
            .env("HELM_CONFIG_HOME", h.join("config"))
            .env("HELM_DATA_HOME", h.join("data"))
            .output()
            .unwrap()
    }

    pub fn helm_ok(&self, args: &[&str]) -> String {
        let out = self.helm(args);
        assert!(
            out.status.success(),
            "helm {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// kubectl, when the machine has one.
    pub fn kubectl(&self, args: &[&str]) -> Option<Output> {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .ok()
    }
}
