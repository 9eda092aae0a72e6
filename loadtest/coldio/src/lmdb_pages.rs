//! Which LMDB database each page of a `data.mdb` belongs to, found by
//! walking the B-trees from the newest meta page, so that the pages an
//! operation touched can be attributed to `vectors`, `links0`, ...
//!
//! The on-disk format is LMDB 0.9's (mdb.master, as in `lmdb-master-sys`),
//! on a 64-bit little-endian machine: 16-byte page headers, 8-byte page
//! numbers, node headers of 8 bytes.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::Path;

use crate::page_cache::{FileMap, Residency, context, os_page_size};

const PAGE_HEADER: usize = 16;
const NODE_HEADER: usize = 8;
const P_BRANCH: u16 = 0x01;
const P_LEAF: u16 = 0x02;
const P_OVERFLOW: u16 = 0x04;
const P_LEAF2: u16 = 0x20;
const F_BIGDATA: u16 = 0x01;
const F_SUBDATA: u16 = 0x02;
const MAGIC: u32 = 0xBEEF_C0DE;
const INVALID: u64 = u64::MAX;
/// Size of `MDB_db` on disk.
const DB_RECORD: usize = 48;

/// What kind of tree page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Branch,
    Leaf,
    Overflow,
}

/// Pages of one owner, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PageKinds {
    /// B-tree branch (interior) pages.
    pub branch: u64,
    /// Leaf pages.
    pub leaf: u64,
    /// Overflow pages (values too large for a leaf).
    pub overflow: u64,
    /// Pages that belong to no tree: LMDB's meta pages, free pages, and
    /// pages past the last one in use (written by a later commit).
    pub other: u64,
}

impl PageKinds {
    /// All pages.
    pub fn total(&self) -> u64 {
        self.branch + self.leaf + self.overflow + self.other
    }
}

/// Names leaf pages of a database by content, e.g. to split hannoy's single
/// database into items and links by the key's mode byte. Gets the database
/// name and the first key of the leaf; `None` keeps the database name.
pub type Classifier<'a> = &'a dyn Fn(&str, &[u8]) -> Option<String>;

/// The owner of every LMDB page of an environment at one commit.
#[derive(Clone, Debug)]
pub struct PageMap {
    page_size: usize,
    names: Vec<String>,
    /// Per LMDB page: index into `names` and kind; `None` for no tree.
    owners: Vec<Option<(u16, Kind)>>,
    other: Vec<&'static str>,
}

/// Reads `data.mdb` bytes as little-endian integers, failing on truncation.
struct Bytes<'a> {
    data: &'a [u8],
    path: &'a Path,
}

impl Bytes<'_> {
    fn slice(&self, at: usize, len: usize) -> io::Result<&[u8]> {
        at.checked_add(len).and_then(|end| self.data.get(at..end)).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: reading {len} bytes at offset {at} beyond the end ({} bytes)", self.path.display(), self.data.len()),
            )
        })
    }

    fn u16(&self, at: usize) -> io::Result<u16> {
        let s = self.slice(at, 2)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }

    fn u32(&self, at: usize) -> io::Result<u32> {
        let s = self.slice(at, 4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }

    fn u64(&self, at: usize) -> io::Result<u64> {
        let s = self.slice(at, 8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(s);
        Ok(u64::from_le_bytes(b))
    }
}

fn malformed(path: &Path, what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{}: not a readable LMDB file: {what}", path.display()))
}

struct Walker<'a> {
    b: Bytes<'a>,
    psize: usize,
    names: Vec<String>,
    owners: Vec<Option<(u16, Kind)>>,
    classify: Option<Classifier<'a>>,
    /// Named databases found in the main tree: (name, root).
    named: Vec<(String, u64)>,
}

