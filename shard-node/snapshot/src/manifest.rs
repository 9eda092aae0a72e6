//! The manifest: what one snapshot of one shard holds and where its bytes
//! are. Written last, so a snapshot exists exactly when its manifest does.

use serde::{Deserialize, Serialize};
use shoal_engine::{IndexParams, Metric};

use crate::error::{Result, SnapshotError};

/// Name in every manifest's `format` field.
pub const FORMAT: &str = "shoal-shard-snapshot";

/// Largest `chunk_size` a manifest may declare: what `SnapshotOptions`
/// accepts (1 GiB). A restore allocates a buffer of a chunk's raw length, so
/// the bound keeps a damaged or hostile manifest from sizing it.
pub const MAX_CHUNK_SIZE: u64 = 1 << 30;

/// Version this build writes and reads. Bump it for any change an older
/// reader must not ignore; readers refuse other versions with
/// [`SnapshotError::UnsupportedFormat`].
pub const FORMAT_VERSION: u64 = 1;

/// One snapshot of one shard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u64,
    /// Snapshot id (shared by the shards of one collection snapshot).
    pub id: String,
    /// Collection name.
    pub collection: String,
    /// Shard number.
    pub shard: u32,
    /// Shards of the collection when the snapshot was taken.
    pub shard_count: u32,
    /// Creation time, UTC, `YYYYMMDDTHHMMSS.mmmZ`.
    pub created_at: String,
    /// Creation time in milliseconds since the epoch.
    pub created_at_ms: u64,
    /// Creation parameters of the index.
    pub index: ParamsDoc,
    /// LMDB transaction id of the copied commit.
    pub txn_id: u64,
    /// Live points at that commit.
    pub points: u64,
    /// Tombstones at that commit.
    pub tombstones: u64,
    /// Highest applied offset of every source at that commit.
    pub offsets: Vec<OffsetDoc>,
    /// `plain` or `compact` (LMDB copy mode).
    pub copy_mode: String,
    /// How chunks are compressed.
    pub compression: CompressionDoc,
    /// Raw bytes per chunk (the last one may be shorter).
    pub chunk_size: u64,
    /// Size of the restored `data.mdb`.
    pub image_bytes: u64,
    /// Compressed bytes of all chunks.
    pub stored_bytes: u64,
    /// Chunks this snapshot uploaded (the others were in the store).
    pub uploaded_chunks: u64,
    /// Compressed bytes this snapshot uploaded.
    pub uploaded_bytes: u64,
    /// The image, in order.
    pub chunks: Vec<ChunkRef>,
}

/// Index parameters as stored in a manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamsDoc {
    /// Vector dimension.
    pub dim: u32,
    /// `cosine`, `dot` or `euclidean`.
    pub metric: String,
    /// HNSW M.
    pub m: u16,
    /// HNSW M0 (bottom layer).
    pub m0: u16,
    /// ef_construction.
    pub ef_construction: u32,
    /// Level seed.
    pub seed: u64,
}

/// A source's offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetDoc {
    /// Source name.
    pub source: String,
    /// Highest applied offset.
    pub offset: u64,
}

/// Compression of the chunks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompressionDoc {
    /// Always `zstd` in version 1.
    pub codec: String,
    /// zstd level.
    pub level: i32,
}

/// One chunk of the image.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// BLAKE3 of the raw (uncompressed) bytes, 64 lowercase hex digits; also
    /// the chunk's object name.
    pub hash: String,
    /// Uncompressed length.
    pub raw_len: u64,
    /// Length of the stored object.
    pub stored_len: u64,
}

impl ParamsDoc {
    pub(crate) fn of(p: &IndexParams) -> ParamsDoc {
        ParamsDoc { dim: p.dim, metric: p.metric.to_string(), m: p.m, m0: p.m0, ef_construction: p.ef_construction, seed: p.seed }
    }

    /// The engine's parameters (None if the metric is unknown).
    pub fn params(&self) -> Option<IndexParams> {
        let metric: Metric = self.metric.parse().ok()?;
        let mut p = IndexParams::new(self.dim, metric);
        p.m = self.m;
        p.m0 = self.m0;
        p.ef_construction = self.ef_construction;
        p.seed = self.seed;
        Some(p)
    }
}

/// Only the fields that say how to read the rest.
#[derive(Deserialize)]
struct Header {
    format: Option<String>,
    format_version: Option<u64>,
}

