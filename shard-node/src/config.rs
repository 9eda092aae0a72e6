//! Shard node settings: defaults that work on one machine, overridden by a
//! TOML file, then `SHOAL_SHARD_*` environment variables, then flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use shoal_control::ClusterConfig;
use shoal_engine::{BatchLogRetention, IndexOptions, LinkLog};
use shoal_server::{ListenerConfig, TelemetryConfig};

use crate::writer::WriterOptions;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ShardNodeConfig {
    /// This node's id in the cluster membership.
    pub node_id: String,
    /// Address the gRPC server listens on.
    pub listen: SocketAddr,
    /// Address coordinators reach this node on, as it registers in the
    /// cluster (`host:port` or a URL). Default: `listen`, which must then
    /// name a specific address (not 0.0.0.0).
    pub advertise: Option<String>,
    /// The control plane to register in (none: no registration; the
    /// coordinator's configuration lists this node).
    pub cluster: ClusterConfig,
    /// Where shards live (`<data_dir>/shards/<collection>/<shard>`).
    pub data_dir: PathBuf,
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    /// Connections of the gRPC listener.
    pub listener: ListenerConfig,
    /// Threads serving requests (and running small searches); 0: one per
    /// core. Lower it when several shoal processes share the machine's
    /// cores (`shoal_server::runtime`).
    pub worker_threads: usize,
    /// How much this node takes on.
    pub limits: NodeLimits,
    /// Traces and metrics.
    pub telemetry: TelemetryConfig,
    pub engine: EngineConfig,
    pub writer: WriterConfig,
    pub snapshot: SnapshotConfig,
    pub scrub: ScrubConfig,
}

impl ShardNodeConfig {
    /// The URL this node registers under.
    pub fn advertised_url(&self, bound: SocketAddr) -> anyhow::Result<String> {
        match &self.advertise {
            Some(a) => Ok(if a.contains("://") { a.clone() } else { format!("http://{a}") }),
            None if bound.ip().is_unspecified() => anyhow::bail!(
                "the node listens on {bound}, which is no address a coordinator can reach: set shard_node.advertise (--advertise)"
            ),
            None => Ok(format!("http://{bound}")),
        }
    }
}

impl Default for ShardNodeConfig {
    fn default() -> Self {
        ShardNodeConfig {
            node_id: "shard-0".into(),
            listen: "127.0.0.1:7701".parse().expect("literal address"),
            advertise: None,
            cluster: ClusterConfig::default(),
            data_dir: PathBuf::from("./shoal-data/shard-0"),
            max_message_bytes: 64 << 20,
            listener: ListenerConfig::default(),
            worker_threads: 0,
            limits: NodeLimits::default(),
            telemetry: TelemetryConfig::default(),
            engine: EngineConfig::default(),
            writer: WriterConfig::default(),
            snapshot: SnapshotConfig::default(),
            scrub: ScrubConfig::default(),
        }
    }
}

/// Limits that keep one node alive whatever it is asked (see docs/limits.md).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct NodeLimits {
    /// Shards this node holds at most. Each is an LMDB environment with
    /// three open files, a memory map and its caches; the node also lowers
    /// this at start when its open-file limit cannot carry that many.
    pub max_shards: usize,
    /// Shards a collection may have (a create with more is refused).
    pub max_shards_per_collection: u32,
    /// Query vectors in one search request.
    pub max_queries: usize,
    /// Hits one search request may ask for: queries × k. Bounds the memory
    /// and the size of one answer.
    pub max_hits: u64,
    /// Searches computing at once; more wait for a slot (until their
    /// deadline). 0: twice the CPUs.
    pub max_concurrent_searches: usize,
    /// Searches of at most this much work (queries × ef) run on the
    /// request's own task instead of the blocking pool, where the handoff
    /// would cost more than the search; 0 sends every search to the pool.
    pub inline_search_work: u64,
}

impl Default for NodeLimits {
    fn default() -> Self {
        NodeLimits {
            max_shards: 1024,
            max_shards_per_collection: 1024,
            max_queries: 1024,
            max_hits: 1_000_000,
            max_concurrent_searches: 0,
            inline_search_work: 256,
        }
    }
}

