//! API keys for the public `shoal.v1.Shoal` service (`[coordinator.auth]`).
//!
//! A caller sends `authorization: Bearer <key>`. Keys are stored as the
//! SHA-256 of the key, never the key: they are long random strings made by
//! `shoalctl keys new`, so a fast hash is as good as a slow one (nothing to
//! guess) and costs a microsecond per call instead of argon2's tens of
//! milliseconds. Every stored hash is compared in constant time, so timing
//! tells nothing about how close a guess came.
//!
//! A key has a role (read < write < admin: each allows what the ones before
//! it do) and may be limited to some collections. Keys live in the config
//! (`keys`) and in a file (`keys_file`) that is read again when it changes,
//! so keys are added, rotated and revoked without a restart.
//!
//! With no key configured at all, every call is allowed: one machine, the
//! demo, the tests. A `keys_file` that exists but lists nothing refuses
//! everything (fail closed).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry::metrics::Counter;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::Status;
use tonic::metadata::MetadataMap;

/// What a key may do. Each role allows everything the ones before it do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Search, SearchBatch, Get, DescribeCollection, ListCollections,
    /// ClusterStatus, GetOffsets, ListSnapshots, GetSnapshotProgress.
    Read,
    /// Also Ingest, Upsert, Delete: what a batch ingest job needs.
    Write,
    /// Also create and drop collections, snapshots and restores, moves,
    /// drains, rebalances, repairs, replication.
    Admin,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }
}

/// One key, as the config and the keys file list it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    /// Who holds it: in logs and metrics instead of the key.
    pub name: String,
    /// Hex SHA-256 of the key (`shoalctl keys new` prints it; or
    /// `printf %s "$KEY" | sha256sum`).
    pub sha256: String,
    pub role: Role,
    /// The collections it may touch; empty: all of them, and the cluster
    /// wide commands (drain, rebalance).
    #[serde(default)]
    pub collections: Vec<String>,
}

/// `[coordinator.auth]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Keys in the config itself.
    pub keys: Vec<KeyEntry>,
    /// A TOML file of `[[keys]]` entries, read at start (a bad file stops
    /// the start) and again within a second of each change (a bad file
    /// then keeps the keys read before, and says why in the log).
    pub keys_file: Option<PathBuf>,
}

impl AuthConfig {
    /// Whether calls need a key.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty() || self.keys_file.is_some()
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: Vec<KeyEntry>,
}

/// A key, ready to check.
#[derive(Debug)]
struct StoredKey {
    name: String,
    hash: [u8; 32],
    role: Role,
    /// None: every collection.
    collections: Option<HashSet<String>>,
}

impl StoredKey {
    fn parse(e: &KeyEntry) -> anyhow::Result<StoredKey> {
        let hash = parse_hash(&e.sha256).ok_or_else(|| {
            anyhow::anyhow!("key {:?}: sha256 must be 64 hex digits (the SHA-256 of the key), got {} characters", e.name, e.sha256.len())
        })?;
        anyhow::ensure!(!e.name.is_empty(), "a key has no name");
        let collections = (!e.collections.is_empty()).then(|| e.collections.iter().cloned().collect());
        Ok(StoredKey { name: e.name.clone(), hash, role: e.role, collections })
    }
}

/// The keys in force, swapped whole when the keys file changes.
pub struct Auth {
    enabled: bool,
    inline: Vec<KeyEntry>,
    file: Option<PathBuf>,
    keys: RwLock<Arc<Vec<Arc<StoredKey>>>>,
}

/// Who is calling: a key, or anyone when no keys are configured.
#[derive(Clone, Debug)]
pub struct Principal(Option<Arc<StoredKey>>);

impl Auth {
    /// Every call allowed.
    pub fn open() -> Arc<Auth> {
        Arc::new(Auth { enabled: false, inline: Vec::new(), file: None, keys: RwLock::new(Arc::new(Vec::new())) })
    }

    /// The keys of `cfg`, the file read now.
    pub fn from_config(cfg: &AuthConfig) -> anyhow::Result<Arc<Auth>> {
        let auth =
            Auth { enabled: cfg.enabled(), inline: cfg.keys.clone(), file: cfg.keys_file.clone(), keys: RwLock::new(Arc::new(Vec::new())) };
        auth.reload()?;
        Ok(Arc::new(auth))
    }

    fn reload(&self) -> anyhow::Result<usize> {
        let mut entries = self.inline.clone();
        if let Some(path) = &self.file {
            entries.extend(read_keys_file(path)?);
        }
        let mut keys = Vec::with_capacity(entries.len());
        let mut names = HashSet::new();
        for e in &entries {
            anyhow::ensure!(names.insert(e.name.as_str()), "two keys are named {:?}", e.name);
            keys.push(Arc::new(StoredKey::parse(e)?));
        }
        let n = keys.len();
        *self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
        Ok(n)
    }

