//! `shoalctl node list|drain|undrain`, `shoalctl shard move` and
//! `shoalctl rebalance`: the operator's side of the control plane
//! (docs/control-plane.md). Each command asks a coordinator, which records
//! the request; the controller carries it out. By default a command waits
//! until the work is done (`--no-wait` returns once it is recorded), and a
//! command interrupted while waiting leaves the work going on.

use std::time::Duration;

use shoal_proto::v1;

use crate::ctl;

/// The `node` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum NodeCommand {
    /// Every member with its state, address, shards and free disk.
    List,
    /// Move every shard off a node; it takes no new ones. Prints
    /// "removable" when the node holds nothing and can be stopped.
    Drain {
        node: String,
        /// Return once the drain is recorded.
        #[arg(long)]
        no_wait: bool,
        /// Give up waiting after this many seconds (the drain goes on).
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Let a drained node take shards again.
    Undrain { node: String },
}

/// The `shard` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum ShardCommand {
    /// Move one shard to another node while it serves.
    Move {
        /// `collection/shard`, e.g. `docs/2`.
        shard: String,
        /// Target node (default: the serving node holding the fewest shards).
        #[arg(long)]
        to: Option<String>,
        /// With replicas: the node whose copy moves (default: the primary).
        #[arg(long)]
        from: Option<String>,
        /// Return once the move is recorded.
        #[arg(long)]
        no_wait: bool,
        /// Give up waiting after this many seconds (the move goes on).
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Restore a shard whose node is gone (its lease ended) on another
    /// node from its latest snapshot; ingest jobs then resume from their
    /// offsets (GetOffsets), which the snapshot carries.
    Recover {
        /// `collection/shard`, e.g. `docs/2`.
        shard: String,
        /// Target node (default: the serving node holding the fewest shards).
        #[arg(long)]
        to: Option<String>,
        /// Snapshot id (default: the shard's latest).
        #[arg(long)]
        snapshot: Option<String>,
    },
    /// Check that the replicas of a shard hold the same points: each
    /// digests its points and offsets; the in-sync ones must agree (exits
    /// with an error if they do not).
    Verify {
        /// `collection/shard`, e.g. `docs/2`, or a collection name: every
        /// shard of it.
        shard: String,
    },
    /// Unlink a shard's tombstones from its graph and reclaim their
    /// vectors now, on every copy, then compact a file whose free pages
    /// pass `engine.compact_free_ratio` (shards also do both on their own
    /// once tombstones pass `engine.vacuum_ratio` of the graph, and free
    /// pages that ratio of the file).
    Vacuum {
        /// `collection/shard`, e.g. `docs/2`, or a collection name: every
        /// shard of it.
        shard: String,
    },
    /// Take a replica that disagrees with the primary out of the in-sync
    /// set: it is seeded anew from the primary and rejoins.
    Resync {
        /// `collection/shard`, e.g. `docs/2`.
        shard: String,
        /// The node of the replica to seed anew (not the primary's).
        #[arg(long)]
        node: String,
        /// Return once it is taken out, not once it is in sync again.
        #[arg(long)]
        no_wait: bool,
    },
}

/// `collection/shard` as the commands take it.
pub fn parse_shard(s: &str) -> anyhow::Result<(String, u32)> {
    let (c, i) = s.rsplit_once('/').ok_or_else(|| anyhow::anyhow!("{s:?} is not collection/shard (e.g. docs/2)"))?;
    let i = i.parse().map_err(|_| anyhow::anyhow!("{s:?}: shard {i:?} is not a number"))?;
    Ok((c.to_owned(), i))
}

fn timed<T>(msg: T, timeout: u64) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(Duration::from_secs(timeout));
    r
}

fn print_move(m: &v1::ShardMove) {
    let to = if m.to_node.is_empty() { "?" } else { &m.to_node };
    println!("  {}/{}: {} -> {}  {}", m.collection, m.shard, m.from_node, to, m.phase);
}

