//! `shoal-loadtest`: shoal's benchmarks. Performance targets live here,
//! never in timed tests.

mod chaos;
mod churn;
mod cluster_bench;
mod compare;
mod disk_bench;
mod disk_compare;
mod filtered_bench;
mod filtered_cluster;
use shoal_ops::vectors::fvecs;
mod groundtruth;
mod hardening;
mod host_noise;
mod index_bench;
mod load;
mod memory;
mod otlp_sink;
mod search_bench;
mod slowfs;
mod snapshot_bench;
mod synth;
#[cfg(test)]
mod test_files;
mod trace_breakdown;
mod written;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "shoal-loadtest", about = "Benchmarks for shoal")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build an index from .fvecs files; measure recall, QPS, incremental
    /// inserts, disk and memory (same JSON as ../shared/peers).
    IndexBench(index_bench::Args),
    /// The shared filter cases (../shared/datasets/pypi): selectivity, plan,
    /// recall@10 and single-thread QPS per case and ef, beside a build
    /// without payload indexes (same JSON as ../shared/peers/filtered_bench.py).
    FilteredBench(filtered_bench::Args),
    /// Rounds of upserts, deletes and inserts; recall, QPS, file size and
    /// tombstones after each, beside a fresh build (issue 22).
    Churn(churn::Args),
    /// Ingest rate and search latency of the embedded 3-shard cluster.
    ClusterBench(cluster_bench::Args),
    /// Search existing index directories pass after pass (e.g. the two
    /// that `churn --keep` leaves), to time and profile them side by side.
    SearchBench(search_bench::Args),
    /// Snapshot and restore a shard beside cp / tar|zstd and a rebuild
    /// (docs/snapshots.md).
    SnapshotBench(snapshot_bench::Args),
    /// Print index-bench JSON files (ours and the peers') side by side.
    Compare(compare::Args),
    /// Cold-cache cost of inserts and searches: faults, bytes read, pages
    /// touched per database (issue 8; docs/network-disks.md).
    DiskBench(disk_bench::Args),
    /// Print disk-bench and hannoy-cold JSON files side by side.
    DiskCompare(disk_compare::Args),
    /// Write a synthetic .fvecs file (clustered Gaussian vectors).
    Synth(synth::Args),
    /// Issue 17's hostile-operator measurements against separate processes
    /// from a directory of release binaries (old beside new).
    Hardening(hardening::Args),
    /// Sustained ingest: concurrent Ingest streams at a target rate or flat
    /// out; vectors/s, ack latency, errors by code (docs/loadtest.md).
    Ingest(load::ingest::Args),
    /// Search load, open loop at a rate or closed loop; an ef list sweeps;
    /// latency percentiles, recall@k (docs/loadtest.md).
    Query(load::query::Args),
    /// Ingest, queries, upserts and deletes at once, each at its own rate
    /// (docs/loadtest.md).
    Mixed(load::mixed::Args),
    /// An OTLP/gRPC collector that only counts what it receives (to
    /// measure the cost of exporting telemetry).
    OtlpSink(otlp_sink::Args),
    /// How steady the CPUs are: each spins on fixed work, counted per
    /// 10 ms window; finds the episodes where a shared host slows them
    /// all (run beside tail-latency measurements).
    HostNoise(host_noise::Args),
    /// Mount a FUSE passthrough that adds latency to every read (a
    /// simulated network disk).
    Slowfs(slowfs::Args),
    /// The chaos run: processes on etcd under ingest and search
    /// while nodes, the controller and etcd are killed, stopped and
    /// restarted; then every acknowledged point is read back
    /// (docs/replication.md).
    Chaos(chaos::Args),
}

fn main() -> anyhow::Result<()> {
    // RUST_LOG=shoal_snapshot=debug (for example) shows where a run spends
    // its time (each span's busy and idle time when it closes); quiet by
    // default so the tables stay readable.
    tracing_subscriber::fmt()
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::IndexBench(a) => index_bench::run(a),
        Command::FilteredBench(a) => filtered_bench::run(a),
        Command::Churn(a) => churn::run(a),
        Command::Compare(a) => compare::run(a),
        Command::ClusterBench(a) => cluster_bench::run(a),
        Command::SearchBench(a) => search_bench::run(a),
        Command::SnapshotBench(a) => snapshot_bench::run(a),
        Command::DiskBench(a) => disk_bench::run(a),
        Command::DiskCompare(a) => disk_compare::run(a),
        Command::Slowfs(a) => slowfs::run(a),
        Command::Synth(a) => synth::run(a),
        Command::Hardening(a) => hardening::run(a),
        Command::OtlpSink(a) => otlp_sink::run(a),
        Command::HostNoise(a) => host_noise::run(a),
        Command::Ingest(a) => load::ingest::run(a),
        Command::Query(a) => load::query::run(a),
        Command::Mixed(a) => load::mixed::run(a),
        Command::Chaos(a) => chaos::run(a),
    }
}
