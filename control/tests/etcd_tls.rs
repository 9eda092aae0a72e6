//! The metadata store over TLS to a real etcd that requires client
//! certificates (`--client-cert-auth`): with the cluster's CA and a client
//! certificate it works; without the certificate, trusting another CA,
//! trusting only the system's roots, or in plain text it is refused, and
//! the error says why.
//!
//! The etcd is the test's own (certificates made here with rcgen, on a
//! free loopback port, killed at the end), gated like
//! `etcd_metadata.rs`'s on `SHOAL_TEST_ETCD_ENDPOINT`: where `ops/test.sh`
//! sets it, `etcd` is installed, and a missing binary fails the test.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use shoal_control::config::EtcdTls;
use shoal_control::metadata::conformance::{self, TTL, view_where};
use shoal_control::metadata::etcd::{EtcdOptions, EtcdStore};
use shoal_control::metadata::{MetaError, MetadataStore};
use shoal_proto::CollectionName;

fn gated(test: &str) -> bool {
    let set = std::env::var("SHOAL_TEST_ETCD_ENDPOINT").is_ok_and(|e| !e.is_empty());
    if !set {
        eprintln!("SKIPPED {test}: SHOAL_TEST_ETCD_ENDPOINT is not set (ops/test.sh starts etcd and sets it)");
    }
    set
}

/// A CA and the certificates it signed, as PEM files in one directory.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Pki {
    /// `name`'s CA in `dir`, a server certificate for `localhost` and
    /// `127.0.0.1` and a client certificate.
    fn new(dir: &Path, name: &str) -> Pki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let ca_path = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_path, ca.pem()).unwrap();
        let leaf = |file: &str, cn: &str, usages: Vec<ExtendedKeyUsagePurpose>| {
            let mut p = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = usages;
            p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
            let key = KeyPair::generate().unwrap();
            let cert = p.signed_by(&key, &ca).unwrap();
            let (cert_path, key_path) = (dir.join(format!("{name}-{file}.pem")), dir.join(format!("{name}-{file}-key.pem")));
            std::fs::write(&cert_path, cert.pem()).unwrap();
            std::fs::write(&key_path, key.serialize_pem()).unwrap();
            (cert_path, key_path)
        };
        // etcd 3.4's own gateway dials etcd with the server certificate, so
        // with --client-cert-auth it must allow client authentication too.
        let (server_cert, server_key) =
            leaf("server", "etcd", vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth]);
        let (client_cert, client_key) = leaf("client", "shoal", vec![ExtendedKeyUsagePurpose::ClientAuth]);
        Pki { ca: ca_path, server_cert, server_key, client_cert, client_key }
    }

    fn client_tls(&self) -> EtcdTls {
        EtcdTls { ca_file: Some(self.ca.clone()), cert_file: Some(self.client_cert.clone()), key_file: Some(self.client_key.clone()) }
    }
}

fn options(tls: EtcdTls) -> EtcdOptions {
    EtcdOptions { call_timeout: Duration::from_secs(2), tls, ..EtcdOptions::default() }
}