pub async fn node(endpoint: &str, cmd: NodeCommand) -> anyhow::Result<()> {
    let mut client = ctl::connect(endpoint).await?;
    match cmd {
        NodeCommand::List => ctl::print_nodes(&client.cluster_status(v1::ClusterStatusRequest {}).await?.into_inner()),
        NodeCommand::Drain { node, no_wait, timeout } => {
            if !no_wait {
                println!("draining {node}: moving its shards (Ctrl-C stops waiting, not the drain)");
            }
            let req = v1::DrainNodeRequest { node: node.clone(), undrain: false, wait: !no_wait };
            let r = client.drain_node(timed(req, timeout)).await?.into_inner();
            if r.removable {
                println!("{node}: removable (holds no shard)");
            } else {
                println!("{node}: draining, {} shards to move", r.moves.len());
                r.moves.iter().for_each(print_move);
            }
        }
        NodeCommand::Undrain { node } => {
            client.drain_node(v1::DrainNodeRequest { node: node.clone(), undrain: true, wait: false }).await?;
            println!("{node}: takes shards again");
        }
    }
    Ok(())
}

pub async fn shard(endpoint: &str, cmd: ShardCommand) -> anyhow::Result<()> {
    let mut client = ctl::connect(endpoint).await?;
    match cmd {
        ShardCommand::Move { shard, to, from, no_wait, timeout } => {
            let (collection, shard) = parse_shard(&shard)?;
            let req = v1::MoveShardRequest {
                collection,
                shard,
                to_node: to.unwrap_or_default(),
                wait: !no_wait,
                from_node: from.unwrap_or_default(),
            };
            let r = client.move_shard(timed(req, timeout)).await?.into_inner();
            if let Some(m) = &r.r#move {
                print_move(m);
            }
        }
        ShardCommand::Recover { shard, to, snapshot } => {
            let (collection, shard) = parse_shard(&shard)?;
            let req = v1::RecoverShardRequest {
                collection: collection.clone(),
                shard,
                to_node: to.unwrap_or_default(),
                snapshot_id: snapshot.unwrap_or_default(),
            };
            let r = client.recover_shard(req).await?.into_inner();
            let (node, epoch, points) = r.shard.as_ref().map_or(("?", 0, 0), |s| (s.node.as_str(), s.epoch, s.points));
            let snap = r.snapshot.unwrap_or_default();
            println!(
                "{collection}/{shard}: recovered on {node} (epoch {epoch}, {points} points) from snapshot {} of {}",
                snap.id, snap.created_at
            );
            println!("  {} is out of its placement; ingest jobs resume from their offsets:", r.from_node);
            for o in &snap.offsets {
                println!("  source {}: offset {}", o.source, o.offset);
            }
        }
        ShardCommand::Verify { shard } => {
            let shards = match shard.contains('/') {
                true => vec![parse_shard(&shard)?],
                false => {
                    let c = client.describe_collection(v1::DescribeCollectionRequest { name: shard.clone() }).await?.into_inner();
                    (0..c.shard_count).map(|i| (shard.clone(), i)).collect()
                }
            };
            let mut disagree = Vec::new();
            for (collection, shard) in shards {
                if !verify(&mut client, &collection, shard).await? {
                    disagree.push(format!("{collection}/{shard}"));
                }
            }
            anyhow::ensure!(disagree.is_empty(), "the in-sync replicas DISAGREE (or one did not answer): {}", disagree.join(" "));
        }
        ShardCommand::Vacuum { shard } => {
            let shards = match shard.contains('/') {
                true => vec![parse_shard(&shard)?],
                false => {
                    let c = client.describe_collection(v1::DescribeCollectionRequest { name: shard.clone() }).await?.into_inner();
                    (0..c.shard_count).map(|i| (shard.clone(), i)).collect()
                }
            };
            let mut failed = Vec::new();
            for (collection, shard) in shards {
                let r = client.vacuum_shard(v1::VacuumShardRequest { collection: collection.clone(), shard }).await?.into_inner();
                for v in &r.replicas {
                    if v.error.is_empty() {
                        println!(
                            "{collection}/{shard} {:<12} vacuumed {:<8} in {} steps; {} still linked; points {} tombstones {} disk {:.1} MiB{}",
                            v.node,
                            v.vacuumed,
                            v.steps,
                            v.pending,
                            v.points,
                            v.tombstones,
                            v.disk_bytes as f64 / (1 << 20) as f64,
                            match v.reclaimed_bytes {
                                0 => String::new(),
                                b => format!(" (compacted: {:.1} MiB given back)", b as f64 / (1 << 20) as f64),
                            }
                        );
                    } else {
                        println!("{collection}/{shard} {:<12} FAILED: {}", v.node, v.error);
                        failed.push(format!("{collection}/{shard} on {}", v.node));
                    }
                }
            }
            anyhow::ensure!(failed.is_empty(), "the vacuum failed on: {}", failed.join(", "));
        }
        ShardCommand::Resync { shard, node, no_wait } => {
            let (collection, shard) = parse_shard(&shard)?;
            let req = v1::ResyncReplicaRequest { collection: collection.clone(), shard, node: node.clone(), wait: !no_wait };
            let info = client.resync_replica(req).await?.into_inner();
            let state = info
                .shards
                .get(shard as usize)
                .and_then(|s| s.replicas.iter().find(|r| r.node == node))
                .map_or("gone", |r| r.state.as_str());
            println!("{collection}/{shard}: the replica on {node} is {state}");
        }
    }
    Ok(())
}

