//! Where the control plane lives, as coordinators and shard nodes are told
//! (`[coordinator.cluster]`, `[shard_node.cluster]`).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The etcd cluster that holds membership and placement. With no
/// endpoints, the process runs without one: a coordinator keeps metadata in
/// memory with the shard nodes of its configuration, a shard node does not
/// register.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd client URLs, e.g. `["http://10.0.0.5:2379"]`; `https://` ones
    /// are dialled with TLS (see `tls`).
    pub etcd: Vec<String>,
    /// Every key of this cluster lives under it, so several clusters (or
    /// tests) can share one etcd.
    pub prefix: String,
    /// A node (or the controller) that stops renewing its lease disappears
    /// this long after its last renewal.
    pub lease_ttl_ms: u64,
    /// Longest wait for one etcd call; an unreachable etcd fails calls
    /// after this instead of hanging them.
    pub call_timeout_ms: u64,
    /// TLS to etcd (`[*.cluster.tls]`), for `https://` endpoints.
    pub tls: EtcdTls,
}

/// TLS to etcd: which CA its server certificate must chain to and the
/// certificate this process presents to an etcd started with
/// `--client-cert-auth`. Every file is PEM and read when the store
/// connects (at start), so a wrong path stops the process there, named.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdTls {
    /// CA certificates that signed etcd's server certificate (etcd's
    /// `--trusted-ca-file` usually names the same). Without it an
    /// `https://` endpoint is checked against the system's roots.
    pub ca_file: Option<PathBuf>,
    /// This process's client certificate (etcd's `--client-cert-auth`
    /// requires one signed by its `--trusted-ca-file`; it must allow client
    /// authentication) ...
    pub cert_file: Option<PathBuf>,
    /// ... and its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
}

impl EtcdTls {
    /// Whether any file is given: then the endpoints must be `https://`.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            etcd: Vec::new(),
            prefix: "/shoal/default".into(),
            lease_ttl_ms: 10_000,
            call_timeout_ms: 2_000,
            tls: EtcdTls::default(),
        }
    }
}

impl ClusterConfig {
    pub fn uses_etcd(&self) -> bool {
        !self.etcd.is_empty()
    }

    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms.max(1_000))
    }

    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms.max(1))
    }
}

/// The `--etcd*` flags of both binaries. They are
/// nested keys of the configuration, which figment cannot merge from a
/// flat flag struct, so they are applied after it.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdFlags {
    /// etcd endpoints holding membership and placement (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Key prefix of the cluster in etcd.
    #[arg(long)]
    pub etcd_prefix: Option<String>,
    /// CA certificate (PEM) that signed etcd's server certificate
    /// (cluster.tls.ca_file); without it `https://` endpoints are checked
    /// against the system's roots.
    #[arg(long, value_name = "PEM")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for an etcd that requires one
    /// (cluster.tls.cert_file; `--client-cert-auth`).
    #[arg(long, value_name = "PEM")]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM; cluster.tls.key_file).
    #[arg(long, value_name = "PEM")]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdFlags {
    /// Overrides what the file and the environment said with the flags given.
    pub fn apply(&self, cfg: &mut ClusterConfig) {
        if !self.etcd.is_empty() {
            cfg.etcd = self.etcd.clone();
        }
        if let Some(p) = &self.etcd_prefix {
            cfg.prefix = p.clone();
        }
        if let Some(ca) = &self.etcd_ca {
            cfg.tls.ca_file = Some(ca.clone());
        }
        if let Some(cert) = &self.etcd_cert {
            cfg.tls.cert_file = Some(cert.clone());
        }
        if let Some(key) = &self.etcd_key {
            cfg.tls.key_file = Some(key.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        etcd: EtcdFlags,
    }

    #[test]
    fn etcd_tls_flags_override_the_file() {
        let mut cfg = ClusterConfig {
            tls: EtcdTls { ca_file: Some("/file/ca.pem".into()), cert_file: Some("/file/c.pem".into()), key_file: None },
            ..ClusterConfig::default()
        };
        let cli =
            Cli::try_parse_from(["x", "--etcd", "https://a:2379,https://b:2379", "--etcd-ca", "/flag/ca.pem", "--etcd-key", "/flag/k.pem"])
                .unwrap();
        cli.etcd.apply(&mut cfg);
        assert_eq!(cfg.etcd, ["https://a:2379", "https://b:2379"]);
        let expected =
            EtcdTls { ca_file: Some("/flag/ca.pem".into()), cert_file: Some("/file/c.pem".into()), key_file: Some("/flag/k.pem".into()) };
        assert_eq!(cfg.tls, expected);
        // Without the flags, the file's settings stay.
        let mut kept = ClusterConfig { tls: expected.clone(), ..ClusterConfig::default() };
        Cli::try_parse_from(["x"]).unwrap().etcd.apply(&mut kept);
        assert_eq!(kept.tls, expected);
    }
}