fn prefix(test: &str) -> String {
    format!("/shoal-test/{test}-{:016x}", rand::random::<u64>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_mutual_tls_works_and_refuses_clients_without_the_right_certificates() {
    if !gated("etcd_over_mutual_tls_works_and_refuses_clients_without_the_right_certificates") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "cluster");
    let stranger = Pki::new(dir.path(), "stranger");
    let etcd = EtcdProcess::start(dir.path(), &pki).await;
    let url = etcd.url();
    let prefix = prefix("etcd_tls");

    // Mutual TLS: the store works, and so does a second one watching it.
    let started = Instant::now();
    let store = EtcdStore::connect(std::slice::from_ref(&url), &prefix, options(pki.client_tls())).await.expect("connect over mutual TLS");
    eprintln!("connected over mutual TLS in {:?}", started.elapsed());
    let docs = conformance::collection("docs", &["n0"]);
    let r1 = store.create_collection(docs.clone()).await.expect("create over TLS");
    let member = shoal_control::model::Member::configured(shoal_proto::NodeId::parse("n0").unwrap(), "https://127.0.0.1:7701".into());
    let registration = store.register(member, TTL).await.expect("register over TLS");
    let leader = store.campaign("coord-a".into(), TTL).await.expect("campaign over TLS");
    assert!(leader.is_leader() && registration.is_alive());
    // Through the configuration, as coordinators and nodes open it.
    let cfg = shoal_control::ClusterConfig { etcd: vec![url.clone()], prefix: prefix.clone(), tls: pki.client_tls(), ..Default::default() };
    let other = shoal_control::metadata::open(&cfg).await.expect("open from the configuration");
    let name = CollectionName::parse("docs").unwrap();
    let view = view_where(other.as_ref(), "the collection and the member", Duration::from_secs(5), |v| {
        v.collection(&name).is_some() && v.members.len() == 1
    })
    .await;
    assert_eq!(view.collection(&name).unwrap().revision, r1);
    let r2 = other.create_collection(conformance::collection("more", &["n0"])).await.expect("create from the other store");
    view_where(&store, "the other store's change, through the watch", Duration::from_secs(5), |v| v.revision >= r2).await;

    // The same CA but no client certificate: etcd ends the handshake.
    let ca_only = EtcdTls { ca_file: Some(pki.ca.clone()), ..EtcdTls::default() };
    let err = refused(&url, &prefix, ca_only).await;
    assert!(err.contains("requires a client certificate (--client-cert-auth)") && err.contains("cluster.tls.cert_file"), "{err}");

    // A client certificate from another CA: etcd refuses it, by name.
    let foreign_cert =
        EtcdTls { cert_file: Some(stranger.client_cert.clone()), key_file: Some(stranger.client_key.clone()), ..pki.client_tls() };
    let err = refused(&url, &prefix, foreign_cert).await;
    assert!(err.contains("refused the client certificate") && err.contains("stranger-client.pem"), "{err}");

    // A client that trusts another CA refuses etcd's certificate, whichever
    // client certificate it holds.
    for tls in [EtcdTls { ca_file: Some(stranger.ca.clone()), ..pki.client_tls() }, stranger.client_tls()] {
        let err = refused(&url, &prefix, tls).await;
        assert!(err.contains("UnknownIssuer") && err.contains("stranger-ca.pem") && err.contains("127.0.0.1"), "{err}");
    }

    // No CA given: the system's roots, which do not hold the cluster's CA.
    let err = refused(&url, &prefix, EtcdTls { ca_file: None, ..pki.client_tls() }).await;
    assert!(err.contains("system's root certificates"), "{err}");

    // Plain text to the TLS port: etcd hangs up; the error says it speaks
    // TLS and what to write instead.
    let plain = url.replacen("https://", "http://", 1);
    let err = refused(&plain, &prefix, EtcdTls::default()).await;
    assert!(err.contains("speaks TLS") && err.contains(&format!("write {url}")), "{err}");

    // Still fine for the store that was allowed in.
    store.sync().await.expect("sync over TLS after the refusals");
    drop(etcd);
}

/// Connecting with `tls` fails; the error, for the caller to check.
async fn refused(url: &str, prefix: &str, tls: EtcdTls) -> String {
    let started = Instant::now();
    let result = EtcdStore::connect(&[url.to_owned()], prefix, options(tls.clone())).await;
    let took = started.elapsed();
    let err = match result {
        Ok(_) => panic!("{tls:?} was let in"),
        Err(e) => e,
    };
    eprintln!("refused in {took:?}: {err}");
    assert!(matches!(err, MetaError::Unavailable(_)), "{err:?}");
    assert!(took < Duration::from_secs(4), "refused after {took:?}");
    err.to_string()
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// An etcd of the test's own serving clients over TLS only, requiring
/// client certificates; killed when dropped.
struct EtcdProcess {
    child: Child,
    client_port: u16,
    log: PathBuf,
}

impl EtcdProcess {
    async fn start(dir: &Path, pki: &Pki) -> EtcdProcess {
        let (client_port, peer_port) = (free_port(), free_port());
        let log = dir.join("etcd.log");
        let out = std::fs::File::create(&log).expect("create the etcd log");
        let (client, peer) = (format!("https://127.0.0.1:{client_port}"), format!("http://127.0.0.1:{peer_port}"));
        let mut command = Command::new("etcd");
        command
            .args(["--name", "shoal-tls", "--data-dir"])
            .arg(dir.join("etcd"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("shoal-tls={peer}")])
            .arg("--cert-file")
            .arg(&pki.server_cert)
            .arg("--key-file")
            .arg(&pki.server_key)
            .arg("--trusted-ca-file")
            .arg(&pki.ca)
            .arg("--client-cert-auth")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out);
        if let Some(arch) = etcd_arch() {
            command.env("ETCD_UNSUPPORTED_ARCH", arch);
        }
        let child = command.spawn().unwrap_or_else(|e| {
            panic!("cannot start `etcd` ({e}): SHOAL_TEST_ETCD_ENDPOINT is set, so this test needs etcd on PATH (ops/test.sh installs it)")
        });
        let process = EtcdProcess { child, client_port, log };
        process.wait_ready(pki).await;
        process
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.client_port)
    }

    /// Waits until etcd answers a client with the right certificates
    /// (etcd-client directly, not the store under test).
    async fn wait_ready(&self, pki: &Pki) {
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(&pki.ca).unwrap()))
            .identity(Identity::from_pem(std::fs::read(&pki.client_cert).unwrap(), std::fs::read(&pki.client_key).unwrap()));
        let started = Instant::now();
        loop {
            let probe = async {
                let mut c = Client::connect([self.url()], Some(ConnectOptions::new().with_tls(tls.clone()))).await.ok()?;
                c.get("probe", None).await.ok()
            };
            if let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(1), probe).await {
                return;
            }
            if started.elapsed() > Duration::from_secs(15) {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("etcd did not answer over TLS within 15 s; its log:\n{log}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
