//! How the disk cache joins the store chain: the chain `Config` asks for (the local disk cache, the
//! read-only layers, the remote), the local disk as the chain's crash guard
//! ([`LocalLevel`]), and the way back from the chain to its local disk cache.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use super::{DiskCacheSettings, PersistentCache};
use crate::cache::store::crash::{CrashedLoading, LocalLevel};
use crate::cache::store::{ReadOnlyStore, Store, StoreChain, StoreKey};
use crate::config::Config;

impl StoreChain {
    /// What `config` asks for: the local disk cache (unless `KPC_CACHE_PERSISTENT=0` or no directory
    /// resolves), then the read-only layers of `KPC_CACHE_READONLY_DIRS` in order, then the remote
    /// (`KPC_CACHE_REMOTE`).
    ///
    /// A local root that cannot be used (a file, or a directory that cannot be created) leaves the
    /// disk cache out: warned once through the configuration's warning sink, and said by
    /// [`StoreChain::local_unusable`].
    pub fn from_config(config: &Config) -> StoreChain {
        match PersistentCache::open_from_config(config) {
            Ok(disk) => StoreChain::with_local_disk(disk, config),
            Err(why) => {
                let mut chain = StoreChain::with_local_disk(None, config);
                crate::warnings::emit!(
                    Some(&config.warning_sink()),
                    target: "kpc::cache::disk",
                    cause: "unusable-root",
                    "disk cache off: {why}; every kernel is built instead of loaded (set \
                     KPC_CACHE_DIR or Config::builder().cache_dir(..) to a directory kpc can \
                     create and write)"
                );
                chain.set_local_unusable(why);
                chain
            }
        }
    }

    /// `disk` as the local cache (none for none), then `config`'s read-only layers and remote.
    pub fn with_local_disk(disk: Option<PersistentCache>, config: &Config) -> StoreChain {
        let mut chain = StoreChain::new();
        chain.configure(config);
        if let Some(d) = disk {
            chain = chain.with_disk(d);
        }
        chain.with_read_only_dirs(config).with_remote(config)
    }

    /// Appends `disk` as the next level; the first disk cache appended this way is the local one
    /// (`StoreChain::local_disk`, the crash guard of every load).
    pub fn with_disk(mut self, disk: PersistentCache) -> StoreChain {
        if !self.has_local() {
            self.set_local(Arc::new(disk.clone()));
            self.journal_mut().local = Some(disk.clone());
        }
        self.with_store(Arc::new(disk))
    }

    /// Appends a read-only layer for each of `config.readonly_dirs`, with `config`'s image size limits:
    /// a disk cache for a directory, a [`BundleStore`](crate::cache::bundle::BundleStore) for a bundle
    /// file. None when `KPC_CACHE_PERSISTENT=0`: that switch turns off every on-disk layer.
    pub(crate) fn with_read_only_dirs(mut self, config: &Config) -> StoreChain {
        if !config.persistent {
            return self;
        }
        for dir in &config.readonly_dirs {
            // A bundle file (`kpc cache export`) is read in place; anything else is a cache directory.
            let inner: Arc<dyn Store> = if crate::cache::bundle::layer::is_bundle_path(dir) {
                Arc::new(crate::cache::bundle::BundleStore::from_config(config, dir))
            } else {
                Arc::new(PersistentCache::new(DiskCacheSettings::from_config_at(
                    config, dir,
                )))
            };
            let mut store = ReadOnlyStore::new(inner);
            store.set_sink(config.warning_sink());
            self = self.with_store(Arc::new(store));
        }
        self
    }

    /// The local disk cache, if one was added with [`StoreChain::with_disk`].
    pub(crate) fn local_disk(&self) -> Option<&PersistentCache> {
        self.local_level()?
            .as_any()
            .downcast_ref::<PersistentCache>()
    }
}

impl LocalLevel for PersistentCache {
    fn begin_load(
        &self,
        key: &StoreKey,
        bytes: &[u8],
    ) -> Result<Option<Box<dyn Send>>, CrashedLoading> {
        PersistentCache::begin_load(self, key, bytes)
            .map(|r| r.map(|r| Box::new(r) as Box<dyn Send>))
    }

    fn crashed_before(&self, key: &StoreKey, bytes: &[u8]) -> bool {
        PersistentCache::crashed_before(self, key, bytes).is_some()
    }

    fn note_serialize_failure(&self, reason: &dyn fmt::Display) {
        PersistentCache::note_serialize_failure(self, reason);
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
