//! Where snapshots live, from a URL: a local directory or an S3 bucket.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::prefix::PrefixStore;
use object_store::{BackoffConfig, RetryConfig};

use crate::error::{Result, SnapshotError};

/// An opened snapshot store: every snapshot of every shard that uses the
/// same URL shares its chunks. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SnapshotStore {
    pub(crate) store: Arc<dyn ObjectStore>,
    /// The URL without its query (which may hold credentials).
    display: String,
}

impl SnapshotStore {
    /// Opens the store named by `url`:
    ///
    /// - a path (`./shoal-data/snapshots`, `/var/lib/shoal/snapshots`) or
    ///   `file:///absolute/path`: a local directory, created if missing;
    /// - `s3://bucket/optional/prefix`: an S3 bucket. Settings come from the
    ///   usual `AWS_*` environment variables (`AWS_ENDPOINT`, `AWS_REGION`,
    ///   `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, ...), overridden by
    ///   query parameters named like object_store's S3 keys
    ///   (`?endpoint=http://127.0.0.1:9000&region=us-east-1`). With an
    ///   explicit endpoint, requests are path-style (what S3-compatible
    ///   servers expect) and plain `http://` is allowed.
    pub fn open(url: &str) -> Result<SnapshotStore> {
        let bad = |reason: String| SnapshotError::BadUrl { url: url.to_owned(), reason };
        if let Some(rest) = url.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(bad("a file URL needs an absolute path (file:///path); give a plain path for a relative one".into()));
            }
            return Self::local(Path::new(rest), url);
        }
        if url.starts_with("s3://") {
            return Self::s3(url);
        }
        if url.contains("://") {
            return Err(bad("supported schemes are file:// and s3:// (or a plain directory path)".into()));
        }
        if url.is_empty() {
            return Err(bad("empty".into()));
        }
        Self::local(Path::new(url), url)
    }

    /// Wraps an object store built elsewhere.
    pub fn from_object_store(store: Arc<dyn ObjectStore>, description: impl Into<String>) -> SnapshotStore {
        SnapshotStore { store, display: description.into() }
    }

    /// The store's URL, without query parameters.
    pub fn url(&self) -> &str {
        &self.display
    }

    fn local(path: &Path, url: &str) -> Result<SnapshotStore> {
        let abs: PathBuf =
            if path.is_absolute() { path.to_owned() } else { std::env::current_dir().map_err(|e| SnapshotError::io(".", e))?.join(path) };
        std::fs::create_dir_all(&abs).map_err(|e| SnapshotError::io(&abs, e))?;
        // fsync every object (and its directory): a manifest must never
        // be durable before the chunks it names.
        let store = LocalFileSystem::new_with_prefix(&abs)
            .map_err(|e| SnapshotError::BadUrl { url: url.to_owned(), reason: e.to_string() })?
            .with_fsync(true);
        Ok(SnapshotStore { store: Arc::new(store), display: format!("file://{}", abs.display()) })
    }

    fn s3(url: &str) -> Result<SnapshotStore> {
        let bad = |reason: String| SnapshotError::BadUrl { url: redact(url), reason };
        let parsed = url::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let bucket = parsed.host_str().filter(|b| !b.is_empty()).ok_or_else(|| bad("no bucket name".into()))?;
        let prefix = parsed.path().trim_matches('/').to_owned();
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let mut path_style_set = false;
        for (k, v) in parsed.query_pairs() {
            let key: AmazonS3ConfigKey = k.parse().map_err(|_| bad(format!("unknown S3 setting {k:?} in the query")))?;
            path_style_set |= key == AmazonS3ConfigKey::VirtualHostedStyleRequest;
            builder = builder.with_config(key, v.into_owned());
        }
        if let Some(endpoint) = builder.get_config_value(&AmazonS3ConfigKey::Endpoint) {
            if endpoint.starts_with("http://") {
                builder = builder.with_allow_http(true);
            }
            if !path_style_set {
                builder = builder.with_virtual_hosted_style_request(false);
            }
        }
        // Bounded retries: a restore that cannot reach the store should say
        // so within a minute, not after object_store's default 3 minutes.
        let retry = RetryConfig { backoff: BackoffConfig::default(), max_retries: 5, retry_timeout: Duration::from_secs(60) };
        let s3 = builder.with_retry(retry).build().map_err(|e| bad(e.to_string()))?;
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() { Arc::new(s3) } else { Arc::new(PrefixStore::new(s3, prefix.as_str())) };
        let display = format!("s3://{bucket}/{prefix}");
        Ok(SnapshotStore { store, display })
    }
}

/// The URL without its query, for messages (the query may carry keys).
fn redact(url: &str) -> String {
    match url.split_once('?') {
        Some((base, _)) => format!("{base}?…"),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_before_anything_is_used() {
        for (url, why) in [
            ("", "empty"),
            ("gs://bucket", "supported schemes"),
            ("file://relative/path", "absolute path"),
            ("s3:///prefix", "no bucket"),
            ("s3://bucket/p?not_a_setting=1", "unknown S3 setting"),
        ] {
            let err = SnapshotStore::open(url).unwrap_err();
            assert!(matches!(err, SnapshotError::BadUrl { .. }), "{url}: {err}");
            assert!(err.to_string().contains(why), "{url}: {err}");
        }
    }

    #[test]
    fn local_paths_and_file_urls_open_the_same_directory() {
        let dir = tempfile::tempdir().unwrap();
        let a = SnapshotStore::open(dir.path().join("s").to_str().unwrap()).unwrap();
        let b = SnapshotStore::open(&format!("file://{}", dir.path().join("s").display())).unwrap();
        assert_eq!(a.url(), b.url());
        assert!(dir.path().join("s").is_dir());
    }

    #[test]
    fn s3_urls_take_their_settings_from_the_query() {
        let s =
            SnapshotStore::open("s3://bucket/some/prefix?endpoint=http://127.0.0.1:1&region=eu-west-1&access_key_id=a&secret_access_key=b")
                .unwrap();
        assert_eq!(s.url(), "s3://bucket/some/prefix");
        let err = SnapshotStore::open("s3://bucket?secret_access_key=hunter2&bogus=1").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "secrets leak into messages: {err}");
    }
}
