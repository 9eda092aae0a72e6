//! The LMDB environment of one shard and the databases inside it.

use std::path::{Path, PathBuf};

use heed::types::Bytes;
use heed::{CommitOrAbort, Env, EnvFlags, EnvOpenOptions, RoTxn, WithoutTls};

use crate::error::{Error, Result};
use crate::table::{
    Block, CHECKSUMS_MARK, DamagedValue, Db, Epoch, ExternalId, InternalId, LevelId, LogPart, MalformedKey, Name, PointSeq, RetiredKey,
    SeqPoint, Table,
};

/// The databases of one index, each typed by its key (see `table`).
#[derive(Clone, Copy)]
pub(crate) struct Dbs {
    /// `params`, `state`.
    pub(crate) meta: Table<Name>,
    /// block number → the prepared vectors (dim × f32 LE each) of its ids
    /// (`codec::vectors_block_nodes`).
    pub(crate) vectors: Table<Block>,
    /// block number → the codes (see `quant`) of its ids
    /// (`codec::codes_block_nodes`), what the graph is walked with.
    pub(crate) codes: Table<Block>,
    /// block number → bottom-layer link lists of its ids
    /// (`codec::links0_block_nodes`).
    pub(crate) links0: Table<Block>,
    /// log epoch → changed bottom-layer lists of existing nodes, not yet
    /// folded into `links0` (see `links_log`).
    pub(crate) links0_log: Table<Epoch>,
    /// (level, internal id) → upper-layer link list.
    pub(crate) links_up: Table<LevelId>,
    /// internal id → [`crate::codec::NodeRecord`] (external id, level, flags).
    pub(crate) nodes: Table<InternalId>,
    /// external id → live internal id (`codec::mapped_id`).
    pub(crate) external: Table<ExternalId>,
    /// internal id → payload bytes, for points that carry one.
    pub(crate) payloads: Table<InternalId>,
    /// source name → highest applied offset (BE u64).
    pub(crate) offsets: Table<Name>,
    /// (sequence number, part) → a piece of one applied batch
    /// (`batch_log`), the newest ones within the retention.
    pub(crate) batch_log: Table<LogPart>,
    /// (kind, internal id) → nothing: every retired id (tombstone), the ids
    /// a later batch may reuse for new points.
    pub(crate) retired: Table<RetiredKey>,
    /// (external id, sequence number) → the vector the point had before
    /// that batch replaced or deleted it, while a batch log entry still
    /// refers to it (`batch_log`).
    pub(crate) log_vectors: Table<PointSeq>,
    /// (sequence number, external id) → nothing: the same copies, in the
    /// order the log lets them go.
    pub(crate) log_vectors_by_seq: Table<SeqPoint>,
    /// field name → its index's definition (`fields::FieldDef`): which
    /// payload fields are indexed, as what, and how far an online build got.
    pub(crate) fields: Table<Name>,
    /// (field, kind, value) → the set of internal ids holding it, a
    /// serialised roaring bitmap (`fields::postings`).
    pub(crate) postings: Table<Name>,
    /// (field, block) → the numeric value of each id of the block, for
    /// checking a range on one point during a walk (`fields::columns`).
    pub(crate) field_columns: Table<Name>,
}

/// The databases of an index, in the order of [`Dbs`]'s fields.
const DB_NAMES: [&str; 17] = [
    "meta",
    "vectors",
    "codes",
    "links0",
    "links0_log",
    "links_up",
    "nodes",
    "external",
    "payloads",
    "offsets",
    "batch_log",
    "retired",
    "log_vectors",
    "log_vectors_by_seq",
    "fields",
    "postings",
    "field_columns",
];

/// Makes sure every value of the environment carries its trailer
/// (`table`): a new one is marked so, one written by a build without them
/// gets them now, in one write transaction.
fn mark_checksums(env: &Env<WithoutTls>, path: &Path, fresh: bool, dbs: &[Db]) -> Result<()> {
    let meta = dbs[0];
    let rtxn = env.read_txn().map_err(|e| storage(path, e))?;
    if meta.get(&rtxn, CHECKSUMS_MARK).map_err(|e| storage(path, e))?.is_some() {
        return Ok(());
    }
    drop(rtxn);
    let mut wtxn = env.write_txn().map_err(|e| storage(path, e))?;
    if !fresh {
        let started = std::time::Instant::now();
        let values = crate::table::add_trailers(&mut wtxn, dbs).map_err(|e| storage(path, e))?;
        tracing::info!(path = %path.display(), values, ms = started.elapsed().as_millis() as u64, "added a checksum to every stored value");
    }
    Table::<Name>::new(meta, "meta").put(&mut wtxn, CHECKSUMS_MARK, b"crc32").map_err(|e| storage(path, e))?;
    wtxn.commit().map_err(|e| storage(path, e))
}

