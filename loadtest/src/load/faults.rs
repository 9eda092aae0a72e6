//! Fault hooks: `--fault AT:ACTION[:ARG]`, fired at AT into the measured
//! run: `kill`, `stop`, `cont` or `restart` a process the run started
//! (`--processes`: shard-0.., coordinator), or `run` a shell command (any
//! target). Each becomes an event on the report's timeline saying what
//! happened.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use parking_lot::Mutex;
use serde::Serialize;
use shoal_ops::procs::ProcessCluster;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::schedule::parse_duration;
use super::target::{self, Signal};

/// What a fault does.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Action {
    Kill(String),
    Stop(String),
    Cont(String),
    Restart(String),
    Run(String),
}

impl Action {
    /// "kill shard-1", "run: sleep 1".
    pub(crate) fn label(&self) -> String {
        match self {
            Action::Kill(p) => format!("kill {p}"),
            Action::Stop(p) => format!("stop {p}"),
            Action::Cont(p) => format!("cont {p}"),
            Action::Restart(p) => format!("restart {p}"),
            Action::Run(c) => format!("run: {c}"),
        }
    }

    fn process(&self) -> Option<(&str, Signal)> {
        match self {
            Action::Kill(p) => Some((p, Signal::Kill)),
            Action::Stop(p) => Some((p, Signal::Stop)),
            Action::Cont(p) => Some((p, Signal::Cont)),
            Action::Restart(p) => Some((p, Signal::Restart)),
            Action::Run(_) => None,
        }
    }
}

/// One `--fault`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Fault {
    /// Seconds into the measured run.
    pub(crate) at_s: f64,
    pub(crate) action: Action,
}

/// Parses `30s:kill:shard-1`, `40s:stop:shard-2`, `20s:run:COMMAND` (the
/// command may hold colons).
pub(crate) fn parse_fault(s: &str) -> Result<Fault, String> {
    let mut parts = s.splitn(3, ':');
    let (Some(at), Some(action)) = (parts.next(), parts.next()) else {
        return Err(format!("expected AT:ACTION:ARG (e.g. 30s:kill:shard-1, 20s:run:COMMAND), got {s:?}"));
    };
    let at_s = parse_duration(at)?.as_secs_f64();
    let arg = parts
        .next()
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| format!("{s:?}: {action} needs a process or a command after a colon"))?;
    let arg = arg.to_owned();
    let action = match action.trim() {
        "kill" => Action::Kill(arg),
        "stop" => Action::Stop(arg),
        "cont" | "resume" => Action::Cont(arg),
        "restart" => Action::Restart(arg),
        "run" => Action::Run(arg),
        other => return Err(format!("{s:?}: unknown action {other:?} (kill, stop, cont, restart, run)")),
    };
    Ok(Fault { at_s, action })
}

