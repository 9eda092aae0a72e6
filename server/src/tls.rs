//! TLS on listeners and on the channels between shoal processes.
//!
//! Files are PEM, read when a listener starts or a channel is made, so a
//! wrong path or a key that does not parse stops the process at start with
//! the file named, not at the first connection. Certificates are checked by
//! rustls (through tonic, with the aws-lc provider the object store's HTTP
//! client already brings in).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// TLS of a listener (`[coordinator.listener.tls]`,
/// `[shard_node.listener.tls]`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// The certificate chain the listener presents (PEM).
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// CA certificates (PEM). When set, a client must present a certificate
    /// signed by one of them or the handshake fails (mutual TLS): what a
    /// shard node sets, so that only the cluster's coordinators call it.
    pub client_ca_file: Option<PathBuf>,
}

/// A TLS handshake not finished within this is abandoned: a client that
/// opens a connection and stalls would otherwise hold a task and a socket.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

impl ServerTls {
    /// tonic's server TLS settings, from the files.
    pub fn load(&self) -> anyhow::Result<ServerTlsConfig> {
        let cert = read_pem(&self.cert_file, "certificate (cert_file)")?;
        let key = read_pem(&self.key_file, "private key (key_file)")?;
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key)).timeout(HANDSHAKE_TIMEOUT);
        if let Some(ca) = &self.client_ca_file {
            config = config.client_ca_root(Certificate::from_pem(read_pem(ca, "client CA (client_ca_file)")?));
        }
        Ok(config)
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.client_ca_file.is_some()
    }
}

/// TLS of the channels a process opens to others (`[coordinator.peers.tls]`
/// for the coordinator's channels to shard nodes; `shoalctl --tls-ca` for
/// the CLI's channel to a coordinator).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// CA certificates (PEM) that signed the servers' certificates. A server
    /// whose certificate does not chain to one of them is refused.
    pub ca_file: PathBuf,
    /// This process's own certificate (PEM), presented to servers that
    /// require one (shard nodes with `client_ca_file`) ...
    pub cert_file: Option<PathBuf>,
    /// ... and its private key.
    pub key_file: Option<PathBuf>,
    /// The name the servers' certificates are checked against, when it is
    /// not the host of the address dialled (e.g. every node presents a
    /// certificate for `shard-node.shoal` and is dialled by IP).
    pub domain_name: Option<String>,
}

impl ClientTls {
    /// Only the CA: enough to reach a server that does not ask for a client
    /// certificate.
    pub fn with_ca(ca_file: impl Into<PathBuf>) -> Self {
        ClientTls { ca_file: ca_file.into(), cert_file: None, key_file: None, domain_name: None }
    }

    /// tonic's channel TLS settings, from the files.
    pub fn load(&self) -> anyhow::Result<ClientTlsConfig> {
        let ca = read_pem(&self.ca_file, "CA certificate (ca_file)")?;
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                let cert = read_pem(cert, "client certificate (cert_file)")?;
                let key = read_pem(key, "client private key (key_file)")?;
                config = config.identity(Identity::from_pem(cert, key));
            }
            (None, None) => {}
            (Some(_), None) | (None, Some(_)) => anyhow::bail!("TLS: cert_file and key_file go together; one of them is missing"),
        }
        if let Some(name) = &self.domain_name {
            config = config.domain_name(name.clone());
        }
        Ok(config)
    }
}

/// `url` with the scheme TLS needs: tonic speaks TLS only to `https://`
/// URLs, while addresses in configs and etcd are written `host:port` or
/// `http://host:port`.
pub fn https(url: &str) -> String {
    match url.split_once("://") {
        Some(("https", _)) => url.to_owned(),
        Some((_, rest)) => format!("https://{rest}"),
        None => format!("https://{url}"),
    }
}

/// Refuses plain text on an address other machines can reach: anyone on
/// the network could read the vectors and call every RPC. Loopback stays
/// plain by default (one machine, the demo, the tests); `insecure` is the
/// operator saying the network is private.
pub fn check_plain_text(addr: SocketAddr, tls: bool, insecure: bool) -> anyhow::Result<()> {
    if tls || addr.ip().is_loopback() {
        return Ok(());
    }
    if insecure {
        tracing::warn!(%addr, "serving plain text on a non-loopback address (insecure = true): anyone who reaches it can read and change data");
        return Ok(());
    }
    anyhow::bail!(
        "refusing to serve plain text on {addr}, which other machines can reach: configure listener.tls \
         (cert_file, key_file; client_ca_file on shard nodes), or pass --insecure (listener.insecure = true) \
         if the network is private"
    )
}

fn read_pem(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    let bytes = std::fs::read(path).with_context(|| format!("TLS {what}: cannot read {}", path.display()))?;
    anyhow::ensure!(bytes.windows(11).any(|w| w == b"-----BEGIN "), "TLS {what}: {} holds no PEM block (-----BEGIN ...)", path.display());
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_https_rewrites_every_form_of_address() {
        assert_eq!(https("127.0.0.1:7701"), "https://127.0.0.1:7701");
        assert_eq!(https("http://10.0.0.7:7701"), "https://10.0.0.7:7701");
        assert_eq!(https("https://node.shoal:7701"), "https://node.shoal:7701");
    }

    #[test]
    fn tls_plain_text_is_refused_off_loopback_unless_insecure() {
        let lo: SocketAddr = "127.0.0.1:7700".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7700".parse().unwrap();
        let lan: SocketAddr = "10.1.2.3:7700".parse().unwrap();
        assert!(check_plain_text(lo, false, false).is_ok());
        assert!(check_plain_text("[::1]:7700".parse().unwrap(), false, false).is_ok());
        let err = check_plain_text(any, false, false).unwrap_err().to_string();
        assert!(err.contains("0.0.0.0:7700") && err.contains("--insecure"), "{err}");
        assert!(check_plain_text(lan, false, false).is_err());
        assert!(check_plain_text(lan, true, false).is_ok());
        assert!(check_plain_text(lan, false, true).is_ok());
    }

    #[test]
    fn tls_missing_and_non_pem_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, b"not a certificate").unwrap();
        let t = ServerTls { cert_file: dir.path().join("absent.pem"), key_file: junk.clone(), client_ca_file: None };
        let err = format!("{:#}", t.load().unwrap_err());
        assert!(err.contains("absent.pem") && err.contains("cert_file"), "{err}");
        let t = ServerTls { cert_file: junk.clone(), key_file: junk.clone(), client_ca_file: None };
        let err = format!("{:#}", t.load().unwrap_err());
        assert!(err.contains("junk.pem") && err.contains("no PEM block"), "{err}");
        let c = ClientTls { ca_file: junk.clone(), cert_file: Some(junk), key_file: None, domain_name: None };
        assert!(c.load().is_err());
    }
}
