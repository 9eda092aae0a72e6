//! Typed handles over the index's LMDB databases, so that a database
//! cannot be read or written with another database's key.
//!
//! Every database stores raw bytes (`Database<Bytes, Bytes>`): heed's
//! integer codecs allocate a `Vec` for every key they encode, which is
//! measurable on the search path. A [`Table`] puts the key's type back on
//! top of the raw handle: each database is a `Table<K>` for the one shape
//! of key it holds, whose methods take that key and encode it into a
//! fixed-size array on the stack. Values stay bytes; `codec` gives them
//! their meaning.
//!
//! Keys are big-endian so that LMDB's byte order is numeric order and
//! sequential ids append to the B-trees instead of splitting pages all
//! over the file.
//!
//! Every stored value ends in a [`TRAILER`]: a CRC-32 of its key and its
//! bytes. LMDB checks the shape of its pages but not their content, so a
//! bit flipped on the disk in a vector, a link or a payload would
//! otherwise be read as data. Tables read on every search step (vectors,
//! codes, links, columns) leave the check to the scrub (`scrub`), which
//! walks every value; the others check each value they hand out, a few
//! nanoseconds against the lookup. Covering the key too means a damaged
//! key is caught as well, and a value cannot pass for another's.

use std::io::Write;
use std::marker::PhantomData;

use heed::types::Bytes;
use heed::{Database, PutFlags, ReservedSpace, RoTxn, RwTxn};

/// A database as heed opens it: raw bytes both ways.
pub(crate) type Db = Database<'static, Bytes, Bytes>;

