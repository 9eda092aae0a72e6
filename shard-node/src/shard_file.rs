//! The file beside a shard's environment recording what the engine does
//! not: how many shards its collection has, and which copy of the shard
//! this is.
//!
//! The copy id is a random number given to a shard each time this node
//! creates or restores it. A coordinator that decided to drop a copy reads
//! its id first and names it in `DropShard`, so a drop that arrives after
//! another operation put a newer copy of the same shard on this node (a
//! move rolled back while the next attempt restores, a trimmed replica
//! copied back) is refused instead of deleting the newer copy.

use std::path::Path;

/// The file's name inside the shard's directory.
pub(crate) const SHARD_FILE: &str = "shard.json";

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ShardFile {
    pub(crate) shard_count: u32,
    /// 0 in files written before copies had ids; `read` gives those one.
    #[serde(default)]
    pub(crate) copy: u64,
}

impl ShardFile {
    /// A new copy of a shard of a collection of `shard_count` shards.
    pub(crate) fn new_copy(shard_count: u32) -> ShardFile {
        ShardFile { shard_count, copy: new_copy_id() }
    }
}

/// Never 0: 0 in a request means "whichever copy".
fn new_copy_id() -> u64 {
    loop {
        let id = rand::random::<u64>();
        if id != 0 {
            return id;
        }
    }
}

/// Reads the file in `dir`; a file without a copy id is given one (and
/// rewritten), so every served shard has one.
pub(crate) fn read(dir: &Path) -> anyhow::Result<ShardFile> {
    let path = dir.join(SHARD_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let mut f: ShardFile = serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("parsing {}: {e}", path.display()))?;
    if f.copy == 0 {
        f.copy = new_copy_id();
        write(dir, &f).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    Ok(f)
}

/// Writes the file in `dir` atomically (a temporary file, synced, renamed).
pub(crate) fn write(dir: &Path, f: &ShardFile) -> std::io::Result<()> {
    let tmp = dir.join(format!("{SHARD_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(f).map_err(std::io::Error::other)?)?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, dir.join(SHARD_FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_copy_id_gets_one_that_stays() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SHARD_FILE), br#"{"shard_count":3}"#).unwrap();
        let first = read(dir.path()).unwrap();
        assert_eq!(first.shard_count, 3);
        assert_ne!(first.copy, 0);
        assert_eq!(read(dir.path()).unwrap(), first, "the id given is kept in the file");
    }

    #[test]
    fn each_new_copy_has_its_own_id() {
        let dir = tempfile::tempdir().unwrap();
        let a = ShardFile::new_copy(2);
        write(dir.path(), &a).unwrap();
        assert_eq!(read(dir.path()).unwrap(), a);
        assert_ne!(ShardFile::new_copy(2).copy, a.copy);
    }
}
