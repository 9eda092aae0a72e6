//! Counters around one operation: page faults, bytes read from the device,
//! pages of a file that became resident, wall time.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::page_cache::{Residency, context, residency};

/// Milliseconds one major fault costs on the modelled network disk.
pub const MODELLED_FAULT_MS: f64 = 1.0;

/// The process's fault counters (`getrusage(RUSAGE_SELF)`: all threads).
fn faults() -> (u64, u64) {
    // SAFETY: an all-zero rusage is valid, and getrusage only writes to it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0, 0);
    }
    (ru.ru_majflt as u64, ru.ru_minflt as u64)
}

/// `read_bytes` and `write_bytes` of `/proc/self/io`: bytes this process
/// caused to be fetched from, or sent to, the storage layer.
fn proc_io() -> io::Result<(u64, u64)> {
    let path = Path::new("/proc/self/io");
    let text = std::fs::read_to_string(path).map_err(|e| context("reading", path, e))?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| io::Error::other(format!("{} has no {name}", path.display())))
    };
    Ok((field("read_bytes:")?, field("write_bytes:")?))
}

/// Counters taken before an operation; [`Probe::finish`] takes the deltas.
pub struct Probe {
    file: PathBuf,
    start: Instant,
    faults: (u64, u64),
    io: (u64, u64),
    before: Residency,
}

impl Probe {
    /// Starts measuring; `file` is the one whose resident pages are counted.
    pub fn start(file: &Path) -> io::Result<Probe> {
        let before = residency(file)?;
        let io = proc_io()?;
        let faults = faults();
        Ok(Probe { file: file.to_owned(), start: Instant::now(), faults, io, before })
    }

    /// Stops measuring.
    pub fn finish(self) -> io::Result<Sample> {
        let wall = self.start.elapsed();
        let faults = faults();
        let io = proc_io()?;
        let after = residency(&self.file)?;
        let touched = after.newly_resident(&self.before);
        let major = faults.0.saturating_sub(self.faults.0);
        Ok(Sample {
            major_faults: major,
            minor_faults: faults.1.saturating_sub(self.faults.1),
            read_bytes: io.0.saturating_sub(self.io.0),
            write_bytes: io.1.saturating_sub(self.io.1),
            resident_pages_before: self.before.resident(),
            resident_pages_after: after.resident(),
            pages_touched: touched.resident(),
            file_pages: after.total(),
            wall_ms: wall.as_secs_f64() * 1e3,
            modelled_disk_ms: major as f64 * MODELLED_FAULT_MS,
            touched,
        })
    }
}

/// What one operation cost.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Sample {
    /// Page faults that had to wait for I/O, in all threads.
    pub major_faults: u64,
    /// Page faults served from memory.
    pub minor_faults: u64,
    /// Bytes fetched from the device for this process (readahead included).
    pub read_bytes: u64,
    /// Bytes this process dirtied for writing to the device.
    pub write_bytes: u64,
    /// Pages of the file resident before the operation.
    pub resident_pages_before: u64,
    /// Pages of the file resident after it.
    pub resident_pages_after: u64,
    /// Pages resident after that were not before: with the cache dropped
    /// first, the distinct pages the operation read (readahead included) or
    /// wrote. A lower bound where memory pressure evicts pages meanwhile.
    pub pages_touched: u64,
    /// Pages in the file after the operation.
    pub file_pages: u64,
    /// Wall-clock time.
    pub wall_ms: f64,
    /// Time the major faults would cost on a network disk
    /// ([`MODELLED_FAULT_MS`] each, one at a time).
    pub modelled_disk_ms: f64,
    /// The newly resident pages themselves, for attribution.
    #[serde(skip)]
    pub touched: Residency,
}

impl Sample {
    /// The counters divided by `n` (inserted vectors, queries).
    pub fn per(&self, n: usize) -> PerUnit {
        let n = n.max(1) as f64;
        PerUnit {
            major_faults: self.major_faults as f64 / n,
            read_bytes: self.read_bytes as f64 / n,
            pages_touched: self.pages_touched as f64 / n,
            wall_ms: self.wall_ms / n,
            modelled_disk_ms: self.modelled_disk_ms / n,
        }
    }
}

/// A [`Sample`] per inserted vector or per query.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct PerUnit {
    /// Major faults.
    pub major_faults: f64,
    /// Bytes read from the device.
    pub read_bytes: f64,
    /// Distinct pages newly resident.
    pub pages_touched: f64,
    /// Wall time.
    pub wall_ms: f64,
    /// Modelled network-disk time.
    pub modelled_disk_ms: f64,
}
