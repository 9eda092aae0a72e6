//! Where a batch puts the bottom-layer lists of existing nodes it changed:
//! patched into their blocks, or appended to the link log (and, once the
//! log is long enough, folded back a range of blocks per batch).
//!
//! A pure function of the log's shape and the batch's, so that each rule
//! can be tested on the sizes it is about (a million points) without
//! building them.

use super::LinkLog;
use crate::links_log;

/// Batches' worth of changed lists the log takes before it folds, at least
/// (`LinkLog::Auto`). A 10k-point batch into 1M points changes ~127k lists
/// in nearly every block: with a log of only `fold_lists` (131,072) lists
/// the fold follows every batch, so every commit rewrote all of the bottom
/// layer (131 MiB at 1M, the builder's largest dirty set). With room for
/// four such batches the fold goes in passes of two steps of half the
/// blocks each (`docs/engine.md`, "The link log").
pub(super) const BATCHES_PER_FOLD: u64 = 4;

/// What a batch does with the changed bottom lists of existing nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LogDecision {
    /// It changed none: the log stays as it is.
    Keep,
    /// Append them to the log as one value, and fold the given number of
    /// blocks of the log's pass (starting one if none is under way).
    Append { step: Option<u32> },
    /// Patch them and everything the log holds into the blocks, and empty
    /// the log (with an empty log: plain patching in place).
    Fold,
}

/// The link log as a batch finds it.
#[derive(Clone, Copy, Debug)]
pub(super) struct LogShape {
    /// Records it holds (a list logged twice counts twice).
    pub records: u64,
    /// Values (one per batch that appended).
    pub values: usize,
    /// A pass is under way.
    pub in_pass: bool,
    /// Records in its largest value: the largest batch it holds.
    pub largest_value: u64,
}

/// The batch's changed lists of existing nodes.
#[derive(Clone, Copy, Debug)]
pub(super) struct Changed {
    /// Lists.
    pub lists: u64,
    /// Distinct bottom-layer blocks they lie in.
    pub blocks: u64,
}

/// The graph's bottom layer before the batch.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layer {
    /// Nodes.
    pub nodes: u32,
    /// Bytes of one list (`codec::links_bytes(M0)`).
    pub list_bytes: u64,
    /// Lists per block (`codec::links0_block_nodes(M0)`).
    pub per_block: u32,
}

