//! The page walker against environments written by LMDB itself.

use coldio::{PageMap, Residency, os_page_size};
use heed::types::Bytes;
use heed::{CommitOrAbort, Database, EnvOpenOptions};

type Db = Database<'static, Bytes, Bytes>;

/// Creates the named databases (or the unnamed one) in one commit.
fn create<const N: usize>(env: &heed::Env, names: [Option<&str>; N]) -> [Db; N] {
    let wtxn = env.write_txn().expect("txn");
    env.create_databases_and_commit(wtxn, |dbo, wtxn| -> heed::Result<_> {
        let mut dbs = Vec::with_capacity(N);
        for n in names {
            dbs.push(dbo.create_database::<Bytes, Bytes>(wtxn, n)?);
        }
        let dbs: [_; N] = dbs.try_into().unwrap_or_else(|_| unreachable!("one database per name"));
        Ok(CommitOrAbort::<_, ()>::Commit(dbs))
    })
    .expect("create")
    .unwrap_commit()
}

#[test]
fn every_page_is_attributed_to_the_database_that_holds_it() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    // SAFETY: a fresh environment used only by this test.
    let env = unsafe { EnvOpenOptions::new().map_size(64 << 20).max_dbs(4).open(dir.path()) }.expect("env");
    let dbs = create(&env, [Some("small"), Some("big")]);
    let [small, big] = dbs;
    let mut wtxn = env.write_txn().expect("txn");
    // 1,500-byte values: two to a 4 KiB leaf.
    for i in 0u32..1000 {
        small.put(&mut wtxn, &i.to_be_bytes(), &[1u8; 1500]).expect("put");
    }
    // 10,000-byte values: on 3 overflow pages each.
    for i in 0u32..10 {
        big.put(&mut wtxn, &i.to_be_bytes(), &[2u8; 10_000]).expect("put");
    }
    wtxn.commit().expect("commit");
    // A second commit that frees pages, so the free list is not empty.
    let mut wtxn = env.write_txn().expect("txn");
    for i in 0u32..100 {
        small.put(&mut wtxn, &i.to_be_bytes(), &[3u8; 1500]).expect("put");
    }
    wtxn.commit().expect("commit");
    let path = dir.path().join("data.mdb");
    let map = PageMap::read(&path, None).expect("walk");
    let totals = map.totals();
    // The walk agrees with LMDB's own counts.
    let rtxn = env.read_txn().expect("txn");
    for (name, db) in [("small", small), ("big", big)] {
        let stat = db.stat(&rtxn).expect("stat");
        let got = totals.get(name).copied().unwrap_or_default();
        let want = (stat.branch_pages as u64, stat.leaf_pages as u64, stat.overflow_pages as u64);
        assert_eq!((got.branch, got.leaf, got.overflow), want, "{name}: {totals:?}");
    }
    assert_eq!(totals["big"].overflow, 30, "{totals:?}");
    assert!(totals.get("(free)").is_some_and(|f| f.other >= 50), "{totals:?}");
    assert!(totals.contains_key("(main)") && totals.contains_key("(meta)"), "{totals:?}");
    let file_pages = std::fs::metadata(&path).expect("stat").len() as usize / map.page_size();
    assert_eq!(totals.values().map(|k| k.total()).sum::<u64>() as usize, file_pages);

    // Attribution follows OS pages onto LMDB pages.
    let ratio = map.page_size() / os_page_size();
    let mut only_first_meta = Residency { pages: vec![false; file_pages * ratio] };
    only_first_meta.pages[0] = true;
    let got = map.attribute(&only_first_meta);
    assert_eq!(got.len(), 1);
    assert_eq!(got["(meta)"].other, 1);
}

#[test]
fn a_classifier_splits_one_database_by_key() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    // SAFETY: a fresh environment used only by this test.
    let env = unsafe { EnvOpenOptions::new().map_size(64 << 20).open(dir.path()) }.expect("env");
    let db = create(&env, [None])[0];
    let mut wtxn = env.write_txn().expect("txn");
    for prefix in [b'a', b'b'] {
        for i in 0u32..200 {
            let mut key = vec![prefix];
            key.extend_from_slice(&i.to_be_bytes());
            db.put(&mut wtxn, &key, &[0u8; 1500]).expect("put");
        }
    }
    wtxn.commit().expect("commit");
    let by_prefix = |_db: &str, key: &[u8]| key.first().map(|p| format!("prefix {}", *p as char));
    let map = PageMap::read(&dir.path().join("data.mdb"), Some(&by_prefix)).expect("walk");
    let totals = map.totals();
    let rtxn = env.read_txn().expect("txn");
    let stat = db.stat(&rtxn).expect("stat");
    let (a, b) = (totals.get("prefix a").map_or(0, |k| k.leaf), totals.get("prefix b").map_or(0, |k| k.leaf));
    assert_eq!(a + b, stat.leaf_pages as u64, "{totals:?}");
    // Keys are appended in order and split at the middle: about one page per key.
    assert!(a.abs_diff(b) <= 2 && a >= 150, "{totals:?}");
    // The branch pages of the unnamed database are those of the main tree.
    assert_eq!(totals["(main)"].branch, stat.branch_pages as u64, "{totals:?}");
}

#[test]
fn damaged_files_are_errors_not_panics() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let path = dir.path().join("data.mdb");
    std::fs::write(&path, vec![0u8; 8192]).expect("write");
    let e = PageMap::read(&path, None).expect_err("zeros are no LMDB file");
    assert!(e.to_string().contains("no LMDB magic"), "{e}");

    // A real environment cut short: its trees point past the end.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let path = dir.path().join("data.mdb");
    // SAFETY: a fresh environment used only by this test.
    let env = unsafe { EnvOpenOptions::new().map_size(64 << 20).open(dir.path()) }.expect("env");
    let db = create(&env, [None])[0];
    let mut wtxn = env.write_txn().expect("txn");
    for i in 0u32..500 {
        db.put(&mut wtxn, &i.to_be_bytes(), &[0u8; 1500]).expect("put");
    }
    wtxn.commit().expect("commit");
    drop(env);
    let full = std::fs::read(&path).expect("read");
    for cut in [4096 * 2, 4096 * 3, full.len() / 2, full.len() - 4096] {
        std::fs::write(&path, &full[..cut]).expect("write");
        let e = PageMap::read(&path, None).expect_err("truncated");
        assert!(e.to_string().contains("past the end"), "{cut}: {e}");
    }
}
