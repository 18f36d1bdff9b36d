//! Bundles: a disk cache's verified entries in one file, for container images and offline machines
//! (`kpc cache export` / `kpc cache import`).
//!
//! A bundle is written on a machine that has built the kernels and read on machines that have not.
//! The reader trusts nothing in it: every entry is an authenticated envelope
//! ([`auth`]) around a sealed entry, with the exporter's provenance, and
//! import checks each one exactly as a remote lookup would (its MAC when `KPC_CACHE_REMOTE_KEY` is set,
//! a signature by a key of `KPC_CACHE_TRUSTED_KEYS` when that is set, then its checksums and full key)
//! before it publishes it to the local cache through the cache's ordinary put. One bad entry is
//! refused on its own; the others are taken. The index's own claims (signed, signer) are informational
//! only: each entry's envelope decides.
//!
//! File layout: `format.rs`. Format 3 (written now) keeps an index up front and each entry compressed
//! on its own, so a bundle can also serve as a read-only layer in place (`layer.rs`,
//! `KPC_CACHE_READONLY_DIRS`); formats 1 and 2 are still read.

mod format;
pub mod layer;

use std::path::Path;

pub(crate) use format::Bundle;
use format::{LEVEL, Written, bad};
pub use layer::BundleStore;

use crate::cache::Digest;
use crate::cache::disk::PersistentCache;
use crate::cache::store::auth::{self, EntryAuth, Refusal};
use crate::cache::store::seal;
use crate::cache::store::{Provenance, PutOutcome, StoreHit, StoreKey};
use crate::error::{Error, Result};

/// What [`export`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportReport {
    /// Entries written.
    pub entries: u64,
    /// Entries in the cache that did not verify (damaged, or being written) and were left out.
    pub unverified: u64,
    /// Entries of other devices left out by the device filter.
    pub other_devices: u64,
    /// Bytes of the entries before compression.
    pub raw_bytes: u64,
    /// Bytes of the bundle file.
    pub file_bytes: u64,
    /// Whether the entries carry a MAC (a key was given).
    pub signed: bool,
    /// The signer's public key fingerprint, when entries are signed (`KPC_CACHE_SIGNING_KEY`).
    pub signer: Option<String>,
}

/// One entry import did not take, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Its position in the bundle (0-based).
    pub index: usize,
    /// Its label (the kernel image's name) as the bundle claims it.
    pub label: String,
    /// Why it was refused.
    pub reason: String,
}

/// What [`import`] did with each entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImportReport {
    /// Entries in the bundle.
    pub total: usize,
    /// Verified and published to the local cache.
    pub taken: u64,
    /// Verified, and the local cache already had the key.
    pub present: u64,
    /// Verified but not stored: outside the cache's size limits, or the put failed (warned by the
    /// cache).
    pub not_stored: u64,
    /// Refused: not authentic, damaged, or for a key other than the one it claims.
    pub refused: Vec<Refused>,
    /// Whether the bundle says its entries are signed.
    pub signed: bool,
}

/// Writes every verified entry of `cache` (only those of the device whose fingerprint digest is
/// `device`, if given) to a bundle at `path`, each in an envelope as `auth` writes it (MAC'd with its
/// MAC key, signed with its signing key, with provenance naming its host). The file is written to a
/// temporary name beside `path` and renamed, so a reader never sees half a bundle.
///
/// Errors: the cache cannot be listed, or `path` cannot be written ([`Error::Io`]).
pub fn export(
    cache: &PersistentCache,
    device: Option<Digest>,
    auth: &EntryAuth,
    path: &Path,
) -> Result<ExportReport> {
    // Each entry compressed on its own (where that helps), so the bundle can be read in place.
    let auth = &EntryAuth {
        compression: LEVEL,
        ..auth.clone()
    };
    let mac = auth.mac.as_ref();
    let signer = auth.signer.as_ref().map(|k| k.public_key().fingerprint());
    let entries = cache
        .entries()
        .map_err(|e| Error::Io(format!("listing {}: {e}", cache.root().display())))?;
    let mut report = ExportReport {
        signed: mac.is_some(),
        signer: signer.clone(),
        ..ExportReport::default()
    };
    let mut written = Vec::new();
    for e in entries {
        let Some(key) = e.record.as_ref().and_then(|r| r.to_key()) else {
            report.unverified += 1;
            continue;
        };
        if device.is_some_and(|d| d != key.device_digest()) {
            report.other_devices += 1;
            continue;
        }
        // Read through the cache's verified read: what goes into the bundle passed every check here.
        let Some(hit) = cache.get_read_only(&key) else {
            report.unverified += 1;
            continue;
        };
        // The builder's provenance as this cache recorded it; for an entry that records none (written
        // by an older kpc, or copied from a place that had none), this machine as the writer.
        let provenance = match e.record.as_ref().and_then(|r| r.provenance.clone()) {
            Some(p) => p,
            None => {
                let written = e.record.as_ref().map(|r| r.created_unix);
                Provenance::for_key(&auth.host, &key, written, hit.build_time())
            }
        };
        let sealed = seal(&key, hit.bytes(), hit.build_time());
        report.raw_bytes += sealed.len() as u64;
        written.push(Written {
            label: key.label().to_owned(),
            backend: e.record.as_ref().map_or("?", |r| r.backend()).to_owned(),
            device_digest: key.device_digest().to_hex(),
            key_digest: key.digest().to_hex(),
            envelope: auth::wrap(auth, &key, &sealed, &provenance),
        });
        report.entries += 1;
    }
    report.file_bytes = format::write_atomically(path, |f| {
        format::write(
            std::io::BufWriter::new(f),
            mac.is_some(),
            signer.as_deref(),
            &written,
        )
    })?;
    Ok(report)
}

