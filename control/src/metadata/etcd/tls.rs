//! TLS to etcd: which endpoints are dialled how, and rustls' settings
//! (through tonic, with the aws-lc provider the rest of shoal uses) from
//! the files of `cluster.tls`.
//!
//! Everything that can be checked without etcd is checked here, before
//! the first connection, so a wrong path, a file that holds no PEM (or the
//! wrong PEM: a key where a certificate belongs), a certificate without
//! its key or a key that does not match it fails the store's `connect`
//! with the file and the setting named.

use std::path::Path;
use std::time::Duration;

use etcd_client::{Certificate, Identity, TlsOptions};
use tokio_rustls::rustls::RootCertStore;
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::pki_types::pem::PemObject;

use crate::config::EtcdTls;
use crate::metadata::MetaError;

/// The endpoints with their scheme, as etcd-client dials them, and the
/// TLS settings when they are `https://`.
///
/// `https://` endpoints use TLS, `http://` ones do not; an endpoint
/// without a scheme uses TLS when `cluster.tls` names any file. All the
/// endpoints must be of one kind, and files in `cluster.tls` with
/// `http://` endpoints are refused: a certificate configured for a
/// connection that would ignore it is a mistake to report, not to skip.
pub(super) fn endpoints(
    given: &[String],
    tls: &EtcdTls,
    handshake_timeout: Duration,
) -> Result<(Vec<String>, Option<TlsOptions>), MetaError> {
    let mut urls = Vec::with_capacity(given.len());
    let mut first: Option<(&str, bool)> = None;
    for endpoint in given {
        let e = endpoint.trim();
        let (secure, url) = match e.split_once("://") {
            Some(("https", _)) => (true, e.to_owned()),
            Some(("http", _)) => (false, e.to_owned()),
            Some((scheme, _)) => {
                return Err(MetaError::Invalid(format!("etcd endpoint {e:?}: expected http:// or https://, not {scheme}://")));
            }
            None => {
                let secure = tls.is_set();
                (secure, format!("{}://{e}", if secure { "https" } else { "http" }))
            }
        };
        match first {
            None => first = Some((e, secure)),
            Some((other, was)) if was != secure => {
                return Err(MetaError::Invalid(format!(
                    "etcd endpoints {other:?} and {e:?} mix TLS (https://) and plain text (http://): give them all one scheme"
                )));
            }
            Some(_) => {}
        }
        if !secure && tls.is_set() {
            return Err(MetaError::Invalid(format!(
                "cluster.tls names {} but etcd endpoint {e:?} is plain text: write https://{} to reach etcd over TLS, \
                 or remove cluster.tls",
                files(tls),
                e.strip_prefix("http://").unwrap_or(e)
            )));
        }
        urls.push(url);
    }
    let secure = first.is_some_and(|(_, secure)| secure);
    let options = if secure { Some(options(tls, handshake_timeout)?) } else { None };
    Ok((urls, options))
}

