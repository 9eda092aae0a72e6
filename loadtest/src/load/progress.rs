//! The live progress bar: time through the run and, per series, the last
//! complete second's rate and p99 with the phase's counts. Drawn only on a
//! terminal.

use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::stats::Recorder;

pub(crate) struct Progress {
    bar: ProgressBar,
    phase: Arc<Mutex<String>>,
    task: JoinHandle<()>,
}

impl Progress {
    pub(crate) fn start(enabled: bool, planned: Option<Duration>, start: Instant, recorders: Arc<Mutex<Vec<Arc<Recorder>>>>) -> Progress {
        let target = if enabled { ProgressDrawTarget::stderr_with_hz(4) } else { ProgressDrawTarget::hidden() };
        let bar = match planned {
            Some(d) => {
                let b = ProgressBar::with_draw_target(Some(d.as_secs().max(1)), target);
                b.set_style(
                    ProgressStyle::with_template("{elapsed_precise} [{bar:24}] {pos}/{len}s {msg}")
                        .expect("constant template")
                        .progress_chars("=> "),
                );
                b
            }
            None => {
                let b = ProgressBar::with_draw_target(None, target);
                b.set_style(ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}").expect("constant template"));
                b
            }
        };
        let phase = Arc::new(Mutex::new(String::new()));
        let (b, p) = (bar.clone(), phase.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let now = Instant::now();
                b.set_position(now.saturating_duration_since(start).as_secs());
                let mut msg = p.lock().clone();
                for r in recorders.lock().iter() {
                    let l = r.live(now);
                    let unit = if r.series == "ingest" { "vec/s" } else { "/s" };
                    msg += &format!(" | {} {}{unit} p99 {:.1}ms ok {} err {}", r.series, l.items_per_s, l.p99_ms, l.ok, l.errors);
                }
                b.set_message(msg);
                b.tick();
            }
        });
        Progress { bar, phase, task }
    }

    pub(crate) fn set_phase(&self, name: &str) {
        *self.phase.lock() = name.to_owned();
    }

    pub(crate) fn finish(self) {
        self.task.abort();
        self.bar.finish_and_clear();
    }
}
