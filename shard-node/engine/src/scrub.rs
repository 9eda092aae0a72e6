//! Checking every stored value against its checksum (`table::TRAILER`)
//! while the shard serves. The tables a walk reads at every step are not
//! checked on each read, so this is what finds a bit flipped in a vector,
//! a code or a link list. A step reads a bounded number of bytes in its
//! own read transaction, so a scrub never pins an old commit for long, and
//! whoever drives it (the shard node) paces the steps to a rate.

use std::ops::Bound;

use heed::{RoTxn, WithoutTls};

use crate::error::{Error, Result};
use crate::store::Store;
use crate::table::{self, DamagedValue};

/// Where a scrub goes on from: a table and the last key checked in it.
/// Keys, not positions, so a step after a commit or a compaction goes on
/// from the same place in the new state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubCursor {
    table: usize,
    after: Option<Vec<u8>>,
}

/// What one step checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrubStep {
    /// Where the next step starts: the beginning again once a pass ended.
    pub next: ScrubCursor,
    /// The table the step ended in, for logs.
    pub table: &'static str,
    /// Values checked.
    pub values: u64,
    /// Their bytes as stored, keys and trailers included.
    pub bytes: u64,
    /// This step reached the end of the last table: every value stored
    /// when each of the pass's steps ran has been checked.
    pub pass_done: bool,
}

