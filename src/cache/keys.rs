//! Cache keys. The program key is the SYCL runtime's four parts (device image, specialization
//! constants, device, build options); the kernel key is (program key, entry point). The cache treats
//! every part as opaque bytes: digests come from the runtime, which knows what a device is.

use std::fmt;
use std::sync::Arc;

/// A 32-byte BLAKE3 digest, printed as hex. Equal digests are taken to mean equal bytes: it is what
/// cache keys compare.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl std::hash::Hash for Digest {
    /// A digest is already uniformly distributed, so eight of its bytes are as good a hash as all 32 and
    /// cost a quarter as much on the cache's hit path; equality still compares all 32.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut head = [0u8; 8];
        head.copy_from_slice(&self.0[..8]);
        state.write_u64(u64::from_le_bytes(head));
    }
}

impl Digest {
    /// The BLAKE3 digest of `bytes`: stable across builds, platforms and processes.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(*blake3::hash(bytes).as_bytes())
    }
    /// The full digest as 64 hex characters.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
    /// The first `n` bytes as hex (2n characters): short names for directories and logs.
    pub fn short_hex(&self, n: usize) -> String {
        self.0[..n.min(32)]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short_hex(6))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.short_hex(6))
    }
}

/// A specialization constant value. Floats are kept as bits so keys compare and hash exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecValue {
    /// A boolean constant.
    Bool(bool),
    /// A 32-bit signed integer.
    I32(i32),
    /// A 32-bit unsigned integer.
    U32(u32),
    /// A 32-bit float, stored as its bits.
    F32Bits(u32),
    /// A 64-bit signed integer.
    I64(i64),
    /// A 64-bit unsigned integer.
    U64(u64),
    /// A 64-bit float, stored as its bits.
    F64Bits(u64),
}

impl SpecValue {
    /// A 32-bit float constant.
    pub fn f32(v: f32) -> SpecValue {
        SpecValue::F32Bits(v.to_bits())
    }
    /// The value's bytes as a Vulkan specialization data entry (little endian; bool is a 32-bit 0/1).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match *self {
            SpecValue::Bool(b) => (b as u32).to_le_bytes().to_vec(),
            SpecValue::I32(v) => v.to_le_bytes().to_vec(),
            SpecValue::U32(v) | SpecValue::F32Bits(v) => v.to_le_bytes().to_vec(),
            SpecValue::I64(v) => v.to_le_bytes().to_vec(),
            SpecValue::U64(v) | SpecValue::F64Bits(v) => v.to_le_bytes().to_vec(),
        }
    }
    /// The type's name in the words of SPIR-V and C APIs: `bool`, `i32`, `u32`, `f32`, `i64`,
    /// `u64`, `f64`.
    pub fn type_name(self) -> &'static str {
        match self {
            SpecValue::Bool(_) => "bool",
            SpecValue::I32(_) => "i32",
            SpecValue::U32(_) => "u32",
            SpecValue::F32Bits(_) => "f32",
            SpecValue::I64(_) => "i64",
            SpecValue::U64(_) => "u64",
            SpecValue::F64Bits(_) => "f64",
        }
    }
    /// The value as C source text, for an OpenCL `-D NAME=value` definition.
    // Only the backends and the warm start use it; the loom build has neither.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn to_c_literal(self) -> String {
        match self {
            SpecValue::Bool(b) => (b as u32).to_string(),
            SpecValue::I32(v) => v.to_string(),
            SpecValue::U32(v) => format!("{v}u"),
            SpecValue::F32Bits(v) => format!("{:?}f", f32::from_bits(v)),
            SpecValue::I64(v) => format!("{v}l"),
            SpecValue::U64(v) => format!("{v}ul"),
            SpecValue::F64Bits(v) => format!("{:?}", f64::from_bits(v)),
        }
    }
    fn tag(&self) -> u8 {
        match self {
            SpecValue::Bool(_) => 0,
            SpecValue::I32(_) => 1,
            SpecValue::U32(_) => 2,
            SpecValue::F32Bits(_) => 3,
            SpecValue::I64(_) => 4,
            SpecValue::U64(_) => 5,
            SpecValue::F64Bits(_) => 6,
        }
    }
}

/// Specialization constant values by id, kept sorted so equal sets compare, hash and serialize equal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SpecConstants(Vec<(u32, SpecValue)>);

