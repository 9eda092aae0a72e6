//! Cold-cache measurement primitives for shoal's disk benchmarks (and for
//! the hannoy peer copy in `loadtest/hannoy-cold`, which uses this crate by
//! path).
//!
//! - [`drop_pages`]: fsync, then `posix_fadvise(POSIX_FADV_DONTNEED)`; it
//!   only drops pages nobody maps, so close the LMDB environment first, and
//!   check [`DropOutcome::emptied`].
//! - [`Probe`]: major faults (`getrusage`), bytes read from the device
//!   (`/proc/self/io`), pages of a file newly resident (`mincore` on a
//!   separate mapping), wall time, and a modelled network-disk time.
//! - [`PageMap`]: which LMDB database each page of `data.mdb` belongs to.
//! - [`MemoryGroup`]: a cgroup v1 memory group with a limit.
//!
//! ```no_run
//! # fn main() -> std::io::Result<()> {
//! let data = std::path::Path::new("env/data.mdb");
//! assert!(coldio::drop_pages(data)?.emptied());
//! let probe = coldio::Probe::start(data)?;
//! // ... open the environment and run the operation ...
//! let sample = probe.finish()?;
//! println!("{} major faults, {} bytes read", sample.major_faults, sample.read_bytes);
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! No shoal crate is a dependency (only `libc` and `serde`), so the hannoy
//! peer measures with the same code without building shoal.
//!
//! - `page_cache`: a file's pages in the kernel page cache (residency by
//!   `mincore`, dropping, warming), and the page size.
//! - `probe`: the counters around one operation, read before and after.
//! - `lmdb_pages`: LMDB 0.9's on-disk B-trees, walked to attribute pages to
//!   databases; apart because it reads the file format, not the kernel.
//! - `memory_group`: a cgroup v1 memory group, which caps the page cache a
//!   process may keep.
#![warn(missing_docs)]

mod lmdb_pages;
mod memory_group;
mod page_cache;
mod probe;

pub use lmdb_pages::{Classifier, PageKinds, PageMap};
pub use memory_group::{GroupStats, MemoryGroup};
pub use page_cache::{DropOutcome, Residency, drop_pages, mapped_by_this_process, os_page_size, residency, warm};
pub use probe::{MODELLED_FAULT_MS, PerUnit, Probe, Sample};
