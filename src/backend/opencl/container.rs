//! The bytes kpc persists for an OpenCL program: a small header that names the device and the exact
//! build it came from, the reflected kernel interface, then the driver's CL_PROGRAM_BINARIES blob.
//!
//! Why a container rather than the driver blob alone:
//! - a blob from another device or driver is refused here, before it reaches the driver (drivers
//!   are not required to reject foreign binaries gracefully);
//! - drivers need not keep kernel-argument info for programs created from binaries
//!   (clGetKernelArgInfo may answer CL_KERNEL_ARG_INFO_NOT_AVAILABLE), so the interface reflected at
//!   the source build travels with the blob.
//!
//! Layout, little endian:
//! ```text
//! magic "KPCOCLB1" | u32 format version | [u8; 32] device fingerprint digest
//! | [u8; 32] build digest (image digest, spec constants, options) | u32 n, n x kernel | u64 m, m bytes of driver binary
//! kernel = str name | u32 x3 required local size | u32 p, p x param
//! param  = str name | u8 kind (0 buffer, 1 scalar, 2 unsupported) | buffer: u8 read_only
//!          | scalar: u32 size, u32 align | unsupported: str why
//! str    = u32 length, UTF-8 bytes
//! ```
//! Decoding checks every length against what is left, so truncated or random bytes are an error,
//! never a panic or a huge allocation.

use crate::cache::Digest;

use super::meta::{KernelMeta, Param, ParamKind};

const MAGIC: &[u8; 8] = b"KPCOCLB1";
/// Bumped whenever the layout changes; an old container is then refused (a miss).
pub const CONTAINER_VERSION: u32 = 1;

/// A decoded container.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenClBinary {
    /// The fingerprint digest of the device that built it.
    pub device: Digest,
    /// What was built: see `program::build_digest`.
    pub build: Digest,
    /// The kernels, as reflected when the program was built from source.
    pub kernels: Vec<KernelMeta>,
    /// The driver's program binary (PoCL: its own format; NVIDIA: PTX text).
    pub driver_binary: Vec<u8>,
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!(
                "truncated: {what} needs {n} bytes, {} left",
                self.0.len()
            ));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    fn digest(&mut self, what: &str) -> Result<Digest, String> {
        let mut d = [0u8; 32];
        d.copy_from_slice(self.take(32, what)?);
        Ok(Digest(d))
    }
    fn str(&mut self, what: &str) -> Result<String, String> {
        let n = self.u32(what)? as usize;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }
    /// A count of items that each take at least `min_bytes`: bounded by what is left, so a
    /// corrupt count cannot make the decoder loop or allocate far beyond the input.
    fn count(&mut self, what: &str, min_bytes: usize) -> Result<usize, String> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_bytes) > self.0.len() {
            return Err(format!(
                "{what} claims {n} entries but only {} bytes are left",
                self.0.len()
            ));
        }
        Ok(n)
    }
}

