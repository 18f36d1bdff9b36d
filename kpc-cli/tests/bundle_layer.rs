//! Bundles as read-only layers (`KPC_CACHE_READONLY_DIRS` naming a `.kpcb` file): read in place, each
//! entry verified as `kpc cache import` verifies it before the (counting, fake) backend sees it, the
//! file never written; a tampered, truncated, foreign, unauthentic, missing or old-format bundle is a
//! warning and a miss (or, for the old format, served too), never a failure. `kpc cache ls --bundle`
//! and `kpc cache check` read them the same way.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::disk::{TempDir, capture};
use common::fake_backend::{FakeBackend, image};
use kpc::Config;
use kpc::MacKey;
use kpc::Source;
use kpc::admin::bundle;
use kpc::admin::disk::PersistentCache;
use kpc::admin::runtime::ProgramManager;
use kpc::admin::store::EntryAuth;
use kpc::{BuildOptions, SpecConstants};
use serde_json::Value;

const SECRET: &str = "0123456789abcdef-bundle-secret";

fn mac(s: &str) -> MacKey {
    MacKey::from_secret("KPC_CACHE_REMOTE_KEY", s).unwrap()
}

fn config(root: &Path, layers: &[&Path], key: Option<&str>) -> Config {
    Config::builder()
        .cache_dir(root)
        .readonly_dirs(layers.iter().map(|p| p.to_path_buf()))
        .remote_key(key.map(mac))
        .build()
        .unwrap()
}

fn program(pm: &ProgramManager, i: usize) -> Source {
    let img = image(&format!("k{i}.cl"), &["main"]);
    pm.program(&img, &SpecConstants::new(), &BuildOptions::new("-O2"))
        .unwrap()
        .source
}

/// Builds programs `0..n` on device `device` into a cache under `dir` and exports them, MAC'd with
/// `key` if given, to `dir/name.kpcb`.
fn shipped(dir: &TempDir, name: &str, device: &str, n: usize, key: Option<&str>) -> PathBuf {
    let root = dir.join(format!("{name}-build"));
    let be = Arc::new(FakeBackend::with_device(device).binary_size(8 << 10));
    let pm = ProgramManager::new(be, &config(&root, &[], None));
    for i in 0..n {
        assert_eq!(program(&pm, i), Source::Built);
    }
    let file = dir.join(format!("{name}.kpcb"));
    let auth = EntryAuth::default().mac(key.map(mac));
    let cache = PersistentCache::from_config(&config(&root, &[], None)).unwrap();
    let r = bundle::export(&cache, None, &auth, &file).unwrap();
    assert_eq!(r.entries, n as u64);
    file
}

/// What a fresh machine (own empty cache at `root`, `layers` as read-only layers) gets for programs
/// `0..n`: each source, the backend's builds, and the store warnings' causes.
fn serve(
    root: &Path,
    layers: &[&Path],
    key: Option<&str>,
    n: usize,
) -> (Vec<Source>, usize, Vec<String>) {
    let be = Arc::new(FakeBackend::new().binary_size(8 << 10));
    let ((sources, builds), ev) = capture(|| {
        let pm = ProgramManager::new(be.clone(), &config(root, layers, key));
        let s: Vec<Source> = (0..n).map(|i| program(&pm, i)).collect();
        (s, be.builds())
    });
    let warned = ev
        .iter()
        .filter(|e| e.level == tracing::Level::WARN && e.target == "kpc::cache::store")
        .map(|e| {
            eprintln!("warning: {:?}", e.fields);
            e.fields.get("cause").cloned().unwrap_or_default()
        })
        .collect();
    (sources, builds, warned)
}

/// The format-3 index of the bundle at `path`: where its body starts, and each entry's (label,
/// offset, length) in it.
fn index_of(path: &Path) -> (u64, Vec<(String, u64, u64)>) {
    let raw = std::fs::read(path).unwrap();
    assert_eq!(&raw[..8], b"KPCBNDL\x03");
    let n = u64::from_le_bytes(raw[8..16].try_into().unwrap()) as usize;
    let index: Value =
        serde_json::from_slice(&zstd::decode_all(&raw[16..16 + n]).unwrap()).unwrap();
    let entries = index["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["label"].as_str().unwrap().to_owned(),
                e["offset"].as_u64().unwrap(),
                e["len"].as_u64().unwrap(),
            )
        })
        .collect();
    ((16 + n) as u64, entries)
}