impl Walker<'_> {
    fn name_index(&mut self, name: &str) -> u16 {
        match self.names.iter().position(|n| n == name) {
            Some(i) => i as u16,
            None => {
                self.names.push(name.to_owned());
                (self.names.len() - 1) as u16
            }
        }
    }

    fn page(&self, pgno: u64) -> io::Result<usize> {
        let off = usize::try_from(pgno).ok().and_then(|p| p.checked_mul(self.psize));
        match off {
            Some(off) if off.checked_add(self.psize).is_some_and(|end| end <= self.b.data.len()) => Ok(off),
            _ => Err(malformed(self.b.path, format!("page {pgno} is past the end of the file"))),
        }
    }

    fn claim(&mut self, pgno: u64, owner: u16, kind: Kind) -> io::Result<bool> {
        let slot =
            self.owners.get_mut(pgno as usize).ok_or_else(|| malformed(self.b.path, format!("page {pgno} is past the end of the file")))?;
        if slot.is_some() {
            return Ok(false);
        }
        *slot = Some((owner, kind));
        Ok(true)
    }

    /// Walks the tree under `root`, naming its pages `db` (or what the
    /// classifier says for leaves). In the main tree (`is_main`), records
    /// the named databases it holds.
    fn walk(&mut self, db: &str, root: u64, is_main: bool) -> io::Result<()> {
        if root == INVALID {
            return Ok(());
        }
        let owner = self.name_index(db);
        let mut stack = vec![root];
        while let Some(pgno) = stack.pop() {
            let off = self.page(pgno)?;
            let flags = self.b.u16(off + 10)?;
            let lower = self.b.u16(off + 12)? as usize;
            let keys = lower.saturating_sub(PAGE_HEADER) / 2;
            if flags & P_BRANCH != 0 {
                if !self.claim(pgno, owner, Kind::Branch)? {
                    continue;
                }
                for i in 0..keys {
                    let node = off + self.b.u16(off + PAGE_HEADER + 2 * i)? as usize;
                    let child =
                        u64::from(self.b.u16(node)?) | (u64::from(self.b.u16(node + 2)?) << 16) | (u64::from(self.b.u16(node + 4)?) << 32);
                    stack.push(child);
                }
            } else if flags & (P_LEAF | P_LEAF2) != 0 {
                let mut leaf_owner = owner;
                if flags & P_LEAF2 == 0 && keys > 0 {
                    let node = off + self.b.u16(off + PAGE_HEADER)? as usize;
                    let ksize = self.b.u16(node + 6)? as usize;
                    if let Some(classify) = self.classify
                        && let Some(label) = classify(db, self.b.slice(node + NODE_HEADER, ksize)?)
                    {
                        leaf_owner = self.name_index(&label);
                    }
                }
                if !self.claim(pgno, leaf_owner, Kind::Leaf)? || flags & P_LEAF2 != 0 {
                    continue;
                }
                for i in 0..keys {
                    let node = off + self.b.u16(off + PAGE_HEADER + 2 * i)? as usize;
                    let nflags = self.b.u16(node + 4)?;
                    let ksize = self.b.u16(node + 6)? as usize;
                    let data = node + NODE_HEADER + ksize;
                    if nflags & F_BIGDATA != 0 {
                        let first = self.b.u64(data)?;
                        let first_off = self.page(first)?;
                        let pages = u64::from(self.b.u32(first_off + 12)?);
                        for p in first..first.saturating_add(pages.max(1)) {
                            self.claim(p, leaf_owner, Kind::Overflow)?;
                        }
                    } else if nflags & F_SUBDATA != 0 {
                        let sub_root = self.b.u64(data + DB_RECORD - 8)?;
                        if is_main {
                            let name = String::from_utf8_lossy(self.b.slice(node + NODE_HEADER, ksize)?).trim_end_matches('\0').to_owned();
                            self.named.push((name, sub_root));
                        } else {
                            // A DUPSORT value set kept in its own tree.
                            stack.push(sub_root);
                        }
                    }
                }
            } else if flags & P_OVERFLOW != 0 {
                return Err(malformed(self.b.path, format!("overflow page {pgno} used as a tree page")));
            } else {
                return Err(malformed(self.b.path, format!("page {pgno} has unknown flags {flags:#x}")));
            }
        }
        Ok(())
    }
}

/// A meta page's fields this parser uses, in on-disk order.
type MetaFields = (u64, u64, u64, u64, u32);

impl PageMap {
    /// Reads the environment's `data.mdb` (through the page cache: drop its
    /// pages again afterwards if the next measurement must start cold).
    pub fn read(path: &Path, classify: Option<Classifier<'_>>) -> io::Result<PageMap> {
        let file = File::open(path).map_err(|e| context("opening", path, e))?;
        let len = file.metadata().map_err(|e| context("reading metadata of", path, e))?.len() as usize;
        let map = FileMap::new(&file, len, path)?.ok_or_else(|| malformed(path, "the file is empty".into()))?;
        Self::parse(map.bytes(), path, classify)
    }

