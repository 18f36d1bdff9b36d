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
//! File layout: `b"KPCBNDL"`, a format byte (`2`; `1` is still read), then one zstd frame holding: the
//! index length (u64 little-endian), the index (JSON: format, kpc version, whether entries are MAC'd,
//! the signer's fingerprint if signed, and per entry its label, backend, device digest, key digest and
//! envelope length), then the envelopes back to back in index order.

use std::fs;
use std::io::{self, Read, Write};
use std::path::Path;

use serde_json::{Value, json};

use crate::cache::Digest;
use crate::cache::disk::PersistentCache;
use crate::cache::store::auth::{self, EntryAuth, Refusal};
use crate::cache::store::seal;
use crate::cache::store::{Provenance, PutOutcome, StoreHit, StoreKey};
use crate::error::{Error, Result};

const MAGIC: &[u8; 7] = b"KPCBNDL";
const FORMAT: u8 = 2;
/// The format before writer signatures: version-1 envelopes, read the same way.
const FORMAT_V1: u8 = 1;
/// The index may not claim more than this (a hostile file cannot make import allocate without bound).
const MAX_INDEX: u64 = 64 << 20;
/// Nor may a single entry.
const MAX_ENTRY: u64 = 2 << 30;
/// zstd level: bundles are written once and read many times; level 19 compresses SPIR-V and PTX-like
/// binaries well and still decompresses at full speed.
const LEVEL: i32 = 19;

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

fn bad(path: &Path, problem: impl Into<String>) -> Error {
    Error::Bundle {
        path: path.display().to_string(),
        problem: problem.into(),
    }
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
    // The whole bundle is one zstd stream: its envelopes are not compressed again.
    let auth = &EntryAuth {
        compression: 0,
        ..auth.clone()
    };
    let mac = auth.mac.as_ref();
    let signer = auth.signer.as_ref().map(|k| k.public_key().fingerprint());
    let io = |what: &str, e: io::Error| Error::Io(format!("{what} {}: {e}", path.display()));
    let entries = cache
        .entries()
        .map_err(|e| Error::Io(format!("listing {}: {e}", cache.root().display())))?;
    let mut report = ExportReport {
        signed: mac.is_some(),
        signer: signer.clone(),
        ..ExportReport::default()
    };
    let mut index = Vec::new();
    let mut body = Vec::new();
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
        let envelope = auth::wrap(auth, &key, &sealed, &provenance);
        index.push(json!({
            "label": key.label(),
            "backend": e.record.as_ref().map_or("?", |r| r.backend()),
            "device_digest": key.device_digest().to_hex(),
            "key_digest": key.digest().to_hex(),
            "len": envelope.len(),
        }));
        body.extend_from_slice(&envelope);
        report.entries += 1;
    }
    report.raw_bytes = body.len() as u64;
    let index = serde_json::to_vec(&json!({
        "format": FORMAT,
        "kpc": env!("CARGO_PKG_VERSION"),
        "signed": mac.is_some(),
        "signer": signer,
        "entries": index,
    }))
    .expect("a JSON value always serializes");

    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{}: not a file name to write a bundle to",
            path.display()
        ))
    })?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let write = || -> io::Result<u64> {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(MAGIC)?;
        f.write_all(&[FORMAT])?;
        let mut z = zstd::Encoder::new(f, LEVEL)?;
        z.write_all(&(index.len() as u64).to_le_bytes())?;
        z.write_all(&index)?;
        z.write_all(&body)?;
        let f = z.finish()?;
        f.sync_all()?;
        Ok(f.metadata()?.len())
    };
    match write() {
        Ok(n) => report.file_bytes = n,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(io("writing", e));
        }
    }
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io("renaming the bundle to", e)
    })?;
    Ok(report)
}

/// One entry of a parsed bundle index.
struct IndexEntry {
    label: String,
    key_digest: String,
    len: u64,
}

