//! `shoalctl ingest`: loads files of embeddings into a collection through
//! the exactly-once `Ingest` + `GetOffsets` contract (docs/ingest.md).
//!
//! Data flows one way: the files' rows are read and checked in order
//! (`input`), cut into batches that always come out the same (`plan`),
//! dealt to concurrent streams, each its own source (`stream`), and
//! acknowledged. Killed at any moment and run again with the same
//! arguments, the job asks where each of its sources stands and sends
//! only what comes after.

mod fields;
pub mod input;
pub mod parquet;
pub mod plan;
pub mod stream;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use shoal_proto::v1;
use tokio::sync::mpsc;

use self::input::{Checks, Input, JsonFields, Rows};
use self::plan::{Batcher, Plan};
use self::stream::{Counters, Outgoing, Stream};

/// Flags of `shoalctl ingest`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The collection to load into.
    #[arg(long)]
    pub collection: String,
    /// The job's name: run again with the same name (and files and flags),
    /// it resumes after what was acknowledged.
    #[arg(long)]
    pub source: String,
    /// `.fvecs`, `.npy` (2-d float32), JSON Lines (`.jsonl`, `.ndjson`) or
    /// Parquet (`.parquet`), read in this order.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Create the collection if it does not exist, with the files'
    /// dimension.
    #[arg(long)]
    pub create: bool,
    /// With --create: cosine, dot or euclidean.
    #[arg(long, default_value = "cosine")]
    pub metric: String,
    /// With --create: shards (default: the coordinator's).
    #[arg(long, default_value_t = 0)]
    pub shards: u32,
    /// With --create: full copies of every shard.
    #[arg(long, default_value_t = 0)]
    pub replication_factor: u32,
    /// Concurrent Ingest streams.
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// A batch holds rows up to about this many bytes (vectors and payloads).
    #[arg(long, default_value_t = 4 << 20)]
    pub batch_bytes: usize,
    /// A batch holds at most this many rows.
    #[arg(long, default_value_t = 10_000)]
    pub batch_points: usize,
    /// Batches a stream sends ahead of their acks.
    #[arg(long, default_value_t = 2)]
    pub window: usize,
    /// A row's id is its number (from 0, across the files) plus this,
    /// unless the row has an id (a JSON line's id field, a Parquet id column).
    #[arg(long, default_value_t = 0)]
    pub id_start: u64,
    /// JSON Lines and Parquet: the field or column holding the id ("" for
    /// row numbers; a file without it is numbered too).
    #[arg(long, default_value = "id")]
    pub id_field: String,
    /// JSON Lines and Parquet: the field or column holding the vector.
    #[arg(long, default_value = "vector")]
    pub vector_field: String,
    /// Give up after this many seconds without an acknowledged batch
    /// (the cluster unavailable meanwhile).
    #[arg(long, default_value_t = 300)]
    pub retry_for: u64,
    /// No progress bar (one line at the end still says what was done).
    #[arg(long)]
    pub quiet: bool,
}

/// What a job did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub rows: u64,
    /// Rows acknowledged by an earlier run of the same job, not sent again.
    pub resumed_rows: u64,
    pub batches: u64,
    pub bytes: u64,
    /// Batches sent again after a broken call and found applied.
    pub skipped_batches: u64,
    pub retries: u64,
}

