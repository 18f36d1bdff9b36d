//! Finding the persisted entry nearest to a key, for a miss explanation (`explain.rs`).
//!
//! Entries are ranked by how many parts of the key they differ in (device, image, spec constants,
//! options), an entry with the same image before one without; an entry of another image counts only
//! when it has the same name (label). Because the directory names are the hashes of those parts, the
//! entries one part away sit at paths known in advance, and the search reads them first:
//! 1. the key's own leaf: the entry itself (unusable, or published after the lookup), or a collision;
//! 2. one part away, the image unchanged: the same leaf under every other device directory, every
//!    options directory beside the key's, every spec directory's leaf with the key's options;
//! 3. one part away, the image changed: the key's spec and options under each image directory that
//!    the name index (`names.rs`) lists for the key's name, under the key's device;
//! 4. two or more parts away: whole subtrees (the key's image directory, under each device; the
//!    named image directories; in a device directory without an index, its other images), reading at
//!    most [`MAX_EXPLAIN_RECORDS`] key records.
//!
//! It stops as soon as nothing left can be nearer than what it found. Steps 1-3 look into at most
//! [`MAX_EXPLAIN_PROBES`] leaves; none of them lists the device directory, so the cost of a miss
//! explanation does not grow with the number of images cached.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use super::StoreKey;
use super::names;
use super::slot::{SlotCheck, check_slot, list_slots, read_src};
use crate::cache::store::key::DIR_HEX_BYTES;

/// Most key records step 4 of a search reads (subtrees of entries two or more parts away).
pub const MAX_EXPLAIN_RECORDS: usize = 128;
/// Most leaf directories steps 1-3 of a search look into (entries one part away).
pub const MAX_EXPLAIN_PROBES: usize = 4096;

/// The parts of a key two entries can differ in, in the order a cause is judged.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Differs {
    pub device: bool,
    pub image: bool,
    pub spec: bool,
    pub options: bool,
}

impl Differs {
    pub fn of(a: &StoreKey, b: &StoreKey) -> Differs {
        Differs {
            device: a.device() != b.device() || a.device_digest() != b.device_digest(),
            image: a.image_digest() != b.image_digest() || a.image_len() != b.image_len(),
            spec: a.spec() != b.spec(),
            options: a.options() != b.options(),
        }
    }
    fn count(self) -> usize {
        [self.device, self.image, self.spec, self.options]
            .iter()
            .filter(|&&d| d)
            .count()
    }
}

/// An entry with exactly the key.
#[derive(Debug)]
pub(super) enum Exact {
    /// It verifies in full: the key is cached.
    Valid(PathBuf),
    /// It does not (corrupt, incomplete or unreadable).
    Unusable(PathBuf),
}

/// What a search found.
#[derive(Debug)]
pub(super) struct Found {
    pub exact: Option<Exact>,
    /// The nearest other entry's key and key record path.
    pub best: Option<(StoreKey, PathBuf)>,
    /// Whether a limit stopped the search before it could rule out anything nearer.
    pub truncated: bool,
}

/// (parts that differ, whether the image is one of them): smaller is nearer.
type Rank = (usize, bool);

struct Search<'k> {
    key: &'k StoreKey,
    /// Step 4 counts records against [`MAX_EXPLAIN_RECORDS`]; steps 1-3 count leaves.
    budgeted: bool,
    records: usize,
    probes: usize,
    truncated: bool,
    best: Option<(Rank, StoreKey, PathBuf)>,
    exact: Option<Exact>,
    read: HashSet<PathBuf>,
}

