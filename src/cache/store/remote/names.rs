//! Where things live on the remote: entries, crash markers, fleet locks, shared manifests; and the
//! fleet lock's holder token.

use std::time::Instant;

use crate::cache::store::StoreKey;
use crate::cache::store::entry::FORMAT_VERSION;

/// The namespace of every entry: kpc's format version.
pub(super) fn namespace() -> String {
    format!("kpc/v{FORMAT_VERSION}/")
}

/// Where `key`'s entry lives on the remote.
pub(crate) fn path_of(key: &StoreKey) -> String {
    format!(
        "{}{}/{}",
        namespace(),
        key.device_digest().to_hex(),
        key.digest().to_hex()
    )
}

/// Where the marker saying that `bytes` for `key` crashed a loading process lives: beside the
/// namespace of entries (so listings never meet it), under the same format and device.
pub(super) fn crash_marker_path(key: &StoreKey, bytes: &[u8]) -> String {
    format!(
        "kpc-crashed/{}.{}",
        &path_of(key)["kpc/".len()..],
        &blake3::hash(bytes).to_hex()[..32]
    )
}

/// The namespace of the last-served records (`retention.rs`), beside the entries'.
pub(super) fn served_namespace() -> String {
    format!("kpc-served/v{FORMAT_VERSION}/")
}

/// Where the record of when `key`'s entry was last served (or published) lives.
pub(super) fn served_path(key: &StoreKey) -> String {
    format!("kpc-served/{}", &path_of(key)["kpc/".len()..])
}

/// The entry path a last-served record's path stands for.
pub(super) fn entry_of_served(served: &str) -> Option<String> {
    Some(format!("kpc/{}", served.strip_prefix("kpc-served/")?))
}

pub(super) fn lock_name(key: &StoreKey) -> String {
    format!("kpc-lock/{}", &path_of(key)["kpc/".len()..])
}

pub(super) fn token() -> String {
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    h.update(format!("{:?}{:?}", std::thread::current().id(), Instant::now()).as_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    h.finalize().to_hex()[..32].to_owned()
}

/// Where application `app`'s shared warm-start manifest lives: beside the entries' namespace, one
/// object per application for every device (a manifest carries its images; prebuild picks those of
/// its backend).
pub(super) fn manifest_path(app: &str) -> String {
    format!("kpc-manifests/v{FORMAT_VERSION}/{app}")
}

/// The key a shared manifest is sealed and authenticated under: fixed per application, so one
/// shared for another application, or an entry, never opens as it.
pub(super) fn manifest_key(app: &str) -> StoreKey {
    let id = |s: &str| crate::cache::Digest(*blake3::hash(s.as_bytes()).as_bytes());
    StoreKey::new(
        "kpc-manifest",
        id("kpc-manifest"),
        id(app),
        0,
        b"",
        "manifest",
    )
}
