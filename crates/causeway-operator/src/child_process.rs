//! Tests whose figure is a process's peak memory run the side under test
//! in a child process of the test binary, alone, so the figure is its own
//! (the attacking clients stay in the parent) and no other test's.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};

/// The variable that tells a re-run test it is the child.
const CHILD: &str = "CAUSEWAY_TEST_CHILD";

/// Whether this process is the child run of `test`.
pub fn is_child(test: &str) -> bool {
    std::env::var(CHILD).as_deref() == Ok(test)
}

/// This test binary again, running only `test` (its path from the crate
/// root, as the harness names it) as the child, with `env`; stdin and
/// stdout piped.
pub fn spawn(test: &str, env: &[(&str, String)]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, test)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The process's peak resident memory so far (VmHWM), in KiB.
pub fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// What follows `prefix` on the first line of the child's stdout that holds
/// it (the harness may have printed the test's name before it on the same
/// line).
pub fn line(out: &mut impl std::io::BufRead, prefix: &str) -> String {
    let mut l = String::new();
    loop {
        l.clear();
        assert!(
            out.read_line(&mut l).unwrap() > 0,
            "the child ended before printing {prefix}"
        );
        if let Some((_, v)) = l.split_once(prefix) {
            return v.trim().to_string();
        }
    }
}
