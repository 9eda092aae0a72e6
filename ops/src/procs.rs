//! A cluster of separate processes on loopback (shard nodes and a
//! coordinator), for the tests and benchmarks that must kill, stop and
//! measure real processes: SIGKILL, SIGSTOP, their CPU time, memory and
//! open files as the kernel counts them.
//!
//! What to run comes from a [`Launcher`]: the release binaries (benchmarks,
//! old against new), or the calling program re-executed in a role (tests,
//! which then need no other build step).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How to start the two kinds of process.
#[derive(Clone, Debug)]
pub enum Launcher {
    /// `dir/shoal-shard-node` and `dir/shoal-coordinator`.
    Binaries(PathBuf),
    /// `program shard-node ...` and `program coordinator ...`: a program
    /// that runs the roles itself (see `ops/tests/processes`).
    Roles(PathBuf),
}

impl Launcher {
    fn command(&self, role: Role) -> Command {
        match self {
            Launcher::Binaries(dir) => Command::new(dir.join(role.binary())),
            Launcher::Roles(program) => {
                let mut c = Command::new(program);
                c.arg(role.name());
                c
            }
        }
    }
}

/// Which process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    ShardNode,
    Coordinator,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::ShardNode => "shard-node",
            Role::Coordinator => "coordinator",
        }
    }

    fn binary(self) -> &'static str {
        match self {
            Role::ShardNode => "shoal-shard-node",
            Role::Coordinator => "shoal-coordinator",
        }
    }

    /// What the process prints once it serves, before its address.
    fn ready_marker(self) -> &'static str {
        " listening on "
    }
}

/// One running process and what the kernel says about it.
pub struct Proc {
    pub role: Role,
    pub id: String,
    pub addr: SocketAddr,
    pid: i32,
    /// Behind a lock so that a test can kill a process through a shared
    /// reference while it uses the others.
    child: Mutex<Child>,
    /// stderr goes here (the logs), for a test to print when it fails.
    pub log: PathBuf,
    /// Everything that started this process, for a restart.
    spec: Spec,
}

#[derive(Clone)]
struct Spec {
    launcher: Launcher,
    args: Vec<String>,
    env: Vec<(String, String)>,
    open_files: Option<u64>,
}

