//! Silent damage as a disk makes it: one bit flipped in a shard copy's
//! data file, behind LMDB's back. The chaos run and the damage tests find
//! a value by its bytes (a vector of a Euclidean collection is stored as
//! sent) and flip a bit in the middle of it; the node's scrub is what must
//! notice.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Every `data.mdb` under a shard node's data directory, those of
/// `collection` only when it is given.
pub fn data_files(node_dir: &Path, collection: Option<&str>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(collections) = std::fs::read_dir(node_dir.join("shards")) else { return out };
    for c in collections.flatten() {
        if collection.is_some_and(|name| c.file_name() != name) {
            continue;
        }
        for s in std::fs::read_dir(c.path()).into_iter().flatten().flatten() {
            let f = s.path().join("data.mdb");
            if f.exists() {
                out.push(f);
            }
        }
    }
    out.sort();
    out
}

/// Flips one bit in the middle of every place `needle` occurs in the
/// first of `files` that holds it; returns that file and how many places.
/// Every place, because a value can also sit in a page LMDB has freed but
/// not yet reused: the live one is among them.
pub fn flip_where(files: &[PathBuf], needle: &[u8]) -> std::io::Result<Option<(PathBuf, usize)>> {
    if needle.is_empty() {
        return Ok(None);
    }
    for file in files {
        let bytes = std::fs::read(file)?;
        let at: Vec<usize> = bytes.windows(needle.len()).enumerate().filter(|(_, w)| *w == needle).map(|(i, _)| i).collect();
        if at.is_empty() {
            continue;
        }
        let f = std::fs::OpenOptions::new().write(true).open(file)?;
        for i in &at {
            let j = i + needle.len() / 2;
            f.write_all_at(&[bytes[j] ^ 0x04], j as u64)?;
        }
        return Ok(Some((file.clone(), at.len())));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_needle_is_flipped_wherever_it_is_and_only_there() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("shards").join("docs").join("0");
        std::fs::create_dir_all(&shard).unwrap();
        let file = shard.join("data.mdb");
        let mut bytes = vec![0u8; 64];
        bytes[10..14].copy_from_slice(b"abcd");
        bytes[40..44].copy_from_slice(b"abcd");
        std::fs::write(&file, &bytes).unwrap();
        let files = data_files(dir.path(), Some("docs"));
        assert_eq!(files, vec![file.clone()]);
        assert!(data_files(dir.path(), Some("other")).is_empty());
        assert_eq!(flip_where(&files, b"abcd").unwrap(), Some((file.clone(), 2)));
        let after = std::fs::read(&file).unwrap();
        let changed: Vec<usize> = (0..64).filter(|&i| after[i] != bytes[i]).collect();
        assert_eq!(changed, vec![12, 42]);
        assert_eq!(after[12], b'c' ^ 0x04);
        assert_eq!(flip_where(&files, b"abcd").unwrap(), None);
    }
}
