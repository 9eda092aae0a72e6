//! Silent damage on a running replica, every party its own process: one
//! bit flipped in the data file of a shard copy (in a stored vector, then
//! in a payload), as a disk would, behind LMDB's back. The node's scrub
//! finds it and stops serving that copy, the controller takes it out of
//! the in-sync set, and the repair seeds it anew from the primary, on the
//! same node. Searches stay whole throughout and the copies agree after
//! (`VerifyShard`). The times are printed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shoal_proto::v1;
use shoal_proto::v1::shard_node_client::ShardNodeClient;

use crate::check;
use crate::common::{Fixture, rng, upsert_all};
use crate::replicas::{DIM, TTL, check_agree, describe, settled, whole_search};

/// Every `data.mdb` under a node's data directory.
fn data_files(node_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(collections) = std::fs::read_dir(node_dir.join("shards")) else { return out };
    for c in collections.flatten() {
        for s in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
            let f = s.path().join("data.mdb");
            if f.exists() {
                out.push(f);
            }
        }
    }
    out
}

/// Flips one bit in the middle of every place `needle` occurs in the
/// files; returns the file it was found in and how often.
fn flip_where(files: &[PathBuf], needle: &[u8]) -> anyhow::Result<Option<(PathBuf, usize)>> {
    use std::os::unix::fs::FileExt;
    for file in files {
        let bytes = std::fs::read(file)?;
        let at: Vec<usize> = bytes.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i).collect();
        if at.is_empty() {
            continue;
        }
        let f = std::fs::OpenOptions::new().write(true).open(file)?;
        for i in &at {
            let j = i + needle.len() / 2;
            f.write_all_at(&[bytes[j] ^ 0x04], j as u64)?;
        }
        return Ok(Some((file.clone(), at.len())));
    }
    Ok(None)
}

fn vector_of(id: u64) -> Vec<f32> {
    (0..DIM).map(|d| ((id * 31 + u64::from(d) * 17) % 97) as f32 / 97.0 - 0.5 + id as f32 * 1e-4).collect()
}

