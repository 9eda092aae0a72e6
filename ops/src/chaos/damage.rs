//! The bit-flip fault: a bit flipped in a vector of a copy that serves,
//! through its file, and timed until the node's scrub found it and the
//! copy was made again. The flip goes into the collection without writes
//! (`still`), so that no later write rewrites the page before the scrub
//! reads it and the fault always leaves damage to find.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use parking_lot::Mutex;
use rand::Rng;
use rand::rngs::StdRng;
use shoal_proto::v1;
use shoal_proto::v1::shard_node_client::ShardNodeClient;

use super::Data;
use super::clients::Clients;
use super::flip::flip_where;
use super::observe::{Busy, all_shards};
use super::report::Timeline;
use crate::procs::ProcessCluster;

/// A flip made: where, and the copy it damaged.
pub(super) struct Flipped {
    pub(super) node: usize,
    pub(super) shard: u32,
    pub(super) file: PathBuf,
    /// The copy's id before the flip: a repaired copy has another.
    pub(super) copy: u64,
    /// Every node with a copy of the shard, kept out of node faults until
    /// the repair: the flipped copy looks in sync until the scrub reaches
    /// it, so losing the other copy meanwhile would lose the shard.
    pub(super) holders: Vec<usize>,
    pub(super) endpoint: String,
    pub(super) at: Instant,
}

/// The copy of the write-free collection a shard the node serves holds,
/// with the bytes of one of its base vectors flipped in its file; `None`
/// if none of the tries found a vector there.
pub(super) async fn flip_a_vector(
    cluster: &Arc<Mutex<ProcessCluster>>,
    admins: &Clients,
    data: &Data,
    node: usize,
    rng: &mut StdRng,
) -> anyhow::Result<Option<Flipped>> {
    let id = format!("shard-{node}");
    let shards = all_shards(admins).await.map_err(anyhow::Error::msg)?;
    let mut serving: Vec<(u32, Vec<usize>)> = shards
        .iter()
        .filter(|(key, s)| key.starts_with("still/") && s.replicas.iter().any(|r| r.node == id && r.state == "active" && !r.node_down))
        .map(|(_, s)| (s.shard, s.replicas.iter().filter_map(|r| r.node.strip_prefix("shard-")?.parse().ok()).collect()))
        .collect();
    if serving.is_empty() {
        return Ok(None);
    }
    let (shard, holders) = serving.swap_remove(rng.random_range(0..serving.len()));
    let (dir, endpoint) = {
        let c = cluster.lock();
        (c.nodes[node].data_dir().context("the node's data directory")?, c.nodes[node].endpoint())
    };
    let file = dir.join("shards").join("still").join(shard.to_string()).join("data.mdb");
    let mut client = ShardNodeClient::connect(endpoint.clone()).await?;
    let listed = client.list_shards(v1::ListShardsRequest {}).await?.into_inner();
    let Some(copy) = copy_of(&listed, shard) else { return Ok(None) };
    // A shard holds about one base point in `shards`: enough tries that
    // one of them is almost surely its.
    let tries: Vec<Vec<u8>> =
        (0..400).map(|_| data.base[rng.random_range(0..data.base.len())].iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let files = vec![file.clone()];
    let hit = tokio::task::spawn_blocking(move || -> std::io::Result<bool> {
        for needle in &tries {
            if flip_where(&files, needle)?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    })
    .await??;
    Ok(hit.then(|| Flipped { node, shard, file, copy, holders, endpoint, at: Instant::now() }))
}

fn copy_of(listed: &v1::ListShardsResponse, shard: u32) -> Option<u64> {
    listed.shards.iter().find(|s| s.shard.as_ref().is_some_and(|i| i.collection == "still" && i.shard == shard)).map(|s| s.copy)
}

impl Flipped {
    /// Waits until the node serves a new copy of the shard, none damaged,
    /// with `factor` copies in sync; times when the node first listed the
    /// damage (if a poll saw it) and the repair.
    pub(super) async fn repaired(
        self,
        timeline: Arc<Mutex<Timeline>>,
        busy: Busy,
        admins: Clients,
        factor: usize,
        within: Duration,
    ) -> anyhow::Result<()> {
        let key = format!("still/{}", self.shard);
        let mut found = None;
        let mut repaired = None;
        while self.at.elapsed() < within {
            let listed = match ShardNodeClient::connect(self.endpoint.clone()).await {
                Ok(mut c) => c.list_shards(v1::ListShardsRequest {}).await.map(|r| r.into_inner()).ok(),
                Err(_) => None,
            };
            if let Some(listed) = listed {
                let damaged =
                    listed.damaged.iter().any(|d| d.shard.as_ref().is_some_and(|i| i.collection == "still" && i.shard == self.shard));
                if damaged && found.is_none() {
                    found = Some(self.at.elapsed());
                }
                let new_copy = copy_of(&listed, self.shard).is_some_and(|c| c != self.copy);
                let in_sync = || async {
                    all_shards(&admins).await.is_ok_and(|shards| {
                        shards.iter().any(|(k, s)| {
                            *k == key && s.moving.is_none() && s.replicas.len() == factor && s.replicas.iter().all(|r| r.state == "active")
                        })
                    })
                };
                if new_copy && !damaged && in_sync().await {
                    repaired = Some(self.at.elapsed());
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let Some(repaired) = repaired else {
            anyhow::bail!(
                "a vector flipped in {} (shard-{}, {key}) was not found and the copy made again within {within:?}",
                self.file.display(),
                self.node
            );
        };
        {
            let mut tl = timeline.lock();
            tl.flip_repaired_s.push(repaired.as_secs_f64());
            tl.flip_found_s.extend(found.map(|f| f.as_secs_f64()));
        }
        for &n in &self.holders {
            busy.release(n);
        }
        Ok(())
    }
}
