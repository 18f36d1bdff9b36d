//! A manifest shared through the fleet's stores: each process that writes its application's
//! manifest also merges it into the one a shared store (the remote) keeps for that application, so
//! that a machine that never ran the application can prebuild what the fleet uses
//! (`kpc cache prebuild`). Best effort throughout: a store that fails or holds nothing costs a
//! warning (the store's own, once per cause), never the manifest on disk.

use std::collections::HashSet;
use std::sync::Arc;

use super::manifest::{self, MAX_BYTES, MAX_RECORDS};
use super::{KernelRequest, WarmStart};
use crate::cache::Store;

/// `theirs` then `ours`, each kernel once (the first time it appears), without those `drop` names.
pub(super) fn merge<'a>(
    theirs: impl IntoIterator<Item = &'a KernelRequest>,
    ours: impl IntoIterator<Item = &'a KernelRequest>,
    drop: &HashSet<manifest::RecordId>,
) -> Vec<KernelRequest> {
    let mut seen = HashSet::new();
    theirs
        .into_iter()
        .chain(ours)
        .filter(|r| {
            let id = manifest::id_of(r);
            !drop.contains(&id) && seen.insert(id)
        })
        .cloned()
        .collect()
}

/// Encodes `records` within the manifest's limits ([`MAX_RECORDS`], [`MAX_BYTES`]), dropping the
/// oldest (the front) first; `records` is left as what was encoded.
pub(super) fn encode_bounded(records: &mut Vec<KernelRequest>) -> Vec<u8> {
    if records.len() > MAX_RECORDS {
        records.drain(..records.len() - MAX_RECORDS);
    }
    let mut bytes = manifest::encode(records);
    while bytes.len() > MAX_BYTES && !records.is_empty() {
        records.drain(..records.len().div_ceil(4));
        bytes = manifest::encode(records);
    }
    bytes
}

/// The kernels the manifest of `app` shared through `stores` names (every store's, each kernel
/// once); a manifest that does not verify or decode counts as none.
pub fn shared_requests<'a>(
    stores: impl IntoIterator<Item = &'a Arc<dyn Store>>,
    app: &str,
) -> Vec<KernelRequest> {
    let all: Vec<KernelRequest> = stores
        .into_iter()
        .filter_map(|s| s.fleet()?.get_manifest(app))
        .filter_map(|b| manifest::decode(&b).ok())
        .flatten()
        .collect();
    merge(&all, &[], &HashSet::new())
}

impl WarmStart {
    /// Makes every later manifest write also merge into the manifest `stores` share
    /// ([`Fleet::put_manifest`](crate::cache::store::Fleet::put_manifest)); the first call wins.
    pub fn share_through(&self, stores: Vec<Arc<dyn Store>>) {
        let _ = self.shared.set(stores);
    }

    /// Merges `ours` (what was just written to disk) into each shared store's manifest of this
    /// application.
    pub(super) fn publish_shared(&self, ours: &[KernelRequest]) {
        let fleet = self.shared.get().into_iter().flatten();
        for s in fleet.filter_map(|s| s.fleet()) {
            let theirs = s
                .get_manifest(&self.app)
                .and_then(|b| manifest::decode(&b).ok())
                .unwrap_or_default();
            let mut merged = merge(&theirs, ours, &HashSet::new());
            if merged.len() == theirs.len() {
                continue; // nothing of ours is new there
            }
            s.put_manifest(&self.app, &encode_bounded(&mut merged));
        }
    }
}
