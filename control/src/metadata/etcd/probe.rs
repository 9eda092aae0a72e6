//! Why etcd refused a connection, when the gRPC error does not say.
//!
//! Some refusals reach the client as a broken pipe: etcd with
//! `--client-cert-auth` ends a TLS 1.3 handshake without a client
//! certificate by an alert, which arrives after the client has finished
//! its side of the handshake and may be lost to the write that follows;
//! a plain-text client on a TLS port is simply hung up on. When the store
//! cannot make its first call, it asks once more with a handshake of its
//! own, and says what that shows: an alert, a certificate that does not
//! verify, or that the plain-text endpoint speaks TLS.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::crypto::{CryptoProvider, aws_lc_rs};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::config::EtcdTls;

/// What a handshake of this process's own with `url` shows, in a sentence
/// for an error message; `None` if it shows nothing wrong (or etcd cannot
/// be reached at all, which the original error already says).
pub(super) async fn diagnose(url: &str, tls: &EtcdTls, limit: Duration) -> Option<String> {
    let (secure, rest) = match url.split_once("://") {
        Some(("https", rest)) => (true, rest),
        Some((_, rest)) => (false, rest),
        None => (false, url),
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h).trim_start_matches('[').trim_end_matches(']').to_owned();
    let probe = async {
        let tcp = TcpStream::connect(authority).await.ok()?;
        if secure { after_handshake(tcp, host, tls).await } else { speaks_tls(tcp, host, url).await }
    };
    tokio::time::timeout(limit, probe).await.ok().flatten()
}

/// A TLS client's view: the handshake fails (etcd's certificate does not
/// verify), or etcd ends the connection right after it (an alert about
/// this client's certificate, or none given).
async fn after_handshake(tcp: TcpStream, host: String, tls: &EtcdTls) -> Option<String> {
    let config = client_config(tls)?;
    let name = ServerName::try_from(host.clone()).ok()?;
    let mut stream = match TlsConnector::from(Arc::new(config)).connect(name, tcp).await {
        Ok(s) => s,
        Err(e) => {
            let trusted = match &tls.ca_file {
                Some(ca) => format!("the CA in {} (cluster.tls.ca_file)", ca.display()),
                None => "one of the system's root certificates (no cluster.tls.ca_file is given)".to_owned(),
            };
            return Some(format!(
                "the TLS handshake with etcd failed ({e}): etcd's certificate must be signed by {trusted} \
                 and name the host dialled, {host}"
            ));
        }
    };
    // etcd sends nothing more unless asked; an alert comes at once.
    let mut byte = [0u8; 1];
    let said = match tokio::time::timeout(Duration::from_millis(500), stream.read(&mut byte)).await {
        Err(_) | Ok(Ok(1..)) => return None,
        Ok(Ok(0)) => "it closed the connection".to_owned(),
        Ok(Err(e)) => e.to_string(),
    };
    Some(match &tls.cert_file {
        None => format!(
            "etcd refused the connection after the TLS handshake ({said}): it requires a client certificate \
             (--client-cert-auth); give one signed by its --trusted-ca-file (cluster.tls.cert_file and key_file, \
             --etcd-cert and --etcd-key)"
        ),
        Some(cert) => format!(
            "etcd refused the client certificate {} after the TLS handshake ({said}): it must be signed by a CA in \
             etcd's --trusted-ca-file and allow client authentication",
            cert.display()
        ),
    })
}

/// Whether a plain-text endpoint answers a TLS hello like a TLS server.
async fn speaks_tls(tcp: TcpStream, host: String, url: &str) -> Option<String> {
    // No roots: the handshake stops at etcd's certificate, which is all
    // this needs to see.
    let config = builder()?.with_root_certificates(RootCertStore::empty()).with_no_client_auth();
    let name = ServerName::try_from(host).ok()?;
    let err = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.err()?;
    // A certificate came back (and was not trusted): a TLS server.
    let is_tls = err
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<tokio_rustls::rustls::Error>())
        .is_some_and(|e| matches!(e, tokio_rustls::rustls::Error::InvalidCertificate(_)));
    is_tls.then(|| {
        format!(
            "etcd at {url} speaks TLS, not plain text: write https://{} and give etcd's CA (cluster.tls.ca_file, \
             --etcd-ca)",
            url.strip_prefix("http://").unwrap_or(url)
        )
    })
}

/// The settings tonic makes from the same files (`tls::options` has
/// checked them already).
fn client_config(tls: &EtcdTls) -> Option<ClientConfig> {
    let mut roots = RootCertStore::empty();
    match &tls.ca_file {
        Some(ca) => {
            let pem = std::fs::read(ca).ok()?;
            roots.add_parsable_certificates(CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok));
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let builder = builder()?.with_root_certificates(roots);
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let cert = std::fs::read(cert).ok()?;
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert).filter_map(Result::ok).collect();
            let key = PrivateKeyDer::from_pem_slice(&std::fs::read(key).ok()?).ok()?;
            builder.with_client_auth_cert(chain, key).ok()
        }
        _ => Some(builder.with_no_client_auth()),
    }
}

/// rustls' builder with the provider tonic uses: the process's default,
/// or aws-lc.
fn builder() -> Option<tokio_rustls::rustls::ConfigBuilder<ClientConfig, tokio_rustls::rustls::WantsVerifier>> {
    let provider = CryptoProvider::get_default().cloned().unwrap_or_else(|| Arc::new(aws_lc_rs::default_provider()));
    ClientConfig::builder_with_provider(provider).with_safe_default_protocol_versions().ok()
}
