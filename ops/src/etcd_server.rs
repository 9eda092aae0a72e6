//! An etcd server of a test's or a run's own (Debian's `etcd-server`,
//! found on PATH), on loopback: the chaos run restarts it, process tests
//! start nodes before it is up.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// An etcd process of a run's own, which it can kill and start again.
pub struct Etcd {
    child: Option<Child>,
    dir: PathBuf,
    client_port: u16,
    peer_port: u16,
}

impl Etcd {
    /// Starts one on free loopback ports, its data and log in `dir`, and
    /// waits until it answers.
    pub fn start(dir: &Path) -> anyhow::Result<Etcd> {
        let mut e = Etcd::on_free_ports(dir)?;
        e.spawn()?;
        Ok(e)
    }

    /// One that is not started yet (`spawn` starts it), so that its
    /// endpoint can be handed out first.
    pub fn on_free_ports(dir: &Path) -> anyhow::Result<Etcd> {
        Ok(Etcd { child: None, dir: dir.to_owned(), client_port: free_port()?, peer_port: free_port()? })
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Starts it (again, on the same data) and waits until it answers.
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("etcd.log"))?;
        let (client, peer) = (self.endpoint(), format!("http://127.0.0.1:{}", self.peer_port));
        let child = Command::new("etcd")
            .args(["--name", "shoal", "--data-dir"])
            .arg(self.dir.join("etcd-data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("shoal={peer}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting `etcd` (Debian's etcd-server; ops/test.sh installs it)")?;
        self.child = Some(child);
        let started = Instant::now();
        while !self.healthy() {
            if started.elapsed() > Duration::from_secs(20) {
                bail!("etcd did not answer within 20 s; see {}", self.dir.join("etcd.log").display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// `GET /health` answers `"health":"true"`.
    fn healthy(&self) -> bool {
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.client_port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        if s.write_all(b"GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n").is_err() {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }

    /// SIGKILL, and waits for the exit.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
