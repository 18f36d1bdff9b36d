//! The envelope's proofs, one forgery at a time: MACs (version 1 and 2) and writer signatures.

use super::*;
use crate::cache::Digest;
use crate::cache::store::seal;
use std::time::Duration;

fn key(n: u8) -> StoreKey {
    StoreKey::new(
        "backend=test\ndriver_version=7\n",
        Digest([n; 32]),
        Digest([2; 32]),
        64,
        b"",
        "-O2",
    )
}

fn secret(s: &str) -> MacKey {
    MacKey::from_secret("KPC_CACHE_REMOTE_KEY", s).unwrap()
}

fn prov(k: &StoreKey) -> Provenance {
    Provenance::for_key(
        "builder-1",
        k,
        Some(1_700_000_000),
        Duration::from_millis(42),
    )
}

fn mac_only(k: Option<&MacKey>) -> EntryAuth {
    EntryAuth::from(k.cloned())
}

fn signer(n: u8) -> SigningKey {
    SigningKey::from_seed(&[n; 32])
}

/// A builder: signs with `n`.
fn builder(n: u8) -> EntryAuth {
    EntryAuth {
        signer: Some(signer(n)),
        host: "builder-1".into(),
        ..EntryAuth::default()
    }
}

/// A reader trusting the public keys of `ns`, holding no private key.
fn reader(ns: &[u8]) -> EntryAuth {
    EntryAuth {
        trusted: ns.iter().map(|&n| signer(n).public_key()).collect(),
        host: "server-1".into(),
        ..EntryAuth::default()
    }
}

/// `auth`, writing uncompressed (version-2) envelopes: for the tests that cut them at byte offsets.
fn plain(auth: EntryAuth) -> EntryAuth {
    EntryAuth {
        compression: 0,
        ..auth
    }
}

fn wrap_mac(k: Option<&MacKey>, key: &StoreKey, sealed: &[u8]) -> Vec<u8> {
    wrap(&mac_only(k), key, sealed, &prov(key))
}

/// A version-1 envelope, as kpc wrote before writer signatures.
fn wrap_v1(mac_key: Option<&MacKey>, key: &StoreKey, sealed: &[u8]) -> Vec<u8> {
    let mut out = b"KPCE".to_vec();
    out.extend_from_slice(&[V1, if mac_key.is_some() { FLAG_MAC } else { 0 }, 0, 0]);
    if let Some(k) = mac_key {
        out.extend_from_slice(mac_v1(k, key, sealed).as_bytes());
    }
    out.extend_from_slice(sealed);
    out
}

#[test]
fn signed_entries_open_only_with_the_same_secret() {
    let k = key(1);
    let sealed = seal(&k, b"binary bytes", Duration::from_millis(5));
    let a = secret("fleet secret number one");
    let env = wrap_mac(Some(&a), &k, &sealed);
    assert_eq!(
        open(&mac_only(Some(&a)), &k, &env).unwrap().bytes(),
        b"binary bytes"
    );
    // No key configured: the checksums still verify, the MAC is not checked.
    assert_eq!(
        open(&mac_only(None), &k, &env).unwrap().bytes(),
        b"binary bytes"
    );
    let b = secret("another fleet's secret!");
    assert_eq!(
        open(&mac_only(Some(&b)), &k, &env).unwrap_err(),
        Refusal::BadMac
    );
}

#[test]
fn version_1_envelopes_are_still_read() {
    let k = key(1);
    let a = secret("fleet secret number one");
    let env = wrap_v1(Some(&a), &k, &seal(&k, b"old", Duration::ZERO));
    let (hit, p) = open_with_provenance(&mac_only(Some(&a)), &k, &env).unwrap();
    assert_eq!((hit.bytes(), p), (&b"old"[..], None));
    let b = secret("another fleet's secret!");
    assert_eq!(
        open(&mac_only(Some(&b)), &k, &env).unwrap_err(),
        Refusal::BadMac
    );
    // A reader that requires signatures refuses it: version 1 has none.
    assert_eq!(
        open(&reader(&[1]), &k, &env).unwrap_err(),
        Refusal::Unsigned
    );
}