/// The program number of a label `k<i>.cl`.
fn number(label: &str) -> usize {
    label
        .trim_start_matches('k')
        .trim_end_matches(".cl")
        .parse()
        .unwrap()
}

fn kpc_ls(file: &Path, key: Option<&str>) -> (Option<i32>, String) {
    let mut c = common::cli::kpc_command();
    c.env_clear()
        .env("KPC_CACHE_DIR", file.with_extension("ls-cache"));
    if let Some(k) = key {
        c.env("KPC_CACHE_REMOTE_KEY", k);
    }
    let o = c
        .args(["cache", "ls", "--bundle"])
        .arg(file)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    (o.status.code(), text)
}

#[test]
fn a_bundle_in_readonly_dirs_serves_verified_hits_in_place_and_is_never_written() {
    let t = TempDir::new("bundle-layer");
    let file = shipped(&t, "kernels", "fake-device-0", 4, Some(SECRET));
    let before = (
        std::fs::read(&file).unwrap(),
        std::fs::metadata(&file).unwrap().modified().unwrap(),
    );
    let b = t.join("b");
    let (sources, builds, warned) = serve(&b, &[&file], Some(SECRET), 4);
    assert_eq!(sources, vec![Source::ReadOnly; 4]);
    assert_eq!(builds, 0, "served, not built");
    assert!(warned.is_empty(), "{warned:?}");
    // Copied to the local disk: the next process hits there.
    let (sources, _, _) = serve(&b, &[&file], Some(SECRET), 4);
    assert_eq!(sources, vec![Source::Disk; 4]);
    // A machine without the secret takes the entries too (checksums only): the MAC is for readers with
    // a key. One with another secret refuses every entry, once warned.
    let (sources, builds, warned) =
        serve(&t.join("c"), &[&file], Some("another-secret-0123456"), 4);
    assert_eq!((sources, builds), (vec![Source::Built; 4], 4));
    assert_eq!(warned, vec!["unauthentic"]);
    // Never written: same bytes, same modification time.
    let after = (
        std::fs::read(&file).unwrap(),
        std::fs::metadata(&file).unwrap().modified().unwrap(),
    );
    assert!(before == after, "the bundle changed");
    // `kpc cache ls --bundle` reads it the same way.
    let (code, out) = kpc_ls(&file, Some(SECRET));
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("4 entries, 0 refused"), "{out}");
    let (code, out) = kpc_ls(&file, Some("another-secret-0123456"));
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("4 entries, 4 refused") && out.contains("MAC"),
        "{out}"
    );
}

#[test]
fn tampered_and_truncated_bundles_serve_only_the_entries_that_verify() {
    let t = TempDir::new("bundle-layer-damage");
    let file = shipped(&t, "kernels", "fake-device-0", 4, None);
    let (body, index) = index_of(&file);
    assert_eq!(index.len(), 4);
    let raw = std::fs::read(&file).unwrap();
    // One bit flipped in the middle of one entry: that one is built, the others served.
    let (label, off, len) = &index[1];
    let hit = number(label);
    let mut tampered = raw.clone();
    tampered[(body + off + len / 2) as usize] ^= 0x10;
    let bad = t.join("tampered.kpcb");
    std::fs::write(&bad, &tampered).unwrap();
    let (sources, builds, warned) = serve(&t.join("a"), &[&bad], None, 4);
    for (i, s) in sources.iter().enumerate() {
        let want = if i == hit {
            Source::Built
        } else {
            Source::ReadOnly
        };
        assert_eq!(*s, want, "program {i}: {sources:?}");
    }
    assert_eq!(builds, 1);
    assert_eq!(warned, vec!["corrupt"]);
    let (code, out) = kpc_ls(&bad, None);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("4 entries, 1 refused"), "{out}");
    // Cut in the middle of the third entry: the first two are served, the rest built, one warning.
    let (_, off, len) = &index[2];
    let cut = t.join("truncated.kpcb");
    std::fs::write(&cut, &raw[..(body + off + len / 2) as usize]).unwrap();
    let first_two: Vec<usize> = index[..2].iter().map(|(l, _, _)| number(l)).collect();
    let (sources, builds, warned) = serve(&t.join("b"), &[&cut], None, 4);
    for (i, s) in sources.iter().enumerate() {
        let want = if first_two.contains(&i) {
            Source::ReadOnly
        } else {
            Source::Built
        };
        assert_eq!(*s, want, "program {i}: {sources:?}");
    }
    assert_eq!(builds, 2);
    assert_eq!(warned, vec!["corrupt"]);
    let (code, out) = kpc_ls(&cut, None);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("truncated file"), "{out}");
    // Cut inside the index: the bundle cannot be used at all. One warning, every program built.
    let head = t.join("head.kpcb");
    std::fs::write(&head, &raw[..20]).unwrap();
    let (sources, builds, warned) = serve(&t.join("c"), &[&head], None, 4);
    assert_eq!((sources, builds), (vec![Source::Built; 4], 4));
    assert_eq!(warned, vec!["corrupt"]);
}

