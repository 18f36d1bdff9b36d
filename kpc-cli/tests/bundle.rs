//! Bundles (`kpc cache export` / `import`): a real attention run's kernels round-trip through a file
//! into a fresh cache and are disk hits there; a tampered, foreign or unsigned bundle is refused entry
//! by entry; garbage is a typed error. Real files, real drivers and real child processes.

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::cli::{attention_check, kernel_sources};
use common::disk::{TempDir, cache, key, payload};
use kpc::Error;
use kpc::MacKey;
use kpc::PutOutcome;
use kpc::admin::bundle;
use kpc::admin::bundle::ImportReport;
use kpc::admin::store::EntryAuth;

const SECRET: &str = "the fleet's shared secret, 2026";

/// What a process with MAC key `k` (and no signing or trusted keys) writes and reads with.
fn auth_mac(k: Option<&MacKey>) -> EntryAuth {
    EntryAuth::from(k.cloned())
}

fn mac(s: &str) -> MacKey {
    MacKey::from_secret("KPC_CACHE_REMOTE_KEY", s).unwrap()
}

/// A cache with `n` entries of distinct keys and payload sizes.
fn filled(dir: &TempDir, n: u64) -> kpc::admin::disk::PersistentCache {
    let c = cache(dir.path());
    for i in 0..n {
        let out = c.put(
            &key(i),
            &payload(i, 1000 + i as usize * 37),
            Duration::from_millis(i),
        );
        assert!(matches!(out, PutOutcome::Published(_)), "{out:?}");
    }
    c
}

/// Lets `edit` change a bundle's bytes in place. The entries are stored as they are where compression
/// would not make them smaller, as with these tests' random binaries, so a binary can be found and
/// changed in the file itself.
fn rewrite_body(path: &Path, edit: impl FnOnce(&mut Vec<u8>)) {
    let mut raw = std::fs::read(path).unwrap();
    edit(&mut raw);
    std::fs::write(path, raw).unwrap();
}

#[test]
fn export_then_import_into_an_empty_cache_takes_every_entry_and_serves_them() {
    let (a, b) = (TempDir::new("bundle-src"), TempDir::new("bundle-dst"));
    let src = filled(&a, 12);
    let file = a.join("cache.kpcb");
    let e = bundle::export(&src, None, &auth_mac(None), &file).unwrap();
    assert_eq!((e.entries, e.unverified, e.signed), (12, 0, false));
    assert!(e.file_bytes > 0 && e.file_bytes == std::fs::metadata(&file).unwrap().len());

    let dst = cache(b.path());
    let r = bundle::import(&dst, &auth_mac(None), &file).unwrap();
    assert_eq!((r.total, r.taken, r.present), (12, 12, 0), "{r:?}");
    assert!(r.refused.is_empty(), "{r:?}");
    for i in 0..12 {
        let hit = dst.get(&key(i)).expect("imported entry is a disk hit");
        assert_eq!(hit.bytes(), payload(i, 1000 + i as usize * 37));
        assert_eq!(hit.build_time(), Duration::from_millis(i));
    }
    // The device filter: none of these entries are of another device's fingerprint.
    let other = kpc::Digest::of(b"another device");
    let none = bundle::export(&src, Some(other), &auth_mac(None), &a.join("none.kpcb")).unwrap();
    assert_eq!((none.entries, none.other_devices), (0, 12));
    let same = key(0).device_digest();
    let all = bundle::export(&src, Some(same), &auth_mac(None), &a.join("same.kpcb")).unwrap();
    assert_eq!((all.entries, all.other_devices), (12, 0));
    // A second import finds everything present and writes nothing.
    let again = bundle::import(&dst, &auth_mac(None), &file).unwrap();
    assert_eq!((again.taken, again.present), (0, 12), "{again:?}");
}

