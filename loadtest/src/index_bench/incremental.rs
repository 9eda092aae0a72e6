//! `index-bench`'s incremental inserts: batches of `added` points into
//! indexes built to each of the given sizes, timed one batch at a time.
//!
//! Two orders. One size after the other (the default) measures each
//! size's memory on its own. Interleaved (`--incremental-interleave`)
//! builds every size first and then sends round `r`'s batch to each size
//! in turn, so a ratio between sizes is taken from batches seconds apart:
//! on this project's shared VM, the two halves of a run minutes apart
//! differed by up to 1.4x with the same code (docs/scale.md).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use serde_json::json;
use shoal_engine::{Index, IndexOptions, IndexParams, IndexStats};

use super::{idle_fold, read_batch, round};
use crate::fvecs::VecFile;
use crate::memory::PeakSampler;

/// What to measure.
pub(super) struct Plan<'a> {
    pub base: &'a VecFile,
    pub params: IndexParams,
    pub opts: IndexOptions,
    pub root: &'a Path,
    pub sizes: &'a [usize],
    /// Points per measured batch.
    pub added: usize,
    /// Measured batches per size.
    pub repeats: usize,
    /// Points per batch of the builds.
    pub batch_size: usize,
    pub reopen: bool,
    pub interleave: bool,
    /// Fold the link log as an idle shard node would before the batches.
    pub idle_fold: bool,
}

/// One size's index and what its batches measured.
struct Sized {
    size: usize,
    dir: PathBuf,
    index: Index,
    build_seconds: f64,
    built: IndexStats,
    /// ms per vector of each measured batch.
    samples: Vec<f64>,
    /// Lists in the link log before the first batch and after each.
    log_lists: Vec<u64>,
    /// What the idle fold before the batches did, if one was asked for.
    idle_fold_before: serde_json::Value,
    /// Peak and starting RssAnon of its batches (one size at a time only).
    memory: Option<(u64, u64)>,
}

/// Runs the plan; one JSON entry per size that fits the base file.
pub(super) fn run(p: &Plan<'_>) -> Result<Vec<serde_json::Value>> {
    let sizes: Vec<usize> = p
        .sizes
        .iter()
        .copied()
        .filter(|&size| {
            let fits = size + p.added * p.repeats <= p.base.len();
            if !fits {
                eprintln!("skipping {} into {size}: the base file has {} vectors", p.added, p.base.len());
            }
            fits
        })
        .collect();
    if !p.interleave {
        let mut out = Vec::new();
        for size in sizes {
            let mut s = build(p, size)?;
            let sampler = PeakSampler::start();
            let before = sampler.start;
            for r in 0..p.repeats {
                insert(p, &mut s, r)?;
            }
            s.memory = Some((sampler.finish(), before));
            out.push(finish(s, p.added, None)?);
        }
        return Ok(out);
    }
    let mut all = sizes.into_iter().map(|size| build(p, size)).collect::<Result<Vec<_>>>()?;
    for r in 0..p.repeats {
        for s in &mut all {
            insert(p, s, r)?;
        }
    }
    let first = all.first().map(|s| s.samples.clone());
    all.into_iter().map(|s| finish(s, p.added, first.as_deref())).collect()
}

/// Builds the index of `size` points in the build's batch size (and
/// reopens it, if asked).
fn build(p: &Plan<'_>, size: usize) -> Result<Sized> {
    let dir = p.root.join(format!("inc-{size}"));
    let index = Index::open_or_create(&dir, p.params, p.opts.clone())?;
    let t = Instant::now();
    let mut s = 0;
    while s < size {
        let e = (s + p.batch_size).min(size);
        index.apply(read_batch(p.base, s, e)?)?;
        s = e;
    }
    let build_seconds = t.elapsed().as_secs_f64();
    let built = index.stats()?;
    eprintln!(
        "{size} built in {build_seconds:.1} s: {} MiB on disk, {} MiB free; tables {:?}",
        built.disk_bytes >> 20,
        built.free_bytes >> 20,
        built.table_bytes
    );
    let index = if p.reopen {
        drop(index);
        Index::open(&dir, p.opts.clone())?
    } else {
        index
    };
    let idle_fold_before = if p.idle_fold { fold_while_due(&index, size)? } else { serde_json::Value::Null };
    let log_lists = vec![index.stats()?.link_log_lists];
    Ok(Sized { size, dir, index, build_seconds, built, samples: Vec::new(), log_lists, idle_fold_before, memory: None })
}