impl OpenClBinary {
    /// The container's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(self.driver_binary.len() + 256));
        w.0.extend_from_slice(MAGIC);
        w.u32(CONTAINER_VERSION);
        w.0.extend_from_slice(&self.device.0);
        w.0.extend_from_slice(&self.build.0);
        w.u32(self.kernels.len() as u32);
        for k in &self.kernels {
            w.str(&k.name);
            for s in k.reqd_local_size {
                w.u32(s);
            }
            w.u32(k.params.len() as u32);
            for p in &k.params {
                w.str(&p.name);
                match &p.kind {
                    ParamKind::Buffer { read_only } => {
                        w.u8(0);
                        w.u8(u8::from(*read_only));
                    }
                    ParamKind::Scalar { size, align } => {
                        w.u8(1);
                        w.u32(*size);
                        w.u32(*align);
                    }
                    ParamKind::Unsupported(why) => {
                        w.u8(2);
                        w.str(why);
                    }
                }
            }
        }
        w.0.extend_from_slice(&(self.driver_binary.len() as u64).to_le_bytes());
        w.0.extend_from_slice(&self.driver_binary);
        w.0
    }

    /// Decodes `bytes`.
    ///
    /// Errors: a description of the first thing wrong (not a kpc container, another container
    /// version, truncated, trailing bytes, an impossible field).
    pub fn decode(bytes: &[u8]) -> Result<OpenClBinary, String> {
        let mut r = Reader(bytes);
        if r.take(8, "magic")? != MAGIC {
            return Err("not a kpc OpenCL binary (bad magic)".into());
        }
        let version = r.u32("version")?;
        if version != CONTAINER_VERSION {
            return Err(format!(
                "container version {version}, this kpc reads {CONTAINER_VERSION}"
            ));
        }
        let device = r.digest("device digest")?;
        let build = r.digest("build digest")?;
        // A kernel takes at least 20 bytes (name length, local size, parameter count).
        let n = r.count("kernel count", 20)?;
        let mut kernels = Vec::new();
        for _ in 0..n {
            let name = r.str("kernel name")?;
            let mut reqd_local_size = [0u32; 3];
            for s in &mut reqd_local_size {
                *s = r.u32("local size")?;
            }
            let np = r.count("parameter count", 5)?;
            let mut params = Vec::new();
            for _ in 0..np {
                let pname = r.str("parameter name")?;
                let kind = match r.u8("parameter kind")? {
                    0 => ParamKind::Buffer {
                        read_only: r.u8("read_only")? != 0,
                    },
                    1 => {
                        let size = r.u32("scalar size")?;
                        let align = r.u32("scalar alignment")?;
                        if size == 0 || size > 128 || !align.is_power_of_two() || align > 128 {
                            return Err(format!(
                                "parameter {pname:?}: impossible scalar size {size} / alignment {align}"
                            ));
                        }
                        ParamKind::Scalar { size, align }
                    }
                    2 => ParamKind::Unsupported(r.str("unsupported reason")?),
                    k => return Err(format!("parameter {pname:?}: unknown kind {k}")),
                };
                params.push(Param { name: pname, kind });
            }
            kernels.push(KernelMeta {
                name,
                params,
                reqd_local_size,
            });
        }
        let len = r.u64("driver binary length")?;
        if len != r.0.len() as u64 {
            return Err(format!(
                "driver binary length {len} but {} bytes follow",
                r.0.len()
            ));
        }
        if len == 0 {
            return Err("empty driver binary".into());
        }
        Ok(OpenClBinary {
            device,
            build,
            kernels,
            driver_binary: r.0.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> OpenClBinary {
        OpenClBinary {
            device: Digest::of(b"dev"),
            build: Digest::of(b"build"),
            kernels: vec![KernelMeta {
                name: "saxpy".into(),
                reqd_local_size: [64, 1, 1],
                params: vec![
                    Param {
                        name: "x".into(),
                        kind: ParamKind::Buffer { read_only: true },
                    },
                    Param {
                        name: "n".into(),
                        kind: ParamKind::Scalar { size: 4, align: 4 },
                    },
                    Param {
                        name: "scratch".into(),
                        kind: ParamKind::Unsupported("local".into()),
                    },
                ],
            }],
            driver_binary: vec![1, 2, 3, 4, 5],
        }
    }

    #[test]
    fn round_trip() {
        let b = sample();
        assert_eq!(OpenClBinary::decode(&b.encode()).unwrap(), b);
    }

    #[test]
    fn every_truncation_and_garbage_is_an_error() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            assert!(OpenClBinary::decode(&bytes[..n]).is_err(), "prefix {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(OpenClBinary::decode(&longer).is_err());
        // A huge kernel count must fail fast, not allocate.
        let mut huge = bytes.clone();
        huge[76..80].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(OpenClBinary::decode(&huge).unwrap_err().contains("claims"));
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in [0usize, 7, 80, 1000] {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            assert!(OpenClBinary::decode(&junk).is_err());
        }
    }
}
