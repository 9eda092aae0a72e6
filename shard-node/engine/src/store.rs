//! The LMDB environment of one shard and the databases inside it.

use std::path::{Path, PathBuf};

use heed::types::Bytes;
use heed::{CommitOrAbort, Database, Env, EnvFlags, EnvOpenOptions, WithoutTls};

use crate::error::{Error, Result};

/// Every database is raw bytes; `codec` gives the bytes their meaning.
pub(crate) type Db = Database<'static, Bytes, Bytes>;

/// The databases of one index.
#[derive(Clone, Copy)]
pub(crate) struct Dbs {
    /// `params`, `state`.
    pub(crate) meta: Db,
    /// internal id (BE u32) → prepared vector (dim × f32 LE).
    pub(crate) vectors: Db,
    /// internal id → the vector's code (see `quant`), what the graph is
    /// walked with.
    pub(crate) codes: Db,
    /// block number → bottom-layer link lists of its ids
    /// (`codec::links0_block_nodes`).
    pub(crate) links0: Db,
    /// log epoch (BE u64) → changed bottom-layer lists of existing nodes,
    /// not yet folded into `links0` (see `links_log`).
    pub(crate) links0_log: Db,
    /// (level, internal id) → upper-layer link list.
    pub(crate) links_up: Db,
    /// internal id → [`crate::codec::NodeRecord`] (external id, level, flags).
    pub(crate) nodes: Db,
    /// external id (BE u64) → live internal id (BE u32).
    pub(crate) external: Db,
    /// internal id → payload bytes, for points that carry one.
    pub(crate) payloads: Db,
    /// source name → highest applied offset (BE u64).
    pub(crate) offsets: Db,
    /// sequence number (BE u64) → one applied batch (`batch_log`), the
    /// newest ones within the retention.
    pub(crate) batch_log: Db,
}

/// How the environment is opened.
#[derive(Clone, Debug)]
pub(crate) struct StoreOptions {
    pub(crate) initial_map_size: u64,
    pub(crate) max_map_size: u64,
    pub(crate) max_readers: u32,
    pub(crate) durable: bool,
    pub(crate) read_ahead: bool,
}

/// An open environment with its databases.
pub(crate) struct Store {
    pub(crate) env: Env<WithoutTls>,
    pub(crate) dbs: Dbs,
    pub(crate) path: PathBuf,
    pub(crate) max_map_size: u64,
}

impl Store {
    /// Opens (creating if needed) the environment in `path`.
    pub(crate) fn open(path: &Path, opts: &StoreOptions) -> Result<Store> {
        std::fs::create_dir_all(path).map_err(|source| io_error(path, path, source))?;
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
        builder.map_size(map_size as usize).max_dbs(16).max_readers(opts.max_readers);
        // SAFETY: the flags are valid LMDB environment flags; NO_SYNC trades
        // durability of the last commits for speed and is opt-in.
        unsafe { builder.flags(flags) };
        // SAFETY: the environment's files are only ever modified through LMDB
        // in this process; shoal never opens them with anything else.
        let env = unsafe { builder.open(path) }.map_err(|e| storage(path, e))?;
        let wtxn = env.write_txn().map_err(|e| storage(path, e))?;
        let (meta, vectors, codes, links0, links0_log, links_up, nodes, external, payloads, offsets, batch_log) = env
            .create_databases_and_commit(wtxn, |dbo, wtxn| -> heed::Result<_> {
                let mut create = |name: &'static str| dbo.create_database::<Bytes, Bytes>(wtxn, Some(name));
                Ok(CommitOrAbort::<_, ()>::Commit((
                    create("meta")?,
                    create("vectors")?,
                    create("codes")?,
                    create("links0")?,
                    create("links0_log")?,
                    create("links_up")?,
                    create("nodes")?,
                    create("external")?,
                    create("payloads")?,
                    create("offsets")?,
                    // Created on first open by a build that has it: an
                    // index written before it starts with an empty log.
                    create("batch_log")?,
                )))
            })
            .map_err(|e| storage(path, e))?
            .unwrap_commit();
        Ok(Store {
            env,
            dbs: Dbs { meta, vectors, codes, links0, links0_log, links_up, nodes, external, payloads, offsets, batch_log },
            path: path.to_owned(),
            max_map_size: opts.max_map_size,
        })
    }

    /// Maps a heed error to the engine's, naming the environment.
    pub(crate) fn err(&self, e: heed::Error) -> Error {
        storage(&self.path, e)
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
        self.env.read_txn().ok().and_then(|t| self.dbs.meta.stat(&t).ok()).map_or(page_size() as u32, |s| s.page_size)
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
/// [`Error::OpenFileLimit`], everything else keeps its source.
pub(crate) fn storage(path: &Path, e: heed::Error) -> Error {
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
}
