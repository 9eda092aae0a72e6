//! `slowfs`: a FUSE passthrough filesystem that adds a fixed latency to every
//! read that reaches it, to run a shard on a simulated network disk
//! (issue 8). Reads served by the kernel's page cache cost nothing, as on a
//! real network disk; a page fault that misses the cache becomes one FUSE
//! read (4 KiB with readahead off, up to the readahead window with it on)
//! and waits `--read-latency-ms`.
//!
//! Mounted with the `fuser` crate without libfuse: as root it calls
//! mount(2) itself; otherwise it needs `fusermount3` (Debian `fuse3`).
//! Requests are served by `--threads` threads, so that many reads wait
//! at once (a device queue depth). Files are opened with `FOPEN_KEEP_CACHE`
//! so the page cache survives reopening; `posix_fadvise(DONTNEED)` on a
//! file of the mount drops its pages like on any filesystem.
//!
//! The root holds a virtual file `.slowfs-stats` with the counters
//! (`reads`, `read_bytes`, `writes`, `write_bytes`, `fsyncs`), read by
//! `disk-bench` when its `--dir` is on the mount.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, MountOption, OpenFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};
use parking_lot::Mutex;

/// Flags of `slowfs`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Directory whose contents the mount shows (on a real disk).
    #[arg(long)]
    source: PathBuf,
    /// Empty directory to mount on.
    #[arg(long)]
    mount: PathBuf,
    /// Latency added to every read request that reaches the filesystem.
    #[arg(long, default_value_t = 1.0)]
    read_latency_ms: f64,
    /// Latency added to every write request.
    #[arg(long, default_value_t = 0.0)]
    write_latency_ms: f64,
    /// Threads serving requests: how many reads can wait at once.
    #[arg(long, default_value_t = 16)]
    threads: usize,
}

/// Name of the virtual counters file in the mount's root.
pub(crate) const STATS_FILE: &str = ".slowfs-stats";
const STATS_INO: u64 = u64::MAX - 1;
const TTL: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    fsyncs: AtomicU64,
}

impl Counters {
    fn text(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "reads {}\nread_bytes {}\nwrites {}\nwrite_bytes {}\nfsyncs {}\n",
            g(&self.reads),
            g(&self.read_bytes),
            g(&self.writes),
            g(&self.write_bytes),
            g(&self.fsyncs)
        )
    }
}

/// Inode numbers for source paths (relative to the source root). Numbers
/// are never reused, and start above the root's (1).
struct Inodes {
    paths: HashMap<u64, PathBuf>,
    inos: HashMap<PathBuf, u64>,
    next: u64,
}

impl Inodes {
    fn new() -> Inodes {
        Inodes { paths: HashMap::new(), inos: HashMap::new(), next: INodeNo::ROOT.0 }
    }

    fn ino(&mut self, rel: &Path) -> u64 {
        if let Some(&i) = self.inos.get(rel) {
            return i;
        }
        self.next += 1;
        let i = self.next;
        self.paths.insert(i, rel.to_owned());
        self.inos.insert(rel.to_owned(), i);
        i
    }

    fn forget_path(&mut self, rel: &Path) {
        if let Some(i) = self.inos.remove(rel) {
            self.paths.remove(&i);
        }
    }

    /// Moves `from` and everything under it to `to`.
    fn rename(&mut self, from: &Path, to: &Path) {
        self.forget_path(to);
        let moved: Vec<(PathBuf, u64)> = self.inos.iter().filter(|(p, _)| p.starts_with(from)).map(|(p, i)| (p.clone(), *i)).collect();
        for (p, i) in moved {
            let Ok(rest) = p.strip_prefix(from) else { continue };
            let np = if rest.as_os_str().is_empty() { to.to_owned() } else { to.join(rest) };
            self.inos.remove(&p);
            self.inos.insert(np.clone(), i);
            self.paths.insert(i, np);
        }
    }
}

struct SlowFs {
    source: PathBuf,
    read_latency: Duration,
    write_latency: Duration,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, Arc<File>>>,
    next_fh: AtomicU64,
    counters: Counters,
}

fn errno(e: std::io::Error) -> Errno {
    if e.raw_os_error().is_some() { Errno::from(e) } else { Errno::EIO }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 { UNIX_EPOCH + Duration::new(secs as u64, nsecs.clamp(0, 999_999_999) as u32) } else { UNIX_EPOCH }
}

fn attr(ino: u64, m: &std::fs::Metadata) -> FileAttr {
    let kind = if m.is_dir() {
        FileType::Directory
    } else if m.file_type().is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    };
    FileAttr {
        ino: INodeNo(ino),
        size: m.len(),
        blocks: m.blocks(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: time(m.ctime(), m.ctime_nsec()),
        kind,
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: m.blksize() as u32,
        flags: 0,
    }
}

