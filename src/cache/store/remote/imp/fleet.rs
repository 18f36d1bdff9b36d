//! The remote's fleet capability ([`Fleet`]): crash markers beside its entries, authenticated as
//! they are, and the miss journal and warm-start manifests it shares (`journal.rs`, `manifest.rs`).

use std::io;
use std::time::Duration;

use super::super::names::crash_marker_path;
use super::RemoteStore;
use crate::cache::store::auth;
use crate::cache::store::provenance::Provenance;
use crate::cache::store::{Fleet, StoreKey, WarnCause, seal};

/// The remote is what a fleet shares: crash markers, the miss journal and warm-start manifests
/// live next to its entries, authenticated as they are.
impl Fleet for RemoteStore {
    fn crashed_marker(&self, key: &StoreKey, bytes: &[u8]) -> Option<String> {
        let path = crash_marker_path(key, bytes);
        let value = self.shared.ops.read(&path).ok()??;
        // A marker is a sealed entry for the key whose binary is its own path, authenticated
        // like any entry: a forger without the fleet's key cannot make machines rebuild.
        let hit = auth::open(&self.shared.auth, key, &value).ok()?;
        (hit.bytes() == path.as_bytes()).then(|| {
            self.shared.warnings.warn(
                WarnCause::Rejected,
                &format_args!(
                    "not loading a remote binary another machine found to crash its loader \
                     (crashed-loading marker {path})"
                ),
            );
            format!("remote:{}/{path}", self.url)
        })
    }

    fn note_crashed(&self, key: &StoreKey, bytes: &[u8]) {
        // Readers would refuse a marker this node cannot sign (a serving node under
        // KPC_CACHE_TRUSTED_KEYS): it quarantines locally only.
        let (path, sh) = (crash_marker_path(key, bytes), &self.shared);
        if !sh.auth.may_publish() {
            return;
        }
        let prov = Provenance::for_key(&sh.auth.host, key, None, Duration::ZERO);
        let sealed = seal(key, path.as_bytes(), Duration::ZERO);
        let value = auth::wrap(&sh.auth, key, &sealed, &prov);
        if let Err(f) = self.shared.ops.write(&path, value) {
            self.shared
                .warn("publishing a crashed-loading marker", &self.diagnose(f));
        }
    }

    fn share_journal(&self, lines: &[String]) {
        self.append_journal(lines);
    }

    fn read_journal(&self) -> Option<io::Result<Vec<String>>> {
        self.fleet_journal()
    }

    fn put_manifest(&self, app: &str, manifest: &[u8]) {
        self.publish_manifest(app, manifest);
    }

    fn get_manifest(&self, app: &str) -> Option<Vec<u8>> {
        self.shared_manifest(app)
    }
}
