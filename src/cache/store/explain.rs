//! The vocabulary of a miss: why a key missed ([`MissCause`]), judged by the nearest entry a store
//! holds, the key fields that differ ([`FieldDiff`]), and a key's latest eviction ([`Evicted`]). The
//! disk cache finds them (`src/cache/disk/explain.rs`); the chain, the journal and the CLI speak them.

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

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
    /// An entry with exactly this key is there, but could not be used: corrupt, incomplete or
    /// unreadable.
    EntryUnusable,
    /// An entry with exactly this key is there and verifies: the key is cached. A lookup that missed
    /// and is explained so raced with another process publishing it.
    Cached,
    /// An entry with exactly this key was there until an eviction pass removed it (the eviction
    /// record says when and under which limit): a larger `KPC_CACHE_MAX_SIZE` would
    /// have served it.
    Evicted,
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
            MissCause::Cached => "cached",
            MissCause::Evicted => "evicted",
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

/// Why one key missed in one store (the disk cache and read-only layers over it explain misses).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MissExplanation {
    /// The cause, judged by the nearest entry.
    pub cause: MissCause,
    /// The fields in which the nearest entry differs from the key (empty for [`MissCause::NewKey`],
    /// [`MissCause::EntryUnusable`] and [`MissCause::Cached`]).
    pub diffs: Vec<FieldDiff>,
    /// The nearest entry's key record (`<n>.src`), if one was found (the key's own for
    /// [`MissCause::EntryUnusable`] and [`MissCause::Cached`]).
    pub nearest: Option<PathBuf>,
    /// Whether the search stopped at the search's bounds (records read, paths probed) before it
    /// could rule out a nearer entry.
    pub truncated: bool,
    /// For [`MissCause::Evicted`]: when the entry was evicted, its size and the limit then in force.
    pub evicted: Option<Evicted>,
}

impl fmt::Display for MissExplanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cause {
            MissCause::NewKey => f.write_str("nothing similar cached")?,
            MissCause::EntryUnusable => f.write_str(
                "an entry with this key is cached but is not usable (corrupt, incomplete or unreadable)",
            )?,
            MissCause::Cached => f.write_str("cached: an entry with exactly this key verifies")?,
            MissCause::Evicted => match &self.evicted {
                Some(e) => write!(
                    f,
                    "evicted {} ago ({} bytes) under KPC_CACHE_MAX_SIZE={}",
                    ago(e.ago()),
                    e.bytes,
                    if e.limit == 0 {
                        "unlimited (removed by age)".to_string()
                    } else {
                        size_arg(e.limit)
                    }
                )?,
                None => f.write_str("evicted")?,
            },
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
            f.write_str(" (search stopped at its limit; a nearer entry may exist)")?;
        }
        Ok(())
    }
}

/// A key's latest eviction, as the record has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evicted {
    /// When the pass removed it.
    pub at: SystemTime,
    /// The bytes it occupied (both files).
    pub bytes: u64,
    /// `KPC_CACHE_MAX_SIZE` then in force (0: none; removed by age).
    pub limit: u64,
}

impl Evicted {
    /// How long ago it was evicted (zero when the clock went back).
    pub fn ago(&self) -> Duration {
        SystemTime::now()
            .duration_since(self.at)
            .unwrap_or_default()
    }
}

/// A size as `KPC_CACHE_MAX_SIZE` takes it: `512K`, `3M`, `2G` when exact, else bytes.
pub fn size_arg(b: u64) -> String {
    match b {
        0 => "0".into(),
        b if b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// `3s`, `5m`, `2h`, `4d`: a duration for people.
fn ago(d: Duration) -> String {
    match d.as_secs() {
        s @ 0..60 => format!("{s}s"),
        s @ 60..3600 => format!("{}m", s / 60),
        s @ 3600..86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
