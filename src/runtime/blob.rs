//! Cache blobs: a kernel's program as bytes the embedder stores wherever it likes (oneDNN's
//! "cache blob id + cache blob" design, ncnn's save-to-memory), and a kernel made from them again
//! without compiling.
//!
//! - [`Context::cache_blob_id`] is the key: equal ids mean interchangeable blobs.
//! - [`Kernel::cache_blob`] is a self-describing container around the backend's program binary.
//! - [`Context::kernel_from_blob`] verifies the container, compares every key field with the
//!   context's own key, and only then hands the payload to the backend (which checks its own
//!   header again); the program goes into the context's memory cache.
//!
//! # Blob id
//! `"KPCBLBID"`, then little-endian: blob format version (u32), kpc format version (u32), device
//! fingerprint digest (32 bytes; BLAKE3 over the backend, every fingerprint field and the kpc format
//! version), image digest (32 bytes, BLAKE3 of the image), image length (u64), spec-constant bytes
//! (u32 length + `SpecConstants::canonical_bytes`), build options (u32 length + normalized UTF-8).
//! Deterministic across processes and machines.
//!
//! # Container (format version 1), little-endian
//! ```text
//! offset  size  field
//!      0     8  magic "KPCBLOB\0"
//!      8     4  blob format version (1)
//!     12     4  K: bytes of the key record
//!     16     8  P: bytes of the payload
//!     24    32  BLAKE3 over bytes 0..24, the key record and the payload
//!     56     K  key record: u32 count, then per field u32 name length, name, u32 value length,
//!               value (UTF-8)
//!   56+K     P  payload: what `Backend::program_binary` returned for the program
//! ```
//! The key record lists, in order: `kpc_format`, `backend`, every device fingerprint field under
//! its own name (Vulkan: `vendor_id`, `device_id`, `device_name`, `driver_version`, ...; OpenCL:
//! `platform_name`, ..., `vendor_id`), `image_digest` (hex), `image_len`, `spec` (hex of the
//! canonical bytes) and `options`. The entry point is not part of it: a blob holds the whole program.
//!
//! The checksum catches accidents (truncation, a flipped bit), not an attacker: whoever can write
//! the blob can recompute it. That is why the key fields are compared one by one, and why the
//! backend still checks its own payload header (Vulkan: the pipeline-cache header against the
//! device; OpenCL: kpc's container with the fingerprint and build digests) before the driver sees it.

use std::sync::Arc;

use crate::backend::{
    DeviceFingerprint, DeviceImage, ImageFormat, KPC_FORMAT_VERSION, KernelObject,
};
use crate::cache::{BuildOptions, Digest, SpecConstants};
use crate::config::BackendKind;
use crate::error::{Error, Result};

use super::context::Context;
use super::kernel::Kernel;
use super::prefetch::KernelRequest;

/// The first bytes of every cache blob.
pub const BLOB_MAGIC: [u8; 8] = *b"KPCBLOB\0";
/// The first bytes of every cache blob id.
pub const BLOB_ID_MAGIC: [u8; 8] = *b"KPCBLBID";
/// The container's format version; a blob of another version is refused as corrupt.
pub const CACHE_BLOB_VERSION: u32 = 1;
/// Bytes before the key record.
const HEADER_BYTES: usize = 56;

/// A parsed, checksum-verified cache blob: its key record and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheBlob {
    /// The key record, in order, as (name, value).
    pub fields: Vec<(String, String)>,
    /// The backend's program binary.
    pub payload: Vec<u8>,
}

fn corrupt(reason: impl Into<String>) -> Error {
    Error::CorruptBlob {
        reason: reason.into(),
    }
}

/// Reads little-endian values from a slice, refusing to run past its end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                corrupt(format!(
                    "the key record ends inside {what} (byte {} of {})",
                    self.at,
                    self.bytes.len()
                ))
            })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn text(&mut self, what: &str) -> Result<String> {
        let n = self.u32(what)? as usize;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| corrupt(format!("{what} is not UTF-8")))
    }
}

fn checksum(head: &[u8], key: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(head);
    h.update(key);
    h.update(payload);
    *h.finalize().as_bytes()
}

