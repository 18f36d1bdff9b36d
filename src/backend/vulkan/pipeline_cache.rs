//! What a Vulkan program persists as, and the checks a persisted blob passes before any of it reaches
//! the driver.
//!
//! The persisted binary is a small kpc container around the driver's vkGetPipelineCacheData blob:
//!
//! ```text
//! magic "kpcvkbin" | u32 format version | u32 flags | u64 SPIR-V bytes | u64 payload bytes |
//! SPIR-V words (only for programs built with -O: the optimized module, so a load does not re-run the
//! optimizer) | payload
//! ```
//!
//! The payload is the pipeline cache data (starting with VkPipelineCacheHeaderVersionOne) or, with
//! flag 2, the pipelines' VK_KHR_pipeline_binary binaries (`pipeline_binary.rs`). Which one a device
//! writes and reads is fixed per device and named in its fingerprint (`kpc_vulkan_binary`), so an
//! entry of one kind is never looked up for the other; a blob of the wrong kind is refused anyway.
//!
//! All integers are little endian. The disk layer checksums the whole binary; these checks are about
//! meaning: is this blob for this device and driver, and is it shaped as kpc writes it?

use ash::vk;

/// Version of the container above. It is part of the Vulkan device fingerprint, so bumping it turns
/// every old blob into a miss before it is even read.
pub const BLOB_FORMAT_VERSION: u32 = 1;

const MAGIC: &[u8; 8] = b"kpcvkbin";
const CONTAINER_HEADER: usize = 8 + 4 + 4 + 8 + 8;
const FLAG_OPTIMIZED_SPIRV: u32 = 1;
const FLAG_PIPELINE_BINARIES: u32 = 2;

/// The bytes of a VkPipelineCacheHeaderVersionOne: headerSize, headerVersion, vendorID, deviceID,
/// pipelineCacheUUID.
pub const PIPELINE_CACHE_HEADER_BYTES: usize = 16 + vk::UUID_SIZE;

/// What identifies the device a pipeline-cache blob was made on, per the Vulkan specification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheIdentity {
    /// VkPhysicalDeviceProperties::vendorID.
    pub vendor_id: u32,
    /// VkPhysicalDeviceProperties::deviceID.
    pub device_id: u32,
    /// VkPhysicalDeviceProperties::pipelineCacheUUID.
    pub uuid: [u8; vk::UUID_SIZE],
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Checks a vkGetPipelineCacheData blob's VkPipelineCacheHeaderVersionOne against `device`: the
/// length, the header version, vendorID, deviceID and pipelineCacheUUID must all match. An empty blob
/// (a driver that keeps nothing) passes: there is nothing to hand the driver.
///
/// Errors: what did not match, in words.
pub fn check_pipeline_cache_header(data: &[u8], device: &CacheIdentity) -> Result<(), String> {
    if data.is_empty() {
        return Ok(());
    }
    if data.len() < PIPELINE_CACHE_HEADER_BYTES {
        return Err(format!(
            "pipeline cache data is {} bytes, shorter than its {PIPELINE_CACHE_HEADER_BYTES}-byte header",
            data.len()
        ));
    }
    // VUID-VkPipelineCacheHeaderVersionOne-headerSize-04967: a version-one header is exactly 32
    // bytes. NVIDIA's driver took a blob whose headerSize said 122 without complaint (found on an
    // H100 by tests/vulkan_binary.rs), so kpc checks it rather than pass the driver invalid data.
    let header_size = u32_at(data, 0) as usize;
    if header_size != PIPELINE_CACHE_HEADER_BYTES {
        return Err(format!(
            "pipeline cache headerSize {header_size}, expected {PIPELINE_CACHE_HEADER_BYTES}"
        ));
    }
    let version = u32_at(data, 4);
    if version != vk::PipelineCacheHeaderVersion::ONE.as_raw() as u32 {
        return Err(format!(
            "pipeline cache headerVersion {version}, expected 1"
        ));
    }
    let (vendor, dev) = (u32_at(data, 8), u32_at(data, 12));
    if vendor != device.vendor_id {
        return Err(format!(
            "pipeline cache vendorID {vendor:#x}, this device's is {:#x}",
            device.vendor_id
        ));
    }
    if dev != device.device_id {
        return Err(format!(
            "pipeline cache deviceID {dev:#x}, this device's is {:#x}",
            device.device_id
        ));
    }
    if data[16..16 + vk::UUID_SIZE] != device.uuid {
        return Err("pipeline cache UUID differs from this device's pipelineCacheUUID".into());
    }
    Ok(())
}

