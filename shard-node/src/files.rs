//! Open files: a shard node holds several per shard, so the process's
//! limit decides how many shards it can carry.

use crate::config::ShardNodeConfig;

/// Files one open shard holds: LMDB's data file, its lock file, and the
/// descriptor it writes meta pages through; one more for a snapshot or
/// restore that reads or writes beside it.
pub(crate) const FILES_PER_SHARD: usize = 4;

/// Files kept for everything else: the listener, logs, the snapshot
/// store's connections, the runtime.
const RESERVED_FILES: usize = 256;

/// Raises the soft open-file limit to the hard one (the soft default of
/// 1024 carries about 200 shards) and returns the limit now in force.
pub(crate) fn open_file_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes into `lim`.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
        // SAFETY: setrlimit only reads `raised`; raising the soft limit up
        // to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not everywhere
    let cur = lim.rlim_cur as u64;
    cur
}

/// The shard limit to enforce: the configured one, or fewer when the
/// open-file limit cannot carry that many (with the connections the
/// listener may hold on top).
pub(crate) fn shards_the_files_allow(cfg: &ShardNodeConfig) -> usize {
    let files = usize::try_from(open_file_limit()).unwrap_or(usize::MAX);
    let for_shards = files.saturating_sub(RESERVED_FILES + cfg.listener.max_connections) / FILES_PER_SHARD;
    let max = cfg.limits.max_shards.min(for_shards);
    if max < cfg.limits.max_shards {
        tracing::warn!(
            configured = cfg.limits.max_shards,
            open_file_limit = files,
            max_shards = max,
            "the open-file limit carries fewer shards than limits.max_shards; raise `ulimit -n` (LimitNOFILE) to hold more"
        );
    }
    max
}
