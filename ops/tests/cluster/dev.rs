//! `shoalctl dev --etcd` as a test harness: separate shard-node and
//! coordinator processes on one etcd, started and stopped the way an
//! operator would, for the tests that drive `shoalctl` itself.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `shoalctl dev --etcd`.
pub(crate) struct DevCluster {
    child: Child,
    /// Process ids by role id (`coordinator`, `coordinator-1`, `shard-0`, ...).
    pub(crate) pids: BTreeMap<String, i32>,
    /// Coordinator URLs by id.
    pub(crate) coordinators: BTreeMap<String, String>,
    /// Data, logs and snapshots; removed when the harness goes.
    dir: tempfile::TempDir,
    /// The etcd it runs on, and the key prefix of this cluster.
    pub(crate) etcd: String,
    pub(crate) prefix: String,
}

/// The etcd the tests use, if any (`./ops/test.sh` starts one).
pub(crate) fn test_etcd() -> Option<String> {
    std::env::var("SHOAL_TEST_ETCD_ENDPOINT").ok().filter(|e| !e.is_empty())
}

pub(crate) fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Runs `shoalctl --endpoint ENDPOINT ARGS...` and returns its output;
/// panics with it if the command failed.
pub(crate) fn shoalctl(endpoint: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_shoalctl")).arg("--endpoint").arg(endpoint).args(args).output().expect("run shoalctl");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "shoalctl {args:?} failed:\n{text}");
    text
}

impl DevCluster {
    /// `nodes` shard nodes and `coordinators` coordinators on `etcd`, under
    /// a prefix of their own; returns once every node is registered.
    pub(crate) fn start(etcd: &str, nodes: usize, coordinators: usize) -> DevCluster {
        DevCluster::start_with_env(etcd, nodes, coordinators, &[])
    }

    /// [`DevCluster::start`] with settings for every process it runs
    /// (`SHOAL_COORD_*`, `SHOAL_SHARD_*`).
    pub(crate) fn start_with_env(etcd: &str, nodes: usize, coordinators: usize, env: &[(&str, &str)]) -> DevCluster {
        let dir = tempfile::tempdir().unwrap();
        // Port 0: each coordinator binds a free port itself. A port picked
        // here and bound later can be taken meanwhile by any socket of the
        // busy machine (it comes from the ephemeral range).
        let port = 0;
        let prefix = format!("/shoal-test/dev-{:016x}", rand::random::<u64>());
        let mut child = Command::new(env!("CARGO_BIN_EXE_shoalctl"))
            .args(["dev", "--etcd", etcd, "--etcd-prefix", &prefix])
            .args(["--shard-nodes", &nodes.to_string(), "--coordinators", &coordinators.to_string(), "--port", &port.to_string()])
            .arg("--data-dir")
            .arg(dir.path())
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut pids = BTreeMap::new();
        let mut urls = BTreeMap::new();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        for line in lines.by_ref() {
            let line = line.unwrap();
            eprintln!("dev: {line}");
            // "  shard-0       http://127.0.0.1:1234 (pid 42)"
            let words: Vec<&str> = line.split_whitespace().collect();
            if let [id, url, "(pid", pid] = words[..] {
                pids.insert(id.to_owned(), pid.trim_end_matches(')').parse().unwrap());
                if id.starts_with("coordinator") {
                    urls.insert(id.to_owned(), url.to_owned());
                }
            }
            if line.starts_with("Ctrl-C") {
                break;
            }
        }
        // Keep reading what it prints (it says when it stops).
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| eprintln!("dev: {l}")));
        assert_eq!(pids.len(), nodes + coordinators, "every process printed: {pids:?}");
        let c = DevCluster { child, pids, coordinators: urls, dir, etcd: etcd.to_owned(), prefix };
        let deadline = Instant::now() + Duration::from_secs(10);
        while shoalctl(&c.endpoint(), &["node", "list"]).matches(" up ").count() < nodes {
            assert!(Instant::now() < deadline, "{nodes} nodes did not register:\n{}", shoalctl(&c.endpoint(), &["node", "list"]));
            std::thread::sleep(Duration::from_millis(100));
        }
        c
    }

    /// [`DevCluster::start`] on the test etcd; `None` (and a printed
    /// SKIPPED naming `test`) without one.
    pub(crate) fn on_test_etcd(test: &str, nodes: usize, coordinators: usize) -> Option<DevCluster> {
        let Some(etcd) = test_etcd() else {
            eprintln!("SKIPPED {test}: SHOAL_TEST_ETCD_ENDPOINT is not set");
            return None;
        };
        Some(DevCluster::start(&etcd, nodes, coordinators))
    }

    /// [`DevCluster::on_test_etcd`] with [`DevCluster::start_with_env`]'s settings.
    pub(crate) fn on_test_etcd_with_env(test: &str, nodes: usize, coordinators: usize, env: &[(&str, &str)]) -> Option<DevCluster> {
        let Some(etcd) = test_etcd() else {
            eprintln!("SKIPPED {test}: SHOAL_TEST_ETCD_ENDPOINT is not set");
            return None;
        };
        Some(DevCluster::start_with_env(&etcd, nodes, coordinators, env))
    }

    /// Where its processes keep their data (a node's under its id).
    pub(crate) fn data_dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The snapshot store its nodes share.
    pub(crate) fn snapshots(&self) -> std::path::PathBuf {
        self.dir.path().join("snapshots")
    }

    /// The first coordinator's URL.
    pub(crate) fn endpoint(&self) -> String {
        self.coordinators["coordinator"].clone()
    }

    /// SIGKILLs one of the processes.
    pub(crate) fn kill(&self, id: &str) {
        // SAFETY: a process this harness started (its pid printed by it).
        unsafe { libc::kill(self.pids[id], libc::SIGKILL) };
    }

    /// Ctrl-C, as an operator stops it; panics unless it and every process
    /// it started are gone within 30 s.
    pub(crate) fn interrupt(mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let started = Instant::now();
        let exit = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "shoalctl dev did not stop");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(exit.success(), "{exit}");
        for (id, pid) in &self.pids {
            assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "{id} (pid {pid}) outlived shoalctl dev");
        }
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // A failed test: take everything down.
            for pid in self.pids.values() {
                // SAFETY: processes this harness started.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
