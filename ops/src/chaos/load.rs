//! The load a chaos run keeps up throughout: ingest streams that resend a
//! batch until it is acknowledged (exactly once through its offset) and
//! search clients that fail over between the coordinators, each keeping
//! its own record for the figures.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_proto::v1;

use super::clients::{Clients, coordinator_gone, request_fault, retry_after};
use super::report::{Acked, Searched};
use super::{Data, batch_vectors};

pub(super) async fn ingest_stream(
    s: usize,
    clients: Clients,
    stop: Arc<AtomicBool>,
    batch: usize,
    dim: usize,
    seed: u64,
    started: Instant,
) -> anyhow::Result<Vec<Acked>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut acked = Vec::new();
    let mut at = 0usize;
    for offset in 1u64.. {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let first_id = 1_000_000_000 * (s as u64 + 1) + (offset - 1) * batch as u64;
        let vseed = rng.random::<u64>();
        let points: Vec<v1::Point> = batch_vectors(vseed, batch, dim)
            .into_iter()
            .enumerate()
            .map(|(j, vector)| v1::Point { id: first_id + j as u64, vector, payload: None })
            .collect();
        let req = v1::IngestRequest { collection: "chaos".into(), source: format!("stream-{s}"), offset, points, ..Default::default() };
        let first_sent = started.elapsed();
        // Until acknowledged: the same offset again is applied at most once.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mut client = clients.clients[at % clients.clients.len()].clone();
            let sent = async {
                let mut acks = client.ingest(tokio_stream::iter(vec![req.clone()])).await?.into_inner();
                acks.message().await?.ok_or_else(|| tonic::Status::unavailable("the stream ended without an ack"))
            };
            match tokio::time::timeout(Duration::from_secs(30), sent).await {
                Ok(Ok(_ack)) => break,
                Ok(Err(e)) if request_fault(&e) => bail!("stream-{s} batch {offset}: {e:?}"),
                Ok(Err(e)) if coordinator_gone(&e) => at += 1,
                // Refused for now (a replica dropping out, etcd away):
                // the same batch again, after the hint.
                Ok(Err(e)) => tokio::time::sleep(retry_after(&e)).await,
                Err(_) => at += 1,
            }
            if Instant::now() > deadline {
                bail!("stream-{s} batch {offset} was not acknowledged within 120 s");
            }
        }
        acked.push(Acked { stream: s, offset, first_sent, acked: started.elapsed(), ids: first_id..first_id + batch as u64, seed: vseed });
    }
    Ok(acked)
}

pub(super) async fn search_loop(clients: Clients, stop: Arc<AtomicBool>, data: Arc<Data>, seed: u64, started: Instant) -> Vec<Searched> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut at = rng.random_range(0..clients.clients.len());
    while !stop.load(Ordering::Relaxed) {
        let (q, truth) = &data.queries[rng.random_range(0..data.queries.len())];
        // Every other search reads the collection being written; recall is
        // measured on the other (see COLLECTIONS).
        let measured = rng.random_bool(0.5);
        let collection = if measured { "still" } else { "chaos" };
        let req = v1::SearchRequest { collection: collection.into(), vector: q.clone(), k: 10, ef: 64, ..Default::default() };
        let t0 = Instant::now();
        let at_s = started.elapsed();
        let mut redirected = false;
        let mut answer = None;
        for _ in 0..clients.clients.len() {
            match clients.clients[at % clients.clients.len()].clone().search(req.clone()).await {
                Err(e) if coordinator_gone(&e) => {
                    at += 1;
                    redirected = true;
                }
                r => {
                    answer = Some(r);
                    break;
                }
            }
        }
        let took = t0.elapsed();
        let s = match answer {
            Some(Ok(r)) => {
                let r = r.into_inner();
                let found = r.hits.iter().filter(|h| truth.contains(&h.id)).count();
                Searched { at: at_s, took, ok: true, partial: r.partial, redirected, measured, recall: found as f64 / 10.0, error: None }
            }
            Some(Err(e)) => {
                let error = Some(format!("{:?}: {}", e.code(), e.message()));
                Searched { at: at_s, took, ok: false, partial: false, redirected, measured, recall: 0.0, error }
            }
            None => {
                let error = Some("no coordinator answered".to_owned());
                Searched { at: at_s, took, ok: false, partial: false, redirected, measured, recall: 0.0, error }
            }
        };
        out.push(s);
    }
    out
}