fn stats_attr(len: u64) -> FileAttr {
    FileAttr {
        ino: INodeNo(STATS_INO),
        size: len,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0o444,
        nlink: 1,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl SlowFs {
    fn rel(&self, ino: INodeNo) -> Option<PathBuf> {
        if ino == INodeNo::ROOT {
            return Some(PathBuf::new());
        }
        self.inodes.lock().paths.get(&ino.0).cloned()
    }

    fn real(&self, rel: &Path) -> PathBuf {
        self.source.join(rel)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        let p = self.rel(parent).ok_or(Errno::ENOENT)?;
        Ok(p.join(name))
    }

    fn entry_of(&self, rel: &Path) -> Result<FileAttr, Errno> {
        let m = std::fs::symlink_metadata(self.real(rel)).map_err(errno)?;
        let ino = if rel.as_os_str().is_empty() { INodeNo::ROOT.0 } else { self.inodes.lock().ino(rel) };
        Ok(attr(ino, &m))
    }

    fn add_file(&self, f: File) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed) + 1;
        self.files.lock().insert(fh, Arc::new(f));
        fh
    }

    fn file(&self, fh: FileHandle) -> Result<Arc<File>, Errno> {
        self.files.lock().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }
}

fn open_options(flags: i32) -> OpenOptions {
    let mut o = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_WRONLY => o.write(true),
        libc::O_RDWR => o.read(true).write(true),
        _ => o.read(true),
    };
    // O_APPEND, O_TRUNC, O_CREAT, O_EXCL and the access mode are handled by
    // OpenOptions; pass the rest (O_SYNC, O_DSYNC...) through.
    o.custom_flags(flags & !(libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC));
    if flags & libc::O_TRUNC != 0 {
        o.truncate(true);
    }
    o
}