/// The client TLS settings from the files, checked as far as they can be
/// without etcd.
fn options(tls: &EtcdTls, handshake_timeout: Duration) -> Result<TlsOptions, MetaError> {
    let mut options = TlsOptions::new().timeout(handshake_timeout);
    options = match &tls.ca_file {
        Some(ca) => {
            let pem = read_pem(ca, "CA certificate (cluster.tls.ca_file)", "CERTIFICATE")?;
            // tonic skips certificates it cannot use: a broken CA file
            // would only show as every handshake failing.
            check_roots(&pem).map_err(|e| {
                MetaError::Invalid(format!("TLS CA certificate (cluster.tls.ca_file) {} does not parse: {e}", ca.display()))
            })?;
            options.ca_certificate(Certificate::from_pem(pem))
        }
        None => options.with_native_roots(),
    };
    check(&options).map_err(|e| match &tls.ca_file {
        Some(ca) => MetaError::Invalid(format!("TLS CA certificate (cluster.tls.ca_file) {} does not parse: {e}", ca.display())),
        None => MetaError::Invalid(format!(
            "etcd is dialled over https:// without a CA (cluster.tls.ca_file, --etcd-ca), and the system's root \
             certificates cannot be used: {e}"
        )),
    })?;
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let cert_pem = read_pem(cert, "client certificate (cluster.tls.cert_file)", "CERTIFICATE")?;
            let key_pem = read_pem(key, "client private key (cluster.tls.key_file)", "PRIVATE KEY")?;
            options = options.identity(Identity::from_pem(cert_pem, key_pem));
            check(&options).map_err(|e| {
                MetaError::Invalid(format!(
                    "TLS client certificate {} (cluster.tls.cert_file) and key {} (cluster.tls.key_file) cannot be used \
                     together: {e}",
                    cert.display(),
                    key.display()
                ))
            })?;
        }
        (None, None) => {}
        (Some(cert), None) => {
            return Err(MetaError::Invalid(format!(
                "TLS client certificate {} (cluster.tls.cert_file, --etcd-cert) is given without its private key \
                 (cluster.tls.key_file, --etcd-key)",
                cert.display()
            )));
        }
        (None, Some(key)) => {
            return Err(MetaError::Invalid(format!(
                "TLS client private key {} (cluster.tls.key_file, --etcd-key) is given without its certificate \
                 (cluster.tls.cert_file, --etcd-cert)",
                key.display()
            )));
        }
    }
    Ok(options)
}

/// Builds what tonic would build for a connection (the root store, the
/// client certificate and key) without connecting: every file that does
/// not parse, and a key that is not the certificate's, fails here.
fn check(options: &TlsOptions) -> Result<(), String> {
    tonic::transport::Endpoint::from_static("https://etcd.invalid")
        .tls_config(options.clone())
        .map(drop)
        .map_err(|e| causes(e.to_string(), std::error::Error::source(&e)))
}

