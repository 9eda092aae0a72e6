//! `shoalctl ingest` as a job runs it: a separate process loading files
//! into a cluster over loopback gRPC, SIGKILLed part way and run again with
//! the same arguments. Every row ends up in the collection once, with the
//! vector the file holds; nothing that was acknowledged is sent again; a
//! bad row stops the job before its batch is sent, naming file, row and
//! column.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use shoal_proto::v1;

use crate::common::{cluster, rng};

const DIM: usize = 16;

fn write_fvecs(path: &Path, rows: &[Vec<f32>]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for r in rows {
        f.write_all(&(r.len() as i32).to_le_bytes()).unwrap();
        for x in r {
            f.write_all(&x.to_le_bytes()).unwrap();
        }
    }
    f.flush().unwrap();
}

/// `shoalctl ingest` of `files` into `docs` as job `job`, with `streams`
/// streams and batches of `batch_bytes`.
fn ingest_cmd(endpoint: &str, files: &[&Path], streams: &str, batch_bytes: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shoalctl"));
    c.args(["--endpoint", endpoint, "ingest", "--collection", "docs", "--source", "job", "--create", "--metric", "euclidean"])
        .args(["--streams", streams, "--batch-bytes", batch_bytes, "--quiet"])
        .args(files);
    c
}

/// Acknowledged offsets of the job's sources, summed.
async fn acked_batches(client: &mut shoal_proto::v1::shoal_client::ShoalClient<tonic::transport::Channel>) -> u64 {
    match client.get_offsets(v1::GetOffsetsRequest { collection: "docs".into(), sources: vec![] }).await {
        Ok(r) => r.into_inner().offsets.iter().filter(|o| o.source.starts_with("job:")).map(|o| o.offset).sum(),
        Err(_) => 0,
    }
}

