//! The metadata store on a real etcd: the conformance suite both backends
//! pass, the key layout operators read, and what happens when etcd goes
//! away and comes back (on an etcd process of the test's own).
//!
//! The etcd comes from `SHOAL_TEST_ETCD_ENDPOINT`, which `ops/test.sh` sets
//! after starting one; without it these tests print `SKIPPED` and pass, as
//! the S3 tests do without `SHOAL_TEST_S3_ENDPOINT`. Every test works under
//! its own random prefix, and every name contains `etcd`
//! (`./ops/test.sh -p shoal-control etcd` runs just these).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use shoal_control::metadata::conformance::{self, StoreFactory, TTL, view_where, within};
use shoal_control::metadata::etcd::{EtcdOptions, EtcdStore};
use shoal_control::metadata::{MetaError, MetadataStore, StoreHealth};
use shoal_proto::CollectionName;

fn endpoint(test: &str) -> Option<String> {
    let endpoint = std::env::var("SHOAL_TEST_ETCD_ENDPOINT").ok().filter(|e| !e.is_empty());
    if endpoint.is_none() {
        eprintln!("SKIPPED {test}: SHOAL_TEST_ETCD_ENDPOINT is not set (ops/test.sh starts etcd and sets it)");
    }
    endpoint
}

fn prefix(test: &str) -> String {
    format!("/shoal-test/{test}-{:016x}", rand::random::<u64>())
}

async fn raw_client(endpoint: &str) -> Client {
    Client::connect([endpoint], None).await.expect("connect a plain etcd client")
}

/// Stores on one fresh prefix of the test etcd.
struct EtcdFactory {
    endpoint: String,
    prefix: String,
}

impl EtcdFactory {
    fn new(test: &str) -> Option<EtcdFactory> {
        Some(EtcdFactory { endpoint: endpoint(test)?, prefix: prefix(test) })
    }
}

impl StoreFactory for EtcdFactory {
    async fn open(&self) -> Arc<dyn MetadataStore> {
        let store = EtcdStore::connect(std::slice::from_ref(&self.endpoint), &self.prefix, EtcdOptions::default()).await;
        Arc::new(store.expect("connect to the test etcd"))
    }

    /// Revokes the controller's lease, as etcd does when it runs out.
    async fn end_controller_term(&self) -> bool {
        let mut client = raw_client(&self.endpoint).await;
        let key = format!("{}/controller", self.prefix);
        let resp = client.get(key.as_str(), None).await.expect("get the controller key");
        let lease = resp.kvs().first().map(|kv| kv.lease()).expect("a controller key");
        client.lease_revoke(lease).await.expect("revoke the controller's lease");
        true
    }
}

mod etcd_conformance {
    use super::*;

    macro_rules! etcd_suite {
        ($($test:ident),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let Some(factory) = EtcdFactory::new(stringify!($test)) else { return };
                conformance::$test(&factory).await;
            }
        )*};
    }

    etcd_suite!(
        collections_change_with_rising_revisions,
        stale_changes_conflict_and_write_nothing,
        drain_marks_and_moves_are_shared,
        invalid_collections_are_refused,
        watch_announces_changes,
        changes_reach_other_stores,
        concurrent_changes_on_one_revision_let_one_win,
        registrations_show_members_until_they_leave,
        dropped_registrations_end_after_their_ttl,
        a_restart_on_the_same_data_takes_its_registration_over,
        second_candidate_wins_when_the_first_resigns,
        a_dropped_leadership_passes_on_within_the_ttl,
        leadership_is_lost_when_the_term_ends,
    );
}