/// One shape of key: how it is stored, and how a stored one reads back.
pub(crate) trait TableKey {
    /// The key as the engine holds it.
    type Key<'a>: Copy;
    /// Its stored bytes, built without allocating.
    type Encoded<'a>: AsRef<[u8]>;
    /// What such a key is, for the error that names a malformed one.
    const WHAT: &'static str;
    fn encode(key: Self::Key<'_>) -> Self::Encoded<'_>;
    /// `None` if the bytes are not such a key: keys come back from the
    /// file, which may be damaged.
    fn decode(bytes: &[u8]) -> Option<Self::Key<'_>>;
}

/// Keys that are one big-endian integer.
macro_rules! be_key {
    ($(#[$doc:meta])* $name:ident, $int:ty, $what:literal) => {
        $(#[$doc])*
        pub(crate) enum $name {}

        impl TableKey for $name {
            type Key<'a> = $int;
            type Encoded<'a> = [u8; size_of::<$int>()];
            const WHAT: &'static str = $what;
            #[inline]
            fn encode(key: Self::Key<'_>) -> Self::Encoded<'_> {
                key.to_be_bytes()
            }
            #[inline]
            fn decode(bytes: &[u8]) -> Option<Self::Key<'_>> {
                Some(<$int>::from_be_bytes(bytes.try_into().ok()?))
            }
        }
    };
}

be_key!(
    /// The internal id of a node: the key of every per-node database.
    InternalId,
    u32,
    "an internal id"
);
be_key!(
    /// The number of a block of consecutive ids (`codec::codes_block_nodes`,
    /// `codec::links0_block_nodes`).
    Block,
    u32,
    "a block number"
);
be_key!(
    /// The user's 64-bit id of a point.
    ExternalId,
    u64,
    "an external id"
);
be_key!(
    /// The link log epoch that wrote a value (`links_log`).
    Epoch,
    u64,
    "a link log epoch"
);
be_key!(
    /// The sequence number of an applied batch (`batch_log` as written
    /// before entries were split into parts).
    Seq,
    u64,
    "a sequence number"
);

/// Keys that are a big-endian u64 then a second big-endian integer, the
/// first the more significant.
macro_rules! pair_key {
    ($(#[$doc:meta])* $name:ident, $second:ty, $what:literal) => {
        $(#[$doc])*
        pub(crate) enum $name {}

        impl TableKey for $name {
            type Key<'a> = (u64, $second);
            type Encoded<'a> = [u8; 8 + size_of::<$second>()];
            const WHAT: &'static str = $what;
            #[inline]
            fn encode((a, b): Self::Key<'_>) -> Self::Encoded<'_> {
                let mut k = [0u8; 8 + size_of::<$second>()];
                k[..8].copy_from_slice(&a.to_be_bytes());
                k[8..].copy_from_slice(&b.to_be_bytes());
                k
            }
            fn decode(bytes: &[u8]) -> Option<Self::Key<'_>> {
                let (a, b) = bytes.split_at_checked(8)?;
                Some((Seq::decode(a)?, <$second>::from_be_bytes(b.try_into().ok()?)))
            }
        }
    };
}

pair_key!(
    /// (sequence number, part) of a piece of a batch log entry: the entry's
    /// parts in order, and every entry after the ones before it, so the log
    /// is one append-only run.
    LogPart,
    u32,
    "a (sequence number, part) pair"
);
pair_key!(
    /// (external id, sequence number) of an old vector the batch log keeps
    /// (`batch_log`): the vector the point had before the batch of that
    /// number replaced or deleted it. A point's copies sort together, oldest
    /// first, so the one an entry needs is the first after the entry's number.
    PointSeq,
    u64,
    "an (external id, sequence number) pair"
);
pair_key!(
    /// (sequence number, external id): the same copies in the order the log
    /// lets them go.
    SeqPoint,
    u64,
    "a (sequence number, external id) pair"
);

/// (level, internal id) of an upper-layer list, so each layer is one
/// contiguous, append-only run of the B-tree and upper layers stay compact.
pub(crate) enum LevelId {}

impl TableKey for LevelId {
    type Key<'a> = (u8, u32);
    type Encoded<'a> = [u8; 5];
    const WHAT: &'static str = "a (level, id) pair";
    #[inline]
    fn encode((level, id): Self::Key<'_>) -> Self::Encoded<'_> {
        let mut k = [0u8; 5];
        k[0] = level;
        k[1..].copy_from_slice(&id.to_be_bytes());
        k
    }
    fn decode(bytes: &[u8]) -> Option<Self::Key<'_>> {
        let (&level, id) = bytes.split_first()?;
        Some((level, InternalId::decode(id)?))
    }
}

/// Kind of a retired id, the first byte of its key in the retired table:
/// still linked (a tombstone that routes searches) or vacuumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retired {
    Linked = 0,
    Vacuumed = 1,
}

/// (kind, internal id) of a retired id, so the vacuum finds the linked ones
/// and reuse the vacuumed ones first, each in one contiguous run.
pub(crate) enum RetiredKey {}

impl TableKey for RetiredKey {
    type Key<'a> = (Retired, u32);
    type Encoded<'a> = [u8; 5];
    const WHAT: &'static str = "a retired id";
    #[inline]
    fn encode((kind, id): Self::Key<'_>) -> Self::Encoded<'_> {
        LevelId::encode((kind as u8, id))
    }
    fn decode(bytes: &[u8]) -> Option<Self::Key<'_>> {
        let (kind, id) = LevelId::decode(bytes)?;
        let kind = match kind {
            0 => Retired::Linked,
            1 => Retired::Vacuumed,
            _ => return None,
        };
        Some((kind, id))
    }
}

/// A name (meta records, sources), stored as its bytes.
pub(crate) enum Name {}

impl TableKey for Name {
    type Key<'a> = &'a [u8];
    type Encoded<'a> = &'a [u8];
    const WHAT: &'static str = "a name";
    fn encode(key: Self::Key<'_>) -> Self::Encoded<'_> {
        key
    }
    fn decode(bytes: &[u8]) -> Option<Self::Key<'_>> {
        Some(bytes)
    }
}

/// A stored key that is not one of its table's: the file is damaged.
/// Iteration hands it out as `heed::Error::Decoding`, like heed's own
/// codecs, and `store::storage` turns it into `Error::Corrupt`.
#[derive(Debug, thiserror::Error)]
#[error("the {table} table holds a key that is not {what}: {key:?}")]
pub(crate) struct MalformedKey {
    table: &'static str,
    what: &'static str,
    key: Vec<u8>,
}

/// Bytes after every stored value: the little-endian CRC-32 of the key then
/// the value (crc32fast, which runs at memory speed with the CPU's
/// carry-less multiply).
pub(crate) const TRAILER: usize = 4;

/// The trailer of `value` stored under `key`.
pub(crate) fn checksum(key: &[u8], value: &[u8]) -> [u8; TRAILER] {
    let mut h = crc32fast::Hasher::new();
    h.update(key);
    h.update(value);
    h.finalize().to_le_bytes()
}

/// The value of a stored entry without its trailer, if its trailer matches.
pub(crate) fn checked<'v>(key: &[u8], stored: &'v [u8]) -> Result<&'v [u8], Damage> {
    let (value, sum) = stored.split_last_chunk::<TRAILER>().ok_or(Damage::Short)?;
    if *sum == checksum(key, value) { Ok(value) } else { Err(Damage::Checksum) }
}

/// What is wrong with a stored value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Damage {
    /// Shorter than its trailer: no build writes such a value.
    Short,
    /// Its trailer does not match its key and bytes.
    Checksum,
}

/// A stored value that fails its checksum: the file changed outside LMDB
/// (a bit flipped on the disk, in the page cache, or a write torn by the
/// device). Handed out as `heed::Error::Decoding`, like [`MalformedKey`].
#[derive(Debug, thiserror::Error)]
#[error("the {table} table's value under key {key:?} {}", match .damage {
    Damage::Short => "is shorter than its checksum",
    Damage::Checksum => "does not match its checksum",
})]
pub(crate) struct DamagedValue {
    pub(crate) table: &'static str,
    pub(crate) key: Vec<u8>,
    pub(crate) damage: Damage,
}

