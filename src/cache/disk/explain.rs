//! Why a lookup missed: the nearest persisted entry and the key fields that differ from it.
//!
//! The nearest entry is found by `nearest.rs`, which reads key records (`<n>.src`) only, changes
//! nothing, and reads the entries one key part away first, at paths known from the key's directory
//! names, with the name index (`names.rs`) for images whose bytes changed (an edited shader or
//! include). Its cost does not grow with the number of entries cached: a changed image among
//! thousands is named as such. An entry counts as near when it shares the image (digest and
//! length) or the image's name (the key's label); of those, the one with the fewest differing parts
//! (device, image, spec constants, options) is named, preferring one with the same image.
//!
//! The disk cache explains every miss it counts (the explanation's [`MissCause`] is counted in
//! [`DiskStats`](super::DiskStats)), never a hit: a miss is about to build anyway, which costs far
//! more than reading a few key records. Asked about a key that is cached, the explanation says so
//! ([`MissCause::Cached`]).

use super::nearest::{Differs, Exact, search};
use super::{Inner, PersistentCache, StoreKey};
pub use crate::cache::store::explain::{FieldDiff, MissCause, MissExplanation};
use crate::cache::store::key::hex;

impl PersistentCache {
    /// Why `key` is not (usably) in this cache: the nearest entry and how it differs, or
    /// [`MissCause::Cached`] when it is cached after all. Reads key records (bounded, see the module
    /// documentation) and the key's own entry, and changes nothing on disk.
    pub fn explain_miss(&self, key: &StoreKey) -> MissExplanation {
        self.inner.explain_miss(key)
    }
}

impl Inner {
    pub(super) fn explain_miss(&self, key: &StoreKey) -> MissExplanation {
        let found = search(&self.v1, key);
        let truncated = found.truncated;
        let own = |cause, path| MissExplanation {
            cause,
            diffs: Vec::new(),
            nearest: Some(path),
            truncated: false,
            evicted: None,
        };
        match found.exact {
            Some(Exact::Valid(path)) => return own(MissCause::Cached, path),
            Some(Exact::Unusable(path)) => return own(MissCause::EntryUnusable, path),
            None => {}
        }
        // Evicted wins over a near entry: this very key would have hit.
        if let Some(ev) = self.evicted(key) {
            return MissExplanation {
                cause: MissCause::Evicted,
                diffs: Vec::new(),
                nearest: None,
                truncated: false,
                evicted: Some(ev),
            };
        }
        let Some((near, path)) = found.best else {
            return MissExplanation {
                cause: MissCause::NewKey,
                diffs: Vec::new(),
                nearest: None,
                truncated,
                evicted: None,
            };
        };
        let (cause, diffs) = compare_keys(&near, key);
        MissExplanation {
            cause,
            diffs,
            nearest: Some(path),
            truncated,
            evicted: None,
        }
    }
}

/// How a cached entry's key (`old`) differs from the key looked up (`new`): the cause, judged as a
/// miss is (device first, then image, spec constants, options), and the fields that differ.
/// [`MissCause::Cached`] with no fields when the keys are equal. For callers that hold both keys
/// (a bundle's entries, `kpc cache check`) rather than a cache directory to search.
pub fn compare_keys(old: &StoreKey, new: &StoreKey) -> (MissCause, Vec<FieldDiff>) {
    let d = Differs::of(old, new);
    let cause = if d.device {
        MissCause::DeviceChanged
    } else if d.image {
        MissCause::ImageChanged
    } else if d.spec {
        MissCause::SpecChanged
    } else if d.options {
        MissCause::OptionsChanged
    } else {
        MissCause::Cached
    };
    (cause, diffs(old, new, d))
}

fn diffs(old: &StoreKey, new: &StoreKey, d: Differs) -> Vec<FieldDiff> {
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