/// What a persisted Vulkan program holds for the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// vkGetPipelineCacheData of the program's pipeline cache.
    PipelineCache(&'a [u8]),
    /// The pipelines' VK_KHR_pipeline_binary binaries, as `pipeline_binary::encode` writes them.
    PipelineBinaries(&'a [u8]),
}

impl<'a> Payload<'a> {
    /// The payload's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        match *self {
            Payload::PipelineCache(b) | Payload::PipelineBinaries(b) => b,
        }
    }

    /// Its kind as the fingerprint names it: `pipeline-cache` or `pipeline-binary`.
    pub fn kind(&self) -> &'static str {
        match self {
            Payload::PipelineCache(_) => PIPELINE_CACHE_KIND,
            Payload::PipelineBinaries(_) => PIPELINE_BINARY_KIND,
        }
    }
}

/// The fingerprint's `kpc_vulkan_binary` value of a device that persists pipeline-cache data.
pub const PIPELINE_CACHE_KIND: &str = "pipeline-cache";
/// The fingerprint's `kpc_vulkan_binary` value of a device that persists pipeline binaries.
pub const PIPELINE_BINARY_KIND: &str = "pipeline-binary";

/// A persisted Vulkan program, parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct ProgramBlob<'a> {
    /// The optimized SPIR-V the program was built from, for programs built with -O.
    pub optimized_spirv: Option<&'a [u8]>,
    /// What the driver gets back.
    pub payload: Payload<'a>,
}