/// The meta key whose presence says every value carries a trailer.
pub(crate) const CHECKSUMS_MARK: &[u8] = b"checksums";

/// Gives every value of `dbs` its trailer, for an environment written by a
/// build without them, in `wtxn` (a crash leaves it as it was), a bounded
/// number of entries at a time so memory stays small at any size.
pub(crate) fn add_trailers(wtxn: &mut RwTxn, dbs: &[Db]) -> heed::Result<u64> {
    const STEP: usize = 1024;
    let mut rewritten = 0u64;
    for db in dbs {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let from = after.as_deref().map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            let entries: Vec<(Vec<u8>, Vec<u8>)> = db
                .range(wtxn, &(from, std::ops::Bound::Unbounded))?
                .take(STEP)
                .map(|item| item.map(|(k, v)| (k.to_vec(), v.to_vec())))
                .collect::<heed::Result<_>>()?;
            for (key, value) in &entries {
                let mut stored = Vec::with_capacity(value.len() + TRAILER);
                stored.extend_from_slice(value);
                stored.extend_from_slice(&checksum(key, value));
                db.put(wtxn, key, &stored)?;
            }
            rewritten += entries.len() as u64;
            match entries.into_iter().last() {
                Some((key, _)) => after = Some(key),
                None => break,
            }
        }
    }
    Ok(rewritten)
}

/// One database, keyed by `K`.
pub(crate) struct Table<K> {
    db: Db,
    /// The database's name, for the error that names a malformed key.
    name: &'static str,
    /// Whether every read checks the value's trailer (see the module's
    /// notes); the trailer is always written and always taken off.
    verify: bool,
    key: PhantomData<K>,
}

// Not derived: that would ask the uninhabited marker types to be Copy.
impl<K> Clone for Table<K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Table<K> {}

/// What iterating a table yields: each key decoded, each value as stored.
pub(crate) type Entry<'t, K> = heed::Result<(<K as TableKey>::Key<'t>, &'t [u8])>;

impl<K: TableKey> Table<K> {
    /// `db`, opened under `name`, holds keys of shape `K`; every read
    /// checks its value's trailer.
    pub(crate) fn new(db: Db, name: &'static str) -> Self {
        Table { db, name, verify: true, key: PhantomData }
    }

    /// The same table with reads that take the trailer off unchecked: for
    /// the tables a walk reads at every step, which the scrub checks.
    pub(crate) fn checked_by_scrub(self) -> Self {
        Table { verify: false, ..self }
    }

