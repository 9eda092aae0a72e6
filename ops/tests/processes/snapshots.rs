//! A collection snapshot that a node kill cuts short is listed as
//! incomplete (with the shard it lacks), cannot restore the collection, and
//! is deleted by the next prune once older than the grace period.

use shoal_proto::v1;
use tonic::Code;

use crate::check;
use crate::common::{Fixture, block_on, create, points, rng, upsert_all};

pub(crate) fn an_interrupted_collection_snapshot_is_listed_incomplete_and_pruned() -> anyhow::Result<()> {
    let fx = Fixture::start(3, |spec| {
        // No grace: the test's incomplete snapshot is old enough at once.
        spec.node_env.push(("SHOAL_SHARD_SNAPSHOT__GC_GRACE_SECS".into(), "0".into()));
    })?;
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("an_interrupted_collection_snapshot_is_listed_incomplete_and_pruned");
        create(&mut client, "docs", 16, 3).await?;
        upsert_all(&mut client, "docs", points(&mut rng, 16, 0..3_000), 1_000).await?;
        let snap = |id: &str| v1::CreateSnapshotRequest { collection: "docs".into(), snapshot_id: id.into(), zstd_level: 0 };
        client.create_snapshot(snap("good")).await?;

        // The node of shard 2 dies; the snapshot publishes shards 0 and 1.
        fx.cluster.nodes[2].kill()?;
        let err = client.create_snapshot(snap("cut")).await.expect_err("a node is dead");
        check!(fx, err.code() == Code::Unavailable, "{err:?}");
        check!(fx, err.message().contains("shards published: [0, 1]"), "{}", err.message());

        let list = client.list_snapshots(v1::ListSnapshotsRequest { collection: "docs".into(), shard: None }).await?.into_inner();
        let of = |id: &str| list.collection_snapshots.iter().find(|c| c.id == id).cloned();
        let good = of("good").ok_or_else(|| anyhow::anyhow!("good not listed: {list:?}"))?;
        let cut = of("cut").ok_or_else(|| anyhow::anyhow!("cut not listed: {list:?}"))?;
        check!(fx, good.complete && good.shards == [0, 1, 2], "{good:?}");
        check!(fx, !cut.complete && cut.shards == [0, 1] && cut.missing == [2] && cut.shard_count == 3, "{cut:?}");
        check!(fx, cut.why_incomplete.contains("no manifest for shard 2 of 3"), "{}", cut.why_incomplete);

        let restore = v1::RestoreSnapshotRequest { collection: "docs".into(), snapshot_id: "cut".into(), shard: None, replace: true };
        let err = client.restore_snapshot(restore).await.expect_err("incomplete");
        check!(fx, err.code() == Code::NotFound && err.message().contains("incomplete"), "{err:?}");

        let pruned =
            client.prune_snapshots(v1::PruneSnapshotsRequest { collection: "docs".into(), shard: None, keep_last: 5 }).await?.into_inner();
        let deleted: Vec<&str> = pruned.deleted_incomplete.iter().map(|c| c.id.as_str()).collect();
        check!(fx, deleted == ["cut"], "{pruned:?}");
        let list = client.list_snapshots(v1::ListSnapshotsRequest { collection: "docs".into(), shard: None }).await?.into_inner();
        let ids: Vec<&str> = list.collection_snapshots.iter().map(|c| c.id.as_str()).collect();
        check!(fx, ids == ["good"], "{list:?}");
        check!(fx, list.snapshots.iter().all(|s| s.id == "good"), "{list:?}");
        Ok(())
    })
}