/// How the environment is opened.
#[derive(Clone, Debug)]
pub(crate) struct StoreOptions {
    pub(crate) initial_map_size: u64,
    pub(crate) max_map_size: u64,
    pub(crate) max_readers: u32,
    pub(crate) durable: bool,
    pub(crate) read_ahead: bool,
    /// Pages a write transaction keeps in memory before LMDB writes some of
    /// them out early (`IndexOptions::write_memory_bytes`).
    pub(crate) write_memory_bytes: u64,
}

#[cfg(test)]
impl StoreOptions {
    /// A small map without syncs, for tests that open a store directly.
    pub(crate) fn small() -> Self {
        StoreOptions {
            initial_map_size: 1 << 20,
            max_map_size: 1 << 30,
            max_readers: 16,
            durable: false,
            read_ahead: false,
            write_memory_bytes: 0,
        }
    }
}

/// An open environment with its databases.
pub(crate) struct Store {
    pub(crate) env: Env<WithoutTls>,
    pub(crate) dbs: Dbs,
    /// The same databases untyped, by name (as in `DB_NAMES`), for what
    /// goes over all of them.
    all: [(&'static str, Db); DB_NAMES.len()],
    pub(crate) path: PathBuf,
    pub(crate) max_map_size: u64,
    /// The environment's page size, fixed when it was created.
    page: u64,
}

impl Store {
    /// Opens (creating if needed) the environment in `path`.
    pub(crate) fn open(path: &Path, opts: &StoreOptions) -> Result<Store> {
        std::fs::create_dir_all(path).map_err(|source| io_error(path, path, source))?;
        check_meta_pages(path)?;
        reserve_lock_file(path, opts.max_readers)?;
        let page = page_size();
        let file_len = std::fs::metadata(path.join("data.mdb")).map(|m| m.len()).unwrap_or(0);
        // Start with room for the data already there plus as much again, so
        // a reopened index does not resize on its first batch.
        let wanted = opts.initial_map_size.max(file_len.saturating_mul(2)).min(opts.max_map_size.max(file_len));
        let map_size = round_up(wanted, page);

        let mut flags = EnvFlags::empty();
        if !opts.read_ahead {
            flags |= EnvFlags::NO_READ_AHEAD;
        }
        if !opts.durable {
            flags |= EnvFlags::NO_SYNC;
        }
        let mut builder = EnvOpenOptions::new().read_txn_without_tls();
        builder.map_size(map_size as usize).max_dbs(24).max_readers(opts.max_readers);
        // SAFETY: the flags are valid LMDB environment flags; NO_SYNC trades
        // durability of the last commits for speed and is opt-in.
        unsafe { builder.flags(flags) };
        // The limit is read by `mdb_env_create`, which `open` calls on this
        // thread.
        let dirty_pages = dirty_page_limit(opts.write_memory_bytes, page);
        // SAFETY: sets a thread-local default of the patched liblmdb.
        unsafe { lmdb_master_sys::mdb_shoal_set_dirty_limit(dirty_pages) };
        // SAFETY: the environment's files are only ever modified through LMDB
        // in this process; shoal never opens them with anything else.
        let opened = unsafe { builder.open(path) };
        // SAFETY: as above; back to LMDB's default for whatever else this
        // thread opens.
        unsafe { lmdb_master_sys::mdb_shoal_set_dirty_limit(0) };
        let env = opened.map_err(|e| storage(path, e))?;
        // An environment that has committed before must already hold its
        // databases: creating a missing one would write an empty table
        // into a file whose main database (the list of tables) is damaged,
        // and the index would then read as empty, or as no index at all.
        let fresh = env.info().last_txn_id == 0;
        let wtxn = env.write_txn().map_err(|e| storage(path, e))?;
        let opened = env
            .create_databases_and_commit(wtxn, |dbo, wtxn| -> heed::Result<_> {
                let open = |name: &'static str| {
                    // Created on first open by a build that has it: an
                    // index written before it starts with an empty log.
                    if fresh
                        || matches!(
                            name,
                            "batch_log" | "retired" | "log_vectors" | "log_vectors_by_seq" | "fields" | "postings" | "field_columns"
                        )
                    {
                        dbo.create_database::<Bytes, Bytes>(wtxn, Some(name)).map(Some)
                    } else {
                        dbo.open_database::<Bytes, Bytes>(wtxn, Some(name))
                    }
                };
                Ok(CommitOrAbort::<_, ()>::Commit(DB_NAMES.map(open)))
            })
            .map_err(|e| storage(path, e))?
            .unwrap_commit();
        let mut dbs = Vec::with_capacity(DB_NAMES.len());
        for (name, db) in DB_NAMES.iter().zip(opened) {
            let db = db.map_err(|e| storage(path, e))?.ok_or_else(|| Error::Corrupt {
                path: path.to_owned(),
                detail: format!("the {name} table is missing from data.mdb: LMDB's main database, which lists the tables, is damaged"),
            })?;
            dbs.push(db);
        }
        let all = std::array::from_fn(|i| (DB_NAMES[i], dbs[i]));
        let [
            meta,
            vectors,
            codes,
            links0,
            links0_log,
            links_up,
            nodes,
            external,
            payloads,
            offsets,
            batch_log,
            retired,
            log_vectors,
            log_vectors_by_seq,
            fields,
            postings,
            field_columns,
        ] = dbs[..]
        else {
            unreachable!("one database per name");
        };
        let page = env.read_txn().ok().and_then(|t| meta.stat(&t).ok()).map_or(page, |s| u64::from(s.page_size));
        mark_checksums(&env, path, fresh, &dbs)?;
        // What a walk reads at every step is checked by the scrub, not on
        // each read (`table`).
        let dbs = Dbs {
            meta: Table::new(meta, "meta"),
            vectors: Table::new(vectors, "vectors").checked_by_scrub(),
            codes: Table::new(codes, "codes").checked_by_scrub(),
            links0: Table::new(links0, "links0").checked_by_scrub(),
            links0_log: Table::new(links0_log, "links0_log").checked_by_scrub(),
            links_up: Table::new(links_up, "links_up").checked_by_scrub(),
            nodes: Table::new(nodes, "nodes"),
            external: Table::new(external, "external"),
            payloads: Table::new(payloads, "payloads"),
            offsets: Table::new(offsets, "offsets"),
            batch_log: Table::new(batch_log, "batch_log"),
            retired: Table::new(retired, "retired"),
            log_vectors: Table::new(log_vectors, "log_vectors"),
            log_vectors_by_seq: Table::new(log_vectors_by_seq, "log_vectors_by_seq"),
            fields: Table::new(fields, "fields"),
            postings: Table::new(postings, "postings"),
            field_columns: Table::new(field_columns, "field_columns").checked_by_scrub(),
        };
        Ok(Store { env, dbs, all, path: path.to_owned(), max_map_size: opts.max_map_size, page })
    }

    /// Every table, by name, untyped: for what reads them all as stored
    /// (`scrub`).
    pub(crate) fn tables(&self) -> &[(&'static str, Db)] {
        &self.all
    }

    /// Maps a heed error to the engine's, naming the environment.
    pub(crate) fn err(&self, e: heed::Error) -> Error {
        storage(&self.path, e)
    }

    /// Refuses a value of `len` bytes that cannot be in the file: LMDB
    /// takes a value's length from its node without checking it against
    /// the page, so a damaged length hands out a slice that runs past the
    /// map, and reading it faults. Bounded by the file's used bytes
    /// (cheap: no transaction), which catches the
    /// damaged high bits; `what` names the value.
    pub(crate) fn check_len(&self, len: usize, what: impl FnOnce() -> String) -> Result<()> {
        let limit = (self.env.info().last_page_number as u64).saturating_add(1).saturating_mul(self.page);
        if len as u64 <= limit {
            Ok(())
        } else {
            Err(Error::Corrupt { path: self.path.clone(), detail: format!("{} claims {len} bytes, more than data.mdb holds", what()) })
        }
    }

    /// Size of the memory map now.
    pub(crate) fn map_size(&self) -> u64 {
        self.env.info().map_size as u64
    }

    /// The map size to grow to after `MDB_MAP_FULL`, or the error that says
    /// which setting to raise.
    pub(crate) fn next_map_size(&self) -> Result<u64> {
        let now = self.map_size();
        if now >= self.max_map_size {
            return Err(Error::MapSizeLimit { path: self.path.clone(), limit: self.max_map_size });
        }
        Ok(round_up(now.saturating_mul(2).min(self.max_map_size), page_size()).max(now + page_size()))
    }

    /// The environment's page size (fixed when it was created).
    pub(crate) fn page_size(&self) -> u32 {
        self.page as u32
    }

    /// Bytes the environment occupies on disk (the data file).
    pub(crate) fn disk_bytes(&self) -> u64 {
        std::fs::metadata(self.path.join("data.mdb")).map(|m| m.len()).unwrap_or(0)
    }

    /// Bytes of the map in use: up to the last page any commit wrote.
    /// Pages LMDB freed below it (its free list) count as used.
    pub(crate) fn used_bytes(&self) -> u64 {
        (self.env.info().last_page_number as u64 + 1) * u64::from(self.page_size())
    }

    /// Bytes each table holds as of `txn` (its B-tree, leaf and overflow
    /// pages), by name, from LMDB's per-table page counts: nothing is
    /// scanned.
    pub(crate) fn table_bytes(&self, txn: &RoTxn<'_, WithoutTls>) -> Result<Vec<(&'static str, u64)>> {
        let pages = |db: &Db| -> heed::Result<u64> {
            let s = db.stat(txn)?;
            Ok((s.branch_pages + s.leaf_pages + s.overflow_pages) as u64)
        };
        self.all.iter().map(|(name, db)| Ok((*name, pages(db).map_err(|e| self.err(e))? * self.page))).collect()
    }

    /// Bytes of the file no table holds as of `txn`: LMDB's free pages
    /// (which later commits reuse but the file never gives back) and the
    /// part past the last used page. Read from LMDB's per-table page
    /// counts, nothing is scanned. The free list's own pages and the main
    /// table (one page for a dozen names) count as free: a few pages.
    pub(crate) fn free_bytes(&self, txn: &RoTxn<'_, WithoutTls>) -> Result<u64> {
        // The two meta pages.
        let held = 2 * self.page + self.table_bytes(txn)?.iter().map(|(_, b)| b).sum::<u64>();
        Ok(self.disk_bytes().saturating_sub(held))
    }
}

/// The environment an [`crate::Index`] works on, which a compaction
/// (`Index::compact`) replaces while the index stays in use.
///
/// A plain field cannot be replaced through `&Index`, and a lock or an
/// `ArcSwap` around it would touch every read path (transactions borrow
/// the environment) for an event that happens once in hours. Instead the
/// replacement happens only under the two locks every user of the store
/// already holds one of: the index's writer lock (writes, vacuum, copies'
/// start) and its `resize` lock (every read transaction, the same lock
/// the map's growth takes exclusively for the same reason: no transaction
/// may be open). Code that reaches the store must hold one of them; the
/// index keeps its own copy of the path for the rest.
pub(crate) struct StoreCell(std::cell::UnsafeCell<Store>);

// SAFETY: `Store` is Send and Sync (an LMDB environment handle opened
// without thread-local read transactions, plain data); the only mutation,
// `replace`, is exclusive by its contract.
unsafe impl Sync for StoreCell {}

impl StoreCell {
    pub(crate) fn new(store: Store) -> Self {
        StoreCell(std::cell::UnsafeCell::new(store))
    }

    /// Puts `store` in place of the current one and hands the old one
    /// back (dropping it closes its environment).
    ///
    /// # Safety
    /// No reference into the current store may be alive on any thread:
    /// the caller holds the index's writer lock and its `resize` lock
    /// exclusively, and every idle session (which holds a read
    /// transaction, hence the environment) has been dropped.
    pub(crate) unsafe fn replace(&self, store: Store) -> Store {
        // SAFETY: exclusive access, by the contract above.
        unsafe { std::mem::replace(&mut *self.0.get(), store) }
    }
}

impl std::ops::Deref for StoreCell {
    type Target = Store;

    fn deref(&self) -> &Store {
        // SAFETY: shared access; `replace` runs only when no reference is
        // alive (see the type's documentation).
        unsafe { &*self.0.get() }
    }
}

/// What opening an environment is about to create, noted before it does,
/// so that a failed create can take it all back: the directory and its
/// parents that do not exist yet, and LMDB's files. Nothing is noted when
/// `data.mdb` exists: an existing index is never removed.
pub(crate) struct Creation {
    /// Missing directories, deepest first.
    dirs: Vec<PathBuf>,
    /// LMDB's files that do not exist yet.
    files: Vec<PathBuf>,
    /// Held until the creation succeeded or was undone: another create of
    /// the same path in this process must not see half of it, nor remove
    /// what it made.
    _serial: Option<parking_lot::MutexGuard<'static, ()>>,
}

/// Serialises the creation of new environments in this process.
static CREATING: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

impl Creation {
    /// Notes what opening `path` would create.
    pub(crate) fn before(path: &Path) -> Creation {
        let serial = CREATING.lock();
        if path.join(DATA_FILE).exists() {
            return Creation { dirs: Vec::new(), files: Vec::new(), _serial: None };
        }
        let dirs = path.ancestors().take_while(|d| !d.as_os_str().is_empty() && !d.exists()).map(Path::to_owned).collect();
        let files = [DATA_FILE, LOCK_FILE].iter().map(|f| path.join(f)).filter(|f| !f.exists()).collect();
        Creation { dirs, files, _serial: Some(serial) }
    }

    /// Removes what a failed open created. Only files it created and
    /// directories that are empty without them go; the environment must be
    /// closed already, or the space would stay allocated until it is.
    pub(crate) fn undo(self) {
        for file in &self.files {
            match std::fs::remove_file(file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(path = %file.display(), error = %e, "cannot remove a file of a failed create"),
            }
        }
        for dir in &self.dirs {
            // Not recursive: whatever else appeared in it stays.
            if let Err(e) = std::fs::remove_dir(dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %dir.display(), error = %e, "cannot remove a directory of a failed create");
            }
        }
    }
}

/// Pages of changes a write transaction keeps in memory before liblmdb
/// spills some (`IndexOptions::write_memory_bytes`). 0 is no limit, so a
/// limit under one page rounds up to a page (liblmdb then raises it to its
/// own minimum) rather than down to "none".
fn dirty_page_limit(bytes: u64, page: u64) -> usize {
    usize::try_from(bytes.div_ceil(page)).unwrap_or(usize::MAX)
}

/// LMDB's data file in an environment directory.
const DATA_FILE: &str = "data.mdb";
/// LMDB's lock file (the reader table).
const LOCK_FILE: &str = "lock.mdb";

/// Bytes of `lock.mdb` that cover LMDB's reader table for `max_readers`
/// readers, rounded up to whole pages. LMDB needs
/// `(max_readers - 1) × sizeof(MDB_reader) + sizeof(MDB_txninfo)`: readers
/// are padded to a 64-byte cache line and the header is three of them on
/// Linux (lmdb-master-sys 0.2.6, `mdb.c`); 4096 bytes for the header is
/// generous. A larger file only gives LMDB more reader slots: it sizes the
/// table from the file when the file is big enough.
fn lock_file_bytes(max_readers: u32) -> u64 {
    round_up(4096 + 64 * u64::from(max_readers), page_size())
}

/// Allocates every block of the environment's lock file before LMDB maps
/// it. LMDB grows the file with `ftruncate`, which leaves it sparse, and
/// then writes its mutexes and reader slots through a shared memory map: a
/// page the file system cannot back raises SIGBUS, which kills the process
/// instead of failing the call. Allocated up front, a full device is an
/// `ENOSPC` here. Holes in a file an earlier version left are filled too;
/// blocks already allocated cost nothing, so an existing index opens on a
/// full device.
fn reserve_lock_file(dir: &Path, max_readers: u32) -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(LOCK_FILE);
    let io = |source: std::io::Error| io_error(dir, &path, source);
    // The mode LMDB creates it with (heed opens environments 0600); never
    // truncated: another process may have the table mapped.
    let file = std::fs::OpenOptions::new().write(true).create(true).truncate(false).mode(0o600).open(&path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len().max(lock_file_bytes(max_readers));
    let len = libc::off_t::try_from(len).map_err(|_| io(std::io::ErrorKind::FileTooLarge.into()))?;
    // SAFETY: `file` is an open descriptor owned by this function; the call
    // only allocates blocks (extending the file with zeros), it never
    // changes bytes the file holds.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        libc::ENOSPC => Err(Error::DiskFull { path: dir.to_owned() }),
        // A file system that cannot allocate ahead (glibc emulates it,
        // musl does not): carry on as LMDB would have.
        libc::EOPNOTSUPP | libc::ENOSYS => Ok(()),
        code => Err(io(std::io::Error::from_raw_os_error(code))),
    }
}