/// The keys are where the module documentation says, in JSON an operator
/// can read and write; a corrupt value is left out of the view without
/// stopping the watch; deleting the controller key by hand ends the term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_keys_are_laid_out_as_documented_and_corrupt_values_are_skipped() {
    let Some(f) = EtcdFactory::new("etcd_keys") else { return };
    let store = f.open().await;
    let docs = conformance::collection("docs", &["n0", "n1"]);
    let r1 = store.create_collection(docs.clone()).await.expect("create");
    let member = shoal_control::model::Member::configured(shoal_proto::NodeId::parse("n0").unwrap(), "http://127.0.0.1:7701".into());
    let registration = store.register(member, TTL).await.expect("register");
    let leader = store.campaign("coord-a".into(), TTL).await.expect("campaign");

    let mut etcd = raw_client(&f.endpoint).await;
    let all = etcd.get(format!("{}/", f.prefix), Some(GetOptions::new().with_prefix())).await.expect("list");
    let mut found: Vec<(String, serde_json::Value)> = all
        .kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap().strip_prefix(&f.prefix).unwrap().to_owned(), serde_json::from_slice(kv.value()).unwrap()))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["/collections/docs", "/controller", "/nodes/n0"]);
    assert_eq!(found[0].1["spec"]["metric"], "cosine");
    assert_eq!(found[0].1["shards"][1]["replicas"][0], "n1");
    assert_eq!(found[1].1["candidate"], "coord-a");
    assert_eq!(found[2].1["address"], "http://127.0.0.1:7701");
    assert_eq!(all.kvs()[0].mod_revision(), r1);
    assert!(all.kvs()[2].lease() != 0 && all.kvs()[1].lease() != 0, "members and the controller live on leases");

    // Written by hand, as an operator would.
    let by_hand =
        r#"{"spec":{"dimension":3,"metric":"dot","m":16,"ef_construction":100,"shard_count":1},"shards":[{"replicas":["n7"],"epoch":4}]}"#;
    etcd.put(format!("{}/collections/manual", f.prefix), by_hand, None).await.expect("put by hand");
    etcd.put(format!("{}/collections/broken", f.prefix), "{not json", None).await.expect("put a corrupt value");
    etcd.put(format!("{}/collections/bad name", f.prefix), by_hand, None).await.expect("put under a bad name");
    etcd.put(format!("{}/later-feature/x", f.prefix), "?", None).await.expect("put an unknown key");
    let manual = CollectionName::parse("manual").unwrap();
    let view = view_where(store.as_ref(), "the hand-written collection", Duration::from_secs(5), |v| v.collection(&manual).is_some()).await;
    let c = &view.collection(&manual).unwrap().value;
    assert_eq!((c.spec.index.m, c.shards[0].epoch, c.node_of(0).as_str()), (16, 4, "n7"));

    // The watcher went on past the corrupt values, and a new store lists
    // past them.
    let r2 = store.create_collection(conformance::collection("after", &["n0"])).await.expect("create after the corrupt value");
    let fresh = f.open().await;
    for s in [&store, &fresh] {
        let view = s.sync().await.expect("sync");
        assert!(view.revision >= r2);
        let names: Vec<&str> = view.collections.keys().map(CollectionName::as_str).collect();
        assert_eq!(names, ["after", "docs", "manual"]);
    }

    // An operator deleting the controller key ends the term.
    assert!(leader.is_leader());
    etcd.delete(format!("{}/controller", f.prefix), None).await.expect("delete the controller key");
    within("lost() after the key was deleted", Duration::from_secs(5), leader.lost()).await;
    assert!(!leader.is_leader());

    // A node whose key was deleted learns it on its next update.
    etcd.delete(format!("{}/nodes/n0", f.prefix), None).await.expect("delete the node key");
    let again = shoal_control::model::Member::configured(shoal_proto::NodeId::parse("n0").unwrap(), "http://127.0.0.1:7702".into());
    assert!(matches!(registration.update(again).await, Err(MetaError::NotFound(_))));
    assert!(!registration.is_alive());
}

/// Connecting to an etcd that is not there fails with `Unavailable` within
/// the call timeout instead of hanging. Needs no etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_connect_to_nothing_fails_within_the_call_timeout() {
    let closed = free_port();
    let options = EtcdOptions { call_timeout: Duration::from_millis(800), ..EtcdOptions::default() };
    let started = Instant::now();
    let r = EtcdStore::connect(&[format!("http://127.0.0.1:{closed}")], "/shoal-test/nothing", options).await;
    let took = started.elapsed();
    assert!(matches!(r, Err(MetaError::Unavailable(_))), "{:?}", r.err());
    assert!(took < Duration::from_millis(1800), "connect failed after {took:?}");
    assert!(matches!(EtcdStore::connect(&["http://127.0.0.1:1".into()], "/", EtcdOptions::default()).await, Err(MetaError::Invalid(_))));
}