#[test]
fn unsigned_entries_are_refused_when_a_key_is_set() {
    let k = key(1);
    let env = wrap_mac(None, &k, &seal(&k, b"x", Duration::ZERO));
    assert_eq!(open(&mac_only(None), &k, &env).unwrap().bytes(), b"x");
    let err = open(&mac_only(Some(&secret("0123456789abcdef"))), &k, &env).unwrap_err();
    assert_eq!(err, Refusal::MissingMac);
    assert!(err.is_auth());
}

#[test]
fn a_forged_binary_under_a_valid_looking_entry_is_refused() {
    let k = key(1);
    let s = secret("fleet secret number one");
    let env = wrap(
        &plain(mac_only(Some(&s))),
        &k,
        &seal(&k, b"genuine", Duration::ZERO),
        &prov(&k),
    );
    assert_eq!(env[4], V2);
    // The forger reseals their own binary (checksums valid) but cannot recompute the MAC.
    let forged = seal(&k, b"evil!!!", Duration::ZERO);
    let genuine_len = seal(&k, b"genuine", Duration::ZERO).len();
    let mut env2 = env[..env.len() - genuine_len].to_vec();
    env2.extend_from_slice(&forged);
    assert_eq!(
        open(&mac_only(Some(&s)), &k, &env2).unwrap_err(),
        Refusal::BadMac
    );
    // Without a key the forged entry verifies: the plain warning ENVIRONMENT.md gives.
    assert_eq!(
        open(&mac_only(None), &k, &env2).unwrap().bytes(),
        b"evil!!!"
    );
}

#[test]
fn an_entry_replayed_under_another_key_is_refused() {
    let (k1, k2) = (key(1), key(9));
    let s = secret("fleet secret number one");
    let env = wrap_mac(Some(&s), &k1, &seal(&k1, b"one", Duration::ZERO));
    assert_eq!(
        open(&mac_only(Some(&s)), &k2, &env).unwrap_err(),
        Refusal::BadMac
    );
    assert!(matches!(
        open(&mac_only(None), &k2, &env).unwrap_err(),
        Refusal::Entry(Defect::KeyMismatch)
    ));
}