/// Refuses process actions without started processes, and unknown names.
pub(crate) fn check(faults: &[Fault], processes: Option<&[String]>) -> Result<()> {
    for f in faults {
        let Some((name, _)) = f.action.process() else { continue };
        match processes {
            None => bail!(
                "--fault {}: killing, stopping and restarting need a cluster of --processes; other targets take run:COMMAND",
                f.action.label()
            ),
            Some(ids) if !ids.iter().any(|i| i == name) => {
                bail!("--fault {}: no process {name:?} (there are {})", f.action.label(), ids.join(", "))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// What happened when a fault fired.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(crate) struct FaultEvent {
    /// When it was due and when it fired, in seconds into the run.
    pub(crate) at_s: f64,
    pub(crate) fired_s: Option<f64>,
    /// When it was done (a restart serves again, a command exits).
    pub(crate) done_s: Option<f64>,
    pub(crate) label: String,
    pub(crate) ok: bool,
    /// What happened: the signal and exit status, the command's exit and
    /// the tail of its output, the error, or that the run ended first.
    pub(crate) outcome: String,
}

/// Fires the faults of a run.
pub(crate) struct FaultRunner {
    events: Arc<Mutex<Vec<FaultEvent>>>,
    task: JoinHandle<()>,
    commands: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

/// How long a `run:` command may take beyond the planned end of the run.
const RUN_GRACE: Duration = Duration::from_secs(10);
/// ... or in all, when the run has no planned end.
const RUN_LIMIT: Duration = Duration::from_secs(120);

impl FaultRunner {
    /// Starts firing `faults` at their times after `start`; a `run:` command
    /// is killed if still running `RUN_GRACE` after `end`.
    pub(crate) fn start(
        mut faults: Vec<Fault>,
        start: Instant,
        end: Option<Instant>,
        procs: Option<Arc<Mutex<ProcessCluster>>>,
    ) -> FaultRunner {
        faults.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        let events: Arc<Mutex<Vec<FaultEvent>>> = Arc::new(Mutex::new(
            faults
                .iter()
                .map(|f| FaultEvent {
                    at_s: f.at_s,
                    fired_s: None,
                    done_s: None,
                    label: f.action.label(),
                    ok: false,
                    outcome: "not fired: the run ended first".into(),
                })
                .collect(),
        ));
        let commands = Arc::new(Mutex::new(Vec::new()));
        let (ev, cmds) = (events.clone(), commands.clone());
        let secs = move |t: Instant| (t.saturating_duration_since(start).as_secs_f64() * 1000.0).round() / 1000.0;
        let task = tokio::spawn(async move {
            for (i, f) in faults.into_iter().enumerate() {
                tokio::time::sleep_until(start + Duration::from_secs_f64(f.at_s)).await;
                let fired = Instant::now();
                ev.lock()[i].fired_s = Some(secs(fired));
                eprintln!("fault at {:.1}s: {}", secs(fired), f.action.label());
                match (&f.action, f.action.process(), &procs) {
                    (Action::Run(cmd), _, _) => {
                        let limit = end.map_or(fired + RUN_LIMIT, |e| e.max(fired) + RUN_GRACE);
                        let (cmd, ev) = (cmd.clone(), ev.clone());
                        let limit_std = std::time::Instant::now() + limit.saturating_duration_since(Instant::now());
                        let h = tokio::task::spawn_blocking(move || {
                            let (ok, outcome) = run_command(&cmd, limit_std);
                            let mut e = ev.lock();
                            e[i].done_s = Some(secs(Instant::now()));
                            e[i].ok = ok;
                            e[i].outcome = outcome;
                        });
                        cmds.lock().push(h);
                    }
                    (_, Some((name, sig)), Some(p)) => {
                        let (p, name) = (p.clone(), name.to_owned());
                        let r = tokio::task::spawn_blocking(move || target::signal(&p, &name, sig)).await;
                        let mut e = ev.lock();
                        e[i].done_s = Some(secs(Instant::now()));
                        (e[i].ok, e[i].outcome) = match r {
                            Ok(Ok(s)) => (true, s),
                            Ok(Err(err)) => (false, format!("failed: {err:#}")),
                            Err(err) => (false, format!("failed: {err}")),
                        };
                    }
                    (_, _, _) => {
                        let mut e = ev.lock();
                        e[i].outcome = "failed: no processes to signal".into();
                    }
                }
            }
        });
        FaultRunner { events, task, commands }
    }

    /// Stops firing (faults not reached stay "not fired"), waits for running
    /// commands (each bounded by its own limit) and returns the events.
    pub(crate) async fn finish(self) -> Vec<FaultEvent> {
        self.task.abort();
        let _ = self.task.await;
        let cmds: Vec<JoinHandle<()>> = std::mem::take(&mut *self.commands.lock());
        for c in cmds {
            let _ = c.await;
        }
        self.events.lock().clone()
    }
}

/// Runs `sh -c cmd` until it exits or `limit`; (exit 0, what it printed).
fn run_command(cmd: &str, limit: std::time::Instant) -> (bool, String) {
    use std::os::unix::process::CommandExt;
    // Its own process group, so that a kill reaches what it started too
    // (and nothing holds its pipes open after).
    let child =
        Command::new("sh").arg("-c").arg(cmd).process_group(0).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return (false, format!("failed to start: {e}")),
    };
    // Drain both pipes so the command never blocks on a full one.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = Vec::new();
            let _ = r.read_to_end(&mut s);
            s
        })
    };
    let out = child.stdout.take().map(|o| drain(Box::new(o)));
    let err = child.stderr.take().map(|e| drain(Box::new(e)));
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) if std::time::Instant::now() >= limit => {
                // SAFETY: kill has no memory effects; the group is the child's own.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                break Err("killed: still running at the end of the run");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break Err("lost track of the command"),
        }
    };
    let mut text = Vec::new();
    for h in [out, err].into_iter().flatten() {
        text.extend(h.join().unwrap_or_default());
    }
    let text = String::from_utf8_lossy(&text);
    let text = text.trim();
    let tail: String = text.chars().rev().take(300).collect::<Vec<_>>().into_iter().rev().collect();
    match status {
        Ok(s) => (s.success(), if tail.is_empty() { format!("{s}") } else { format!("{s}; output: {tail}") }),
        Err(why) => (false, format!("{why}; output: {tail}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_specs_parse() {
        assert_eq!(parse_fault("30s:kill:shard-1"), Ok(Fault { at_s: 30.0, action: Action::Kill("shard-1".into()) }));
        assert_eq!(parse_fault("40s:stop:shard-2"), Ok(Fault { at_s: 40.0, action: Action::Stop("shard-2".into()) }));
        assert_eq!(parse_fault("50s:cont:shard-2"), Ok(Fault { at_s: 50.0, action: Action::Cont("shard-2".into()) }));
        assert_eq!(parse_fault("1m:restart:coordinator"), Ok(Fault { at_s: 60.0, action: Action::Restart("coordinator".into()) }));
        assert_eq!(parse_fault("2.5:run:echo a:b"), Ok(Fault { at_s: 2.5, action: Action::Run("echo a:b".into()) }));
        assert!(parse_fault("30s").is_err());
        assert!(parse_fault("30s:kill").is_err());
        assert!(parse_fault("30s:kill:").is_err());
        assert!(parse_fault("soon:kill:shard-1").is_err());
        assert!(parse_fault("30s:explode:shard-1").is_err());
    }

    #[test]
    fn process_faults_need_started_processes_with_that_name() {
        let kill = vec![parse_fault("1s:kill:shard-1").unwrap()];
        let run = vec![parse_fault("1s:run:true").unwrap()];
        let ids = vec!["shard-0".to_owned(), "shard-1".to_owned(), "coordinator".to_owned()];
        assert!(check(&kill, Some(&ids)).is_ok());
        assert!(check(&kill, None).is_err());
        assert!(check(&kill, Some(&ids[..1])).is_err());
        assert!(check(&run, None).is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commands_fire_on_time_and_report_what_happened() {
        let start = Instant::now();
        let faults = vec![
            parse_fault("0.3s:run:echo fired; exit 3").unwrap(),
            parse_fault("0.1s:run:echo hello").unwrap(),
            parse_fault("5s:run:true").unwrap(),
        ];
        let r = FaultRunner::start(faults, start, Some(start + Duration::from_millis(500)), None);
        tokio::time::sleep(Duration::from_millis(800)).await;
        let ev = r.finish().await;
        assert_eq!(ev.len(), 3);
        assert_eq!(ev[0].label, "run: echo hello");
        assert!(ev[0].ok && ev[0].outcome.contains("hello"), "{ev:?}");
        let fired = ev[0].fired_s.unwrap();
        assert!((0.1..0.3).contains(&fired), "{ev:?}");
        assert!(!ev[1].ok && ev[1].outcome.contains("exit status: 3") && ev[1].outcome.contains("fired"), "{ev:?}");
        assert!(ev[1].fired_s.unwrap() >= 0.3);
        assert_eq!((ev[2].fired_s, ev[2].ok), (None, false));
        assert!(ev[2].outcome.contains("not fired"));
    }

    #[test]
    fn a_command_past_its_limit_is_killed() {
        let t = std::time::Instant::now();
        let (ok, out) = run_command("echo started; sleep 30", std::time::Instant::now() + Duration::from_millis(200));
        assert!(!ok && out.contains("killed") && out.contains("started"), "{out}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
