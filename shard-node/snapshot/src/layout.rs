//! Object keys of the store, and snapshot ids.
//!
//! ```text
//! chunks/<blake3 of the raw chunk, 64 hex>          compressed chunk (zstd frame)
//! snapshots/<collection>/<shard>/<id>.json          manifest: the publish
//! inflight/<collection>.<shard>.<id>.json           marker while a snapshot uploads
//! ```
//!
//! Chunks are shared by every shard and collection of the store, so equal
//! regions are stored once whoever wrote them first.

use object_store::path::Path;

use crate::error::{Result, SnapshotError};

pub(crate) const CHUNKS: &str = "chunks";
pub(crate) const SNAPSHOTS: &str = "snapshots";
pub(crate) const INFLIGHT: &str = "inflight";

pub(crate) fn chunk_key(hash: &str) -> Path {
    Path::from(format!("{CHUNKS}/{hash}"))
}

pub(crate) fn manifest_key(collection: &str, shard: u32, id: &str) -> Path {
    Path::from(format!("{SNAPSHOTS}/{collection}/{shard}/{id}.json"))
}

pub(crate) fn collection_prefix(collection: &str) -> Path {
    Path::from(format!("{SNAPSHOTS}/{collection}"))
}

pub(crate) fn inflight_key(collection: &str, shard: u32, id: &str) -> Path {
    Path::from(format!("{INFLIGHT}/{collection}.{shard}.{id}.json"))
}

/// `(collection, shard, id)` of a manifest key, None for other objects.
pub(crate) fn parse_manifest_key(key: &Path) -> Option<(String, u32, String)> {
    let mut parts = key.as_ref().split('/');
    let (root, collection, shard, file) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if root != SNAPSHOTS || parts.next().is_some() {
        return None;
    }
    let id = file.strip_suffix(".json")?;
    Some((collection.to_owned(), shard.parse().ok()?, id.to_owned()))
}

/// Checks a snapshot id: 1 to 64 characters of `[A-Za-z0-9._-]`, not
/// starting with a dot (ids become object keys and file names).
pub fn validate_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(SnapshotError::Invalid(format!("snapshot id {id:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ - and not start with a dot")))
    }
}

/// Checks a collection name as it appears in keys (the service validates
/// names already; this keeps the library safe on its own).
pub(crate) fn validate_collection(name: &str) -> Result<()> {
    let ok = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    if ok { Ok(()) } else { Err(SnapshotError::Invalid(format!("collection name {name:?} is not valid"))) }
}

/// A new id: the UTC time to the millisecond, so ids sort by creation,
/// and a random suffix so two coordinators never collide.
pub fn new_snapshot_id() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{}-{:04x}", utc_stamp(now.as_millis() as u64), rand::random::<u16>())
}

/// `YYYYMMDDTHHMMSS.mmmZ` for milliseconds since the epoch.
pub(crate) fn utc_stamp(ms: u64) -> String {
    let (secs, millis) = (ms / 1000, ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{millis:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Howard Hinnant's `civil_from_days`: (year, month, day) of a day count
/// since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { era * 400 + yoe + 1 } else { era * 400 + yoe }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_utc_and_sort_like_time() {
        assert_eq!(utc_stamp(0), "19700101T000000.000Z");
        assert_eq!(utc_stamp(951_782_400_123), "20000229T000000.123Z");
        assert_eq!(utc_stamp(1_795_478_400_000), "20261124T000000.000Z");
        assert!(utc_stamp(1_000) < utc_stamp(86_400_000));
        validate_id(&new_snapshot_id()).unwrap();
    }

    #[test]
    fn ids_cannot_escape_their_directory() {
        for bad in ["", ".", "..", "../x", "a/b", "a b", &"x".repeat(65)] {
            assert!(validate_id(bad).is_err(), "{bad:?}");
        }
        validate_id("20261123T101010.000Z-00ff").unwrap();
    }

    #[test]
    fn manifest_keys_parse_back() {
        let k = manifest_key("docs", 3, "abc");
        assert_eq!(parse_manifest_key(&k), Some(("docs".into(), 3, "abc".into())));
        assert_eq!(parse_manifest_key(&chunk_key("00")), None);
        assert_eq!(parse_manifest_key(&Path::from("snapshots/docs/x/abc.json")), None);
    }
}