/// The container bytes for a program built from `optimized_spirv` (with -O) whose driver data is
/// `payload`.
pub fn encode(optimized_spirv: Option<&[u32]>, payload: Payload<'_>) -> Vec<u8> {
    let data = payload.bytes();
    let spirv_bytes = optimized_spirv.map_or(0, |w| w.len() * 4);
    let mut out = Vec::with_capacity(CONTAINER_HEADER + spirv_bytes + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&BLOB_FORMAT_VERSION.to_le_bytes());
    let mut flags = if optimized_spirv.is_some() {
        FLAG_OPTIMIZED_SPIRV
    } else {
        0
    };
    if matches!(payload, Payload::PipelineBinaries(_)) {
        flags |= FLAG_PIPELINE_BINARIES;
    }
    out.extend_from_slice(&flags.to_le_bytes());
    out.extend_from_slice(&(spirv_bytes as u64).to_le_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    for w in optimized_spirv.unwrap_or_default() {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.extend_from_slice(data);
    out
}

/// Parses a container written by [`encode`].
///
/// Errors: what is wrong with it, in words (wrong magic or version, lengths that do not add up).
pub fn decode(bytes: &[u8]) -> Result<ProgramBlob<'_>, String> {
    if bytes.len() < CONTAINER_HEADER || &bytes[..8] != MAGIC {
        return Err("not a kpc Vulkan program binary".into());
    }
    let version = u32_at(bytes, 8);
    if version != BLOB_FORMAT_VERSION {
        return Err(format!(
            "kpc Vulkan binary format {version}, this build reads {BLOB_FORMAT_VERSION}"
        ));
    }
    let flags = u32_at(bytes, 12);
    if flags & !(FLAG_OPTIMIZED_SPIRV | FLAG_PIPELINE_BINARIES) != 0 {
        return Err(format!("unknown flags {flags:#x}"));
    }
    let spirv_len = u64_at(bytes, 16);
    let cache_len = u64_at(bytes, 24);
    let body = (bytes.len() - CONTAINER_HEADER) as u64;
    if spirv_len.checked_add(cache_len) != Some(body) || spirv_len % 4 != 0 {
        return Err(format!(
            "lengths {spirv_len} + {cache_len} do not match the {body} bytes that follow the header"
        ));
    }
    let has_spirv = flags & FLAG_OPTIMIZED_SPIRV != 0;
    if has_spirv != (spirv_len > 0) {
        return Err("SPIR-V flag and length disagree".into());
    }
    let split = CONTAINER_HEADER + spirv_len as usize;
    let data = &bytes[split..];
    Ok(ProgramBlob {
        optimized_spirv: has_spirv.then(|| &bytes[CONTAINER_HEADER..split]),
        payload: if flags & FLAG_PIPELINE_BINARIES != 0 {
            Payload::PipelineBinaries(data)
        } else {
            Payload::PipelineCache(data)
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> CacheIdentity {
        CacheIdentity {
            vendor_id: 0x10de,
            device_id: 0x2335,
            uuid: [7; 16],
        }
    }

    fn header(id: &CacheIdentity, extra: usize) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&32u32.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        h.extend_from_slice(&id.vendor_id.to_le_bytes());
        h.extend_from_slice(&id.device_id.to_le_bytes());
        h.extend_from_slice(&id.uuid);
        h.resize(32 + extra, 0xab);
        h
    }

    #[test]
    fn header_checks_every_field() {
        let id = identity();
        assert_eq!(check_pipeline_cache_header(&header(&id, 100), &id), Ok(()));
        assert_eq!(check_pipeline_cache_header(&[], &id), Ok(()));
        let mut h = header(&id, 0);
        h.truncate(31);
        assert!(
            check_pipeline_cache_header(&h, &id)
                .unwrap_err()
                .contains("shorter")
        );
        for (at, what) in [
            (0, "headerSize"),
            (4, "headerVersion"),
            (8, "vendorID"),
            (12, "deviceID"),
            (20, "UUID"),
        ] {
            let mut h = header(&id, 4);
            h[at] ^= 0x40;
            let e = check_pipeline_cache_header(&h, &id).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
        // A headerSize other than 32 is refused even where the data is long enough to hold it.
        let mut h = header(&id, 200);
        h[0] ^= 0x5a;
        let e = check_pipeline_cache_header(&h, &id).unwrap_err();
        assert!(e.contains("headerSize 122"), "{e}");
    }

    #[test]
    fn container_round_trips_and_rejects_damage() {
        let words = [0x0723_0203u32, 0x0001_0300, 1, 2, 3];
        let cache = header(&identity(), 10);
        let b = encode(Some(&words), Payload::PipelineCache(&cache));
        let p = decode(&b).unwrap();
        assert_eq!(p.optimized_spirv.unwrap().len(), 20);
        assert_eq!(p.payload, Payload::PipelineCache(&cache[..]));
        let plain = encode(None, Payload::PipelineCache(&cache));
        assert_eq!(decode(&plain).unwrap().optimized_spirv, None);
        let bins = encode(None, Payload::PipelineBinaries(b"xyz"));
        assert_eq!(
            decode(&bins).unwrap().payload,
            Payload::PipelineBinaries(b"xyz")
        );
        let mut unknown = plain.clone();
        unknown[12] |= 4;
        assert!(decode(&unknown).unwrap_err().contains("unknown flags"));
        assert!(decode(&b[..b.len() - 1]).is_err());
        assert!(decode(b"kpcvkbi").is_err());
        let mut v = b.clone();
        v[8] = 9;
        assert!(decode(&v).unwrap_err().contains("format"));
    }
}
