//! How steady the machine's CPUs are: one thread pinned to each CPU spins
//! on a fixed piece of work and counts how many pieces it finishes in each
//! short window. On a quiet machine of its own every window counts about
//! the same; on a shared VM the host can take most of every vCPU at once
//! for tens of milliseconds without the guest seeing a gap or steal time
//! (docs/loadtest.md, "The host's slow episodes"). A tail latency measured
//! on such a host holds those episodes, whatever the cluster does, so this
//! runs beside (before and after) the tail measurements.
//!
//! Nothing else should run meanwhile: it measures the CPUs it keeps busy.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// How long to spin, seconds.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Window length, milliseconds.
    #[arg(long, default_value_t = 10)]
    window_ms: u64,
    /// A window is slow when the CPUs' mean rate falls below this share of
    /// their median.
    #[arg(long, default_value_t = 0.5)]
    slow_below: f64,
    /// Spin only this long at the start of each window and sleep the rest,
    /// counting work per CPU time the thread got: light enough to run
    /// beside a benchmark, and blind to the guest's own scheduling (a
    /// thread the guest preempts gets no CPU time meanwhile), so a slow
    /// window is the host's doing. 0: spin the whole window.
    #[arg(long, default_value_t = 0)]
    busy_ms: u64,
    /// Run the spinning threads at real-time priority (`SCHED_FIFO`, needs
    /// root or `CAP_SYS_NICE`): with `--busy-ms` beside a busy cluster,
    /// the probe then gets its millisecond on time instead of waiting for
    /// the cluster's threads, which would leave the windows it most needs
    /// unmeasured. It delays those threads by up to `--busy-ms`.
    #[arg(long)]
    realtime: bool,
    /// Write the report here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// What [`analyze`] found.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Report {
    /// When the first window began, ms since the Unix epoch (0 from
    /// [`analyze`] alone): to line the episodes up with traces.
    pub(crate) started_unix_ms: u64,
    pub(crate) cpus: usize,
    pub(crate) window_ms: u64,
    pub(crate) windows: usize,
    pub(crate) slow_below: f64,
    /// Each CPU's median pieces of work per window.
    pub(crate) medians: Vec<u64>,
    /// Windows (over all CPUs) where the light probe was preempted by the
    /// guest and measured nothing; counted at the CPU's median.
    pub(crate) unmeasured: usize,
    /// The CPUs' mean rate as a share of their medians, over the windows:
    /// 1st, 5th and 50th percentile.
    pub(crate) capacity_p1: f64,
    pub(crate) capacity_p5: f64,
    pub(crate) capacity_p50: f64,
    /// Share of the windows that were slow.
    pub(crate) slow_share: f64,
    /// Runs of consecutive slow windows, by start.
    pub(crate) episodes: Vec<Episode>,
    /// Median seconds from one episode's start to the next's.
    pub(crate) median_interval_s: Option<f64>,
    /// Median and longest episode, ms.
    pub(crate) median_episode_ms: Option<f64>,
    pub(crate) max_episode_ms: Option<f64>,
}

/// A run of slow windows.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Episode {
    /// Seconds after the first window.
    pub(crate) at_s: f64,
    pub(crate) ms: f64,
    /// The lowest capacity in it.
    pub(crate) min_capacity: f64,
}

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    anyhow::ensure!(a.seconds > 0.0 && a.window_ms > 0, "--seconds and --window-ms must be positive");
    anyhow::ensure!(a.slow_below > 0.0 && a.slow_below < 1.0, "--slow-below must be between 0 and 1");
    anyhow::ensure!(a.busy_ms < a.window_ms, "--busy-ms must be shorter than --window-ms");
    let allowed = allowed_cpus();
    let window = Duration::from_millis(a.window_ms);
    let windows = ((a.seconds * 1000.0) / a.window_ms as f64).ceil() as usize;
    // Every thread starts its windows at the same instant, so window i is
    // the same stretch of time on every CPU.
    let start = Instant::now() + Duration::from_millis(50);
    let busy = (a.busy_ms > 0).then(|| Duration::from_millis(a.busy_ms));
    let realtime = a.realtime;
    let counts: Vec<Vec<u64>> = std::thread::scope(|s| {
        let spinners: Vec<_> = allowed
            .iter()
            .map(|&cpu| {
                s.spawn(move || {
                    pin(cpu);
                    if realtime && let Err(e) = fifo() {
                        eprintln!("host-noise: no real-time priority ({e}); measuring without it");
                    }
                    spin(start, window, windows, busy)
                })
            })
            .collect();
        spinners.into_iter().map(|t| t.join().unwrap_or_default()).collect()
    });
    let mut r = analyze(&counts, a.window_ms, a.slow_below);
    let unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    r.started_unix_ms = unix_ms.saturating_sub(start.elapsed().as_millis()) as u64;
    println!(
        "{} CPUs, {} windows of {} ms ({} unmeasured): capacity p1 {:.2} p5 {:.2} p50 {:.2}; {:.1}% of windows below {:.2}; {} episodes, median {} ms, longest {} ms, one every {} s",
        r.cpus,
        r.windows,
        r.window_ms,
        r.unmeasured,
        r.capacity_p1,
        r.capacity_p5,
        r.capacity_p50,
        r.slow_share * 100.0,
        r.slow_below,
        r.episodes.len(),
        r.median_episode_ms.map_or("-".into(), |v| format!("{v:.0}")),
        r.max_episode_ms.map_or("-".into(), |v| format!("{v:.0}")),
        r.median_interval_s.map_or("-".into(), |v| format!("{v:.2}")),
    );
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&r)?)?;
    }
    Ok(())
}