#[test]
fn garbage_and_truncation_are_typed_refusals() {
    let k = key(1);
    let s = secret("fleet secret number one");
    let both = EntryAuth {
        mac: Some(s.clone()),
        ..builder(1)
    };
    let env = wrap(&both, &k, &seal(&k, b"payload", Duration::ZERO), &prov(&k));
    let strict = EntryAuth {
        mac: Some(s.clone()),
        ..reader(&[1])
    };
    for cut in [
        0,
        3,
        HEADER,
        HEADER + 10,
        HEADER + MAC_LEN + 2,
        env.len() - 1,
    ] {
        assert!(open(&strict, &k, &env[..cut]).is_err(), "cut at {cut}");
        assert!(
            open(&mac_only(None), &k, &env[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    assert_eq!(
        open(&mac_only(None), &k, b"GARBAGE!garbage").unwrap_err(),
        Refusal::Malformed("wrong magic")
    );
    let mut flipped = env.clone();
    *flipped.last_mut().unwrap() ^= 1;
    assert_eq!(open(&strict, &k, &flipped).unwrap_err(), Refusal::BadMac);
    // No MAC key: the signature (always checked when present) catches it.
    assert!(matches!(
        open(&mac_only(None), &k, &flipped).unwrap_err(),
        Refusal::BadSignature(_)
    ));
    assert_eq!(claimed_record(&env).unwrap().image_len, 64);
    // Every single-bit flip anywhere is refused by the strict reader.
    for i in 0..env.len() {
        let mut bad = env.clone();
        bad[i] ^= 0x40;
        assert!(open(&strict, &k, &bad).is_err(), "byte {i}");
    }
}

#[test]
fn short_secrets_are_config_errors_that_hide_the_value() {
    let err = MacKey::from_secret("KPC_CACHE_REMOTE_KEY", "short").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("KPC_CACHE_REMOTE_KEY"), "{msg}");
    assert!(!msg.contains("short\""), "{msg}");
    assert!(msg.contains("at least 16 bytes"), "{msg}");
    assert!(MacKey::from_secret("V", "                ").is_err());
    assert_eq!(
        format!("{:?}", secret("0123456789abcdef")),
        "MacKey(<redacted>)"
    );
}

#[test]
fn a_trusted_signature_opens_with_its_provenance() {
    let k = key(1);
    let env = wrap(
        &builder(1),
        &k,
        &seal(&k, b"bin", Duration::from_millis(42)),
        &prov(&k),
    );
    let (hit, p) = open_with_provenance(&reader(&[1]), &k, &env).unwrap();
    assert_eq!(hit.bytes(), b"bin");
    let p = p.unwrap();
    assert_eq!(p.host, "builder-1");
    assert_eq!(p.driver, "driver_version=7");
    assert_eq!(p.built_unix, 1_700_000_000);
    assert_eq!(p.build_time, Duration::from_millis(42));
    assert_eq!(p.kpc_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(p.signer, Some(signer(1).public_key().fingerprint()));
}

#[test]
fn a_reader_refuses_unsigned_untrusted_and_resigned_entries() {
    let k = key(1);
    let sealed = seal(&k, b"bin", Duration::ZERO);
    // A node holding only trusted keys writes unsigned entries: another reader refuses them.
    let serving = reader(&[1]);
    assert!(!serving.may_publish());
    let env = wrap(&serving, &k, &sealed, &prov(&k));
    assert_eq!(
        open(&reader(&[1]), &k, &env).unwrap_err(),
        Refusal::Unsigned
    );
    // Signed by a key nobody trusts (an attacker's own key pair).
    let env = wrap(&builder(66), &k, &sealed, &prov(&k));
    let fp = signer(66).public_key().fingerprint();
    assert_eq!(
        open(&reader(&[1]), &k, &env).unwrap_err(),
        Refusal::UntrustedSigner(fp)
    );
    // A trusted entry re-signed by the attacker: signature block replaced, rest kept.
    let good = wrap(&plain(builder(1)), &k, &sealed, &prov(&k));
    let p = split(&good).unwrap();
    let evil = signer(66);
    let sig = evil.sign(&signed_message(&k, p.header, p.provenance, p.sealed));
    let mut resigned = good.clone();
    let at = good.len() - sealed.len() - SIG_BLOCK;
    resigned[at..at + 32].copy_from_slice(&evil.public_key().to_bytes());
    resigned[at + 32..at + SIG_BLOCK].copy_from_slice(&sig);
    assert!(matches!(
        open(&reader(&[1]), &k, &resigned).unwrap_err(),
        Refusal::UntrustedSigner(_)
    ));
    // The attacker names the trusted key but keeps their own signature: does not verify.
    let mut named = resigned.clone();
    named[at..at + 32].copy_from_slice(&signer(1).public_key().to_bytes());
    assert!(matches!(
        open(&reader(&[1]), &k, &named).unwrap_err(),
        Refusal::BadSignature(_)
    ));
    // The signature stripped (flag cleared, block removed): unsigned.
    let mut stripped = good[..at].to_vec();
    stripped[5] &= !FLAG_SIG;
    stripped.extend_from_slice(&good[at + SIG_BLOCK..]);
    assert_eq!(
        open(&reader(&[1]), &k, &stripped).unwrap_err(),
        Refusal::Unsigned
    );
    // A trusted builder's binary swapped for the attacker's (checksums valid).
    let mut swapped = good[..good.len() - sealed.len()].to_vec();
    let evil_sealed = seal(&k, b"EVIL", Duration::ZERO);
    swapped.extend_from_slice(&evil_sealed);
    assert!(matches!(
        open(&reader(&[1]), &k, &swapped).unwrap_err(),
        Refusal::BadSignature(_)
    ));
    // The provenance rewritten (another host claimed).
    let other = Provenance {
        host: "innocent-host".into(),
        ..prov(&k)
    };
    let forged_prov = other.encode();
    let mut rewritten = good[..HEADER].to_vec();
    rewritten.extend_from_slice(&(forged_prov.len() as u32).to_le_bytes());
    rewritten.extend_from_slice(&forged_prov);
    rewritten.extend_from_slice(&good[at..]);
    assert!(matches!(
        open(&reader(&[1]), &k, &rewritten).unwrap_err(),
        Refusal::BadSignature(_)
    ));
}

#[test]
fn a_signed_entry_replayed_under_another_key_is_refused() {
    let (k1, k2) = (key(1), key(9));
    let env = wrap(
        &builder(1),
        &k1,
        &seal(&k1, b"one", Duration::ZERO),
        &prov(&k1),
    );
    // Looked up as k2 (stored at k2's name): the signature binds k1's digest.
    assert!(matches!(
        open(&reader(&[1]), &k2, &env).unwrap_err(),
        Refusal::BadSignature(_)
    ));
    // Re-sealed by the attacker under k2 with k1's signature kept.
    let p = split(&env).unwrap();
    let sealed2 = seal(&k2, b"one", Duration::ZERO);
    let mut moved = env[..env.len() - p.sealed.len()].to_vec();
    moved.extend_from_slice(&sealed2);
    assert!(matches!(
        open(&reader(&[1]), &k2, &moved).unwrap_err(),
        Refusal::BadSignature(_)
    ));
}

#[test]
fn rotation_accepts_every_trusted_key_and_drops_a_removed_one() {
    let k = key(1);
    let sealed = seal(&k, b"bin", Duration::ZERO);
    let old = wrap(&builder(1), &k, &sealed, &prov(&k));
    let new = wrap(&builder(2), &k, &sealed, &prov(&k));
    let both = reader(&[1, 2]);
    assert!(open(&both, &k, &old).is_ok());
    assert!(open(&both, &k, &new).is_ok());
    let rotated = reader(&[2]);
    assert!(matches!(
        open(&rotated, &k, &old).unwrap_err(),
        Refusal::UntrustedSigner(_)
    ));
    assert!(open(&rotated, &k, &new).is_ok());
}

#[test]
fn mac_and_signature_combine() {
    let k = key(1);
    let s = secret("fleet secret number one");
    let sealed = seal(&k, b"bin", Duration::ZERO);
    let full = EntryAuth {
        mac: Some(s.clone()),
        ..builder(1)
    };
    let strict = EntryAuth {
        mac: Some(s.clone()),
        ..reader(&[1])
    };
    assert!(open(&strict, &k, &wrap(&full, &k, &sealed, &prov(&k))).is_ok());
    // Signed but not MAC'd: the MAC reader refuses it.
    assert_eq!(
        open(&strict, &k, &wrap(&builder(1), &k, &sealed, &prov(&k))).unwrap_err(),
        Refusal::MissingMac
    );
    // MAC'd (a fleet member with the secret, a serving node say) but not signed: refused.
    let member = EntryAuth {
        mac: Some(s),
        ..reader(&[1])
    };
    assert_eq!(
        open(&strict, &k, &wrap(&member, &k, &sealed, &prov(&k))).unwrap_err(),
        Refusal::Unsigned
    );
}

/// A sealed entry large and regular enough that compression pays (as real binaries do).
fn big_sealed(k: &StoreKey, tag: u8) -> Vec<u8> {
    let bin: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 13) as u8 ^ tag).collect();
    seal(k, &bin, Duration::from_millis(3))
}

#[test]
fn compressed_entries_open_to_the_same_binary_and_are_smaller() {
    let k = key(1);
    let sealed = big_sealed(&k, 0);
    let s = secret("fleet secret number one");
    let both = EntryAuth {
        mac: Some(s.clone()),
        ..builder(1)
    };
    let env = wrap(&both, &k, &sealed, &prov(&k));
    assert_eq!((env[4], env[5] & FLAG_ZSTD), (V3, FLAG_ZSTD));
    assert_eq!(is_compressed(&env), Some(true));
    assert!(
        env.len() < sealed.len() / 10,
        "{} of {}",
        env.len(),
        sealed.len()
    );
    let reader = EntryAuth {
        mac: Some(s),
        ..reader(&[1])
    };
    let (hit, p) = open_with_provenance(&reader, &k, &env).unwrap();
    assert_eq!(hit.bytes(), &sealed_binary(&k, &sealed)[..]);
    assert_eq!(
        p.unwrap().signer,
        Some(signer(1).public_key().fingerprint())
    );
    // Listing reads the key record without the binary.
    assert_eq!(claimed_record(&env).unwrap().to_key().unwrap(), k);
    // Uncompressed (level 0) the same entry is version 2, which readers take alike.
    let env2 = wrap(&plain(both), &k, &sealed, &prov(&k));
    assert_eq!((env2[4], is_compressed(&env2)), (V2, Some(false)));
    assert_eq!(open(&reader, &k, &env2).unwrap().bytes(), hit.bytes());
}

/// The binary a sealed entry holds (what a hit returns).
fn sealed_binary(k: &StoreKey, sealed: &[u8]) -> Vec<u8> {
    StoreHit::unseal(k, sealed).unwrap().into_bytes()
}

#[test]
fn the_mac_and_the_signature_cover_the_compressed_bytes_and_the_flag() {
    let k = key(1);
    let s = secret("fleet secret number one");
    let good_mac = wrap(&mac_only(Some(&s)), &k, &big_sealed(&k, 0), &prov(&k));
    let good_sig = wrap(&builder(1), &k, &big_sealed(&k, 0), &prov(&k));
    // The attacker's block: their own binary, compressed the same way, in place of the genuine one.
    let evil_block = compress::compress(&big_sealed(&k, 0x55), DEFAULT_LEVEL).unwrap();
    for (good, who, want_auth) in [
        (&good_mac, mac_only(Some(&s)), "bad-mac"),
        (&good_sig, reader(&[1]), "bad-signature"),
    ] {
        let p = split(good).unwrap();
        let at = good.len() - p.sealed.len();
        let swapped = [&good[..at], &evil_block[..]].concat();
        assert_eq!(open(&who, &k, &swapped).unwrap_err().reason(), want_auth);
        // One bit of the compressed bytes.
        let mut flipped = good.to_vec();
        flipped[at + 20] ^= 1;
        assert_eq!(open(&who, &k, &flipped).unwrap_err().reason(), want_auth);
        // The compression flag cleared: the header is covered too.
        let mut unflagged = good.to_vec();
        unflagged[5] &= !FLAG_ZSTD;
        assert_eq!(open(&who, &k, &unflagged).unwrap_err().reason(), want_auth);
    }
    // A reader without a key or trusted keys decompresses, and the entry's checksums refuse damage.
    let mut flipped = good_mac.clone();
    let last = flipped.len() - 10;
    flipped[last] ^= 1;
    assert!(matches!(
        open(&mac_only(None), &k, &flipped).unwrap_err(),
        Refusal::Malformed(_) | Refusal::Entry(_)
    ));
}

#[test]
fn a_decompression_bomb_is_refused_within_the_limit() {
    let k = key(1);
    let s = secret("fleet secret number one");
    // A genuine fleet member's entry of 64 KiB, read by a reader that decompresses at most 16 KiB.
    let env = wrap(&mac_only(Some(&s)), &k, &big_sealed(&k, 0), &prov(&k));
    let small = EntryAuth {
        max_entry: 16 << 10,
        ..mac_only(Some(&s))
    };
    assert!(matches!(
        open(&small, &k, &env).unwrap_err(),
        Refusal::Oversized { limit: 16384, .. }
    ));
    // A hostile writer (no key configured): 256 MiB of zeros in a few KB, declared as what it is, or
    // as something small.
    let zeros = zstd::bulk::compress(&vec![0u8; 256 << 20], 19).unwrap();
    for declared in [256u64 << 20, 1000] {
        let mut block = declared.to_le_bytes().to_vec();
        block.extend_from_slice(&zeros);
        let bomb = wrap_stored(&mac_only(None), &k, V3, FLAG_ZSTD, &block, &prov(&k));
        assert!(bomb.len() < 64 << 10, "{}", bomb.len());
        let reader = EntryAuth {
            max_entry: 1 << 20,
            ..mac_only(None)
        };
        let e = open(&reader, &k, &bomb).unwrap_err();
        match declared {
            1000 => assert!(matches!(e, Refusal::Malformed(_)), "{e}"),
            _ => assert_eq!(
                e,
                Refusal::Oversized {
                    declared,
                    limit: 1 << 20
                }
            ),
        }
        assert!(!e.is_auth());
    }
}

#[test]
fn version_2_readers_flags_are_refused_in_version_2_envelopes() {
    // The compression flag belongs to version 3: a version-2 envelope that sets it is malformed.
    let k = key(1);
    let mut env = wrap(&plain(mac_only(None)), &k, &big_sealed(&k, 0), &prov(&k));
    env[5] |= FLAG_ZSTD;
    assert_eq!(
        open(&mac_only(None), &k, &env).unwrap_err(),
        Refusal::Malformed("unknown flags")
    );
}

#[test]
fn a_cut_off_refuses_entries_built_before_it_and_the_signature_covers_the_time() {
    let k = key(1);
    let sealed = seal(&k, b"bin", Duration::ZERO);
    let at = |t: u64| Provenance::for_key("builder-1", &k, Some(t), Duration::ZERO);
    let env = wrap(&plain(builder(1)), &k, &sealed, &at(1_800_000_000));
    let cut = |t: u64| EntryAuth {
        not_before: Some(t),
        ..reader(&[1])
    };
    assert!(open(&cut(1_800_000_000), &k, &env).is_ok());
    assert_eq!(
        open(&cut(1_800_000_001), &k, &env).unwrap_err(),
        Refusal::BeforeCutoff {
            built: Some(1_800_000_000),
            not_before: 1_800_000_001
        }
    );
    // Moving the build time past the cut-off breaks the signature, which covers the provenance.
    let p = split(&env).unwrap();
    let old = String::from_utf8(p.provenance.to_vec()).unwrap();
    let newer = old.replace("1800000000", "1900000000");
    assert_eq!(old.len(), newer.len());
    let at_prov = env
        .windows(old.len())
        .position(|w| w == old.as_bytes())
        .unwrap();
    let mut moved = env.clone();
    moved[at_prov..at_prov + old.len()].copy_from_slice(newer.as_bytes());
    assert!(matches!(
        open(&cut(1_800_000_001), &k, &moved).unwrap_err(),
        Refusal::BadSignature(_)
    ));
    // A version-1 envelope has no build time: refused under any cut-off.
    let v1 = wrap_v1(None, &k, &sealed);
    let e = open(
        &EntryAuth {
            not_before: Some(0),
            ..mac_only(None)
        },
        &k,
        &v1,
    )
    .unwrap_err();
    assert_eq!(
        e,
        Refusal::BeforeCutoff {
            built: None,
            not_before: 0
        }
    );
    assert_eq!(e.reason(), "before-cutoff");
}
