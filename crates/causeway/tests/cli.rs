//! `causeway check` and `causeway leases` as a person runs them.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn causeway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_causeway"))
}

fn repo_file(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

#[test]
fn check_accepts_the_examples() {
    let examples = [
        ("examples/local.yaml", "dhcp, dns"),
        ("examples/vlan.yaml", "dhcp, dns, proxy"),
        ("examples/appliance.yaml", "dhcp, dns, proxy, routing"),
        (
            "examples/appliance-ha.yaml",
            "dhcp, dns, proxy, routing, ha",
        ),
        (
            "examples/appliance-clusters.yaml",
            "dhcp, dns, proxy, routing",
        ),
        (
            "examples/dual-stack.yaml",
            "dhcp, dns, proxy, routing, routerAdvertisements, dhcp6 (leasing)",
        ),
    ];
    // Every example on disk is checked: one added without a line above
    // would otherwise ship unvalidated.
    for entry in std::fs::read_dir(repo_file("examples")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") {
            let rel = format!("examples/{name}");
            assert!(
                examples.iter().any(|(e, _)| *e == rel),
                "{rel} is not in check_accepts_the_examples's list"
            );
        }
    }
    for (example, services) in examples {
        let out = causeway()
            .args(["check", "--config"])
            .arg(repo_file(example))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{example}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("valid; services: {services}"))
        );
    }
}

#[test]
fn check_reports_every_error_with_its_path_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "network: {cidr: 192.168.1.0/24, gateway: 192.168.9.1, address: 192.168.1.2, interface: net1}\n\
         dhcp:\n  subnets:\n    - pools: [{start: 192.168.1.10, end: 192.168.1.300}]\n",
    )
    .unwrap();
    let out = causeway()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("network.gateway: 192.168.9.1 is outside network.cidr 192.168.1.0/24"),
        "{stderr}"
    );
    assert!(
        stderr.contains("dhcp.subnets[0].pools[0].end: 192.168.1.300 is not an IPv4 address"),
        "{stderr}"
    );
    assert!(stderr.contains("2 error(s)"), "{stderr}");
}

/// `clusters:` holds at most 64 hosted clusters (MAX_CLUSTERS): 64
/// validate, 65 are refused with the count.
#[test]
fn check_refuses_more_than_64_clusters() {
    let dir = tempfile::tempdir().unwrap();
    for (count, valid) in [(64, true), (65, false)] {
        let mut text = String::from(
            "network: {cidr: 192.168.0.0/16, address: 192.168.0.2}\nproxy: {}\nclusters:\n",
        );
        for i in 0..count {
            // One worker each, none overlapping, so the count is the only
            // thing wrong.
            text.push_str(&format!(
                "  - {{name: hc{i}, baseDomain: example.com, workers: [192.168.1.{i}]}}\n"
            ));
        }
        let path = dir.path().join(format!("clusters-{count}.yaml"));
        std::fs::write(&path, text).unwrap();
        let out = causeway()
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if valid {
            assert!(out.status.success(), "{count} clusters: {stderr}");
        } else {
            assert_eq!(out.status.code(), Some(1), "{count} clusters: {stderr}");
            assert!(
                stderr.contains("clusters: 65 clusters listed; at most 64 share one VLAN"),
                "{stderr}"
            );
            assert!(stderr.contains("1 error(s)"), "{stderr}");
        }
    }
}

#[test]
fn check_names_a_missing_file() {
    let out = causeway()
        .args(["check", "--config", "/nonexistent/causeway.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/causeway.yaml"));
}

