//! [`BundleStore`]: a bundle file (`kpc cache export`) as a read-only layer, read in place.
//!
//! What `KPC_CACHE_READONLY_DIRS` makes of an element that is a file: the bundle is opened at its
//! first lookup (header and index; a format-3 bundle is then read entry by entry with one positioned
//! read each, formats 1 and 2 are decompressed into memory once), and a lookup finds the key's entry
//! through the index and verifies it exactly as `kpc cache import` does before anything reaches a
//! driver: the envelope's MAC with `KPC_CACHE_REMOTE_KEY`, a trusted signature with
//! `KPC_CACHE_TRUSTED_KEYS`, then the entry's checksums and its full key record against the key asked
//! for (device fields, image, spec constants, options), and the image size limits. Nothing is ever
//! written to the file. A bundle that cannot be opened (missing, not a bundle, an unknown format, a
//! damaged index) is one warning and a miss for every lookup; a damaged, truncated or unauthentic
//! entry is a miss, counted and warned about once per cause; a bundle of another device simply holds
//! no entry for this one's keys.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::format::Bundle;
use crate::cache::store::auth::{self, EntryAuth};
use crate::cache::store::{
    Access, PutOutcome, Removal, Store, StoreCounters, StoreEntry, StoreHit, StoreKey, StoreStats,
    StoreWarnings, WarnCause,
};
use crate::config::Config;

/// The bundle, opened, with its entries by key digest.
#[derive(Debug)]
struct Opened {
    bundle: Bundle,
    by_key: HashMap<String, usize>,
}

/// A bundle file, looked up in place and never written. Wrap it in
/// [`ReadOnlyStore`](crate::cache::store::ReadOnlyStore) to add it to a chain as a read-only layer (what
/// [`StoreChain::from_config`](crate::cache::store::StoreChain::from_config) does for a file in
/// `KPC_CACHE_READONLY_DIRS`).
pub struct BundleStore {
    path: PathBuf,
    auth: EntryAuth,
    image_sizes: (u64, u64),
    opened: OnceLock<Option<Opened>>,
    counters: StoreCounters,
    warnings: StoreWarnings,
}

impl fmt::Debug for BundleStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("BundleStore").field(&self.path).finish()
    }
}

impl BundleStore {
    /// The bundle at `path`, its entries verified as `auth` requires (MAC, trusted signers), any image
    /// size accepted. Nothing is read until the first lookup.
    pub fn open(path: impl Into<PathBuf>, auth: EntryAuth) -> BundleStore {
        let path = path.into();
        BundleStore {
            warnings: StoreWarnings::new(format!("bundle:{}", path.display())),
            path,
            auth,
            image_sizes: (0, u64::MAX),
            opened: OnceLock::new(),
            counters: StoreCounters::default(),
        }
    }

    /// The bundle at `path` as `config` reads shared entries (its MAC key, trusted keys and image size
    /// limits), warning through its receivers.
    pub fn from_config(config: &Config, path: impl Into<PathBuf>) -> BundleStore {
        let mut s = BundleStore::open(path, EntryAuth::from_config(config));
        s.image_sizes = (config.min_device_image_size, config.max_device_image_size);
        s.warnings.set_sink(config.warning_sink());
        s
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bundle, opened at the first call (warned once if it cannot be).
    fn opened(&self) -> Option<&Opened> {
        self.opened
            .get_or_init(|| match Bundle::open(&self.path) {
                Ok(bundle) => {
                    if bundle.trailing() {
                        self.warnings.warn(
                            WarnCause::Corrupt,
                            &"the bundle holds bytes after its last entry (tampered with, or written by another tool); each entry is still verified on its own",
                        );
                    }
                    let by_key = bundle
                        .entries
                        .iter()
                        .enumerate()
                        .map(|(i, e)| (e.key_digest.clone(), i))
                        .collect();
                    Some(Opened { bundle, by_key })
                }
                Err(e) => {
                    self.counters.error();
                    let cause = match &e {
                        crate::Error::Io(_) => WarnCause::Unavailable,
                        _ => WarnCause::Corrupt,
                    };
                    self.warnings
                        .warn(cause, &format_args!("cannot be used as a layer ({e})"));
                    None
                }
            })
            .as_ref()
    }

    /// Every entry of the index, each verified as a lookup of the key it claims would verify it
    /// (what `kpc cache ls --bundle` shows). Changes nothing, warns about nothing.
    ///
    /// Errors: the bundle cannot be opened (what a lookup would warn about).
    pub fn list_verified(&self) -> crate::Result<Vec<BundleRow>> {
        let bundle = Bundle::open(&self.path)?;
        let mut out = Vec::new();
        for (i, e) in bundle.entries.iter().enumerate() {
            let mut row = BundleRow {
                label: e.label.clone(),
                key_digest: e.key_digest.clone(),
                bytes: e.len,
                record: None,
                verdict: Ok(()),
            };
            let envelope = match bundle.envelope(i) {
                Ok(v) => v,
                Err(why) => {
                    row.verdict = Err(why);
                    out.push(row);
                    continue;
                }
            };
            row.record = auth::claimed_record(&envelope);
            row.verdict = match row.record.as_ref().and_then(|r| r.to_key()) {
                None => Err("its key record is missing or damaged".to_string()),
                Some(k) if k.digest().to_hex() != e.key_digest => {
                    Err("the index names another key for it".to_string())
                }
                Some(k) if !(self.image_sizes.0..=self.image_sizes.1).contains(&k.image_len()) => {
                    Err("its image is outside the image size limits".to_string())
                }
                Some(k) => auth::open(&self.auth, &k, &envelope)
                    .map(drop)
                    .map_err(|r| r.to_string()),
            };
            out.push(row);
        }
        Ok(out)
    }

    fn refused(&self, key: &StoreKey, cause: WarnCause, why: &dyn fmt::Display) {
        self.counters.error();
        self.warnings.warn(
            cause,
            &format_args!("refused the entry for {} ({why})", key.digest()),
        );
    }
}

impl Store for BundleStore {
    fn name(&self) -> String {
        format!("bundle:{}", self.path.display())
    }

