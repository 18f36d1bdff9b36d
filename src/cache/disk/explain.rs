//! Why a lookup missed: the nearest persisted entries and the key fields that differ from them.
//!
//! A miss is explained by reading the key records (`<n>.src`) of entries near the key, in a bounded
//! scan that reads nothing else and changes nothing:
//! 1. the key's own image directory under its device directory (entries that differ only in spec
//!    constants or options);
//! 2. the key's image directory under every other device directory (the same image built for a
//!    device whose fingerprint differs: a driver update);
//! 3. the rest of the key's device directory (a changed image with the same name).
//!
//! At most [`MAX_EXPLAIN_RECORDS`] records are read, so a miss costs one bounded scan however large
//! the cache is. An entry counts as near when it shares the image (digest and length) or the image's
//! name (the key's label); of those, the one with the fewest differing parts (device, image, spec
//! constants, options) is named, preferring one with the same image.
//!
//! The disk cache explains every miss it counts (the explanation's [`MissCause`] is counted in
//! [`DiskStats`](super::DiskStats)), never a hit: a miss is about to build anyway, which costs far
//! more than reading a few key records.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use super::key::hex;
use super::slot::{list_slots, read_src};
use super::{DiskKey, Inner, PersistentCache};

/// Most key records one explanation reads.
pub const MAX_EXPLAIN_RECORDS: usize = 128;

/// Why a key missed, judged by the nearest entry found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MissCause {
    /// Nothing similar is cached: no entry shares the image or its name.
    NewKey,
    /// The nearest entry was built for a device whose fingerprint differs (driver, device, backend).
    DeviceChanged,
    /// The nearest entry has an image of the same name whose bytes differ.
    ImageChanged,
    /// The nearest entry differs in spec constants only (device and image equal).
    SpecChanged,
    /// The nearest entry differs in build options only (device, image and spec constants equal).
    OptionsChanged,
    /// An entry with exactly this key is there, but could not be used: corrupt or unreadable, or
    /// published by another process after the lookup.
    EntryUnusable,
}

impl MissCause {
    /// A stable kebab-case name (trace field, `--json`).
    pub fn name(self) -> &'static str {
        match self {
            MissCause::NewKey => "new-key",
            MissCause::DeviceChanged => "device-changed",
            MissCause::ImageChanged => "image-changed",
            MissCause::SpecChanged => "spec-changed",
            MissCause::OptionsChanged => "options-changed",
            MissCause::EntryUnusable => "entry-unusable",
        }
    }
}

impl fmt::Display for MissCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One key field in which the nearest entry (old) differs from the key looked up (new).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldDiff {
    /// A field of the device description (`driver_version`, `device_name`, ...); `None` where one
    /// side lacks it.
    Device {
        /// The field's name.
        field: String,
        /// The entry's value.
        old: Option<String>,
        /// The key's value.
        new: Option<String>,
    },
    /// The device digest, when the descriptions are equal but the digests are not.
    DeviceDigest {
        /// The entry's digest, hex.
        old: String,
        /// The key's digest, hex.
        new: String,
    },
    /// The image's bytes (digest, and length where it changed too); `name` is the label both share,
    /// empty when the entry was found by digest alone.
    Image {
        /// The image's name.
        name: String,
        /// The entry's image digest, hex.
        old: String,
        /// The key's image digest, hex.
        new: String,
        /// The entry's and the key's image lengths.
        len: (u64, u64),
    },
    /// Spec constant `id`: `None` where one side does not set it.
    SpecConstant {
        /// The constant's id.
        id: u32,
        /// The entry's value.
        old: Option<String>,
        /// The key's value.
        new: Option<String>,
    },
    /// Spec constant bytes that do not decode as kpc's canonical encoding, hex.
    SpecBytes {
        /// The entry's bytes.
        old: String,
        /// The key's bytes.
        new: String,
    },
    /// The build options.
    Options {
        /// The entry's options.
        old: String,
        /// The key's options.
        new: String,
    },
}

impl FieldDiff {
    /// The field's name, old and new value, as strings (`--json`).
    pub fn parts(&self) -> (String, String, String) {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "(unset)".into());
        match self {
            FieldDiff::Device { field, old, new } => (field.clone(), opt(old), opt(new)),
            FieldDiff::DeviceDigest { old, new } => {
                ("device_digest".into(), old.clone(), new.clone())
            }
            FieldDiff::Image { old, new, .. } => ("image_digest".into(), old.clone(), new.clone()),
            FieldDiff::SpecConstant { id, old, new } => {
                (format!("spec constant {id}"), opt(old), opt(new))
            }
            FieldDiff::SpecBytes { old, new } => ("spec".into(), old.clone(), new.clone()),
            FieldDiff::Options { old, new } => ("options".into(), old.clone(), new.clone()),
        }
    }
}

