//! A shard node whose disk is full refuses to create a shard (it used to die
//! with SIGBUS, taking every shard it held down), leaves no file behind,
//! keeps serving, and takes on work again once there is space.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use shoal_proto::v1;
use tonic::Code;

use crate::check;
use crate::common::{Fixture, block_on, create, points, points_in, rng, vector};

/// A tmpfs of `bytes` mounted on `dir`, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).ok()?;
        let status = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"]).arg(dir).status();
        match status {
            Ok(s) if s.success() => Some(Tmpfs(dir.to_owned())),
            other => {
                eprintln!("SKIPPED disk-full test: cannot mount a tmpfs here ({other:?}); run as root to include it");
                None
            }
        }
    }

    fn resize(&self, bytes: u64) -> anyhow::Result<()> {
        let s = Command::new("mount").args(["-o", &format!("remount,size={bytes}")]).arg(&self.0).status()?;
        anyhow::ensure!(s.success(), "remount failed: {s}");
        Ok(())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn free_bytes(path: &Path) -> anyhow::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: statvfs only writes into `st`, and `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    anyhow::ensure!(unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0, "statvfs failed");
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

fn entries(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir)?.map(|e| Ok(e?.file_name().to_string_lossy().into_owned())).collect::<anyhow::Result<_>>()?;
    v.sort();
    Ok(v)
}

pub(crate) fn a_full_disk_refuses_a_new_shard_and_the_node_keeps_serving() -> anyhow::Result<()> {
    let base = tempfile::tempdir()?;
    let small = base.path().join("small");
    let Some(tmpfs) = Tmpfs::mount(&small, 64 << 20) else { return Ok(()) };
    let fx = Fixture::start(1, |spec| {
        spec.node_dirs.insert(0, small.join("node"));
    })?;
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("a_full_disk_refuses_a_new_shard_and_the_node_keeps_serving");
        create(&mut client, "big", 1024, 1).await?;
        let mut acked = 0u64;
        let mut full = None;
        for b in 0..400u64 {
            let batch = points(&mut rng, 1024, b * 256..b * 256 + 256);
            match client.upsert(v1::UpsertRequest { collection: "big".into(), points: batch }).await {
                Ok(_) => acked += 256,
                Err(e) => {
                    full = Some(e);
                    break;
                }
            }
        }
        let full = full.expect("64 MiB fills up");
        check!(fx, full.code() == Code::ResourceExhausted, "a full disk should refuse the batch: {full:?}");
        eprintln!("{acked} points of 1024 dimensions fit before the disk filled");

        let free_before = free_bytes(&small)?;
        let err = create(&mut client, "small", 8, 1).await.expect_err("no room for a shard");
        check!(fx, err.code() == Code::ResourceExhausted, "{err:?}");
        check!(fx, fx.cluster.nodes[0].exited()?.is_none(), "the node died: {:?}", fx.cluster.nodes[0].exited()?);
        let shards = entries(&small.join("node/shards"))?;
        check!(fx, shards == ["big"], "files left behind by the refused create: {shards:?}");
        check!(fx, free_bytes(&small)? >= free_before, "the refused create kept space");
        // The shard it had serves on.
        check!(fx, points_in(&mut client, "big").await? == acked, "points changed");
        let hits = client
            .search(v1::SearchRequest { collection: "big".into(), vector: vector(&mut rng, 1024), k: 5, ..Default::default() })
            .await?
            .into_inner();
        check!(fx, hits.hits.len() == 5, "{hits:?}");

        // More space: the create and the writes go through.
        tmpfs.resize(128 << 20)?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        create(&mut client, "small", 8, 1).await?;
        client.upsert(v1::UpsertRequest { collection: "big".into(), points: points(&mut rng, 1024, 1_000_000..1_000_256) }).await?;
        check!(fx, points_in(&mut client, "big").await? == acked + 256, "the write after growing the disk was lost");
        Ok(())
    })
}
