//! Writer signatures on the remote tier, against a real redis-server (tests/common/redis.rs) and a
//! real fs:// remote, with key pairs written to real files and read back through the environment
//! variables (`KPC_CACHE_SIGNING_KEY`, `KPC_CACHE_TRUSTED_KEYS`): a serving node holding only public
//! keys cannot produce an entry another node accepts; rotation (old and new accepted, then the old one
//! removed); forged, re-signed and replayed entries are refused, counted, warned about once and never
//! loaded.
#![cfg(feature = "remote")]

use crate::common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::disk::{Ev, TempDir, capture};
use common::fake_backend::{FakeBackend, image, program};
use common::redis::RedisServer;
use kpc::Config;
use kpc::SigningKey;
use kpc::Source;
use kpc::StoreKey;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::store::auth;
use kpc::admin::store::{EntryAuth, Provenance};
use kpc::seal;
use kpc::{BuildOptions, SpecConstants, StoreKind};

/// Writes a key pair `name` (seed `n`) under `dir`; returns the private key file (the public key is
/// beside it, `.pub`).
fn keypair(dir: &TempDir, name: &str, n: u8) -> PathBuf {
    let file = dir.join(name);
    SigningKey::write_pair(&[n; 32], &file, name).unwrap();
    file
}

fn pub_of(private: &Path) -> String {
    format!("{}.pub", private.display())
}

/// A node's configuration as its environment gives it: local cache `root`, remote `url`, signing key
/// file `signing`, trusted keys `trusted` (a KPC_CACHE_TRUSTED_KEYS value), host id `host`.
fn node(
    root: &Path,
    url: &str,
    signing: Option<&Path>,
    trusted: Option<&str>,
    host: &str,
) -> Config {
    let mut vars: Vec<(&str, String)> = vec![
        ("KPC_CACHE_DIR", root.display().to_string()),
        ("KPC_CACHE_REMOTE", url.into()),
        ("KPC_CACHE_REMOTE_TIMEOUT", "2s".into()),
        ("KPC_HOST_ID", host.into()),
    ];
    if let Some(s) = signing {
        vars.push(("KPC_CACHE_SIGNING_KEY", s.display().to_string()));
    }
    if let Some(t) = trusted {
        vars.push(("KPC_CACHE_TRUSTED_KEYS", t.into()));
    }
    Config::from_lookup(move |k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| OsString::from(v))
    })
    .unwrap()
}

fn store_key(pm: &ProgramManager, i: usize) -> StoreKey {
    pm.disk_key(
        &image(&format!("k{i}.cl"), &["main"]),
        &SpecConstants::new(),
        &BuildOptions::new("-O2"),
    )
}

/// The remote level's (hits, misses, errors, puts).
fn remote_stats(pm: &ProgramManager) -> (u64, u64, u64, u64) {
    let l = pm
        .store_stats()
        .into_iter()
        .find(|l| l.kind == StoreKind::Remote)
        .expect("a remote level");
    (l.store.hits, l.store.misses, l.store.errors, l.store.puts)
}

fn remote_warnings(events: &[Ev]) -> Vec<String> {
    events
        .iter()
        .filter(|e| {
            e.level == tracing::Level::WARN
                && e.target == "kpc::cache::store"
                // The message names the store first (`remote:<url>: ...`).
                && e.fields
                    .get("message")
                    .is_some_and(|s| s.starts_with("remote:"))
        })
        .map(|e| e.fields.get("cause").cloned().unwrap_or_default())
        .collect()
}

/// The redis key of `key`'s entry.
fn path_of(key: &StoreKey) -> String {
    format!(
        "kpc/v1/{}/{}",
        key.device_digest().to_hex(),
        key.digest().to_hex()
    )
}

/// Runs a fresh reader (its own empty local cache under `t/tag`, configured by `cfg`) asking for
/// programs `which`; returns their sources, the remote's (hits, misses, errors, puts) and its
/// warnings' causes.
fn read_as(cfg: &Config, which: &[usize]) -> (Vec<Source>, (u64, u64, u64, u64), Vec<String>) {
    let be = Arc::new(FakeBackend::new());
    let ((sources, stats), ev) = capture(|| {
        let pm = ProgramManager::new(be.clone(), cfg);
        let s: Vec<Source> = which.iter().map(|&i| program(&pm, i)).collect();
        (s, remote_stats(&pm))
    });
    (sources, stats, remote_warnings(&ev))
}

