//! Authenticated entries: what a shared store (the remote, a bundle) holds, and how a reader with the
//! fleet's secret (`KPC_CACHE_REMOTE_KEY`) tells an entry a fleet member wrote from one anybody else
//! wrote.
//!
//! A sealed entry ([`seal`](super::seal)) protects itself against damage (checksums, the full key),
//! not against a writer: whoever can write the shared store can seal a binary of their own under any
//! key. So what leaves the machine is wrapped in an *envelope*: a short header and, when a secret is
//! configured, a keyed BLAKE3 MAC over the key's digest and the whole sealed entry (key record and
//! binary). A reader with the secret refuses an envelope without a MAC or with a wrong one before it
//! looks at the entry; the entry is then verified as any other ([`StoreHit::unseal`]).
//!
//! Layout (little-endian): `b"KPCE"`, version `1`, flags (bit 0: a MAC follows), two zero bytes, the
//! 32-byte MAC if flagged, then the sealed entry.

use super::StoreHit;
use crate::cache::disk::entry::Defect;
use crate::cache::store::StoreKey;
use crate::config::MacKey;

const MAGIC: &[u8; 4] = b"KPCE";
const VERSION: u8 = 1;
const FLAG_MAC: u8 = 1;
const HEADER: usize = 8;
const MAC_LEN: usize = 32;
/// The MAC of a sealed entry under `key`: keyed BLAKE3 over the entry key's digest, the length and the
/// sealed bytes.
fn mac_of(mac_key: &MacKey, key: &StoreKey, sealed: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(mac_key.bytes());
    h.update(&key.digest().0);
    h.update(&(sealed.len() as u64).to_le_bytes());
    h.update(sealed);
    h.finalize()
}

/// Why an envelope was refused. Every refusal means the entry was not loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not an envelope at all: too short, wrong magic or an unknown version or flags.
    #[error("not a kpc entry envelope ({0})")]
    Malformed(&'static str),
    /// A secret is configured and the entry carries no MAC: written by a process without the secret.
    #[error("the entry carries no MAC, and a key is configured (KPC_CACHE_REMOTE_KEY)")]
    MissingMac,
    /// The MAC does not match: written with another secret, or forged, or altered after signing.
    #[error("the entry's MAC does not match the configured key (KPC_CACHE_REMOTE_KEY)")]
    BadMac,
    /// The envelope is authentic (or unauthenticated and accepted) but the entry inside fails its own
    /// verification: damaged, truncated, or for another key.
    #[error("the entry does not verify: {0}")]
    Entry(Defect),
}

impl Refusal {
    /// Whether this refusal is an authentication failure (missing or wrong MAC) rather than damage.
    pub fn is_auth(&self) -> bool {
        matches!(self, Refusal::MissingMac | Refusal::BadMac)
    }
}

/// Wraps `sealed` (the bytes [`seal`](super::seal) made for `key`) in an envelope, with a MAC when
/// `mac_key` is given.
pub fn wrap(mac_key: Option<&MacKey>, key: &StoreKey, sealed: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + MAC_LEN + sealed.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(if mac_key.is_some() { FLAG_MAC } else { 0 });
    out.extend_from_slice(&[0, 0]);
    if let Some(k) = mac_key {
        out.extend_from_slice(mac_of(k, key, sealed).as_bytes());
    }
    out.extend_from_slice(sealed);
    out
}

/// The parts of an envelope: its MAC, if any, and the sealed entry.
fn split(envelope: &[u8]) -> Result<(Option<[u8; MAC_LEN]>, &[u8]), Refusal> {
    if envelope.len() < HEADER {
        return Err(Refusal::Malformed("shorter than its header"));
    }
    if &envelope[..4] != MAGIC {
        return Err(Refusal::Malformed("wrong magic"));
    }
    if envelope[4] != VERSION {
        return Err(Refusal::Malformed("unknown version"));
    }
    if envelope[5] & !FLAG_MAC != 0 || envelope[6..8] != [0, 0] {
        return Err(Refusal::Malformed("unknown flags"));
    }
    if envelope[5] & FLAG_MAC == 0 {
        return Ok((None, &envelope[HEADER..]));
    }
    if envelope.len() < HEADER + MAC_LEN {
        return Err(Refusal::Malformed("truncated MAC"));
    }
    let mac: [u8; MAC_LEN] = envelope[HEADER..HEADER + MAC_LEN]
        .try_into()
        .expect("slice of MAC_LEN bytes");
    Ok((Some(mac), &envelope[HEADER + MAC_LEN..]))
}