#[test]
fn a_tampered_bundle_is_refused_entry_by_entry() {
    let (a, b) = (
        TempDir::new("bundle-tamper-src"),
        TempDir::new("bundle-tamper-dst"),
    );
    let src = filled(&a, 5);
    let file = a.join("t.kpcb");
    bundle::export(&src, None, &auth_mac(None), &file).unwrap();
    // Flip one byte near the end of the body: inside the last entry's binary.
    rewrite_body(&file, |body| {
        let n = body.len();
        body[n - 10] ^= 0x40;
    });
    let dst = cache(b.path());
    let r = bundle::import(&dst, &auth_mac(None), &file).unwrap();
    assert_eq!(r.taken, 4, "{r:?}");
    assert_eq!(r.refused.len(), 1, "{r:?}");
    assert_eq!(
        r.refused[0].index, 4,
        "the last entry in the file was damaged"
    );
    // Compressed, the entry breaks already in its frame (its key record unreadable); stored as it
    // is, in its checksums.
    let why = &r.refused[0].reason;
    assert!(
        why.contains("does not verify") || why.contains("missing or damaged"),
        "{r:?}"
    );
    // Entries are in the cache's path order: find the damaged one by its label.
    let bad: u64 = r.refused[0]
        .label
        .trim_start_matches("image")
        .trim_end_matches(".spv")
        .parse()
        .unwrap();
    for i in 0..5 {
        assert_eq!(dst.get(&key(i)).is_some(), i != bad, "key {i}");
    }
}

#[test]
fn signed_bundles_need_the_same_key_and_unsigned_ones_are_refused_with_a_key() {
    let a = TempDir::new("bundle-mac");
    let src = filled(&a, 3);
    let (signed, unsigned) = (a.join("signed.kpcb"), a.join("unsigned.kpcb"));
    assert!(
        bundle::export(&src, None, &auth_mac(Some(&mac(SECRET))), &signed)
            .unwrap()
            .signed
    );
    bundle::export(&src, None, &auth_mac(None), &unsigned).unwrap();

    let check = |file: &Path, key: Option<&MacKey>, taken: u64, reason: &str| {
        let dir = TempDir::new("bundle-mac-dst");
        let r: ImportReport = bundle::import(&cache(dir.path()), &auth_mac(key), file).unwrap();
        assert_eq!(r.taken, taken, "{r:?}");
        assert_eq!(r.refused.len() as u64, 3 - taken, "{r:?}");
        assert!(r.refused.iter().all(|x| x.reason.contains(reason)), "{r:?}");
    };
    check(&signed, Some(&mac(SECRET)), 3, "");
    check(
        &signed,
        Some(&mac("somebody else's secret")),
        0,
        "MAC does not match",
    );
    check(&unsigned, Some(&mac(SECRET)), 0, "carries no MAC");
    // Without a key nothing can be authenticated; the checksums still verify each entry.
    check(&signed, None, 3, "");
}

#[test]
fn a_forged_entry_in_a_signed_bundle_is_refused_and_the_rest_taken() {
    let a = TempDir::new("bundle-forge");
    let src = filled(&a, 3);
    let file = a.join("f.kpcb");
    let k = mac(SECRET);
    bundle::export(&src, None, &auth_mac(Some(&k)), &file).unwrap();
    // The forger replaces entry 1's binary with their own, correctly sealed (valid checksums) but
    // without the secret: its MAC cannot match.
    rewrite_body(&file, |body| {
        let good = payload(1, 1037);
        let at = body
            .windows(good.len())
            .position(|w| w == good)
            .expect("entry 1's binary is in the body");
        let evil = vec![0xCCu8; good.len()];
        body[at..at + good.len()].copy_from_slice(&evil);
    });
    let dir = TempDir::new("bundle-forge-dst");
    let dst = cache(dir.path());
    let r = bundle::import(&dst, &auth_mac(Some(&k)), &file).unwrap();
    assert_eq!(r.taken, 2, "{r:?}");
    assert_eq!(r.refused.len(), 1);
    assert_eq!(r.refused[0].index, 1);
    assert!(r.refused[0].reason.contains("MAC"), "{r:?}");
    assert!(dst.get(&key(1)).is_none());
}

