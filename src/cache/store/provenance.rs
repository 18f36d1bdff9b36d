//! Provenance: who wrote a shared entry (a remote object, a bundle entry), with which kpc, for which
//! driver, when, and how long its build took. Carried in the entry's envelope ([`super::auth`]) and
//! covered by its MAC and signature, so a reader that verified the entry can believe it.

use std::time::Duration;

use serde_json::{Value, json};

/// The provenance of one shared entry.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Provenance {
    /// The writer's host id (`KPC_HOST_ID`, default its host name): the builder for a remote entry
    /// (a process publishes only what it built), the exporting machine for a bundle entry.
    pub host: String,
    /// The writer's kpc version.
    pub kpc_version: String,
    /// The driver the binary was built by: the device description's `driver*` fields.
    pub driver: String,
    /// When the binary was built (seconds since the Unix epoch; for a bundle entry, when it was
    /// written to the exporter's disk cache).
    pub built_unix: u64,
    /// How long the build took.
    pub build_time: Duration,
    /// The signer's public key fingerprint (`ed25519:...`), for a signed entry. Filled from the
    /// signature itself, never from the provenance text.
    pub signer: Option<String>,
}

/// The `driver*` fields of a device description (name=value lines), joined: which driver built it.
pub fn driver_of(device: &str) -> String {
    let v: Vec<&str> = device.lines().filter(|l| l.starts_with("driver")).collect();
    if v.is_empty() {
        "-".into()
    } else {
        v.join(" ")
    }
}

impl Provenance {
    /// As JSON (the signer is not in it: an envelope's comes from its signature).
    pub(crate) fn to_value(&self) -> Value {
        json!({
            "host": self.host,
            "kpc": self.kpc_version,
            "driver": self.driver,
            "built_unix": self.built_unix,
            "build_ns": self.build_time.as_nanos().min(u64::MAX as u128) as u64,
        })
    }

    /// Parses what [`Provenance::to_value`] made; `None` if it is not that.
    pub(crate) fn from_value(v: &Value) -> Option<Provenance> {
        let s = |k: &str| v.get(k)?.as_str().map(str::to_owned);
        Some(Provenance {
            host: s("host")?,
            kpc_version: s("kpc")?,
            driver: s("driver")?,
            built_unix: v.get("built_unix")?.as_u64()?,
            build_time: Duration::from_nanos(v.get("build_ns")?.as_u64()?),
            signer: None,
        })
    }

    /// The bytes the envelope carries (JSON; the signer is not in them).
    pub(crate) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_value()).expect("a JSON value always serializes")
    }

    /// Parses what [`Provenance::encode`] wrote; `None` if it is not that.
    pub(crate) fn decode(raw: &[u8]) -> Option<Provenance> {
        Provenance::from_value(&serde_json::from_slice(raw).ok()?)
    }
}
