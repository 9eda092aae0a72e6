//! The node's claim on its data directory: an exclusive lock that one
//! process at a time holds (the kernel drops it when the process dies,
//! SIGKILL included), and the directory's incarnation, an id made the
//! first time a node uses it and kept there.
//!
//! Together they let a node restarted right after a crash take its own
//! registration over at once: a registration of the same incarnation can
//! only come from a process holding this directory's lock, so the one it
//! replaces is gone. A process with the same node id and another directory
//! has another incarnation and is refused while the first one lives.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

const LOCK_FILE: &str = "node.lock";
const INCARNATION_FILE: &str = "incarnation";

/// A data directory this process holds; the lock ends with the value.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    incarnation: String,
    _lock: File,
}

impl DataDir {
    /// Creates `path` if needed, locks it (failing at once, naming the
    /// holder's pid, if another process holds it) and reads or makes its
    /// incarnation.
    pub fn claim(path: &Path) -> Result<DataDir> {
        std::fs::create_dir_all(path).with_context(|| format!("creating the data directory {}", path.display()))?;
        let lock_path = path.join(LOCK_FILE);
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = lock.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() { "another process".to_owned() } else { format!("process {holder}") };
                bail!("the data directory {} is in use by {who} (a shard node on it); stop it first", path.display());
            }
            Err(TryLockError::Error(e)) => {
                // Some network and FUSE file systems have no locks. Without
                // one nothing proves the last run is gone, so no incarnation:
                // a restart waits for the old lease to end, as it must.
                tracing::warn!(dir = %path.display(), error = %e, "the data directory cannot be locked; a restart will wait for its previous registration's lease to end");
                return Ok(DataDir { path: path.to_owned(), incarnation: String::new(), _lock: lock });
            }
        }
        lock.set_len(0)?;
        write!(lock, "{}", std::process::id())?;
        let incarnation = incarnation(path)?;
        Ok(DataDir { path: path.to_owned(), incarnation, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This directory's id, the same on every run that uses it; empty
    /// where the directory cannot be locked.
    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }
}

/// Reads the directory's incarnation, making one (written whole, then
/// renamed into place) the first time.
fn incarnation(dir: &Path) -> Result<String> {
    let path = dir.join(INCARNATION_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("{} holds {id:?}, not an incarnation id (hex digits); remove the file to make a new one", path.display());
            }
            Ok(id.to_owned())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = format!("{:032x}", rand::random::<u128>());
            let tmp = dir.join(format!("{INCARNATION_FILE}.tmp"));
            let mut f = File::create(&tmp).with_context(|| format!("writing {}", tmp.display()))?;
            writeln!(f, "{id}")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
            File::open(dir)?.sync_all()?;
            Ok(id)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_the_incarnation_stays() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDir::claim(dir.path()).unwrap();
        assert_eq!(first.incarnation().len(), 32);
        let e = format!("{:#}", DataDir::claim(dir.path()).unwrap_err());
        assert!(e.contains("is in use by process") && e.contains(&std::process::id().to_string()), "{e}");
        let id = first.incarnation().to_owned();
        drop(first);
        let again = DataDir::claim(dir.path()).unwrap();
        assert_eq!(again.incarnation(), id, "a new run on the same directory is the same incarnation");
        let other = tempfile::tempdir().unwrap();
        assert_ne!(DataDir::claim(other.path()).unwrap().incarnation(), id);
        drop(again);
        std::fs::write(dir.path().join(INCARNATION_FILE), "not hex\n").unwrap();
        let e = format!("{:#}", DataDir::claim(dir.path()).unwrap_err());
        assert!(e.contains("not an incarnation id"), "{e}");
    }
}
