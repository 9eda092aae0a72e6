//! `shoalctl tls init` and `shoalctl keys new`: the files a secured cluster
//! needs, made the way docs/security.md describes.

use std::io::Write;
use std::path::{Path, PathBuf};

use rand::RngCore;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};

/// What `tls init` wrote.
#[derive(Clone, Debug)]
pub struct ClusterCerts {
    /// The cluster's CA certificate: what every process trusts.
    pub ca: PathBuf,
    /// Shard nodes' certificate and key (server only).
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
    /// Coordinators' certificate and key: served to clients and presented
    /// to shard nodes (mutual TLS), so it is good for both.
    pub coordinator_cert: PathBuf,
    pub coordinator_key: PathBuf,
}

/// A new CA in `dir` and certificates signed by it for shard nodes and
/// coordinators, valid for `hosts` (names or IPs) besides `localhost` and
/// `127.0.0.1`. The CA's key is written too (`ca-key.pem`), to sign more
/// later: keep it off the servers.
pub fn make_cluster_certs(dir: &Path, hosts: &[String]) -> anyhow::Result<ClusterCerts> {
    std::fs::create_dir_all(dir)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "shoal cluster CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate()?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;
    write(&dir.join("ca.pem"), ca.pem().as_bytes(), false)?;
    write(&dir.join("ca-key.pem"), ca_key_pem.as_bytes(), true)?;

    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into()];
    names.extend(hosts.iter().filter(|h| !names.contains(h)).cloned().collect::<Vec<_>>());
    let leaf = |file: &str, cn: &str, usages: Vec<ExtendedKeyUsagePurpose>| -> anyhow::Result<(PathBuf, PathBuf)> {
        let mut p = CertificateParams::new(names.clone())?;
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages = usages;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &ca)?;
        let (cert_path, key_path) = (dir.join(format!("{file}.pem")), dir.join(format!("{file}-key.pem")));
        write(&cert_path, cert.pem().as_bytes(), false)?;
        write(&key_path, key.serialize_pem().as_bytes(), true)?;
        Ok((cert_path, key_path))
    };
    let (node_cert, node_key) = leaf("node", "shoal shard node", vec![ExtendedKeyUsagePurpose::ServerAuth])?;
    let (coordinator_cert, coordinator_key) =
        leaf("coordinator", "shoal coordinator", vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth])?;
    Ok(ClusterCerts { ca: dir.join("ca.pem"), node_cert, node_key, coordinator_cert, coordinator_key })
}

/// A new API key and the hex SHA-256 the coordinator stores instead: 32
/// random bytes, so the key cannot be guessed and a plain hash is enough.
pub fn new_api_key() -> (String, String) {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let key = format!("shoal_{}", hex(&bytes));
    let hash = sha256_hex(&key);
    (key, hash)
}

/// Hex SHA-256 of `key`, as the `sha256` of a key entry.
pub fn sha256_hex(key: &str) -> String {
    use sha2::Digest;
    hex(&sha2::Sha256::digest(key.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key entry for the coordinator's keys file.
pub fn key_entry_toml(name: &str, hash: &str, role: &str, collections: &[String]) -> String {
    let mut s = format!("[[keys]]\nname = {name:?}\nsha256 = {hash:?}\nrole = {role:?}\n");
    if !collections.is_empty() {
        s.push_str(&format!("collections = {collections:?}\n"));
    }
    s
}

/// Appends `entry` (a `[[keys]]` table named `name`) to the keys file,
/// refusing a name already there.
pub fn add_key_entry(file: &Path, name: &str, entry: &str) -> anyhow::Result<()> {
    let text = if file.exists() { std::fs::read_to_string(file)? } else { String::new() };
    anyhow::ensure!(!key_names(&text, file)?.iter().any(|n| n == name), "{} already has a key named {name:?}", file.display());
    let sep = if text.is_empty() || text.ends_with("\n\n") {
        ""
    } else if text.ends_with('\n') {
        "\n"
    } else {
        "\n\n"
    };
    replace_file(file, &format!("{text}{sep}{entry}"))
}

/// Removes the entry named `name` from the keys file.
pub fn remove_key_entry(file: &Path, name: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let mut doc: toml::Table = toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let keys =
        doc.get_mut("keys").and_then(toml::Value::as_array_mut).ok_or_else(|| anyhow::anyhow!("{} has no [[keys]]", file.display()))?;
    let before = keys.len();
    keys.retain(|k| k.get("name").and_then(toml::Value::as_str) != Some(name));
    anyhow::ensure!(keys.len() < before, "{} has no key named {name:?}", file.display());
    replace_file(file, &toml::to_string(&doc)?)
}

fn key_names(text: &str, file: &Path) -> anyhow::Result<Vec<String>> {
    let doc: toml::Table = toml::from_str(text).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    Ok(doc
        .get("keys")
        .and_then(toml::Value::as_array)
        .map(|ks| ks.iter().filter_map(|k| k.get("name").and_then(toml::Value::as_str).map(str::to_owned)).collect())
        .unwrap_or_default())
}

/// Writes a new file beside `file` and renames it over: a coordinator
/// re-reading the file never sees half of it.
fn replace_file(file: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = file.with_extension("toml.tmp");
    write(&tmp, text.as_bytes(), true)?;
    std::fs::rename(&tmp, file).map_err(|e| anyhow::anyhow!("cannot replace {}: {e}", file.display()))?;
    Ok(())
}

fn write(path: &Path, bytes: &[u8], secret: bool) -> anyhow::Result<()> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    f.write_all(bytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_hash_as_the_coordinator_checks() {
        let (a, ha) = new_api_key();
        let (b, _) = new_api_key();
        assert_ne!(a, b);
        assert!(a.starts_with("shoal_") && a.len() == 70);
        assert_eq!(ha, shoal_coordinator::auth::hash_hex(&a));
        let entry = key_entry_toml("job", &ha, "write", &["docs".into()]);
        let parsed: toml::Value = toml::from_str(&entry).unwrap();
        assert_eq!(parsed["keys"][0]["collections"][0].as_str(), Some("docs"));
    }

    #[test]
    fn auth_keys_files_gain_and_lose_entries_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys.toml");
        for (name, role) in [("ops", "admin"), ("ui", "read")] {
            let (_, hash) = new_api_key();
            add_key_entry(&file, name, &key_entry_toml(name, &hash, role, &[])).unwrap();
        }
        assert!(add_key_entry(&file, "ui", "").is_err(), "a second key of one name");
        remove_key_entry(&file, "ops").unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(key_names(&text, &file).unwrap(), vec!["ui".to_owned()]);
        assert!(remove_key_entry(&file, "ops").is_err());
    }

    #[test]
    fn tls_certs_are_pem_files_and_keys_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let c = make_cluster_certs(dir.path(), &["node-1.example".into()]).unwrap();
        for p in [&c.ca, &c.node_cert, &c.coordinator_cert] {
            assert!(std::fs::read_to_string(p).unwrap().starts_with("-----BEGIN CERTIFICATE-----"));
        }
        let mode = std::fs::metadata(&c.node_key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "a private key readable by others: {mode:o}");
    }
}