fn note_of(id: u64) -> String {
    format!(r#"{{"note": "needle-{id:06}-in-the-payload"}}"#)
}

pub(crate) fn etcd_a_bit_flipped_on_a_replica_is_found_by_the_scrub_and_the_copy_made_again() -> anyhow::Result<()> {
    let test = "etcd_a_bit_flipped_on_a_replica_is_found_by_the_scrub_and_the_copy_made_again";
    let Some(fx) = Fixture::on_etcd_with(test, 3, 1, TTL, |spec| {
        // The controller looks at every node each second.
        spec.coordinator_env.push(("SHOAL_COORD_RECLAIM_AFTER_MS".into(), "4000".into()));
        spec.node_env.push(("SHOAL_SHARD_SCRUB__BYTES_PER_SECOND".into(), (32u64 << 20).to_string()));
        spec.node_env.push(("SHOAL_SHARD_SCRUB__STEP_BYTES".into(), (64u64 << 10).to_string()));
    })?
    else {
        return Ok(());
    };
    let mut rng = rng(test);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut client = rt.block_on(fx.client())?;
    let ids = 0..600u64;
    let before = rt.block_on(async {
        // Euclidean: vectors are stored as sent, so their bytes can be found.
        let req = v1::CreateCollectionRequest {
            name: "docs".into(),
            dimension: DIM,
            metric: v1::Metric::Euclidean as i32,
            shard_count: 3,
            replication_factor: 2,
            ..Default::default()
        };
        client.create_collection(req).await?;
        let points = ids
            .clone()
            .map(|id| v1::Point {
                id,
                vector: vector_of(id),
                payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(note_of(id))) }),
            })
            .collect();
        upsert_all(&mut client, "docs", points, 100).await?;
        anyhow::Ok(settled(&describe(&mut client).await?))
    })?;
    check!(fx, before.is_some(), "two active copies of every shard after create");
    let node_dir = fx.dir.path().join("shard-1");
    let mut node = rt.block_on(ShardNodeClient::connect(fx.cluster.nodes[1].endpoint()))?;

    for (kind, id) in [("vector", 0u64), ("payload", 1)] {
        // A point with a copy on shard-1: the first whose bytes are there.
        let needle = |id: u64| -> Vec<u8> {
            match kind {
                "vector" => vector_of(id).iter().flat_map(|x| x.to_le_bytes()).collect(),
                _ => format!("needle-{id:06}").into_bytes(),
            }
        };
        let files = data_files(&node_dir);
        let mut hit = None;
        for id in ids.clone().skip(id as usize).step_by(2) {
            if let Some(found) = flip_where(&files, &needle(id))? {
                hit = Some((id, found));
                break;
            }
        }
        let Some((point, (file, places))) = hit else { anyhow::bail!("no {kind} of any point found in {}", node_dir.display()) };
        let shard: u32 =
            file.parent().and_then(|d| d.file_name()).and_then(|n| n.to_str()).and_then(|n| n.parse().ok()).unwrap_or(u32::MAX);
        let copy_of = |listed: &v1::ListShardsResponse| {
            listed.shards.iter().find(|s| s.shard.as_ref().is_some_and(|i| i.shard == shard)).map(|s| s.copy)
        };
        let flipped = Instant::now();
        let outcome = rt.block_on(async {
            let damaged_copy = copy_of(&node.list_shards(v1::ListShardsRequest {}).await?.into_inner());
            let (mut repaired, mut whole, mut searched) = (None, 0, 0);
            while flipped.elapsed() < Duration::from_secs(90) {
                searched += 1;
                if whole_search(&mut client, &mut rng).await.unwrap_or(false) {
                    whole += 1;
                }
                // Done once the node serves a new copy of the shard and
                // every shard has its two copies in sync.
                let listed = node.list_shards(v1::ListShardsRequest {}).await?.into_inner();
                let new_copy = copy_of(&listed).is_some_and(|c| Some(c) != damaged_copy);
                if new_copy && listed.damaged.is_empty() && settled(&describe(&mut client).await?).is_some() {
                    repaired = Some(flipped.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok((repaired, whole, searched))
        })?;
        let (repaired, whole, searched) = outcome;
        let Some(repaired) = repaired else {
            anyhow::bail!("the copy with the {kind} flipped in {} was not made again\n{}", file.display(), fx.cluster.logs())
        };
        let node_log = std::fs::read_to_string(&fx.cluster.nodes[1].log)?;
        let table = if kind == "vector" { "the vectors table" } else { "the payloads table" };
        let found =
            node_log.lines().find(|l| l.contains("a shard copy is damaged") && l.contains(&format!("shard={shard} ")) && l.contains(table));
        let Some(found) = found else { anyhow::bail!("shard-1's log does not name the damaged {kind}\n{node_log}") };
        eprintln!(
            "{kind} of point {point} flipped in {places} places of {}; the copy made again and in sync {repaired:?} later; \
             {whole} of {searched} searches meanwhile whole",
            file.display()
        );
        check!(fx, found.contains("does not match its checksum"), "{found}");
        check!(fx, whole == searched, "{whole} of {searched} searches were whole");
        let nodes = rt.block_on(async { anyhow::Ok(settled(&describe(&mut client).await?)) })?;
        check!(fx, nodes == before, "made again in place: {nodes:?}, before {before:?}");
        check_agree(&fx, &rt, &mut client, 600)?;
        let got = rt.block_on(async {
            let req = v1::GetRequest { collection: "docs".into(), ids: vec![point], with_vector: true };
            anyhow::Ok(client.get(req).await?.into_inner().points)
        })?;
        let payload = got.first().and_then(|p| p.payload.as_ref()).and_then(|p| p.kind.clone());
        check!(fx, got.first().is_some_and(|p| p.vector == vector_of(point)), "point {point} reads back with its vector");
        check!(fx, payload == Some(v1::payload::Kind::Json(note_of(point))), "point {point} reads back with its payload: {payload:?}");
    }
    let log = std::fs::read_to_string(&fx.cluster.coordinator.log)?;
    check!(fx, log.contains("a damaged copy left the in-sync set"), "the coordinator's log does not say what it did");
    // The node lets go of a damaged copy's files at once: each seed
    // succeeds on its first attempt.
    let failed: Vec<&str> = log.lines().filter(|l| l.contains("shard move failed")).collect();
    check!(fx, failed.is_empty(), "a seed failed: {failed:#?}");
    Ok(())
}
