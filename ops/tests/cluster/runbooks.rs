//! The runbooks in `docs/runbooks/` are executed here, so they cannot rot:
//! every ```sh block of a runbook runs in order, through bash with
//! `set -euo pipefail`, against a live cluster, with `shoalctl` (this
//! package's binary) on the PATH. A block that fails fails the test with
//! its output.

use std::path::Path;
use std::process::Command;

use shoal_proto::v1;

use crate::common::{batch, cluster, create, ingest, points, points_in, rng};

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
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/runbooks").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let blocks = shell_blocks(&text);
    assert!(!blocks.is_empty(), "{name} has no ```sh block");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_shoalctl")).parent().unwrap().to_owned();
    let path_var = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    for (i, block) in blocks.iter().enumerate() {
        let out = Command::new("bash")
            .args(["-c", &format!("set -euo pipefail\n{block}")])
            .env("PATH", &path_var)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("run bash");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("{name} block {}:\n{block}---\n{stdout}{stderr}", i + 1);
        assert!(out.status.success(), "{name}: block {} failed ({}):\n{block}\nstdout:\n{stdout}\nstderr:\n{stderr}", i + 1, out.status);
    }
}

#[test]
fn shell_blocks_are_found_in_order() {
    let md = "# t\n```sh\na\nb\n```\ntext\n```rust\nno\n```\n```sh\nc\n```\n";
    assert_eq!(shell_blocks(md), ["a\nb\n", "c\n"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runbook_drain_a_node() {
    let mut t = cluster(3).await;
    let mut rng = rng("runbook_drain_a_node");
    create(&mut t.client, "docs", 8, v1::Metric::Cosine, 6).await;
    ingest(&mut t.client, vec![batch("docs", "job", 1, points(&mut rng, 8, 0..600))]).await.unwrap();
    let endpoint = t.cluster.endpoint();
    // The runbook's commands block; run them off the runtime's workers.
    let env = vec![("SHOAL_ENDPOINT", endpoint), ("NODE", "shard-1".to_owned())];
    tokio::task::spawn_blocking(move || run_runbook("drain-a-node.md", &env)).await.unwrap();

    // It drained the node, then undid that (its last block): the node is
    // serving again and empty, and every point is still there.
    let status = t.client.cluster_status(v1::ClusterStatusRequest {}).await.unwrap().into_inner();
    let node = status.nodes.iter().find(|n| n.id == "shard-1").unwrap();
    assert_eq!(node.state, "serving");
    let held = status.collections.iter().flat_map(|c| &c.shards).filter(|s| s.node == "shard-1").count();
    assert_eq!(held, 0, "the drained node got nothing back without a rebalance");
    assert_eq!(points_in(&mut t.client, "docs").await, 600);
    t.cluster.shutdown().await.unwrap();
}