impl Filesystem for SlowFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name.as_bytes() == STATS_FILE.as_bytes() {
            reply.entry(&Duration::ZERO, &stats_attr(self.counters.text().len() as u64), Generation(0));
            return;
        }
        match self.child(parent, name).and_then(|rel| self.entry_of(&rel)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 == STATS_INO {
            reply.attr(&Duration::ZERO, &stats_attr(self.counters.text().len() as u64));
            return;
        }
        let meta = match fh.map(|fh| self.file(fh)) {
            Some(Ok(f)) => f.metadata().map_err(errno),
            _ => match self.rel(ino) {
                Some(rel) => std::fs::symlink_metadata(self.real(&rel)).map_err(errno),
                None => Err(Errno::ENOENT),
            },
        };
        match meta {
            Ok(m) => reply.attr(&TTL, &attr(ino.0, &m)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let Some(rel) = self.rel(ino) else { return reply.error(Errno::ENOENT) };
        let path = self.real(&rel);
        let result = (|| -> Result<(), Errno> {
            if let Some(size) = size {
                match fh.map(|fh| self.file(fh)) {
                    Some(Ok(f)) => f.set_len(size).map_err(errno)?,
                    _ => OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(size)).map_err(errno)?,
                }
            }
            if let Some(mode) = mode {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777)).map_err(errno)?;
            }
            Ok(())
        })();
        match result.and_then(|()| self.entry_of(&rel)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let result = self.child(parent, name).and_then(|rel| {
            let path = self.real(&rel);
            std::fs::create_dir(&path).map_err(errno)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & !umask & 0o7777)).map_err(errno)?;
            self.entry_of(&rel)
        });
        match result {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.child(parent, name).and_then(|rel| {
            std::fs::remove_file(self.real(&rel)).map_err(errno)?;
            self.inodes.lock().forget_path(&rel);
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.child(parent, name).and_then(|rel| {
            std::fs::remove_dir(self.real(&rel)).map_err(errno)?;
            self.inodes.lock().forget_path(&rel);
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let result = self.child(parent, name).and_then(|from| {
            let to = self.child(newparent, newname)?;
            std::fs::rename(self.real(&from), self.real(&to)).map_err(errno)?;
            self.inodes.lock().rename(&from, &to);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino.0 == STATS_INO {
            // Direct I/O: every read asks again, nothing is cached.
            return reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        }
        let Some(rel) = self.rel(ino) else { return reply.error(Errno::ENOENT) };
        match open_options(flags.0).open(self.real(&rel)) {
            // Keep the page cache across opens, as a local filesystem does;
            // without it every open would invalidate the file's pages.
            Ok(f) => reply.opened(FileHandle(self.add_file(f)), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let result = self.child(parent, name).and_then(|rel| {
            let mut o = open_options(flags);
            o.create(true).mode(mode & !umask & 0o7777);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            }
            if flags & libc::O_ACCMODE == libc::O_RDONLY {
                // Creating needs write access to the source; reads stay allowed.
                o.read(true).write(true);
            }
            let f = o.open(self.real(&rel)).map_err(errno)?;
            let a = self.entry_of(&rel)?;
            Ok((a, self.add_file(f)))
        });
        match result {
            Ok((a, fh)) => reply.created(&TTL, &a, Generation(0), FileHandle(fh), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        if ino.0 == STATS_INO {
            let text = self.counters.text();
            let start = (offset as usize).min(text.len());
            let end = (start + size as usize).min(text.len());
            return reply.data(&text.as_bytes()[start..end]);
        }
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        std::thread::sleep(self.read_latency);
        let mut buf = vec![0u8; size as usize];
        let mut done = 0;
        while done < buf.len() {
            match f.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(errno(e)),
            }
        }
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.read_bytes.fetch_add(done as u64, Ordering::Relaxed);
        reply.data(&buf[..done]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        if !self.write_latency.is_zero() {
            std::thread::sleep(self.write_latency);
        }
        match f.write_all_at(data, offset) {
            Ok(()) => {
                self.counters.writes.fetch_add(1, Ordering::Relaxed);
                self.counters.write_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                reply.written(data.len() as u32)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: fuser::LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        self.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        match if datasync { f.sync_data() } else { f.sync_all() } {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let Some(rel) = self.rel(ino) else { return reply.error(Errno::ENOENT) };
        let entries = match std::fs::read_dir(self.real(&rel)) {
            Ok(e) => e,
            Err(e) => return reply.error(errno(e)),
        };
        let mut all = vec![(ino.0, FileType::Directory, OsStr::new(".").to_owned()), (ino.0, FileType::Directory, "..".into())];
        for e in entries.flatten() {
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => FileType::Directory,
                Ok(t) if t.is_symlink() => FileType::Symlink,
                _ => FileType::RegularFile,
            };
            let child = rel.join(e.file_name());
            all.push((self.inodes.lock().ino(&child), kind, e.file_name()));
        }
        for (i, (ino, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let path = std::ffi::CString::new(self.source.as_os_str().as_bytes()).unwrap_or_default();
        // SAFETY: an all-zero statvfs is valid and statvfs only writes it.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a NUL-terminated path and a valid out pointer.
        if unsafe { libc::statvfs(path.as_ptr(), &mut s) } != 0 {
            return reply.error(errno(std::io::Error::last_os_error()));
        }
        reply.statfs(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize as u32, s.f_namemax as u32, s.f_frsize as u32);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fallocate(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        let f = match self.file(fh) {
            Ok(f) => f,
            Err(e) => return reply.error(e),
        };
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor; the kernel checks the arguments.
        let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as libc::off_t, length as libc::off_t) };
        if rc == 0 { reply.ok() } else { reply.error(errno(std::io::Error::last_os_error())) }
    }
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

pub(crate) fn run(a: Args) -> Result<()> {
    if !(a.read_latency_ms >= 0.0 && a.write_latency_ms >= 0.0) || a.threads == 0 {
        bail!("latencies must be at least 0 and --threads at least 1");
    }
    let source = a.source.canonicalize().with_context(|| format!("resolving --source {}", a.source.display()))?;
    if !source.is_dir() {
        bail!("--source {} is not a directory", source.display());
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse does not exist: this kernel or container has no FUSE");
    }
    let fs = SlowFs {
        source: source.clone(),
        read_latency: Duration::from_secs_f64(a.read_latency_ms / 1e3),
        write_latency: Duration::from_secs_f64(a.write_latency_ms / 1e3),
        inodes: Mutex::new(Inodes::new()),
        files: Mutex::new(HashMap::new()),
        next_fh: AtomicU64::new(0),
        counters: Counters::default(),
    };
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("slowfs".into()), MountOption::Subtype("slowfs".into())];
    config.n_threads = Some(a.threads);
    config.clone_fd = true;
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let session = fuser::spawn_mount(fs, &a.mount, &config).with_context(|| {
        format!("mounting {} (as root this needs /dev/fuse; otherwise fusermount3 from Debian's fuse3)", a.mount.display())
    })?;
    eprintln!(
        "slowfs: {} on {} with {} ms per read, {} ms per write, {} threads; Ctrl-C or SIGTERM unmounts",
        source.display(),
        a.mount.display(),
        a.read_latency_ms,
        a.write_latency_ms,
        a.threads
    );
    while !STOP.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("slowfs: unmounting {}", a.mount.display());
    session.umount_and_join().with_context(|| format!("unmounting {}", a.mount.display()))?;
    Ok(())
}

/// The counters of the slowfs mounted at or above `dir`, if any:
/// (reads, read bytes).
pub(crate) fn counters_above(dir: &Path) -> Option<(u64, u64)> {
    let text = dir.ancestors().find_map(|d| std::fs::read_to_string(d.join(STATS_FILE)).ok())?;
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')).and_then(|v| v.trim().parse::<u64>().ok());
    Some((field("reads")?, field("read_bytes")?))
}
