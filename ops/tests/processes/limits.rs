//! How many shards a node takes: a configured limit, lowered to what its
//! open-file limit carries; a refused create leaves nothing behind, and a
//! dropped collection gives its files and memory back.

use std::path::Path;
use std::time::Duration;

use shoal_proto::v1;
use tonic::Code;

use crate::check;
use crate::common::{Fixture, block_on, create, points, rng, upsert_all, vector};

/// Shard directories under a node's data dir, as `collection/shard`.
fn shard_dirs(data: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let root = data.join("shards");
    for c in std::fs::read_dir(&root)? {
        let c = c?;
        for s in std::fs::read_dir(c.path())? {
            out.push(format!("{}/{}", c.file_name().to_string_lossy(), s?.file_name().to_string_lossy()));
        }
    }
    out.sort();
    Ok(out)
}

fn collections_named(list: &v1::ListCollectionsResponse) -> Vec<String> {
    list.collections.iter().map(|c| c.name.clone()).collect()
}

pub(crate) fn shard_limits_hold_and_a_refused_create_leaves_nothing() -> anyhow::Result<()> {
    let fx = Fixture::start(1, |spec| {
        spec.node_env.push(("SHOAL_SHARD_LIMITS__MAX_SHARDS".into(), "8".into()));
        spec.coordinator_env.push(("SHOAL_COORD_LIMITS__MAX_SHARDS_PER_COLLECTION".into(), "32".into()));
    })?;
    let data = fx.dir.path().join("shard-0");
    block_on(async {
        let mut client = fx.client().await?;
        create(&mut client, "a", 8, 6).await?;
        let err = create(&mut client, "b", 8, 4).await.unwrap_err();
        check!(fx, err.code() == Code::ResourceExhausted, "{err:?}");
        check!(fx, err.message().contains("holds 6 shards") && err.message().contains("max_shards"), "{}", err.message());
        let dirs = shard_dirs(&data)?;
        check!(fx, dirs.len() == 6 && dirs.iter().all(|d| d.starts_with("a/")), "left behind: {dirs:?}");
        let list = client.list_collections(v1::ListCollectionsRequest {}).await?.into_inner();
        check!(fx, collections_named(&list) == ["a"], "{list:?}");
        // Per collection, refused by the coordinator before any node works.
        let err = create(&mut client, "huge", 8, 33).await.unwrap_err();
        check!(fx, err.code() == Code::ResourceExhausted && err.message().contains("max_shards_per_collection"), "{err:?}");
        // What fits still fits; a drop makes room.
        create(&mut client, "c", 8, 2).await?;
        client.drop_collection(v1::DropCollectionRequest { name: "a".into() }).await?;
        create(&mut client, "d", 8, 6).await?;
        let dirs = shard_dirs(&data)?;
        check!(fx, dirs.len() == 8 && !dirs.iter().any(|d| d.starts_with("a/")), "{dirs:?}");
        Ok(())
    })
}

/// A node started with 64 open files cannot carry even one shard with the
/// room it keeps for connections: it says so instead of failing somewhere
/// inside LMDB with "Too many open files" and leaving files behind.
pub(crate) fn a_low_open_file_limit_lowers_the_shard_limit() -> anyhow::Result<()> {
    let fx = Fixture::start(1, |spec| {
        spec.node_open_files.insert(0, 64);
        spec.node_env.push(("SHOAL_SHARD_LISTENER__MAX_CONNECTIONS".into(), "16".into()));
    })?;
    let data = fx.dir.path().join("shard-0");
    block_on(async {
        let mut client = fx.client().await?;
        let err = create(&mut client, "many", 8, 20).await.unwrap_err();
        check!(fx, err.code() == Code::ResourceExhausted, "{err:?}");
        check!(fx, err.message().contains("open-file limit"), "{}", err.message());
        let dirs = shard_dirs(&data)?;
        check!(fx, dirs.is_empty(), "left behind: {dirs:?}");
        check!(fx, fx.cluster.nodes[0].exited()?.is_none(), "the node died");
        Ok(())
    })
}

/// Three rounds of creating a 64-shard collection, filling, searching and
/// dropping it end with the node's open files where they started and its
/// memory close to where it started.
pub(crate) fn dropped_collections_give_back_files_and_memory() -> anyhow::Result<()> {
    let fx = Fixture::start(1, |_| {})?;
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("dropped_collections_give_back_files_and_memory");
        let node = &fx.cluster.nodes[0];
        let mut round = |name: String| {
            let mut client = client.clone();
            let pts = points(&mut rng, 32, 0..3_000);
            let q = vector(&mut rng, 32);
            async move {
                create(&mut client, &name, 32, 64).await?;
                upsert_all(&mut client, &name, pts, 1_000).await?;
                for _ in 0..20 {
                    client.search(v1::SearchRequest { collection: name.clone(), vector: q.clone(), k: 10, ..Default::default() }).await?;
                }
                client.drop_collection(v1::DropCollectionRequest { name }).await?;
                anyhow::Ok(())
            }
        };
        // The first round warms the allocator and the thread pools.
        round("warm".into()).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (files0, rss0) = (node.open_files()?, node.rss_bytes()?);
        let mut peak = 0;
        for i in 0..3 {
            round(format!("round{i}")).await?;
            peak = peak.max(node.rss_bytes()?);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (files1, rss1) = (node.open_files()?, node.rss_bytes()?);
        eprintln!("open files {files0} -> {files1}; RSS {} MiB -> {} MiB (peak {} MiB)", rss0 >> 20, rss1 >> 20, peak >> 20);
        check!(fx, files1 <= files0 + 2, "open files grew from {files0} to {files1}");
        check!(fx, rss1 <= rss0 + rss0 / 4 + (8 << 20), "RSS grew from {rss0} to {rss1} bytes over three create/drop rounds");
        drop(client.list_collections(v1::ListCollectionsRequest {}).await?);
        Ok(())
    })
}