impl fmt::Display for FieldDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "(unset)".into());
        match self {
            FieldDiff::Device { field, old, new } => {
                write!(f, "{field} {} → {}", opt(old), opt(new))
            }
            FieldDiff::DeviceDigest { old, new } => {
                write!(
                    f,
                    "device digest {} → {}",
                    &old[..16.min(old.len())],
                    &new[..16.min(new.len())]
                )
            }
            FieldDiff::Image { name, len, .. } => {
                f.write_str("image digest changed")?;
                if !name.is_empty() {
                    write!(f, " (same name {name:?}")?;
                    if len.0 != len.1 {
                        write!(f, ", {} → {} bytes", len.0, len.1)?;
                    }
                    f.write_str(")")?;
                }
                Ok(())
            }
            FieldDiff::SpecConstant { id, old, new } => {
                write!(f, "spec constant {id}: {} → {}", opt(old), opt(new))
            }
            FieldDiff::SpecBytes { old, new } => write!(f, "spec constants {old:?} → {new:?}"),
            FieldDiff::Options { old, new } => write!(f, "options {old:?} → {new:?}"),
        }
    }
}

/// Why one key missed in one disk cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissExplanation {
    /// The cause, judged by the nearest entry.
    pub cause: MissCause,
    /// The fields in which the nearest entry differs from the key (empty for [`MissCause::NewKey`]
    /// and [`MissCause::EntryUnusable`]).
    pub diffs: Vec<FieldDiff>,
    /// The nearest entry's key record (`<n>.src`), if one was found.
    pub nearest: Option<PathBuf>,
    /// Whether the scan stopped at [`MAX_EXPLAIN_RECORDS`] before reading every near directory.
    pub truncated: bool,
}

impl fmt::Display for MissExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cause {
            MissCause::NewKey => f.write_str("nothing similar cached")?,
            MissCause::EntryUnusable => f.write_str(
                "an entry with this key is cached but was not usable (corrupt, unreadable, or published after the lookup)",
            )?,
            _ => {
                for (i, d) in self.diffs.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "{d}")?;
                }
            }
        }
        if self.truncated {
            write!(f, " (scan stopped after {MAX_EXPLAIN_RECORDS} entries)")?;
        }
        Ok(())
    }
}

impl PersistentCache {
    /// Why `key` is not (usably) in this cache: the nearest entry and how it differs. Reads key
    /// records only (bounded, see the module documentation) and changes nothing on disk.
    pub fn explain_miss(&self, key: &DiskKey) -> MissExplanation {
        self.inner.explain_miss(key)
    }
}

/// The parts of a key two entries can differ in, in the order a cause is judged.
#[derive(Debug, Default, Clone, Copy)]
struct Differs {
    device: bool,
    image: bool,
    spec: bool,
    options: bool,
}

impl Differs {
    fn of(a: &DiskKey, b: &DiskKey) -> Differs {
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

fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// The leaf directories `depth` levels below `dir`.
fn leaves(dir: &Path, depth: usize) -> Vec<PathBuf> {
    let mut level = vec![dir.to_owned()];
    for _ in 0..depth {
        level = level.iter().flat_map(|d| subdirs(d)).collect();
    }
    level
}

struct Scan<'k> {
    key: &'k DiskKey,
    read: usize,
    truncated: bool,
    best: Option<(usize, bool, DiskKey, PathBuf)>,
    exact: Option<PathBuf>,
}

impl Scan<'_> {
    /// Reads the key records of `leaf`; false once the record budget is spent.
    fn leaf(&mut self, leaf: &Path) -> bool {
        let Ok(slots) = list_slots(leaf) else {
            return true;
        };
        for n in slots {
            if self.read >= MAX_EXPLAIN_RECORDS {
                self.truncated = true;
                return false;
            }
            self.read += 1;
            let path = leaf.join(format!("{n}.src"));
            let Ok(Ok((_, rec))) = read_src(&path) else {
                continue;
            };
            let Some(c) = rec.to_key() else { continue };
            let d = Differs::of(&c, self.key);
            if d.count() == 0 {
                self.exact.get_or_insert(path);
                continue;
            }
            let same_name = !self.key.label().is_empty() && c.label() == self.key.label();
            if d.image && !same_name {
                continue;
            }
            let rank = (d.count(), d.image);
            if self
                .best
                .as_ref()
                .is_none_or(|(n, img, ..)| rank < (*n, *img))
            {
                self.best = Some((rank.0, rank.1, c, path));
            }
        }
        true
    }
}