    pub(crate) fn get<'t>(self, txn: &'t RoTxn, key: K::Key<'_>) -> heed::Result<Option<&'t [u8]>> {
        let key = K::encode(key);
        match self.db.get(txn, key.as_ref())? {
            Some(stored) => self.value(key.as_ref(), stored).map(Some),
            None => Ok(None),
        }
    }

    /// `stored` without its trailer, checked if this table checks reads.
    #[inline]
    fn value<'t>(self, key: &[u8], stored: &'t [u8]) -> heed::Result<&'t [u8]> {
        let damaged = |damage| heed::Error::Decoding(Box::new(DamagedValue { table: self.name, key: key.to_vec(), damage }));
        if self.verify {
            return checked(key, stored).map_err(damaged);
        }
        match stored.split_last_chunk::<TRAILER>() {
            Some((value, _)) => Ok(value),
            None => Err(damaged(Damage::Short)),
        }
    }

    pub(crate) fn put(self, txn: &mut RwTxn, key: K::Key<'_>, value: &[u8]) -> heed::Result<()> {
        let key = K::encode(key);
        let key = key.as_ref();
        self.db.put_reserved(txn, key, value.len() + TRAILER, |space| {
            space.write_all(value)?;
            space.write_all(&checksum(key, value))
        })
    }

    /// [`Table::put`] under a key above every stored one: LMDB then fills
    /// pages completely instead of splitting them in half (and refuses a
    /// key that is not the largest).
    pub(crate) fn append(self, txn: &mut RwTxn, key: K::Key<'_>, value: &[u8]) -> heed::Result<()> {
        let key = K::encode(key);
        let key = key.as_ref();
        // heed reserves space only without flags: the trailer is added in a
        // buffer, on the stack for the small values appended most.
        let mut small = [0u8; 64];
        let mut large = Vec::new();
        let stored = if value.len() + TRAILER <= small.len() {
            &mut small[..value.len() + TRAILER]
        } else {
            large.resize(value.len() + TRAILER, 0);
            &mut large[..]
        };
        stored[..value.len()].copy_from_slice(value);
        stored[value.len()..].copy_from_slice(&checksum(key, value));
        self.db.put_with_flags(txn, PutFlags::APPEND, key, stored)
    }

    /// Puts a value of `len` bytes that `write` writes straight into the
    /// pages LMDB reserves for it; what `write` leaves of the `len` bytes
    /// is zeros.
    pub(crate) fn put_reserved(
        self,
        txn: &mut RwTxn,
        key: K::Key<'_>,
        len: usize,
        write: impl FnOnce(&mut ReservedSpace) -> std::io::Result<()>,
    ) -> heed::Result<()> {
        let key = K::encode(key);
        let key = key.as_ref();
        self.db.put_reserved(txn, key, len + TRAILER, |space| {
            write(space)?;
            static ZEROS: [u8; 4096] = [0; 4096];
            let mut zeros = space.remaining().checked_sub(TRAILER).ok_or(std::io::ErrorKind::WriteZero)?;
            while zeros > 0 {
                let n = zeros.min(ZEROS.len());
                space.write_all(&ZEROS[..n])?;
                zeros -= n;
            }
            let sum = checksum(key, space.written_mut());
            space.write_all(&sum)
        })
    }

    /// Puts `stored` exactly as given, trailer or not: for tests that damage
    /// a value or write one as an older build did.
    #[cfg(test)]
    pub(crate) fn put_stored(self, txn: &mut RwTxn, key: K::Key<'_>, stored: &[u8]) -> heed::Result<()> {
        self.db.put(txn, K::encode(key).as_ref(), stored)
    }

    pub(crate) fn delete(self, txn: &mut RwTxn, key: K::Key<'_>) -> heed::Result<bool> {
        self.db.delete(txn, K::encode(key).as_ref())
    }

    /// Deletes the entries from `from` up to, not including, `to`; returns
    /// how many there were.
    pub(crate) fn delete_range(self, txn: &mut RwTxn, from: K::Key<'_>, to: K::Key<'_>) -> heed::Result<usize> {
        let (from, to) = (K::encode(from), K::encode(to));
        let range = (std::ops::Bound::Included(from.as_ref()), std::ops::Bound::Excluded(to.as_ref()));
        self.db.delete_range(txn, &range)
    }

    /// The first key as stored, undecoded: how a migration tells which
    /// layout a table has.
    pub(crate) fn first_raw_key<'t>(self, txn: &'t RoTxn) -> heed::Result<Option<&'t [u8]>> {
        Ok(self.db.first(txn)?.map(|(k, _)| k))
    }

    /// The same database read with keys of another shape: only for a
    /// migration that rewrites a table from an older layout.
    pub(crate) fn retyped<K2>(self) -> Table<K2> {
        Table { db: self.db, name: self.name, verify: self.verify, key: PhantomData }
    }

    /// Entries held; LMDB keeps the count, nothing is scanned.
    pub(crate) fn len(self, txn: &RoTxn) -> heed::Result<u64> {
        self.db.len(txn)
    }

    /// The name the table was opened under.
    pub(crate) fn name(self) -> &'static str {
        self.name
    }

    pub(crate) fn clear(self, txn: &mut RwTxn) -> heed::Result<()> {
        self.db.clear(txn)
    }

    /// Every entry, in key order.
    pub(crate) fn iter<'t>(self, txn: &'t RoTxn) -> heed::Result<impl Iterator<Item = Entry<'t, K>>> {
        Ok(self.db.iter(txn)?.map(move |item| self.decoded(item)))
    }

    /// The entries from `first` on, in key order.
    pub(crate) fn iter_from<'t>(self, txn: &'t RoTxn, first: K::Key<'_>) -> heed::Result<impl Iterator<Item = Entry<'t, K>>> {
        let first = K::encode(first);
        let range = (std::ops::Bound::Included(first.as_ref()), std::ops::Bound::Unbounded);
        Ok(self.db.range(txn, &range)?.map(move |item| self.decoded(item)))
    }

    fn decoded<'t>(self, item: heed::Result<(&'t [u8], &'t [u8])>) -> Entry<'t, K> {
        let (raw, stored) = item?;
        let key = K::decode(raw)
            .ok_or_else(|| heed::Error::Decoding(Box::new(MalformedKey { table: self.name, what: K::WHAT, key: raw.to_vec() })))?;
        Ok((key, self.value(raw, stored)?))
    }

    /// Drops the database from the file, as an index written before it
    /// existed lacks it.
    ///
    /// # Safety
    /// No other handle of the database may be used afterwards.
    #[cfg(test)]
    pub(crate) unsafe fn remove(self, txn: &mut RwTxn) -> heed::Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.db.remove(txn) }
    }
}

