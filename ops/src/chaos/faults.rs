//! The fault schedule of a chaos run.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_proto::v1;

use super::clients::Clients;
use super::damage::flip_a_vector;
use super::observe::{Busy, all_shards, blocking, node_safe_to_lose};
use super::report::Timeline;
use super::returns::{Back, NodeReturn};
use super::{ChaosConfig, Data};
use crate::etcd_server::Etcd;
use crate::procs::ProcessCluster;

/// The kinds of fault, in the order they take turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGKILL; every other one is back after a pause, the rest after
    /// their copies were repaired elsewhere.
    Kill,
    /// SIGSTOP for 1-3 s, then SIGCONT.
    Stop,
    /// The controller coordinator SIGKILLed and restarted.
    Controller,
    /// SIGKILL and a single start again at once, as a service manager does.
    QuickRestart,
    /// A bit flipped in a stored vector of a copy that serves.
    Flip,
    /// etcd SIGKILLed and restarted.
    Etcd,
}

/// Node faults between the others, so that the controller and etcd go
/// down while a node's return or a repair is under way.
const ROTATION: [Fault; 6] = [Fault::Kill, Fault::Stop, Fault::Controller, Fault::QuickRestart, Fault::Flip, Fault::Etcd];

impl Fault {
    fn on_a_node(self) -> bool {
        matches!(self, Fault::Kill | Fault::Stop | Fault::QuickRestart | Fault::Flip)
    }
}

/// The faults, one every `fault_every`, taking turns (`ROTATION`). A node
/// fault hits a node whose every shard has another copy in sync on a node
/// that is up: with two copies, a node lost while a shard's other copy is
/// still catching up takes that shard's last copy, which no replication
/// factor of two survives. When no node is safe to lose, the controller
/// or etcd stand in for the node fault, which runs next round, so faults
/// keep coming. A node's
/// return and a flipped copy's repair are awaited and timed by tasks of
/// their own, so that the next faults do not wait for them.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run_faults(
    cfg: &ChaosConfig,
    seed: u64,
    cluster: &Arc<Mutex<ProcessCluster>>,
    etcd: &Arc<Mutex<Etcd>>,
    timeline: &Arc<Mutex<Timeline>>,
    admins: Clients,
    data: Arc<Data>,
    started: Instant,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let end = Instant::now() + cfg.faults_for;
    let busy = Busy::default();
    let mut returns = Vec::new();
    let (mut kills, mut stand_ins, mut turn) = (0usize, 0usize, 0usize);
    let within = cfg.lease_ttl + cfg.repair_after + Duration::from_secs(150);
    let factor = cfg.replication_factor as usize;
    while Instant::now() < end {
        let began = Instant::now();
        let mut fault = ROTATION[turn % ROTATION.len()];
        let mut node = 0;
        if fault.on_a_node() {
            match node_safe_to_lose(&admins, cfg.shard_nodes, &busy.nodes(), &mut rng).await {
                Some(n) => node = n,
                // The node fault keeps its turn for the next round, so
                // that every kind runs in a short run too.
                None => {
                    stand_ins += 1;
                    fault = if stand_ins % 2 == 1 { Fault::Controller } else { Fault::Etcd };
                }
            }
        }
        if fault == ROTATION[turn % ROTATION.len()] {
            turn += 1;
        }
        let kind = match fault {
            Fault::Kill | Fault::QuickRestart => {
                // Safe to lose was just read, so the shards it holds can be.
                let Ok(shards) = all_shards(&admins).await else { continue };
                let held: HashSet<String> = shards
                    .into_iter()
                    .filter(|(_, s)| s.replicas.iter().any(|r| r.node == format!("shard-{node}")))
                    .map(|(key, _)| key)
                    .collect();
                busy.hold(node);
                timeline.lock().node_kills.push(started.elapsed());
                blocking(cluster, move |c| c.nodes[node].kill().map(|_| ())).await?;
                let (back, kind) = if fault == Fault::QuickRestart {
                    (Back::AtOnce, "node SIGKILL and one start again at once")
                } else {
                    kills += 1;
                    if kills.is_multiple_of(2) {
                        (Back::AfterRepair, "node SIGKILL, back after repair")
                    } else {
                        (Back::AfterPause(Duration::from_millis(rng.random_range(500..2_000))), "node SIGKILL and restart")
                    }
                };
                let back = NodeReturn { node, held, back, within, rebalance_returned: cfg.rebalance_returned, factor };
                let (cluster, timeline, busy, admins) = (Arc::clone(cluster), Arc::clone(timeline), busy.clone(), admins.clone());
                returns.push(tokio::spawn(async move { back.run(cluster, timeline, busy, admins).await }));
                kind
            }
            Fault::Flip => match flip_a_vector(cluster, &admins, &data, node, &mut rng).await? {
                Some(flipped) => {
                    for &n in &flipped.holders {
                        busy.hold(n);
                    }
                    let (timeline, busy, admins) = (Arc::clone(timeline), busy.clone(), admins.clone());
                    returns.push(tokio::spawn(async move { flipped.repaired(timeline, busy, admins, factor, within).await }));
                    "a bit flipped in a stored vector"
                }
                None => "a bit flip that found no vector to flip",
            },
            Fault::Stop => {
                blocking(cluster, move |c| c.nodes[node].stop()).await?;
                tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
                blocking(cluster, move |c| c.nodes[node].resume()).await?;
                "node SIGSTOP for 1-3 s"
            }
            Fault::Controller => {
                let mut controller = String::new();
                for admin in &admins.clients {
                    if let Ok(s) = admin.clone().cluster_status(v1::ClusterStatusRequest {}).await {
                        controller = s.into_inner().control_plane.map(|c| c.controller).unwrap_or_default();
                        break;
                    }
                }
                blocking(cluster, move |c| {
                    let all = std::iter::once(&mut c.coordinator).chain(c.more_coordinators.iter_mut());
                    for p in all {
                        if p.id == controller {
                            p.kill()?;
                            std::thread::sleep(Duration::from_millis(500));
                            return p.restart();
                        }
                    }
                    Ok(())
                })
                .await?;
                "controller SIGKILL and restart"
            }
            Fault::Etcd => {
                let etcd = Arc::clone(etcd);
                tokio::task::spawn_blocking(move || {
                    let mut e = etcd.lock();
                    e.kill();
                    std::thread::sleep(Duration::from_millis(500));
                    e.spawn()
                })
                .await??;
                "etcd restart"
            }
        };
        {
            let mut tl = timeline.lock();
            *tl.faults.entry(kind.to_owned()).or_insert(0) += 1;
            let on = if fault.on_a_node() { format!(" (shard-{node})") } else { String::new() };
            tl.log.push((began.duration_since(started).as_secs_f64(), format!("{kind}{on}")));
        }
        let spent = began.elapsed();
        if spent < cfg.fault_every {
            tokio::time::sleep(cfg.fault_every - spent).await;
        }
    }
    for r in returns {
        r.await??;
    }
    Ok(())
}
