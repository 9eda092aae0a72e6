//! The runbooks in `docs/runbooks/` and the examples of docs/filters.md
//! are executed here, so they cannot rot: every ```sh block of a page
//! runs in order, through bash with
//! `set -euo pipefail`, against a live cluster, with `shoalctl` (this
//! package's binary) on the PATH. A block that fails fails the test with
//! its output.
//!
//! Under `pipefail`, `shoalctl status | grep -q X` fails when grep stops
//! reading early and shoalctl dies of SIGPIPE, whether or not X was there:
//! the runbooks write `grep X >/dev/null`, which reads to the end.

use std::path::Path;
use std::process::Command;

use shoal_proto::v1;

use crate::common::{batch, ingest, points, rng};
use crate::dev::{DevCluster, shoalctl, test_etcd};

/// The ```sh blocks of a markdown file, in order.
fn shell_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), l) => {
                block.push_str(l);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(current.is_none(), "an unclosed ```sh block");
    blocks
}

fn run_runbook(name: &str, env: &[(&str, String)]) {
    let cwd = tempfile::tempdir().expect("a working directory");
    run_runbook_in(name, env, cwd.path());
}

/// Runs the runbook with `cwd` as its working directory (where the files
/// it writes land).
fn run_runbook_in(name: &str, env: &[(&str, String)], cwd: &Path) {
    run_runbook_hooked(name, env, cwd, |_| {});
}

/// Runs the runbook, calling `before(i)` before its block `i` (from 0):
/// where the test does what the runbook's prose says happens meanwhile,
/// or checks what it promises.
fn run_runbook_hooked(name: &str, env: &[(&str, String)], cwd: &Path, before: impl FnMut(usize)) {
    run_page(&Path::new("runbooks").join(name), env, cwd, before);
}

/// Runs the ```sh blocks of `docs/<page>` as [`run_runbook_hooked`] does.
fn run_page(page: &Path, env: &[(&str, String)], cwd: &Path, mut before: impl FnMut(usize)) {
    let name = page.display().to_string();
    let name = name.as_str();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs").join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let blocks = shell_blocks(&text);
    assert!(!blocks.is_empty(), "{name} has no ```sh block");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_shoalctl")).parent().unwrap().to_owned();
    let path_var = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    // The roles' binaries are this package's `shoalctl`, which runs them
    // when asked (`shoalctl shard-node ...`): wrappers under their names.
    let wrappers = tempfile::tempdir().expect("a directory for wrappers");
    for role in ["shard-node", "coordinator"] {
        let path = wrappers.path().join(format!("shoal-{role}"));
        std::fs::write(&path, format!("#!/bin/sh\nexec '{}' {role} \"$@\"\n", env!("CARGO_BIN_EXE_shoalctl"))).unwrap();
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(&path, perms).unwrap();
    }
    let path_var = format!("{}:{path_var}", wrappers.path().display());
    for (i, block) in blocks.iter().enumerate() {
        before(i);
        let out = Command::new("bash")
            .current_dir(cwd)
            .args(["-c", &format!("set -euo pipefail\n{block}")])
            .env("PATH", &path_var)
            // An expected error of shoalctl is one line, not a backtrace;
            // a panic still has one.
            .env("RUST_LIB_BACKTRACE", "0")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("run bash");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("{name} block {}:\n{block}---\n{stdout}{stderr}", i + 1);
        if !out.status.success() {
            print_log_tails(cwd);
        }
        assert!(out.status.success(), "{name}: block {} failed ({}):\n{block}\nstdout:\n{stdout}\nstderr:\n{stderr}", i + 1, out.status);
    }
}

/// The last lines of every `*.log` the runbook's processes wrote in `cwd`:
/// what a failed block needs to be understood (the directory is gone after).
fn print_log_tails(cwd: &Path) {
    let Ok(entries) = std::fs::read_dir(cwd) else { return };
    let mut logs: Vec<_> = entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "log")).collect();
    logs.sort();
    for log in logs {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("--- last lines of {}:\n{}", log.display(), lines[lines.len().saturating_sub(40)..].join("\n"));
    }
}

#[test]
fn shell_blocks_are_found_in_order() {
    let md = "# t\n```sh\na\nb\n```\ntext\n```rust\nno\n```\n```sh\nc\n```\n";
    assert_eq!(shell_blocks(md), ["a\nb\n", "c\n"]);
}

