//! `shoalctl`: run the demo or an embedded dev cluster, look at a cluster.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use shoal_ops::embedded::{EmbeddedCluster, EmbeddedConfig};
use shoal_ops::{ctl, demo, placement, points, snapshots, top};
use shoal_proto::v1;

#[derive(Parser)]
#[command(name = "shoalctl", about = "Operate a shoal cluster", version)]
struct Cli {
    /// Coordinator to talk to.
    #[arg(long, global = true, env = "SHOAL_ENDPOINT", default_value = "http://127.0.0.1:7700")]
    endpoint: String,
    /// API key sent with every call (`authorization: Bearer <key>`), when
    /// the coordinator requires keys (docs/security.md).
    #[arg(long, global = true, env = "SHOAL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// CA certificate (PEM) that signed the coordinator's: speak TLS to it.
    #[arg(long, global = true, env = "SHOAL_TLS_CA")]
    tls_ca: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job end to end on an embedded cluster: ingest a real
    /// sample, search it, report recall, ingest rate and latency.
    Demo(demo::DemoArgs),
    /// Run a coordinator and shard nodes in this process on fixed loopback
    /// ports until Ctrl-C; with `--etcd`, each one its own process,
    /// registered in that etcd, to try moves, drains and failures by hand.
    Dev {
        #[arg(long, default_value = "./shoal-data/dev")]
        data_dir: PathBuf,
        #[arg(long, default_value_t = 3)]
        shard_nodes: usize,
        /// The (first) coordinator's port; in process, shard nodes take the
        /// ports after it. 0 gives every process a free port (printed when
        /// it is up).
        #[arg(long, default_value_t = 7700)]
        port: u16,
        /// etcd endpoint: run separate processes sharing membership and
        /// placement through it (etcd must be running).
        #[arg(long)]
        etcd: Option<String>,
        /// Key prefix in etcd (one cluster per prefix).
        #[arg(long, default_value = "/shoal/dev")]
        etcd_prefix: String,
        /// TLS to an `https://` etcd: the CA that signed its certificate
        /// (without it, the system's roots). Passed on to every process
        /// with the two below (docs/security.md, "TLS to etcd").
        #[arg(long, value_name = "PEM")]
        etcd_ca: Option<PathBuf>,
        /// Client certificate for an etcd with `--client-cert-auth`.
        #[arg(long, value_name = "PEM")]
        etcd_cert: Option<PathBuf>,
        /// The client certificate's private key.
        #[arg(long, value_name = "PEM")]
        etcd_key: Option<PathBuf>,
        /// Coordinators to run with `--etcd` (ports `port`, `port + 1`, ...).
        #[arg(long, default_value_t = 1)]
        coordinators: usize,
        /// TLS everywhere, mutual between the coordinator and the nodes,
        /// with the certificates `shoalctl tls init --out DIR` made (in
        /// process only).
        #[arg(long)]
        tls_dir: Option<PathBuf>,
        /// API keys the coordinator requires (a keys file as
        /// `shoalctl keys new` prints entries for; in process only).
        #[arg(long)]
        keys_file: Option<PathBuf>,
    },
    /// Nodes, collections and shards of the cluster.
    Status,
    /// A live view of the cluster from its processes' metrics: rates,
    /// p99 latencies, queue depths, memory, per node. Ctrl-C ends it.
    Top {
        /// Seconds between refreshes (the rates cover one interval).
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        /// Print one view and exit (two scrapes, one interval apart).
        #[arg(long)]
        once: bool,
    },
    /// Load files of embeddings (.fvecs, .npy, JSON Lines) into a
    /// collection over concurrent streams; run again with the same
    /// arguments after a failure, it resumes after the last acknowledged
    /// batch (docs/ingest.md).
    Ingest(shoal_ops::ingest::Args),
    /// Manage collections.
    #[command(subcommand)]
    Collections(Collections),
    /// The nearest points to a vector (or to a stored point), optionally
    /// among those matching a filter (docs/filters.md).
    Search(points::SearchArgs),
    /// How many points match a filter, exactly.
    Count(points::CountArgs),
    /// The points matching a filter in id order, as JSON lines: a page,
    /// or every page with --all (an export).
    Scroll(points::ScrollArgs),
    /// Delete points by id, or every point matching a filter.
    Delete(points::DeleteArgs),
    /// Payload indexes: create, drop, list (docs/filters.md).
    #[command(subcommand)]
    Index(points::IndexCommand),
    /// Snapshots to object storage: create, list, restore, prune.
    #[command(subcommand)]
    Snapshot(snapshots::SnapshotCommand),
    /// Shard nodes: list, drain, undrain.
    #[command(subcommand)]
    Node(placement::NodeCommand),
    /// Shards: move one to another node while it serves.
    #[command(subcommand)]
    Shard(placement::ShardCommand),
    /// Move shards until no two serving nodes hold more than one apart.
    Rebalance {
        /// Only print the moves it would make.
        #[arg(long)]
        dry_run: bool,
        /// Return once the moves are recorded.
        #[arg(long)]
        no_wait: bool,
        /// Give up waiting after this many seconds (the moves go on).
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Certificates for TLS between every process of a cluster.
    #[command(subcommand)]
    Tls(TlsCommand),
    /// API keys for the coordinator's `[coordinator.auth]`.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Write the gRPC file descriptor set (for `grpcurl -protoset`).
    ProtoDescriptor {
        #[arg(long, short, default_value = "shoal.protoset")]
        output: PathBuf,
    },
}

#[derive(Subcommand)]
enum TlsCommand {
    /// A new cluster CA and certificates signed by it: `node.pem` for
    /// shard nodes, `coordinator.pem` for coordinators (server and client),
    /// valid for localhost, 127.0.0.1 and every `--host`.
    Init {
        #[arg(long, default_value = "./shoal-tls")]
        out: PathBuf,
        /// A name or IP address the processes are reached at (repeat).
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// A new random API key: prints the key (give it to its user; it is
    /// not stored) and the entry to add to the coordinator's keys file.
    New {
        /// Who holds it (shown in logs and metrics instead of the key).
        #[arg(long)]
        name: String,
        /// read, write (ingest, upsert, delete) or admin.
        #[arg(long, default_value = "read")]
        role: String,
        /// Limit the key to this collection (repeat); default: all.
        #[arg(long = "collection")]
        collections: Vec<String>,
        /// Add the entry to this keys file (made if absent) instead of
        /// printing it.
        #[arg(long)]
        keys_file: Option<PathBuf>,
    },
    /// Remove a key's entry from a keys file: a coordinator reading that
    /// file refuses the key within a second.
    Revoke {
        #[arg(long)]
        name: String,
        #[arg(long)]
        keys_file: PathBuf,
    },
    /// The hex SHA-256 of a key given on stdin, as the keys file stores it.
    Hash,
}

#[derive(Subcommand)]
enum Collections {
    List,
    Describe {
        name: String,
    },
    Create {
        name: String,
        #[arg(long)]
        dimension: u32,
        #[arg(long, default_value = "cosine")]
        metric: String,
        #[arg(long, default_value_t = 0)]
        shards: u32,
        #[arg(long, default_value_t = 16)]
        m: u32,
        #[arg(long, default_value_t = 100)]
        ef_construction: u32,
        /// Full, searchable copies of every shard, on distinct nodes.
        #[arg(long, default_value_t = 1)]
        replication_factor: u32,
        /// Below this many in-sync copies a write is refused (retry hint).
        #[arg(long, default_value_t = 1)]
        min_in_sync: u32,
        /// A payload index, as field:type (keyword, integer, float, bool,
        /// datetime); repeat for more.
        #[arg(long = "index", value_name = "FIELD:TYPE")]
        indexes: Vec<String>,
    },
    Drop {
        name: String,
    },
    /// Change a collection's replication factor (or minimum in sync): the
    /// controller copies shards to more nodes, or removes extra copies.
    SetReplication {
        name: String,
        /// Copies wanted of every shard (default: unchanged).
        #[arg(long, default_value_t = 0)]
        replication_factor: u32,
        /// Below this many in-sync copies a write is refused (default:
        /// unchanged, or the factor if that is lower).
        #[arg(long, default_value_t = 0)]
        min_in_sync: u32,
        /// Return at once instead of when every shard holds the factor's copies.
        #[arg(long)]
        no_wait: bool,
    },
}

fn main() -> anyhow::Result<()> {
    // `shoalctl dev --etcd` runs the roles as processes of this program.
    if let Some(ran) = shoal_ops::procs::run_role_if_asked() {
        return ran;
    }
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Demo(_) | Command::Dev { .. }) {
        // A reader that stops early (`shoalctl status | grep -q X`, `| head`)
        // ends this command quietly, as it would any Unix tool, instead of
        // a panic on "failed printing to stdout". Not for the commands that
        // run servers in this process.
        // SAFETY: at the start of main, before any thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // The embedded cluster sets up the process's telemetry itself (logs
    // included, and traces when OTEL_EXPORTER_OTLP_ENDPOINT is set).
    if !matches!(cli.command, Command::Demo(_) | Command::Dev { .. }) {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
            .init();
    }
    ctl::set_credentials(ctl::Credentials { api_key: cli.api_key.clone(), tls: cli.tls_ca.clone().map(shoal_server::ClientTls::with_ca) });
    match cli.command {
        Command::Demo(args) => demo::run(args).await,
        Command::Tls(TlsCommand::Init { out, hosts }) => {
            let c = shoal_ops::security::make_cluster_certs(&out, &hosts)?;
            println!("wrote {} (the CA; ca-key.pem beside it signs more: keep it off the servers)", c.ca.display());
            println!("  shard nodes:  {} {}", c.node_cert.display(), c.node_key.display());
            println!("  coordinators: {} {}", c.coordinator_cert.display(), c.coordinator_key.display());
            println!("see docs/security.md for the config that uses them");
            Ok(())
        }
        Command::Keys(KeysCommand::New { name, role, collections, keys_file }) => {
            anyhow::ensure!(matches!(role.as_str(), "read" | "write" | "admin"), "--role must be read, write or admin, not {role:?}");
            let (key, hash) = shoal_ops::security::new_api_key();
            let entry = shoal_ops::security::key_entry_toml(&name, &hash, &role, &collections);
            eprintln!("API key for {name} (shown once; the coordinator keeps only its hash):");
            println!("{key}");
            match keys_file {
                Some(file) => {
                    shoal_ops::security::add_key_entry(&file, &name, &entry)?;
                    eprintln!("added to {}", file.display());
                }
                None => eprint!("\nadd to the coordinator's keys file:\n\n{entry}"),
            }
            Ok(())
        }
        Command::Keys(KeysCommand::Revoke { name, keys_file }) => {
            shoal_ops::security::remove_key_entry(&keys_file, &name)?;
            println!("removed {name} from {}", keys_file.display());
            Ok(())
        }
        Command::Keys(KeysCommand::Hash) => {
            let mut key = String::new();
            std::io::stdin().read_line(&mut key)?;
            println!("{}", shoal_ops::security::sha256_hex(key.trim()));
            Ok(())
        }
        Command::Dev {
            data_dir,
            shard_nodes,
            port,
            etcd: Some(etcd),
            etcd_prefix,
            etcd_ca,
            etcd_cert,
            etcd_key,
            coordinators,
            tls_dir,
            keys_file,
        } => {
            anyhow::ensure!(
                tls_dir.is_none() && keys_file.is_none(),
                "--tls-dir and --keys-file work in process only, not with --etcd (give the processes a config file: docs/security.md)"
            );
            let tls = shoal_control::config::EtcdTls { ca_file: etcd_ca, cert_file: etcd_cert, key_file: etcd_key };
            dev_processes(data_dir, shard_nodes, port, etcd, etcd_prefix, tls, coordinators).await
        }
        Command::Dev { data_dir, shard_nodes, port, etcd: None, etcd_ca, etcd_cert, etcd_key, tls_dir, keys_file, .. } => {
            anyhow::ensure!(
                etcd_ca.is_none() && etcd_cert.is_none() && etcd_key.is_none(),
                "--etcd-ca, --etcd-cert and --etcd-key go with --etcd"
            );
            dev(data_dir, shard_nodes, port, tls_dir, keys_file).await
        }
        Command::Status => ctl::status(&cli.endpoint).await,
        Command::Top { interval, once } => {
            anyhow::ensure!(interval > 0.0 && interval.is_finite(), "--interval must be a positive number of seconds");
            top::run(&cli.endpoint, std::time::Duration::from_secs_f64(interval), !once).await
        }
        Command::Collections(c) => collections(&cli.endpoint, c).await,
        Command::Ingest(a) => shoal_ops::ingest::run(&cli.endpoint, a).await.map(|_| ()),
        Command::Search(a) => points::search(&cli.endpoint, a).await,
        Command::Count(a) => points::count(&cli.endpoint, a).await,
        Command::Scroll(a) => points::scroll(&cli.endpoint, a).await,
        Command::Delete(a) => points::delete(&cli.endpoint, a).await,
        Command::Index(c) => points::index(&cli.endpoint, c).await,
        Command::Snapshot(c) => snapshots::run(&cli.endpoint, c).await,
        Command::Node(c) => placement::node(&cli.endpoint, c).await,
        Command::Shard(c) => placement::shard(&cli.endpoint, c).await,
        Command::Rebalance { dry_run, no_wait, timeout } => placement::rebalance(&cli.endpoint, dry_run, no_wait, timeout).await,
        Command::ProtoDescriptor { output } => {
            std::fs::write(&output, shoal_proto::FILE_DESCRIPTOR_SET)?;
            println!("wrote {} (grpcurl -protoset {} ...)", output.display(), output.display());
            Ok(())
        }
    }
}

async fn dev(data_dir: PathBuf, shard_nodes: usize, port: u16, tls_dir: Option<PathBuf>, keys_file: Option<PathBuf>) -> anyhow::Result<()> {
    let mut cfg = EmbeddedConfig::ephemeral(&data_dir, shard_nodes);
    if let Some(dir) = &tls_dir {
        cfg.use_tls(dir);
    }
    cfg.coordinator.auth.keys_file = keys_file;
    cfg.coordinator_listen = ([127, 0, 0, 1], port).into();
    // Port 0: every process on a free port (tests, several dev clusters).
    cfg.first_shard_port = if port == 0 { 0 } else { port + 1 };
    let cluster = EmbeddedCluster::start(cfg).await?;
    println!("shoal dev cluster up; data in {}", data_dir.display());
    let scheme = if tls_dir.is_some() { "https" } else { "http" };
    println!("  coordinator  {scheme}://{}", cluster.coordinator.addr);
    for (i, a) in cluster.node_addrs().iter().enumerate() {
        println!("  shard-{i}      {scheme}://{a}");
    }
    println!();
    let at = cluster.endpoint().trim_start_matches("http://").to_owned();
    println!("try:  grpcurl -plaintext {at} list");
    println!(
        "      grpcurl -plaintext -d '{{\"name\":\"docs\",\"dimension\":3,\"metric\":\"COSINE\"}}' {at} shoal.v1.Shoal/CreateCollection"
    );
    println!("      shoalctl status");
    println!("Ctrl-C stops it (queued batches commit first).");
    tokio::signal::ctrl_c().await?;
    println!("stopping: committing queued batches, closing shards");
    cluster.shutdown().await?;
    println!("stopped");
    Ok(())
}

/// `shoalctl dev --etcd`: shard nodes and coordinators as processes of
/// this program, on loopback, sharing one etcd prefix and one snapshot
/// directory (moves seed from snapshots).
async fn dev_processes(
    data_dir: PathBuf,
    shard_nodes: usize,
    port: u16,
    etcd: String,
    prefix: String,
    etcd_tls: shoal_control::config::EtcdTls,
    coordinators: usize,
) -> anyhow::Result<()> {
    use shoal_ops::procs::{ClusterSpec, Launcher, ProcessCluster};
    anyhow::ensure!(shard_nodes >= 1 && coordinators >= 1, "--shard-nodes and --coordinators must be at least 1");
    let mut spec = ClusterSpec::new(Launcher::Roles(std::env::current_exe()?), &data_dir, shard_nodes);
    spec.etcd = Some((etcd.clone(), prefix.clone()));
    spec.etcd_tls = etcd_tls;
    spec.coordinators = coordinators;
    spec.first_coordinator_port = (port != 0).then_some(port);
    let cluster = tokio::task::spawn_blocking(move || ProcessCluster::start(&spec)).await??;
    println!("shoal dev cluster up on etcd {etcd} (prefix {prefix}); data, logs and snapshots in {}", data_dir.display());
    for c in std::iter::once(&cluster.coordinator).chain(&cluster.more_coordinators) {
        println!("  {:<13} {} (pid {})", c.id, c.endpoint(), c.pid());
    }
    for n in &cluster.nodes {
        println!("  {:<13} {} (pid {})", n.id, n.endpoint(), n.pid());
    }
    println!();
    println!("try:  shoalctl node list; shoalctl shard move docs/0; shoalctl node drain shard-1; shoalctl rebalance --dry-run");
    println!("      kill -9 <pid> to see a node or the controller die");
    println!("Ctrl-C stops them all (SIGTERM: queued batches commit first).");
    tokio::signal::ctrl_c().await?;
    println!("stopping");
    tokio::task::spawn_blocking(move || {
        for p in cluster.nodes.iter().chain(std::iter::once(&cluster.coordinator)).chain(&cluster.more_coordinators) {
            if let Ok(None) = p.exited() {
                let _ = p.terminate();
            }
        }
    })
    .await?;
    println!("stopped");
    Ok(())
}

async fn collections(endpoint: &str, c: Collections) -> anyhow::Result<()> {
    let mut client = ctl::connect(endpoint).await?;
    match c {
        Collections::List => {
            let list = client.list_collections(v1::ListCollectionsRequest {}).await?.into_inner();
            // The list holds what the placement says; points and shard
            // states need each collection's shards asked.
            for c in &list.collections {
                match client.describe_collection(v1::DescribeCollectionRequest { name: c.name.clone() }).await {
                    Ok(live) => ctl::print_collection(&live.into_inner()),
                    Err(e) => {
                        ctl::print_collection(c);
                        println!("  (points unknown: {:?}: {})", e.code(), e.message());
                    }
                }
            }
            if list.collections.is_empty() {
                println!("no collections");
            }
        }
        Collections::Describe { name } => {
            let c = client.describe_collection(v1::DescribeCollectionRequest { name }).await?.into_inner();
            ctl::print_collection(&c);
        }
        Collections::Create { name, dimension, metric, shards, m, ef_construction, replication_factor, min_in_sync, indexes } => {
            let metric = ctl::parse_metric(&metric)? as i32;
            let index = Some(v1::IndexParams { m, ef_construction });
            let field_indexes = indexes.iter().map(|s| points::parse_index(s)).collect::<anyhow::Result<_>>()?;
            let req = v1::CreateCollectionRequest {
                name,
                dimension,
                metric,
                shard_count: shards,
                index,
                replication_factor,
                min_in_sync,
                field_indexes,
            };
            let c = client.create_collection(req).await?.into_inner();
            ctl::print_collection(&c);
            if !c.field_indexes.is_empty() {
                points::print_indexes(&c);
            }
        }
        Collections::SetReplication { name, replication_factor, min_in_sync, no_wait } => {
            let req = v1::SetReplicationRequest { collection: name, replication_factor, min_in_sync, wait: !no_wait };
            let c = client.set_replication(req).await?.into_inner();
            ctl::print_collection(&c);
        }
        Collections::Drop { name } => {
            client.drop_collection(v1::DropCollectionRequest { name: name.clone() }).await?;
            println!("dropped {name}");
        }
    }
    Ok(())
}
