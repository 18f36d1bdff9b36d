//! The key every store files a binary under, and the key record kept beside each entry (in the disk
//! cache's `<n>.src`, in a remote object's envelope).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::cache::Digest;
use crate::cache::store::provenance::{Provenance, driver_of};

impl Provenance {
    /// The provenance of an entry for `key` written now by host `host`: built at `built_unix`
    /// (`None`: now) in `build_time`, by this kpc, with the key's driver.
    pub fn for_key(
        host: &str,
        key: &StoreKey,
        built_unix: Option<u64>,
        build_time: Duration,
    ) -> Provenance {
        Provenance {
            host: host.to_owned(),
            kpc_version: env!("CARGO_PKG_VERSION").to_owned(),
            driver: driver_of(key.device()),
            built_unix: built_unix.unwrap_or_else(now_unix),
            build_time,
            signer: None,
        }
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Hex characters of each directory name: 8 bytes of BLAKE3. Collisions at this length are rare, and
/// harmless when they happen: the full key values in `.src` decide, and a colliding key takes the next n.
pub const DIR_HEX_BYTES: usize = 8;

/// What a persisted binary is stored under. The cache treats every part as opaque: the runtime decides
/// what a device is and how to serialize spec constants and options.
///
/// Two keys are the same entry iff every compared part is byte-for-byte equal: device description and
/// digest, image digest and length, spec constant bytes, options. The label is informational (shown by
/// `kpc cache ls`) and never compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreKey {
    device: String,
    device_digest: Digest,
    image_digest: Digest,
    image_len: u64,
    spec: Vec<u8>,
    options: String,
    label: String,
    digest: Digest,
    dirs: [String; 4],
}

fn put_part(h: &mut blake3::Hasher, part: &[u8]) {
    h.update(&(part.len() as u64).to_le_bytes());
    h.update(part);
}

fn dir_name(domain: &str, parts: &[&[u8]]) -> String {
    let mut h = blake3::Hasher::new();
    put_part(&mut h, domain.as_bytes());
    for p in parts {
        put_part(&mut h, p);
    }
    Digest(*h.finalize().as_bytes()).short_hex(DIR_HEX_BYTES)
}

impl StoreKey {
    /// The key of a binary built for the device described by `device` (name=value lines, e.g. a
    /// fingerprint's `describe()`) whose digest is `device_digest`, from an image of `image_len` bytes
    /// with digest `image_digest`, with specialization constants `spec` (canonical bytes) and build
    /// options `options`.
    pub fn new(
        device: &str,
        device_digest: Digest,
        image_digest: Digest,
        image_len: u64,
        spec: &[u8],
        options: &str,
    ) -> StoreKey {
        let dirs = [
            dir_name("device", &[device.as_bytes(), &device_digest.0]),
            dir_name("image", &[&image_digest.0, &image_len.to_le_bytes()]),
            dir_name("spec", &[spec]),
            dir_name("options", &[options.as_bytes()]),
        ];
        let mut h = blake3::Hasher::new();
        put_part(&mut h, b"kpc-disk-key-v1");
        put_part(&mut h, device.as_bytes());
        put_part(&mut h, &device_digest.0);
        put_part(&mut h, &image_digest.0);
        put_part(&mut h, &image_len.to_le_bytes());
        put_part(&mut h, spec);
        put_part(&mut h, options.as_bytes());
        StoreKey {
            device: device.to_owned(),
            device_digest,
            image_digest,
            image_len,
            spec: spec.to_vec(),
            options: options.to_owned(),
            label: String::new(),
            digest: Digest(*h.finalize().as_bytes()),
            dirs,
        }
    }

    /// Sets the informational label (the image's name), shown by `kpc cache ls`; not part of the key.
    pub fn with_label(mut self, label: &str) -> StoreKey {
        self.label = label.to_owned();
        self
    }

    /// BLAKE3 over every compared part: what each entry file's header binds the file to.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// Length of the device image: what `KPC_CACHE_MIN/MAX_DEVICE_IMAGE_SIZE` are compared with.
    pub fn image_len(&self) -> u64 {
        self.image_len
    }

    /// The four directory names: device, image, spec constants, options.
    pub fn dir_names(&self) -> &[String; 4] {
        &self.dirs
    }

    /// The informational label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The device description (name=value lines).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The device digest.
    pub fn device_digest(&self) -> Digest {
        self.device_digest
    }

    /// The image digest.
    pub fn image_digest(&self) -> Digest {
        self.image_digest
    }

    /// The canonical spec constant bytes.
    pub fn spec(&self) -> &[u8] {
        &self.spec
    }

