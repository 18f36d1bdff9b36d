//! Preflight: whether a shipped cache (a bundle, a cache directory) can serve a given device, judged
//! before anything runs (`kpc cache check`).
//!
//! Each entry is judged against the device's description and digest (what the runtime keys entries
//! by): usable, for another backend (not meant for this device), for another device or driver (with
//! the description fields that differ, e.g. `driverVersion 580.159.03 → 580.159.04`), or damaged.
//! Given the keys an application asks for (from its warm-start manifest, which carries the images),
//! [`coverage`] says for each whether an entry would serve it and, if not, why: the nearest entry and
//! the key fields that differ, as a miss explanation does. Nothing here touches a driver; the cache
//! layer stays ignorant of Vulkan and OpenCL (a device is its description and digest).

use std::io;

use super::Digest;
use super::disk::{FieldDiff, MissCause, PersistentCache, compare_keys};
use super::store::StoreKey;

/// Whether one entry can serve the device checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Usability {
    /// Verified, and keyed for exactly this device.
    Usable,
    /// Keyed for another backend (named): never meant for this device.
    OtherBackend(String),
    /// Keyed for another device or driver of the same backend: the description fields that differ
    /// (entry's value → this device's).
    OtherDevice(Vec<FieldDiff>),
    /// Did not verify (damaged, not authentic, truncated): why.
    Damaged(String),
}

/// One entry of the cache checked, judged.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CheckedEntry {
    /// The kernel image's name the entry carries.
    pub label: String,
    /// Its key, where its record parses.
    pub key: Option<StoreKey>,
    /// The verdict.
    pub usability: Usability,
}

/// The device an entry is judged for: its description (`name=value` lines, as keys hold it) and
/// fingerprint digest.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Target<'a> {
    /// The device description.
    pub description: &'a str,
    /// The fingerprint digest.
    pub digest: Digest,
}

impl<'a> Target<'a> {
    /// The device described by `description` (its fingerprint's fields) with fingerprint digest
    /// `digest`.
    pub fn new(description: &'a str, digest: Digest) -> Self {
        Target {
            description,
            digest,
        }
    }
}

fn field<'a>(description: &'a str, name: &str) -> Option<&'a str> {
    description
        .lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Judges one entry with key `key` (when its record parses) that verified, or did not (`problem`).
pub fn judge(
    label: String,
    key: Option<StoreKey>,
    problem: Option<String>,
    target: Target<'_>,
) -> CheckedEntry {
    let usability = match (&key, problem) {
        (_, Some(p)) => Usability::Damaged(p),
        (None, None) => Usability::Damaged("its key record does not parse".into()),
        (Some(k), None) => {
            let theirs = field(k.device(), "backend").unwrap_or("?");
            if Some(theirs) != field(target.description, "backend") {
                Usability::OtherBackend(theirs.to_owned())
            } else if k.device_digest() == target.digest && k.device() == target.description {
                Usability::Usable
            } else {
                let mine = StoreKey::new(
                    target.description,
                    target.digest,
                    k.image_digest(),
                    k.image_len(),
                    k.spec(),
                    k.options(),
                );
                Usability::OtherDevice(compare_keys(k, &mine).1)
            }
        }
    };
    CheckedEntry {
        label,
        key,
        usability,
    }
}

/// Every entry of the cache directory `cache` (read only: nothing is touched, locked or repaired),
/// judged for `target`.
///
/// Errors: the directory cannot be listed.
pub fn dir_entries(cache: &PersistentCache, target: Target<'_>) -> io::Result<Vec<CheckedEntry>> {
    let mut out = Vec::new();
    for e in cache.entries()? {
        let key = e.record.as_ref().and_then(|r| r.to_key());
        let label = key
            .as_ref()
            .map_or_else(String::new, |k| k.label().to_owned());
        let problem = match &key {
            Some(k) if cache.get_read_only(k).is_none() => {
                Some("its binary does not verify (corrupt or incomplete)".to_string())
            }
            Some(_) => None,
            None => Some(format!(
                "its key record {}/{}.src does not verify",
                e.leaf.display(),
                e.slot
            )),
        };
        out.push(judge(label, key, problem, target));
    }
    Ok(out)
}

/// Whether one requested kernel would be served.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Covered {
    /// The kernel, as the caller names it (`image:entry`).
    pub kernel: String,
    /// Whether a usable entry holds exactly its key.
    pub served: bool,
    /// When not served: the cause and the fields in which the nearest entry differs, e.g.
    /// `device-changed: driverVersion 580.159.03 → 580.159.04`, or `new-key: ...`.
    pub why: Option<String>,
}

