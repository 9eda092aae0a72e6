//! `shoalctl snapshot create|list|restore|prune`: collection snapshots
//! through the coordinator, with a progress bar fed by the nodes'
//! progress counters while a snapshot or restore runs.

use std::future::Future;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use shoal_proto::v1;

use crate::ctl;

/// The `snapshot` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Snapshot every shard of a collection to the nodes' object store.
    Create {
        collection: String,
        /// Snapshot id (default: the UTC time and a random suffix).
        #[arg(long)]
        id: Option<String>,
        /// zstd level, 1 to 22 (default: each node's setting).
        #[arg(long)]
        zstd_level: Option<u32>,
    },
    /// List a collection's snapshots.
    List {
        collection: String,
        #[arg(long)]
        shard: Option<u32>,
    },
    /// Restore a collection (or one shard) from a snapshot id.
    Restore {
        collection: String,
        /// Snapshot id (see `snapshot list`).
        id: String,
        #[arg(long)]
        shard: Option<u32>,
        /// Overwrite shards that exist.
        #[arg(long)]
        replace: bool,
    },
    /// Keep the last N snapshots per shard; delete chunks nothing names.
    Prune {
        collection: String,
        /// Snapshots kept per shard (default: the node's `snapshot.keep_last`).
        #[arg(long)]
        keep: Option<u32>,
        #[arg(long)]
        shard: Option<u32>,
    },
}

pub async fn run(endpoint: &str, cmd: SnapshotCommand) -> anyhow::Result<()> {
    let mut client = ctl::connect(endpoint).await?;
    match cmd {
        SnapshotCommand::Create { collection, id, zstd_level } => {
            let req = v1::CreateSnapshotRequest {
                collection: collection.clone(),
                snapshot_id: id.unwrap_or_default(),
                zstd_level: zstd_level.unwrap_or(0),
            };
            let call = {
                let mut c = client.clone();
                async move { c.create_snapshot(req).await }
            };
            let resp = with_progress(&mut client, &collection, "snapshot", call).await?.into_inner();
            println!("snapshot {} of {collection}:", resp.snapshot_id);
            print_infos(&resp.shards);
            let image: u64 = resp.shards.iter().map(|s| s.image_bytes).sum();
            let uploaded: u64 = resp.shards.iter().map(|s| s.uploaded_bytes).sum();
            println!("  total: {} of data files, {} uploaded (the rest was in the store)", mib(image), mib(uploaded));
        }
        SnapshotCommand::List { collection, shard } => {
            let list = client.list_snapshots(v1::ListSnapshotsRequest { collection: collection.clone(), shard }).await?.into_inner();
            if list.snapshots.is_empty() {
                println!("no snapshots of {collection}");
            }
            print_infos(&list.snapshots);
            print_collection_snapshots(&list.collection_snapshots);
        }
        SnapshotCommand::Restore { collection, id, shard, replace } => {
            let req = v1::RestoreSnapshotRequest { collection: collection.clone(), snapshot_id: id.clone(), shard, replace };
            let call = {
                let mut c = client.clone();
                async move { c.restore_snapshot(req).await }
            };
            let resp = with_progress(&mut client, &collection, "restore", call).await?.into_inner();
            println!("restored snapshot {id} of {collection}:");
            print_infos(&resp.restored);
            if let Some(c) = &resp.collection {
                ctl::print_collection(c);
            }
        }
        SnapshotCommand::Prune { collection, keep, shard } => {
            let r = client
                .prune_snapshots(v1::PruneSnapshotsRequest { collection: collection.clone(), shard, keep_last: keep.unwrap_or(0) })
                .await?
                .into_inner();
            println!("pruned {collection}: {} snapshots deleted, {} kept", r.deleted.len(), r.kept_snapshots);
            for d in &r.deleted {
                println!("  deleted {d}");
            }
            for c in &r.deleted_incomplete {
                println!("  deleted incomplete snapshot {} ({})", c.id, c.why_incomplete);
            }
            for c in &r.young_incomplete {
                println!(
                    "  kept incomplete snapshot {} ({}): younger than the grace period, maybe still being taken",
                    c.id, c.why_incomplete
                );
            }
            if r.chunk_pass_skipped.is_empty() {
                println!(
                    "chunks: {} deleted ({}), {} referenced, {} unreferenced but younger than the grace period",
                    r.deleted_chunks,
                    mib(r.deleted_bytes),
                    r.referenced_chunks,
                    r.young_unreferenced_chunks
                );
            } else {
                println!("chunks: none deleted: {}", r.chunk_pass_skipped);
            }
        }
    }
    Ok(())
}

/// Runs `call` while a bar shows the collection's running operations
/// (bytes done of the total, rate, time left), polled from the nodes.
async fn with_progress<T>(
    client: &mut shoal_proto::auth::KeyedClient,
    collection: &str,
    what: &str,
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> anyhow::Result<T> {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {prefix} [{elapsed_precise}] {wide_bar} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(what.to_owned());
    tokio::pin!(call);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let out = loop {
        tokio::select! {
            r = &mut call => break r,
            _ = tick.tick() => {
                let req = v1::GetSnapshotProgressRequest { collection: collection.to_owned() };
                if let Ok(p) = client.get_snapshot_progress(req).await {
                    let running = p.into_inner().running;
                    if !running.is_empty() {
                        bar.set_length(running.iter().map(|r| r.bytes_total).sum());
                        bar.set_position(running.iter().map(|r| r.bytes_done).sum());
                        let sent: u64 = running.iter().map(|r| r.bytes_transferred).sum();
                        bar.set_message(format!("{} shards running, {} over the network", running.len(), mib(sent)));
                    }
                }
            }
        }
    };
    bar.finish_and_clear();
    Ok(out?)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

fn print_infos(infos: &[v1::SnapshotInfo]) {
    println!(
        "  {:<28} {:>5} {:>9} {:>11} {:>11} {:>11} {:>9}  offsets",
        "id", "shard", "points", "data file", "stored", "uploaded", "took"
    );
    for s in infos {
        if !s.error.is_empty() {
            println!("  {:<28} {:>5} UNREADABLE: {}", s.id, s.shard, s.error);
            continue;
        }
        let offsets: Vec<String> = s.offsets.iter().map(|o| format!("{}@{}", o.source, o.offset)).collect();
        let took = if s.duration_ms > 0 { format!("{:.2}s", s.duration_ms as f64 / 1000.0) } else { String::new() };
        println!(
            "  {:<28} {:>5} {:>9} {:>11} {:>11} {:>11} {:>9}  {}",
            s.id,
            s.shard,
            s.points,
            mib(s.image_bytes),
            mib(s.stored_bytes),
            mib(s.uploaded_bytes),
            took,
            offsets.join(" ")
        );
    }
}

/// One line per snapshot id: complete (restorable as a collection) or not.
fn print_collection_snapshots(all: &[v1::CollectionSnapshot]) {
    if all.is_empty() {
        return;
    }
    println!();
    println!("  {:<28} {:>6}  state", "collection snapshot", "shards");
    for c in all {
        let state = if c.complete {
            "complete".to_owned()
        } else {
            format!("INCOMPLETE ({}), age {:.0} s", c.why_incomplete, c.age_ms as f64 / 1000.0)
        };
        println!("  {:<28} {:>6}  {state}", c.id, format!("{}/{}", c.shards.len(), c.shard_count));
    }
}