/// One entry of a bundle as [`read_entries`] found it.
#[derive(Debug, Clone)]
pub struct BundleEntry {
    /// Its label (the kernel image's name) as the bundle claims it.
    pub label: String,
    /// The key its record claims, when the record parses (also for an entry that failed to verify).
    pub key: Option<StoreKey>,
    /// Why it did not verify (damaged, not authentic, truncated); `None` when it did.
    pub problem: Option<String>,
}

/// Reads the bundle at `path` and verifies every entry as [`import`] would (as `auth` requires, then
/// its checksums and full key), without storing anything: what `kpc cache check` judges. Returns
/// whether the bundle says its entries are signed, and each entry.
///
/// Errors: as [`import`]'s.
pub fn read_entries(auth: &EntryAuth, path: &Path) -> Result<(bool, Vec<BundleEntry>)> {
    let b = Bundle::open(path)?;
    let mut out = Vec::with_capacity(b.entries.len());
    for (i, e) in b.entries.iter().enumerate() {
        let (key, problem) = match b.envelope(i) {
            Ok(envelope) => (
                auth::claimed_record(&envelope).and_then(|r| r.to_key()),
                verify(auth, &envelope, &e.key_digest).err(),
            ),
            Err(why) => (None, Some(why)),
        };
        out.push(BundleEntry {
            label: e.label.clone(),
            key,
            problem,
        });
    }
    Ok((b.signed, out))
}

/// Reads the bundle at `path` and publishes each entry that verifies into `cache`.
///
/// Each entry is authenticated as `auth` requires (with a MAC key, an entry without a MAC or with a
/// wrong one is refused; with trusted keys, one not signed by one of them), then verified (checksums, the full key it claims, the binary bound to it) before the
/// cache's ordinary put; nothing unverified is written. Entries are judged one by one: a refused entry
/// does not stop the others.
///
/// Errors: `path` cannot be read ([`Error::Io`]), or it is not a kpc bundle of a known format, or its
/// compressed data or index is damaged so that no entry can be located ([`Error::Bundle`]).
pub fn import(cache: &PersistentCache, auth: &EntryAuth, path: &Path) -> Result<ImportReport> {
    let b = Bundle::open(path)?;
    if b.trailing() {
        return Err(bad(
            path,
            "it holds bytes after its last entry (tampered with, or written by another tool)",
        ));
    }
    let mut report = ImportReport {
        total: b.entries.len(),
        signed: b.signed,
        ..ImportReport::default()
    };
    for (i, e) in b.entries.iter().enumerate() {
        let outcome = b
            .envelope(i)
            .and_then(|envelope| take(cache, auth, &envelope, &e.key_digest));
        match outcome {
            Ok(PutOutcome::Published(_)) => report.taken += 1,
            Ok(PutOutcome::AlreadyPresent) => report.present += 1,
            Ok(PutOutcome::Skipped | PutOutcome::Failed) => report.not_stored += 1,
            Err(reason) => report.refused.push(Refused {
                index: i,
                label: e.label.clone(),
                reason,
            }),
        }
    }
    Ok(report)
}

/// Verifies one envelope: its key and the verified entry, or why it was refused.
pub(crate) fn verify(
    auth: &EntryAuth,
    envelope: &[u8],
    claimed_digest: &str,
) -> std::result::Result<(StoreKey, StoreHit), String> {
    let record = auth::claimed_record(envelope)
        .ok_or_else(|| "its key record is missing or damaged".to_string())?;
    let key: StoreKey = record
        .to_key()
        .ok_or_else(|| "its key record has malformed values".to_string())?;
    if key.digest().to_hex() != claimed_digest {
        return Err("the index names another key for it".into());
    }
    let hit = auth::open(auth, &key, envelope).map_err(|r: Refusal| {
        crate::cache::metrics::refused("bundle", r.reason());
        r.to_string()
    })?;
    Ok((key, hit))
}

/// Verifies one envelope and puts it; `Err` is why it was refused.
fn take(
    cache: &PersistentCache,
    auth: &EntryAuth,
    envelope: &[u8],
    claimed_digest: &str,
) -> std::result::Result<PutOutcome, String> {
    let (key, hit) = verify(auth, envelope, claimed_digest)?;
    // The put itself answers AlreadyPresent for a key the cache holds a valid entry of.
    Ok(cache.put_copy(&key, hit.bytes(), hit.build_time(), hit.provenance()))
}
