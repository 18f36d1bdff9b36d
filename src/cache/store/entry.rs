//! The file format of an entry's two files, and their verification.
//!
//! Both `<n>.src` and `<n>.bin` are a fixed 88-byte header followed by a payload:
//!
//! ```text
//! offset size field
//!      0    8 magic "KPCDISK\0"
//!      8    4 format version (u32 LE) = 1
//!     12    4 file kind (u32 LE): 1 = .src (key record, JSON), 2 = .bin (binary)
//!     16    8 payload length (u64 LE)
//!     24   32 key digest: BLAKE3 of the entry's canonical key bytes
//!     56   32 checksum: BLAKE3 of bytes 0..56 of the header followed by the payload
//!     88    - payload
//! ```
//!
//! The checksum covers the header fields too, so a flipped bit anywhere is caught. The key digest in
//! the `.bin` ties the binary to the key its `.src` describes: a `.bin` that ended up next to another
//! key's `.src` fails verification instead of reaching a driver.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};

/// Magic bytes at the start of every entry file.
pub const MAGIC: [u8; 8] = *b"KPCDISK\0";
/// Version of the entry file format (and the `v1` directory level).
pub const FORMAT_VERSION: u32 = 1;
/// Length of the header that precedes every payload.
pub const HEADER_LEN: usize = 88;
const CHECKED_PREFIX: usize = 56;
/// A `.src` larger than this is not a key record kpc wrote (keys are a few KB at most).
pub(crate) const MAX_SRC_LEN: u64 = 16 << 20;

/// Which of an entry's two files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `<n>.src`: the full key values (JSON).
    Src = 1,
    /// `<n>.bin`: the opaque binary.
    Bin = 2,
}

impl FileKind {
    /// The file name extension.
    pub fn ext(self) -> &'static str {
        match self {
            FileKind::Src => "src",
            FileKind::Bin => "bin",
        }
    }
}

/// Why a file failed verification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Defect {
    /// Shorter than its header, or than the header says.
    Truncated,
    /// Longer than the header says.
    TrailingBytes,
    /// Not a kpc entry file.
    BadMagic,
    /// A format version this kpc does not write.
    BadVersion(u32),
    /// A `.src` header in a `.bin` file or the reverse.
    WrongKind,
    /// The checksum does not match header and payload.
    Checksum,
    /// The `.bin` belongs to another key than its `.src`.
    KeyMismatch,
    /// The `.src` payload is not a key record.
    BadRecord,
    /// A `.src` whose `.bin` is missing.
    MissingBin,
}

impl fmt::Display for Defect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Defect::Truncated => f.write_str("truncated"),
            Defect::TrailingBytes => f.write_str("longer than its header says"),
            Defect::BadMagic => f.write_str("bad magic"),
            Defect::BadVersion(v) => write!(f, "unknown format version {v}"),
            Defect::WrongKind => f.write_str("wrong file kind in header"),
            Defect::Checksum => f.write_str("checksum mismatch"),
            Defect::KeyMismatch => f.write_str(".bin belongs to another key than its .src"),
            Defect::BadRecord => f.write_str(".src is not a valid key record"),
            Defect::MissingBin => f.write_str(".src without its .bin"),
        }
    }
}

/// A header, as read from a file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Header {
    pub payload_len: u64,
    pub key_digest: [u8; 32],
    pub checksum: [u8; 32],
    raw: [u8; HEADER_LEN],
}

/// The header for `payload` of kind `kind` under the key whose digest is `key_digest`.
pub(crate) fn encode_header(
    kind: FileKind,
    key_digest: &[u8; 32],
    payload: &[u8],
) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(kind as u32).to_le_bytes());
    h[16..24].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    h[24..56].copy_from_slice(key_digest);
    let mut hasher = blake3::Hasher::new();
    hasher.update(&h[..CHECKED_PREFIX]);
    hasher.update(payload);
    h[56..88].copy_from_slice(hasher.finalize().as_bytes());
    h
}

/// Parses a header and checks what can be checked without the payload: magic, version, kind and that
/// the file length is exactly header + payload.
pub(crate) fn parse_header(
    raw: &[u8; HEADER_LEN],
    kind: FileKind,
    file_len: u64,
) -> Result<Header, Defect> {
    if raw[0..8] != MAGIC {
        return Err(Defect::BadMagic);
    }
    let version = u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(Defect::BadVersion(version));
    }
    let k = u32::from_le_bytes(raw[12..16].try_into().expect("4 bytes"));
    if k != kind as u32 {
        return Err(Defect::WrongKind);
    }
    let payload_len = u64::from_le_bytes(raw[16..24].try_into().expect("8 bytes"));
    let expect = payload_len
        .checked_add(HEADER_LEN as u64)
        .ok_or(Defect::Truncated)?;
    if file_len < expect {
        return Err(Defect::Truncated);
    }
    if file_len > expect {
        return Err(Defect::TrailingBytes);
    }
    Ok(Header {
        payload_len,
        key_digest: raw[24..56].try_into().expect("32 bytes"),
        checksum: raw[56..88].try_into().expect("32 bytes"),
        raw: *raw,
    })
}

impl Header {
    /// Whether `payload` is what this header's checksum covers.
    pub fn checks(&self, payload: &[u8]) -> bool {
        let mut hasher = blake3::Hasher::new();
        hasher.update(&self.raw[..CHECKED_PREFIX]);
        hasher.update(payload);
        // Not secret material, so a plain comparison is fine.
        hasher.finalize().as_bytes() == &self.checksum
    }
}

/// A file read and verified: its header and payload.
#[derive(Debug)]
pub(crate) struct Verified {
    pub header: Header,
    pub payload: Vec<u8>,
}

/// Reads the whole of an open entry file of length `len` and verifies it. The outer `Result` is an
/// I/O failure (the file could not be read: permission, vanished, ...); the inner one a defect in
/// what was read.
pub(crate) fn read_verified(
    file: &mut File,
    len: u64,
    kind: FileKind,
) -> io::Result<Result<Verified, Defect>> {
    if len < HEADER_LEN as u64 {
        return Ok(Err(Defect::Truncated));
    }
    if kind == FileKind::Src && len > MAX_SRC_LEN {
        return Ok(Err(Defect::BadRecord));
    }
    let mut raw = [0u8; HEADER_LEN];
    file.read_exact(&mut raw)?;
    let header = match parse_header(&raw, kind, len) {
        Ok(h) => h,
        Err(d) => return Ok(Err(d)),
    };
    // The length was checked against the file's size, so this allocation is bounded by what is on disk.
    let mut payload = vec![0u8; header.payload_len as usize];
    match file.read_exact(&mut payload) {
        Ok(()) => {}
        // The file shrank between fstat and read: only a writer bypassing the protocol does that.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Err(Defect::Truncated)),
        Err(e) => return Err(e),
    }
    if !header.checks(&payload) {
        return Ok(Err(Defect::Checksum));
    }
    Ok(Ok(Verified { header, payload }))
}

/// Verifies the bytes of a whole file already in memory (the CLI's `verify`).
pub(crate) fn verify_bytes(bytes: &[u8], kind: FileKind) -> Result<(Header, &[u8]), Defect> {
    if bytes.len() < HEADER_LEN {
        return Err(Defect::Truncated);
    }
    let raw: [u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().expect("header length");
    let header = parse_header(&raw, kind, bytes.len() as u64)?;
    let payload = &bytes[HEADER_LEN..];
    if !header.checks(payload) {
        return Err(Defect::Checksum);
    }
    Ok((header, payload))
}
