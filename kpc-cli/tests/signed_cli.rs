//! Writer signatures as a user meets them: `kpc cache keygen`, bundles exported with
//! `KPC_CACHE_SIGNING_KEY` and imported with `KPC_CACHE_TRUSTED_KEYS` (rotation, a foreign signer, a
//! forged entry, an unsigned bundle), and a real attention run publishing signed entries to an fs://
//! remote that `kpc cache ls --remote --provenance` verifies and a serving node loads. Real files,
//! real child processes, lavapipe.
#![cfg(feature = "remote")]

// The support code all of the workspace's integration tests share.
use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::cli::{attention_check, kernel_sources};
use common::disk::{TempDir, cache, key, payload};
use common::drivers::vulkan_device;
use kpc::PutOutcome;
use kpc::SigningKey;
use kpc::admin::bundle;
use kpc::admin::store::EntryAuth;

fn kpc(cache: &Path) -> Command {
    let mut c = common::cli::kpc_command();
    c.env("KPC_CACHE_DIR", cache)
        .env("KPC_CACHE_PERSISTENT", "1")
        .env_remove("KPC_DEVICE")
        .env_remove("KPC_CACHE_REMOTE_KEY")
        .env_remove("KPC_CACHE_SIGNING_KEY")
        .env_remove("KPC_CACHE_TRUSTED_KEYS")
        .env_remove("KPC_CACHE_REMOTE");
    c
}