impl CacheBlob {
    /// Parses and verifies `bytes`: magic, format version, lengths (exactly the bytes given) and
    /// checksum.
    ///
    /// Errors: [`Error::CorruptBlob`] saying what is wrong.
    pub fn parse(bytes: &[u8]) -> Result<CacheBlob> {
        if bytes.len() < HEADER_BYTES {
            return Err(corrupt(format!(
                "{} bytes is shorter than the {HEADER_BYTES}-byte header",
                bytes.len()
            )));
        }
        if bytes[..8] != BLOB_MAGIC {
            return Err(corrupt(
                "bad magic: these bytes are not a kpc cache blob (Kernel::cache_blob makes them)",
            ));
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
        let version = u32_at(8);
        if version != CACHE_BLOB_VERSION {
            return Err(corrupt(format!(
                "blob format version {version}; this kpc reads version {CACHE_BLOB_VERSION}"
            )));
        }
        let key_len = u32_at(12) as u64;
        let payload_len = u64::from_le_bytes(bytes[16..24].try_into().unwrap_or([0; 8]));
        let want = (HEADER_BYTES as u64)
            .checked_add(key_len)
            .and_then(|n| n.checked_add(payload_len));
        if want != Some(bytes.len() as u64) {
            return Err(corrupt(format!(
                "the header announces {key_len} key bytes and {payload_len} payload bytes after \
                 its {HEADER_BYTES}, but the blob has {} bytes (truncated or extended)",
                bytes.len()
            )));
        }
        let key_end = HEADER_BYTES + key_len as usize;
        let (key, payload) = (&bytes[HEADER_BYTES..key_end], &bytes[key_end..]);
        if checksum(&bytes[..24], key, payload)[..] != bytes[24..56] {
            return Err(corrupt(
                "checksum mismatch: the blob was altered or damaged after it was made",
            ));
        }
        let mut r = Reader { bytes: key, at: 0 };
        let count = r.u32("the field count")?;
        let mut fields = Vec::new();
        for i in 0..count {
            let name = r.text(&format!("the name of field {i}"))?;
            let value = r.text(&format!("the value of field {name:?}"))?;
            fields.push((name, value));
        }
        if r.at != key.len() {
            return Err(corrupt(format!(
                "{} bytes follow the key record's {count} fields",
                key.len() - r.at
            )));
        }
        Ok(CacheBlob {
            fields,
            payload: payload.to_vec(),
        })
    }

    /// The container bytes, with a fresh checksum.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut key = Vec::new();
        key.extend_from_slice(&(self.fields.len() as u32).to_le_bytes());
        for (name, value) in &self.fields {
            for part in [name, value] {
                key.extend_from_slice(&(part.len() as u32).to_le_bytes());
                key.extend_from_slice(part.as_bytes());
            }
        }
        let mut out = Vec::with_capacity(HEADER_BYTES + key.len() + self.payload.len());
        out.extend_from_slice(&BLOB_MAGIC);
        out.extend_from_slice(&CACHE_BLOB_VERSION.to_le_bytes());
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.payload.len() as u64).to_le_bytes());
        let sum = checksum(&out, &key, &self.payload);
        out.extend_from_slice(&sum);
        out.extend_from_slice(&key);
        out.extend_from_slice(&self.payload);
        out
    }

    /// The value of key field `name`, if the record has it.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The key record of a program: see the module documentation for the order.
fn key_fields(
    device: &DeviceFingerprint,
    image_digest: Digest,
    image_len: u64,
    spec: &SpecConstants,
    options: &BuildOptions,
) -> Vec<(String, String)> {
    let mut f = vec![
        ("kpc_format".to_string(), KPC_FORMAT_VERSION.to_string()),
        ("backend".to_string(), device.backend.to_string()),
    ];
    f.extend(device.fields.iter().cloned());
    let spec_hex: String = spec
        .canonical_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    f.extend([
        ("image_digest".to_string(), image_digest.to_hex()),
        ("image_len".to_string(), image_len.to_string()),
        ("spec".to_string(), spec_hex),
        ("options".to_string(), options.as_str().to_string()),
    ]);
    f
}