/// The sealed entry inside `envelope`, authenticated for `key` when `mac_key` is given.
///
/// With a key, an envelope without a MAC or with a wrong one is refused; without one, the MAC (if
/// present) cannot be checked and is ignored: the entry's own checksums still catch damage, not a
/// forger. The returned bytes are not yet verified as an entry: pass them to [`StoreHit::unseal`], or
/// use [`open`], which does both.
pub(crate) fn authenticate<'a>(
    mac_key: Option<&MacKey>,
    key: &StoreKey,
    envelope: &'a [u8],
) -> Result<&'a [u8], Refusal> {
    let (mac, sealed) = split(envelope)?;
    if let Some(k) = mac_key {
        let Some(mac) = mac else {
            return Err(Refusal::MissingMac);
        };
        // blake3::Hash compares in constant time.
        if mac_of(k, key, sealed) != blake3::Hash::from(mac) {
            return Err(Refusal::BadMac);
        }
    }
    Ok(sealed)
}

/// Authenticates `envelope` for `key` ([`authenticate`]) and verifies the entry inside
/// ([`StoreHit::unseal`]): the only way a shared store's bytes become a [`StoreHit`].
pub fn open(
    mac_key: Option<&MacKey>,
    key: &StoreKey,
    envelope: &[u8],
) -> Result<StoreHit, Refusal> {
    let sealed = authenticate(mac_key, key, envelope)?;
    StoreHit::unseal(key, sealed).map_err(Refusal::Entry)
}

/// The key record of an envelope's entry, read without authentication (for listings and for finding
/// the key an imported entry claims, which [`open`] then checks). `None` if it does not parse.
pub(crate) fn claimed_record(envelope: &[u8]) -> Option<super::KeyRecord> {
    let (_, sealed) = split(envelope).ok()?;
    super::sealed_record(sealed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Digest;
    use crate::cache::store::seal;
    use std::time::Duration;

    fn key(n: u8) -> StoreKey {
        StoreKey::new(
            "backend=test\n",
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

    #[test]
    fn signed_entries_open_only_with_the_same_secret() {
        let k = key(1);
        let sealed = seal(&k, b"binary bytes", Duration::from_millis(5));
        let a = secret("fleet secret number one");
        let env = wrap(Some(&a), &k, &sealed);
        assert_eq!(open(Some(&a), &k, &env).unwrap().bytes(), b"binary bytes");
        // No key configured: the checksums still verify, the MAC is not checked.
        assert_eq!(open(None, &k, &env).unwrap().bytes(), b"binary bytes");
        let b = secret("another fleet's secret!");
        assert_eq!(open(Some(&b), &k, &env).unwrap_err(), Refusal::BadMac);
    }

    #[test]
    fn unsigned_entries_are_refused_when_a_key_is_set() {
        let k = key(1);
        let env = wrap(None, &k, &seal(&k, b"x", Duration::ZERO));
        assert_eq!(open(None, &k, &env).unwrap().bytes(), b"x");
        let err = open(Some(&secret("0123456789abcdef")), &k, &env).unwrap_err();
        assert_eq!(err, Refusal::MissingMac);
        assert!(err.is_auth());
    }

    #[test]
    fn a_forged_binary_under_a_valid_looking_entry_is_refused() {
        let k = key(1);
        let s = secret("fleet secret number one");
        let mut env = wrap(Some(&s), &k, &seal(&k, b"genuine", Duration::ZERO));
        // The forger reseals their own binary (checksums valid) but cannot recompute the MAC.
        let forged = seal(&k, b"evil!!!", Duration::ZERO);
        env.truncate(HEADER + MAC_LEN);
        env.extend_from_slice(&forged);
        assert_eq!(open(Some(&s), &k, &env).unwrap_err(), Refusal::BadMac);
        // Without a key the forged entry verifies: the plain warning ENVIRONMENT.md gives.
        assert_eq!(open(None, &k, &env).unwrap().bytes(), b"evil!!!");
    }

    #[test]
    fn an_entry_replayed_under_another_key_is_refused() {
        let (k1, k2) = (key(1), key(9));
        let s = secret("fleet secret number one");
        let env = wrap(Some(&s), &k1, &seal(&k1, b"one", Duration::ZERO));
        assert_eq!(open(Some(&s), &k2, &env).unwrap_err(), Refusal::BadMac);
        assert!(matches!(
            open(None, &k2, &env).unwrap_err(),
            Refusal::Entry(Defect::KeyMismatch)
        ));
    }

    #[test]
    fn garbage_and_truncation_are_typed_refusals() {
        let k = key(1);
        let s = secret("fleet secret number one");
        let env = wrap(Some(&s), &k, &seal(&k, b"payload", Duration::ZERO));
        for cut in [0, 3, HEADER, HEADER + 10, env.len() - 1] {
            assert!(open(Some(&s), &k, &env[..cut]).is_err(), "cut at {cut}");
            assert!(open(None, &k, &env[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(
            open(None, &k, b"GARBAGE!garbage").unwrap_err(),
            Refusal::Malformed("wrong magic")
        );
        let mut flipped = env.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(open(Some(&s), &k, &flipped).unwrap_err(), Refusal::BadMac);
        assert!(matches!(
            open(None, &k, &flipped).unwrap_err(),
            Refusal::Entry(_)
        ));
        assert_eq!(claimed_record(&env).unwrap().image_len, 64);
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
}