/// Every certificate of a CA file, as rustls takes it into a root store.
fn check_roots(pem: &[u8]) -> Result<(), String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        roots.add(cert.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `path`'s bytes, which must hold a PEM block of `kind` (`CERTIFICATE`,
/// or `PRIVATE KEY` for any kind of key).
fn read_pem(path: &Path, what: &str, kind: &str) -> Result<Vec<u8>, MetaError> {
    let bytes = std::fs::read(path).map_err(|e| MetaError::Invalid(format!("TLS {what}: cannot read {}: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&bytes);
    if !text.contains("-----BEGIN ") {
        return Err(MetaError::Invalid(format!("TLS {what}: {} holds no PEM block (-----BEGIN ...)", path.display())));
    }
    let has_kind = text.lines().any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{kind}-----")));
    if !has_kind {
        return Err(MetaError::Invalid(format!("TLS {what}: {} holds no {kind} PEM block (-----BEGIN ...{kind}-----)", path.display())));
    }
    Ok(bytes)
}

fn files(tls: &EtcdTls) -> String {
    [("ca_file", &tls.ca_file), ("cert_file", &tls.cert_file), ("key_file", &tls.key_file)]
        .into_iter()
        .filter_map(|(key, file)| file.as_ref().map(|f| format!("{key} {}", f.display())))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `text` followed by the errors that caused it, each once: tonic's
/// transport errors say only "transport error" and keep what happened (a
/// certificate that does not verify, an alert from etcd) in their sources.
pub(super) fn causes(mut text: String, mut source: Option<&(dyn std::error::Error + 'static)>) -> String {
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    const T: Duration = Duration::from_secs(2);

    fn invalid(r: Result<(Vec<String>, Option<TlsOptions>), MetaError>) -> String {
        match r {
            Err(MetaError::Invalid(e)) => e,
            Err(e) => panic!("not Invalid: {e:?}"),
            Ok((urls, tls)) => panic!("accepted: {urls:?}, TLS: {}", tls.is_some()),
        }
    }

    fn ends(given: &[&str], tls: &EtcdTls) -> Result<(Vec<String>, Option<TlsOptions>), MetaError> {
        endpoints(&given.iter().map(|s| s.to_string()).collect::<Vec<_>>(), tls, T)
    }

    /// A certificate (self-signed, for localhost) and its key, as files.
    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let (cert, key) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}-key.pem")));
        std::fs::write(&cert, c.cert.pem()).unwrap();
        std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    #[test]
    fn etcd_tls_endpoints_take_tls_from_their_scheme() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = pair(dir.path(), "ca");
        let with_ca = EtcdTls { ca_file: Some(ca.clone()), ..EtcdTls::default() };
        let none = EtcdTls::default();

        let (urls, tls) = ends(&["http://10.0.0.5:2379", "10.0.0.6:2379"], &none).unwrap();
        assert_eq!(urls, ["http://10.0.0.5:2379", "http://10.0.0.6:2379"]);
        assert!(tls.is_none());
        let (urls, tls) = ends(&["https://10.0.0.5:2379", "10.0.0.6:2379"], &with_ca).unwrap();
        assert_eq!(urls, ["https://10.0.0.5:2379", "https://10.0.0.6:2379"]);
        assert!(tls.is_some());
        // https:// without a CA: the system's roots (or, on a system without
        // any, an error that says so).
        match ends(&["https://etcd.example:2379"], &none) {
            Ok((_, tls)) => assert!(tls.is_some()),
            Err(e) => assert!(e.to_string().contains("system's root certificates"), "{e}"),
        }

        let err = invalid(ends(&["http://10.0.0.5:2379"], &with_ca));
        assert!(err.contains("plain text") && err.contains("write https://10.0.0.5:2379") && err.contains("ca.pem"), "{err}");
        let err = invalid(ends(&["https://a:2379", "http://b:2379"], &none));
        assert!(err.contains("\"https://a:2379\"") && err.contains("\"http://b:2379\"") && err.contains("mix"), "{err}");
        let err = invalid(ends(&["unix:///run/etcd.sock"], &none));
        assert!(err.contains("unix://"), "{err}");
    }

    #[test]
    fn etcd_tls_bad_files_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, ca_key) = pair(dir.path(), "ca");
        let (cert, key) = pair(dir.path(), "client");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let broken = dir.path().join("broken.pem");
        std::fs::write(&broken, "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n").unwrap();
        let url = ["https://127.0.0.1:2379"];
        let good = EtcdTls { ca_file: Some(ca.clone()), cert_file: Some(cert.clone()), key_file: Some(key.clone()) };
        assert!(ends(&url, &good).unwrap().1.is_some());

        let cases: Vec<(EtcdTls, &[&str])> = vec![
            (
                EtcdTls { ca_file: Some(dir.path().join("absent.pem")), ..good.clone() },
                &["absent.pem", "cluster.tls.ca_file", "cannot read"],
            ),
            (EtcdTls { ca_file: Some(junk.clone()), ..good.clone() }, &["junk.pem", "cluster.tls.ca_file", "no PEM block"]),
            (EtcdTls { ca_file: Some(ca_key.clone()), ..good.clone() }, &["ca-key.pem", "cluster.tls.ca_file", "no CERTIFICATE PEM block"]),
            (EtcdTls { ca_file: Some(broken.clone()), ..good.clone() }, &["broken.pem", "cluster.tls.ca_file", "does not parse"]),
            (EtcdTls { cert_file: Some(junk.clone()), ..good.clone() }, &["junk.pem", "cluster.tls.cert_file", "no PEM block"]),
            (EtcdTls { key_file: Some(cert.clone()), ..good.clone() }, &["client.pem", "cluster.tls.key_file", "no PRIVATE KEY PEM block"]),
            (EtcdTls { key_file: Some(ca_key.clone()), ..good.clone() }, &["client.pem", "ca-key.pem", "cannot be used together"]),
            (EtcdTls { cert_file: Some(broken.clone()), ..good.clone() }, &["broken.pem", "client-key.pem", "cannot be used together"]),
            (EtcdTls { key_file: None, ..good.clone() }, &["client.pem", "without its private key", "--etcd-key"]),
            (EtcdTls { cert_file: None, ..good.clone() }, &["client-key.pem", "without its certificate", "--etcd-cert"]),
        ];
        for (tls, words) in cases {
            let err = invalid(ends(&url, &tls));
            eprintln!("{err}");
            for w in words {
                assert!(err.contains(w), "{tls:?}: {w:?} not in {err}");
            }
        }
    }
}