/// Maps an error of a file-system call on `file` in the environment `dir`
/// like [`storage`] maps LMDB's.
fn io_error(dir: &Path, file: &Path, source: std::io::Error) -> Error {
    match source.raw_os_error() {
        Some(libc::ENOSPC) => Error::DiskFull { path: dir.to_owned() },
        Some(libc::EMFILE | libc::ENFILE) => Error::OpenFileLimit { path: dir.to_owned() },
        _ => Error::Io { path: file.to_owned(), source },
    }
}

/// Maps heed errors: a full device becomes [`Error::DiskFull`], running
/// out of file descriptors (opening the environment)
/// [`Error::OpenFileLimit`], LMDB finding its file damaged, or a table a
/// key of the wrong shape, [`Error::Corrupt`]; everything else keeps its
/// source.
pub(crate) fn storage(path: &Path, e: heed::Error) -> Error {
    if let heed::Error::Mdb(m) = &e
        && let Some(why) = lmdb_corruption(m)
    {
        return Error::Corrupt { path: path.to_owned(), detail: format!("{why} ({e})") };
    }
    if let heed::Error::Decoding(d) = &e
        && let Some(key) = d.downcast_ref::<MalformedKey>()
    {
        return Error::Corrupt { path: path.to_owned(), detail: key.to_string() };
    }
    if let heed::Error::Decoding(d) = &e
        && let Some(value) = d.downcast_ref::<DamagedValue>()
    {
        return Error::Corrupt { path: path.to_owned(), detail: value.to_string() };
    }
    match &e {
        heed::Error::Io(io) if io.raw_os_error() == Some(libc::ENOSPC) => Error::DiskFull { path: path.to_owned() },
        heed::Error::Io(io) if matches!(io.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
            Error::OpenFileLimit { path: path.to_owned() }
        }
        // LMDB reports a short write (the device filled up part-way through
        // a commit's pages) as EIO; say what really happened.
        heed::Error::Io(io) if io.raw_os_error() == Some(libc::EIO) && device_nearly_full(path) => {
            Error::DiskFull { path: path.to_owned() }
        }
        heed::Error::Io(_) | heed::Error::Mdb(_) | heed::Error::Encoding(_) | heed::Error::Decoding(_) | heed::Error::EnvAlreadyOpened => {
            Error::Storage { path: path.to_owned(), source: e }
        }
    }
}

