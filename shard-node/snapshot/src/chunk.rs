//! Cutting the copy stream into fixed-size chunks, and each chunk's
//! compression, hash and checks.
//!
//! Chunks are cut at fixed offsets of the raw image and compressed one by
//! one, so a region of the environment that did not change between two
//! snapshots gives the same raw chunk, the same hash and the same object:
//! the second snapshot reuses it without compressing or uploading it. The
//! object's name is the BLAKE3 of the *raw* bytes (not of the compressed
//! ones) so that reuse does not depend on the zstd version or level, and so
//! that a restore checks the bytes that end up in `data.mdb`, end to end.

use std::io::Write;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::progress::Progress;

/// A raw chunk on its way from the copy to the uploaders.
pub(crate) struct RawChunk {
    pub(crate) index: usize,
    pub(crate) data: Vec<u8>,
}

/// The `Write` that the engine's copy writes into: fills chunk-size buffers
/// and hands each full one to the async side through a bounded channel, so
/// the copy waits (and memory stays bounded) when uploads fall behind.
pub(crate) struct ChunkWriter {
    tx: mpsc::Sender<RawChunk>,
    chunk_size: usize,
    buf: Vec<u8>,
    next: usize,
    progress: Arc<Progress>,
}

impl ChunkWriter {
    pub(crate) fn new(tx: mpsc::Sender<RawChunk>, chunk_size: usize, progress: Arc<Progress>) -> Self {
        ChunkWriter { tx, chunk_size, buf: Vec::with_capacity(chunk_size), next: 0, progress }
    }

    fn send(&mut self) -> std::io::Result<()> {
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(self.chunk_size));
        let len = data.len() as u64;
        // Called on a blocking thread (never inside the runtime).
        self.tx.blocking_send(RawChunk { index: self.next, data }).map_err(|_| std::io::Error::other("the upload stopped"))?;
        self.next += 1;
        self.progress.add_done(len);
        Ok(())
    }

    /// Sends the last, partial chunk.
    pub(crate) fn finish(mut self) -> std::io::Result<usize> {
        if !self.buf.is_empty() {
            self.send()?;
        }
        Ok(self.next)
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(self.chunk_size - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == self.chunk_size {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// BLAKE3 of raw bytes, lowercase hex.
pub(crate) fn hash(raw: &[u8]) -> String {
    blake3::hash(raw).to_hex().to_string()
}

/// One zstd frame with the content size and zstd's own checksum in it.
///
/// The whole chunk in one call: the streaming encoder fed the same bytes
/// compresses 128 KiB slices against an "external dictionary" of the
/// slices before it (`ZSTD_compressBlock_doubleFast_extDict_generic`, half
/// of a snapshot's compression samples in `perf`).
pub(crate) fn compress(raw: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    let mut c = zstd::bulk::Compressor::new(level)?;
    c.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
    c.set_parameter(zstd::zstd_safe::CParameter::ContentSizeFlag(true))?;
    c.compress(raw)
}

/// Decompresses a stored chunk and checks it against the manifest: the
/// length, then the BLAKE3 of the result. Err is the reason, for
/// [`crate::SnapshotError::ChunkCorrupt`].
#[cfg(test)]
pub(crate) fn decompress_checked(stored: &[u8], raw_len: u64, want_hash: &str) -> Result<Vec<u8>, String> {
    let cap = usize::try_from(raw_len)
        .ok()
        .and_then(|n| n.checked_add(1))
        .ok_or_else(|| format!("raw length {raw_len} does not fit in memory"))?;
    let mut raw = vec![0; cap];
    let n = decompress_checked_into(stored, raw_len, want_hash, &mut raw)?;
    raw.truncate(n);
    Ok(raw)
}

/// [`decompress_checked`] into the front of `out`, which must hold at least
/// `raw_len + 1` bytes (one more, so that an over-long frame is caught);
/// returns `raw_len`. A restore reuses one buffer per thread (aligned for
/// direct writes) instead of faulting in a fresh one per chunk.
pub(crate) fn decompress_checked_into(stored: &[u8], raw_len: u64, want_hash: &str, out: &mut [u8]) -> Result<usize, String> {
    let len = usize::try_from(raw_len).map_err(|_| format!("raw length {raw_len} does not fit in memory"))?;
    if out.len() <= len {
        return Err(format!("raw length {raw_len} exceeds the buffer"));
    }
    let n = zstd::bulk::Decompressor::new()
        .and_then(|mut d| d.decompress_to_buffer(stored, out))
        .map_err(|e| format!("does not decompress: {e}"))?;
    if n != len {
        return Err(format!("decompresses to {n} bytes, manifest says {raw_len}"));
    }
    let got = hash(&out[..n]);
    if got != want_hash {
        return Err(format!("BLAKE3 of the content is {got}"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_and_damage_is_caught() {
        let raw: Vec<u8> = (0..100_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        let h = hash(&raw);
        let stored = compress(&raw, 3).unwrap();
        assert!(stored.len() < raw.len() / 4);
        assert_eq!(decompress_checked(&stored, raw.len() as u64, &h).unwrap(), raw);
        assert_eq!(compress(&raw, 3).unwrap(), stored, "compression must be deterministic");

        let mut flipped = stored.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x40;
        assert!(decompress_checked(&flipped, raw.len() as u64, &h).is_err());
        assert!(decompress_checked(&stored[..stored.len() - 3], raw.len() as u64, &h).is_err());
        assert!(decompress_checked(&stored, raw.len() as u64 - 1, &h).unwrap_err().contains("manifest says"));
        assert!(decompress_checked(&stored, raw.len() as u64, &"0".repeat(64)).unwrap_err().contains("BLAKE3"));
    }

    #[test]
    fn the_writer_cuts_fixed_chunks_whatever_the_write_sizes() {
        let (tx, mut rx) = mpsc::channel(100);
        let progress = Arc::new(Progress::new(crate::progress::Operation::Snapshot));
        let mut w = ChunkWriter::new(tx, 10, Arc::clone(&progress));
        let data: Vec<u8> = (0..37u8).collect();
        for piece in data.chunks(7) {
            w.write_all(piece).unwrap();
        }
        assert_eq!(w.finish().unwrap(), 4);
        let mut got = Vec::new();
        while let Ok(c) = rx.try_recv() {
            assert_eq!(c.index, got.len());
            got.push(c.data);
        }
        assert_eq!(got.iter().map(Vec::len).collect::<Vec<_>>(), [10, 10, 10, 7]);
        assert_eq!(got.concat(), data);
        assert_eq!(progress.report().bytes_done, 37);
    }
}
