//! A damaged `data.mdb` (issue 23): random bytes flipped in random pages
//! of a closed index, which is then opened and read in full.
//!
//! LMDB keeps no page checksums; unpatched, a damaged page pointer or node
//! header made liblmdb itself fault, loop or abort (about 4% of cases).
//! The liblmdb shoal builds checks each page before trusting it
//! (third_party/README.md), and this test holds it to that. Every damaged
//! copy is opened in a child process (this test binary run again with
//! `--exact` and an environment variable naming the case), so that a
//! crash fails one case with its signal and phase instead of the whole
//! run; the parent asserts that each child exits normally: the engine
//! returned results or errors, never panicked, never crashed, never hung.
//!
//! Cases: `SHOAL_FUZZ_ENV_CASES`, else `SHOAL_FUZZ_CASES / 1000` (a soak
//! run's count is per decoder, and a case here is a process), at least 64
//! (a case takes about 25 ms).
//! Seeds are case numbers, so a failure names the case to replay with
//! `SHOAL_FUZZ_ENV_CASE_ONLY=<n>`; `SHOAL_FUZZ_ENV_KEEP=<dir>` keeps the
//! damaged `data.mdb` of every failing case there, for a debugger.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_engine::{Batch, Error, Index, IndexOptions, IndexParams, LinkLog, Metric, Op, Point, SearchParams};

use crate::common::{random_batch, random_vector, test_options};

const CASE_VAR: &str = "SHOAL_FUZZ_ENV_CASE_DIR";
const NAME: &str = "corruption::fuzz_corrupted_environments";
const DIM: usize = 8;
const POINTS: u64 = 3000;
/// A child that takes longer than this is reported as hung.
const CHILD_LIMIT: Duration = Duration::from_secs(20);

fn cases() -> u64 {
    let var = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    var("SHOAL_FUZZ_ENV_CASES").unwrap_or_else(|| var("SHOAL_FUZZ_CASES").map_or(64, |n| (n / 1000).max(64)))
}

/// A work directory for the cases, and the bytes of the `data.mdb` of the
/// index `build` makes in it: what each case copies and damages.
fn clean_copy() -> (tempfile::TempDir, Vec<u8>) {
    let work = tempfile::tempdir().expect("tempdir");
    let clean = work.path().join("clean");
    build(&clean);
    let _ = std::fs::remove_file(clean.join("lock.mdb"));
    let original = std::fs::read(clean.join("data.mdb")).expect("read data.mdb");
    (work, original)
}

/// Builds the index every case damages: a few batches (so the link log
/// and the batch log hold values), payloads, a source offset, deletes
/// (tombstones), two levels of graph at least.
fn build(dir: &Path) {
    let mut rng = StdRng::seed_from_u64(23);
    // Folded only past 100k lists, so the log still holds values at the end.
    // Retired ids are not reused, so the damaged file holds tombstones.
    let opts = IndexOptions { link_log: LinkLog::Always { fold_lists: 100_000 }, reuse_retired: false, ..test_options() };
    let index = Index::open_or_create(dir, IndexParams::new(DIM as u32, Metric::Euclidean), opts).expect("create index");
    // The last batches are small: a batch that changes more lists than
    // the index has nodes folds the log instead of appending to it.
    let starts = [0, 500, 1000, 1500, 2000, 2500, 2800, 2900, POINTS];
    for (b, w) in starts.windows(2).enumerate() {
        if w[0] == 1500 {
            let deletes = (0..w[0]).step_by(11).map(Op::Delete).collect();
            index.apply(Batch { ops: deletes, source: None }).expect("deletes");
        }
        let mut batch = random_batch(&mut rng, DIM, w[0]..w[1]).with_source("job", b as u64);
        for op in batch.ops.iter_mut().step_by(7) {
            if let Op::Upsert(p) = op {
                p.payload = Some(format!("payload of {}", p.id).into_bytes());
            }
        }
        index.apply(batch).expect("apply");
    }
    let stats = index.stats().expect("stats");
    assert!(stats.link_log_lists > 0 && stats.tombstones > 0 && stats.batch_log_entries > 0, "{stats:?}");
}