impl SpecConstants {
    /// No constants.
    pub fn new() -> Self {
        SpecConstants(Vec::new())
    }
    /// Sets constant `id` (replacing an earlier value for the same id).
    pub fn with(mut self, id: u32, value: SpecValue) -> Self {
        match self.0.binary_search_by_key(&id, |(i, _)| *i) {
            Ok(pos) => self.0[pos].1 = value,
            Err(pos) => self.0.insert(pos, (id, value)),
        }
        self
    }
    /// The constants, sorted by id.
    pub fn iter(&self) -> impl Iterator<Item = &(u32, SpecValue)> {
        self.0.iter()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// A canonical, stable byte encoding (for disk keys): per constant, id, type tag and value.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.0.len() * 13);
        for (id, v) in &self.0 {
            out.extend_from_slice(&id.to_le_bytes());
            out.push(v.tag());
            let mut b = v.to_le_bytes();
            b.resize(8, 0);
            out.extend_from_slice(&b);
        }
        out
    }
    /// The constants [`SpecConstants::canonical_bytes`] encoded, or `None` when `bytes` is not such an
    /// encoding (a length not a multiple of 13, an unknown type tag, ids out of order or repeated).
    // Only the backends and the warm start use it; the loom build has neither.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn from_canonical_bytes(bytes: &[u8]) -> Option<SpecConstants> {
        if bytes.len() % 13 != 0 {
            return None;
        }
        let mut out: Vec<(u32, SpecValue)> = Vec::with_capacity(bytes.len() / 13);
        for c in bytes.chunks_exact(13) {
            let id = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            let mut v = [0u8; 8];
            v.copy_from_slice(&c[5..13]);
            let lo = u32::from_le_bytes([v[0], v[1], v[2], v[3]]);
            let hi_zero = v[4..].iter().all(|&b| b == 0);
            let value = match c[4] {
                0 if hi_zero && lo <= 1 => SpecValue::Bool(lo == 1),
                1 if hi_zero => SpecValue::I32(lo as i32),
                2 if hi_zero => SpecValue::U32(lo),
                3 if hi_zero => SpecValue::F32Bits(lo),
                4 => SpecValue::I64(i64::from_le_bytes(v)),
                5 => SpecValue::U64(u64::from_le_bytes(v)),
                6 => SpecValue::F64Bits(u64::from_le_bytes(v)),
                _ => return None,
            };
            // Sorted and unique, as `with` keeps them: anything else was not made by canonical_bytes.
            if out.last().is_some_and(|(last, _)| *last >= id) {
                return None;
            }
            out.push((id, value));
        }
        Some(SpecConstants(out))
    }
}

/// Build options, whitespace-normalized: `"-a  -b"` and `" -a -b"` are the same program.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct BuildOptions(Arc<str>);

impl BuildOptions {
    /// Normalizes `s` by collapsing runs of whitespace.
    pub fn new(s: &str) -> Self {
        BuildOptions(s.split_whitespace().collect::<Vec<_>>().join(" ").into())
    }
    /// The normalized text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Whether the individual option `opt` is present.
    pub fn has(&self, opt: &str) -> bool {
        self.0.split(' ').any(|o| o == opt)
    }
}

impl From<&str> for BuildOptions {
    fn from(s: &str) -> Self {
        BuildOptions::new(s)
    }
}

/// The key of a built program: device image, spec constants, device and build options.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ProgramKey {
    /// Digest of the device image bytes.
    pub image: Digest,
    /// Specialization constant values.
    pub spec: SpecConstants,
    /// Digest of the device fingerprint.
    pub device: Digest,
    /// Normalized build options.
    pub options: BuildOptions,
}

impl ProgramKey {
    /// The key of the program built from image digest `image` with `spec`, for device digest
    /// `device`, with `options`.
    pub fn new(image: Digest, spec: SpecConstants, device: Digest, options: BuildOptions) -> Self {
        ProgramKey {
            image,
            spec,
            device,
            options,
        }
    }
}

/// The key of a kernel: its program and entry point name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KernelKey {
    /// The program the kernel comes from.
    pub program: ProgramKey,
    /// The entry point.
    pub entry: Arc<str>,
}

impl KernelKey {
    /// The kernel `entry` of `program`.
    pub fn new(program: ProgramKey, entry: &str) -> Self {
        KernelKey {
            program,
            entry: entry.into(),
        }
    }
}

/// A kernel key made of borrowed parts, so a lookup that hits allocates nothing: no spec-constant
/// vector clone, no entry-name `Arc`. It hashes and compares exactly like the owned [`KernelKey`].
#[derive(Debug, Clone, Copy)]
pub struct KernelKeyRef<'a> {
    /// Digest of the device image bytes.
    pub image: Digest,
    /// Specialization constant values.
    pub spec: &'a SpecConstants,
    /// Digest of the device fingerprint.
    pub device: Digest,
    /// Normalized build options.
    pub options: &'a BuildOptions,
    /// The entry point.
    pub entry: &'a str,
}

