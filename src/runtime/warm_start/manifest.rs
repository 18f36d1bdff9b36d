//! The warm-start manifest's file format: the kernels one application acquired on one device, with
//! the device images they came from, so a new process can reload them from the stores without the
//! application naming them again.
//!
//! ```text
//! magic "kpcwarm\0" | u32 version | u32 images | u32 records | u32 reserved (0)
//! images:  u8 format (0 SPIR-V, 1 OpenCL C) | u16 name bytes | name | u64 image bytes | image
//! records: u32 image index | u16 entry bytes | entry | u32 spec bytes | spec (canonical encoding)
//!          | u32 option bytes | options
//! BLAKE3 of everything above (32 bytes)
//! ```
//!
//! Little endian throughout. The trailing hash catches a torn or damaged file: such a manifest is
//! refused whole (a warning, never an error). Nothing here reaches a driver on its own: a manifest only
//! names keys, and a key is loaded only from a store entry that passed the store's own verification,
//! whose key covers the image's digest.

use crate::backend::{DeviceImage, ImageFormat};
use crate::cache::{BuildOptions, SpecConstants};

use super::super::prefetch::KernelRequest;

const MAGIC: &[u8; 8] = b"kpcwarm\0";
/// Format version; a manifest of another version is treated as absent (and rewritten).
pub const VERSION: u32 = 1;
/// At most this many kernels are remembered per application and device (the oldest go first).
pub const MAX_RECORDS: usize = 4096;
/// A manifest larger than this is refused unread, and a write drops the oldest kernels to stay under.
pub const MAX_BYTES: usize = 64 << 20;
const HEADER: usize = 8 + 4 * 4;
const TRAILER: usize = 32;

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt(pub String);

fn corrupt(what: impl Into<String>) -> Corrupt {
    Corrupt(what.into())
}

/// The identity of a remembered kernel: image digest, entry, spec bytes, options.
pub(crate) type RecordId = ([u8; 32], String, Vec<u8>, String);

pub(crate) fn id_of(r: &KernelRequest) -> RecordId {
    (
        r.image.digest().0,
        r.entry.clone(),
        r.spec.canonical_bytes(),
        r.options.as_str().to_string(),
    )
}

/// The manifest bytes for `records` (in order). Images shared by several records are stored once.
pub fn encode(records: &[KernelRequest]) -> Vec<u8> {
    let mut images: Vec<&DeviceImage> = Vec::new();
    let mut index = std::collections::HashMap::new();
    let mut refs = Vec::with_capacity(records.len());
    for r in records {
        let i = *index.entry(r.image.digest().0).or_insert_with(|| {
            images.push(&r.image);
            images.len() - 1
        });
        refs.push(i as u32);
    }
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(images.len() as u32).to_le_bytes());
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for im in &images {
        out.push(match im.format() {
            ImageFormat::SpirV => 0,
            ImageFormat::OpenClC => 1,
            // Never stored (see `storable`: the context records a GLSL image's SPIR-V image); a
            // reader refuses the tag.
            ImageFormat::Glsl => 2,
        });
        let name = truncated(im.name(), u16::MAX as usize);
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(im.bytes().len() as u64).to_le_bytes());
        out.extend_from_slice(im.bytes());
    }
    for (r, i) in records.iter().zip(refs) {
        out.extend_from_slice(&i.to_le_bytes());
        out.extend_from_slice(&(r.entry.len() as u16).to_le_bytes());
        out.extend_from_slice(r.entry.as_bytes());
        let spec = r.spec.canonical_bytes();
        out.extend_from_slice(&(spec.len() as u32).to_le_bytes());
        out.extend_from_slice(&spec);
        let o = r.options.as_str().as_bytes();
        out.extend_from_slice(&(o.len() as u32).to_le_bytes());
        out.extend_from_slice(o);
    }
    let h = blake3::hash(&out);
    out.extend_from_slice(h.as_bytes());
    out
}

fn truncated(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Whether a record can be stored: an entry name that fits its length field.
pub(crate) fn storable(r: &KernelRequest) -> bool {
    r.entry.len() <= u16::MAX as usize && r.image.format() != ImageFormat::Glsl
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], Corrupt> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| corrupt(format!("truncated in {what}")))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self, what: &str) -> Result<usize, Corrupt> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]) as usize)
    }
    fn u32(&mut self, what: &str) -> Result<usize, Corrupt> {
        let s = self.take(4, what)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize)
    }
    fn u64(&mut self, what: &str) -> Result<u64, Corrupt> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(a))
    }
    fn text(&mut self, n: usize, what: &str) -> Result<&'a str, Corrupt> {
        std::str::from_utf8(self.take(n, what)?)
            .map_err(|_| corrupt(format!("{what} is not UTF-8")))
    }
}

