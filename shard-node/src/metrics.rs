//! The shard node's metrics, through the process's OpenTelemetry meter
//! (served at `/metrics`; see `shoal_server::telemetry`). Their only labels
//! are `collection` and `shard`, so their number grows with the shards a
//! node holds, never with points or requests. Names as Prometheus shows
//! them are listed in docs/observability.md.

use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};
use parking_lot::Mutex;

use crate::host::{ShardHost, ShardKey};

/// Seconds, from 0.1 ms to a minute.
const LATENCY_BOUNDS: [f64; 17] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0];

/// Instruments recorded as work happens.
pub(crate) struct NodeMetrics {
    /// One search request on one shard, from arrival to answer.
    pub(crate) search_duration: Histogram<f64>,
    /// One group commit: the engine's write transaction, fsync included.
    pub(crate) commit_duration: Histogram<f64>,
    /// A batch part's wait in its shard's writer queue.
    pub(crate) queue_wait: Histogram<f64>,
    /// Points upserted and deleted by committed batches.
    pub(crate) points_upserted: Counter<u64>,
    pub(crate) points_deleted: Counter<u64>,
    /// Tombstones unlinked and reclaimed by vacuum steps.
    pub(crate) vacuumed: Counter<u64>,
    /// Searches by the plan a shard ran (label `plan`, see `Explain`).
    pub(crate) search_plans: Counter<u64>,
    /// Points field index builds indexed.
    pub(crate) field_index_built: Counter<u64>,
    /// Link lists idle folds moved from the link log into their blocks.
    pub(crate) folded_lists: Counter<u64>,
    /// Bytes of data files snapshotted or restored, and how long it took.
    pub(crate) snapshot_bytes: Counter<u64>,
    pub(crate) snapshot_duration: Histogram<f64>,
    /// Bytes compactions gave back to the disk, and how long batches
    /// waited for each (the copy; searches wait only for the swap).
    pub(crate) compacted_bytes: Counter<u64>,
    pub(crate) compact_duration: Histogram<f64>,
    /// Bytes the scrub read and checked, its whole passes, and the damaged
    /// values it found (each takes its copy out of service).
    pub(crate) scrubbed_bytes: Counter<u64>,
    pub(crate) scrub_passes: Counter<u64>,
    pub(crate) scrub_damage: Counter<u64>,
}

/// The labels of a shard's searches run with `plan`.
pub(crate) fn plan_labels(key: &ShardKey, plan: &str) -> [KeyValue; 3] {
    let [c, s] = labels(key);
    [c, s, KeyValue::new("plan", plan.to_owned())]
}

/// The labels of a shard.
pub(crate) fn labels(key: &ShardKey) -> [KeyValue; 2] {
    [KeyValue::new("collection", key.0.to_string()), KeyValue::new("shard", i64::from(key.1))]
}

static METRICS: OnceLock<NodeMetrics> = OnceLock::new();

/// The node's instruments (made on first use: after the process set up its
/// telemetry, or as no-ops in a process that has none).
pub(crate) fn get() -> &'static NodeMetrics {
    METRICS.get_or_init(|| {
        let m = meter();
        let seconds = |name: &'static str, what: &'static str| {
            m.f64_histogram(name).with_unit("s").with_description(what).with_boundaries(LATENCY_BOUNDS.to_vec()).build()
        };
        NodeMetrics {
            search_duration: seconds("shoal.shard.search.duration", "A search request on one shard, arrival to answer"),
            commit_duration: seconds("shoal.shard.commit.duration", "One group commit of a shard's writer, fsync included"),
            queue_wait: seconds("shoal.shard.queue.wait", "A batch part's wait in its shard's writer queue"),
            points_upserted: m.u64_counter("shoal.shard.points.upserted").with_description("Points upserted by committed batches").build(),
            points_deleted: m.u64_counter("shoal.shard.points.deleted").with_description("Points deleted by committed batches").build(),
            search_plans: m
                .u64_counter("shoal.shard.search.plans")
                .with_description("Queries a shard answered, by the plan it ran (graph, exact, scan, filtered_graph, empty)")
                .build(),
            field_index_built: m
                .u64_counter("shoal.shard.field_index.built")
                .with_description("Ids an online field index build went over")
                .build(),
            vacuumed: m
                .u64_counter("shoal.shard.vacuumed")
                .with_description("Tombstones a shard's vacuum unlinked from the graph and reclaimed")
                .build(),
            folded_lists: m
                .u64_counter("shoal.shard.link_log.folded")
                .with_description("Link lists an idle fold moved from a shard's link log into their blocks")
                .build(),
            snapshot_bytes: m
                .u64_counter("shoal.snapshot.data")
                .with_unit("By")
                .with_description("Bytes of data files snapshotted or restored, by operation")
                .build(),
            snapshot_duration: seconds("shoal.snapshot.duration", "A shard's snapshot or restore, by operation"),
            compacted_bytes: m
                .u64_counter("shoal.shard.compacted")
                .with_unit("By")
                .with_description("Bytes of free pages a shard's compactions gave back to the disk")
                .build(),
            compact_duration: seconds("shoal.shard.compact.duration", "A shard's compaction: the copy, then the swap"),
            scrubbed_bytes: m
                .u64_counter("shoal.shard.scrub.read")
                .with_unit("By")
                .with_description("Bytes of stored values the background scrub read and checked against their checksums")
                .build(),
            scrub_passes: m.u64_counter("shoal.shard.scrub.passes").with_description("Whole passes of the scrub over a shard").build(),
            scrub_damage: m
                .u64_counter("shoal.shard.scrub.damaged")
                .with_description("Damaged values the scrub found; each takes its shard copy out of service")
                .build(),
        }
    })
}

