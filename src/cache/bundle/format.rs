//! The bundle file format: writing format 3, and reading formats 1 to 3 into one shape (an index and
//! a way to get each entry's envelope), which import, `kpc cache check`, `kpc cache ls --bundle` and the
//! read-only layer share.
//!
//! Format 3 (written since bundles became read-only layers) can be read in place:
//! ```text
//! b"KPCBNDL" 3
//! u64 LE   length of the index frame
//!          the index: one zstd frame of JSON (format, kpc version, whether entries are MAC'd, the
//!          signer's fingerprint if signed, and per entry its label, backend, device digest, key
//!          digest, offset from the start of the body and envelope length)
//!          the body: the envelopes back to back, each compressed on its own (envelope version 3,
//!          `crate::cache::store::auth`) where that makes it smaller
//! ```
//! A reader reads the header and the index (bounded) and then any one envelope with one positioned
//! read. Formats 1 and 2 (one zstd stream over index and envelopes) can only be read from the start:
//! they are decompressed into memory when opened, within a bound.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde_json::{Value, json};

use crate::error::{Error, Result};

pub(super) const MAGIC: &[u8; 7] = b"KPCBNDL";
/// The format kpc writes: an index up front and the entries each compressed on their own.
pub(super) const FORMAT: u8 = 3;
/// One zstd stream over index and envelopes (writer signatures); still read.
const FORMAT_V2: u8 = 2;
/// The format before writer signatures: version-1 envelopes, read the same way.
const FORMAT_V1: u8 = 1;
/// The index may not claim more than this (a hostile file cannot make a reader allocate without bound).
const MAX_INDEX: u64 = 64 << 20;
/// Nor may a single entry.
const MAX_ENTRY: u64 = 2 << 30;
/// Nor may the body of a format 1 or 2 bundle, which is read into memory.
const MAX_STREAM_BODY: u64 = 4 << 30;
/// zstd level of the index and of each entry: bundles are written once and read many times.
pub(super) const LEVEL: i32 = 19;