impl Table<Name> {
    /// The entries whose keys lie in `from..=to`, in key order.
    pub(crate) fn range_inclusive<'t>(self, txn: &'t RoTxn, from: &[u8], to: &[u8]) -> heed::Result<impl Iterator<Item = Entry<'t, Name>>> {
        let range = (std::ops::Bound::Included(from), std::ops::Bound::Included(to));
        Ok(self.db.range(txn, &range)?.map(move |item| self.decoded(item)))
    }

    /// The entries whose keys lie in `from..=to`, last key first.
    pub(crate) fn rev_range_inclusive<'t>(
        self,
        txn: &'t RoTxn,
        from: &[u8],
        to: &[u8],
    ) -> heed::Result<impl Iterator<Item = Entry<'t, Name>>> {
        let range = (std::ops::Bound::Included(from), std::ops::Bound::Included(to));
        Ok(self.db.rev_range(txn, &range)?.map(move |item| self.decoded(item)))
    }

    /// The entries whose keys start with `prefix`, in key order.
    pub(crate) fn prefix<'t>(self, txn: &'t RoTxn, prefix: &[u8]) -> heed::Result<impl Iterator<Item = Entry<'t, Name>>> {
        Ok(self.db.prefix_iter(txn, prefix)?.map(move |item| self.decoded(item)))
    }

    /// Deletes every entry whose key starts with `prefix`; returns how many.
    pub(crate) fn delete_prefix(self, txn: &mut RwTxn, prefix: &[u8]) -> heed::Result<usize> {
        let keys: Vec<Vec<u8>> =
            self.db.prefix_iter(txn, prefix)?.map(|item| item.map(|(k, _)| k.to_vec())).collect::<heed::Result<_>>()?;
        for key in &keys {
            self.db.delete(txn, key)?;
        }
        Ok(keys.len())
    }
}