fn meter() -> Meter {
    opentelemetry::global::meter("shoal-shard-node")
}

/// A finished compaction of the shard labelled `labels`.
pub(crate) fn record_compaction(labels: &[KeyValue; 2], o: &shoal_engine::CompactOutcome) {
    let m = get();
    m.compacted_bytes.add(o.bytes_before.saturating_sub(o.bytes_after), labels);
    m.compact_duration.record(o.copy_seconds + o.swap_seconds, labels);
}

/// Hosts whose shards the gauges report (an embedded cluster runs several
/// nodes in one process; the gauges are registered once for all).
static HOSTS: Mutex<Vec<Weak<ShardHost>>> = Mutex::new(Vec::new());

/// One reading of every shard's state, shared by the gauges of one scrape.
struct Reading {
    at: Instant,
    shards: Vec<ShardReading>,
}

struct ShardReading {
    labels: [KeyValue; 2],
    points: u64,
    tombstones: u64,
    vacuumed: u64,
    link_log_lists: u64,
    disk_bytes: u64,
    map_bytes: u64,
    used_bytes: u64,
    free_bytes: u64,
    queue_depth: u64,
    epoch: u64,
    last_seq: u64,
    batch_log_bytes: u64,
}

static READING: Mutex<Option<Reading>> = Mutex::new(None);

/// Reads every shard once per second at most, whichever gauge asks first.
fn with_reading(f: impl FnOnce(&[ShardReading])) {
    let mut reading = READING.lock();
    let stale = reading.as_ref().is_none_or(|r| r.at.elapsed() > Duration::from_secs(1));
    if stale {
        let mut shards = Vec::new();
        HOSTS.lock().retain(|h| match h.upgrade() {
            Some(host) => {
                for (key, shard) in host.shards_now() {
                    let Ok(s) = shard.index.stats() else { continue };
                    shards.push(ShardReading {
                        labels: labels(&key),
                        points: s.live,
                        tombstones: s.tombstones,
                        vacuumed: s.vacuumed,
                        link_log_lists: s.link_log_lists,
                        disk_bytes: s.disk_bytes,
                        map_bytes: s.map_size,
                        used_bytes: s.used_bytes,
                        free_bytes: s.free_bytes,
                        queue_depth: shard.queue_depth() as u64,
                        epoch: s.epoch,
                        last_seq: s.last_seq,
                        batch_log_bytes: s.batch_log_bytes,
                    });
                }
                true
            }
            None => false,
        });
        *reading = Some(Reading { at: Instant::now(), shards });
    }
    if let Some(r) = reading.as_ref() {
        f(&r.shards);
    }
}

/// Reports `host`'s shards in the per-shard gauges from now on.
pub(crate) fn watch(host: &Arc<ShardHost>) {
    HOSTS.lock().push(Arc::downgrade(host));
    static GAUGES: OnceLock<()> = OnceLock::new();
    GAUGES.get_or_init(register_gauges);
}

fn register_gauges() {
    let m = meter();
    type Field = fn(&ShardReading) -> u64;
    let gauges: [(&'static str, &'static str, &'static str, Field); 12] = [
        ("shoal.shard.points", "", "Live points of a shard", |r| r.points),
        ("shoal.shard.tombstones", "", "Deleted or replaced points whose slots wait for new points", |r| r.tombstones),
        ("shoal.shard.tombstones.vacuumed", "", "Tombstones the vacuum has unlinked from the graph (part of the tombstones)", |r| {
            r.vacuumed
        }),
        ("shoal.shard.link_log.lists", "", "Link lists in a shard's link log, waiting for a fold", |r| r.link_log_lists),
        ("shoal.shard.disk", "By", "Size of a shard's data file", |r| r.disk_bytes),
        ("shoal.shard.lmdb.map", "By", "Size of a shard's LMDB memory map", |r| r.map_bytes),
        (
            "shoal.shard.lmdb.used",
            "By",
            "Bytes of a shard's map up to its last written page; map minus used is the room before the map grows",
            |r| r.used_bytes,
        ),
        (
            "shoal.shard.lmdb.free",
            "By",
            "Bytes of a shard's data file no table holds (LMDB's free pages): what a compaction gives back",
            |r| r.free_bytes,
        ),
        ("shoal.shard.queue.depth", "", "Batch parts waiting for a shard's writer", |r| r.queue_depth),
        ("shoal.shard.epoch", "", "A shard's epoch: writes carrying a lower one are refused", |r| r.epoch),
        ("shoal.shard.batch_log.last_seq", "", "Sequence number of the last batch a shard applied", |r| r.last_seq),
        ("shoal.shard.batch_log", "By", "Bytes of a shard's batch log", |r| r.batch_log_bytes),
    ];
    for (name, unit, what, field) in gauges {
        let mut g = m.u64_observable_gauge(name).with_description(what);
        if !unit.is_empty() {
            g = g.with_unit(unit);
        }
        // The SDK keeps the instrument alive once its callback is set.
        let _ = g
            .with_callback(move |obs| {
                with_reading(|shards| {
                    for r in shards {
                        obs.observe(field(r), &r.labels);
                    }
                });
            })
            .build();
    }
}