/// LMDB's page kinds, from the page header's flags (offset 10).
fn page_kind(page: &[u8]) -> &'static str {
    match page.get(10..12).map(|f| u16::from_le_bytes([f[0], f[1]])) {
        Some(0x08) => "meta",
        Some(0x01) => "branch",
        Some(0x02) => "leaf",
        Some(0x04) => "overflow (first page)",
        Some(0x22) => "leaf2",
        Some(_) | None => "overflow continuation or free",
    }
}

/// Flips random bytes in 1 to 4 random pages of `data`; returns what it
/// did, for the report.
fn damage(data: &mut [u8], seed: u64) -> Vec<String> {
    const PAGE: usize = 4096;
    let mut rng = StdRng::seed_from_u64(seed);
    let pages = data.len() / PAGE;
    let mut what = Vec::new();
    for _ in 0..rng.random_range(1..=4) {
        let p = rng.random_range(0..pages);
        let kind = page_kind(&data[p * PAGE..(p + 1) * PAGE]);
        let mut offsets = Vec::new();
        for _ in 0..rng.random_range(1..=8) {
            // Headers are where damage matters most: half the flips land
            // in a page's first 64 bytes.
            let at = if rng.random_bool(0.5) { rng.random_range(0..64) } else { rng.random_range(0..PAGE) };
            data[p * PAGE + at] ^= rng.random_range(1..=255u8);
            offsets.push(at);
        }
        what.push(format!("page {p} ({kind}) at {offsets:?}"));
    }
    what
}

/// The name of an error's variant, for the tally.
fn kind(e: &Error) -> String {
    let debug = format!("{e:?}");
    debug.split([' ', '(', '{']).next().unwrap_or_default().to_owned()
}

/// What the child is doing, for the line its signal handler writes.
static PHASE: AtomicUsize = AtomicUsize::new(0);
const PHASES: [&str; 10] =
    ["open", "stats and offsets", "get", "search", "digest", "scrub", "read_log", "apply", "search after apply", "done"];

fn phase(name: &str) {
    PHASE.store(PHASES.iter().position(|p| *p == name).unwrap_or(0), Ordering::Relaxed);
}

/// Writes which phase the child was in when a fatal signal came, then dies
/// of it as before: only async-signal-safe calls.
extern "C" fn on_fatal_signal(sig: libc::c_int) {
    let name = PHASES.get(PHASE.load(Ordering::Relaxed)).copied().unwrap_or("?");
    for part in ["\nfuzz-env-crash during ", name, "\n"] {
        // SAFETY: write(2) on stderr with a valid buffer.
        unsafe { libc::write(2, part.as_ptr().cast(), part.len()) };
    }
    // SAFETY: restoring the default action and re-raising are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn report_fatal_signals() {
    for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT] {
        // SAFETY: installs a handler that only makes async-signal-safe calls.
        unsafe { libc::signal(sig, on_fatal_signal as *const () as libc::sighandler_t) };
    }
}

