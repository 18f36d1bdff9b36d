//! Walking the cache tree: every leaf directory with the files of each slot, their sizes and access
//! times, in path order. What eviction, `kpc cache ls/verify` and the size file's rebuild start from.
//! The image subtrees are walked on a few threads when there are many of them.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use filetime::FileTime;

use crate::cache::store::key::DIR_HEX_BYTES;

#[derive(Debug, Clone, Copy)]
pub(crate) struct FileMeta {
    pub len: u64,
    pub atime: FileTime,
}

/// The files of one slot found by a walk.
#[derive(Debug, Default)]
pub(crate) struct SlotFiles {
    pub src: Option<FileMeta>,
    pub bin: Option<FileMeta>,
    pub tmp_bytes: u64,
    pub tmp: bool,
    pub lock: bool,
}

impl SlotFiles {
    pub fn complete(&self) -> bool {
        self.src.is_some() && self.bin.is_some()
    }
    /// Bytes the size file counts for this slot (`count.rs`): `.src` and `.bin`, not temporaries.
    pub fn counted(&self) -> u64 {
        self.src.map_or(0, |m| m.len) + self.bin.map_or(0, |m| m.len)
    }
}

/// One leaf directory found by a walk.
#[derive(Debug)]
pub(crate) struct LeafScan {
    pub path: PathBuf,
    pub dirs: [String; 4],
    pub slots: BTreeMap<u32, SlotFiles>,
    pub key_lock: bool,
}

impl LeafScan {
    /// Bytes the size file counts for this leaf.
    pub fn counted(&self) -> u64 {
        self.slots.values().map(SlotFiles::counted).sum()
    }

    /// Entries the size file counts for this leaf (`.src` files).
    pub fn entries(&self) -> u64 {
        self.slots.values().filter(|f| f.src.is_some()).count() as u64
    }
}

fn is_dir_name(name: &str) -> bool {
    name.len() == 2 * DIR_HEX_BYTES && name.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The hash-named subdirectories of `dir`. A directory that vanished (removed by an evictor) or cannot
/// be read is treated as empty: a walk is a best-effort census, not a transaction.
fn subdirs(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<(String, PathBuf)> = rd
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            is_dir_name(&name).then(|| (name, e.path()))
        })
        .collect();
    v.sort();
    v
}

fn scan_leaf(path: &Path, dirs: [String; 4]) -> LeafScan {
    let mut leaf = LeafScan {
        path: path.to_owned(),
        dirs,
        slots: BTreeMap::new(),
        key_lock: false,
    };
    let Ok(rd) = fs::read_dir(path) else {
        return leaf;
    };
    for e in rd.filter_map(Result::ok) {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        if name == "key.lock" {
            leaf.key_lock = true;
            continue;
        }
        let Some((num, ext)) = name.split_once('.') else {
            continue;
        };
        let Ok(n) = num.parse::<u32>() else {
            continue;
        };
        let meta = || {
            e.metadata().ok().map(|m| FileMeta {
                len: m.len(),
                atime: FileTime::from_last_access_time(&m),
            })
        };
        match ext {
            "src" => {
                let m = meta();
                leaf.slots.entry(n).or_default().src = m;
            }
            "bin" => {
                let m = meta();
                leaf.slots.entry(n).or_default().bin = m;
            }
            "src.tmp" | "bin.tmp" => {
                let len = meta().map_or(0, |m| m.len);
                let s = leaf.slots.entry(n).or_default();
                s.tmp = true;
                s.tmp_bytes += len;
            }
            "lock" => leaf.slots.entry(n).or_default().lock = true,
            _ => {}
        }
    }
    leaf
}

/// Every leaf under `v1`, in path order.
pub(crate) fn scan(v1: &Path) -> io::Result<Vec<LeafScan>> {
    scan_tree(v1).map(|(leaves, _, _)| leaves)
}

/// What a walk found: every leaf under `v1`, how many subdirectories each non-leaf directory had
/// (eviction uses the counts to remove a parent only once its last child went, instead of trying every
/// parent), and the non-leaf directories that had none (a sweep killed half-way leaves them).
pub(crate) type Tree = (Vec<LeafScan>, HashMap<PathBuf, usize>, Vec<PathBuf>);

pub(crate) fn scan_tree(v1: &Path) -> io::Result<Tree> {
    match fs::metadata(v1) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok((Vec::new(), HashMap::new(), Vec::new()));
        }
        Err(e) => return Err(e),
    }
    // The root level is the one directory whose unreadability is an error rather than an empty subtree.
    fs::read_dir(v1)?;
    let mut tree: Tree = Default::default();
    let mut images = Vec::new();
    for (a, pa) in subdirs(v1) {
        let level_b = subdirs(&pa);
        count(&mut tree, &pa, level_b.len());
        images.extend(level_b.into_iter().map(|(b, pb)| (a.clone(), b, pb)));
    }
    // The image subtrees are independent, and a walk is system calls on a warm cache more than I/O:
    // a few threads over contiguous chunks (so the leaves stay in path order) cut its wall time.
    let workers = workers_for(images.len());
    if workers == 1 {
        scan_images(&images, &mut tree);
        return Ok(tree);
    }
    let parts: Vec<Tree> = std::thread::scope(|sc| {
        let handles: Vec<_> = images
            .chunks(images.len().div_ceil(workers))
            .map(|chunk| {
                sc.spawn(move || {
                    let mut t: Tree = Default::default();
                    scan_images(chunk, &mut t);
                    t
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    for (leaves, children, bare) in parts {
        tree.0.extend(leaves);
        tree.1.extend(children);
        tree.2.extend(bare);
    }
    Ok(tree)
}

/// At most this many threads walk the tree or remove entries.
const MAX_WORKERS: usize = 4;
/// Below this many items (image directories, entries) per thread, a thread costs more than it saves.
const MIN_ITEMS_PER_WORKER: usize = 512;

/// How many threads to spread `items` independent pieces of file system work over.
pub(crate) fn workers_for(items: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_WORKERS)
        .min(items.div_ceil(MIN_ITEMS_PER_WORKER))
        .max(1)
}

fn count(tree: &mut Tree, dir: &Path, n: usize) {
    tree.1.insert(dir.to_owned(), n);
    if n == 0 {
        tree.2.push(dir.to_owned());
    }
}

/// Walks the `<image>` subtrees `images` (device name, image name, path) into `tree`.
fn scan_images(images: &[(String, String, PathBuf)], tree: &mut Tree) {
    for (a, b, pb) in images {
        let level_c = subdirs(pb);
        count(tree, pb, level_c.len());
        for (c, pc) in level_c {
            let level_d = subdirs(&pc);
            count(tree, &pc, level_d.len());
            for (d, pd) in level_d {
                let leaf = scan_leaf(&pd, [a.clone(), b.clone(), c.clone(), d]);
                tree.0.push(leaf);
            }
        }
    }
}
