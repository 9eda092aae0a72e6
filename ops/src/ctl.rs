//! `shoalctl status` and `shoalctl collections`: operator views of a
//! running cluster through the public API.

use std::sync::OnceLock;

use shoal_proto::auth::{BearerKey, KeyedClient};
use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use shoal_server::ClientTls;
use tonic::transport::Endpoint;

/// How shoalctl reaches its coordinator besides the address: the API key
/// sent with every call and the CA that signed the coordinator's
/// certificate (`--api-key`, `--tls-ca`).
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    pub api_key: Option<String>,
    pub tls: Option<ClientTls>,
}

/// One coordinator per shoalctl run, so its credentials are set once, at
/// start, for every command's calls.
static CREDENTIALS: OnceLock<Credentials> = OnceLock::new();

/// Sets the credentials every later [`connect`] uses (the first call wins).
pub fn set_credentials(c: Credentials) {
    let _ = CREDENTIALS.set(c);
}

pub async fn connect(endpoint: &str) -> anyhow::Result<KeyedClient> {
    let creds = CREDENTIALS.get().cloned().unwrap_or_default();
    connect_with(endpoint, &creds).await
}

/// A client of the coordinator at `endpoint` with `creds`: TLS when a CA
/// is given (the endpoint is then dialled as `https://`), the key on every
/// call.
pub async fn connect_with(endpoint: &str, creds: &Credentials) -> anyhow::Result<KeyedClient> {
    let key = BearerKey::new(creds.api_key.as_deref()).map_err(|e| anyhow::anyhow!("--api-key: {e}"))?;
    let url = if creds.tls.is_some() { shoal_server::tls::https(endpoint) } else { endpoint.to_owned() };
    let mut ep = Endpoint::from_shared(url).map_err(|e| anyhow::anyhow!("bad coordinator address {endpoint:?}: {e}"))?;
    if let Some(tls) = &creds.tls {
        ep = ep.tls_config(tls.load()?)?;
    }
    let channel = ep.connect().await.map_err(|e| anyhow::anyhow!("cannot reach the coordinator at {endpoint}: {e:?}"))?;
    Ok(ShoalClient::with_interceptor(channel, key))
}

fn metric_name(m: i32) -> &'static str {
    match v1::Metric::try_from(m) {
        Ok(v1::Metric::Cosine) => "cosine",
        Ok(v1::Metric::Dot) => "dot",
        Ok(v1::Metric::Euclidean) => "euclidean",
        _ => "?",
    }
}

pub fn parse_metric(s: &str) -> anyhow::Result<v1::Metric> {
    match s.to_ascii_lowercase().as_str() {
        "cosine" => Ok(v1::Metric::Cosine),
        "dot" => Ok(v1::Metric::Dot),
        "euclidean" | "l2" => Ok(v1::Metric::Euclidean),
        other => anyhow::bail!("unknown metric {other:?} (cosine, dot, euclidean)"),
    }
}

pub async fn status(endpoint: &str) -> anyhow::Result<()> {
    let s = connect(endpoint).await?.cluster_status(v1::ClusterStatusRequest {}).await?.into_inner();
    if let Some(cp) = &s.control_plane {
        print_control_plane(cp);
    }
    print_nodes(&s);
    println!();
    for c in &s.collections {
        print_collection(c);
    }
    if s.collections.is_empty() {
        println!("no collections");
    }
    Ok(())
}

/// The members, one line each.
pub fn print_nodes(s: &v1::ClusterStatusResponse) {
    println!("{:<12} {:<28} {:<6} {:<10} {:<7} disk free", "node", "address", "health", "state", "shards");
    for n in &s.nodes {
        let free =
            if n.disk_free_bytes == 0 { "?".to_string() } else { format!("{:.1} GiB", n.disk_free_bytes as f64 / f64::from(1u32 << 30)) };
        println!(
            "{:<12} {:<28} {:<6} {:<10} {:<7} {free}",
            n.id,
            n.address,
            if n.available { "up" } else { "DOWN" },
            if n.state.is_empty() { "-" } else { &n.state },
            n.shards
        );
        for d in &n.damaged {
            let next = if other_copies(s, d, &n.id) > 0 {
                "the controller seeds it anew from another replica"
            } else {
                "the only copy in sync: restore the shard from a snapshot (docs/runbooks/a-copy-is-damaged.md)"
            };
            println!("  DAMAGED {}/{}: not served; {next} ({})", d.collection, d.shard, d.reason);
        }
    }
}

/// In-sync copies of the damaged copy `d`'s shard on nodes other than
/// `node` that are up.
fn other_copies(s: &v1::ClusterStatusResponse, d: &v1::DamagedCopy, node: &str) -> usize {
    let shard = s.collections.iter().find(|c| c.name == d.collection).and_then(|c| c.shards.iter().find(|i| i.shard == d.shard));
    shard.map_or(0, |i| i.replicas.iter().filter(|r| r.node != node && r.state == "active" && !r.node_down).count())
}

fn print_control_plane(cp: &v1::ControlPlane) {
    let controller = if cp.controller.is_empty() { "none" } else { &cp.controller };
    println!("control plane: {} at revision {}, controller {controller} (this is {})", cp.store, cp.revision, cp.coordinator);
    if !cp.reachable {
        let ago = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
            .saturating_sub(cp.unreachable_since_ms);
        println!(
            "  UNREACHABLE for {:.0} s ({}): serving with the placement last seen; placement changes are refused",
            ago as f64 / 1000.0,
            cp.error
        );
    }
    println!();
}