    /// The build options.
    pub fn options(&self) -> &str {
        &self.options
    }

    /// The `.src` payload: the full key values plus what `kpc cache ls` shows, and where given the
    /// entry's provenance (who built it; the disk cache records it, a sealed entry leaves it to its
    /// envelope).
    pub(crate) fn record_json(
        &self,
        build_time: Duration,
        bin_len: u64,
        provenance: Option<&Provenance>,
    ) -> Vec<u8> {
        let created = now_unix();
        let mut v = json!({
            "device": self.device,
            "device_digest": self.device_digest.to_hex(),
            "image_digest": self.image_digest.to_hex(),
            "image_len": self.image_len,
            "spec": hex(&self.spec),
            "options": self.options,
            "label": self.label,
            "build_ns": build_time.as_nanos().min(u64::MAX as u128) as u64,
            "bin_len": bin_len,
            "created_unix": created,
        });
        if let Some(p) = provenance {
            let mut pv = p.to_value();
            if let Some(s) = &p.signer {
                pv["signer"] = json!(s);
            }
            v["provenance"] = pv;
        }
        let mut out = serde_json::to_vec_pretty(&v).expect("a JSON value always serializes");
        out.push(b'\n');
        out
    }
}

/// A parsed key record (what an entry was built from, in words): parsing checks its form, not its
/// authenticity, which the entry's checksums and signature establish.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyRecord {
    /// The device description (name=value lines).
    pub device: String,
    /// The device digest, hex.
    pub device_digest: String,
    /// The image digest, hex.
    pub image_digest: String,
    /// The image length in bytes.
    pub image_len: u64,
    /// The spec constant bytes, hex.
    pub spec: String,
    /// The build options.
    pub options: String,
    /// The label (image name).
    pub label: String,
    /// How long the original build took.
    pub build_time: Duration,
    /// Length of the binary's payload.
    pub bin_len: u64,
    /// When the entry was written (seconds since the Unix epoch).
    pub created_unix: u64,
    /// Who built the binary, where the entry records it (disk entries written by this kpc; the
    /// signer is the key whose signature this machine verified when it took the entry).
    pub provenance: Option<Provenance>,
}

impl KeyRecord {
    /// Parses a `.src` payload; `None` if it is not a key record.
    pub(crate) fn parse(payload: &[u8]) -> Option<KeyRecord> {
        let v: Value = serde_json::from_slice(payload).ok()?;
        let s = |k: &str| v.get(k)?.as_str().map(str::to_owned);
        let n = |k: &str| v.get(k)?.as_u64();
        Some(KeyRecord {
            device: s("device")?,
            device_digest: s("device_digest")?,
            image_digest: s("image_digest")?,
            image_len: n("image_len")?,
            spec: s("spec")?,
            options: s("options")?,
            label: s("label").unwrap_or_default(),
            build_time: Duration::from_nanos(n("build_ns").unwrap_or(0)),
            bin_len: n("bin_len").unwrap_or(0),
            created_unix: n("created_unix").unwrap_or(0),
            provenance: v.get("provenance").and_then(|p| {
                let mut prov = Provenance::from_value(p)?;
                prov.signer = p.get("signer").and_then(Value::as_str).map(str::to_owned);
                Some(prov)
            }),
        })
    }

    /// Whether this record is exactly `key`: every compared value equal, not just the hashes.
    pub fn matches(&self, key: &StoreKey) -> bool {
        self.image_len == key.image_len
            && self.options == key.options
            && self.device == key.device
            && self.device_digest == key.device_digest.to_hex()
            && self.image_digest == key.image_digest.to_hex()
            && self.spec == hex(&key.spec)
    }

    /// The key this record describes, if its values are well formed.
    pub fn to_key(&self) -> Option<StoreKey> {
        let key = StoreKey::new(
            &self.device,
            Digest(unhex(&self.device_digest)?.try_into().ok()?),
            Digest(unhex(&self.image_digest)?.try_into().ok()?),
            self.image_len,
            &unhex(&self.spec)?,
            &self.options,
        );
        Some(key.with_label(&self.label))
    }

    /// The backend named in the device description (`backend=...`), or "?".
    pub fn backend(&self) -> &str {
        self.field("backend").unwrap_or("?")
    }

    /// The first device-description field whose name contains "name" (the device's name), if any.
    pub fn device_name(&self) -> Option<&str> {
        self.device.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            k.to_ascii_lowercase().contains("name").then_some(v)
        })
    }

    fn field(&self, name: &str) -> Option<&str> {
        self.device.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k == name).then_some(v)
        })
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(D[(b >> 4) as usize] as char);
        s.push(D[(b & 15) as usize] as char);
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}