#[test]
fn etcd_runbook_drain_a_node() {
    let Some(dev) = DevCluster::on_test_etcd("etcd_runbook_drain_a_node", 3, 1) else { return };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "6"]);
    ingest_job(&endpoint, 1..=6);
    run_runbook("drain-a-node.md", &[("SHOAL_ENDPOINT", endpoint.clone()), ("NODE", "shard-1".to_owned())]);

    // It drained the node, then undid that (its last block): the node is
    // serving again and empty, and every point is still there.
    let nodes = shoalctl(&endpoint, &["node", "list"]);
    let line = nodes.lines().find(|l| l.starts_with("shard-1 ")).expect("shard-1 listed");
    assert!(line.contains(" serving ") && line.split_whitespace().nth(4) == Some("0"), "{nodes}");
    assert_eq!(points_of(&endpoint, "docs"), 600);
    dev.interrupt();
}

/// Streams batches `offsets` of source "job" into `docs` through
/// `endpoint` (100 points each, ids from the offset); returns the acks.
pub(crate) fn ingest_job(endpoint: &str, offsets: std::ops::RangeInclusive<u64>) -> Vec<v1::IngestAck> {
    ingest_job_dim(endpoint, 8, offsets)
}

fn ingest_job_dim(endpoint: &str, dim: usize, offsets: std::ops::RangeInclusive<u64>) -> Vec<v1::IngestAck> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut client = shoal_proto::v1::shoal_client::ShoalClient::connect(endpoint.to_owned()).await.unwrap();
        let mut rng = rng("runbook ingest job");
        let batches = offsets.map(|o| batch("docs", "job", o, points(&mut rng, dim, (o - 1) * 100..o * 100))).collect();
        ingest(&mut client, batches).await.unwrap()
    })
}

pub(crate) fn points_of(endpoint: &str, name: &str) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut client = shoal_proto::v1::shoal_client::ShoalClient::connect(endpoint.to_owned()).await.unwrap();
        // A describe asks every shard within the status timeout (1 s): on a
        // machine busy with several clusters a node can miss it once.
        let mut last = None;
        for _ in 0..10 {
            match client.describe_collection(v1::DescribeCollectionRequest { name: name.into() }).await {
                Ok(r) => return r.into_inner().points,
                Err(e) if matches!(e.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded) => {
                    eprintln!("describe {name}: {e:?}; again");
                    last = Some(e);
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(e) => panic!("describe {name}: {e:?}"),
            }
        }
        panic!("describe {name} kept failing: {last:?}")
    })
}

#[test]
fn etcd_runbook_a_node_died() {
    let Some(dev) = DevCluster::on_test_etcd("etcd_runbook_a_node_died", 3, 1) else { return };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "3"]);
    ingest_job(&endpoint, 1..=5);
    shoalctl(&endpoint, &["snapshot", "create", "docs"]);
    ingest_job(&endpoint, 6..=10);
    dev.kill("shard-1");
    // The runbook starts once the lease has ended (10 s by default).
    wait_gone(&endpoint, "shard-1");
    run_runbook("a-node-died.md", &[("SHOAL_ENDPOINT", endpoint.clone())]);

    // As it says: the job, run again, replays what the snapshot lacks,
    // and every point is there once.
    assert!(points_of(&endpoint, "docs") < 1_000, "the recovered shard is as of its snapshot");
    let acks = ingest_job(&endpoint, 1..=10);
    assert!(acks.iter().take(5).all(|a| a.status == v1::BatchStatus::Skipped as i32), "batches in the snapshot are skipped: {acks:?}");
    assert_eq!(points_of(&endpoint, "docs"), 1_000);
    dev.interrupt();
}

