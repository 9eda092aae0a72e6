//! `shoalctl dev --etcd`: separate processes on one etcd, driven by hand
//! with the same `shoalctl` commands an operator uses; Ctrl-C stops them
//! all.

use crate::dev::{DevCluster, shoalctl};

#[test]
fn etcd_shoalctl_dev_runs_a_process_cluster_that_moves_shards() {
    let Some(dev) = DevCluster::on_test_etcd("etcd_shoalctl_dev_runs_a_process_cluster_that_moves_shards", 3, 1) else { return };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "3"]);
    let moved = shoalctl(&endpoint, &["shard", "move", "docs/0", "--timeout", "60"]);
    assert!(moved.contains("done"), "{moved}");
    let status = shoalctl(&endpoint, &["status"]);
    assert!(status.contains("docs") && !status.contains("moving to"), "{status}");
    dev.interrupt();
}