#[test]
fn a_serving_node_with_only_trusted_keys_cannot_produce_an_entry_another_node_accepts() {
    let Some(r) = RedisServer::start("a_serving_node_cannot_produce_an_accepted_entry") else {
        return;
    };
    let t = TempDir::new("signed-serving");
    let builder_key = keypair(&t, "builder.key", 1);
    let trusted = pub_of(&builder_key);
    // The serving node builds key 0 itself (nothing published yet) and publishes nothing.
    let serving = node(&t.join("s"), &r.url(), None, Some(&trusted), "serving-1");
    let (src, stats, warned) = read_as(&serving, &[0]);
    assert_eq!(src, vec![Source::Built]);
    assert_eq!(stats.3, 0, "a serving node publishes nothing: {stats:?}");
    assert_eq!(warned, vec!["untrusted"]);
    assert!(r.keys("kpc/v*").is_empty(), "{:?}", r.keys("kpc/v*"));
    // Nor did it take the fleet build lock while building: its build lock level was not offered.
    let be = Arc::new(FakeBackend::new());
    let pm = ProgramManager::new(be.clone(), &serving);
    let k5 = store_key(&pm, 5);
    let store = kpc::admin::store::RemoteStore::from_config(&serving).unwrap();
    use kpc::Store;
    use kpc::admin::store::BuildLock;
    assert!(matches!(store.lock_for_build(&k5), BuildLock::NotOffered));
    assert!(r.keys("kpc-lock/*").is_empty());

    // Everything a serving node could write: unsigned (it has no private key), or signed with a key
    // pair it made up. Written straight into redis; another reader refuses both and builds.
    let be = Arc::new(FakeBackend::new());
    let pm = ProgramManager::new(be.clone(), &serving);
    let k0 = store_key(&pm, 0);
    let forged = seal(&k0, b"FAKEBIN1 from the serving node", Duration::ZERO);
    let prov = Provenance::for_key("serving-1", &k0, None, Duration::ZERO);
    let own = EntryAuth::from_config(&serving).signer(Some(SigningKey::from_seed(&[99; 32])));
    for (tag, auth) in [
        ("unsigned", EntryAuth::from_config(&serving)),
        ("own key", own),
    ] {
        r.set(&path_of(&k0), &auth::wrap(&auth, &k0, &forged, &prov));
        let reader = node(&t.join(tag), &r.url(), None, Some(&trusted), "serving-2");
        let (src, stats, warned) = read_as(&reader, &[0]);
        assert_eq!(src, vec![Source::Built], "{tag}");
        assert_eq!(
            (stats.0, stats.2),
            (0, 1),
            "{tag}: refused and counted: {stats:?}"
        );
        assert_eq!(warned, vec!["untrusted"], "{tag}: warned once");
    }
    // The builder's own entry for key 1 is accepted by the same reader.
    let builder = node(
        &t.join("b"),
        &r.url(),
        Some(&builder_key),
        Some(&trusted),
        "builder-1",
    );
    let (src, _, _) = read_as(&builder, &[1]);
    assert_eq!(src, vec![Source::Built]);
    // Publishing runs in the background: the entry lands within the remote timeout (bounded wait;
    // under load the build returns first, so the put counter alone would race).
    let k1 = path_of(&store_key(
        &ProgramManager::new(Arc::new(FakeBackend::new()), &builder),
        1,
    ));
    let published = || r.keys("kpc/v*").contains(&k1);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !published() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(published(), "the builder published key 1");
    let fresh_reader = node(&t.join("r2"), &r.url(), None, Some(&trusted), "serving-3");
    let (src, stats, warned) = read_as(&fresh_reader, &[1]);
    assert_eq!(src, vec![Source::Remote]);
    assert_eq!(stats.0, 1);
    assert!(warned.is_empty(), "{warned:?}");
}