/// The parts of a kernel key, owned or borrowed: what lets the kernel map be searched by a
/// [`KernelKeyRef`] (through `Borrow<dyn KernelKeyParts>`) without building a [`KernelKey`].
pub trait KernelKeyParts {
    /// The image digest.
    fn image(&self) -> &Digest;
    /// The specialization constants.
    fn spec(&self) -> &SpecConstants;
    /// The device digest.
    fn device(&self) -> &Digest;
    /// The build options.
    fn options(&self) -> &BuildOptions;
    /// The entry point.
    fn entry(&self) -> &str;
}

impl KernelKeyParts for KernelKey {
    fn image(&self) -> &Digest {
        &self.program.image
    }
    fn spec(&self) -> &SpecConstants {
        &self.program.spec
    }
    fn device(&self) -> &Digest {
        &self.program.device
    }
    fn options(&self) -> &BuildOptions {
        &self.program.options
    }
    fn entry(&self) -> &str {
        &self.entry
    }
}

impl KernelKeyParts for KernelKeyRef<'_> {
    fn image(&self) -> &Digest {
        &self.image
    }
    fn spec(&self) -> &SpecConstants {
        self.spec
    }
    fn device(&self) -> &Digest {
        &self.device
    }
    fn options(&self) -> &BuildOptions {
        self.options
    }
    fn entry(&self) -> &str {
        self.entry
    }
}

impl<'a> std::borrow::Borrow<dyn KernelKeyParts + 'a> for KernelKey {
    fn borrow(&self) -> &(dyn KernelKeyParts + 'a) {
        self
    }
}

// One hashing routine for owned and borrowed keys: `Borrow` requires that both hash identically.
fn hash_parts<H: std::hash::Hasher>(k: &(impl KernelKeyParts + ?Sized), h: &mut H) {
    use std::hash::Hash;
    k.image().hash(h);
    k.spec().hash(h);
    k.device().hash(h);
    k.options().hash(h);
    k.entry().hash(h);
}

impl std::hash::Hash for KernelKey {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        hash_parts(self, h);
    }
}

impl std::hash::Hash for dyn KernelKeyParts + '_ {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        hash_parts(self, h);
    }
}

impl PartialEq for dyn KernelKeyParts + '_ {
    fn eq(&self, o: &Self) -> bool {
        self.image() == o.image()
            && self.device() == o.device()
            && self.entry() == o.entry()
            && self.spec() == o.spec()
            && self.options() == o.options()
    }
}

impl Eq for dyn KernelKeyParts + '_ {}

impl std::fmt::Display for SpecValue {
    /// The type and the value as a person writes them (`f32 1.5`, `u32 64`), never the bit pattern.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.type_name();
        match *self {
            SpecValue::Bool(b) => write!(f, "{t} {b}"),
            SpecValue::I32(v) => write!(f, "{t} {v}"),
            SpecValue::U32(v) => write!(f, "{t} {v}"),
            SpecValue::F32Bits(v) => write!(f, "{t} {}", f32::from_bits(v)),
            SpecValue::I64(v) => write!(f, "{t} {v}"),
            SpecValue::U64(v) => write!(f, "{t} {v}"),
            SpecValue::F64Bits(v) => write!(f, "{t} {}", f64::from_bits(v)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn borrowed_kernel_keys_hash_and_compare_like_owned_ones() {
        let spec = SpecConstants::new().with(0, SpecValue::U32(80));
        let options = BuildOptions::new("-O");
        let owned = KernelKey::new(
            ProgramKey {
                image: Digest::of(b"img"),
                spec: spec.clone(),
                device: Digest::of(b"dev"),
                options: options.clone(),
            },
            "main",
        );
        let view = KernelKeyRef {
            image: Digest::of(b"img"),
            spec: &spec,
            device: Digest::of(b"dev"),
            options: &options,
            entry: "main",
        };
        let s = std::collections::hash_map::RandomState::new();
        let dv: &dyn KernelKeyParts = &view;
        assert_eq!(s.hash_one(&owned), s.hash_one(dv));
        let b: &dyn KernelKeyParts = std::borrow::Borrow::borrow(&owned);
        assert!(b == dv);
        let other = KernelKeyRef {
            entry: "other",
            ..view
        };
        assert!(b != &other as &dyn KernelKeyParts);
    }
}