/// Decides for one batch.
pub(super) fn decide(mode: LinkLog, log: LogShape, changed: Changed, layer: Layer) -> LogDecision {
    let Some(fold_lists) = mode.fold_lists() else { return LogDecision::Fold };
    if changed.lists == 0 {
        return LogDecision::Keep;
    }
    let lists = changed.lists;
    // Room for `BATCHES_PER_FOLD` of this batch or of the largest one the
    // log holds, so that smaller batches after large ones go on with the
    // pass rather than fold the large ones' records whole.
    let fold_lists = match mode {
        LinkLog::Auto { .. } => (fold_lists as u64).max(BATCHES_PER_FOLD * lists.max(log.largest_value)),
        LinkLog::Off | LinkLog::Always { .. } => fold_lists as u64,
    };
    // The log holds at most twice as many lists as the index has nodes:
    // past that it is larger than the blocks it shadows, and a fold
    // (which rewrites at most every block) costs less than carrying it.
    let fold_lists = fold_lists.min(u64::from(layer.nodes)).max(1);
    let records = log.records + lists;
    let empty = log.values == 0;
    if records > 2 * fold_lists
        || (empty && records > fold_lists)
        || log.values >= links_log::MAX_VALUES
        || lists > links_log::MAX_RECORDS as u64
    {
        return LogDecision::Fold;
    }
    let all_blocks = u64::from(layer.nodes.div_ceil(layer.per_block.max(1)));
    if log.in_pass || records > fold_lists {
        // A pass folds the log a range of blocks per batch, so no commit
        // rewrites every block. Its steps cover twice the batch's share of
        // the blocks: the pass ends before the records it lets in take the
        // log from `fold_lists` to twice that. A pass that would end in
        // its first step is a fold.
        let step = (2 * all_blocks * lists).div_ceil(fold_lists).max(1);
        if !log.in_pass && step >= all_blocks {
            return LogDecision::Fold;
        }
        return LogDecision::Append { step: Some(step.min(u64::from(u32::MAX)) as u32) };
    }
    if matches!(mode, LinkLog::Always { .. }) || !empty {
        return LogDecision::Append { step: None };
    }
    // With an empty log, choose by the bytes a batch costs: patching in
    // place writes the blocks it touches; appending writes the records,
    // plus its share of the fold that will rewrite (nearly) every block
    // once the log holds `fold_lists` lists. A small index has few blocks
    // and a batch touches most of them, so it keeps patching.
    let block_bytes = layer.list_bytes * u64::from(layer.per_block);
    let append = lists * links_log::record_bytes(layer.list_bytes as usize) as u64 + all_blocks * block_bytes * lists / fold_lists;
    if changed.blocks * block_bytes <= append { LogDecision::Fold } else { LogDecision::Append { step: None } }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;

    const AUTO: LinkLog = LinkLog::Auto { fold_lists: 131_072 };

    fn layer(nodes: u32) -> Layer {
        Layer { nodes, list_bytes: codec::links_bytes(32) as u64, per_block: codec::links0_block_nodes(32) as u32 }
    }

    fn blocks(l: &Layer) -> u64 {
        u64::from(l.nodes.div_ceil(l.per_block))
    }

    /// What a run of batches into an index of `nodes` does, each batch
    /// `(lists, blocks)` of changed lists: the decisions, and the most
    /// blocks any one of them rewrites. The log (one count per value)
    /// follows each decision as the writer's would.
    fn run(nodes: u32, batches: &[(u64, u64)]) -> (Vec<LogDecision>, u64) {
        let l = layer(nodes);
        let all = blocks(&l);
        // The log's values, and the pass: (cursor, values it folds).
        let (mut log, mut pass): (Vec<u64>, Option<(u64, usize)>) = (Vec::new(), None);
        let (mut out, mut most) = (Vec::new(), 0);
        for &(lists, touched) in batches {
            let shape = LogShape {
                records: log.iter().sum(),
                values: log.len(),
                in_pass: pass.is_some(),
                largest_value: log.iter().copied().max().unwrap_or(0),
            };
            let d = decide(AUTO, shape, Changed { lists, blocks: touched }, l);
            match d {
                LogDecision::Keep => {}
                LogDecision::Fold => {
                    most = most.max(all);
                    (log, pass) = (Vec::new(), None);
                }
                LogDecision::Append { step } => {
                    if let Some(step) = step.map(u64::from) {
                        most = most.max(step);
                        let (cursor, folds) = pass.unwrap_or((0, log.len()));
                        if cursor + step >= all {
                            log.drain(..folds);
                            pass = None;
                        } else {
                            pass = Some((cursor + step, folds));
                        }
                    }
                    log.push(lists);
                }
            }
            out.push(d);
        }
        (out, most)
    }

    /// A 10k-point batch into 1M: ~12.7 changed lists per new point, in
    /// 86% of the blocks.
    fn big(l: &Layer) -> (u64, u64) {
        (127_000, blocks(l) * 86 / 100)
    }

    #[test]
    fn ten_thousand_point_batches_into_a_million_fold_in_passes_not_whole() {
        let l = layer(1_000_000);
        let (decisions, most) = run(1_000_000, &[big(&l); 24]);
        assert!(!decisions.contains(&LogDecision::Fold), "{decisions:?}");
        assert!(decisions.iter().any(|d| matches!(d, LogDecision::Append { step: Some(_) })), "{decisions:?}");
        // No commit rewrites more than about half of the bottom layer.
        assert!(most <= blocks(&l).div_ceil(2) + 1, "{most} of {}", blocks(&l));
    }

    #[test]
    fn small_batches_after_large_ones_go_on_with_the_pass() {
        // 1k-point batches alone would fold a log past 2 x 131,072 lists
        // whole; the large batches' values keep the threshold theirs.
        let l = layer(1_000_000);
        let mut batches = vec![big(&l); 6];
        batches.extend([(12_700, 11_000); 40]);
        let (decisions, most) = run(1_000_000, &batches);
        assert!(!decisions.contains(&LogDecision::Fold), "{decisions:?}");
        assert!(most <= blocks(&l).div_ceil(2) + 1, "{most} of {}", blocks(&l));
    }

    #[test]
    fn with_the_old_threshold_every_such_batch_rewrote_the_whole_layer() {
        // The rule without the batch-sized threshold, for contrast: the
        // test above fails on it.
        let l = layer(1_000_000);
        let old = LinkLog::Always { fold_lists: 131_072 };
        let shape = LogShape { records: 127_000, values: 1, in_pass: false, largest_value: 127_000 };
        assert_eq!(decide(old, shape, Changed { lists: 127_000, blocks: blocks(&l) }, l), LogDecision::Fold);
    }

    #[test]
    fn thousand_point_batches_keep_the_configured_threshold() {
        // 4 x 12.7k is under 131,072: the log and its passes are as before.
        let l = layer(1_000_000);
        let shape = LogShape { records: 131_000, values: 10, in_pass: false, largest_value: 13_100 };
        let step = (2 * blocks(&l) * 12_700).div_ceil(131_072);
        assert_eq!(decide(AUTO, shape, Changed { lists: 12_700, blocks: 12_000 }, l), LogDecision::Append { step: Some(step as u32) });
    }

    #[test]
    fn a_small_index_keeps_patching_in_place() {
        // 1k points into 10k change lists in every one of its blocks.
        let l = layer(10_000);
        let shape = LogShape { records: 0, values: 0, in_pass: false, largest_value: 0 };
        assert_eq!(decide(AUTO, shape, Changed { lists: 9_000, blocks: blocks(&l) }, l), LogDecision::Fold);
        assert_eq!(decide(AUTO, shape, Changed { lists: 0, blocks: 0 }, l), LogDecision::Keep);
        assert_eq!(decide(LinkLog::Off, shape, Changed { lists: 5, blocks: 5 }, l), LogDecision::Fold);
    }

    #[test]
    fn a_full_log_folds_whatever_the_batch() {
        let l = layer(1_000_000);
        let shape = LogShape { records: 10, values: links_log::MAX_VALUES, in_pass: false, largest_value: 0 };
        assert_eq!(decide(AUTO, shape, Changed { lists: 10, blocks: 10 }, l), LogDecision::Fold);
        let shape = LogShape { records: 2_000_000, values: 20, in_pass: true, largest_value: 0 };
        assert_eq!(decide(AUTO, shape, Changed { lists: 10, blocks: 10 }, l), LogDecision::Fold);
    }
}