/// The CPUs this process may run on (a container's cpuset need not start
/// at 0); every CPU the machine reports if the kernel will not say.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, which
    // sched_getaffinity fills within the size it is given; CPU_ISSET reads
    // inside it for ids below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect();
            if !cpus.is_empty() {
                return cpus;
            }
        }
    }
    (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
}

/// Pins the calling thread to `cpu` (best effort: without it the counts
/// still show the machine, only less sharply per CPU).
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // inside it for cpu < CPU_SETSIZE, checked first.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Moves the calling thread to `SCHED_FIFO` at the lowest priority.
fn fifo() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: `param` is a valid sched_param for the call to read.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Pieces of work finished in each of `windows` windows from `start`;
/// with `busy`, spinning only that long in each window, pieces per
/// millisecond of the thread's CPU time.
fn spin(start: Instant, window: Duration, windows: usize, busy: Option<Duration>) -> Vec<u64> {
    while Instant::now() < start {
        std::hint::spin_loop();
    }
    let mut counts = vec![0u64; windows];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for (i, count) in counts.iter_mut().enumerate() {
        let window_start = start + window * i as u32;
        let end = window_start + window;
        let spin_end = busy.map_or(end, |b| window_start + b);
        let cpu_before = thread_cpu_ns();
        let mut pieces = 0u64;
        while Instant::now() < spin_end {
            // A few hundred nanoseconds of work per clock read.
            for _ in 0..256 {
                x = black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407));
            }
            pieces += 1;
        }
        *count = match busy {
            None => pieces,
            Some(b) => {
                let cpu_ns = thread_cpu_ns().saturating_sub(cpu_before);
                // Preempted by the guest for most of it: too little CPU
                // time to say how fast the CPU was.
                if cpu_ns < b.as_nanos() as u64 / 4 { UNMEASURED } else { pieces * 1_000_000 / cpu_ns }
            }
        };
        if busy.is_some() {
            std::thread::sleep(end.saturating_duration_since(Instant::now()));
        }
    }
    counts
}

/// A window in which the light probe got too little CPU time to count.
const UNMEASURED: u64 = u64::MAX;