#[test]
fn etcd_runbook_a_coordinator_died() {
    let Some(dev) = DevCluster::on_test_etcd("etcd_runbook_a_coordinator_died", 2, 2) else { return };
    let first = dev.endpoint();
    shoalctl(&first, &["collections", "create", "docs", "--dimension", "8", "--shards", "2"]);
    ingest_job(&first, 1..=3);
    // Kill the controller, whichever it is.
    let status = shoalctl(&first, &["status"]);
    let controller = status
        .lines()
        .find_map(|l| {
            l.strip_prefix("control plane: ").and_then(|r| r.split("controller ").nth(1)).and_then(|r| r.split_whitespace().next())
        })
        .expect("a controller in the status")
        .to_owned();
    let alive = dev.coordinators.iter().find(|(id, _)| **id != controller).map(|(_, url)| url.clone()).unwrap();
    let dead_listen = dev.coordinators[&controller].trim_start_matches("http://").to_owned();
    dev.kill(&controller);
    let cwd = tempfile::tempdir().unwrap();
    let env = [
        ("SHOAL_ENDPOINT", alive.clone()),
        ("DEAD", controller.clone()),
        ("DEAD_LISTEN", dead_listen.clone()),
        ("ETCD", dev.etcd.clone()),
        ("ETCD_PREFIX", dev.prefix.clone()),
    ];
    let ran = std::panic::catch_unwind(|| run_runbook_in("a-coordinator-died.md", &env, cwd.path()));
    let restarted = std::fs::read_to_string(cwd.path().join(format!("{controller}.pid")));
    // The survivor serves what the dead one created, and so does the dead
    // one restarted, which did not take the controller role back.
    let checked = std::panic::catch_unwind(|| {
        assert_eq!(points_of(&alive, "docs"), 300);
        assert_eq!(points_of(&format!("http://{dead_listen}"), "docs"), 300);
        let moved = shoalctl(&alive, &["shard", "move", "docs/0", "--timeout", "60"]);
        assert!(moved.contains("done"), "the new controller carries out moves: {moved}");
    });
    if let Ok(pid) = restarted {
        // SAFETY: the process the runbook started.
        unsafe { libc::kill(pid.trim().parse().unwrap(), libc::SIGKILL) };
    }
    ran.unwrap();
    checked.unwrap();
    dev.interrupt();
}

#[test]
fn etcd_runbook_add_a_node() {
    let Some(dev) = DevCluster::on_test_etcd("etcd_runbook_add_a_node", 2, 1) else { return };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "4"]);
    ingest_job(&endpoint, 1..=8);
    let cwd = tempfile::tempdir().unwrap();
    let env = [
        ("SHOAL_ENDPOINT", endpoint.clone()),
        ("ETCD", dev.etcd.clone()),
        ("ETCD_PREFIX", dev.prefix.clone()),
        ("NEW_NODE", "shard-9".to_owned()),
        ("SHOAL_SHARD_SNAPSHOT__URL", dev.snapshots().display().to_string()),
    ];
    let ran = std::panic::catch_unwind(|| run_runbook_in("add-a-node.md", &env, cwd.path()));
    // Whatever happened, the node it started goes.
    if let Ok(pid) = std::fs::read_to_string(cwd.path().join("shard-9.pid")) {
        let pid: i32 = pid.trim().parse().unwrap();
        let (held, points) = match &ran {
            Ok(()) => (shoalctl(&endpoint, &["status"]).matches("node shard-9 ").count(), points_of(&endpoint, "docs")),
            Err(_) => (0, 0),
        };
        // SAFETY: the process the runbook started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        ran.unwrap();
        // As it says: 4 shards over 3 nodes, none more than one apart (the
        // new one took one or two); every point still there.
        assert!(held >= 1, "the new node got shards");
        assert_eq!(points, 800);
    } else {
        ran.unwrap();
        panic!("the runbook wrote no pid file");
    }
    dev.interrupt();
}

/// Kills every process a runbook recorded in a `*.pid` file of `dir` when
/// dropped (the test is over, or failed).
struct PidFiles<'a>(&'a Path);

