//! What a store shared by a fleet of machines offers beyond storage, behind one optional capability
//! ([`Store::fleet`](super::Store::fleet)): crash markers, the shared miss journal and shared
//! warm-start manifests. Only the remote implements it; the chain, the journal and the warm start ask
//! for it and skip stores without it, so [`Store`](super::Store) keeps storage operations only.

use std::io;

use super::StoreKey;

/// A store shared by machines: what they tell each other through it. Every method is best effort: a
/// failure is warned about by the store, never returned to the caller (except [`Fleet::read_journal`],
/// an inspection).
pub trait Fleet: Send + Sync {
    /// Another machine found that `bytes`, stored for `key`, crashed a process that loaded them (a
    /// crash marker it published, see `src/cache/disk/loading.rs`): `Some` with where the marker is,
    /// and the caller refuses them.
    fn crashed_marker(&self, key: &StoreKey, bytes: &[u8]) -> Option<String>;

    /// `bytes`, stored for `key`, crashed a process that loaded them: publishes a marker, so that no
    /// other machine loads them ([`Fleet::crashed_marker`]).
    fn note_crashed(&self, key: &StoreKey, bytes: &[u8]);

    /// Appends miss journal records (one JSON line each, `crate::cache::journal`) to the fleet's
    /// shared journal, if this store keeps one; bounded by the store.
    fn share_journal(&self, lines: &[String]);

    /// The fleet's shared miss journal records, oldest first (`None` when this store keeps no
    /// journal).
    ///
    /// Errors: the store keeps one but could not be read.
    fn read_journal(&self) -> Option<io::Result<Vec<String>>>;

    /// Shares application `app`'s warm-start manifest (its encoded bytes) with other machines, for
    /// `kpc cache prebuild` there, authenticated as the store's entries are.
    fn put_manifest(&self, app: &str, manifest: &[u8]);

    /// The manifest of `app` shared through this store ([`Fleet::put_manifest`]), verified as its
    /// entries are; `None` when there is none or it fails to verify.
    fn get_manifest(&self, app: &str) -> Option<Vec<u8>>;
}