/// Refuses `found` unless it is field for field the record `expected`, naming the first field that
/// differs.
fn check_key(expected: &[(String, String)], found: &[(String, String)]) -> Result<()> {
    let absent = "(absent)".to_string();
    for i in 0..expected.len().max(found.len()) {
        let mismatch = match (expected.get(i), found.get(i)) {
            (Some(e), Some(f)) if e == f => continue,
            (Some((name, value)), Some((fname, fvalue))) => Error::BlobMismatch {
                field: name.clone(),
                expected: value.clone(),
                found: if fname == name {
                    fvalue.clone()
                } else {
                    format!("{absent}; field {i} is {fname}={fvalue}")
                },
            },
            (Some((name, value)), None) => Error::BlobMismatch {
                field: name.clone(),
                expected: value.clone(),
                found: absent.clone(),
            },
            (None, Some((name, value))) => Error::BlobMismatch {
                field: name.clone(),
                expected: absent.clone(),
                found: value.clone(),
            },
            (None, None) => continue,
        };
        return Err(mismatch);
    }
    Ok(())
}

impl Context {
    fn check_image_format(&self, image: &DeviceImage) -> Result<()> {
        let want = match self.backend() {
            BackendKind::Vulkan => ImageFormat::SpirV,
            BackendKind::OpenCl => ImageFormat::OpenClC,
        };
        if image.format() == want {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "image {:?} holds {}; a {} context takes {want} images ({})",
                image.name(),
                image.format(),
                self.backend(),
                want.made_by()
            )))
        }
    }

    /// The cache-blob id of `request`'s program (its image built with its spec constants and build
    /// options) on this context's device: stable bytes covering the whole key (blob and kpc format
    /// versions, device fingerprint digest, image digest and length, spec constants, build options;
    /// layout in the module documentation). The request's entry point is not part of it: a blob
    /// holds the whole program, so every entry of one program shares its id. Equal ids mean
    /// interchangeable blobs: store blobs under their id.
    ///
    /// Errors: [`Error::InvalidArgument`] for an image of the other backend's format; what
    /// compiling a GLSL image to SPIR-V returns (its id is its SPIR-V's).
    pub fn cache_blob_id(&self, request: &KernelRequest) -> Result<Vec<u8>> {
        let (image, spec, options) = (&request.image, &request.spec, &request.options);
        // A GLSL image's blobs are its SPIR-V's: the id needs that SPIR-V (from the SPIR-V cache).
        let resolved = self.glsl_spirv(image)?;
        let image = resolved.as_ref().map_or(image, |(i, _)| i);
        self.check_image_format(image)?;
        let spec = spec.canonical_bytes();
        let options = options.as_str().as_bytes();
        let mut id = Vec::with_capacity(96 + spec.len() + options.len());
        id.extend_from_slice(&BLOB_ID_MAGIC);
        id.extend_from_slice(&CACHE_BLOB_VERSION.to_le_bytes());
        id.extend_from_slice(&KPC_FORMAT_VERSION.to_le_bytes());
        id.extend_from_slice(&self.device().fingerprint.digest.0);
        id.extend_from_slice(&image.digest().0);
        id.extend_from_slice(&(image.bytes().len() as u64).to_le_bytes());
        for part in [&spec[..], options] {
            id.extend_from_slice(&(part.len() as u32).to_le_bytes());
            id.extend_from_slice(part);
        }
        Ok(id)
    }

    /// The kernel `request` names (entry, image, spec constants, options) from `blob`, without
    /// compiling:
    /// the blob is parsed and checksummed, every key field is compared with this context's, and only
    /// then is its payload handed to the backend, which checks its own header before the driver
    /// sees it. The program then sits in this context's memory cache, so later [`Context::kernel`]
    /// calls for the key are memory hits; nothing is written to the disk cache. The kernel's
    /// [`Kernel::source`] is `Source::Blob`, or `Source::Memory` where the program was in memory
    /// already (the blob is then verified but not loaded).
    ///
    /// Errors: [`Error::CorruptBlob`] for bytes that are not an intact blob; [`Error::BlobMismatch`]
    /// naming the first key field that differs (another device, driver, kpc format, image, spec
    /// constants or options); [`Error::BinaryRejected`] when the backend refuses the payload;
    /// [`Error::UnknownKernel`] for an entry the image lacks; [`Error::InvalidArgument`] for an image
    /// of the other backend's format.
    pub fn kernel_from_blob(&self, request: &KernelRequest, blob: &[u8]) -> Result<Kernel> {
        let (image, entry) = (&request.image, request.entry.as_str());
        let (spec, options) = (&request.spec, &request.options);
        let declared = options.as_str().is_empty().then(|| image.digest());
        let resolved = self.glsl_spirv(image)?;
        let (image, spirv) = match &resolved {
            Some((i, step)) => (i, Some(*step)),
            None => (image, None),
        };
        self.check_image_format(image)?;
        let parsed = CacheBlob::parse(blob)?;
        let expected = key_fields(
            &self.device().fingerprint,
            image.digest(),
            image.bytes().len() as u64,
            spec,
            options,
        );
        check_key(&expected, &parsed.fields)?;
        self.check_entry(image, entry)?;
        let a =
            self.inner
                .programs
                .kernel_from_binary(image, entry, spec, options, &parsed.payload)?;
        Ok(Kernel {
            obj: a.value as Arc<dyn KernelObject>,
            context: self.inner.id,
            source: a.source,
            elapsed: a.elapsed,
            spirv,
            declared,
            generic: false,
        })
    }
}