impl Drop for PidFiles<'_> {
    fn drop(&mut self) {
        for entry in std::fs::read_dir(self.0).into_iter().flatten().flatten() {
            if entry.path().extension().is_some_and(|e| e == "pid")
                && let Ok(pid) = std::fs::read_to_string(entry.path()).unwrap_or_default().trim().parse::<i32>()
            {
                // SAFETY: a process the runbook started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn pid_in(dir: &Path, name: &str) -> i32 {
    std::fs::read_to_string(dir.join(format!("{name}.pid"))).unwrap().trim().parse().unwrap()
}

#[test]
fn etcd_runbooks_start_a_cluster_with_s3_then_etcd_is_down() {
    if test_etcd().is_none() {
        eprintln!("SKIPPED etcd_runbooks_start_a_cluster_with_s3_then_etcd_is_down: SHOAL_TEST_ETCD_ENDPOINT is not set");
        return;
    }
    let cwd = tempfile::tempdir().unwrap();
    let _stop = PidFiles(cwd.path());
    let snapshot_url = match std::env::var("SHOAL_TEST_S3_ENDPOINT").ok().filter(|e| !e.is_empty()) {
        Some(e) => {
            let bucket = std::env::var("SHOAL_TEST_S3_BUCKET").unwrap_or_else(|_| "shoal-test".into());
            let prefix = format!("runbook-{:016x}", rand::random::<u64>());
            format!("s3://{bucket}/{prefix}?endpoint={e}&region=us-east-1&access_key_id=testing&secret_access_key=testing")
        }
        None => {
            eprintln!("no SHOAL_TEST_S3_ENDPOINT (ops/test.sh sets it): snapshots go to a directory instead of S3");
            format!("file://{}/snapshots", cwd.path().display())
        }
    };
    let port = loop {
        let p = crate::dev::free_port();
        if p < 65000 && (1..4).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
            break p;
        }
    };
    let endpoint = format!("http://127.0.0.1:{port}");
    let env = [
        ("PORT", port.to_string()),
        ("ETCD_PORT", crate::dev::free_port().to_string()),
        ("ETCD_PEER_PORT", crate::dev::free_port().to_string()),
        ("SNAPSHOT_URL", snapshot_url),
        ("SHOAL_ENDPOINT", endpoint.clone()),
    ];
    run_runbook_in("start-a-cluster.md", &env, cwd.path());
    ingest_job_dim(&endpoint, 384, 1..=3);
    assert_eq!(points_of(&endpoint, "docs"), 300);

    // etcd dies; the runbook for that follows. While it is down (before
    // the block that brings it back), the cluster serves ingest and search.
    // SAFETY: the etcd the runbook started.
    unsafe { libc::kill(pid_in(cwd.path(), "etcd"), libc::SIGKILL) };
    run_runbook_hooked("etcd-is-down.md", &env, cwd.path(), |i| {
        if i == 1 {
            let acks = ingest_job_dim(&endpoint, 384, 4..=5);
            assert!(acks.iter().all(|a| a.status == v1::BatchStatus::Applied as i32), "ingest while etcd is down: {acks:?}");
            assert_eq!(points_of(&endpoint, "docs"), 500, "search and describe while etcd is down");
        }
    });
    assert_eq!(points_of(&endpoint, "docs"), 500);
    let listed = shoalctl(&endpoint, &["snapshot", "list", "docs"]);
    assert!(listed.lines().count() >= 2, "the snapshot is listed from the store: {listed}");
}

/// Lease and repair delay short enough for a test: a dead node leaves the
/// membership within 2 s and its copies are repaired 3 s later.
const FAST_REPAIR: [(&str, &str); 3] =
    [("SHOAL_SHARD_CLUSTER__LEASE_TTL_MS", "2000"), ("SHOAL_COORD_CLUSTER__LEASE_TTL_MS", "2000"), ("SHOAL_COORD_REPAIR_AFTER_MS", "3000")];

/// `(node, state)` of every replica of every shard of `docs`, by shard.
fn replicas_of(endpoint: &str) -> Vec<Vec<(String, String)>> {
    replicas_of_collection(endpoint, "docs")
}

/// `(node, state)` of every replica of every shard of `name`, by shard.
fn replicas_of_collection(endpoint: &str, name: &str) -> Vec<Vec<(String, String)>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut client = shoal_proto::v1::shoal_client::ShoalClient::connect(endpoint.to_owned()).await.unwrap();
        let c = client.describe_collection(v1::DescribeCollectionRequest { name: name.into() }).await.unwrap().into_inner();
        c.shards.iter().map(|s| s.replicas.iter().map(|r| (r.node.clone(), r.state.clone())).collect()).collect()
    })
}

/// Asserts that every shard of `docs` has `factor` in-sync copies on
/// distinct nodes, none on `gone`; returns the replicas.
fn assert_whole(endpoint: &str, factor: usize, gone: Option<&str>) -> Vec<Vec<(String, String)>> {
    let replicas = replicas_of(endpoint);
    for (s, r) in replicas.iter().enumerate() {
        assert_eq!(r.len(), factor, "shard {s}: {r:?}");
        assert!(r.iter().all(|(n, state)| Some(n.as_str()) != gone && state == "active"), "shard {s}: {r:?}");
        let nodes: std::collections::BTreeSet<&String> = r.iter().map(|(n, _)| n).collect();
        assert_eq!(nodes.len(), factor, "shard {s}: copies share a node: {r:?}");
    }
    replicas
}