/// Folds the link log a step at a time for as long as the engine says a
/// fold is due, as the shard node's writer does when idle
/// (`shard-node/src/writer.rs`). Null if none was due.
fn fold_while_due(index: &Index, size: usize) -> Result<serde_json::Value> {
    let lists = index.stats()?.link_log_lists;
    let started = Instant::now();
    let (mut steps, mut blocks) = (0u64, 0u64);
    while index.fold_due()? {
        let step = index.fold_link_log_step()?;
        steps += 1;
        blocks += step.blocks;
    }
    if steps == 0 {
        return Ok(serde_json::Value::Null);
    }
    let seconds = started.elapsed().as_secs_f64();
    let left = index.stats()?.link_log_lists;
    eprintln!("{size}: idle fold of {lists} lists before the batches, {blocks} blocks in {steps} steps, {seconds:.2} s; {left} lists left");
    Ok(json!({"lists": lists, "blocks": blocks, "steps": steps, "seconds": round(seconds, 3), "lists_left": left}))
}

/// Round `r`'s batch: the `added` base rows after the ones the index has.
fn insert(p: &Plan<'_>, s: &mut Sized, r: usize) -> Result<()> {
    let from = s.size + r * p.added;
    let batch = read_batch(p.base, from, from + p.added)?;
    let t = Instant::now();
    s.index.apply(batch)?;
    s.samples.push(t.elapsed().as_secs_f64() * 1000.0 / p.added as f64);
    s.log_lists.push(s.index.stats()?.link_log_lists);
    Ok(())
}

/// The size's JSON entry; with the first size's samples of the same
/// rounds (interleaved), also the per-round ratios to them.
fn finish(s: Sized, added: usize, first: Option<&[f64]>) -> Result<serde_json::Value> {
    let ms = median(&s.samples);
    let mean = s.samples.iter().sum::<f64>() / s.samples.len().max(1) as f64;
    let ratios: Option<Vec<f64>> = first.map(|f| s.samples.iter().zip(f).map(|(a, b)| a / b).collect());
    eprintln!(
        "{added} into {}: {ms:.4} ms/vector, median of {:.4?} (mean {mean:.4}){}{}; link log lists {:?}",
        s.size,
        s.samples,
        match s.memory {
            Some((peak, before)) => format!(", peak RssAnon {} MiB ({} MiB before the batches)", peak >> 20, before >> 20),
            None => String::new(),
        },
        match &ratios {
            Some(r) => format!(", {:.3}x the first size (median of the rounds' ratios {r:.3?})", median(r)),
            None => String::new(),
        },
        s.log_lists
    );
    let idle_fold = idle_fold(&s.index)?;
    let tables: serde_json::Map<_, _> = s.built.table_bytes.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect();
    let r4 = |v: &[f64]| v.iter().map(|&x| round(x, 4)).collect::<Vec<_>>();
    let mut entry = json!({"base": s.size, "added": added,
                           "ms_per_vector": round(ms, 4), "samples": r4(&s.samples),
                           "mean_ms_per_vector": round(mean, 4), "link_log_lists": s.log_lists,
                           "idle_fold": idle_fold, "build_seconds": round(s.build_seconds, 2),
                           "built_disk_bytes": s.built.disk_bytes,
                           "built_free_bytes": s.built.free_bytes, "built_table_bytes": tables,
                           "interleaved": first.is_some(),
                           "idle_fold_before": s.idle_fold_before});
    if let Some((peak, before)) = s.memory {
        entry["peak_rss_anon_bytes"] = json!(peak);
        entry["rss_anon_before_bytes"] = json!(before);
    }
    if let Some(r) = &ratios {
        entry["ratio_to_first"] = json!({"median": round(median(r), 4), "rounds": r4(r)});
    }
    drop(s.index);
    std::fs::remove_dir_all(&s.dir).ok();
    Ok(entry)
}