fn run(out: Output) -> (Option<i32>, String, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kpc cache keygen DIR/name`: returns the private key file.
fn keygen(dir: &TempDir, name: &str) -> PathBuf {
    let file = dir.join(name);
    let (code, out, err) = run(kpc(dir.path())
        .args(["cache", "keygen"])
        .arg(&file)
        .output()
        .unwrap());
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("fingerprint: ed25519:"), "{out}");
    file
}

fn pub_of(private: &Path) -> String {
    format!("{}.pub", private.display())
}

fn auth(signing: Option<&Path>, trusted: &[&Path]) -> EntryAuth {
    EntryAuth::default()
        .signer(signing.map(|p| SigningKey::from_file("KPC_CACHE_SIGNING_KEY", p).unwrap()))
        .trusted(
            trusted
                .iter()
                .flat_map(|p| {
                    kpc::admin::config::parse_trusted_keys("KPC_CACHE_TRUSTED_KEYS", &pub_of(p))
                        .unwrap()
                })
                .collect(),
        )
        .host("exporter-1".into())
}

fn filled(dir: &TempDir, n: u64) -> kpc::admin::disk::PersistentCache {
    let c = cache(dir.path());
    for i in 0..n {
        let out = c.put(
            &key(i),
            &payload(i, 900 + i as usize),
            Duration::from_millis(i),
        );
        assert!(matches!(out, PutOutcome::Published(_)), "{out:?}");
    }
    c
}

#[test]
fn keygen_writes_a_0600_private_key_and_never_overwrites() {
    let d = TempDir::new("keygen");
    let file = keygen(&d, "fleet.key");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let public = std::fs::read_to_string(pub_of(&file)).unwrap();
    assert!(kpc::PublicKey::parse(&public).is_some(), "{public}");
    let before = std::fs::read(&file).unwrap();
    let (code, _, err) = run(kpc(d.path())
        .args(["cache", "keygen"])
        .arg(&file)
        .output()
        .unwrap());
    assert_ne!(code, Some(0));
    assert!(err.contains("exists") && !err.contains("panicked"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), before);
    // A bad key variable is a configuration error naming it, exit status 2.
    let (code, _, err) = run(kpc(d.path())
        .args(["cache", "ls"])
        .env("KPC_CACHE_TRUSTED_KEYS", "ed25519:nothex")
        .output()
        .unwrap());
    assert_eq!(code, Some(2));
    assert!(
        err.contains("KPC_CACHE_TRUSTED_KEYS") && err.contains("element 1"),
        "{err}"
    );
    let (code, _, err) = run(kpc(d.path())
        .args(["cache", "ls"])
        .env("KPC_CACHE_SIGNING_KEY", pub_of(&file))
        .output()
        .unwrap());
    assert_eq!(code, Some(2));
    assert!(err.contains("KPC_CACHE_SIGNING_KEY"), "{err}");
}

#[test]
fn bundles_are_signed_and_checked_like_the_remote() {
    let d = TempDir::new("bundle-sig");
    let (old, new, evil) = (
        keygen(&d, "old.key"),
        keygen(&d, "new.key"),
        keygen(&d, "evil.key"),
    );
    let src = filled(&d, 3);
    let signed_old = d.join("old.kpcb");
    let r = bundle::export(&src, None, &auth(Some(&old), &[]), &signed_old).unwrap();
    assert_eq!(
        r.signer,
        Some(
            SigningKey::from_file("K", &old)
                .unwrap()
                .public_key()
                .fingerprint()
        )
    );
    let signed_evil = d.join("evil.kpcb");
    bundle::export(&src, None, &auth(Some(&evil), &[]), &signed_evil).unwrap();
    let unsigned = d.join("unsigned.kpcb");
    bundle::export(&src, None, &auth(None, &[]), &unsigned).unwrap();

    let import = |file: &Path, reader: EntryAuth| {
        let dir = TempDir::new("bundle-sig-dst");
        bundle::import(&cache(dir.path()), &reader, file).unwrap()
    };
    // Rotation: old and new trusted, the old key's bundle is taken; the old one removed, refused.
    let r = import(&signed_old, auth(None, &[&old, &new]));
    assert_eq!((r.taken, r.refused.len()), (3, 0), "{r:?}");
    let r = import(&signed_old, auth(None, &[&new]));
    assert_eq!(r.taken, 0, "{r:?}");
    assert!(
        r.refused
            .iter()
            .all(|x| x.reason.contains("not in KPC_CACHE_TRUSTED_KEYS")),
        "{r:?}"
    );
    // Signed by a key nobody trusts, or not signed at all.
    let r = import(&signed_evil, auth(None, &[&old]));
    assert_eq!((r.taken, r.refused.len()), (0, 3), "{r:?}");
    let r = import(&unsigned, auth(None, &[&old]));
    assert!(
        r.refused.iter().all(|x| x.reason.contains("not signed")),
        "{r:?}"
    );
    assert_eq!(r.taken, 0);
    // A reader trusting no key takes all three (checksums only), as before signatures.
    assert_eq!(import(&unsigned, auth(None, &[])).taken, 3);

    // A forged entry: entry 1's binary replaced inside the signed bundle (the attacker cannot
    // re-sign it with the old key).
    // (Random binaries are stored uncompressed in the bundle: found and replaced in the file itself.)
    let mut body = std::fs::read(&signed_old).unwrap();
    let good = payload(1, 901);
    let at = body.windows(good.len()).position(|w| w == good).unwrap();
    body[at..at + good.len()].copy_from_slice(&vec![0xCC; good.len()]);
    let forged = d.join("forged.kpcb");
    std::fs::write(&forged, body).unwrap();
    let r = import(&forged, auth(None, &[&old]));
    assert_eq!(r.taken, 2, "{r:?}");
    assert_eq!(r.refused.len(), 1);
    assert!(r.refused[0].reason.contains("signature"), "{r:?}");

    // Through the CLI, with the variables: export signed, import trusting the .pub file.
    let (code, out, err) = run(kpc(d.path())
        .args(["cache", "export"])
        .arg(d.join("cli.kpcb"))
        .env("KPC_CACHE_SIGNING_KEY", &new)
        .output()
        .unwrap());
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("signed by ed25519:"), "{out}");
    let e = TempDir::new("bundle-sig-cli");
    let (code, out, err) = run(kpc(e.path())
        .args(["cache", "import"])
        .arg(d.join("cli.kpcb"))
        .env("KPC_CACHE_TRUSTED_KEYS", pub_of(&old))
        .output()
        .unwrap());
    assert_eq!(code, Some(1), "refused entries: exit 1: {out}{err}");
    assert!(
        out.contains("0 taken") && out.contains("not in KPC_CACHE_TRUSTED_KEYS"),
        "{out}"
    );
    let (code, out, err) = run(kpc(e.path())
        .args(["cache", "import"])
        .arg(d.join("cli.kpcb"))
        .env(
            "KPC_CACHE_TRUSTED_KEYS",
            format!("{},{}", pub_of(&old), pub_of(&new)),
        )
        .output()
        .unwrap());
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("3 taken"), "{out}");
}

#[test]
fn a_signed_attention_run_on_an_fs_remote_is_listed_with_provenance_and_served() {
    if vulkan_device("a_signed_attention_run_on_an_fs_remote_is_listed_with_provenance").is_none() {
        return;
    }
    let d = TempDir::new("signed-fleet");
    let key = keygen(&d, "builder.key");
    let remote = format!("fs://{}", d.join("remote").display());
    let trusted = pub_of(&key);
    // The builder signs what it publishes.
    let built = attention_check("vulkan", &d.join("builder"), 2, |c| {
        c.env("KPC_CACHE_REMOTE", &remote)
            .env("KPC_CACHE_SIGNING_KEY", &key)
            .env("KPC_CACHE_TRUSTED_KEYS", &trusted)
            .env("KPC_HOST_ID", "builder-7");
    });
    assert!(
        kernel_sources(&built).iter().all(|s| *s == "built"),
        "{built}"
    );
    // The listing verifies each entry and shows who built it.
    let ls = |trust: &str| {
        run(kpc(&d.join("serving"))
            .args(["cache", "ls", "--remote", "--provenance"])
            .env("KPC_CACHE_REMOTE", &remote)
            .env("KPC_CACHE_TRUSTED_KEYS", trust)
            .env("KPC_DEVICE", "vulkan:0")
            .output()
            .unwrap())
    };
    let (code, out, err) = ls(&trusted);
    eprintln!("{out}");
    assert_eq!(code, Some(0), "{out}{err}");
    let fp = SigningKey::from_file("K", &key)
        .unwrap()
        .public_key()
        .fingerprint();
    let rows: Vec<&str> = out.lines().filter(|l| l.contains("builder-7")).collect();
    assert!(rows.len() >= kernel_sources(&built).len(), "{out}");
    assert!(
        rows.iter().all(|l| l.contains(&fp) && l.contains("  ok  ")),
        "{out}"
    );
    assert!(rows.iter().all(|l| l.contains("driver_name=")), "{out}");
    assert!(out.contains(", 0 refused"), "{out}");
    // A serving node (public key only) is served every kernel by the remote.
    let served = attention_check("vulkan", &d.join("serving"), 2, |c| {
        c.env("KPC_CACHE_REMOTE", &remote)
            .env("KPC_CACHE_TRUSTED_KEYS", &trusted);
    });
    assert!(
        kernel_sources(&served).iter().all(|s| *s == "remote"),
        "{served}"
    );
    // The serving node's disk records the builder's provenance and the signer it verified.
    let (code, local, err) = run(kpc(&d.join("serving"))
        .args(["cache", "ls", "--provenance"])
        .output()
        .unwrap());
    eprintln!("{local}");
    assert_eq!(code, Some(0), "{local}{err}");
    let rows: Vec<&str> = local.lines().filter(|l| l.contains("builder-7")).collect();
    assert!(rows.len() >= kernel_sources(&built).len(), "{local}");
    assert!(rows.iter().all(|l| l.contains(&fp)), "{local}");
    // `kpc cache explain` says the same of each cached kernel.
    let (code, explained, err) = run(kpc(&d.join("serving"))
        .args(["cache", "explain", "--backend", "vulkan"])
        .args(["--prompt", "40", "--heads", "4", "--kv-heads", "2"])
        .output()
        .unwrap());
    eprintln!("{explained}");
    assert_eq!(code, Some(0), "{explained}{err}");
    let lines: Vec<&str> = explained
        .lines()
        .filter(|l| l.starts_with("attn_"))
        .collect();
    assert!(!lines.is_empty(), "{explained}");
    for l in lines {
        assert!(
            l.contains("cached (disk; built by builder-7")
                && l.contains(&format!("signed by {fp}")),
            "{explained}"
        );
    }
    // Exported by the serving node with its own key, imported elsewhere: the builder is still the
    // builder, the signer the exporter.
    let exporter = keygen(&d, "exporter.key");
    let bundle_file = d.join("served.kpcb");
    let (code, out, err) = run(kpc(&d.join("serving"))
        .args(["cache", "export"])
        .arg(&bundle_file)
        .env("KPC_CACHE_SIGNING_KEY", &exporter)
        .output()
        .unwrap());
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = run(kpc(&d.join("third"))
        .args(["cache", "import"])
        .arg(&bundle_file)
        .env("KPC_CACHE_TRUSTED_KEYS", pub_of(&exporter))
        .output()
        .unwrap());
    assert_eq!(code, Some(0), "{out}{err}");
    let (_, third, _) = run(kpc(&d.join("third"))
        .args(["cache", "ls", "--provenance", "--json"])
        .output()
        .unwrap());
    let v: serde_json::Value = serde_json::from_str(&third).unwrap();
    let efp = SigningKey::from_file("K", &exporter)
        .unwrap()
        .public_key()
        .fingerprint();
    let entries = v["entries"].as_array().unwrap();
    assert!(!entries.is_empty(), "{third}");
    for e in entries {
        assert_eq!(e["provenance"]["host"], "builder-7", "{third}");
        assert_eq!(e["provenance"]["signer"], efp.as_str(), "{third}");
    }
    // A node trusting another key sees every entry refused, and the listing exits 1.
    let other = keygen(&d, "other.key");
    let (code, out, _) = ls(&pub_of(&other));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("REFUSED"), "{out}");
    assert!(out.contains("refused: the entry is signed by"), "{out}");
}