#[test]
fn rotation_old_and_new_keys_accepted_then_the_old_one_removed() {
    let Some(r) = RedisServer::start("rotation_old_and_new_keys_accepted") else {
        return;
    };
    let t = TempDir::new("signed-rotation");
    let (old, new) = (keypair(&t, "old.key", 1), keypair(&t, "new.key", 2));
    let both = format!("{},{}", pub_of(&old), pub_of(&new));
    // Builder A still signs with the old key (key 0); builder B already with the new one (key 1).
    let a = node(&t.join("a"), &r.url(), Some(&old), Some(&both), "builder-a");
    let b = node(&t.join("b"), &r.url(), Some(&new), Some(&both), "builder-b");
    assert_eq!(read_as(&a, &[0]).0, vec![Source::Built]);
    assert_eq!(read_as(&b, &[1]).0, vec![Source::Built]);
    // A reader trusting both is served both.
    let reader = node(&t.join("r1"), &r.url(), None, Some(&both), "serving-1");
    let (src, _, warned) = read_as(&reader, &[0, 1]);
    assert_eq!(src, vec![Source::Remote, Source::Remote]);
    assert!(warned.is_empty(), "{warned:?}");
    // The old key removed (the new .pub file alone, as an inline key this time): the old key's entry
    // is refused and rebuilt, the new key's served.
    let new_inline = std::fs::read_to_string(pub_of(&new)).unwrap();
    let new_inline = new_inline.split_whitespace().next().unwrap();
    let rotated = node(&t.join("r2"), &r.url(), None, Some(new_inline), "serving-2");
    let (src, stats, warned) = read_as(&rotated, &[0, 1]);
    assert_eq!(src, vec![Source::Built, Source::Remote]);
    assert_eq!((stats.0, stats.2), (1, 1), "{stats:?}");
    assert_eq!(warned, vec!["untrusted"]);
    // A builder re-signs key 0 with the new key: served again after rotation.
    let b2 = node(
        &t.join("b2"),
        &r.url(),
        Some(&new),
        Some(new_inline),
        "builder-b",
    );
    let (src, stats, _) = read_as(&b2, &[0]);
    assert_eq!((src, stats.3), (vec![Source::Built], 1));
    let rotated2 = node(&t.join("r3"), &r.url(), None, Some(new_inline), "serving-3");
    assert_eq!(read_as(&rotated2, &[0]).0, vec![Source::Remote]);
}

#[test]
fn forged_resigned_and_replayed_entries_are_refused() {
    let Some(r) = RedisServer::start("forged_resigned_and_replayed_entries_are_refused") else {
        return;
    };
    let t = TempDir::new("signed-forgery");
    let key = keypair(&t, "builder.key", 1);
    let trusted = pub_of(&key);
    let builder = node(
        &t.join("b"),
        &r.url(),
        Some(&key),
        Some(&trusted),
        "builder-1",
    );
    assert_eq!(
        read_as(&builder, &[0, 1]).0,
        vec![Source::Built, Source::Built]
    );
    let pm = ProgramManager::new(Arc::new(FakeBackend::new()), &builder);
    let (k0, k1) = (store_key(&pm, 0), store_key(&pm, 1));
    let (p0, p1) = (path_of(&k0), path_of(&k1));
    let (good0, good1) = (r.get(&p0), r.get(&p1));
    let evil = SigningKey::from_seed(&[66; 32]);
    let evil_auth = EntryAuth::default()
        .signer(Some(evil))
        .host("attacker".into());
    let evil_bin = seal(&k0, b"FAKEBIN1 evil binary", Duration::ZERO);
    let prov = Provenance::for_key("builder-1", &k0, None, Duration::ZERO);
    // Where the genuine envelope's sealed entry starts: header, provenance length and provenance,
    // the signer's key and signature (no MAC here).
    let prov_len = u32::from_le_bytes(good0[8..12].try_into().unwrap()) as usize;
    let sealed_at = 12 + prov_len + 96;
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        // Re-signed: the attacker's own signature over their binary.
        (
            "re-signed",
            p0.as_str(),
            auth::wrap(&evil_auth, &k0, &evil_bin, &prov),
        ),
        // Forged: the genuine signature kept, the binary swapped for the attacker's (its own
        // checksums valid).
        (
            "forged",
            p0.as_str(),
            [&good0[..sealed_at], &evil_bin[..]].concat(),
        ),
        // Altered: one byte of the genuine binary changed.
        ("altered", p0.as_str(), {
            let mut v = good0.clone();
            *v.last_mut().unwrap() ^= 1;
            v
        }),
        // Replayed: key 0's genuine, validly signed entry stored under key 1's name.
        ("replayed", p1.as_str(), good0.clone()),
    ];
    for (i, (tag, at, value)) in cases.into_iter().enumerate() {
        let orig = r.get(at);
        r.set(at, &value);
        let reader = node(
            &t.join(format!("r{i}")),
            &r.url(),
            None,
            Some(&trusted),
            "serving",
        );
        let want = if at == p0 { 0 } else { 1 };
        let (src, stats, warned) = read_as(&reader, &[want]);
        r.set(at, &orig);
        assert_eq!(src, vec![Source::Built], "{tag}: never loaded");
        assert_eq!(
            (stats.0, stats.2),
            (0, 1),
            "{tag}: refused and counted: {stats:?}"
        );
        assert_eq!(warned, vec!["untrusted"], "{tag}: warned once");
        // The reader's local disk holds its own build, not the remote's bytes.
        let cfg_again = node(
            &t.join(format!("r{i}")),
            &r.url(),
            None,
            Some(&trusted),
            "serving",
        );
        assert_eq!(read_as(&cfg_again, &[want]).0, vec![Source::Disk], "{tag}");
    }
    // Untouched, both entries are served.
    assert_eq!((r.get(&p0), r.get(&p1)), (good0, good1));
    let reader = node(&t.join("ok"), &r.url(), None, Some(&trusted), "serving");
    assert_eq!(
        read_as(&reader, &[0, 1]).0,
        vec![Source::Remote, Source::Remote]
    );
}

