//! How a job's rows become batches with `(source, offset)`, so that a job
//! killed at any moment and run again with the same arguments resumes
//! after its last acknowledged batch.
//!
//! Batches are cut from the rows in order by size (`--batch-bytes`), so
//! the same files and flags always give the same batches. Batch `b` goes
//! to stream `b % streams`; each stream is its own source, named after the
//! job's `--source`, its number and the plan (`NAME:s/S@BYTES`), and sends
//! its batches with offsets 1, 2, 3... in order. A shard skips an offset at
//! or below its own, so a batch resent after a crash is applied once. The
//! plan is in the source names so that a run with other `--streams` or
//! `--batch-bytes`, whose batches would not line up with the offsets
//! recorded, is refused instead of skipping rows it never sent.

use std::collections::BTreeSet;

use anyhow::{Result, bail};
use shoal_proto::v1;

use super::input::Row;

/// The parts of a job's plan that fix its batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub streams: usize,
    pub batch_bytes: usize,
    /// Points in one batch at most (the cluster's batch limit).
    pub batch_points: usize,
}

impl Plan {
    /// Stream `s`'s source name for job `source`.
    pub fn source(&self, source: &str, s: usize) -> String {
        format!("{source}:{s}/{}@{}", self.streams, self.batch_bytes)
    }

    /// The stream and offset of batch `b`.
    pub fn place(&self, b: u64) -> (usize, u64) {
        ((b % self.streams as u64) as usize, b / self.streams as u64 + 1)
    }

    /// Bytes a row takes in a batch: what the size limit counts.
    pub fn row_bytes(row: &Row) -> usize {
        16 + 4 * row.vector.len() + row.payload.as_ref().map_or(0, String::len)
    }

    /// Where each stream of this job stands (its acknowledged offset),
    /// from every source the collection has recorded. Refuses sources of
    /// the same job made with another plan.
    pub fn resume_from(&self, source: &str, recorded: &[v1::SourceOffset]) -> Result<Vec<u64>> {
        let mine: Vec<String> = (0..self.streams).map(|s| self.source(source, s)).collect();
        let mut at = vec![0; self.streams];
        let mut other = BTreeSet::new();
        for r in recorded {
            if let Some(s) = mine.iter().position(|m| *m == r.source) {
                at[s] = r.offset;
            } else if let Some(rest) = r.source.strip_prefix(source).and_then(|r| r.strip_prefix(':')) {
                other.insert(rest.split_once('/').map_or(rest, |(_, p)| p).to_owned());
            }
        }
        if let Some(plan) = other.first() {
            let (streams, bytes) = plan.split_once('@').unwrap_or((plan, "?"));
            bail!(
                "source {source:?} was ingested with --streams {streams} --batch-bytes {bytes}; its batches would not line up with \
                 --streams {} --batch-bytes {}: run again with those, or name another --source",
                self.streams,
                self.batch_bytes
            );
        }
        Ok(at)
    }
}

/// Cuts rows into batches: a batch is closed before the row that would
/// take it past the byte limit (a row larger than the limit is a batch of
/// its own) or when it has the most points allowed.
#[derive(Debug)]
pub struct Batcher {
    plan: Plan,
    points: Vec<Row>,
    bytes: usize,
    first_row: u64,
    next: u64,
}

/// A batch of the job: its number, the rows it holds, and its points.
#[derive(Debug)]
pub struct Batch {
    pub number: u64,
    pub rows: std::ops::Range<u64>,
    pub bytes: usize,
    pub points: Vec<Row>,
}

impl Batcher {
    pub fn new(plan: Plan) -> Batcher {
        Batcher { plan, points: Vec::new(), bytes: 0, first_row: 0, next: 0 }
    }

    /// Adds row `number`; returns the batch it closed, if any.
    pub fn push(&mut self, number: u64, row: Row) -> Option<Batch> {
        let size = Plan::row_bytes(&row);
        let full =
            !self.points.is_empty() && (self.bytes + size > self.plan.batch_bytes || self.points.len() >= self.plan.batch_points.max(1));
        let closed = if full { self.take(number) } else { None };
        if self.points.is_empty() {
            self.first_row = number;
        }
        self.points.push(row);
        self.bytes += size;
        closed
    }

    /// The last batch, if rows are left.
    pub fn finish(&mut self, rows_end: u64) -> Option<Batch> {
        self.take(rows_end)
    }

    fn take(&mut self, end: u64) -> Option<Batch> {
        if self.points.is_empty() {
            return None;
        }
        let b = Batch { number: self.next, rows: self.first_row..end, bytes: self.bytes, points: std::mem::take(&mut self.points) };
        self.next += 1;
        self.bytes = 0;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u64, dim: usize) -> Row {
        Row { id, vector: vec![1.0; dim], payload: None }
    }

    #[test]
    fn batches_are_cut_by_bytes_and_points_the_same_every_time() {
        let plan = Plan { streams: 2, batch_bytes: 100, batch_points: 3 };
        let cut = || {
            let mut b = Batcher::new(plan);
            let mut out = Vec::new();
            // 16 + 4*4 = 32 bytes a row: three fit in 100, the third
            // point also hits the point limit.
            for i in 0..7 {
                out.extend(b.push(i, row(i, 4)));
            }
            out.extend(b.finish(7));
            out.iter().map(|b| (b.number, b.rows.clone(), b.points.len())).collect::<Vec<_>>()
        };
        assert_eq!(cut(), vec![(0, 0..3, 3), (1, 3..6, 3), (2, 6..7, 1)]);
        assert_eq!(cut(), cut());
        let mut b = Batcher::new(Plan { streams: 1, batch_bytes: 10, batch_points: 100 });
        assert!(b.push(0, row(0, 8)).is_none(), "a row over the limit is a batch of its own");
        assert_eq!(b.push(1, row(1, 8)).unwrap().rows, 0..1);
    }

    #[test]
    fn streams_take_batches_in_turn_and_resume_after_their_offsets() {
        let plan = Plan { streams: 3, batch_bytes: 4096, batch_points: 10 };
        assert_eq!((0..7).map(|b| plan.place(b)).collect::<Vec<_>>(), [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2), (0, 3)]);
        assert_eq!(plan.source("job", 1), "job:1/3@4096");
        let at = |source: &str, offset| v1::SourceOffset { source: source.into(), offset };
        let recorded = [at("job:0/3@4096", 5), at("job:2/3@4096", 4), at("other:0/3@4096", 9), at("jobs:0/1@1", 1)];
        assert_eq!(plan.resume_from("job", &recorded).unwrap(), [5, 0, 4]);
        let e = plan.resume_from("job", &[at("job:0/2@4096", 1)]).unwrap_err().to_string();
        assert!(e.contains("--streams 2 --batch-bytes 4096"), "{e}");
    }
}