    /// Reads the keys file again whenever it changes (checked every
    /// second), until the returned task is aborted.
    pub fn watch(self: &Arc<Self>) -> Option<tokio::task::JoinHandle<()>> {
        let path = self.file.clone()?;
        let auth = Arc::downgrade(self);
        Some(tokio::spawn(async move {
            let mut seen = stamp(&path);
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(auth) = auth.upgrade() else { return };
                let now = stamp(&path);
                if now == seen {
                    continue;
                }
                seen = now;
                let path2 = path.clone();
                let auth2 = Arc::clone(&auth);
                match tokio::task::spawn_blocking(move || auth2.reload()).await {
                    Ok(Ok(n)) => tracing::info!(file = %path2.display(), keys = n, "API keys read again"),
                    Ok(Err(e)) => {
                        tracing::error!(file = %path2.display(), error = %format!("{e:#}"), "API keys file not taken; the keys read before stay in force")
                    }
                    Err(e) => tracing::error!(error = %e, "reading the API keys file failed"),
                }
            }
        }))
    }

    /// The caller of a request, from its `authorization` metadata:
    /// UNAUTHENTICATED without a key or with one that is not known.
    pub fn authenticate(&self, md: &MetadataMap, rpc: &'static str) -> Result<Principal, Status> {
        if !self.enabled {
            return Ok(Principal(None));
        }
        let Some(value) = md.get("authorization") else {
            return Err(refused(Refusal::NoKey, rpc, None));
        };
        let Some(key) = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).map(str::trim) else {
            return Err(refused(Refusal::Malformed, rpc, None));
        };
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let keys = Arc::clone(&self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner));
        // Every stored hash is compared, whether or not one matched already.
        let mut found = None;
        for k in keys.iter() {
            if bool::from(k.hash.ct_eq(&hash)) {
                found = Some(Arc::clone(k));
            }
        }
        found.map(|k| Principal(Some(k))).ok_or_else(|| refused(Refusal::UnknownKey, rpc, None))
    }
}

impl Principal {
    /// PERMISSION_DENIED unless this caller's role reaches `need` and its
    /// scope covers `collection` (None: a command over the whole cluster,
    /// which needs a key without a collection list).
    pub fn allow(&self, need: Role, collection: Option<&str>, rpc: &'static str) -> Result<(), Status> {
        self.has_role(need, rpc)?;
        let Some(key) = &self.0 else { return Ok(()) };
        match (&key.collections, collection) {
            (None, _) => Ok(()),
            (Some(scope), Some(c)) if scope.contains(c) => Ok(()),
            (Some(_), Some(c)) => Err(refused(Refusal::Collection(c.to_owned()), rpc, Some(key))),
            (Some(_), None) => Err(refused(Refusal::ClusterWide, rpc, Some(key))),
        }
    }

    /// PERMISSION_DENIED unless this caller's role reaches `need`,
    /// whatever its collections (checked against them separately).
    pub fn has_role(&self, need: Role, rpc: &'static str) -> Result<(), Status> {
        match &self.0 {
            Some(key) if key.role < need => Err(refused(Refusal::Role { has: key.role, need }, rpc, Some(key))),
            Some(_) | None => Ok(()),
        }
    }

    /// Whether a listing shows this collection to the caller.
    pub fn sees(&self, collection: &str) -> bool {
        self.0.as_ref().is_none_or(|k| k.collections.as_ref().is_none_or(|s| s.contains(collection)))
    }
}

enum Refusal {
    NoKey,
    Malformed,
    UnknownKey,
    Role { has: Role, need: Role },
    Collection(String),
    ClusterWide,
}

/// The refusal's status, counted and logged (with the key's name, never
/// the key).
fn refused(why: Refusal, rpc: &'static str, key: Option<&StoredKey>) -> Status {
    let (reason, status) = match &why {
        Refusal::NoKey => {
            ("no_key", Status::unauthenticated(format!("{rpc} needs an API key: send the metadata `authorization: Bearer <key>`")))
        }
        Refusal::Malformed => {
            ("malformed", Status::unauthenticated("the authorization metadata must be `Bearer <key>` (ASCII)".to_owned()))
        }
        Refusal::UnknownKey => ("unknown_key", Status::unauthenticated("the API key is not known (revoked, or mistyped)".to_owned())),
        Refusal::Role { has, need } => (
            "role",
            Status::permission_denied(format!("{rpc} needs a key with role {} or more; this key has role {}", need.as_str(), has.as_str())),
        ),
        Refusal::Collection(c) => ("collection", Status::permission_denied(format!("this key may not touch collection {c:?}"))),
        Refusal::ClusterWide => (
            "cluster_wide",
            Status::permission_denied(format!("{rpc} acts on the whole cluster: it needs a key not limited to collections")),
        ),
    };
    refusals().add(1, &[KeyValue::new("reason", reason), KeyValue::new("rpc", rpc)]);
    tracing::warn!(rpc, reason, key = key.map_or("-", |k| k.name.as_str()), "call refused: {}", status.message());
    status
}