impl Table<RetiredKey> {
    /// The retired ids of `kind`, ascending: one contiguous run of keys.
    pub(crate) fn ids(self, txn: &RoTxn, kind: Retired) -> heed::Result<impl Iterator<Item = heed::Result<u32>>> {
        let entries = self.db.prefix_iter(txn, &[kind as u8])?;
        Ok(entries.map(move |item| Ok(self.decoded(item)?.0.1)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::error::Error;
    use crate::store::{Store, StoreOptions};

    proptest! {
        #[test]
        fn keys_round_trip_and_sort_numerically(a: u32, b: u32, la: u8, lb: u8, x: u64, y: u64) {
            prop_assert_eq!(InternalId::decode(&InternalId::encode(a)), Some(a));
            prop_assert_eq!(InternalId::encode(a).cmp(&InternalId::encode(b)), a.cmp(&b));
            prop_assert_eq!(Block::encode(a).cmp(&Block::encode(b)), a.cmp(&b));
            prop_assert_eq!(LevelId::decode(&LevelId::encode((la, a))), Some((la, a)));
            prop_assert_eq!(LevelId::encode((la, a)).cmp(&LevelId::encode((lb, b))), (la, a).cmp(&(lb, b)));
            prop_assert_eq!(RetiredKey::decode(&RetiredKey::encode((Retired::Vacuumed, a))), Some((Retired::Vacuumed, a)));
            for encode in [ExternalId::encode, Epoch::encode, Seq::encode] {
                prop_assert_eq!(encode(x).cmp(&encode(y)), x.cmp(&y));
            }
            prop_assert_eq!(Seq::decode(&Seq::encode(x)), Some(x));
            prop_assert_eq!(LogPart::decode(&LogPart::encode((x, a))), Some((x, a)));
            prop_assert_eq!(LogPart::encode((x, a)).cmp(&LogPart::encode((y, b))), (x, a).cmp(&(y, b)));
            let (u, v) = (u64::from(a), u64::from(b));
            prop_assert_eq!(PointSeq::decode(&PointSeq::encode((x, u))), Some((x, u)));
            prop_assert_eq!(SeqPoint::encode((x, u)).cmp(&SeqPoint::encode((y, v))), (x, u).cmp(&(y, v)));
        }
    }

    /// Keys written through a table read back typed; a key damaged on disk
    /// is an error that names its table, never a panic.
    #[test]
    fn stored_keys_round_trip_and_damaged_ones_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let opts = StoreOptions::small();
        let store = Store::open(dir.path(), &opts).unwrap();
        let retired = store.dbs.retired;
        let mut wtxn = store.env.write_txn().unwrap();
        retired.append(&mut wtxn, (Retired::Linked, 7), &[]).unwrap();
        retired.append(&mut wtxn, (Retired::Vacuumed, 3), b"v").unwrap();
        let entries: Vec<_> = retired.iter(&wtxn).unwrap().map(Result::unwrap).collect();
        assert_eq!(entries, [((Retired::Linked, 7), &[][..]), ((Retired::Vacuumed, 3), &b"v"[..])]);
        assert_eq!(retired.ids(&wtxn, Retired::Vacuumed).unwrap().map(Result::unwrap).collect::<Vec<_>>(), [3]);

        // Damage written through an untyped view of the same database.
        let raw = Table::<Name>::new(retired.db, "retired");
        // A kind byte no build writes, and a key cut short.
        for damaged in [&[2, 0, 0, 0, 1][..], &[1, 0, 0]] {
            raw.put(&mut wtxn, damaged, &[]).unwrap();
            let err = retired.iter(&wtxn).unwrap().find_map(Result::err).unwrap();
            let err = store.err(err);
            assert!(
                matches!(&err, Error::Corrupt { detail, .. } if detail.contains("the retired table holds a key that is not a retired id")),
                "{err}"
            );
            raw.delete(&mut wtxn, damaged).unwrap();
        }
        assert!(RetiredKey::decode(&[]).is_none() && LevelId::decode(&[1, 2, 3, 4, 5, 6]).is_none());
    }
}