impl Manifest {
    /// Parses and checks a manifest read from `key`.
    pub fn parse(key: &str, bytes: &[u8]) -> Result<Manifest> {
        let bad = |reason: String| SnapshotError::BadManifest { key: key.to_owned(), reason };
        let header: Header = serde_json::from_slice(bytes).map_err(|e| bad(format!("not a JSON manifest: {e}")))?;
        if header.format.as_deref() != Some(FORMAT) {
            return Err(bad(format!("format is {:?}, not {FORMAT:?}", header.format)));
        }
        let found = header.format_version.ok_or_else(|| bad("no format_version".into()))?;
        if found != FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedFormat { key: key.to_owned(), found, supported: FORMAT_VERSION });
        }
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        m.check().map_err(bad)?;
        Ok(m)
    }

    /// The manifest as stored.
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings and numbers always serialises.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    fn check(&self) -> std::result::Result<(), String> {
        if self.compression.codec != "zstd" {
            return Err(format!("codec {:?} is not zstd", self.compression.codec));
        }
        if self.index.params().is_none() {
            return Err(format!("unknown metric {:?}", self.index.metric));
        }
        if self.chunk_size == 0 || self.chunk_size > MAX_CHUNK_SIZE {
            return Err(format!("chunk_size is {}, not 1 to {MAX_CHUNK_SIZE}", self.chunk_size));
        }
        // Sums in checked arithmetic: the numbers are whatever the object
        // says, and a wrapped sum could match a wrong total.
        let mut raw = 0u64;
        let mut stored = 0u64;
        for (i, c) in self.chunks.iter().enumerate() {
            if c.hash.len() != 64 || !c.hash.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                return Err(format!("chunk {i} has a malformed hash {:?}", c.hash));
            }
            let last = i + 1 == self.chunks.len();
            if c.raw_len == 0 || c.raw_len > self.chunk_size || (!last && c.raw_len != self.chunk_size) {
                return Err(format!("chunk {i} has raw_len {} with chunk_size {}", c.raw_len, self.chunk_size));
            }
            // A download is sized by `stored_len`: no zstd frame of the
            // chunk can be larger than zstd's bound for its raw length.
            let bound = zstd::zstd_safe::compress_bound(c.raw_len as usize) as u64;
            if c.stored_len == 0 || c.stored_len > bound {
                return Err(format!("chunk {i} has stored_len {}, not 1 to {bound} for raw_len {}", c.stored_len, c.raw_len));
            }
            raw = raw.checked_add(c.raw_len).ok_or_else(|| format!("chunks add up to more than {} bytes", u64::MAX))?;
            stored = stored.checked_add(c.stored_len).ok_or_else(|| format!("chunks add up to more than {} stored bytes", u64::MAX))?;
        }
        if raw != self.image_bytes {
            return Err(format!("chunks add up to {raw} bytes, image_bytes says {}", self.image_bytes));
        }
        if stored != self.stored_bytes {
            return Err(format!("chunks add up to {stored} stored bytes, stored_bytes says {}", self.stored_bytes));
        }
        Ok(())
    }

    /// Offset of each chunk in the image.
    pub fn chunk_offsets(&self) -> impl Iterator<Item = (usize, u64, &ChunkRef)> {
        // A checked manifest's offsets are below `image_bytes`; saturating
        // keeps an unchecked one from overflowing.
        self.chunks.iter().enumerate().map(move |(i, c)| (i, (i as u64).saturating_mul(self.chunk_size), c))
    }

    /// The offsets as pairs.
    pub fn offset_pairs(&self) -> Vec<(String, u64)> {
        self.offsets.iter().map(|o| (o.source.clone(), o.offset)).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        let p = IndexParams::new(8, Metric::Cosine);
        Manifest {
            format: FORMAT.into(),
            format_version: FORMAT_VERSION,
            id: "x".into(),
            collection: "docs".into(),
            shard: 0,
            shard_count: 1,
            created_at: "19700101T000000.000Z".into(),
            created_at_ms: 0,
            index: ParamsDoc::of(&p),
            txn_id: 1,
            points: 0,
            tombstones: 0,
            offsets: vec![OffsetDoc { source: "job".into(), offset: 3 }],
            copy_mode: "plain".into(),
            compression: CompressionDoc { codec: "zstd".into(), level: 3 },
            chunk_size: 10,
            image_bytes: 15,
            stored_bytes: 9,
            uploaded_chunks: 2,
            uploaded_bytes: 9,
            chunks: vec![
                ChunkRef { hash: "a".repeat(64), raw_len: 10, stored_len: 4 },
                ChunkRef { hash: "b".repeat(64), raw_len: 5, stored_len: 5 },
            ],
        }
    }

    #[test]
    fn manifests_round_trip() {
        let m = sample();
        assert_eq!(Manifest::parse("k", &m.to_json()).unwrap(), m);
        assert_eq!(m.index.params(), Some(IndexParams::new(8, Metric::Cosine)));
        let offs: Vec<u64> = m.chunk_offsets().map(|(_, o, _)| o).collect();
        assert_eq!(offs, [0, 10]);
    }

    #[test]
    fn other_versions_and_broken_manifests_are_refused_precisely() {
        let mut v2 = serde_json::to_value(sample()).unwrap();
        v2["format_version"] = 2.into();
        let err = Manifest::parse("k", v2.to_string().as_bytes()).unwrap_err();
        assert!(matches!(err, SnapshotError::UnsupportedFormat { found: 2, supported: 1, .. }), "{err}");

        type Breakage = Box<dyn Fn(&mut Manifest)>;
        let cases: Vec<(Breakage, &str)> = vec![
            (Box::new(|m| m.image_bytes = 16), "add up to 15 bytes"),
            (Box::new(|m| m.chunks[0].hash = "xyz".into()), "malformed hash"),
            (Box::new(|m| m.chunks[0].raw_len = 9), "raw_len 9"),
            (Box::new(|m| m.compression.codec = "lz4".into()), "not zstd"),
            (Box::new(|m| m.index.metric = "hamming".into()), "unknown metric"),
        ];
        for (break_it, why) in cases {
            let mut m = sample();
            break_it(&mut m);
            let err = Manifest::parse("k", &m.to_json()).unwrap_err();
            assert!(matches!(&err, SnapshotError::BadManifest { .. }) && err.to_string().contains(why), "{why}: {err}");
        }
        for junk in [&b"{"[..], b"[]", br#"{"format":"other","format_version":1}"#] {
            assert!(matches!(Manifest::parse("k", junk), Err(SnapshotError::BadManifest { .. })));
        }
    }
}