impl Kernel {
    /// Its program as a cache blob: the self-describing container of the module documentation,
    /// which [`Context::kernel_from_blob`] accepts on any context whose [`Context::cache_blob_id`]
    /// for the key is the same. Works after the context evicted the kernel or was dropped: the
    /// kernel holds its program.
    ///
    /// Errors: what serializing the program returns ([`Error::Backend`] for a failed driver query);
    /// [`Error::InvalidArgument`] for a kernel of a backend outside kpc that keeps no program.
    pub fn cache_blob(&self) -> Result<Vec<u8>> {
        let unsupported = || {
            Error::InvalidArgument(format!(
                "kernel {:?} comes from a backend that does not keep its program, so it has no \
                 cache blob",
                self.name()
            ))
        };
        let origin = self.obj.origin().ok_or_else(unsupported)?;
        let payload = self.obj.program_binary()?.ok_or_else(unsupported)?;
        Ok(CacheBlob {
            fields: key_fields(
                &origin.device,
                origin.image_digest,
                origin.image_len,
                &origin.spec,
                &origin.options,
            ),
            payload,
        }
        .to_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CacheBlob {
        CacheBlob {
            fields: vec![
                ("kpc_format".into(), "1".into()),
                ("driver_version".into(), "0x01".into()),
            ],
            payload: vec![1, 2, 3, 4, 5],
        }
    }

    #[test]
    fn round_trip_and_every_cut_is_refused() {
        let b = sample();
        let bytes = b.to_bytes();
        assert_eq!(CacheBlob::parse(&bytes).unwrap(), b);
        for n in 0..bytes.len() {
            assert!(
                matches!(
                    CacheBlob::parse(&bytes[..n]),
                    Err(Error::CorruptBlob { .. })
                ),
                "cut at {n}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(CacheBlob::parse(&longer).is_err());
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let bytes = sample().to_bytes();
        for i in 0..bytes.len() {
            let mut t = bytes.clone();
            t[i] ^= 0x10;
            assert!(
                matches!(CacheBlob::parse(&t), Err(Error::CorruptBlob { .. })),
                "byte {i}"
            );
        }
    }

    #[test]
    fn the_first_differing_field_is_named() {
        let e = sample().fields;
        let mut f = e.clone();
        f[1].1 = "0x02".into();
        match check_key(&e, &f) {
            Err(Error::BlobMismatch {
                field,
                expected,
                found,
            }) => {
                assert_eq!(field, "driver_version");
                assert_eq!((expected.as_str(), found.as_str()), ("0x01", "0x02"));
            }
            other => panic!("{other:?}"),
        }
        assert!(check_key(&e, &e).is_ok());
        assert!(matches!(
            check_key(&e, &e[..1]),
            Err(Error::BlobMismatch { field, .. }) if field == "driver_version"
        ));
    }
}