    fn parse(data: &[u8], path: &Path, classify: Option<Classifier<'_>>) -> io::Result<PageMap> {
        let b = Bytes { data, path };
        // The two meta pages; the one with the larger txnid is current.
        let meta = |off: usize| -> io::Result<Option<MetaFields>> {
            if b.u32(off + PAGE_HEADER)? != MAGIC {
                return Ok(None);
            }
            let m = off + PAGE_HEADER;
            let psize = b.u32(m + 24)?;
            let free_root = b.u64(m + 24 + DB_RECORD - 8)?;
            let main_root = b.u64(m + 24 + 2 * DB_RECORD - 8)?;
            let last_pg = b.u64(m + 24 + 2 * DB_RECORD)?;
            let txnid = b.u64(m + 24 + 2 * DB_RECORD + 8)?;
            Ok(Some((txnid, free_root, main_root, last_pg, psize)))
        };
        let first = meta(0)?.ok_or_else(|| malformed(path, "no LMDB magic in page 0".into()))?;
        let psize = first.4 as usize;
        if !(512..=65536).contains(&psize) || !psize.is_power_of_two() {
            return Err(malformed(path, format!("page size {psize}")));
        }
        let second = meta(psize)?;
        let (_, free_root, main_root, last_pg, _) = match second {
            Some(s) if s.0 > first.0 => s,
            _ => first,
        };
        let pages = data.len() / psize;
        let mut w = Walker { b, psize, names: Vec::new(), owners: vec![None; pages], classify, named: Vec::new() };
        w.walk("(main)", main_root, true)?;
        w.walk("(freelist)", free_root, false)?;
        let named = std::mem::take(&mut w.named);
        for (name, root) in named {
            w.walk(&name, root, false)?;
        }
        // Pages on the free list: their page numbers are the values of the
        // free database (an ID list: count, then ids).
        let mut free = vec![false; pages];
        let free_owner = w.names.iter().position(|n| n == "(freelist)");
        for pgno in 0..pages {
            if w.owners[pgno].is_some_and(|(o, k)| Some(o as usize) == free_owner && k == Kind::Leaf) {
                let off = pgno * psize;
                let keys = (w.b.u16(off + 12)? as usize).saturating_sub(PAGE_HEADER) / 2;
                for i in 0..keys {
                    let node = off + w.b.u16(off + PAGE_HEADER + 2 * i)? as usize;
                    let nflags = w.b.u16(node + 4)?;
                    let ksize = w.b.u16(node + 6)? as usize;
                    let mut data = node + NODE_HEADER + ksize;
                    if nflags & F_BIGDATA != 0 {
                        data = w.page(w.b.u64(data)?)? + PAGE_HEADER;
                    }
                    let count = w.b.u64(data)?;
                    for j in 0..count {
                        let id = w.b.u64(data + 8 * (j as usize + 1))?;
                        if let Some(f) = free.get_mut(id as usize) {
                            *f = true;
                        }
                    }
                }
            }
        }
        let other = (0..pages)
            .map(|p| {
                if p < 2 {
                    "(meta)"
                } else if free[p] {
                    "(free)"
                } else if p as u64 > last_pg {
                    "(past last page)"
                } else {
                    "(unreferenced)"
                }
            })
            .collect();
        Ok(PageMap { page_size: psize, names: w.names, owners: w.owners, other })
    }

    /// The environment's page size.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages per owner (database name, or `(meta)`, `(free)`, ...).
    pub fn totals(&self) -> BTreeMap<String, PageKinds> {
        self.count(|_| true)
    }

    /// The resident pages of `pages` (a residency of the same file, in OS
    /// pages), per owner. An OS page belongs to the LMDB page that holds
    /// it; pages past the map's end count as `(past last page)`.
    pub fn attribute(&self, pages: &Residency) -> BTreeMap<String, PageKinds> {
        let os = os_page_size();
        let mut out = BTreeMap::<String, PageKinds>::new();
        for (i, _) in pages.pages.iter().enumerate().filter(|(_, r)| **r) {
            let pgno = i * os / self.page_size;
            self.add(&mut out, pgno);
        }
        out
    }

    fn count(&self, mut keep: impl FnMut(usize) -> bool) -> BTreeMap<String, PageKinds> {
        let mut out = BTreeMap::new();
        for pgno in (0..self.owners.len()).filter(|&p| keep(p)) {
            self.add(&mut out, pgno);
        }
        out
    }

    fn add(&self, out: &mut BTreeMap<String, PageKinds>, pgno: usize) {
        match self.owners.get(pgno).copied().flatten() {
            Some((owner, kind)) => {
                let e = out.entry(self.names[owner as usize].clone()).or_default();
                match kind {
                    Kind::Branch => e.branch += 1,
                    Kind::Leaf => e.leaf += 1,
                    Kind::Overflow => e.overflow += 1,
                }
            }
            None => out.entry(self.other.get(pgno).copied().unwrap_or("(past last page)").to_owned()).or_default().other += 1,
        }
    }
}