/// Waits up to 30 s for `done`; panics saying what never happened.
pub(crate) fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Waits until `id` is no longer a member.
fn wait_gone(endpoint: &str, id: &str) {
    wait_until(&format!("{id} leaving the membership"), || !shoalctl(endpoint, &["node", "list"]).contains(&format!("{id} ")));
}

#[test]
fn etcd_runbook_replication_factor() {
    let Some(dev) = DevCluster::on_test_etcd("etcd_runbook_replication_factor", 3, 1) else { return };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "3"]);
    ingest_job(&endpoint, 1..=4);
    let env = [("SHOAL_ENDPOINT", endpoint.clone()), ("COLLECTION", "docs".to_owned()), ("FACTOR", "2".to_owned())];
    let cwd = tempfile::tempdir().unwrap();
    run_runbook_hooked("replication-factor.md", &env, cwd.path(), |i| {
        if i == 4 {
            // Before "lowering": what the first four blocks promised. Every
            // shard has two in-sync copies on distinct nodes, writes need
            // both, and ingest still flows.
            assert_whole(&endpoint, 2, None);
            let acks = ingest_job(&endpoint, 5..=6);
            assert!(acks.iter().all(|a| a.status == v1::BatchStatus::Applied as i32), "{acks:?}");
        }
    });
    // Lowered again: one copy per shard, every point there once.
    assert!(replicas_of(&endpoint).iter().all(|r| r.len() == 1), "{:?}", replicas_of(&endpoint));
    assert_eq!(points_of(&endpoint, "docs"), 600);
    dev.interrupt();
}

#[test]
fn etcd_runbook_a_replicated_node_died() {
    let Some(dev) = DevCluster::on_test_etcd_with_env("etcd_runbook_a_replicated_node_died", 3, 1, &FAST_REPAIR) else { return };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "3", "--replication-factor", "2"]);
    ingest_job(&endpoint, 1..=5);
    let held = |node: &str| replicas_of(&endpoint).iter().filter(|r| r.iter().any(|(n, _)| n == node)).count();
    assert!(held("shard-1") >= 1, "{:?}", replicas_of(&endpoint));
    // No write follows the kill: its copies are still marked in sync when
    // the repair delay ends, and are repaired all the same.
    dev.kill("shard-1");
    // The runbook starts once an operator sees it: the probe marked the node
    // down, and the status flags its shards.
    wait_until("shard-1's copies showing its node down", || shoalctl(&endpoint, &["status"]).contains("shard-1 active (node DOWN)"));
    assert!(shoalctl(&endpoint, &["status"]).contains("UNDER-REPLICATED"));
    run_runbook("a-replicated-node-died.md", &[("SHOAL_ENDPOINT", endpoint.clone())]);

    // As it says: every shard has two in-sync copies again, none on the
    // dead node, and nothing was lost; ingest goes on.
    assert_whole(&endpoint, 2, Some("shard-1"));
    assert_eq!(points_of(&endpoint, "docs"), 500);
    let acks = ingest_job(&endpoint, 1..=6);
    assert!(acks[..5].iter().all(|a| a.status == v1::BatchStatus::Skipped as i32), "{acks:?}");
    assert_eq!(points_of(&endpoint, "docs"), 600);
    dev.interrupt();
}

/// Flips one bit wherever `needle` occurs in a `data.mdb` under `dir`, as
/// a disk would, in at most `files` files; returns the files it changed.
pub(crate) fn flip_on_disk(dir: &Path, needle: &[u8], files: usize) -> Vec<std::path::PathBuf> {
    use std::os::unix::fs::FileExt;
    let mut changed = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if changed.len() == files {
                return changed;
            }
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "data.mdb") {
                let bytes = std::fs::read(&path).unwrap();
                let at: Vec<usize> = bytes.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i).collect();
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                for i in &at {
                    let j = i + needle.len() / 2;
                    f.write_all_at(&[bytes[j] ^ 0x08], j as u64).unwrap();
                }
                if !at.is_empty() {
                    changed.push(path);
                }
            }
        }
    }
    changed
}