impl NodeLimits {
    /// Searches computing at once, with 0 resolved.
    pub fn concurrent_searches(&self) -> usize {
        match self.max_concurrent_searches {
            0 => 2 * std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Threads that link a batch into the graph (0: one per CPU).
    pub build_threads: usize,
    /// Ceiling of each shard's memory map, in bytes.
    pub max_map_size: u64,
    /// fsync every commit before acknowledging it.
    pub durable: bool,
    /// Let the kernel read ahead on page faults.
    pub read_ahead: bool,
    /// A shard whose file is at most this share of the machine's memory
    /// (or of the node's cgroup limit, if lower) is read into the page
    /// cache in order when it opens: searches then ran 1.3x faster than
    /// over a file faulted in page by page (docs/benchmarks.md, "Page cache
    /// warm-up"). 0: never; larger files are left to the graph
    /// walk's faults.
    #[serde(deserialize_with = "share_or_zero")]
    pub warm_max_share: f64,
    /// Largest payload per point, in bytes.
    pub max_payload_bytes: usize,
    /// Bottom-layer lists the link log holds before a batch folds it into
    /// the link blocks; 0 patches every batch's lists in place (see
    /// `shoal_engine::LinkLog` and docs/engine.md).
    pub link_log_fold_lists: usize,
    /// Recent batches each shard keeps so that a copy restored elsewhere
    /// (a shard move) catches up from it; the oldest go first past either
    /// bound. 0 batches keeps no log (a copy can then only be re-seeded).
    pub batch_log_max_batches: u64,
    pub batch_log_max_bytes: u64,
    /// ... and at most this multiple of what the shard's own points take
    /// in the log (0: no such bound; default 0.25): a copy further behind
    /// than that is re-seeded from a snapshot faster than it replays.
    #[serde(deserialize_with = "non_negative")]
    pub batch_log_max_share: f64,
    /// ... which never cuts the log below these bytes.
    pub batch_log_min_bytes: u64,
    /// New points take the slots of deleted and replaced ones, so a shard
    /// under churn stays the size of its live set (docs/engine.md, "Churn:
    /// slots reused, and the vacuum").
    pub reuse_retired: bool,
    /// Share of a shard's graph that tombstones still linked into it may
    /// reach before the shard's writer vacuums them while idle (0 < r ≤ 1).
    #[serde(deserialize_with = "ratio")]
    pub vacuum_ratio: f64,
    /// Lists per graph node that a shard's link log may hold before the
    /// idle writer folds it into the bottom-layer blocks, where searches
    /// read them faster (0: only batches fold, past
    /// `link_log_fold_lists`; docs/engine.md, "The link log").
    #[serde(deserialize_with = "non_negative")]
    pub idle_fold_ratio: f64,
    /// Share of a shard's data file that free pages (LMDB's, which it
    /// reuses but never gives back) may reach before the idle writer, or
    /// `shoalctl shard vacuum`, compacts the file (0 ≤ r ≤ 1; 0: never).
    #[serde(deserialize_with = "share_or_zero")]
    pub compact_free_ratio: f64,
    /// Files smaller than this are never compacted on their own.
    pub compact_min_bytes: u64,
    /// Memory a batch's write transaction keeps for the pages it changes
    /// before LMDB writes some of them to the file ahead of the commit,
    /// which keeps the builder's memory flat in the shard's size (0: no
    /// limit but LMDB's own, 512 MiB or more; see
    /// `IndexOptions::write_memory_bytes`).
    pub write_memory_bytes: u64,
}

/// A share from 0 to 1, both included.
fn share_or_zero<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let r = f64::deserialize(d)?;
    if r.is_finite() && (0.0..=1.0).contains(&r) {
        Ok(r)
    } else {
        Err(serde::de::Error::custom(format!("a share from 0 to 1 was expected, got {r}")))
    }
}

/// A share strictly above 0 and at most 1.
/// A finite number, 0 or more.
fn non_negative<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let r = f64::deserialize(d)?;
    if r.is_finite() && r >= 0.0 {
        Ok(r)
    } else {
        Err(serde::de::Error::custom(format!("a finite number of 0 or more was expected, got {r}")))
    }
}

fn ratio<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let r = f64::deserialize(d)?;
    if r.is_finite() && r > 0.0 && r <= 1.0 {
        Ok(r)
    } else {
        Err(serde::de::Error::custom(format!("a share above 0 and at most 1 was expected, got {r}")))
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        let d = IndexOptions::default();
        EngineConfig {
            build_threads: 0,
            max_map_size: d.max_map_size,
            durable: d.durable,
            read_ahead: d.read_ahead,
            warm_max_share: 0.5,
            max_payload_bytes: d.max_payload_bytes,
            link_log_fold_lists: d.link_log.fold_lists().unwrap_or(0),
            batch_log_max_batches: d.batch_log.max_batches,
            batch_log_max_bytes: d.batch_log.max_bytes,
            batch_log_max_share: d.batch_log.max_share,
            batch_log_min_bytes: d.batch_log.min_bytes,
            reuse_retired: d.reuse_retired,
            vacuum_ratio: d.vacuum_ratio,
            idle_fold_ratio: d.idle_fold_ratio,
            compact_free_ratio: d.compact_free_ratio,
            compact_min_bytes: d.compact_min_bytes,
            write_memory_bytes: d.write_memory_bytes,
        }
    }
}