impl Proc {
    /// Starts `role` with `args` and `env`, waits until it prints its
    /// address. `open_files` sets its RLIMIT_NOFILE (soft and hard).
    fn start(role: Role, id: &str, spec: Spec, log: PathBuf) -> anyhow::Result<Proc> {
        let mut cmd = spec.launcher.command(role);
        cmd.args(&spec.args).envs(spec.env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null()).stdout(Stdio::piped());
        let log_file = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        cmd.stderr(log_file);
        if let Some(n) = spec.open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe, the only call made
            // between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit { rlim_cur: n as libc::rlim_t, rlim_max: n as libc::rlim_t };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().with_context(|| format!("starting {} {id}", role.name()))?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, rx) = mpsc::channel();
        // Keep draining stdout so the process never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok(line) => {
                    if let Some((_, rest)) = line.split_once(role.ready_marker()) {
                        let a = rest.split_whitespace().next().unwrap_or_default();
                        break a.parse::<SocketAddr>().with_context(|| format!("address in {line:?}"))?;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait()?;
                    bail!("{} {id} exited ({status}) before serving; log:\n{}", role.name(), tail(&log));
                }
            }
            if let Some(status) = child.try_wait()? {
                bail!("{} {id} exited ({status}) before serving; log:\n{}", role.name(), tail(&log));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                bail!("{} {id} did not serve within 60 s; log:\n{}", role.name(), tail(&log));
            }
        };
        let pid = child.id() as i32;
        Ok(Proc { role, id: id.to_owned(), addr, pid, child: Mutex::new(child), log, spec })
    }

    fn child(&self) -> MutexGuard<'_, Child> {
        self.child.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The `--data-dir` it was started with, if any.
    pub fn data_dir(&self) -> Option<PathBuf> {
        let args = &self.spec.args;
        args.iter().position(|a| a == "--data-dir").and_then(|i| args.get(i + 1)).map(PathBuf::from)
    }

    fn signal(&self, sig: libc::c_int) -> anyhow::Result<()> {
        // SAFETY: kill has no memory effects; the pid is our own child's.
        if unsafe { libc::kill(self.pid(), sig) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(())
    }

    /// SIGKILL, and waits for the exit.
    pub fn kill(&self) -> anyhow::Result<ExitStatus> {
        self.signal(libc::SIGKILL)?;
        Ok(self.child().wait()?)
    }

    /// SIGSTOP: alive, holding its sockets, answering nothing.
    pub fn stop(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGSTOP)
    }

    /// SIGCONT after [`Proc::stop`].
    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGCONT)
    }

    /// SIGTERM (graceful shutdown), and waits for the exit.
    pub fn terminate(&self) -> anyhow::Result<ExitStatus> {
        self.signal(libc::SIGTERM)?;
        Ok(self.child().wait()?)
    }

    /// The exit status if it has exited.
    pub fn exited(&self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child().try_wait()?)
    }

    /// Starts it again with the same arguments, on the same address.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        if self.exited()?.is_none() {
            self.kill()?;
        }
        let mut spec = self.spec.clone();
        set_flag(&mut spec.args, "--listen", &self.addr.to_string());
        let mut last = None;
        for _ in 0..50 {
            match Proc::start(self.role, &self.id, spec.clone(), self.log.clone()) {
                Ok(p) => {
                    *self = p;
                    return Ok(());
                }
                Err(e) => {
                    last = Some(e);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("restart failed")))
    }

    /// Starts it again once, as a service manager would right after a
    /// crash: no retry, so a start that is refused fails here.
    pub fn restart_once(&mut self) -> anyhow::Result<()> {
        if self.exited()?.is_none() {
            self.kill()?;
        }
        let mut spec = self.spec.clone();
        set_flag(&mut spec.args, "--listen", &self.addr.to_string());
        *self = Proc::start(self.role, &self.id, spec, self.log.clone())?;
        Ok(())
    }

    /// Starts a second process like this one (same id and settings) on
    /// another port with `data_dir`, its log in `log`: what an operator's
    /// mistake would start.
    pub fn start_twin(&self, data_dir: &Path, log: PathBuf) -> anyhow::Result<Proc> {
        let mut spec = self.spec.clone();
        set_flag(&mut spec.args, "--listen", "127.0.0.1:0");
        set_flag(&mut spec.args, "--data-dir", &data_dir.to_string_lossy());
        Proc::start(self.role, &self.id, spec, log)
    }

    /// Resident memory, from /proc.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        proc_status_kib(self.pid(), "VmRSS:").map(|k| k * 1024)
    }

    /// Resident memory that is the process's own (heap, stacks), without
    /// the pages of mapped files (LMDB's data, which is page cache the
    /// kernel can take back), from /proc.
    pub fn rss_anon_bytes(&self) -> anyhow::Result<u64> {
        proc_status_kib(self.pid(), "RssAnon:").map(|k| k * 1024)
    }

    /// CPU time used so far (user + system), from /proc.
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))?;
        // Fields after the command name, which is in parentheses.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).context("/proc stat format")?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Ok(Duration::from_millis(ticks * 1000 / hz))
    }

    /// Open file descriptors, from /proc.
    pub fn open_files(&self) -> anyhow::Result<usize> {
        Ok(std::fs::read_dir(format!("/proc/{}/fd", self.pid()))?.count())
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let mut child = self.child();
        if let Ok(None) = child.try_wait() {
            // SAFETY: as in `signal`; a stopped process must run to die.
            unsafe { libc::kill(self.pid, libc::SIGCONT) };
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn set_flag(args: &mut Vec<String>, flag: &str, value: &str) {
    match args.iter().position(|a| a == flag) {
        Some(i) if i + 1 < args.len() => args[i + 1] = value.to_owned(),
        _ => {
            args.push(flag.to_owned());
            args.push(value.to_owned());
        }
    }
}

fn proc_status_kib(pid: i32, key: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with(key)).with_context(|| format!("{key} in /proc/{pid}/status"))?;
    Ok(line.split_whitespace().nth(1).context("value")?.parse()?)
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    // A backtrace's frames would push the error itself out of the tail.
    let frame = |l: &str| {
        let t = l.trim_start();
        t.starts_with("at ") || t.split_once(": ").is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
    };
    let lines: Vec<&str> = text.lines().filter(|l| !frame(l)).collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// How to lay out a process cluster.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub launcher: Launcher,
    /// Nodes get `<dir>/shard-<i>` unless `node_dirs` says otherwise; logs
    /// go to `<dir>/<id>.log`; snapshots to `<dir>/snapshots`.
    pub dir: PathBuf,
    pub shard_nodes: usize,
    /// Data directories by node index (e.g. one on a small tmpfs).
    pub node_dirs: HashMap<usize, PathBuf>,
    /// Environment of every shard node (`SHOAL_SHARD_*` settings).
    pub node_env: Vec<(String, String)>,
    /// Environment of one shard node only, by index.
    pub node_env_of: HashMap<usize, Vec<(String, String)>>,
    /// RLIMIT_NOFILE of one shard node, by index.
    pub node_open_files: HashMap<usize, u64>,
    /// Environment of the coordinator (`SHOAL_COORD_*` settings).
    pub coordinator_env: Vec<(String, String)>,
    /// Coordinators to start (at least one).
    pub coordinators: usize,
    /// etcd endpoint and key prefix: nodes register there and
    /// coordinators read membership and placement from it (instead of the
    /// coordinator being given the nodes' addresses).
    pub etcd: Option<(String, String)>,
    /// TLS to an `https://` etcd (`--etcd-ca`, `--etcd-cert`, `--etcd-key`
    /// of every process).
    pub etcd_tls: shoal_control::config::EtcdTls,
    /// Coordinator `j` listens on this port plus `j` (default: any free
    /// port).
    pub first_coordinator_port: Option<u16>,
}

impl ClusterSpec {
    pub fn new(launcher: Launcher, dir: impl Into<PathBuf>, shard_nodes: usize) -> Self {
        ClusterSpec {
            launcher,
            dir: dir.into(),
            shard_nodes,
            node_dirs: HashMap::new(),
            node_env: Vec::new(),
            node_env_of: HashMap::new(),
            node_open_files: HashMap::new(),
            coordinator_env: Vec::new(),
            coordinators: 1,
            etcd: None,
            etcd_tls: Default::default(),
            first_coordinator_port: None,
        }
    }

    fn etcd_args(&self) -> Vec<String> {
        let Some((endpoint, prefix)) = &self.etcd else { return Vec::new() };
        let mut args = vec!["--etcd".into(), endpoint.clone(), "--etcd-prefix".into(), prefix.clone()];
        let tls = &self.etcd_tls;
        for (flag, file) in [("--etcd-ca", &tls.ca_file), ("--etcd-cert", &tls.cert_file), ("--etcd-key", &tls.key_file)] {
            if let Some(f) = file {
                args.extend([flag.to_owned(), f.to_string_lossy().into_owned()]);
            }
        }
        args
    }
}

/// Shard nodes and a coordinator, each its own process, on loopback.
pub struct ProcessCluster {
    pub nodes: Vec<Proc>,
    pub coordinator: Proc,
    /// Coordinators after the first (`ClusterSpec::coordinators`), named
    /// `coordinator-1`, `coordinator-2`, ...
    pub more_coordinators: Vec<Proc>,
}

impl ProcessCluster {
    pub fn start(spec: &ClusterSpec) -> anyhow::Result<ProcessCluster> {
        std::fs::create_dir_all(&spec.dir)?;
        let snapshots = spec.dir.join("snapshots");
        let mut nodes = Vec::new();
        for i in 0..spec.shard_nodes {
            let id = format!("shard-{i}");
            let data = spec.node_dirs.get(&i).cloned().unwrap_or_else(|| spec.dir.join(&id));
            let mut env = vec![("SHOAL_SHARD_SNAPSHOT__URL".to_owned(), snapshots.to_string_lossy().into_owned())];
            env.extend(spec.node_env.iter().cloned());
            env.extend(spec.node_env_of.get(&i).into_iter().flatten().cloned());
            let node_spec = Spec {
                launcher: spec.launcher.clone(),
                args: vec![
                    "--node-id".into(),
                    id.clone(),
                    "--listen".into(),
                    "127.0.0.1:0".into(),
                    "--data-dir".into(),
                    data.to_string_lossy().into_owned(),
                ]
                .into_iter()
                .chain(spec.etcd_args())
                .collect(),
                env,
                open_files: spec.node_open_files.get(&i).copied(),
            };
            nodes.push(Proc::start(Role::ShardNode, &id, node_spec, spec.dir.join(format!("{id}.log")))?);
        }
        let mut coordinators = Vec::new();
        for j in 0..spec.coordinators.max(1) {
            let id = if j == 0 { "coordinator".to_owned() } else { format!("coordinator-{j}") };
            let port = spec.first_coordinator_port.map_or(0, |p| p + j as u16);
            let mut args = vec!["--listen".to_owned(), format!("127.0.0.1:{port}"), "--id".into(), id.clone()];
            if spec.etcd.is_some() {
                args.extend(spec.etcd_args());
            } else {
                for n in &nodes {
                    args.push("--shard-node".into());
                    args.push(format!("{}={}", n.id, n.addr));
                }
            }
            let coord_spec = Spec { launcher: spec.launcher.clone(), args, env: spec.coordinator_env.clone(), open_files: None };
            coordinators.push(Proc::start(Role::Coordinator, &id, coord_spec, spec.dir.join(format!("{id}.log")))?);
        }
        let coordinator = coordinators.remove(0);
        Ok(ProcessCluster { nodes, coordinator, more_coordinators: coordinators })
    }

    /// The coordinator's URL.
    pub fn endpoint(&self) -> String {
        self.coordinator.endpoint()
    }

    /// Every process's log tail, for a failing test to print.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for p in self.nodes.iter().chain(std::iter::once(&self.coordinator)).chain(&self.more_coordinators) {
            out.push_str(&format!("--- {} ---\n{}\n", p.id, p.log_tail()));
        }
        out
    }
}

/// For a program used as a [`Launcher::Roles`] launcher: when its first
/// argument names a role, runs that role with the remaining arguments, as
/// the role's own binary would, and returns how it ended. `None` otherwise.
pub fn run_role_if_asked() -> Option<anyhow::Result<()>> {
    let mut args = std::env::args_os();
    let program = args.next()?;
    let role = args.next()?;
    let rest: Vec<std::ffi::OsString> = std::iter::once(program).chain(args).collect();
    let role = match role.to_str()? {
        "shard-node" => Role::ShardNode,
        "coordinator" => Role::Coordinator,
        _ => return None,
    };
    Some(run_role(role, rest))
}

/// Runs `role` as its own binary would, on the runtime its configuration asks for.
fn run_role(role: Role, args: Vec<std::ffi::OsString>) -> anyhow::Result<()> {
    use clap::Parser;
    match role {
        Role::ShardNode => shoal_shard_node::cli::main(shoal_shard_node::cli::Cli::try_parse_from(args)?),
        Role::Coordinator => shoal_coordinator::cli::main(shoal_coordinator::cli::Cli::try_parse_from(args)?),
    }
}