/// What an LMDB error says about the data file, if it says it is damaged.
/// LMDB keeps no checksums: these are the structural checks it makes on
/// the way down a B-tree, and the checks of its header on open.
fn lmdb_corruption(e: &heed::MdbError) -> Option<&'static str> {
    use heed::MdbError as M;
    match e {
        M::PageNotFound => Some("LMDB followed a page number past the last page written: a page pointer in data.mdb is damaged"),
        // Also what liblmdb's page checks answer (third_party/README.md).
        M::Corrupted => Some(
            "LMDB met a damaged page in data.mdb (of the wrong kind, or whose header or nodes point outside it, \
             or a free-page record naming pages past the file)",
        ),
        M::Invalid => Some("data.mdb is not an LMDB environment: its meta pages (the first two) are damaged"),
        M::VersionMismatch => Some("data.mdb's meta pages name another LMDB format version: they are damaged or the file is foreign"),
        // Our databases are created with fixed flags; a record whose flags
        // changed is a damaged record of the main database.
        M::Incompatible => Some("a database record in LMDB's main database has the wrong flags: a page of data.mdb is damaged"),
        M::Problem => Some("LMDB found its free-page bookkeeping inconsistent: data.mdb is damaged (or LMDB has a bug)"),
        // Our trees are a few levels deep; 32 means a branch page points
        // back up the tree.
        M::CursorFull => Some("LMDB went more than 32 levels down a B-tree: a branch page of data.mdb points into a cycle"),
        // The engine's only puts that can meet an existing key are
        // appends (`PutFlags::APPEND`) of ids above every stored one.
        // Our tables are opened once and never dropped: a table handle that
        // went bad means its record in the main database changed.
        M::BadDbi => Some("a table's record in LMDB's main database changed under the index: a page of data.mdb is damaged"),
        M::KeyExist => Some("LMDB refused to append an id above the last one stored: a key or page of data.mdb is damaged"),
        M::NotFound
        | M::Panic
        | M::MapFull
        | M::DbsFull
        | M::ReadersFull
        | M::TlsFull
        | M::TxnFull
        | M::PageFull
        | M::MapResized
        | M::BadRslot
        | M::BadTxn
        | M::BadValSize
        | M::Other(_) => None,
    }
}