#[test]
fn signatures_work_the_same_on_an_fs_remote() {
    let t = TempDir::new("signed-fs");
    let url = format!("fs://{}", t.join("remote").display());
    let key = keypair(&t, "builder.key", 5);
    let trusted = pub_of(&key);
    let builder = node(&t.join("b"), &url, Some(&key), Some(&trusted), "builder-fs");
    assert_eq!(read_as(&builder, &[0]).0, vec![Source::Built]);
    let reader = node(&t.join("r"), &url, None, Some(&trusted), "serving-fs");
    assert_eq!(read_as(&reader, &[0]).0, vec![Source::Remote]);
    // The same remote read by a node trusting another key: refused, built.
    let other = keypair(&t, "other.key", 6);
    let stranger = node(&t.join("x"), &url, None, Some(&pub_of(&other)), "serving-x");
    let (src, stats, warned) = read_as(&stranger, &[0]);
    assert_eq!((src, stats.2), (vec![Source::Built], 1));
    assert_eq!(warned, vec!["untrusted"]);
    // The listing verifies what it lists, with provenance.
    let store = kpc::admin::store::RemoteStore::from_config(&reader).unwrap();
    let listed = store.list_verified(None).unwrap();
    assert_eq!(listed.len(), 1);
    let p = listed[0].verdict.clone().unwrap().unwrap();
    assert_eq!(p.host, "builder-fs");
    assert_eq!(p.kpc_version, env!("CARGO_PKG_VERSION"));
    let fp = SigningKey::from_file("K", &key)
        .unwrap()
        .public_key()
        .fingerprint();
    assert_eq!(p.signer.as_deref(), Some(fp.as_str()));
    // The local disks record who built each entry: the builder itself, and on the reader (which took
    // it from the remote) the original builder and the signer it verified.
    let record = |root: &str| {
        let c = common::disk::cache(&t.join(root));
        let e = c.entries().unwrap();
        assert_eq!(e.len(), 1, "{root}");
        e[0].record.clone().unwrap().provenance.unwrap()
    };
    let built = record("b");
    assert_eq!(
        (built.host.as_str(), built.signer.as_deref()),
        ("builder-fs", None)
    );
    let copied = record("r");
    assert_eq!(copied.host, "builder-fs");
    assert_eq!(copied.built_unix, p.built_unix);
    assert_eq!(copied.signer.as_deref(), Some(fp.as_str()));
    // The stranger built it itself.
    assert_eq!(record("x").host, "serving-x");
    let strange = kpc::admin::store::RemoteStore::from_config(&stranger).unwrap();
    let listed = strange.list_verified(None).unwrap();
    assert!(
        listed[0]
            .verdict
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("not in KPC_CACHE_TRUSTED_KEYS")
    );
}