impl EngineConfig {
    pub fn index_options(&self) -> IndexOptions {
        let mut o = IndexOptions::default();
        if self.build_threads > 0 {
            o.build_threads = self.build_threads;
        }
        o.max_map_size = self.max_map_size;
        o.durable = self.durable;
        o.read_ahead = self.read_ahead;
        o.warm_max_bytes = (self.warm_max_share * memory_limit_bytes() as f64) as u64;
        o.max_payload_bytes = self.max_payload_bytes;
        o.link_log = match self.link_log_fold_lists {
            0 => LinkLog::Off,
            fold_lists => LinkLog::Auto { fold_lists },
        };
        o.batch_log = BatchLogRetention {
            max_batches: self.batch_log_max_batches,
            max_bytes: self.batch_log_max_bytes,
            max_share: self.batch_log_max_share,
            min_bytes: self.batch_log_min_bytes,
        };
        o.reuse_retired = self.reuse_retired;
        o.vacuum_ratio = self.vacuum_ratio;
        o.idle_fold_ratio = self.idle_fold_ratio;
        o.compact_free_ratio = self.compact_free_ratio;
        o.compact_min_bytes = self.compact_min_bytes;
        o.write_memory_bytes = self.write_memory_bytes;
        o
    }
}

/// The memory this process may fill: the machine's (`MemTotal`), or its
/// cgroup's limit if lower; 0 if neither can be read.
fn memory_limit_bytes() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find_map(|l| l.strip_prefix("MemTotal:").map(str::trim).map(str::to_owned)))
        .and_then(|kb| kb.trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024);
    // cgroup v2; "max" (no limit) does not parse and leaves the total.
    let limit = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok().and_then(|l| l.trim().parse::<u64>().ok());
    limit.map_or(total, |l| l.min(total))
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct WriterConfig {
    pub queue_depth: usize,
    pub max_group_parts: usize,
    pub max_group_ops: usize,
    /// Tombstones per vacuum step when the writer vacuums while idle (0:
    /// never on its own; `shoalctl shard vacuum` still can).
    pub vacuum_step: usize,
    /// Seconds without a write after which a shard is at rest and is
    /// compacted once if its free pages are at least `rest_compact_ratio`
    /// of its file (0: never; see `WriterOptions::rest_after`).
    pub rest_after_secs: u64,
    #[serde(deserialize_with = "share_or_zero")]
    pub rest_compact_ratio: f64,
}

impl Default for WriterConfig {
    fn default() -> Self {
        let d = WriterOptions::default();
        WriterConfig {
            queue_depth: d.queue_depth,
            max_group_parts: d.max_group_parts,
            max_group_ops: d.max_group_ops,
            vacuum_step: d.vacuum_step,
            rest_after_secs: d.rest_after.as_secs(),
            rest_compact_ratio: d.rest_compact_ratio,
        }
    }
}

impl WriterConfig {
    pub fn options(&self) -> WriterOptions {
        WriterOptions {
            queue_depth: self.queue_depth.max(1),
            max_group_parts: self.max_group_parts.max(1),
            max_group_ops: self.max_group_ops.max(1),
            vacuum_step: self.vacuum_step,
            rest_after: std::time::Duration::from_secs(self.rest_after_secs),
            rest_compact_ratio: self.rest_compact_ratio,
        }
    }
}

/// The background scrub, which reads every stored value of every shard
/// back and checks it against its checksum (see docs/replication.md,
/// "Damaged copies").
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ScrubConfig {
    /// Bytes per second the node reads for it, all its shards together
    /// (they share its disk); 0: no scrub.
    pub bytes_per_second: u64,
    /// Bytes one step reads in one read transaction.
    pub step_bytes: u64,
}

impl Default for ScrubConfig {
    fn default() -> Self {
        ScrubConfig { bytes_per_second: 8 << 20, step_bytes: 1 << 20 }
    }
}

/// Where and how this node stores shard snapshots (see docs/snapshots.md).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct SnapshotConfig {
    /// Object store: a directory (relative to the working directory),
    /// `file:///absolute/path`, or `s3://bucket/prefix` (settings from the
    /// `AWS_*` environment variables or `?endpoint=...&region=...`). Nodes
    /// that should restore each other's snapshots need the same store.
    pub url: String,
    /// zstd level, 1 to 22.
    pub zstd_level: i32,
    /// Raw bytes per chunk.
    pub chunk_bytes: usize,
    /// Chunks moving to or from the store at once.
    pub concurrency: usize,
    /// Snapshots a prune keeps per shard when the request does not say.
    pub keep_last: u32,
    /// A prune deletes unreferenced chunks only when they are older than
    /// this (they may belong to a snapshot being uploaded).
    pub gc_grace_secs: u64,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            url: "./shoal-data/snapshots".into(),
            zstd_level: 3,
            chunk_bytes: 4 << 20,
            concurrency: 8,
            keep_last: 3,
            gc_grace_secs: 3600,
        }
    }
}