async fn read_all(
    client: &mut shoal_proto::v1::shoal_client::ShoalClient<tonic::transport::Channel>,
    ids: std::ops::Range<u64>,
) -> Vec<v1::Point> {
    let mut out = Vec::new();
    let ids: Vec<u64> = ids.collect();
    for chunk in ids.chunks(1000) {
        let got =
            client.get(v1::GetRequest { collection: "docs".into(), ids: chunk.to_vec(), with_vector: true }).await.unwrap().into_inner();
        assert!(got.missing.is_empty(), "{} ids missing, e.g. {:?}", got.missing.len(), &got.missing[..got.missing.len().min(5)]);
        out.extend(got.points);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_killed_at_any_point_resumes_with_nothing_missing_or_applied_twice() {
    let mut rng = rng("ingest_killed_at_any_point_resumes_with_nothing_missing_or_applied_twice");
    let mut tc = cluster(3).await;
    let endpoint = tc.cluster.endpoint();
    let dir = tempfile::tempdir().unwrap();
    // Two files in a row: an .fvecs and an .npy, 12,000 rows; batches of
    // 8 KiB hold 102 rows, so 118 batches over 3 streams.
    let rows: Vec<Vec<f32>> = (0..12_000).map(|_| (0..DIM).map(|_| rng.random_range(-1.0..1.0)).collect()).collect();
    let (a, b) = (dir.path().join("a.fvecs"), dir.path().join("b.npy"));
    write_fvecs(&a, &rows[..7_000]);
    shoal_ops::vectors::npy::write(&b, &rows[7_000..]).unwrap();
    let files = [a.as_path(), b.as_path()];

    // Killed twice, at different points: once soon after its first ack,
    // once past the middle.
    let mut kills = Vec::new();
    for after in [1, 50] {
        let mut child = ingest_cmd(&endpoint, &files, "3", "8192").stdout(Stdio::null()).stderr(Stdio::inherit()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let acked = acked_batches(&mut tc.client).await;
            if acked >= after {
                break;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the job ended ({status}) before {after} batches were acknowledged ({acked})");
            }
            assert!(Instant::now() < deadline, "no progress: {acked} batches acknowledged");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        kills.push(acked_batches(&mut tc.client).await);
    }
    eprintln!("killed with {kills:?} batches acknowledged");
    assert!(kills[0] < 118 && kills[1] < 118, "each kill came before the end: {kills:?}");

    let out = ingest_cmd(&endpoint, &files, "3", "8192").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{stdout}");
    // Resumed: the rows of the batches acknowledged before were not sent.
    assert!(stdout.contains("rows were acknowledged by an earlier run"), "{stdout}");

    // Every row once, with its vector; offsets say each batch was applied
    // once (118 batches: 40 + 39 + 39 offsets).
    let points = read_all(&mut tc.client, 0..12_000).await;
    for p in &points {
        assert_eq!(p.vector, rows[p.id as usize], "point {}", p.id);
    }
    let info = tc.client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await.unwrap().into_inner();
    assert_eq!(info.points, 12_000);
    assert_eq!(acked_batches(&mut tc.client).await, 118);

    // A run with another plan would not line up with the offsets: refused.
    let out = ingest_cmd(&endpoint, &files, "2", "8192").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--streams 3 --batch-bytes 8192"), "{stderr}");
    // The same job again: nothing left to send.
    let out = ingest_cmd(&endpoint, &files, "3", "8192").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stdout.contains(": 0 rows in 0 batches"), "{stdout}");
    tc.cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_stops_at_a_bad_row_naming_it_and_sends_nothing_of_its_batch() {
    let mut tc = cluster(2).await;
    let endpoint = tc.cluster.endpoint();
    let dir = tempfile::tempdir().unwrap();
    // 300 good lines, then one whose vector has a string in column 3.
    let mut text = String::new();
    for i in 0..300 {
        let v: Vec<String> = (0..DIM).map(|j| format!("{}", (i * DIM + j) as f32 / 1000.0 + 0.001)).collect();
        text.push_str(&format!("{{\"id\":{i},\"vector\":[{}],\"title\":\"row {i}\"}}\n", v.join(",")));
    }
    let mut bad: Vec<String> = (0..DIM).map(|j| format!("{j}.5")).collect();
    bad[3] = "\"x\"".into();
    text.push_str(&format!("{{\"id\":300,\"vector\":[{}]}}\n", bad.join(",")));
    let path = dir.path().join("docs.jsonl");
    std::fs::write(&path, text).unwrap();

    let out = ingest_cmd(&endpoint, &[&path], "1", "4096").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("docs.jsonl row 300 column vector[3]: \"x\" is not a number"), "{stderr}");
    // The batches before it were acknowledged; the one being filled when
    // row 300 was read (it holds row 299) was never sent.
    let info = tc.client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await.unwrap().into_inner();
    let sent = info.points;
    assert!(sent < 300 && sent > 0, "{sent} points");
    let got =
        tc.client.get(v1::GetRequest { collection: "docs".into(), ids: vec![0, 299], with_vector: false }).await.unwrap().into_inner();
    assert_eq!(got.points.len(), 1, "row 0 is in, row 299 (in the bad row's batch) is not: {got:?}");
    let payload = got.points[0].payload.as_ref().and_then(|p| p.kind.clone());
    assert_eq!(payload, Some(v1::payload::Kind::Json("{\"title\":\"row 0\"}".into())), "the other fields are the payload");
    tc.cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parquet_file_loads_with_its_ids_vectors_and_payload_columns() {
    use std::sync::Arc;

    use arrow_array::builder::{FixedSizeListBuilder, Float32Builder};
    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};

    let mut tc = cluster(2).await;
    let endpoint = tc.cluster.endpoint();
    let dir = tempfile::tempdir().unwrap();
    let mut r = rng("a_parquet_file_loads_with_its_ids_vectors_and_payload_columns");
    let n = 1500usize;
    let ids: Vec<i64> = (0..n as i64).map(|i| 10_000 + 3 * i).collect();
    let vectors: Vec<Vec<f32>> = (0..n).map(|_| crate::common::vector(&mut r, DIM)).collect();
    let mut list = FixedSizeListBuilder::new(Float32Builder::new(), DIM as i32);
    for v in &vectors {
        list.values().append_slice(v);
        list.append(true);
    }
    let titles: Vec<String> = (0..n).map(|i| format!("package {i}")).collect();
    let batch = RecordBatch::try_from_iter([
        ("id", Arc::new(Int64Array::from(ids.clone())) as ArrayRef),
        ("vector", Arc::new(list.finish()) as ArrayRef),
        ("title", Arc::new(StringArray::from(titles.clone())) as ArrayRef),
    ])
    .unwrap();
    let path = dir.path().join("docs.parquet");
    let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();

    let out = ingest_cmd(&endpoint, &[&path], "2", "8192").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let wanted: Vec<u64> = ids.iter().map(|&i| i as u64).collect();
    let got = tc.client.get(v1::GetRequest { collection: "docs".into(), ids: wanted, with_vector: true }).await.unwrap().into_inner();
    assert!(got.missing.is_empty(), "{} ids missing", got.missing.len());
    let mut points = got.points;
    points.sort_by_key(|p| p.id);
    assert_eq!(points.len(), n);
    for (i, p) in points.iter().enumerate() {
        assert_eq!(p.id, ids[i] as u64);
        assert_eq!(p.vector, vectors[i], "point {}", p.id);
        let payload = p.payload.as_ref().and_then(|p| p.kind.clone());
        assert_eq!(payload, Some(v1::payload::Kind::Json(format!("{{\"title\":\"{}\"}}", titles[i]))), "point {}", p.id);
    }
    tc.cluster.shutdown().await.unwrap();
}