/// This thread's CPU time, ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Reads per-CPU window counts (`counts[cpu][window]`, every CPU the same
/// length) as the module says.
pub(crate) fn analyze(counts: &[Vec<u64>], window_ms: u64, slow_below: f64) -> Report {
    let windows = counts.iter().map(Vec::len).min().unwrap_or(0);
    let medians: Vec<u64> = counts.iter().map(|c| median_u64(&c[..windows])).collect();
    let unmeasured = counts.iter().map(|c| c[..windows].iter().filter(|&&n| n == UNMEASURED).count()).sum();
    let capacity: Vec<f64> = (0..windows)
        .map(|w| {
            let share = |n: u64, m: u64| if n == UNMEASURED { 1.0 } else { n as f64 / m.max(1) as f64 };
            let shares = counts.iter().zip(&medians).map(|(c, &m)| share(c[w], m));
            shares.sum::<f64>() / counts.len().max(1) as f64
        })
        .collect();
    let mut sorted = capacity.clone();
    sorted.sort_by(f64::total_cmp);
    let pct = |p: f64| if sorted.is_empty() { 0.0 } else { sorted[((sorted.len() - 1) as f64 * p).round() as usize] };
    let mut episodes = Vec::new();
    let mut w = 0;
    while w < windows {
        if capacity[w] >= slow_below {
            w += 1;
            continue;
        }
        let first = w;
        let mut low = f64::INFINITY;
        while w < windows && capacity[w] < slow_below {
            low = low.min(capacity[w]);
            w += 1;
        }
        episodes.push(Episode {
            at_s: (first as u64 * window_ms) as f64 / 1000.0,
            ms: ((w - first) as u64 * window_ms) as f64,
            min_capacity: (low * 100.0).round() / 100.0,
        });
    }
    let slow = capacity.iter().filter(|&&c| c < slow_below).count();
    let intervals: Vec<f64> = episodes.windows(2).map(|p| p[1].at_s - p[0].at_s).collect();
    let lengths: Vec<f64> = episodes.iter().map(|e| e.ms).collect();
    Report {
        started_unix_ms: 0,
        cpus: counts.len(),
        window_ms,
        windows,
        slow_below,
        medians,
        unmeasured,
        capacity_p1: round2(pct(0.01)),
        capacity_p5: round2(pct(0.05)),
        capacity_p50: round2(pct(0.5)),
        slow_share: if windows == 0 { 0.0 } else { slow as f64 / windows as f64 },
        median_interval_s: median_f64(&intervals),
        median_episode_ms: median_f64(&lengths),
        max_episode_ms: lengths.iter().copied().reduce(f64::max),
        episodes,
    }
}

/// Of the measured windows.
fn median_u64(v: &[u64]) -> u64 {
    let mut s: Vec<u64> = v.iter().copied().filter(|&n| n != UNMEASURED).collect();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

fn median_f64(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied()
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two CPUs slowed together for 3 windows, then 2: two episodes; a dip
    /// on one CPU alone stays above half the machine.
    #[test]
    fn episodes_are_runs_of_windows_where_the_machine_slowed() {
        let mut a = vec![100u64; 40];
        let mut b = vec![100u64; 40];
        for w in [5, 6, 7, 25, 26] {
            a[w] = 10;
            b[w] = 20;
        }
        b[15] = 0; // one CPU alone: capacity 0.5, not below 0.5
        a[30] = UNMEASURED;
        b[30] = UNMEASURED;
        let r = analyze(&[a, b], 10, 0.5);
        assert_eq!((r.medians.clone(), r.unmeasured), (vec![100, 100], 2));
        assert_eq!(
            r.episodes,
            vec![Episode { at_s: 0.05, ms: 30.0, min_capacity: 0.15 }, Episode { at_s: 0.25, ms: 20.0, min_capacity: 0.15 }]
        );
        assert_eq!(r.median_interval_s, Some(0.2));
        assert_eq!((r.median_episode_ms, r.max_episode_ms), (Some(30.0), Some(30.0)));
        assert!((r.slow_share - 5.0 / 40.0).abs() < 1e-12);
        assert_eq!((r.capacity_p50, r.capacity_p1), (1.0, 0.15));
    }

    /// The probe spins on CPUs this process may use: as many as the
    /// affinity mask holds, each one in it.
    #[test]
    fn it_spins_on_the_cpus_it_is_allowed() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let count = cpus.len();
        // SAFETY: as in allowed_cpus.
        let listed = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
            libc::CPU_COUNT(&set) as usize
        };
        assert_eq!(count, listed);
    }

    /// A short real run, spinning whole windows and a part of each: one
    /// count per window. A thread the machine preempts for a whole
    /// window counts 0 there (the test threads share the CPUs), so only
    /// the light probe's counts are checked: a window it got enough CPU
    /// time in did work, any other is marked unmeasured.
    #[test]
    fn a_short_spin_counts_every_window() {
        let c = spin(Instant::now(), Duration::from_millis(2), 5, None);
        assert_eq!(c.len(), 5);
        let c = spin(Instant::now(), Duration::from_millis(4), 5, Some(Duration::from_millis(2)));
        assert_eq!(c.len(), 5);
        assert!(c.iter().all(|&n| n > 0), "{c:?}");
    }
}