/// Checks values from `from` on until `budget` bytes are read (at least
/// one value, if there is one). A damaged value is [`Error::Corrupt`],
/// naming its table and key.
pub(crate) fn step(store: &Store, txn: &RoTxn<'_, WithoutTls>, from: &ScrubCursor, budget: u64) -> Result<ScrubStep> {
    let tables = store.tables();
    let mut cursor = if from.table < tables.len() { from.clone() } else { ScrubCursor::default() };
    let (mut values, mut bytes) = (0u64, 0u64);
    loop {
        let (name, db) = tables[cursor.table];
        let lower = cursor.after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let mut stopped_at = None;
        for item in db.range(txn, &(lower, Bound::Unbounded)).map_err(|e| store.err(e))? {
            let (key, stored) = item.map_err(|e| store.err(e))?;
            if let Err(damage) = table::checked(key, stored) {
                let detail = DamagedValue { table: name, key: key.to_vec(), damage }.to_string();
                return Err(Error::Corrupt { path: store.path.clone(), detail });
            }
            values += 1;
            bytes += (key.len() + stored.len()) as u64;
            if bytes >= budget {
                stopped_at = Some(key.to_vec());
                break;
            }
        }
        if let Some(key) = stopped_at {
            cursor.after = Some(key);
            return Ok(ScrubStep { next: cursor, table: name, values, bytes, pass_done: false });
        }
        cursor = ScrubCursor { table: cursor.table + 1, after: None };
        if cursor.table == tables.len() {
            return Ok(ScrubStep { next: ScrubCursor::default(), table: name, values, bytes, pass_done: true });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::path::Path;

    use crate::batch::{Batch, Op, Point};
    use crate::fields::FieldType;
    use crate::fields::value::PAYLOAD_JSON;
    use crate::table::{CHECKSUMS_MARK, TRAILER, Table};
    use crate::{Error, Index, IndexOptions, IndexParams, Metric, ScrubCursor, SearchParams};

    const DIM: usize = 8;

    fn vector(i: u64) -> Vec<f32> {
        (0..DIM).map(|d| ((i * 7 + d as u64 * 13) % 29) as f32 - 14.0).collect()
    }

    fn payload(i: u64) -> Vec<u8> {
        let mut p = vec![PAYLOAD_JSON];
        p.extend_from_slice(format!(r#"{{"tag": "t{}", "n": {i}}}"#, i % 5).as_bytes());
        p
    }

    /// An index with something in every table a shard fills: points with
    /// payloads and field indexes, replaced and deleted points (the batch
    /// log and its old vectors, tombstones), several batches.
    fn filled(dir: &Path) -> Index {
        let index = Index::open_or_create(dir, IndexParams::new(DIM as u32, Metric::Cosine), IndexOptions::default()).unwrap();
        index.create_field_index("tag", FieldType::Keyword).unwrap();
        index.create_field_index("n", FieldType::Integer).unwrap();
        for round in 0..6u64 {
            let ops = (0..100u64).map(|i| {
                let id = round * 60 + i;
                Op::Upsert(Point { id, vector: vector(id + round), payload: Some(payload(id)) })
            });
            let deletes = (0..5u64).map(|i| Op::DeleteIfPresent(round * 50 + i * 3));
            index.apply(Batch { ops: ops.chain(deletes).collect(), source: None }.with_source("job", round)).unwrap();
        }
        index
    }

    /// A whole pass from the start: the first damage it finds.
    fn scrub_pass(index: &Index, budget: u64) -> Result<(u64, u64), Error> {
        let (mut cursor, mut values, mut steps) = (ScrubCursor::default(), 0, 0);
        loop {
            let step = index.scrub(&cursor, budget)?;
            values += step.values;
            steps += 1;
            if step.pass_done {
                return Ok((values, steps));
            }
            cursor = step.next;
        }
    }

    /// Where in the file (offset from its start) `stored` lies: the map of
    /// `data.mdb` is found in this process's own mappings.
    fn file_offset(data: &Path, stored: &[u8]) -> u64 {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let data = data.canonicalize().unwrap();
        let addr = stored.as_ptr() as u64;
        for line in maps.lines().filter(|l| l.ends_with(data.to_str().unwrap())) {
            let mut f = line.split_whitespace();
            let (range, offset) = (f.next().unwrap(), f.nth(1).unwrap());
            let (start, end) = range.split_once('-').unwrap();
            let (start, end) = (u64::from_str_radix(start, 16).unwrap(), u64::from_str_radix(end, 16).unwrap());
            if (start..end).contains(&addr) {
                return addr - start + u64::from_str_radix(offset, 16).unwrap();
            }
        }
        panic!("{} is not mapped here", data.display());
    }

    /// Flips one bit of the byte at `offset` of the file, as a disk would:
    /// through the file, not through LMDB.
    fn flip(data: &Path, offset: u64) {
        let mut f = std::fs::OpenOptions::new().read(true).write(true).open(data).unwrap();
        let mut byte = [0u8];
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.read_exact(&mut byte).unwrap();
        byte[0] ^= 0x10;
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&byte).unwrap();
    }

    #[test]
    fn a_bit_flipped_in_any_table_is_found_by_the_scrub_and_the_value_reads_again_once_restored() {
        let dir = tempfile::tempdir().unwrap();
        let index = filled(dir.path());
        let data = dir.path().join("data.mdb");
        let (clean, _) = scrub_pass(&index, 64 << 10).unwrap();
        let mut damaged = Vec::new();
        for &(name, db) in index.store.tables() {
            let txn = index.store.env.read_txn().unwrap();
            // The middle entry of the table, a bit in the middle of its value.
            let len = db.len(&txn).unwrap();
            let Some(entry) = db.iter(&txn).unwrap().nth((len / 2) as usize) else { continue };
            let (key, stored) = entry.unwrap();
            let (key, at) = (key.to_vec(), file_offset(&data, stored) + (stored.len() / 2) as u64);
            drop(txn);
            flip(&data, at);
            match scrub_pass(&index, 4 << 10) {
                Err(Error::Corrupt { detail, .. }) => {
                    assert!(detail.contains(&format!("the {name} table's value under key {key:?}")), "{name}: {detail}")
                }
                other => panic!("{name}: a flipped bit went unnoticed: {other:?}"),
            }
            flip(&data, at);
            assert_eq!(scrub_pass(&index, 4 << 10).unwrap().0, clean, "{name}: restored");
            damaged.push(name);
        }
        // Everything a shard with payloads and field indexes fills.
        for name in ["meta", "vectors", "codes", "links0", "nodes", "external", "payloads", "offsets", "batch_log", "retired"] {
            assert!(damaged.contains(&name), "{name} was not tried: {damaged:?}");
        }
        for name in ["log_vectors", "log_vectors_by_seq", "fields", "postings", "field_columns"] {
            assert!(damaged.contains(&name), "{name} was not tried: {damaged:?}");
        }
    }

    #[test]
    fn checked_reads_refuse_a_damaged_payload_and_a_search_still_answers() {
        let dir = tempfile::tempdir().unwrap();
        let index = filled(dir.path());
        let data = dir.path().join("data.mdb");
        let internal = {
            let txn = index.store.env.read_txn().unwrap();
            let want = payload(77);
            let payloads = index.store.tables().iter().find(|(n, _)| *n == "payloads").unwrap().1;
            let stored = payloads.iter(&txn).unwrap().map(|e| e.unwrap().1).find(|v| v[..v.len() - TRAILER] == want[..]).unwrap();
            let at = file_offset(&data, stored) + 3;
            drop(txn);
            flip(&data, at);
            at
        };
        match index.get(77) {
            Err(Error::Corrupt { detail, .. }) => assert!(detail.contains("the payloads table's value"), "{detail}"),
            other => panic!("a damaged payload was handed out: {other:?}"),
        }
        assert!(index.get(78).unwrap().is_some(), "the other points still read");
        assert!(!index.search(&vector(5), SearchParams::new(5, 32)).unwrap().is_empty());
        flip(&data, internal);
        assert_eq!(index.get(77).unwrap().unwrap().payload, Some(payload(77)));
    }

    #[test]
    fn small_steps_check_what_one_large_step_does_and_go_on_across_commits() {
        let dir = tempfile::tempdir().unwrap();
        let index = filled(dir.path());
        let (all, one) = scrub_pass(&index, u64::MAX).unwrap();
        assert_eq!(one, 1, "one step of an unbounded budget is the whole pass");
        let (again, steps) = scrub_pass(&index, 1).unwrap();
        assert_eq!(again, all, "a budget of a byte checks one value a step");
        assert!(steps >= all, "{steps} steps for {all} values");
        let stored: u64 = {
            let txn = index.store.env.read_txn().unwrap();
            index.store.tables().iter().map(|(_, db)| db.len(&txn).unwrap()).sum()
        };
        assert_eq!(all, stored, "every entry of every table, once");

        // A commit between two steps: the pass goes on from the same key.
        let first = index.scrub(&ScrubCursor::default(), 16 << 10).unwrap();
        assert!(!first.pass_done);
        index.apply(Batch::upserts([(10_000, vector(3))])).unwrap();
        let mut cursor = first.next;
        loop {
            let step = index.scrub(&cursor, 16 << 10).unwrap();
            if step.pass_done {
                break;
            }
            cursor = step.next;
        }
    }

    #[test]
    fn an_environment_written_without_checksums_gets_them_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let index = filled(dir.path());
        let before = index.snapshot().unwrap().digest().unwrap();
        let hits = index.search(&vector(11), SearchParams::new(10, 64)).unwrap();
        // Back to what a build without checksums wrote: every value without
        // its trailer, and no mark.
        {
            let mut wtxn = index.store.env.write_txn().unwrap();
            for &(name, db) in index.store.tables() {
                let entries: Vec<(Vec<u8>, Vec<u8>)> =
                    db.iter(&wtxn).unwrap().map(|e| e.map(|(k, v)| (k.to_vec(), v[..v.len() - TRAILER].to_vec())).unwrap()).collect();
                for (k, v) in entries {
                    Table::<crate::table::Name>::new(db, name).put_stored(&mut wtxn, &k, &v).unwrap();
                }
            }
            index.store.tables()[0].1.delete(&mut wtxn, CHECKSUMS_MARK).unwrap();
            wtxn.commit().unwrap();
        }
        drop(index);
        let index = Index::open(dir.path(), IndexOptions::default()).unwrap();
        assert_eq!(index.snapshot().unwrap().digest().unwrap(), before);
        assert_eq!(index.search(&vector(11), SearchParams::new(10, 64)).unwrap(), hits);
        scrub_pass(&index, 1 << 20).unwrap();
        assert_eq!(index.get(77).unwrap().unwrap().payload, Some(payload(77)));
    }
}
