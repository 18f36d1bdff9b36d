//! A shipped cache silently unused: a read-only layer or the remote that serves none of the first 32
//! lookups of a context is warned about once, with the dominant miss cause (counting fake backend,
//! real files, a real redis-server for the remote).

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::disk::{Ev, TempDir, capture};
use common::fake_backend::{FakeBackend, image};
use common::redis::RedisServer;
use kpc::Config;
use kpc::RemoteUrl;
use kpc::Source;
use kpc::admin::disk::DiskCacheSettings;
use kpc::admin::disk::PersistentCache;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::store::IDLE_LOOKUPS;
use kpc::admin::store::ReadOnlyStore;
use kpc::{BuildOptions, SpecConstants, StoreChain};

fn config(root: &Path) -> Config {
    Config::builder().cache_dir(root).build().unwrap()
}

fn acquire(pm: &ProgramManager, i: usize) -> Source {
    let img = image(&format!("k{i}.cl"), &["main"]);
    pm.kernel(
        &img,
        "main",
        &SpecConstants::new(),
        &BuildOptions::default(),
    )
    .unwrap()
    .source
}

fn idle_warnings(events: &[Ev]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.level == tracing::Level::WARN && e.target == "kpc::cache::store")
        .filter_map(|e| e.fields.get("message").cloned())
        .filter(|m| m.contains("has served none of the"))
        .collect()
}

/// A read-only layer holding kernels 0..n built by driver version "2".
fn shipped_layer(dir: &Path, n: usize) {
    let old = ProgramManager::new(
        Arc::new(FakeBackend::with_driver_version("fake-device-0", "2")),
        &config(dir),
    );
    for i in 0..n {
        assert_eq!(acquire(&old, i), Source::Built);
    }
}

fn manager_over(local: &Path, shipped: &Path) -> ProgramManager {
    let ro = PersistentCache::new(DiskCacheSettings::from_config_at(&config(shipped), shipped));
    let chain = StoreChain::new()
        .with_disk(PersistentCache::from_config(&config(local)).unwrap())
        .with_store(Arc::new(ReadOnlyStore::new(Arc::new(ro))));
    ProgramManager::with_stores(
        Arc::new(FakeBackend::with_driver_version("fake-device-0", "1")),
        &config(local),
        chain,
    )
}

#[test]
fn a_read_only_layer_for_another_driver_is_warned_about_once_with_the_field() {
    let (local, shipped) = (TempDir::new("idle-local"), TempDir::new("idle-ro"));
    let n = IDLE_LOOKUPS as usize + 8;
    shipped_layer(shipped.path(), n);
    let pm = manager_over(local.path(), shipped.path());
    let (_, events) = capture(|| {
        for i in 0..IDLE_LOOKUPS as usize - 1 {
            assert_eq!(acquire(&pm, i), Source::Built);
        }
    });
    assert!(idle_warnings(&events).is_empty(), "not before 32 lookups");
    let (_, events) = capture(|| {
        for i in IDLE_LOOKUPS as usize - 1..n {
            assert_eq!(acquire(&pm, i), Source::Built);
        }
    });
    let w = idle_warnings(&events);
    assert_eq!(w.len(), 1, "{w:?}");
    let want = format!(
        "readonly:disk:{} has served none of the 32 lookups this context made: most misses are \
         device-changed (32 of the first 32), e.g. driverVersion 2 → 1; it is not used",
        shipped.path().display()
    );
    assert!(w[0].starts_with(&want), "{}\nwant: {want}", w[0]);
}

#[test]
fn a_read_only_layer_that_served_once_is_not_warned_about() {
    let (local, shipped) = (TempDir::new("idle-local2"), TempDir::new("idle-ro2"));
    // Kernel 0 built by this driver: the layer serves it once; the rest miss.
    let same = ProgramManager::new(
        Arc::new(FakeBackend::with_driver_version("fake-device-0", "1")),
        &config(shipped.path()),
    );
    assert_eq!(acquire(&same, 0), Source::Built);
    let pm = manager_over(local.path(), shipped.path());
    let (_, events) = capture(|| {
        assert_eq!(acquire(&pm, 0), Source::ReadOnly);
        for i in 1..IDLE_LOOKUPS as usize * 2 {
            assert_eq!(acquire(&pm, i), Source::Built);
        }
    });
    assert!(idle_warnings(&events).is_empty());
}

#[test]
fn an_empty_remote_is_warned_about_after_32_lookups() {
    let Some(r) = RedisServer::start("an_empty_remote_is_warned_about_after_32_lookups") else {
        return;
    };
    let dir = TempDir::new("idle-remote");
    let cfg = Config::builder()
        .cache_dir(dir.path())
        .remote(RemoteUrl::parse(&r.url()).unwrap())
        .remote_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let pm = ProgramManager::new(Arc::new(FakeBackend::new()), &cfg);
    let (_, events) = capture(|| {
        for i in 0..IDLE_LOOKUPS as usize + 4 {
            assert_eq!(acquire(&pm, i), Source::Built);
        }
    });
    let w = idle_warnings(&events);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains(
            "has served none of the 32 lookups this context made: it holds no entry \
             under this device's keys"
        ),
        "{}",
        w[0]
    );
}