#[test]
fn leases_reads_the_store_as_the_server_would() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("leases.jsonl");
    std::fs::write(
        &store,
        concat!(
            r#"{"ip":"10.0.0.10","client":"01:52:54:00:00:00:01","hw":"52:54:00:00:00:01","state":"active","expires":4000000000,"hostname":"vm1"}"#, "\n",
            r#"{"ip":"10.0.0.11","client":"01:52:54:00:00:00:02","hw":"52:54:00:00:00:02","state":"active","expires":4000000000}"#, "\n",
            r#"{"ip":"10.0.0.11","client":"01:52:54:00:00:00:02","hw":"52:54:00:00:00:02","state":"released","expires":1}"#, "\n",
            r#"{"ip":"10.0.0.12","cli"#,
        ),
    )
    .unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        format!(
            "dhcp:\n  listen: [{{address: '127.0.0.1:6767'}}]\n  leaseFile: {}\n  subnets:\n    - {{cidr: 10.0.0.0/24, serverId: 127.0.0.1}}\n",
            store.display()
        ),
    )
    .unwrap();
    let out = causeway()
        .args(["leases", "--json", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let leases: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let leases = leases.as_array().unwrap();
    assert_eq!(
        leases.len(),
        2,
        "the torn last line is not a lease: {leases:?}"
    );
    assert_eq!(leases[0]["ip"], "10.0.0.10");
    assert_eq!(leases[0]["state"], "active");
    assert_eq!(leases[0]["hostname"], "vm1");
    assert_eq!(leases[1]["state"], "released");

    let out = causeway()
        .args(["leases", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("10.0.0.10") && l.contains("active") && l.contains("vm1")),
        "{table}"
    );
}

/// `causeway leases | head -3`: the reader goes away after a few lines,
/// and the command ends quietly instead of panicking on the closed pipe.
#[test]
fn every_printing_command_ends_quietly_when_its_reader_goes() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("leases.jsonl");
    // More than a pipe holds (64 KiB), so the writes after the reader
    // left do fail.
    let lines: String = (0..4000u32)
        .map(|i| {
            format!(
                "{{\"ip\":\"10.0.{}.{}\",\"client\":\"01:52:54:00:00:{:02x}:{:02x}\",\"hw\":\"52:54:00:00:{:02x}:{:02x}\",\"state\":\"active\",\"expires\":4000000000,\"hostname\":\"host-{i}\"}}\n",
                i / 250,
                i % 250 + 1,
                i / 256,
                i % 256,
                i / 256,
                i % 256
            )
        })
        .collect();
    std::fs::write(&store, lines).unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        format!(
            "dhcp:\n  listen: [{{address: '127.0.0.1:6767'}}]\n  leaseFile: {}\n  subnets:\n    - {{cidr: 10.0.0.0/16, serverId: 127.0.0.1}}\n",
            store.display()
        ),
    )
    .unwrap();
    let leases = ["leases", "--config", config.to_str().unwrap()];
    let json = ["leases", "--json", "--config", config.to_str().unwrap()];
    // A CRD is shorter than a pipe holds: its reader goes before it
    // writes (closed at once, so the write nearly always finds it gone).
    let crd = ["operator", "crd", "dpfhcpprovisioner"];
    for (args, read_first) in [(&leases[..], true), (&json[..], true), (&crd[..], false)] {
        let mut child = causeway()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut reader = BufReader::new(child.stdout.take().unwrap());
        if read_first {
            let mut first = String::new();
            reader.read_line(&mut first).unwrap();
            assert!(!first.is_empty(), "{args:?} printed nothing");
        }
        drop(reader);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "{args:?}: {:?} {stderr}",
            out.status
        );
    }
}

/// A config that is valid but leaves a subnet unreachable (the lab's
/// earlier config: a subnet behind a relay, no `relayAddresses`, an
/// interface listener only) passes, with the subnet named.
#[test]
fn check_names_a_subnet_no_client_can_reach() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "dhcp:\n  listen: [{interface: net1}]\n  subnets:\n    - {cidr: 192.168.100.0/24, interface: net1, serverId: 192.168.100.2}\n    - {cidr: 10.20.0.0/24, serverId: 192.168.100.2}\n",
    )
    .unwrap();
    let out = causeway()
        .args(["check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains(": valid; services: dhcp"), "{stdout}");
    assert!(
        stdout.contains("warning: dhcp.subnets[1] (10.20.0.0/24): no client can reach it"),
        "{stdout}"
    );
    assert!(!stdout.contains("subnets[0]"), "{stdout}");
}

#[test]
fn check_warns_of_an_ha_key_it_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    let example = std::fs::read_to_string(repo_file("examples/appliance-ha.yaml")).unwrap();
    let key = dir.path().join("ha.key");
    let path = dir.path().join("ha.yaml");
    std::fs::write(
        &path,
        example.replace("/etc/causeway/ha.key", key.to_str().unwrap()),
    )
    .unwrap();
    let run = || {
        let out = causeway()
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        run().contains("warning: ha.keyFile"),
        "a missing key is named"
    );
    std::fs::write(&key, "short\n").unwrap();
    assert!(
        run().contains("5 bytes; the shared key needs at least 16"),
        "a short key is named"
    );
    std::fs::write(&key, "0123456789abcdef0123\n").unwrap();
    assert!(!run().contains("warning"), "a good key passes quietly");
}