/// In the child: opens the damaged copy in `dir` and reads everything,
/// then writes a batch; prints one line with the tally of outcomes.
fn read_everything(dir: &Path) {
    let mut tally: BTreeMap<String, u32> = BTreeMap::new();
    // The first message of each kind of error.
    let mut first_errors: BTreeMap<String, String> = BTreeMap::new();
    let mut note = |r: Result<(), Error>| match r {
        Ok(()) => *tally.entry("ok".into()).or_default() += 1,
        Err(e) => {
            // The error must name the environment it is about.
            if let Error::Corrupt { path, .. } | Error::Storage { path, .. } = &e {
                assert_eq!(path, dir, "{e}");
            }
            first_errors.entry(kind(&e)).or_insert_with(|| e.to_string());
            *tally.entry(kind(&e)).or_default() += 1;
        }
    };
    report_fatal_signals();
    phase("open");
    let index = match Index::open(dir, IndexOptions { build_threads: 2, ..test_options() }) {
        Ok(index) => index,
        Err(e) => {
            println!("fuzz-env-outcome open={} detail={e}", kind(&e));
            return;
        }
    };
    let mut rng = StdRng::seed_from_u64(7);
    phase("stats and offsets");
    note(index.stats().map(drop));
    note(index.offsets().map(drop));
    note(index.offset("job").map(drop));
    phase("get");
    for id in 0..POINTS + 10 {
        note(index.get(id).map(drop));
    }
    phase("search");
    for _ in 0..20 {
        let q = random_vector(&mut rng, DIM);
        note(index.search(&q, SearchParams { k: 10, ef: 64, with_payload: true }).map(drop));
    }
    phase("digest");
    note(index.snapshot().and_then(|s| s.digest()).map(drop));
    // What the node's background scrub does: every value against its
    // checksum, in steps.
    phase("scrub");
    note((|| {
        let mut cursor = shoal_engine::ScrubCursor::default();
        loop {
            let step = index.scrub(&cursor, 64 << 10)?;
            if step.pass_done {
                return Ok(());
            }
            cursor = step.next;
        }
    })());
    phase("read_log");
    note(index.read_log(1, u64::MAX).map(drop));
    // A node keeps taking writes after a damage nobody noticed.
    let batch = Batch {
        ops: (0..20)
            .map(|i| Op::Upsert(Point { id: 1_000_000 + i, vector: random_vector(&mut rng, DIM), payload: None }))
            .chain([Op::DeleteIfPresent(5)])
            .collect(),
        source: None,
    };
    phase("apply");
    note(index.apply(batch).map(drop));
    phase("search after apply");
    note(index.search(&random_vector(&mut rng, DIM), SearchParams::new(10, 64)).map(drop));
    phase("done");
    let tally: Vec<String> = tally.iter().map(|(k, n)| format!("{k}:{n}")).collect();
    println!("fuzz-env-outcome open=ok ops={} errors={:?}", tally.join(","), first_errors.values().collect::<Vec<_>>());
}

