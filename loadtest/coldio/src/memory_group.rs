//! A cgroup v1 memory group with a limit, so that a process placed in it
//! cannot keep its whole working set in the page cache (page cache is
//! charged to the group of the process that reads a page in).

use std::io;
use std::path::{Path, PathBuf};

use crate::page_cache::context;

/// A child of this process's own memory cgroup, removed on drop.
#[derive(Debug)]
pub struct MemoryGroup {
    dir: PathBuf,
}

/// What the kernel counted for a group.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct GroupStats {
    /// The limit in force.
    pub limit_bytes: u64,
    /// Highest usage (anonymous memory and page cache) seen.
    pub max_usage_bytes: u64,
    /// Times usage hit the limit (and the kernel reclaimed).
    pub failcnt: u64,
}

fn read(path: &Path) -> io::Result<String> {
    std::fs::read_to_string(path).map_err(|e| context("reading", path, e))
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value).map_err(|e| context(&format!("writing {value:?} to"), path, e))
}

/// Where the v1 memory controller is mounted, from `/proc/self/mounts`.
fn mount_point() -> io::Result<PathBuf> {
    let mounts = read(Path::new("/proc/self/mounts"))?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "memory")).then(|| PathBuf::from(f[1]))
        })
        .next()
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                "no cgroup v1 memory controller is mounted (looked in /proc/self/mounts for a cgroup with the memory option)",
            )
        })
}

/// This process's group under the memory controller, from `/proc/self/cgroup`.
fn own_group() -> io::Result<String> {
    let text = read(Path::new("/proc/self/cgroup"))?;
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            controllers.split(',').any(|c| c == "memory").then(|| path.to_owned())
        })
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "/proc/self/cgroup names no memory cgroup"))
}

/// Removes empty groups left by runs that were killed before cleaning up:
/// siblings named like `name` up to its last `-` (`tool-PID`).
fn remove_stale(parent: &Path, name: &str) {
    let Some((prefix, _)) = name.rsplit_once('-') else { return };
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for e in entries.flatten() {
        let stale = e.file_name().to_str().is_some_and(|n| n.starts_with(prefix) && n != name)
            && read(&e.path().join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty());
        if stale && std::fs::remove_dir(e.path()).is_ok() {
            eprintln!("removed the stale memory cgroup {}", e.path().display());
        }
    }
}

impl MemoryGroup {
    /// Creates `name` under this process's memory cgroup with a limit of
    /// `limit_bytes`. Fails with a reason where cgroup v1 memory groups are
    /// not available or not writable (not root).
    pub fn create(name: &str, limit_bytes: u64) -> io::Result<MemoryGroup> {
        let root = mount_point()?;
        let own = own_group()?;
        let parent = root.join(own.trim_start_matches('/'));
        remove_stale(&parent, name);
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| context("creating the memory cgroup", &dir, e))?;
        let group = MemoryGroup { dir };
        write(&group.dir.join("memory.limit_in_bytes"), &limit_bytes.to_string())?;
        Ok(group)
    }

    /// The group's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Moves this process (all its threads) into the group at `dir`. Memory
    /// it already uses stays charged where it was; what it reads or
    /// allocates from now on is charged to the group.
    pub fn join(dir: &Path) -> io::Result<()> {
        write(&dir.join("cgroup.procs"), &std::process::id().to_string())
    }

    /// The kernel's counters for the group.
    pub fn stats(&self) -> io::Result<GroupStats> {
        let num = |file: &str| -> io::Result<u64> {
            let p = self.dir.join(file);
            read(&p)?.trim().parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", p.display())))
        };
        Ok(GroupStats {
            limit_bytes: num("memory.limit_in_bytes")?,
            max_usage_bytes: num("memory.max_usage_in_bytes")?,
            failcnt: num("memory.failcnt")?,
        })
    }
}

impl Drop for MemoryGroup {
    fn drop(&mut self) {
        // Succeeds once no process is left in the group; charges move to
        // the parent.
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("could not remove memory cgroup {}: {e}", self.dir.display());
        }
    }
}