pub(super) fn bad(path: &Path, problem: impl Into<String>) -> Error {
    Error::Bundle {
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

/// One entry of a bundle's index.
#[derive(Debug, Clone)]
pub(crate) struct IndexEntry {
    /// The kernel image's name, as the bundle claims it.
    pub label: String,
    /// The key digest (hex), as the bundle claims it.
    pub key_digest: String,
    /// Where its envelope starts in the body.
    pub offset: u64,
    /// Its envelope's length.
    pub len: u64,
}

/// What an entry of the index says, for writing.
pub(super) struct Written {
    pub label: String,
    pub backend: String,
    pub device_digest: String,
    pub key_digest: String,
    pub envelope: Vec<u8>,
}

/// Writes a format-3 bundle of `entries` to `out`; returns its length.
pub(super) fn write(
    mut out: impl Write,
    signed: bool,
    signer: Option<&str>,
    entries: &[Written],
) -> io::Result<u64> {
    let mut offset = 0u64;
    let list: Vec<Value> = entries
        .iter()
        .map(|e| {
            let v = json!({
                "label": e.label,
                "backend": e.backend,
                "device_digest": e.device_digest,
                "key_digest": e.key_digest,
                "offset": offset,
                "len": e.envelope.len(),
            });
            offset += e.envelope.len() as u64;
            v
        })
        .collect();
    let index = serde_json::to_vec(&json!({
        "format": FORMAT,
        "kpc": env!("CARGO_PKG_VERSION"),
        "signed": signed,
        "signer": signer,
        "entries": list,
    }))
    .expect("a JSON value always serializes");
    let frame = zstd::bulk::compress(&index, LEVEL)?;
    out.write_all(MAGIC)?;
    out.write_all(&[FORMAT])?;
    out.write_all(&(frame.len() as u64).to_le_bytes())?;
    out.write_all(&frame)?;
    for e in entries {
        out.write_all(&e.envelope)?;
    }
    Ok((8 + 8 + frame.len()) as u64 + offset)
}

fn parse_index(path: &Path, raw: &[u8], format: u8) -> Result<(bool, Vec<IndexEntry>)> {
    let v: Value = serde_json::from_slice(raw)
        .map_err(|e| bad(path, format!("its index is not valid JSON ({e})")))?;
    if v.get("format").and_then(Value::as_u64) != Some(u64::from(format)) {
        return Err(bad(path, "its index has an unknown format"));
    }
    let signed = v.get("signed").and_then(Value::as_bool).unwrap_or(false);
    let list = v
        .get("entries")
        .and_then(Value::as_array)
        .ok_or_else(|| bad(path, "its index lists no entries"))?;
    let mut out = Vec::with_capacity(list.len());
    let mut next = 0u64;
    for (i, e) in list.iter().enumerate() {
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let len = e
            .get("len")
            .and_then(Value::as_u64)
            .filter(|&l| l <= MAX_ENTRY)
            .ok_or_else(|| bad(path, format!("index entry {i} has no valid length")))?;
        // Format 3 says where each entry is; in a stream they follow each other.
        let offset = match format {
            FORMAT => e
                .get("offset")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad(path, format!("index entry {i} has no valid offset")))?,
            _ => next,
        };
        next = offset
            .checked_add(len)
            .ok_or_else(|| bad(path, format!("index entry {i} lies past any file")))?;
        out.push(IndexEntry {
            label: s("label"),
            key_digest: s("key_digest"),
            offset,
            len,
        });
    }
    Ok((signed, out))
}

/// Where the envelopes are.
#[derive(Debug)]
enum Body {
    /// In the file, from `start` (format 3): read in place.
    File { file: File, start: u64, len: u64 },
    /// Decompressed into memory (formats 1 and 2).
    Memory(Vec<u8>),
}

/// A bundle, opened: its index and its body.
#[derive(Debug)]
pub(crate) struct Bundle {
    /// Whether it says its entries are MAC'd.
    pub signed: bool,
    /// The index.
    pub entries: Vec<IndexEntry>,
    body: Body,
}

impl Bundle {
    /// Opens the bundle at `path`: reads its header and index (format 3), or decompresses it (formats
    /// 1 and 2, within a bound).
    ///
    /// Errors: `path` cannot be read ([`Error::Io`]); it is not a kpc bundle, of an unknown format,
    /// or its index is damaged so that no entry can be located ([`Error::Bundle`]).
    pub fn open(path: &Path) -> Result<Bundle> {
        let mut f =
            File::open(path).map_err(|e| Error::Io(format!("opening {}: {e}", path.display())))?;
        let mut head = [0u8; 8];
        f.read_exact(&mut head)
            .map_err(|_| bad(path, "it is shorter than a bundle header"))?;
        if &head[..7] != MAGIC {
            return Err(bad(path, "it does not start with a kpc bundle header"));
        }
        match head[7] {
            FORMAT => Bundle::open_indexed(path, f),
            v @ (FORMAT_V1 | FORMAT_V2) => Bundle::open_stream(path, f, v),
            v => Err(bad(
                path,
                format!("its format {v} is not one this kpc reads (1 to {FORMAT})"),
            )),
        }
    }

    fn open_indexed(path: &Path, mut f: File) -> Result<Bundle> {
        let mut len = [0u8; 8];
        f.read_exact(&mut len)
            .map_err(|_| bad(path, "it ends before its index"))?;
        let frame_len = u64::from_le_bytes(len);
        if frame_len > MAX_INDEX {
            return Err(bad(path, format!("its index claims {frame_len} bytes")));
        }
        let mut frame = vec![0u8; frame_len as usize];
        f.read_exact(&mut frame)
            .map_err(|_| bad(path, "it ends inside its index (truncated file)"))?;
        let mut index = Vec::new();
        zstd::stream::read::Decoder::with_buffer(&frame[..])
            .and_then(|d| d.take(MAX_INDEX + 1).read_to_end(&mut index))
            .map_err(|e| bad(path, format!("its index is damaged ({e})")))?;
        if index.len() as u64 > MAX_INDEX {
            return Err(bad(path, "its index is larger than any kpc writes"));
        }
        let (signed, entries) = parse_index(path, &index, FORMAT)?;
        let start = 16 + frame_len;
        let file_len = f
            .metadata()
            .map_err(|e| Error::Io(format!("reading {}: {e}", path.display())))?
            .len();
        Ok(Bundle {
            signed,
            entries,
            body: Body::File {
                file: f,
                start,
                len: file_len.saturating_sub(start),
            },
        })
    }

    fn open_stream(path: &Path, f: File, format: u8) -> Result<Bundle> {
        let damaged = |e: io::Error| bad(path, format!("its compressed data is damaged ({e})"));
        let mut z = zstd::Decoder::new(f).map_err(damaged)?;
        let mut len = [0u8; 8];
        z.read_exact(&mut len).map_err(damaged)?;
        let index_len = u64::from_le_bytes(len);
        if index_len > MAX_INDEX {
            return Err(bad(path, format!("its index claims {index_len} bytes")));
        }
        let mut index = vec![0u8; index_len as usize];
        z.read_exact(&mut index).map_err(damaged)?;
        let (signed, entries) = parse_index(path, &index, format)?;
        let claimed = entries.last().map_or(0, |e| e.offset + e.len);
        if claimed > MAX_STREAM_BODY {
            return Err(bad(path, format!("its entries claim {claimed} bytes")));
        }
        // One byte more than the entries claim tells a stream with bytes after its last entry. A
        // stream that breaks off (truncated, damaged) keeps what came before: the entries within it
        // are still judged one by one.
        let mut body = Vec::new();
        let _ = z.take(claimed + 1).read_to_end(&mut body);
        Ok(Bundle {
            signed,
            entries,
            body: Body::Memory(body),
        })
    }

    /// Whether the body holds bytes after the last entry's end (tampered with, or another tool's).
    pub fn trailing(&self) -> bool {
        let end = self.entries.iter().map(|e| e.offset + e.len).max();
        self.body_len() > end.unwrap_or(0)
    }

    fn body_len(&self) -> u64 {
        match &self.body {
            Body::File { len, .. } => *len,
            Body::Memory(b) => b.len() as u64,
        }
    }

    /// Entry `i`'s envelope, exactly as stored (nothing verified yet). `Err` says why it cannot be
    /// read: the file ends before it does, or the read failed.
    pub fn envelope(&self, i: usize) -> std::result::Result<Vec<u8>, String> {
        let e = &self.entries[i];
        if e.offset + e.len > self.body_len() {
            return Err("the bundle ends before this entry does (truncated file)".into());
        }
        match &self.body {
            Body::Memory(b) => Ok(b[e.offset as usize..(e.offset + e.len) as usize].to_vec()),
            Body::File { file, start, .. } => {
                let mut v = vec![0u8; e.len as usize];
                match file.read_exact_at(&mut v, start + e.offset) {
                    Ok(()) => Ok(v),
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        Err("the bundle ends before this entry does (truncated file)".into())
                    }
                    Err(e) => Err(format!("reading the bundle failed ({e})")),
                }
            }
        }
    }
}

/// Writes `write`'s output to a temporary name beside `path` and renames it into place, so a reader
/// never sees half a bundle. Returns the file's length.
pub(super) fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<u64>,
) -> Result<u64> {
    let io = |what: &str, e: io::Error| Error::Io(format!("{what} {}: {e}", path.display()));
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
    let done = File::create(&tmp).and_then(|mut f| {
        let n = write(&mut f)?;
        f.sync_all()?;
        Ok(n)
    });
    let n = match done {
        Ok(n) => n,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(io("writing", e));
        }
    };
    fs::rename(&tmp, path).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        io("renaming the bundle to", e)
    })?;
    Ok(n)
}