/// The records of a manifest file's bytes, or why they are refused.
pub fn decode(bytes: &[u8]) -> Result<Vec<KernelRequest>, Corrupt> {
    if bytes.len() > MAX_BYTES {
        return Err(corrupt(format!(
            "{} bytes, more than the {MAX_BYTES}-byte limit",
            bytes.len()
        )));
    }
    if bytes.len() < HEADER + TRAILER || &bytes[..8] != MAGIC {
        return Err(corrupt(
            "not a kpc warm-start manifest (bad magic or too short)",
        ));
    }
    let (body, sum) = bytes.split_at(bytes.len() - TRAILER);
    if blake3::hash(body).as_bytes() != sum {
        return Err(corrupt("checksum mismatch (torn or damaged file)"));
    }
    let mut r = Reader { b: body, at: 8 };
    let version = r.u32("header")? as u32;
    if version != VERSION {
        return Err(corrupt(format!(
            "format version {version}, this kpc reads {VERSION}"
        )));
    }
    let n_images = r.u32("header")?;
    let n_records = r.u32("header")?;
    r.u32("header")?;
    if n_records > MAX_RECORDS || n_images > n_records {
        return Err(corrupt(format!(
            "{n_images} images and {n_records} records (at most {MAX_RECORDS} records, and no more images than records)"
        )));
    }
    let mut images = Vec::with_capacity(n_images);
    for _ in 0..n_images {
        let format = match r.take(1, "image format")?[0] {
            0 => ImageFormat::SpirV,
            1 => ImageFormat::OpenClC,
            f => return Err(corrupt(format!("unknown image format {f}"))),
        };
        let name_len = r.u16("image name")?;
        let name = r.text(name_len, "image name")?;
        let len = r.u64("image length")?;
        let len = usize::try_from(len).map_err(|_| corrupt("image length overflows"))?;
        let data = r.take(len, "image bytes")?;
        images.push(DeviceImage::new(name, format, data.to_vec()));
    }
    let mut out = Vec::with_capacity(n_records);
    for _ in 0..n_records {
        let i = r.u32("record")?;
        let image = images
            .get(i)
            .ok_or_else(|| corrupt(format!("record names image {i} of {n_images}")))?
            .clone();
        let entry_len = r.u16("entry")?;
        let entry = r.text(entry_len, "entry")?.to_string();
        let spec_len = r.u32("spec constants")?;
        let spec = SpecConstants::from_canonical_bytes(r.take(spec_len, "spec constants")?)
            .ok_or_else(|| corrupt("spec constants are not a canonical encoding"))?;
        let opt_len = r.u32("build options")?;
        let options = BuildOptions::new(r.text(opt_len, "build options")?);
        out.push(KernelRequest {
            image,
            entry,
            spec,
            options,
            generic: None,
        });
    }
    if r.at != body.len() {
        return Err(corrupt(format!(
            "{} bytes after the last record",
            body.len() - r.at
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::SpecValue;

    fn req(name: &str, entry: &str, spec: u32) -> KernelRequest {
        let image = DeviceImage::new(
            name,
            ImageFormat::OpenClC,
            format!("kernel {name}").into_bytes(),
        );
        KernelRequest::new(&image, entry)
            .spec(
                SpecConstants::new()
                    .with(0, SpecValue::U32(spec))
                    .with(3, SpecValue::f32(1.5)),
            )
            .options(BuildOptions::new("-cl-fast-relaxed-math"))
    }

    #[test]
    fn round_trip_shares_images() {
        let rs = vec![req("a", "x", 1), req("a", "y", 2), req("b", "z", 3)];
        let bytes = encode(&rs);
        let back = decode(&bytes).unwrap();
        assert_eq!(back.len(), 3);
        for (a, b) in rs.iter().zip(&back) {
            assert_eq!(id_of(a), id_of(b));
            assert_eq!(a.image.name(), b.image.name());
            assert_eq!(a.image.format(), b.image.format());
        }
        // "a" is stored once: shorter than two copies would make it.
        let solo = encode(&rs[..1]).len();
        assert!(bytes.len() < 3 * solo);
    }

    #[test]
    fn every_damage_is_refused() {
        let bytes = encode(&[req("a", "x", 1)]);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x40;
            assert!(decode(&b).is_err(), "flipped byte {i} accepted");
        }
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "prefix of {n} bytes accepted");
        }
        assert!(decode(b"").is_err());
    }
}