#[test]
fn fuzz_corrupted_environments() {
    if let Ok(dir) = std::env::var(CASE_VAR) {
        read_everything(Path::new(&dir));
        return;
    }
    let t0 = Instant::now();
    let (work, original) = clean_copy();
    // The undamaged copy reads without a single error.
    let only: Option<u64> = std::env::var("SHOAL_FUZZ_ENV_CASE_ONLY").ok().and_then(|s| s.parse().ok());
    let seeds: Vec<u64> = match only {
        Some(n) => vec![n],
        None => (0..cases()).collect(),
    };
    // Per kind of outcome: how many cases, and the first one in full.
    let mut outcomes: BTreeMap<String, (u32, String)> = BTreeMap::new();
    let mut failures = Vec::new();
    // Children that died of a signal: by how and when, and each case.
    let mut signals: BTreeMap<String, u32> = BTreeMap::new();
    let mut signalled = Vec::new();
    let exe = std::env::current_exe().expect("current exe");
    for seed in std::iter::once(None).chain(seeds.into_iter().map(Some)) {
        let dir = work.path().join(format!("case-{}", seed.map_or("clean".into(), |s| s.to_string())));
        std::fs::create_dir_all(&dir).expect("case dir");
        let mut data = original.clone();
        let what = seed.map(|s| damage(&mut data, s)).unwrap_or_default();
        std::fs::write(dir.join("data.mdb"), &data).expect("write the damaged copy");
        let (status, stdout, stderr, took) = run_child(&exe, &dir);
        let outcome = stdout.lines().find_map(|l| l.split_once("fuzz-env-outcome ")).map(|(_, o)| o.to_owned());
        match (&status, &outcome) {
            (Some(s), Some(o)) if s.success() => {
                if seed.is_none() {
                    assert!(o.starts_with("open=ok ops=ok:") && !o.contains(','), "the undamaged copy must read cleanly: {o}");
                }
                let class = o.split(" detail=").next().unwrap_or(o).split(" errors=").next().unwrap_or(o);
                // Counts of errors per kind, without the per-case numbers.
                let class: String = class.split(',').map(|k| k.split(':').next().unwrap_or(k)).collect::<Vec<_>>().join(",");
                let entry = outcomes.entry(class).or_insert_with(|| (0, format!("case {seed:?} ({what:?}): {o}")));
                entry.0 += 1;
            }
            (Some(_) | None, Some(_) | None) => {
                use std::os::unix::process::ExitStatusExt;
                if let Ok(keep) = std::env::var("SHOAL_FUZZ_ENV_KEEP") {
                    let to = Path::new(&keep).join(dir.file_name().unwrap_or_default());
                    let _ = std::fs::create_dir_all(&to);
                    let _ = std::fs::copy(dir.join("data.mdb"), to.join("data.mdb"));
                }
                let during = stderr.lines().find_map(|l| l.strip_prefix("fuzz-env-crash during ")).unwrap_or("?");
                match status.and_then(|s| s.signal()) {
                    // Tallied by phase as well, for the report below.
                    Some(sig) if seed.is_some() => {
                        let how = status.as_ref().map_or_else(String::new, describe);
                        *signals.entry(format!("{how} during {during}")).or_default() += 1;
                        signalled.push(format!("case {seed:?} ({what:?}): the child {how} during {during}"));
                        let _ = sig;
                    }
                    Some(_) | None => {
                        let how = match &status {
                            None => format!("hung (killed after {CHILD_LIMIT:?}) during {during}"),
                            Some(s) => describe(s),
                        };
                        failures.push(format!(
                            "case {seed:?} ({what:?}): the child {how} after {took:?}\n--- stdout\n{stdout}\n--- stderr (tail)\n{}",
                            tail(&stderr, 2000)
                        ));
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    // Less the undamaged copy, which is always run first.
    let ran: u32 = outcomes.values().map(|(n, _)| n).sum::<u32>() + signals.values().sum::<u32>() + failures.len() as u32 - 1;
    eprintln!("fuzz_corrupted_environments: {ran} damaged copies and the clean one in {:?}", t0.elapsed());
    for (class, (n, example)) in &outcomes {
        eprintln!("  {n:5} {class}\n        e.g. {example}");
    }
    for (class, n) in &signals {
        eprintln!("  {n:5} {class} (inside liblmdb)");
    }
    for case in &signalled {
        eprintln!("        {case}");
    }
    assert!(failures.is_empty(), "{} damaged environments panicked or hung the reader:\n{}", failures.len(), failures.join("\n\n"));
    assert!(signalled.is_empty(), "{} damaged environments crashed the reader:\n{}", signalled.len(), signalled.join("\n"));
}

/// The damage the fuzzer found crashing or hanging unpatched liblmdb, made
/// on purpose (third_party/README.md): each kind on every leaf page, and
/// on every fifth one (so that the index opens and reads and writes meet
/// it later). Each copy must give `Corrupt` errors, in a child that exits
/// normally.
#[test]
fn damaged_page_and_node_headers_are_corrupt_errors_not_crashes() {
    const PAGE: usize = 4096;
    const HEADER: usize = 16;
    let (work, original) = clean_copy();
    let u16_at = |page: &[u8], at: usize| u16::from_le_bytes([page[at], page[at + 1]]);
    // Each kind of damage, applied to one leaf page.
    type Damage = fn(&mut [u8]);
    let kinds: [(&str, Damage); 5] = [
        // The node flag that sends liblmdb to a sub-cursor our tables lack.
        ("F_DUPDATA on every node", |page| {
            let lower = usize::from(u16::from_le_bytes([page[12], page[13]]));
            for i in 0..(lower.saturating_sub(HEADER) / 2) {
                let off = usize::from(u16::from_le_bytes([page[HEADER + 2 * i], page[HEADER + 2 * i + 1]]));
                if off + 6 <= PAGE {
                    page[off + 4] |= 0x04;
                }
            }
        }),
        // NUMKEYS wraps: the binary search used to never end.
        ("lower below the header", |page| page[12..14].copy_from_slice(&8u16.to_le_bytes())),
        ("the first node's offset past the page", |page| page[HEADER..HEADER + 2].copy_from_slice(&0xfff0u16.to_le_bytes())),
        // An in-memory flag on disk: liblmdb took the page for one this
        // transaction had copied and wrote into the read-only map.
        ("P_DIRTY in the header", |page| page[10] |= 0x10),
        // What copy-on-write copied into a page-sized buffer.
        ("lower and upper past the page", |page| {
            page[12..14].copy_from_slice(&0x8000u16.to_le_bytes());
            page[14..16].copy_from_slice(&0xfff0u16.to_le_bytes());
        }),
    ];
    let leaves: Vec<usize> = (2..original.len() / PAGE)
        .filter(|&p| u16_at(&original[p * PAGE..], 10) == 0x02 && u16_at(&original[p * PAGE..], 12) as usize > HEADER)
        .collect();
    assert!(leaves.len() > 20, "the index has leaf pages to damage: {}", leaves.len());
    let exe = std::env::current_exe().expect("current exe");
    let mut failures = Vec::new();
    for (name, hurt) in kinds {
        for every in [1, 5] {
            let mut data = original.clone();
            for &p in leaves.iter().step_by(every) {
                hurt(&mut data[p * PAGE..(p + 1) * PAGE]);
            }
            let dir = work.path().join(format!("{}-{every}", name.replace(' ', "-")));
            let case = format!("{name}, every {every} leaf page(s) of {}", leaves.len());
            failures.extend(run_damaged(&exe, &dir, &data, &case, true).0);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Runs a child over `data` in `dir`; returns what is wrong (a crash, a
/// hang, damage reported as a storage error, and with `require_corrupt`
/// no `Corrupt` error) and whether it met a `Corrupt` error.
fn run_damaged(exe: &Path, dir: &Path, data: &[u8], case: &str, require_corrupt: bool) -> (Vec<String>, bool) {
    std::fs::create_dir_all(dir).expect("case dir");
    std::fs::write(dir.join("data.mdb"), data).expect("write the damaged copy");
    let (status, stdout, stderr, took) = run_child(exe, dir);
    let outcome = stdout.lines().find_map(|l| l.split_once("fuzz-env-outcome ")).map(|(_, o)| o.to_owned());
    let mut failures = Vec::new();
    let corrupt = outcome.as_deref().is_some_and(|o| o.contains("Corrupt"));
    match (&status, &outcome) {
        (Some(s), Some(o)) if s.success() => {
            eprintln!("{case}: {}", o.split(" errors=").next().unwrap_or(o));
            if require_corrupt && !corrupt {
                failures.push(format!("{case}: no Corrupt error: {o}"));
            }
            if o.contains("Storage") {
                failures.push(format!("{case}: damage reported as a storage error, not Corrupt: {o}"));
            }
        }
        _ => {
            let during = stderr.lines().find_map(|l| l.strip_prefix("fuzz-env-crash during ")).unwrap_or("?");
            let how = status.as_ref().map_or_else(|| format!("hung (killed after {CHILD_LIMIT:?})"), describe);
            failures.push(format!("{case}: the child {how} during {during} after {took:?}\n{}", tail(&stderr, 1000)));
        }
    }
    (failures, corrupt)
}

/// A read transaction takes a value's overflow pages without reading the
/// first one (third_party/README.md): the node's page number and size
/// alone must keep the read inside the file. Each copy points the
/// overflow values of one leaf page (vector and code blocks, link-log
/// values) past the file or at a meta page; the leaf itself stays sound.
/// Some such leaves are free pages (an older copy of a leaf), which no
/// read reaches: every copy must end normally, and those that read the
/// damaged values with a `Corrupt` error.
#[test]
fn overflow_page_numbers_outside_the_data_are_corrupt_errors_not_crashes() {
    const PAGE: usize = 4096;
    const HEADER: usize = 16;
    const BIGDATA: u16 = 0x01;
    let (work, original) = clean_copy();
    let u16_at = |page: &[u8], at: usize| usize::from(u16::from_le_bytes([page[at], page[at + 1]]));
    // Where each overflow value's page number sits in a leaf page.
    let pgno_offsets = |page: &[u8]| -> Vec<usize> {
        if u16_at(page, 10) != 0x02 {
            return Vec::new();
        }
        (0..u16_at(page, 12).saturating_sub(HEADER) / 2)
            .map(|i| u16_at(page, HEADER + 2 * i))
            .filter(|&off| off + 8 <= PAGE && u16_at(page, off + 4) as u16 & BIGDATA != 0)
            .map(|off| off + 8 + u16_at(page, off + 6))
            .filter(|&at| at + 8 <= PAGE)
            .collect()
    };
    let leaves: Vec<(usize, Vec<usize>)> = (2..original.len() / PAGE)
        .map(|p| (p, pgno_offsets(&original[p * PAGE..(p + 1) * PAGE])))
        .filter(|(_, offsets)| !offsets.is_empty())
        .collect();
    assert!(leaves.len() >= 2, "the index has leaves of overflow values: {}", leaves.len());
    let exe = std::env::current_exe().expect("current exe");
    let mut failures = Vec::new();
    for (name, pgno) in [("past the file", 1u64 << 40), ("on a meta page", 1)] {
        let mut corrupt = 0;
        for (p, offsets) in &leaves {
            let mut data = original.clone();
            for at in offsets {
                data[p * PAGE + at..p * PAGE + at + 8].copy_from_slice(&pgno.to_le_bytes());
            }
            let dir = work.path().join(format!("{}-{p}", name.replace(' ', "-")));
            let case = format!("{} overflow value(s) of leaf page {p} {name}", offsets.len());
            let (failed, met) = run_damaged(&exe, &dir, &data, &case, false);
            failures.extend(failed);
            corrupt += usize::from(met);
        }
        // The live vector and code blocks are among them.
        if corrupt < 2 {
            failures.push(format!("{name}: only {corrupt} of {} copies met a Corrupt error", leaves.len()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn run_child(exe: &Path, dir: &Path) -> (Option<std::process::ExitStatus>, String, String, Duration) {
    let t0 = Instant::now();
    let mut child = Command::new(exe)
        .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
        .env(CASE_VAR, dir)
        .env_remove("SHOAL_FUZZ_ENV_CASE_ONLY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child");
    // Drained on threads so a chatty child cannot block on a full pipe.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t0.elapsed() > CHILD_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("waiting for the child: {e}"),
        }
    };
    (status, out.join().unwrap_or_default(), err.join().unwrap_or_default(), t0.elapsed())
}

fn describe(s: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (_, Some(sig)) => format!("was killed by signal {sig} ({})", signal_name(sig)),
        (Some(code), None) => format!("exited with code {code} (a panic or a failed assertion)"),
        (None, None) => "ended somehow".into(),
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        6 => "SIGABRT: an LMDB assertion or a Rust abort",
        7 => "SIGBUS: a page past the end of the file",
        11 => "SIGSEGV: a read outside the map",
        _ => "other",
    }
}

fn tail(s: &str, n: usize) -> &str {
    let start = s.len().saturating_sub(n);
    let start = (start..s.len()).find(|&i| s.is_char_boundary(i)).unwrap_or(s.len());
    &s[start..]
}