#[test]
fn foreign_missing_and_old_format_bundles() {
    let t = TempDir::new("bundle-layer-foreign");
    // Not a bundle at all, under a .kpcb name: one warning, every program built.
    let junk = t.join("junk.kpcb");
    std::fs::write(&junk, b"PK\x03\x04 this is a zip file, not a kpc bundle").unwrap();
    let (sources, builds, warned) = serve(&t.join("a"), &[&junk], None, 3);
    assert_eq!((sources, builds), (vec![Source::Built; 3], 3));
    assert_eq!(warned, vec!["corrupt"]);
    let (code, out) = kpc_ls(&junk, None);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("kpc bundle header"), "{out}");
    // Another device's bundle: nothing for this device, nothing wrong with it either.
    let other = shipped(&t, "other", "another-device", 3, None);
    let (sources, builds, warned) = serve(&t.join("b"), &[&other], None, 3);
    assert_eq!((sources, builds), (vec![Source::Built; 3], 3));
    assert!(warned.is_empty(), "{warned:?}");
    // A layer that is missing: one warning, builds; a second layer behind it still serves.
    let ours = shipped(&t, "ours", "fake-device-0", 3, None);
    let missing = t.join("not-there.kpcb");
    let (sources, builds, warned) = serve(&t.join("c"), &[&missing, &ours], None, 3);
    assert_eq!((sources, builds), (vec![Source::ReadOnly; 3], 0));
    assert_eq!(warned, vec!["unavailable"]);
    // A format-2 bundle (kpc before bundles were layers: one zstd stream), made from this one's
    // index and envelopes: served as well (decompressed into memory once), and imported.
    let (body, index) = index_of(&ours);
    let raw = std::fs::read(&ours).unwrap();
    let n = u64::from_le_bytes(raw[8..16].try_into().unwrap()) as usize;
    let mut idx: Value =
        serde_json::from_slice(&zstd::decode_all(&raw[16..16 + n]).unwrap()).unwrap();
    idx["format"] = 2.into();
    for e in idx["entries"].as_array_mut().unwrap() {
        e.as_object_mut().unwrap().remove("offset");
    }
    let idx = serde_json::to_vec(&idx).unwrap();
    let mut stream = (idx.len() as u64).to_le_bytes().to_vec();
    stream.extend_from_slice(&idx);
    let end = index.iter().map(|(_, o, l)| o + l).max().unwrap();
    stream.extend_from_slice(&raw[body as usize..(body + end) as usize]);
    let mut v2 = b"KPCBNDL\x02".to_vec();
    let mut z = zstd::Encoder::new(&mut v2, 3).unwrap();
    z.write_all(&stream).unwrap();
    z.finish().unwrap();
    let old = t.join("old.kpcb");
    std::fs::write(&old, &v2).unwrap();
    let (sources, builds, warned) = serve(&t.join("d"), &[&old], None, 3);
    assert_eq!((sources, builds), (vec![Source::ReadOnly; 3], 0));
    assert!(warned.is_empty(), "{warned:?}");
    let dst = PersistentCache::from_config(&config(&t.join("e"), &[], None)).unwrap();
    let r = bundle::import(&dst, &EntryAuth::default(), &old).unwrap();
    assert_eq!((r.taken, r.refused.len()), (3, 0), "{r:?}");
    // `kpc cache check` reads the old and the new format the same way.
    for f in [&old, &ours] {
        let o = common::cli::kpc_command()
            .env_clear()
            .env("KPC_CACHE_DIR", t.join("check"))
            .args(["cache", "check", "--json"])
            .arg(f)
            .output()
            .unwrap();
        let mut text = String::new();
        o.stdout.as_slice().read_to_string(&mut text).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(v["kind"], "bundle", "{text}");
    }
}