/// A bit flipped on disk in the only copy of a shard, and in one copy of
/// a replicated shard: the scrub finds both, the controller seeds the
/// replicated one anew by itself, the runbook restores the other from its
/// snapshot, and the ingest job's replay brings back what came after.
#[test]
fn etcd_runbook_a_copy_is_damaged() {
    // The runbook's case: the controller does not restore on its own
    // (`damaged::etcd_the_only_damaged_copy_is_restored_from_its_snapshot`
    // covers that).
    let env = [
        ("SHOAL_SHARD_SCRUB__BYTES_PER_SECOND", "33554432"),
        ("SHOAL_COORD_RECLAIM_AFTER_MS", "4000"),
        ("SHOAL_COORD_RESTORE_DAMAGED", "false"),
    ];
    let Some(dev) = DevCluster::on_test_etcd_with_env("etcd_runbook_a_copy_is_damaged", 2, 1, &env) else { return };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "2"]);
    shoalctl(&endpoint, &["collections", "create", "copies", "--dimension", "8", "--shards", "2", "--replication-factor", "2"]);
    ingest_job(&endpoint, 1..=3);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let needle = |c: &str| format!("needle-of-{c}");
    rt.block_on(async {
        let mut client = shoal_proto::v1::shoal_client::ShoalClient::connect(endpoint.clone()).await.unwrap();
        for c in ["docs", "copies"] {
            let payload = Some(v1::Payload { kind: Some(v1::payload::Kind::Json(format!(r#"{{"note": "{}"}}"#, needle(c)))) });
            let point = v1::Point { id: 100_000, vector: vec![0.5; 8], payload };
            client.upsert(v1::UpsertRequest { collection: c.into(), points: vec![point] }).await.unwrap();
        }
    });
    shoalctl(&endpoint, &["snapshot", "create", "docs"]);
    ingest_job(&endpoint, 4..=5);
    // One copy of each: the docs shard's only one, one of the two of copies'.
    let docs = flip_on_disk(dev.data_dir(), needle("docs").as_bytes(), 1);
    let copies = flip_on_disk(dev.data_dir(), needle("copies").as_bytes(), 1);
    assert_eq!((docs.len(), copies.len()), (1, 1), "the needles are where they were put: {docs:?} {copies:?}");
    let shard_of = |p: &Path| p.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    wait_until("the scrub finding the damaged copy of docs", || {
        shoalctl(&endpoint, &["status"]).contains(&format!("DAMAGED docs/{}", shard_of(&docs[0])))
    });

    let cwd = tempfile::tempdir().unwrap();
    run_runbook_in("a-copy-is-damaged.md", &[("SHOAL_ENDPOINT", endpoint.clone())], cwd.path());
    // It restored the docs shard only: the copies one was seeded anew.
    assert_eq!(std::fs::read_to_string(cwd.path().join("restore.txt")).unwrap().trim(), format!("docs/{}", shard_of(&docs[0])));
    assert!(!shoalctl(&endpoint, &["status"]).contains("DAMAGED"));
    assert!(replicas_of_collection(&endpoint, "copies").iter().flatten().all(|(_, state)| state == "active"));
    // The replay brings back what the restored shard took after its
    // snapshot; every point reads back, the needles unchanged.
    ingest_job(&endpoint, 1..=5);
    assert_eq!(points_of(&endpoint, "docs"), 501);
    shoalctl(&endpoint, &["shard", "verify", "copies"]);
    rt.block_on(async {
        let mut client = shoal_proto::v1::shoal_client::ShoalClient::connect(endpoint.clone()).await.unwrap();
        for c in ["docs", "copies"] {
            let got =
                client.get(v1::GetRequest { collection: c.into(), ids: vec![100_000], with_vector: false }).await.unwrap().into_inner();
            let payload = got.points.first().and_then(|p| p.payload.clone()).and_then(|p| p.kind);
            assert_eq!(payload, Some(v1::payload::Kind::Json(format!(r#"{{"note": "{}"}}"#, needle(c)))), "{c}");
        }
    });
    dev.interrupt();
}

#[test]
fn etcd_runbook_replace_a_node() {
    let Some(dev) = DevCluster::on_test_etcd_with_env("etcd_runbook_replace_a_node", 3, 1, &FAST_REPAIR) else { return };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "4", "--replication-factor", "2"]);
    ingest_job(&endpoint, 1..=4);
    dev.kill("shard-2");
    // Writes go on while it is gone (its copies leave the in-sync set).
    let acks = ingest_job(&endpoint, 5..=6);
    assert!(acks.iter().all(|a| a.status == v1::BatchStatus::Applied as i32), "{acks:?}");
    wait_gone(&endpoint, "shard-2");

    let cwd = tempfile::tempdir().unwrap();
    let _stop = PidFiles(cwd.path());
    let env = [
        ("SHOAL_ENDPOINT", endpoint.clone()),
        ("ETCD", dev.etcd.clone()),
        ("ETCD_PREFIX", dev.prefix.clone()),
        ("OLD_NODE", "shard-2".to_owned()),
        ("NEW_NODE", "shard-9".to_owned()),
        ("SHOAL_SHARD_SNAPSHOT__URL", dev.snapshots().display().to_string()),
        ("SHOAL_SHARD_CLUSTER__LEASE_TTL_MS", "2000".to_owned()),
    ];
    run_runbook_in("replace-a-node.md", &env, cwd.path());

    // As it says: the old node is in no placement, every shard has two
    // in-sync copies on distinct nodes, the new node holds some, and every
    // acknowledged point is there.
    let replicas = assert_whole(&endpoint, 2, Some("shard-2"));
    assert!(replicas.iter().flatten().filter(|(n, _)| n == "shard-9").count() >= 2, "the new node took its share: {replicas:?}");
    assert_eq!(points_of(&endpoint, "docs"), 600);
    dev.interrupt();
}

#[test]
fn etcd_runbook_replicas_disagree() {
    let Some(dev) = DevCluster::on_test_etcd("etcd_runbook_replicas_disagree", 2, 1) else { return };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "2", "--replication-factor", "2"]);
    ingest_job(&endpoint, 1..=3);
    // A client writes to shard 1's follower directly, behind the
    // coordinator's back: point 1 gets another vector there only.
    let follower = replicas_of(&endpoint)[1][1].0.clone();
    let nodes = shoalctl(&endpoint, &["node", "list"]);
    let addr = nodes
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{follower} ")).and_then(|r| r.split_whitespace().next()))
        .unwrap_or_else(|| panic!("{follower} in {nodes}"))
        .to_owned();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let url = if addr.contains("://") { addr.clone() } else { format!("http://{addr}") };
        let mut direct = shoal_proto::v1::shard_node_client::ShardNodeClient::connect(url).await.unwrap();
        let stray = v1::ApplyBatchRequest {
            shard: Some(v1::ShardId { collection: "docs".into(), shard: 1 }),
            points: points(&mut rng("a stray write"), 8, 1..2),
            ..Default::default()
        };
        direct.apply_batch(stray).await.unwrap();
    });
    let before = Command::new(env!("CARGO_BIN_EXE_shoalctl")).args(["--endpoint", &endpoint, "shard", "verify", "docs"]).output().unwrap();
    assert!(!before.status.success(), "verify sees the disagreement: {}", String::from_utf8_lossy(&before.stdout));

    let cwd = tempfile::tempdir().unwrap();
    run_runbook_in("replicas-disagree.md", &[("SHOAL_ENDPOINT", endpoint.clone()), ("COLLECTION", "docs".to_owned())], cwd.path());
    // It found shard 1 only, and resynced the follower (not the primary).
    assert_eq!(std::fs::read_to_string(cwd.path().join("disagree.txt")).unwrap().trim(), "docs/1");
    assert_eq!(std::fs::read_to_string(cwd.path().join("resync.txt")).unwrap().trim(), follower);
    assert!(replicas_of(&endpoint).iter().flatten().all(|(_, state)| state == "active"));
    assert_eq!(points_of(&endpoint, "docs"), 300);
    dev.interrupt();
}

/// TLS everywhere, mutual between coordinator and nodes, API keys and a
/// revocation, as an operator sets them up from the runbook.
#[test]
fn tls_auth_runbook_secure_a_cluster() {
    let cwd = tempfile::tempdir().unwrap();
    let _stop = PidFiles(cwd.path());
    let port = loop {
        let p = crate::dev::free_port();
        if p < 65000 && (1..3).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
            break p;
        }
    };
    run_runbook_in("secure-a-cluster.md", &[("PORT", port.to_string())], cwd.path());
    // Past the runbook: a plain-text caller gets nothing from the nodes.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let node = format!("http://127.0.0.1:{}", port + 1);
        if let Ok(mut c) = shoal_proto::v1::shard_node_client::ShardNodeClient::connect(node).await {
            assert!(c.list_shards(v1::ListShardsRequest {}).await.is_err(), "a TLS node answered plain text");
        }
    });
}