/// Prints every replica's digest of one shard; whether the in-sync ones
/// agree.
async fn verify(client: &mut shoal_proto::auth::KeyedClient, collection: &str, shard: u32) -> anyhow::Result<bool> {
    let r = client.verify_shard(v1::VerifyShardRequest { collection: collection.to_owned(), shard }).await?.into_inner();
    for d in &r.replicas {
        if d.error.is_empty() {
            let offsets: Vec<String> = d.offsets.iter().map(|o| format!("{}@{}", o.source, o.offset)).collect();
            println!(
                "{collection}/{shard} {:<12} {:<10} points {:<10} digest {}  batch {}  offsets {}",
                d.node,
                d.state,
                d.points,
                d.digest.get(..16).unwrap_or(&d.digest),
                d.last_seq,
                offsets.join(" ")
            );
            if d.index_mismatches > 0 {
                println!(
                    "{collection}/{shard} {:<12} its field indexes disagree with its payloads on {} entries: resync it",
                    d.node, d.index_mismatches
                );
            }
        } else {
            println!("{collection}/{shard} {:<12} {:<10} no answer: {}", d.node, d.state, d.error);
        }
    }
    match r.agree {
        true => println!("{collection}/{shard}: the in-sync replicas agree"),
        false => println!("{collection}/{shard}: the in-sync replicas DISAGREE (or one did not answer)"),
    }
    Ok(r.agree)
}

pub async fn rebalance(endpoint: &str, dry_run: bool, no_wait: bool, timeout: u64) -> anyhow::Result<()> {
    let mut client = ctl::connect(endpoint).await?;
    let r = client.rebalance(timed(v1::RebalanceRequest { dry_run, wait: !no_wait }, timeout)).await?.into_inner();
    if r.moves.is_empty() {
        println!("balanced: nothing to move");
    }
    r.moves.iter().for_each(print_move);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_collection_slash_index() {
        assert_eq!(parse_shard("docs/2").unwrap(), ("docs".to_owned(), 2));
        assert!(parse_shard("docs").unwrap_err().to_string().contains("collection/shard"));
        assert!(parse_shard("docs/x").unwrap_err().to_string().contains("not a number"));
    }
}