/// Reads the two meta pages of an existing `data.mdb` and refuses one
/// whose header LMDB would misread. LMDB checks only their magic and
/// version: it takes the one with the larger transaction id and trusts its
/// last page number, so a flipped bit there makes it map (and later touch)
/// pages past the end of the file, which is a SIGBUS, not an error, or
/// start from a tree that is long gone.
fn check_meta_pages(dir: &Path) -> Result<()> {
    use std::io::Read;
    let path = dir.join(DATA_FILE);
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(dir, &path, e)),
    };
    let len = file.metadata().map_err(|e| io_error(dir, &path, e))?.len();
    if len == 0 {
        // LMDB writes the meta pages of an empty file itself.
        return Ok(());
    }
    // Both meta pages, at the largest page size LMDB supports.
    let mut head = Vec::with_capacity(2 * MAX_META_PAGE);
    (&mut file).take(2 * MAX_META_PAGE as u64).read_to_end(&mut head).map_err(|e| io_error(dir, &path, e))?;
    meta::check(&head, len).map_err(|detail| Error::Corrupt { path: dir.to_owned(), detail })
}

/// Largest LMDB page size (`MAX_PAGESIZE`).
const MAX_META_PAGE: usize = 0x10000;

/// LMDB's meta pages, as `mdb.c` lays them out on 64-bit builds: a 16-byte
/// page header (flags at 10), then `MDB_meta`: magic, version, address,
/// map size, the free and main databases' records (48 bytes each, the
/// page size in the first's first word, the root in the last 8 bytes),
/// the last page number and the transaction id.
pub(crate) mod meta {
    const FLAGS: usize = 10;
    const P_META: u16 = 0x08;
    const MAGIC: usize = 16;
    const VERSION: usize = 20;
    const PAGE_SIZE: usize = 40;
    const FREE_ROOT: usize = 80;
    const MAIN_ROOT: usize = 128;
    const LAST_PAGE: usize = 136;
    const TXN_ID: usize = 144;
    const END: usize = 152;
    const MDB_MAGIC: u32 = 0xBEEF_C0DE;
    const MDB_DATA_VERSION: u32 = 1;
    const P_INVALID: u64 = u64::MAX;