impl Inner {
    pub(super) fn explain_miss(&self, key: &DiskKey) -> MissExplanation {
        let [dev, img, ..] = key.dir_names();
        let dev_dir = self.v1.join(dev);
        let mut scan = Scan {
            key,
            read: 0,
            truncated: false,
            best: None,
            exact: None,
        };
        let own_image = dev_dir.join(img);
        let other_devices = subdirs(&self.v1)
            .into_iter()
            .filter(|d| d.file_name().is_some_and(|n| n != dev.as_str()))
            .map(|d| d.join(img));
        let other_images = subdirs(&dev_dir).into_iter().filter(|d| *d != own_image);
        let image_dirs = std::iter::once(own_image.clone())
            .chain(other_devices)
            .chain(other_images);
        'dirs: for dir in image_dirs {
            for leaf in leaves(&dir, 2) {
                if !scan.leaf(&leaf) {
                    break 'dirs;
                }
            }
        }
        let truncated = scan.truncated;
        if let Some(path) = scan.exact {
            return MissExplanation {
                cause: MissCause::EntryUnusable,
                diffs: Vec::new(),
                nearest: Some(path),
                truncated,
            };
        }
        let Some((_, _, near, path)) = scan.best else {
            return MissExplanation {
                cause: MissCause::NewKey,
                diffs: Vec::new(),
                nearest: None,
                truncated,
            };
        };
        let d = Differs::of(&near, key);
        let cause = if d.device {
            MissCause::DeviceChanged
        } else if d.image {
            MissCause::ImageChanged
        } else if d.spec {
            MissCause::SpecChanged
        } else {
            MissCause::OptionsChanged
        };
        MissExplanation {
            cause,
            diffs: diffs(&near, key, d),
            nearest: Some(path),
            truncated,
        }
    }
}

fn diffs(old: &DiskKey, new: &DiskKey, d: Differs) -> Vec<FieldDiff> {
    let mut out = Vec::new();
    if d.device {
        let fields = |s: &str| -> Vec<(String, String)> {
            s.lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let (a, b) = (fields(old.device()), fields(new.device()));
        let get = |v: &[(String, String)], k: &str| {
            v.iter().find(|(n, _)| n == k).map(|(_, x)| x.clone())
        };
        let names: Vec<&String> = a.iter().chain(b.iter()).map(|(k, _)| k).collect();

        let mut seen = std::collections::HashSet::new();
        for k in names {
            if !seen.insert(k.clone()) {
                continue;
            }
            let (o, n) = (get(&a, k), get(&b, k));
            if o != n {
                out.push(FieldDiff::Device {
                    field: k.clone(),
                    old: o,
                    new: n,
                });
            }
        }
        if out.is_empty() {
            out.push(FieldDiff::DeviceDigest {
                old: old.device_digest().to_hex(),
                new: new.device_digest().to_hex(),
            });
        }
    }
    if d.image {
        out.push(FieldDiff::Image {
            name: if old.label() == new.label() {
                new.label().to_owned()
            } else {
                String::new()
            },
            old: old.image_digest().to_hex(),
            new: new.image_digest().to_hex(),
            len: (old.image_len(), new.image_len()),
        });
    }
    if d.spec {
        out.extend(spec_diffs(old.spec(), new.spec()));
    }
    if d.options {
        out.push(FieldDiff::Options {
            old: old.options().to_owned(),
            new: new.options().to_owned(),
        });
    }
    out
}

/// Decodes kpc's canonical spec constant bytes (per constant: id u32 LE, type tag, 8 value bytes).
fn decode_spec(b: &[u8]) -> Option<Vec<(u32, String)>> {
    if b.len() % 13 != 0 {
        return None;
    }
    b.chunks(13)
        .map(|c| {
            let id = u32::from_le_bytes(c[0..4].try_into().ok()?);
            let v = u64::from_le_bytes(c[5..13].try_into().ok()?);
            let s = match c[4] {
                0 => (v != 0).to_string(),
                1 => (v as u32 as i32).to_string(),
                2 => (v as u32).to_string(),
                3 => format!("{:?}", f32::from_bits(v as u32)),
                4 => (v as i64).to_string(),
                5 => v.to_string(),
                6 => format!("{:?}", f64::from_bits(v)),
                _ => return None,
            };
            Some((id, s))
        })
        .collect()
}

fn spec_diffs(old: &[u8], new: &[u8]) -> Vec<FieldDiff> {
    let (Some(a), Some(b)) = (decode_spec(old), decode_spec(new)) else {
        return vec![FieldDiff::SpecBytes {
            old: hex(old),
            new: hex(new),
        }];
    };
    let mut ids: Vec<u32> = a.iter().chain(b.iter()).map(|(i, _)| *i).collect();
    ids.sort_unstable();
    ids.dedup();
    let get = |v: &[(u32, String)], id| v.iter().find(|(i, _)| *i == id).map(|(_, s)| s.clone());
    ids.into_iter()
        .filter_map(|id| {
            let (o, n) = (get(&a, id), get(&b, id));
            (o != n).then_some(FieldDiff::SpecConstant { id, old: o, new: n })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{SpecConstants, SpecValue};

    #[test]
    fn spec_constants_decode_and_diff_by_id() {
        let a = SpecConstants::new()
            .with(3, SpecValue::U32(64))
            .with(1, SpecValue::I32(-2));
        let b = SpecConstants::new()
            .with(3, SpecValue::U32(128))
            .with(1, SpecValue::I32(-2))
            .with(7, SpecValue::Bool(true));
        let d = spec_diffs(&a.canonical_bytes(), &b.canonical_bytes());
        let text: Vec<String> = d.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "spec constant 3: 64 → 128",
                "spec constant 7: (unset) → true"
            ]
        );
        let raw = spec_diffs(&[1, 2], &[3]);
        assert_eq!(raw[0].to_string(), "spec constants \"0102\" → \"03\"");
    }
}