#[test]
fn garbage_truncation_and_missing_files_are_typed_errors() {
    let a = TempDir::new("bundle-garbage");
    let dst = cache(a.path());
    let garbage = a.join("garbage.kpcb");
    std::fs::write(&garbage, b"this is not a bundle at all").unwrap();
    let err = bundle::import(&dst, &auth_mac(None), &garbage).unwrap_err();
    assert!(matches!(err, Error::Bundle { .. }), "{err:?}");
    assert!(err.to_string().contains("kpc cache export"), "{err}");

    let missing = bundle::import(&dst, &auth_mac(None), &a.join("nope.kpcb")).unwrap_err();
    assert!(matches!(missing, Error::Io(_)), "{missing:?}");

    let src_dir = TempDir::new("bundle-trunc-src");
    let src = filled(&src_dir, 4);
    let file = src_dir.join("b.kpcb");
    bundle::export(&src, None, &auth_mac(None), &file).unwrap();
    let raw = std::fs::read(&file).unwrap();
    let mut future = raw.clone();
    future[7] = 9;
    std::fs::write(&garbage, &future).unwrap();
    let err = bundle::import(&dst, &auth_mac(None), &garbage).unwrap_err();
    assert!(err.to_string().contains("format 9"), "{err}");
    // Cut anywhere in the compressed stream: an error or a report with refusals, never a panic,
    // and never an entry that does not verify.
    for cut in [9, raw.len() / 2, raw.len() - 3] {
        std::fs::write(&garbage, &raw[..cut]).unwrap();
        let dir = TempDir::new("bundle-trunc-dst");
        let c = cache(dir.path());
        match bundle::import(&c, &auth_mac(None), &garbage) {
            Err(e) => assert!(matches!(e, Error::Bundle { .. }), "{e:?}"),
            Ok(r) => assert!(!r.refused.is_empty() || r.taken < 4, "{r:?}"),
        }
        assert_eq!(c.verify(false).unwrap().bad.len(), 0);
    }
}

// ---- The CLI on a real attention run ----

fn kpc(cache: &Path) -> Command {
    let mut c = common::cli::kpc_command();
    c.env("KPC_CACHE_DIR", cache)
        .env("KPC_CACHE_PERSISTENT", "1")
        .env_remove("KPC_DEVICE")
        .env_remove("KPC_CACHE_REMOTE_KEY");
    c
}

fn ok(out: Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn attention(backend: &str, cache: &Path) -> Vec<String> {
    let text = attention_check(backend, cache, 4, |_| {});
    kernel_sources(&text)
        .into_iter()
        .map(str::to_string)
        .collect()
}

fn round_trip(backend: &str) {
    let a = TempDir::new(&format!("bundle-cli-{backend}-a"));
    let built = attention(backend, a.path());
    assert!(
        built.len() >= 2 && built.iter().all(|s| s == "built"),
        "{built:?}"
    );
    let file = a.join("attention.kpcb");
    let text = ok(kpc(a.path())
        .args(["cache", "export"])
        .arg(&file)
        .args(["--device", &format!("{backend}:0")])
        .env("KPC_CACHE_REMOTE_KEY", SECRET)
        .output()
        .unwrap());
    assert!(text.contains("MAC'd with KPC_CACHE_REMOTE_KEY"), "{text}");

    // Export, clear, import: the cache that built the kernels gets them back from the file alone.
    let cleared = ok(kpc(a.path()).args(["cache", "clear"]).output().unwrap());
    assert!(cleared.contains("removed"), "{cleared}");
    let text = ok(kpc(a.path())
        .args(["cache", "import"])
        .arg(&file)
        .env("KPC_CACHE_REMOTE_KEY", SECRET)
        .output()
        .unwrap());
    // Every kernel the run used, and any other entry of that device (e.g. a variant's), was taken.
    let taken: usize = text
        .split(" taken")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(taken >= built.len(), "{text}");
    assert!(
        text.contains(" 0 already present, 0 refused, 0 not stored"),
        "{text}"
    );
    let loaded = attention(backend, a.path());
    assert!(
        loaded.len() == built.len() && loaded.iter().all(|s| s == "disk"),
        "{loaded:?}"
    );

    // The same bundle with another secret: every entry refused, exit status 1.
    let c = TempDir::new(&format!("bundle-cli-{backend}-c"));
    let out = kpc(c.path())
        .args(["cache", "import"])
        .arg(&file)
        .env("KPC_CACHE_REMOTE_KEY", "not the fleet's secret at all")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("0 taken, 0 already present, {taken} refused")),
        "{text}"
    );
    assert!(text.contains("MAC does not match"), "{text}");
}

crate::backend_tests! {
    fn attention_kernels_round_trip_through_a_signed_bundle(backend, test) {
        if crate::common::drivers::device(backend, test).is_some() {
            round_trip(&backend.to_string());
        }
    }
}

#[test]
fn a_short_key_is_an_error_naming_the_variable() {
    let a = TempDir::new("bundle-cli-badkey");
    let out = kpc(a.path())
        .args(["cache", "export"])
        .arg(a.join("x.kpcb"))
        .env("KPC_CACHE_REMOTE_KEY", "short")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("KPC_CACHE_REMOTE_KEY"), "{err}");
    assert!(err.contains("at least 16 bytes"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
