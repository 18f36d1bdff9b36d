//! The remote's share of the warm-start manifests (`crate::runtime::warm_start`): one object per
//! application ([`manifest_path`]), sealed and authenticated under [`manifest_key`] like an entry, so
//! a forger without the fleet's key or a trusted signature cannot make machines prebuild its kernels.

use std::time::Duration;

use super::super::names::{manifest_key, manifest_path};
use super::RemoteStore;
use crate::cache::store::auth;
use crate::cache::store::provenance::Provenance;
use crate::cache::store::{WarnCause, seal};

impl RemoteStore {
    pub(super) fn publish_manifest(&self, app: &str, manifest: &[u8]) {
        let (key, sh) = (manifest_key(app), &self.shared);
        if !sh.auth.may_publish() || sh.ops.breaker.is_open() {
            return;
        }
        let prov = Provenance::for_key(&sh.auth.host, &key, None, Duration::ZERO);
        let value = auth::wrap(&sh.auth, &key, &seal(&key, manifest, Duration::ZERO), &prov);
        if let Err(f) = sh.ops.write(&manifest_path(app), value) {
            sh.warn("publishing a warm-start manifest", &self.diagnose(f));
        }
    }

    pub(super) fn shared_manifest(&self, app: &str) -> Option<Vec<u8>> {
        let value = match self.shared.ops.read(&manifest_path(app)) {
            Ok(v) => v?,
            Err(f) => {
                self.shared.failed("reading a warm-start manifest", &f);
                return None;
            }
        };
        match auth::open(&self.shared.auth, &manifest_key(app), &value) {
            Ok(hit) => Some(hit.into_bytes()),
            Err(r) => {
                let what = format_args!("a shared warm-start manifest for {app} refused: {r}");
                self.shared.warnings.warn(WarnCause::Rejected, &what);
                None
            }
        }
    }
}