impl Search<'_> {
    fn rank(&self) -> Option<Rank> {
        self.best.as_ref().map(|(r, ..)| *r)
    }

    /// Whether nothing of rank `floor` or worse can beat what was found.
    fn settled(&self, floor: Rank) -> bool {
        self.exact.is_some() || self.rank().is_some_and(|r| r <= floor)
    }

    /// Looks into one leaf in steps 1-3; false once the probe limit is spent.
    fn probe(&mut self, leaf: &Path) -> bool {
        if self.probes >= MAX_EXPLAIN_PROBES {
            self.truncated = true;
            return false;
        }
        self.probes += 1;
        self.leaf(leaf)
    }

    /// Reads the key records of `leaf` (once per search); false once the record budget is spent.
    fn leaf(&mut self, leaf: &Path) -> bool {
        if !self.read.insert(leaf.to_owned()) {
            return true;
        }
        let Ok(slots) = list_slots(leaf) else {
            return true;
        };
        for n in slots {
            if self.budgeted {
                if self.records >= MAX_EXPLAIN_RECORDS {
                    self.truncated = true;
                    return false;
                }
                self.records += 1;
            }
            let path = leaf.join(format!("{n}.src"));
            let Ok(Ok((_, rec))) = read_src(&path) else {
                continue;
            };
            let Some(c) = rec.to_key() else { continue };
            let d = Differs::of(&c, self.key);
            if d.count() == 0 {
                match check_slot(leaf, n) {
                    SlotCheck::Valid(_) => self.exact = Some(Exact::Valid(path)),
                    // Removed since we listed it.
                    SlotCheck::Absent => {}
                    _ => {
                        if self.exact.is_none() {
                            self.exact = Some(Exact::Unusable(path));
                        }
                    }
                }
                continue;
            }
            let same_name = !self.key.label().is_empty() && c.label() == self.key.label();
            if d.image && !same_name {
                continue;
            }
            let rank = (d.count(), d.image);
            if self.rank().is_none_or(|r| rank < r) {
                self.best = Some((rank, c, path));
            }
        }
        true
    }
}

/// The hash-named subdirectories of `dir`, sorted.
fn subdirs(dir: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.len() == 2 * DIR_HEX_BYTES && n.bytes().all(|b| b.is_ascii_hexdigit()))
        .collect();
    v.sort();
    v
}

/// The leaf directories two levels below an image directory.
fn leaves_of(image_dir: &Path) -> Vec<PathBuf> {
    subdirs(image_dir)
        .into_iter()
        .flat_map(|s| {
            let spec = image_dir.join(s);
            subdirs(&spec).into_iter().map(move |o| spec.join(o))
        })
        .collect()
}

/// Searches the tree under `v1` for `key`'s own entry and its nearest neighbour (module docs).
pub(super) fn search(v1: &Path, key: &StoreKey) -> Found {
    let [dev, img, spec, opts] = key.dir_names();
    let dev_dir = v1.join(dev);
    let img_dir = dev_dir.join(img);
    let mut s = Search {
        key,
        budgeted: false,
        records: 0,
        probes: 0,
        truncated: false,
        best: None,
        exact: None,
        read: HashSet::new(),
    };
    // 1.
    s.probe(&img_dir.join(spec).join(opts));
    // 2.
    let others: Vec<String> = subdirs(v1).into_iter().filter(|d| d != dev).collect();
    let one_away: Vec<PathBuf> = others
        .iter()
        .map(|d| v1.join(d).join(img).join(spec).join(opts))
        .chain(
            subdirs(&img_dir.join(spec))
                .into_iter()
                .map(|o| img_dir.join(spec).join(o)),
        )
        .chain(
            subdirs(&img_dir)
                .into_iter()
                .map(|sp| img_dir.join(sp).join(opts)),
        )
        .collect();
    for leaf in one_away {
        if s.settled((1, false)) || !s.probe(&leaf) {
            break;
        }
    }
    // 3.
    let named = names::images_named(v1, dev, key.label());
    let named_dirs: Vec<PathBuf> = named
        .iter()
        .flatten()
        .filter(|i| *i != img)
        .map(|i| dev_dir.join(i))
        .collect();
    for d in &named_dirs {
        if s.settled((1, true)) || !s.probe(&d.join(spec).join(opts)) {
            break;
        }
    }
    // 4. Each subtree with the nearest rank an entry in it can have (steps 1-3 read every nearer one).
    let mut subtrees: Vec<(Rank, PathBuf)> = vec![((2, false), img_dir.clone())];
    subtrees.extend(others.iter().map(|d| ((2, false), v1.join(d).join(img))));
    subtrees.extend(named_dirs.iter().map(|d| ((2, true), d.clone())));
    if named.is_none() {
        // No index: the device's other images, by name only, as far as the budget goes.
        subtrees.extend(
            subdirs(&dev_dir)
                .into_iter()
                .filter(|i| i != img)
                .map(|i| ((1, true), dev_dir.join(i))),
        );
    }
    s.budgeted = true;
    'trees: for i in 0..subtrees.len() {
        let floor = subtrees[i..]
            .iter()
            .map(|(r, _)| *r)
            .min()
            .expect("non-empty");
        for leaf in leaves_of(&subtrees[i].1) {
            if s.settled(floor) || s.truncated || !s.leaf(&leaf) {
                break 'trees;
            }
        }
    }
    Found {
        exact: s.exact,
        best: s.best.map(|(_, k, p)| (k, p)),
        truncated: s.truncated,
    }
}