pub async fn run(endpoint: &str, a: Args) -> Result<Summary> {
    anyhow::ensure!(a.streams >= 1, "--streams must be at least 1");
    anyhow::ensure!(a.batch_bytes >= 1 && a.batch_points >= 1, "--batch-bytes and --batch-points must be at least 1");
    let fields = JsonFields { vector: a.vector_field.clone(), id: (!a.id_field.is_empty()).then(|| a.id_field.clone()) };
    let inputs = a.files.iter().map(|f| Input::open(f, &fields)).collect::<Result<Vec<_>>>()?;
    let mut client = crate::ctl::connect(endpoint).await?;
    let collection = collection(&mut client, &a, &inputs).await?;
    let checks = Checks { dim: collection.dimension as usize, nonzero: collection.metric == v1::Metric::Cosine as i32 };
    let mut rows = Rows::new(inputs, a.id_start, fields, checks)?;
    let plan = Plan { streams: a.streams, batch_bytes: a.batch_bytes, batch_points: a.batch_points };
    let resume = plan.resume_from(&a.source, &stream::offsets(&mut client, &a.collection).await?)?;

    let total = rows.total();
    let progress = if a.quiet { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(total) };
    progress.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} rows  {per_sec}  ETA {eta}  {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let counters = Arc::new(Counters::default());
    let started = Instant::now();
    let mut senders = Vec::new();
    let mut streams = Vec::new();
    for s in 0..plan.streams {
        let (tx, rx) = mpsc::channel(a.window.max(1));
        senders.push(tx);
        let st = Stream {
            client: client.clone(),
            collection: a.collection.clone(),
            source: plan.source(&a.source, s),
            window: a.window,
            retry_for: Duration::from_secs(a.retry_for),
            counters: Arc::clone(&counters),
            progress: progress.clone(),
        };
        streams.push(tokio::spawn(st.run(rx)));
    }
    let reading = {
        let progress = progress.clone();
        tokio::task::spawn_blocking(move || read(&mut rows, plan, &resume, &senders, &progress))
    };
    let read_result = reading.await.context("the reader")?;
    // Every stream finishes what it sent, even after a bad row: what is
    // acknowledged stays, and a run after the fix resumes after it.
    let mut stream_error = None;
    for s in streams {
        if let Err(e) = s.await.context("a stream")? {
            stream_error.get_or_insert(e);
        }
    }
    progress.finish_and_clear();
    let resumed_rows = read_result.as_ref().map_or(0, |r| *r);
    let summary = Summary {
        rows: counters.rows.load(Ordering::Relaxed),
        resumed_rows,
        batches: counters.batches.load(Ordering::Relaxed),
        bytes: counters.bytes.load(Ordering::Relaxed),
        skipped_batches: counters.skipped.load(Ordering::Relaxed),
        retries: counters.retries.load(Ordering::Relaxed),
    };
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    println!(
        "{}: {} rows in {} batches over {} streams in {secs:.1} s ({:.0} rows/s, {:.1} MB/s){}{}",
        a.collection,
        summary.rows,
        summary.batches,
        a.streams,
        summary.rows as f64 / secs,
        summary.bytes as f64 / secs / 1e6,
        if resumed_rows > 0 { format!("; {resumed_rows} rows were acknowledged by an earlier run") } else { String::new() },
        if summary.retries > 0 { format!("; {} calls retried", summary.retries) } else { String::new() },
    );
    // A stream that failed closed its input, so the reader's own error
    // ("ended early") says less than the stream's.
    if let Some(e) = stream_error {
        return Err(e);
    }
    read_result?;
    Ok(summary)
}

/// The collection, created from the files' dimension with `--create`.
async fn collection(client: &mut shoal_proto::auth::KeyedClient, a: &Args, inputs: &[Input]) -> Result<v1::CollectionInfo> {
    match client.describe_collection(v1::DescribeCollectionRequest { name: a.collection.clone() }).await {
        Ok(c) => Ok(c.into_inner()),
        Err(e) if e.code() == tonic::Code::NotFound && a.create => {
            let Some(dim) = inputs.iter().find_map(|i| i.dim) else { bail!("the files hold no rows to take a dimension from") };
            let req = v1::CreateCollectionRequest {
                name: a.collection.clone(),
                dimension: dim as u32,
                metric: crate::ctl::parse_metric(&a.metric)? as i32,
                shard_count: a.shards,
                replication_factor: a.replication_factor,
                ..Default::default()
            };
            let c = client.create_collection(req).await.with_context(|| format!("creating {}", a.collection))?.into_inner();
            eprintln!("created {} (dimension {dim}, {}, {} shards)", c.name, a.metric, c.shard_count);
            Ok(c)
        }
        Err(e) if e.code() == tonic::Code::NotFound => {
            bail!("no collection {:?}: --create makes it with the files' dimension", a.collection)
        }
        Err(e) => Err(e).with_context(|| format!("describing {}", a.collection)),
    }
}

/// Reads every row, cuts batches and deals them to the streams, leaving
/// out those an earlier run had acknowledged; returns how many rows those
/// held. Stops at the first bad row: the batch holding it is not sent.
fn read(rows: &mut Rows, plan: Plan, resume: &[u64], senders: &[mpsc::Sender<Outgoing>], progress: &indicatif::ProgressBar) -> Result<u64> {
    let mut batcher = Batcher::new(plan);
    let mut resumed = 0;
    let mut deal = |batch: plan::Batch| -> Result<()> {
        let (s, offset) = plan.place(batch.number);
        if offset <= resume[s] {
            let n = batch.rows.end - batch.rows.start;
            resumed += n;
            progress.inc(n);
            return Ok(());
        }
        senders[s].blocking_send(Outgoing { batch, offset }).map_err(|_| anyhow::anyhow!("stream {s} ended early"))
    };
    let mut end = 0;
    while let Some((number, row)) = rows.next_row()? {
        end = number + 1;
        if let Some(b) = batcher.push(number, row) {
            deal(b)?;
        }
    }
    if let Some(b) = batcher.finish(end) {
        deal(b)?;
    }
    Ok(resumed)
}