    #[derive(Clone, Copy, Debug)]
    struct Meta {
        last_page: u64,
        txn_id: u64,
    }

    fn u16_at(p: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([p[at], p[at + 1]])
    }
    fn u32_at(p: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
    }
    fn u64_at(p: &[u8], at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&p[at..at + 8]);
        u64::from_le_bytes(b)
    }

    /// The meta page `n` of `head` (at least `END` bytes of it).
    fn read(page: &[u8], n: usize) -> Result<(Meta, u32), String> {
        let p = page.get(..END).ok_or_else(|| format!("data.mdb ends inside meta page {n}"))?;
        if u16_at(p, FLAGS) & P_META == 0 || u32_at(p, MAGIC) != MDB_MAGIC {
            return Err(format!("meta page {n} of data.mdb is damaged: it is not marked as a meta page or lacks LMDB's magic number"));
        }
        if u32_at(p, VERSION) != MDB_DATA_VERSION {
            return Err(format!("meta page {n} of data.mdb names LMDB data version {}, not {MDB_DATA_VERSION}", u32_at(p, VERSION)));
        }
        let meta = Meta { last_page: u64_at(p, LAST_PAGE), txn_id: u64_at(p, TXN_ID) };
        for (db, at) in [("free-page", FREE_ROOT), ("main", MAIN_ROOT)] {
            let root = u64_at(p, at);
            if root != P_INVALID && root > meta.last_page {
                return Err(format!(
                    "meta page {n} of data.mdb puts the root of the {db} database at page {root}, past its last page {}",
                    meta.last_page
                ));
            }
        }
        Ok((meta, u32_at(p, PAGE_SIZE)))
    }

    /// A valid pair of meta pages of `page`-byte pages (for tests): the
    /// newer one (`txn_id`) in the slot of its parity.
    #[cfg(test)]
    pub(crate) fn sample(page: usize, last_page: u64, txn_id: u64) -> Vec<u8> {
        let mut head = vec![0u8; 2 * page];
        for n in 0..2u64 {
            let p = &mut head[n as usize * page..];
            p[..8].copy_from_slice(&n.to_le_bytes());
            p[FLAGS..FLAGS + 2].copy_from_slice(&P_META.to_le_bytes());
            p[MAGIC..MAGIC + 4].copy_from_slice(&MDB_MAGIC.to_le_bytes());
            p[VERSION..VERSION + 4].copy_from_slice(&MDB_DATA_VERSION.to_le_bytes());
            p[PAGE_SIZE..PAGE_SIZE + 4].copy_from_slice(&(page as u32).to_le_bytes());
            p[FREE_ROOT..FREE_ROOT + 8].copy_from_slice(&P_INVALID.to_le_bytes());
            p[MAIN_ROOT..MAIN_ROOT + 8].copy_from_slice(&last_page.to_le_bytes());
            let txn = if n == txn_id % 2 { txn_id } else { txn_id.saturating_sub(1) };
            p[LAST_PAGE..LAST_PAGE + 8].copy_from_slice(&last_page.to_le_bytes());
            p[TXN_ID..TXN_ID + 8].copy_from_slice(&txn.to_le_bytes());
        }
        head
    }

    /// Checks the meta pages at the start of a data file of `file_len`
    /// bytes (`head`: its first bytes, both meta pages included); Err says
    /// what is wrong.
    pub(crate) fn check(head: &[u8], file_len: u64) -> Result<(), String> {
        let (m0, page) = read(head, 0)?;
        if !page.is_power_of_two() || !(512..=0x10000).contains(&page) {
            return Err(format!("meta page 0 of data.mdb gives a page size of {page} bytes"));
        }
        let page = page as usize;
        let (m1, page1) = read(head.get(page..).unwrap_or_default(), 1)?;
        if page1 as usize != page {
            return Err(format!("the meta pages of data.mdb disagree on the page size ({page} and {page1} bytes)"));
        }
        // Each commit writes the meta page of its parity, so the two hold
        // consecutive transaction ids (both 0 before the first commit).
        let (older, newer) = if m0.txn_id <= m1.txn_id { (m0, m1) } else { (m1, m0) };
        if newer.txn_id != 0 && newer.txn_id - older.txn_id != 1 {
            return Err(format!(
                "the meta pages of data.mdb hold transaction ids {} and {}, which are not consecutive: one of them is damaged",
                m0.txn_id, m1.txn_id
            ));
        }
        // The file only ever grows, and holds every page up to the last.
        if older.last_page > newer.last_page {
            return Err(format!(
                "the meta pages of data.mdb say the file shrank from page {} to {}: one of them is damaged",
                older.last_page, newer.last_page
            ));
        }
        let needed = newer.last_page.checked_add(1).and_then(|n| n.checked_mul(page as u64));
        match needed {
            Some(needed) if needed <= file_len => Ok(()),
            Some(_) | None => Err(format!(
                "the newest meta page of data.mdb puts the last page at {}, past the end of the file ({file_len} bytes of {page}-byte pages)",
                newer.last_page
            )),
        }
    }
}