/// (points, tombstones) of every shard of `name` (as its primary counts them).
fn tombstones_of(endpoint: &str, name: &str) -> Vec<(u64, u64)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut client = shoal_proto::v1::shoal_client::ShoalClient::connect(endpoint.to_owned()).await.unwrap();
        let c = client.describe_collection(v1::DescribeCollectionRequest { name: name.into() }).await.unwrap().into_inner();
        c.shards.iter().map(|s| (s.points, s.tombstones)).collect()
    })
}

#[test]
fn etcd_runbook_a_shard_under_churn() {
    // The nodes do not vacuum on their own: the runbook does it. Their
    // small files are compacted once free pages are a tenth of them, so
    // the compaction after the vacuum (or the idle writer's) runs here.
    let env = [
        ("SHOAL_SHARD_WRITER__VACUUM_STEP", "0"),
        ("SHOAL_SHARD_ENGINE__COMPACT_MIN_BYTES", "0"),
        ("SHOAL_SHARD_ENGINE__COMPACT_FREE_RATIO", "0.1"),
    ];
    let Some(dev) = DevCluster::on_test_etcd_with_env("etcd_runbook_a_shard_under_churn", 2, 1, &env) else { return };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "2", "--replication-factor", "2"]);
    ingest_job(&endpoint, 1..=10);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut client = shoal_proto::v1::shoal_client::ShoalClient::connect(endpoint.clone()).await.unwrap();
        let r = client
            .delete(v1::DeleteRequest { collection: "docs".into(), ids: (0..600).collect(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.deleted, 600);
    });
    assert_eq!(tombstones_of(&endpoint, "docs").iter().map(|s| s.1).sum::<u64>(), 600);
    let cwd = tempfile::tempdir().unwrap();
    run_runbook_in("a-shard-under-churn.md", &[("SHOAL_ENDPOINT", endpoint.clone()), ("COLLECTION", "docs".into())], cwd.path());
    // As it says: every copy of every shard vacuumed its tombstones
    // (all but a retired entry point)...
    let out = std::fs::read_to_string(cwd.path().join("vacuum.txt")).unwrap();
    let vacuumed: u64 = out.lines().filter_map(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok()).sum();
    assert_eq!(out.lines().count(), 4, "two shards, two copies each: {out}");
    assert!(vacuumed >= 2 * (600 - 2), "{out}");
    // ...nothing live was lost, and new points take the vacuumed slots:
    // a shard's node count grows only once its free slots (all but a
    // retired entry point's) are taken.
    assert_eq!(points_of(&endpoint, "docs"), 400);
    let before = tombstones_of(&endpoint, "docs");
    ingest_job(&endpoint, 11..=16);
    assert_eq!(points_of(&endpoint, "docs"), 1_000);
    let after = tombstones_of(&endpoint, "docs");
    for ((p0, t0), (p1, t1)) in before.iter().zip(&after) {
        assert!(p1 + t1 <= (p0 + t0).max(p1 + 1), "{before:?} then {after:?}");
    }
    dev.interrupt();
}

/// docs/filters.md's examples: indexes declared at creation, a filtered
/// search with its plans, count, scroll, delete by filter, a refused
/// filter and an index added online, as a user types them.
#[test]
fn etcd_docs_filters_examples_work() {
    let Some(dev) = DevCluster::on_test_etcd("etcd_docs_filters_examples_work", 2, 1) else { return };
    let endpoint = dev.endpoint();
    let cwd = tempfile::tempdir().unwrap();
    run_page(Path::new("filters.md"), &[("SHOAL_ENDPOINT", endpoint.clone())], cwd.path(), |_| {});
    // What the page left: five points, the late index ready on every shard.
    assert_eq!(points_of(&endpoint, "docs"), 5);
    let list = shoalctl(&endpoint, &["index", "list", "docs"]);
    assert_eq!(list.matches("lang ready").count(), 2, "{list}");
    dev.interrupt();
}