fn median(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use rand::SeedableRng;

    use crate::test_files::write_fvecs;
    use crate::{Cli, Command};

    /// Runs `index-bench` as a person types it on `rows` random 8-d rows
    /// (a 200-point build in 100-point batches, 5 queries at ef 16) with
    /// `extra` flags, and returns its JSON.
    fn index_bench(dir: &std::path::Path, rows: usize, name: &str, extra: &[&str]) -> serde_json::Value {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let (base, query, json) = (dir.join("base.fvecs"), dir.join("query.fvecs"), dir.join(format!("{name}.json")));
        write_fvecs(&base, rows, 8, &mut rng);
        write_fvecs(&query, 5, 8, &mut rng);
        let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
        let mut argv: Vec<String> = ["shoal-loadtest", "index-bench", "--base", &s(&base), "--query", &s(&query)]
            .into_iter()
            .chain(["--limit", "200", "--queries", "5", "--ef", "16", "--batch-size", "100", "--dir", &s(dir), "--json", &s(&json)])
            .map(String::from)
            .collect();
        argv.extend(extra.iter().map(|a| a.to_string()));
        let Command::IndexBench(args) = Cli::try_parse_from(argv).unwrap().command else { panic!("not index-bench") };
        super::super::run(args).unwrap();
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap()
    }

    /// Both orders: each size gets every round's batch (its index grows
    /// by them), interleaved entries carry the per-round ratios to the
    /// first size and no memory figure of their own, and a size the base
    /// file cannot feed is skipped.
    #[test]
    fn incremental_batches_go_to_every_size_in_both_orders() {
        let dir = tempfile::tempdir().unwrap();
        for interleave in [false, true] {
            let mut flags = vec!["--incremental-sizes", "200,600,900", "--incremental-batch", "50", "--incremental-repeats", "3"];
            if interleave {
                flags.push("--incremental-interleave");
            }
            let out = index_bench(dir.path(), 1_000, &format!("bench-{interleave}"), &flags);
            let inc = out["incremental"].as_array().unwrap();
            // 900 + 3 x 50 rows are more than the file has.
            assert_eq!(inc.iter().map(|e| e["base"].as_u64().unwrap()).collect::<Vec<_>>(), [200, 600], "{interleave}");
            for e in inc {
                assert_eq!(e["samples"].as_array().unwrap().len(), 3);
                assert_eq!(e["link_log_lists"].as_array().unwrap().len(), 4);
                assert_eq!(e["interleaved"], interleave);
                assert_eq!(e["peak_rss_anon_bytes"].is_u64(), !interleave, "memory is a size's own only one size at a time");
                let ratios = &e["ratio_to_first"]["rounds"];
                if interleave {
                    let (samples, first) = (e["samples"].as_array().unwrap(), inc[0]["samples"].as_array().unwrap());
                    for ((r, a), b) in ratios.as_array().unwrap().iter().zip(samples).zip(first) {
                        let want = a.as_f64().unwrap() / b.as_f64().unwrap();
                        assert!((r.as_f64().unwrap() - want).abs() <= 0.01 * want + 1e-4, "ratio {r} of {a} / {b}");
                    }
                } else {
                    assert!(ratios.is_null());
                }
            }
            assert_eq!(inc[0]["ratio_to_first"]["median"].as_f64().map(|m| m == 1.0), interleave.then_some(true));
        }
        // Every index directory was removed after its entry was written.
        let left: Vec<_> = walk(dir.path()).into_iter().filter(|p| p.ends_with("data.mdb")).collect();
        assert!(left.is_empty(), "{left:?}");
    }

    /// With `--incremental-idle-fold` the batches find the link log the
    /// build left folded away, as an idle shard node leaves it; without,
    /// they find it as the build left it.
    #[test]
    fn an_idle_fold_before_the_batches_empties_the_log_the_build_left() {
        let dir = tempfile::tempdir().unwrap();
        for fold in [false, true] {
            // Every batch appends to the log and none folds it.
            let mut flags =
                vec!["--link-log", "always", "--log-fold-lists", "1000000", "--incremental-sizes", "600", "--incremental-batch", "50"];
            if fold {
                flags.push("--incremental-idle-fold");
            }
            let out = index_bench(dir.path(), 700, &format!("bench-{fold}"), &flags);
            let e = &out["incremental"][0];
            let before_batches = e["link_log_lists"][0].as_u64().unwrap();
            let folded = &e["idle_fold_before"];
            if fold {
                assert_eq!(before_batches, 0, "{e}");
                assert!(folded["lists"].as_u64().unwrap() > 0, "{folded}");
                assert!(folded["blocks"].as_u64().unwrap() > 0, "{folded}");
                assert_eq!(folded["lists_left"], 0, "{folded}");
            } else {
                assert!(before_batches > 0, "the build left no log to fold: {e}");
                assert!(folded.is_null(), "{folded}");
            }
        }
    }

    fn walk(p: &std::path::Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(p).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
        out
    }
}