/// etcd stops: the store keeps serving its last view, reports
/// `Unreachable`, and refuses changes within the call timeout. etcd comes
/// back on the same data: the store reconnects by itself, sees what
/// another client changed meanwhile, and takes changes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_unreachable_keeps_the_view_and_recovers() {
    // Not the shared etcd (it must stay up for the other tests), but gated
    // on the same variable: where it is set, etcd is installed, and a
    // missing binary fails the test instead of skipping it.
    if endpoint("etcd_unreachable_keeps_the_view_and_recovers").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (client_port, peer_port) = (free_port(), free_port());
    let mut etcd = EtcdProcess::start(dir.path(), client_port, peer_port).await;
    let endpoints = [etcd.endpoint()];
    let call_timeout = Duration::from_secs(1);
    let options = EtcdOptions { call_timeout, max_backoff: Duration::from_millis(500), ..EtcdOptions::default() };
    let prefix = prefix("etcd_unreachable");
    let store = EtcdStore::connect(&endpoints, &prefix, options.clone()).await.expect("connect");
    let docs = conformance::collection("docs", &["n0", "n1"]);
    let r1 = store.create_collection(docs.clone()).await.expect("create");
    assert_eq!(store.health(), StoreHealth::Connected);

    etcd.kill();
    let before = store.view();
    let started = Instant::now();
    loop {
        if let StoreHealth::Unreachable { error, .. } = store.health() {
            eprintln!("unreachable after {:?}: {error}", started.elapsed());
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "health still Connected {:?} after etcd was killed", started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.view(), before, "the view changed while etcd was away");

    let bound = call_timeout + Duration::from_millis(500);
    let moved = {
        let mut c = docs.clone();
        c.shards[1].replicas = vec![shoal_control::model::Replica::active(shoal_proto::NodeId::parse("n2").unwrap())];
        c.shards[1].epoch += 1;
        c
    };
    let started = Instant::now();
    let r = store.update_collection(moved.clone(), r1).await;
    assert!(matches!(r, Err(MetaError::Unavailable(_))), "update while etcd is down: {r:?}");
    assert!(started.elapsed() < bound, "update failed after {:?}", started.elapsed());
    let started = Instant::now();
    let r = store.create_collection(conformance::collection("new", &["n0"])).await;
    assert!(matches!(r, Err(MetaError::Unavailable(_))), "create while etcd is down: {r:?}");
    assert!(started.elapsed() < bound, "create failed after {:?}", started.elapsed());
    let started = Instant::now();
    let r = store.sync().await;
    assert!(matches!(r, Err(MetaError::Unavailable(_))), "sync while etcd is down: {r:?}");
    assert!(started.elapsed() < bound, "sync failed after {:?}", started.elapsed());
    let docs_name = docs.name.clone();
    assert_eq!(store.view().collection(&docs_name).map(|c| c.revision), Some(r1), "the last view is still served");

    let etcd = EtcdProcess::start(dir.path(), client_port, peer_port).await;
    // Another coordinator changes the collection before this store is back.
    let other = EtcdStore::connect(&endpoints, &prefix, options).await.expect("connect another store");
    let r2 = other.update_collection(moved.clone(), r1).await.expect("update from the other store");

    let started = Instant::now();
    loop {
        if store.health() == StoreHealth::Connected {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "health still {:?} after etcd came back", store.health());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let view = view_where(&store, "the other store's change", Duration::from_secs(5), |v| v.revision >= r2).await;
    assert_eq!(view.collection(&docs_name).map(|c| (&c.value, c.revision)), Some((&moved, r2)));
    let r3 = store.update_collection(docs.clone(), r2).await.expect("update after etcd came back");
    assert!(r3 > r2);
    drop(etcd);
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// An etcd of the test's own, killed when dropped.
struct EtcdProcess {
    child: Child,
    client_port: u16,
    log: PathBuf,
}

impl EtcdProcess {
    /// Starts `etcd` from PATH on `data` (kept across restarts) and waits
    /// until it answers.
    async fn start(data: &Path, client_port: u16, peer_port: u16) -> EtcdProcess {
        let log = data.join("etcd.log");
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("open the etcd log");
        let (client, peer) = (format!("http://127.0.0.1:{client_port}"), format!("http://127.0.0.1:{peer_port}"));
        let mut command = Command::new("etcd");
        command
            .args(["--name", "shoal-test", "--data-dir"])
            .arg(data.join("etcd"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("shoal-test={peer}")])
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out);
        // etcd 3.4 refuses to start on architectures it does not list
        // (arm64 among them) unless told this; 3.5 ignores it on those.
        if let Some(arch) = etcd_arch() {
            command.env("ETCD_UNSUPPORTED_ARCH", arch);
        }
        let child = command.spawn().unwrap_or_else(|e| {
            panic!("cannot start `etcd` ({e}): SHOAL_TEST_ETCD_ENDPOINT is set, so this test needs etcd on PATH (ops/test.sh installs it)")
        });
        let process = EtcdProcess { child, client_port, log };
        process.wait_ready().await;
        process
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    async fn wait_ready(&self) {
        let started = Instant::now();
        loop {
            let probe = async {
                let mut c = Client::connect([self.endpoint()], None).await.ok()?;
                c.get("probe", None).await.ok()
            };
            if let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(1), probe).await {
                return;
            }
            if started.elapsed() > Duration::from_secs(15) {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("etcd did not answer within 15 s; its log:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn etcd_arch() -> Option<&'static str> {
    match std::env::consts::ARCH {
        "x86_64" => None,
        "aarch64" => Some("arm64"),
        "powerpc64" => Some("ppc64le"),
        "s390x" => Some("s390x"),
        "x86" => Some("386"),
        "arm" => Some("arm"),
        _ => None,
    }
}
