//! Compressed transfers against a real redis-server (tests/common/redis.rs): entries are published
//! zstd-compressed (version-3 envelopes), a fresh machine is served the exact binary, entries written
//! uncompressed (`KPC_CACHE_REMOTE_COMPRESS=0`, or by kpc before compression) are still read, and a
//! decompression bomb (declared too large, or expanding past what it declares) is refused, counted,
//! warned about once and never reaches the backend.
#![cfg(feature = "remote")]

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::disk::{TempDir, capture};
use common::fake_backend::{FakeBackend, key, program};
use common::redis::RedisServer;
use kpc::Config;
use kpc::RemoteUrl;
use kpc::Source;
use kpc::StoreKey;
use kpc::StoreKind;
use kpc::admin::disk::PersistentCache;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::store::auth;

fn config(root: &Path, url: &str, level: u8) -> Config {
    Config::builder()
        .cache_dir(root)
        .remote(RemoteUrl::parse(url).unwrap())
        .remote_timeout(Duration::from_secs(2))
        .remote_compress(level)
        .build()
        .unwrap()
}

fn path_of(k: &StoreKey) -> String {
    format!(
        "kpc/v1/{}/{}",
        k.device_digest().to_hex(),
        k.digest().to_hex()
    )
}

/// The remote level's (hits, misses, errors).
fn remote_stats(pm: &ProgramManager) -> (u64, u64, u64) {
    let s = pm
        .store_stats()
        .into_iter()
        .find(|l| l.kind == StoreKind::Remote)
        .expect("a remote level")
        .store;
    (s.hits, s.misses, s.errors)
}

/// The binary `cfg`'s local disk holds for `k`.
fn on_disk(cfg: &Config, k: &StoreKey) -> Vec<u8> {
    let disk = PersistentCache::from_config(cfg).unwrap();
    disk.get_read_only(k)
        .expect("on the local disk")
        .bytes()
        .to_vec()
}

#[test]
fn compressed_and_uncompressed_entries_serve_every_reader_the_same_binary() {
    let Some(r) = RedisServer::start("compressed_and_uncompressed_entries_serve_every_reader")
    else {
        return;
    };
    let t = TempDir::new("remote-compress");
    let be = Arc::new(FakeBackend::new().binary_size(64 << 10));
    // Builder A compresses (the default level); builder B publishes uncompressed, as kpc before
    // compression did.
    let a = config(&t.join("a"), &r.url(), 3);
    let b = config(&t.join("b"), &r.url(), 0);
    let pm_a = ProgramManager::new(be.clone(), &a);
    let pm_b = ProgramManager::new(be.clone(), &b);
    assert_eq!(program(&pm_a, 0), Source::Built);
    assert_eq!(program(&pm_b, 1), Source::Built);
    let (k0, k1) = (key(&pm_a, 0), key(&pm_a, 1));
    let (v0, v1) = (r.get(&path_of(&k0)), r.get(&path_of(&k1)));
    assert_eq!(auth::is_compressed(&v0), Some(true));
    assert_eq!(auth::is_compressed(&v1), Some(false));
    assert!(
        v0.len() * 4 < v1.len(),
        "compressed {} against {} bytes",
        v0.len(),
        v1.len()
    );
    // Fresh readers of either setting are served both, byte for byte what the builders hold.
    for (tag, level) in [("r3", 3), ("r0", 0), ("r19", 19)] {
        let cfg = config(&t.join(tag), &r.url(), level);
        let pm = ProgramManager::new(be.clone(), &cfg);
        assert_eq!(
            (program(&pm, 0), program(&pm, 1)),
            (Source::Remote, Source::Remote),
            "{tag}"
        );
        assert_eq!(remote_stats(&pm), (2, 0, 0), "{tag}");
        assert_eq!(on_disk(&cfg, &k0), on_disk(&a, &k0), "{tag}");
        assert_eq!(on_disk(&cfg, &k1), on_disk(&b, &k1), "{tag}");
    }
    assert_eq!(be.builds(), 2);
}

/// A compressed envelope whose block (after the header, the provenance and no MAC or signature)
/// is replaced by `declared` and `frame`.
fn with_block(genuine: &[u8], declared: u64, frame: &[u8]) -> Vec<u8> {
    assert_eq!(
        &genuine[..6],
        b"KPCE\x03\x04",
        "an unsigned compressed envelope"
    );
    let prov_len = u32::from_le_bytes(genuine[8..12].try_into().unwrap()) as usize;
    let mut v = genuine[..12 + prov_len].to_vec();
    v.extend_from_slice(&declared.to_le_bytes());
    v.extend_from_slice(frame);
    v
}

#[test]
fn a_decompression_bomb_is_refused_and_never_reaches_the_backend() {
    let Some(r) = RedisServer::start("a_decompression_bomb_is_refused") else {
        return;
    };
    let t = TempDir::new("remote-bomb");
    let be = Arc::new(FakeBackend::new().binary_size(16 << 10));
    let a = config(&t.join("a"), &r.url(), 3);
    let pm = ProgramManager::new(be.clone(), &a);
    assert_eq!(program(&pm, 0), Source::Built);
    let target = path_of(&key(&pm, 0));
    let genuine = r.get(&target);
    // 512 MiB of zeros: a few KB compressed.
    let zeros = zstd::bulk::compress(&vec![0u8; 512 << 20], 19).unwrap();
    let cases = [
        // Declared as what it is: over the reader's limit (KPC_CACHE_MAX_DEVICE_IMAGE_SIZE=64M plus
        // a key record), refused before decompressing.
        ("declared", with_block(&genuine, 512 << 20, &zeros)),
        // Declared small: decompression stops one byte past the declared length.
        ("lying", with_block(&genuine, 20_000, &zeros)),
        // Not zstd at all.
        ("garbage", with_block(&genuine, 20_000, b"not a zstd frame")),
    ];
    for (tag, bomb) in cases {
        assert!(bomb.len() < 64 << 10, "{tag}: {} bytes", bomb.len());
        r.set(&target, &bomb);
        let mut cfg = config(&t.join(tag), &r.url(), 3);
        cfg.max_device_image_size = 64 << 20;
        let builds = be.builds();
        let ((src, stats), ev) = capture(|| {
            let pm = ProgramManager::new(be.clone(), &cfg);
            (program(&pm, 0), remote_stats(&pm))
        });
        assert_eq!(src, Source::Built, "{tag}");
        assert_eq!(stats, (0, 1, 1), "{tag}: refused and counted");
        assert_eq!(be.builds(), builds + 1, "{tag}: built locally");
        let warned: Vec<_> = ev
            .iter()
            .filter(|e| e.level == tracing::Level::WARN && e.target == "kpc::cache::store")
            .map(|e| {
                let m = e.fields.get("message").cloned().unwrap_or_default();
                (e.fields.get("cause").cloned().unwrap_or_default(), m)
            })
            .collect();
        assert_eq!(warned.len(), 1, "{tag}: {warned:?}");
        assert_eq!(warned[0].0, "corrupt", "{tag}: {warned:?}");
        if tag == "declared" {
            assert!(
                warned[0].1.contains("declares 536870912 bytes"),
                "{warned:?}"
            );
        }
    }
}