pub fn print_collection(c: &v1::CollectionInfo) {
    // 0 asks for the engine's default (M=16, ef_construction=100).
    let (m, efc) = c.index.map_or((0, 0), |i| (i.m, i.ef_construction));
    let (m, efc) = (if m == 0 { "16".to_owned() } else { m.to_string() }, if efc == 0 { "100".to_owned() } else { efc.to_string() });
    let replication = match c.replication_factor {
        0 | 1 => String::new(),
        f => format!(", {f} replicas (writes need {} in sync)", c.min_in_sync.max(1)),
    };
    println!(
        "collection {}: dim {} {} M={m} ef_construction={efc}, {} shards{replication}, {} points",
        c.name,
        c.dimension,
        metric_name(c.metric),
        c.shard_count,
        c.points
    );
    for s in &c.shards {
        let moving = s.moving.as_ref().map_or(String::new(), |m| match m.kind.as_str() {
            "copy" => format!("  copying a replica from {} to {} ({})", m.from_node, m.to_node, m.phase),
            _ => format!("  moving to {} ({})", m.to_node, m.phase),
        });
        println!(
            "  shard {:<3} node {:<10} {:<5} points {:<10} tombstones {:<8} disk {:.1} MiB  epoch {}{moving}",
            s.shard,
            s.node,
            if s.available { "up" } else { "DOWN" },
            s.points,
            s.tombstones,
            s.disk_bytes as f64 / 1048576.0,
            s.epoch
        );
        if let Some(line) = replicas_line(s, c.replication_factor) {
            println!("{line}");
        }
    }
}

/// A shard's copies and their states, when there is more than one copy to
/// show or the shard is short of copies; an out-of-sync one is what an
/// operator looks for (UNDER-REPLICATED). A copy in sync on a node that is
/// down holds every write but serves nothing until the node is back (or
/// the copy is repaired elsewhere): the shard is short of it. So is a
/// shard of a replicated collection left with one copy (the controller
/// forgot a dead node's copy and has not started the new one yet): the
/// runbooks wait for no shard to be short, so that moment must show.
fn replicas_line(s: &v1::ShardInfo, replication_factor: u32) -> Option<String> {
    let in_sync = s.replicas.iter().filter(|r| r.state == "active" && !r.node_down).count() as u32;
    let short = in_sync < replication_factor.max(1);
    let replicated = replication_factor > 1 || s.replicas.len() > 1;
    if !(s.replicas.len() > 1 || s.replicas.iter().any(|r| r.state != "active") || (replicated && short)) {
        return None;
    }
    let list: Vec<String> =
        s.replicas.iter().map(|r| format!("{} {}{}", r.node, r.state, if r.node_down { " (node DOWN)" } else { "" })).collect();
    Some(format!("      replicas: {}{}", list.join(", "), if short { "  UNDER-REPLICATED" } else { "" }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(node: &str, state: &str, node_down: bool) -> v1::ReplicaInfo {
        v1::ReplicaInfo { node: node.into(), state: state.into(), node_down }
    }

    #[test]
    fn a_damaged_copy_counts_the_other_copies_in_sync_that_can_seed_it() {
        let shard = v1::ShardInfo {
            shard: 1,
            replicas: vec![replica("shard-1", "dead", false), replica("shard-2", "active", false), replica("shard-3", "active", true)],
            ..Default::default()
        };
        let s = v1::ClusterStatusResponse {
            collections: vec![v1::CollectionInfo { name: "docs".into(), shards: vec![shard], ..Default::default() }],
            ..Default::default()
        };
        let damaged = |c: &str, shard| v1::DamagedCopy { collection: c.into(), shard, ..Default::default() };
        // shard-2 can seed it; shard-3's node is down.
        assert_eq!(other_copies(&s, &damaged("docs", 1), "shard-1"), 1);
        assert_eq!(other_copies(&s, &damaged("docs", 1), "shard-2"), 0);
        assert_eq!(other_copies(&s, &damaged("docs", 0), "shard-1"), 0, "no such shard");
        assert_eq!(other_copies(&s, &damaged("other", 1), "shard-1"), 0, "no such collection");
    }

    #[test]
    fn a_replicated_shard_left_with_one_copy_shows_as_under_replicated() {
        let shard = |replicas| v1::ShardInfo { replicas, ..Default::default() };
        // One copy left of two: the moment between forgetting a dead
        // node's copy and starting its replacement.
        let one = shard(vec![replica("shard-1", "active", false)]);
        assert_eq!(replicas_line(&one, 2).as_deref(), Some("      replicas: shard-1 active  UNDER-REPLICATED"));
        // A collection of one copy: nothing to show.
        assert_eq!(replicas_line(&one, 1), None);
        assert_eq!(replicas_line(&one, 0), None);
        let two = shard(vec![replica("shard-1", "active", false), replica("shard-2", "active", false)]);
        assert_eq!(replicas_line(&two, 2).as_deref(), Some("      replicas: shard-1 active, shard-2 active"));
        let down = shard(vec![replica("shard-1", "active", false), replica("shard-2", "active", true)]);
        assert_eq!(
            replicas_line(&down, 2).as_deref(),
            Some("      replicas: shard-1 active, shard-2 active (node DOWN)  UNDER-REPLICATED")
        );
        let copying = shard(vec![replica("shard-1", "active", false), replica("shard-9", "copying", false)]);
        assert!(replicas_line(&copying, 2).is_some_and(|l| l.ends_with("UNDER-REPLICATED")));
    }
}