fn parse_index(path: &Path, raw: &[u8]) -> Result<(bool, Vec<IndexEntry>)> {
    let v: Value = serde_json::from_slice(raw)
        .map_err(|e| bad(path, format!("its index is not valid JSON ({e})")))?;
    let format = v.get("format").and_then(Value::as_u64);
    if format != Some(u64::from(FORMAT)) && format != Some(u64::from(FORMAT_V1)) {
        return Err(bad(path, "its index has an unknown format"));
    }
    let signed = v.get("signed").and_then(Value::as_bool).unwrap_or(false);
    let list = v
        .get("entries")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(path, "its index lists no entries"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let len = e
            .get("len")
            .and_then(Value::as_u64)
            .filter(|&l| l <= MAX_ENTRY)
            .ok_or_else(|| bad(path, format!("index entry {i} has no valid length")))?;
        out.push(IndexEntry {
            label: s("label"),
            key_digest: s("key_digest"),
            len,
        });
    }
    Ok((signed, out))
}

/// The bundle at `path`, opened: the decompressing reader positioned at its first envelope, whether
/// it says its entries are signed, and its index.
type Opened = (
    zstd::Decoder<'static, io::BufReader<fs::File>>,
    bool,
    Vec<IndexEntry>,
);

fn open_bundle(path: &Path) -> Result<Opened> {
    let mut f =
        fs::File::open(path).map_err(|e| Error::Io(format!("opening {}: {e}", path.display())))?;
    let mut head = [0u8; 8];
    f.read_exact(&mut head)
        .map_err(|_| bad(path, "it is shorter than a bundle header"))?;
    if &head[..7] != MAGIC {
        return Err(bad(path, "it does not start with a kpc bundle header"));
    }
    if head[7] != FORMAT && head[7] != FORMAT_V1 {
        return Err(bad(
            path,
            format!(
                "its format {} is not the one this kpc reads ({FORMAT})",
                head[7]
            ),
        ));
    }
    let mut z = zstd::Decoder::new(f)
        .map_err(|e| bad(path, format!("its compressed data is damaged ({e})")))?;
    let damaged = |e: io::Error| bad(path, format!("its compressed data is damaged ({e})"));
    let mut len = [0u8; 8];
    z.read_exact(&mut len).map_err(damaged)?;
    let index_len = u64::from_le_bytes(len);
    if index_len > MAX_INDEX {
        return Err(bad(path, format!("its index claims {index_len} bytes")));
    }
    let mut index = vec![0u8; index_len as usize];
    z.read_exact(&mut index).map_err(damaged)?;
    let (signed, entries) = parse_index(path, &index)?;
    Ok((z, signed, entries))
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
    let (mut z, signed, entries) = open_bundle(path)?;
    let damaged = |e: io::Error| bad(path, format!("its compressed data is damaged ({e})"));
    let mut out = Vec::with_capacity(entries.len());
    for e in &entries {
        let mut envelope = Vec::new();
        let got = (&mut z)
            .take(e.len)
            .read_to_end(&mut envelope)
            .map_err(damaged)?;
        let key = auth::claimed_record(&envelope).and_then(|r| r.to_key());
        let problem = if (got as u64) < e.len {
            Some("the bundle ends before this entry does (truncated file)".to_string())
        } else {
            verify(auth, &envelope, &e.key_digest).err()
        };
        out.push(BundleEntry {
            label: e.label.clone(),
            key,
            problem,
        });
    }
    Ok((signed, out))
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
    let (mut z, signed, entries) = open_bundle(path)?;
    let damaged = |e: io::Error| bad(path, format!("its compressed data is damaged ({e})"));
    let mut report = ImportReport {
        total: entries.len(),
        signed,
        ..ImportReport::default()
    };
    for (i, e) in entries.iter().enumerate() {
        let mut envelope = Vec::new();
        let got = (&mut z)
            .take(e.len)
            .read_to_end(&mut envelope)
            .map_err(damaged)?;
        if (got as u64) < e.len {
            // Everything after this point is missing: refuse the rest, keep what was taken.
            for (j, rest) in entries.iter().enumerate().skip(i) {
                report.refused.push(Refused {
                    index: j,
                    label: rest.label.clone(),
                    reason: "the bundle ends before this entry does (truncated file)".into(),
                });
            }
            return Ok(report);
        }
        match take(cache, auth, &envelope, &e.key_digest) {
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
    let mut rest = [0u8; 1];
    if z.read(&mut rest).map_err(damaged)? != 0 {
        return Err(bad(
            path,
            "it holds bytes after its last entry (tampered with, or written by another tool)",
        ));
    }
    Ok(report)
}

/// Verifies one envelope: its key and the verified entry, or why it was refused.
fn verify(
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
