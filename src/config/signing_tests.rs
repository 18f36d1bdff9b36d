//! Key files and key lists as `KPC_CACHE_SIGNING_KEY` and `KPC_CACHE_TRUSTED_KEYS` read them: real
//! files in a fresh directory, every bad one a typed error naming the variable.

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use super::super::{Config, ConfigError};
use super::*;

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kpc-keys-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn config(pairs: &[(&str, String)]) -> Result<Config, ConfigError> {
    let pairs = pairs.to_vec();
    Config::from_lookup(move |k| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| OsString::from(v))
    })
}

fn message(e: ConfigError) -> String {
    assert!(matches!(e, ConfigError::InvalidKey { .. }), "{e:?}");
    e.to_string()
}

#[test]
fn a_generated_pair_round_trips_through_the_variables() {
    let d = dir("pair");
    let file = d.join("builder.key");
    let public = SigningKey::write_pair(&[7; 32], &file, "kpc@test").unwrap();
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let pub_text = std::fs::read_to_string(d.join("builder.key.pub")).unwrap();
    assert!(pub_text.starts_with("ed25519:") && pub_text.ends_with(" kpc@test\n"));
    let c = config(&[
        ("KPC_CACHE_SIGNING_KEY", file.display().to_string()),
        (
            "KPC_CACHE_TRUSTED_KEYS",
            format!("{}, {}", d.join("builder.key.pub").display(), public),
        ),
        ("KPC_HOST_ID", "build-7".into()),
    ])
    .unwrap();
    assert_eq!(c.signing_key.as_ref().unwrap().public_key(), public);
    // The file and the inline key are the same key: listed once.
    assert_eq!(c.trusted_keys, vec![public]);
    assert_eq!(c.host_id(), "build-7");
    // Never overwritten.
    let again = SigningKey::write_pair(&[8; 32], &file, "x").unwrap_err();
    assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(
        SigningKey::from_file("V", &file).unwrap().public_key(),
        public
    );
    // Debug shows no secret.
    let dbg = format!("{:?}", SigningKey::from_seed(&[7; 32]));
    assert!(dbg.contains("redacted") && !dbg.contains("0707"), "{dbg}");
}

#[test]
fn bad_signing_key_files_are_typed_errors() {
    let d = dir("bad-signing");
    let var = |p: &std::path::Path| config(&[("KPC_CACHE_SIGNING_KEY", p.display().to_string())]);
    let missing = message(var(&d.join("nope")).unwrap_err());
    assert!(
        missing.contains("KPC_CACHE_SIGNING_KEY") && missing.contains("cannot be read"),
        "{missing}"
    );
    assert!(missing.contains("kpc cache keygen"), "{missing}");
    let file = d.join("k");
    SigningKey::write_pair(&[1; 32], &file, "c").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open = message(var(&file).unwrap_err());
    assert!(
        open.contains("mode 0644") && open.contains("chmod 600"),
        "{open}"
    );
    // The public key given where the private one belongs.
    let pubf = d.join("k.pub");
    std::fs::set_permissions(&pubf, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(message(var(&pubf).unwrap_err()).contains("holds a public key"));
    let junk = d.join("junk");
    std::fs::write(&junk, "kpc-ed25519-private:zz\n").unwrap();
    std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o600)).unwrap();
    let m = message(var(&junk).unwrap_err());
    assert!(m.contains("does not hold a kpc Ed25519 private key"), "{m}");
    assert!(
        !m.contains("zz"),
        "the error must not echo key material: {m}"
    );
}

#[test]
fn bad_trusted_key_lists_are_typed_errors() {
    let d = dir("bad-trusted");
    let t = |v: &str| message(config(&[("KPC_CACHE_TRUSTED_KEYS", v.into())]).unwrap_err());
    let good = SigningKey::from_seed(&[3; 32]).public_key().to_string();
    assert!(t(&format!("{good},")).contains("element 2 is empty"));
    assert!(t("ed25519:1234").contains("element 1"));
    let m = t(&format!("{good},/no/such/file"));
    assert!(
        m.contains("KPC_CACHE_TRUSTED_KEYS") && m.contains("element 2"),
        "{m}"
    );
    let privf = d.join("k");
    SigningKey::write_pair(&[1; 32], &privf, "c").unwrap();
    assert!(t(&privf.display().to_string()).contains("holds a private key"));
    let empty = d.join("empty.pub");
    std::fs::write(&empty, "# nothing here\n\n").unwrap();
    assert!(t(&empty.display().to_string()).contains("holds no public key"));
    let bad_line = d.join("bad.pub");
    std::fs::write(&bad_line, format!("{good}\nssh-ed25519 AAAA\n")).unwrap();
    assert!(t(&bad_line.display().to_string()).contains("line 2"));
    // A rotation file: two keys, comments.
    let two = d.join("two.pub");
    let other = SigningKey::from_seed(&[4; 32]).public_key();
    std::fs::write(&two, format!("# old\n{good} old\n# new\n{other} new\n")).unwrap();
    let c = config(&[("KPC_CACHE_TRUSTED_KEYS", two.display().to_string())]).unwrap();
    assert_eq!(c.trusted_keys.len(), 2);
    assert!(c.trusted_keys.contains(&other));
    // Empty means unset; a bad host id is refused.
    assert!(
        config(&[("KPC_CACHE_TRUSTED_KEYS", " ".into())])
            .unwrap()
            .trusted_keys
            .is_empty()
    );
    let e = config(&[("KPC_HOST_ID", "a\nb".into())]).unwrap_err();
    assert!(e.to_string().contains("KPC_HOST_ID"), "{e}");
    assert!(config(&[("KPC_HOST_ID", "".into())]).is_err());
}