/// For each `(kernel, key)` requested, whether one of `entries` would serve it, and if not why.
pub fn coverage(entries: &[CheckedEntry], wanted: &[(String, StoreKey)]) -> Vec<Covered> {
    wanted
        .iter()
        .map(|(kernel, key)| {
            let exact = entries
                .iter()
                .find(|e| e.key.as_ref().is_some_and(|k| k.digest() == key.digest()));
            let why = match exact.map(|e| &e.usability) {
                Some(Usability::Usable) => None,
                Some(Usability::Damaged(p)) => Some(format!("{}: {p}", MissCause::EntryUnusable)),
                _ => Some(nearest(entries, key)),
            };
            Covered {
                kernel: kernel.clone(),
                served: why.is_none(),
                why,
            }
        })
        .collect()
}

/// The nearest entry to `key` (same image, else same image name; fewest differing fields, the same
/// image first), explained; `new-key` when none shares the image or its name.
fn nearest(entries: &[CheckedEntry], key: &StoreKey) -> String {
    // An entry of another backend is never near: it could not serve this device whatever it holds.
    let best = entries
        .iter()
        .filter(|e| !matches!(e.usability, Usability::OtherBackend(_)))
        .filter_map(|e| e.key.as_ref())
        .filter(|k| {
            (k.image_digest() == key.image_digest() && k.image_len() == key.image_len())
                || (!key.label().is_empty() && k.label() == key.label())
        })
        .map(|k| (compare_keys(k, key), k.image_digest() != key.image_digest()))
        .min_by_key(|((_, diffs), other_image)| (*other_image, diffs.len()));
    match best {
        Some(((cause, diffs), _)) => {
            let text: Vec<String> = diffs.iter().map(ToString::to_string).collect();
            format!("{cause}: {}", text.join("; "))
        }
        None => format!(
            "{}: no entry of this backend holds this image or one of its name",
            MissCause::NewKey
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINE: &str = "backend=vulkan\nkpc_format=1\ndeviceName=GPU\ndriverVersion=580.159.04\n";
    const OLD: &str = "backend=vulkan\nkpc_format=1\ndeviceName=GPU\ndriverVersion=580.159.03\n";
    const CL: &str = "backend=opencl\nkpc_format=1\ndeviceName=CPU\n";

    fn key(desc: &str, image: u8, spec: &[u8], label: &str) -> StoreKey {
        StoreKey::new(
            desc,
            Digest::of(desc.as_bytes()),
            Digest([image; 32]),
            100,
            spec,
            "",
        )
        .with_label(label)
    }

    fn target() -> Target<'static> {
        Target {
            description: MINE,
            digest: Digest::of(MINE.as_bytes()),
        }
    }

    #[test]
    fn entries_are_judged_with_the_field_that_differs() {
        let j = |k: StoreKey, p: Option<&str>| {
            judge("a".into(), Some(k), p.map(str::to_owned), target()).usability
        };
        assert_eq!(j(key(MINE, 1, b"", "a"), None), Usability::Usable);
        assert_eq!(
            j(key(CL, 1, b"", "a"), None),
            Usability::OtherBackend("opencl".into())
        );
        let Usability::OtherDevice(d) = j(key(OLD, 1, b"", "a"), None) else {
            panic!("another driver");
        };
        let text: Vec<String> = d.iter().map(ToString::to_string).collect();
        assert_eq!(text, ["driverVersion 580.159.03 → 580.159.04"]);
        assert_eq!(
            j(key(MINE, 1, b"", "a"), Some("checksum mismatch")),
            Usability::Damaged("checksum mismatch".into())
        );
    }

    #[test]
    fn coverage_names_the_nearest_entry_for_what_is_not_served() {
        let entries: Vec<CheckedEntry> = [key(MINE, 1, b"", "a"), key(OLD, 2, b"", "b")]
            .into_iter()
            .map(|k| judge(k.label().to_owned(), Some(k), None, target()))
            .collect();
        let wanted = vec![
            ("a:main".to_string(), key(MINE, 1, b"", "a")),
            ("b:main".to_string(), key(MINE, 2, b"", "b")),
            ("c:main".to_string(), key(MINE, 3, b"", "c")),
            ("a:other".to_string(), key(MINE, 9, b"", "a")),
        ];
        let c = coverage(&entries, &wanted);
        assert!(c[0].served && c[0].why.is_none());
        assert_eq!(
            c[1].why.as_deref(),
            Some("device-changed: driverVersion 580.159.03 → 580.159.04")
        );
        assert_eq!(
            c[2].why.as_deref(),
            Some("new-key: no entry of this backend holds this image or one of its name")
        );
        assert_eq!(
            c[3].why.as_deref(),
            Some("image-changed: image digest changed (same name \"a\")")
        );
        assert_eq!(c.iter().filter(|c| c.served).count(), 1);
    }
}
