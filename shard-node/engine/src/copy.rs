//! Streaming a committed state of the index out, for snapshots.
//!
//! LMDB copies an environment from one read transaction
//! (`mdb_env_copyfd2`); shoal needs to know *which* commit that was, so the
//! snapshot's manifest can name its per-source offsets and counts. The
//! copy runs on its own thread into a pipe. This side holds the index's
//! writer lock from the moment it reads the commit's state until the copy's
//! first bytes come out of the pipe: LMDB starts the copy's read
//! transaction before it writes anything, and no commit can happen in
//! between, so both saw the same commit. Writers wait for microseconds to
//! milliseconds, not for the copy. The rest streams while ingest goes on.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use heed::CompactionOption;

use crate::error::{Error, Result};
use crate::index::Index;
use crate::params::IndexParams;
use crate::session;

/// How the environment is copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CopyMode {
    /// Every page up to the last used one, free pages included (LMDB's
    /// plain copy). Cheapest in CPU; the output is as large as the used
    /// part of the data file.
    #[default]
    Plain,
    /// Live pages only, renumbered (`MDB_CP_COMPACT`): smaller output, more
    /// CPU, and the B-trees come out densely packed.
    Compact,
}

/// What a copy holds: the state of the commit it was taken from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyInfo {
    /// Creation parameters of the index.
    pub params: IndexParams,
    /// LMDB's id of the copied commit.
    pub txn_id: u64,
    /// Live points.
    pub live: u64,
    /// Retired nodes kept for routing.
    pub tombstones: u64,
    /// Every source's highest applied offset, sorted by name.
    pub offsets: Vec<(String, u64)>,
    /// The shard's epoch in that commit.
    pub epoch: u64,
    /// Sequence number of the last batch in the copy: a copy restored
    /// from it catches up from the batch log starting at the next one.
    pub last_seq: u64,
    /// Bytes written to the sink.
    pub bytes: u64,
}

impl Index {
    /// Streams a consistent image of the last commit into `out` (a valid
    /// `data.mdb` once complete) and says which commit it was. Ingest and
    /// searches go on while it runs; the map cannot grow meanwhile (a batch
    /// that needs to grow it waits up to `resize_wait`, then fails with
    /// [`Error::ResizeBlocked`] and can be retried).
    ///
    /// An error from `out` stops the copy and is returned as
    /// [`Error::Io`].
    pub fn copy_to<W: Write + ?Sized>(&self, mode: CopyMode, out: &mut W) -> Result<CopyInfo> {
        let io = |source: std::io::Error| Error::Io { path: self.path().join("data.mdb"), source };
        let (reader, writer) = pipe().map_err(io)?;
        let mut reader = std::fs::File::from(reader);
        // Counted before it waits for any lock: a compaction that holds
        // the writer lock and waits for read transactions to end gives up
        // when it sees a copy waiting (see `Index::compact`).
        let _copying = Copying::new(&self.copies);
        // Held for the whole copy: remapping under the copy's read
        // transaction would leave it reading unmapped memory, and a
        // compaction would replace the store.
        let _no_resize = self.resize.read();
        let store = &self.store;
        let option = match mode {
            CopyMode::Plain => CompactionOption::Disabled,
            CopyMode::Compact => CompactionOption::Enabled,
        };
        std::thread::scope(|scope| {
            let writer_lock = self.writer.lock();
            let txn = store.env.read_txn().map_err(|e| store.err(e))?;
            let txn_id = txn.id() as u64;
            let state = session::read_state(store, &txn)?;
            let offsets = session::offsets(store, &txn)?;
            drop(txn);
            let copier = scope.spawn(move || {
                // SAFETY: `writer` is an open pipe owned by this thread and
                // closed when it returns, which ends the stream.
                let r = unsafe { store.env.copy_to_fd(writer.as_raw_fd(), option) };
                drop(writer);
                r
            });
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            let mut writer_lock = Some(writer_lock);
            let streamed: std::io::Result<()> = loop {
                let n = match reader.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => break Err(e),
                };
                // First bytes (or the end): the copy's transaction exists.
                writer_lock.take();
                if n == 0 {
                    break Ok(());
                }
                total += n as u64;
                if let Err(e) = out.write_all(&buf[..n]) {
                    break Err(e);
                }
            };
            drop(writer_lock);
            // Closing our end makes a copy still writing fail with EPIPE
            // instead of blocking forever.
            drop(reader);
            let copied = copier.join().map_err(|_| io(std::io::Error::other("the copy thread panicked")))?;
            streamed.map_err(io)?;
            copied.map_err(|e| store.err(e))?;
            let info = CopyInfo {
                params: self.params,
                txn_id,
                live: state.live,
                tombstones: state.tombstones,
                offsets,
                epoch: state.shard_epoch,
                last_seq: state.last_seq,
                bytes: total,
            };
            Ok(info)
        })
    }

    /// Size in bytes of a [`CopyMode::Plain`] copy of the last commit: the
    /// used part of the data file. Useful to report progress.
    pub fn used_bytes(&self) -> Result<u64> {
        let _shared = self.resize.read();
        let info = self.store.env.info();
        Ok((info.last_page_number as u64 + 1) * u64::from(self.store.page_size()))
    }
}

/// Counts a copy in progress for as long as it lives.
struct Copying<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Copying<'a> {
    fn new(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        count.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Copying(count)
    }
}

impl Drop for Copying<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both are open descriptors we now own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
