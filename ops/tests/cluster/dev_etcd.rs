//! `shoalctl dev --etcd`: separate processes on one etcd, driven by hand
//! with the same `shoalctl` commands an operator uses; Ctrl-C stops them
//! all.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn shoalctl(endpoint: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_shoalctl")).arg("--endpoint").arg(endpoint).args(args).output().expect("run shoalctl");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "shoalctl {args:?} failed:\n{text}");
    text
}

#[test]
fn etcd_shoalctl_dev_runs_a_process_cluster_that_moves_shards() {
    let Some(etcd) = std::env::var("SHOAL_TEST_ETCD_ENDPOINT").ok().filter(|e| !e.is_empty()) else {
        eprintln!("SKIPPED etcd_shoalctl_dev_runs_a_process_cluster_that_moves_shards: SHOAL_TEST_ETCD_ENDPOINT is not set");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let prefix = format!("/shoal-test/dev-{:016x}", rand::random::<u64>());
    let mut dev = Command::new(env!("CARGO_BIN_EXE_shoalctl"))
        .args(["dev", "--etcd", &etcd, "--etcd-prefix", &prefix, "--shard-nodes", "3", "--port", &port.to_string()])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(dev.stdout.take().unwrap()).lines();
    let mut pids = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        eprintln!("dev: {line}");
        if let Some(pid) = line.split("(pid ").nth(1).and_then(|r| r.trim_end_matches(')').parse::<i32>().ok()) {
            pids.push(pid);
        }
        if line.starts_with("Ctrl-C") {
            break;
        }
    }
    assert_eq!(pids.len(), 4, "a coordinator and 3 shard nodes");
    let endpoint = format!("http://127.0.0.1:{port}");

    // The nodes registered; a collection and a move go through shoalctl.
    let deadline = Instant::now() + Duration::from_secs(10);
    while shoalctl(&endpoint, &["node", "list"]).matches(" up ").count() < 3 {
        assert!(Instant::now() < deadline, "3 nodes did not register:\n{}", shoalctl(&endpoint, &["node", "list"]));
        std::thread::sleep(Duration::from_millis(100));
    }
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "3"]);
    let moved = shoalctl(&endpoint, &["shard", "move", "docs/0", "--timeout", "60"]);
    assert!(moved.contains("done"), "{moved}");
    let status = shoalctl(&endpoint, &["status"]);
    assert!(status.contains("docs") && !status.contains("moving to"), "{status}");

    // Ctrl-C stops every process it started.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(dev.id() as i32, libc::SIGINT) };
    let started = Instant::now();
    let exit = loop {
        if let Some(s) = dev.try_wait().unwrap() {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "shoalctl dev did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit}");
    for pid in pids {
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "process {pid} outlived shoalctl dev");
    }
}