fn refusals() -> &'static Counter<u64> {
    static C: OnceLock<Counter<u64>> = OnceLock::new();
    C.get_or_init(|| {
        opentelemetry::global::meter("shoal")
            .u64_counter("shoal.auth.refused")
            .with_description("Calls refused for a missing, unknown or insufficient API key, by reason and RPC")
            .build()
    })
}

fn read_keys_file(path: &Path) -> anyhow::Result<Vec<KeyEntry>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("API keys file {}: {e}", path.display()))?;
    let file: KeysFile = toml::from_str(&text).map_err(|e| anyhow::anyhow!("API keys file {}: {e}", path.display()))?;
    Ok(file.keys)
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim().as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

/// Hex SHA-256 of a key, as `sha256` in a [`KeyEntry`].
pub fn hash_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(key: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", format!("Bearer {key}").parse().unwrap());
        m
    }

    fn entry(name: &str, key: &str, role: Role, collections: &[&str]) -> KeyEntry {
        KeyEntry { name: name.into(), sha256: hash_hex(key), role, collections: collections.iter().map(|c| (*c).to_owned()).collect() }
    }

    #[test]
    fn auth_roles_and_scopes_decide_and_unknown_keys_are_unauthenticated() {
        let cfg = AuthConfig {
            keys: vec![entry("reader", "r-key", Role::Read, &[]), entry("docs-admin", "a-key", Role::Admin, &["docs"])],
            keys_file: None,
        };
        let auth = Auth::from_config(&cfg).unwrap();
        assert_eq!(auth.authenticate(&MetadataMap::new(), "Search").unwrap_err().code(), tonic::Code::Unauthenticated);
        assert_eq!(auth.authenticate(&md("nope"), "Search").unwrap_err().code(), tonic::Code::Unauthenticated);
        let reader = auth.authenticate(&md("r-key"), "Search").unwrap();
        assert!(reader.allow(Role::Read, Some("docs"), "Search").is_ok());
        let denied = reader.allow(Role::Write, Some("docs"), "Upsert").unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(denied.message().contains("write"), "{}", denied.message());
        let admin = auth.authenticate(&md("a-key"), "DropCollection").unwrap();
        assert!(admin.allow(Role::Admin, Some("docs"), "DropCollection").is_ok());
        assert_eq!(admin.allow(Role::Read, Some("other"), "Search").unwrap_err().code(), tonic::Code::PermissionDenied);
        assert_eq!(admin.allow(Role::Admin, None, "Rebalance").unwrap_err().code(), tonic::Code::PermissionDenied);
        assert!(admin.sees("docs") && !admin.sees("other") && reader.sees("other"));
    }

    #[test]
    fn auth_off_allows_everything_and_bad_entries_stop_the_start() {
        let open = Auth::from_config(&AuthConfig::default()).unwrap();
        assert!(open.authenticate(&MetadataMap::new(), "DropCollection").unwrap().allow(Role::Admin, None, "Rebalance").is_ok());
        let bad = AuthConfig {
            keys: vec![KeyEntry { name: "x".into(), sha256: "abc".into(), role: Role::Read, collections: vec![] }],
            keys_file: None,
        };
        assert!(format!("{:#}", Auth::from_config(&bad).err().unwrap()).contains("64 hex digits"));
        let twice = AuthConfig { keys: vec![entry("x", "a", Role::Read, &[]), entry("x", "b", Role::Read, &[])], keys_file: None };
        assert!(Auth::from_config(&twice).is_err());
    }

    #[test]
    fn auth_an_empty_keys_file_refuses_everything_and_a_rewrite_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys.toml");
        std::fs::write(&file, "").unwrap();
        let auth = Auth::from_config(&AuthConfig { keys: vec![], keys_file: Some(file.clone()) }).unwrap();
        assert!(auth.authenticate(&MetadataMap::new(), "Search").is_err());
        assert!(auth.authenticate(&md("k1"), "Search").is_err());
        let e = entry("job", "k1", Role::Write, &[]);
        std::fs::write(&file, format!("[[keys]]\nname = {:?}\nsha256 = {:?}\nrole = \"write\"\n", e.name, e.sha256)).unwrap();
        auth.reload().unwrap();
        assert!(auth.authenticate(&md("k1"), "Search").is_ok());
        // A broken file is refused and the keys in force stay.
        std::fs::write(&file, "[[keys]]\nname = 3\n").unwrap();
        assert!(auth.reload().is_err());
        assert!(auth.authenticate(&md("k1"), "Search").is_ok());
    }
}