/// True if the file system holding `path` has less than 1 MiB free.
fn device_nearly_full(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: statvfs only writes into `st`, and `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    #[allow(clippy::unnecessary_cast)] // u32 on some targets
    let free = (st.f_bavail as u64).saturating_mul(st.f_frsize as u64);
    free < 1 << 20
}

/// True when LMDB ran out of map space (recoverable by growing the map).
pub(crate) fn is_map_full(e: &heed::Error) -> bool {
    matches!(e, heed::Error::Mdb(heed::MdbError::MapFull))
}

pub(crate) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as u64 } else { 4096 }
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to).saturating_mul(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both "too many open files" errors, the process's and the system's,
    /// from LMDB or from the engine's own calls, say so.
    #[test]
    fn running_out_of_descriptors_is_an_open_file_limit() {
        let dir = Path::new("/shards/7");
        for code in [libc::EMFILE, libc::ENFILE] {
            let from_lmdb = storage(dir, heed::Error::Io(std::io::Error::from_raw_os_error(code)));
            assert!(matches!(&from_lmdb, Error::OpenFileLimit { path } if path == dir), "{code}: {from_lmdb:?}");
            let own = io_error(dir, &dir.join(LOCK_FILE), std::io::Error::from_raw_os_error(code));
            assert!(matches!(&own, Error::OpenFileLimit { path } if path == dir), "{code}: {own:?}");
            assert!(own.to_string().contains("open-file limit"), "{own}");
        }
        let other = io_error(dir, &dir.join(LOCK_FILE), std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(matches!(&other, Error::Io { path, .. } if path.ends_with(LOCK_FILE)), "{other:?}");
    }

    #[test]
    fn a_write_memory_limit_under_a_page_is_still_a_limit() {
        assert_eq!(dirty_page_limit(0, 4096), 0);
        assert_eq!(dirty_page_limit(1, 4096), 1);
        assert_eq!(dirty_page_limit(4096, 4096), 1);
        assert_eq!(dirty_page_limit(4097, 4096), 2);
        assert_eq!(dirty_page_limit(32 << 20, 4096), 8192);
    }
}

#[cfg(test)]
mod meta_tests {
    use super::meta;

    #[test]
    fn meta_pages_of_a_whole_file_pass_and_damage_is_named() {
        let head = meta::sample(4096, 9, 41);
        assert_eq!(meta::check(&head, 10 * 4096), Ok(()));
        assert_eq!(meta::check(&meta::sample(4096, 1, 0), 2 * 4096), Ok(()));
        // Past the end of the file.
        assert!(meta::check(&head, 9 * 4096).unwrap_err().contains("past the end of the file"));
        // A flipped bit in the newer transaction id.
        let mut flipped = head.clone();
        flipped[4096 + 144 + 5] ^= 1;
        assert!(meta::check(&flipped, 10 * 4096).unwrap_err().contains("not consecutive"));
        // A flipped bit in the last page number.
        let mut flipped = head.clone();
        flipped[4096 + 136 + 4] ^= 0x10;
        assert!(meta::check(&flipped, 10 * 4096).unwrap_err().contains("past"));
        // The magic number.
        let mut flipped = head;
        flipped[17] ^= 2;
        assert!(meta::check(&flipped, 10 * 4096).unwrap_err().contains("meta page 0"));
        assert!(meta::check(&[], 0).is_err());
    }
}