    fn get(&self, key: &StoreKey, _access: Access) -> Option<StoreHit> {
        let (min, max) = self.image_sizes;
        let found = (min..=max)
            .contains(&key.image_len())
            .then(|| self.opened())
            .flatten()
            .and_then(|o| Some((o, *o.by_key.get(&key.digest().to_hex())?)));
        let Some((o, i)) = found else {
            self.counters.miss();
            return None;
        };
        let envelope = match o.bundle.envelope(i) {
            Ok(e) => e,
            Err(why) => {
                self.counters.miss();
                self.refused(key, WarnCause::Corrupt, &why);
                return None;
            }
        };
        match auth::open(&self.auth, key, &envelope) {
            Ok(hit) => {
                self.counters.hit(hit.bytes().len());
                Some(hit)
            }
            Err(r) => {
                self.counters.miss();
                crate::cache::metrics::refused("bundle", r.reason());
                let cause = if r.is_signature() {
                    WarnCause::Untrusted
                } else if r.is_auth() {
                    WarnCause::Unauthentic
                } else {
                    WarnCause::Corrupt
                };
                self.refused(key, cause, &r);
                None
            }
        }
    }

    fn put(&self, _key: &StoreKey, _bytes: &[u8], _t: std::time::Duration) -> PutOutcome {
        PutOutcome::Skipped
    }

    fn remove(&self, _key: &StoreKey, _what: Removal<'_>) -> bool {
        false
    }

    /// Every entry whose envelope can be read, with the key record it claims (listing does not
    /// authenticate; a lookup does).
    fn list(&self) -> io::Result<Vec<StoreEntry>> {
        let Some(o) = self.opened() else {
            return Err(io::Error::other(format!(
                "{} cannot be opened as a bundle",
                self.path.display()
            )));
        };
        let mut out = Vec::new();
        for i in 0..o.bundle.entries.len() {
            let Ok(envelope) = o.bundle.envelope(i) else {
                continue;
            };
            if let Some(record) = auth::claimed_record(&envelope) {
                out.push(StoreEntry {
                    record,
                    bytes: envelope.len() as u64,
                    last_access: None,
                });
            }
        }
        Ok(out)
    }

    fn stats(&self) -> StoreStats {
        self.counters.snapshot()
    }
}

/// One entry of a bundle as [`BundleStore::list_verified`] found it.
#[derive(Debug, Clone)]
pub struct BundleRow {
    /// Its label (the kernel image's name) as the index claims it.
    pub label: String,
    /// Its key digest (hex) as the index claims it.
    pub key_digest: String,
    /// Its envelope's bytes in the file (compressed where that helped).
    pub bytes: u64,
    /// The key record its envelope claims, when it can be read.
    pub record: Option<crate::cache::store::KeyRecord>,
    /// `Ok` if a lookup of its key would serve it; else why not.
    pub verdict: Result<(), String>,
}

/// Whether `path`, an element of `KPC_CACHE_READONLY_DIRS`, names a bundle: an existing file, or a
/// path ending in `.kpcb`.
pub fn is_bundle_path(path: &Path) -> bool {
    path.is_file() || path.extension().is_some_and(|e| e == "kpcb")
}
