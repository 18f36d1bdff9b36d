//! Authenticated entries: what a shared store (the remote, a bundle) holds, and how a reader tells an
//! entry a trusted writer wrote from one anybody else wrote.
//!
//! A sealed entry ([`seal`](super::seal)) protects itself against damage (checksums, the full key),
//! not against a writer: whoever can write the shared store can seal a binary of their own under any
//! key. So what leaves the machine is wrapped in an *envelope* that may carry two proofs:
//! - a keyed BLAKE3 **MAC** (`KPC_CACHE_REMOTE_KEY`, a secret every fleet member shares): proves a
//!   fleet member wrote it, but every machine that can check it can also make it;
//! - an Ed25519 **writer signature** (`KPC_CACHE_SIGNING_KEY` on builders, `KPC_CACHE_TRUSTED_KEYS`
//!   on readers): only holders of a private key can make it, and readers hold public keys only, so a
//!   serving node verifies but cannot forge. Several trusted keys allow rotation.
//!
//! The two combine: a reader checks every proof it is configured for (the MAC with a secret, the
//! signature with trusted keys), and an entry must pass all of them. A present signature is always
//! checked against the key it names, so an altered signed entry is refused even by a reader that
//! trusts no key; whether that key is *trusted* matters only with `KPC_CACHE_TRUSTED_KEYS`.
//!
//! Layout, version 2 (little-endian): `b"KPCE"`, version `2`, flags (bit 0: a MAC follows, bit 1: a
//! signature follows), two zero bytes; the 32-byte MAC if flagged; the provenance's length (u32) and
//! the provenance ([`Provenance`], JSON); the signer's 32-byte public key and the 64-byte signature if
//! flagged; then the sealed entry. The signature covers a domain string, the entry key's digest, the
//! header (so its flags), the provenance and the sealed entry; the MAC covers the key's digest, the
//! header and everything after the MAC (signature included). Version 1 (no provenance, no signature,
//! MAC over the key digest and the sealed entry) is still read.
//!
//! Version 3 is version 2 with one more flag, bit 2: the sealed entry is stored zstd-compressed, as
//! a block of its length (u64) and one zstd frame (`compress.rs`). The MAC and the signature cover the
//! block as stored, so a reader authenticates before it decompresses, and the sealed entry's checksums
//! then cover what came out; decompression is bounded by [`EntryAuth::max_entry`]. kpc writes version
//! 3 when it compresses (`KPC_CACHE_REMOTE_COMPRESS`, on by default, and bundles) and the entry gets
//! smaller, else version 2. A kpc from before compression refuses a version-3 entry as malformed (a
//! miss: it builds and publishes a version-2 one, which this kpc reads).

use std::borrow::Cow;

use super::StoreHit;
use super::compress::{self, Inflate};
use super::entry::Defect;
use super::provenance::Provenance;
use crate::cache::store::StoreKey;
use crate::config::{Config, MacKey, PublicKey, SigningKey};

const MAGIC: &[u8; 4] = b"KPCE";
const V1: u8 = 1;
const V2: u8 = 2;
const V3: u8 = 3;
const FLAG_MAC: u8 = 1;
const FLAG_SIG: u8 = 2;
const FLAG_ZSTD: u8 = 4;
/// The zstd level shared entries are written at unless configured otherwise
/// (`KPC_CACHE_REMOTE_COMPRESS`): fast to write, and within a few percent of level 19 on binaries.
pub const DEFAULT_LEVEL: i32 = 3;
const HEADER: usize = 8;
const MAC_LEN: usize = 32;
const SIG_BLOCK: usize = 32 + 64;
/// Longest provenance accepted (a hostile entry cannot make a reader parse without bound).
const MAX_PROVENANCE: usize = 64 << 10;
const SIG_DOMAIN: &[u8] = b"kpc shared cache entry signature v2\0";

/// What a process brings to shared entries: the fleet's MAC key, its own signing key, the public keys
/// it trusts, its host id for provenance, how it compresses what it writes and how much it decompresses.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EntryAuth {
    /// MAC key (`KPC_CACHE_REMOTE_KEY`): written entries carry a MAC, read ones must.
    pub mac: Option<MacKey>,
    /// Signing key (`KPC_CACHE_SIGNING_KEY`): written entries are signed with it.
    pub signer: Option<SigningKey>,
    /// Trusted keys (`KPC_CACHE_TRUSTED_KEYS`): with any, read entries must be signed by one of them.
    pub trusted: Vec<PublicKey>,
    /// Host id recorded in the provenance of written entries (`KPC_HOST_ID`).
    pub host: String,
    /// zstd level of the entries written (`KPC_CACHE_REMOTE_COMPRESS`, default
    /// 3); 0 writes them uncompressed (version-2 envelopes, which kpc before
    /// compression reads).
    pub compression: i32,
    /// The largest sealed entry a read decompresses: a compressed entry that declares more is
    /// refused before any byte is decompressed. From the configuration:
    /// `KPC_CACHE_MAX_DEVICE_IMAGE_SIZE` plus the largest key record and two headers; default: that of
    /// the default image limit.
    pub max_entry: u64,
    /// Entries built before this time (seconds since the Unix epoch, the provenance's `built_unix`)
    /// are refused; so is an entry without provenance (version 1). Set
    /// for the remote from `KPC_CACHE_REMOTE_NOT_BEFORE`; `None` (default): no cut-off.
    pub not_before: Option<u64>,
}

impl Default for EntryAuth {
    /// No MAC, no signature, no trusted keys, an empty host id; compressed at zstd level 3,
    /// decompressing what the default image size limit allows.
    fn default() -> EntryAuth {
        EntryAuth {
            mac: None,
            signer: None,
            trusted: Vec::new(),
            host: String::new(),
            compression: DEFAULT_LEVEL,
            max_entry: compress::entry_limit(crate::config::GIB),
            not_before: None,
        }
    }
}

impl EntryAuth {
    /// Sets [`EntryAuth::mac`].
    pub fn mac(mut self, mac: Option<MacKey>) -> Self {
        self.mac = mac;
        self
    }

    /// Sets [`EntryAuth::signer`].
    pub fn signer(mut self, signer: Option<SigningKey>) -> Self {
        self.signer = signer;
        self
    }

    /// Sets [`EntryAuth::trusted`].
    pub fn trusted(mut self, trusted: Vec<PublicKey>) -> Self {
        self.trusted = trusted;
        self
    }

    /// Sets [`EntryAuth::host`].
    pub fn host(mut self, host: String) -> Self {
        self.host = host;
        self
    }

    /// Sets [`EntryAuth::compression`].
    pub fn compression(mut self, compression: i32) -> Self {
        self.compression = compression;
        self
    }

    /// Sets [`EntryAuth::max_entry`].
    pub fn max_entry(mut self, max_entry: u64) -> Self {
        self.max_entry = max_entry;
        self
    }

    /// Sets [`EntryAuth::not_before`].
    pub fn not_before(mut self, not_before: Option<u64>) -> Self {
        self.not_before = not_before;
        self
    }

    /// What `config` sets: its MAC key, signing key, trusted keys and host id.
    pub fn from_config(config: &Config) -> EntryAuth {
        EntryAuth {
            mac: config.remote_key.clone(),
            signer: config.signing_key.clone(),
            trusted: config.trusted_keys.clone(),
            host: config.host_id(),
            compression: i32::from(config.remote_compress),
            max_entry: compress::entry_limit(config.max_device_image_size),
            not_before: None,
        }
    }

    /// Whether entries read must carry a trusted signature.
    pub fn requires_signature(&self) -> bool {
        !self.trusted.is_empty()
    }

    /// Whether this process should publish what it builds: not when it requires signatures and
    /// cannot sign (a serving node), since every reader like it would refuse the entry, and a
    /// published unsigned entry would replace a signed one.
    pub fn may_publish(&self) -> bool {
        self.signer.is_some() || self.trusted.is_empty()
    }
}

impl From<Option<MacKey>> for EntryAuth {
    /// MAC only, as before writer signatures; host id from the host name.
    fn from(mac: Option<MacKey>) -> EntryAuth {
        EntryAuth {
            mac,
            host: crate::config::signing::hostname(),
            ..EntryAuth::default()
        }
    }
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
    /// Trusted keys are configured and the entry carries no signature.
    #[error("the entry is not signed, and KPC_CACHE_TRUSTED_KEYS requires a signature")]
    Unsigned,
    /// The entry is signed, validly, by a key that is not among the trusted ones.
    #[error("the entry is signed by {0}, which is not in KPC_CACHE_TRUSTED_KEYS")]
    UntrustedSigner(String),
    /// The signature does not verify under the key it names: altered after signing, forged, or
    /// moved under another entry key.
    #[error("the entry's signature (by {0}) does not verify: altered, forged or moved")]
    BadSignature(String),
    /// The envelope is authentic (or unauthenticated and accepted) but the entry inside fails its own
    /// verification: damaged, truncated, or for another key.
    #[error("the entry does not verify: {0}")]
    Entry(Defect),
    /// A compressed entry declares more bytes than this reader decompresses (a decompression bomb,
    /// or an entry for a reader with a larger `KPC_CACHE_MAX_DEVICE_IMAGE_SIZE`).
    #[error(
        "the compressed entry declares {declared} bytes, more than the {limit} this reader decompresses (KPC_CACHE_MAX_DEVICE_IMAGE_SIZE plus the key record)"
    )]
    Oversized {
        /// What it declares.
        declared: u64,
        /// What this reader accepts.
        limit: u64,
    },
    /// The entry was built before the reader's cut-off (`KPC_CACHE_REMOTE_NOT_BEFORE`), or carries no
    /// build time to compare (a version-1 envelope).
    #[error("the entry was built {}, before KPC_CACHE_REMOTE_NOT_BEFORE (@{not_before})", built.map_or("at an unknown time (no provenance)".to_string(), |b| format!("at @{b}")))]
    BeforeCutoff {
        /// When it says it was built (seconds since the Unix epoch), if it says.
        built: Option<u64>,
        /// The reader's cut-off.
        not_before: u64,
    },
}

impl Refusal {
    /// Whether this refusal is an authentication failure (MAC or signature) rather than damage.
    pub fn is_auth(&self) -> bool {
        matches!(
            self,
            Refusal::MissingMac
                | Refusal::BadMac
                | Refusal::Unsigned
                | Refusal::UntrustedSigner(_)
                | Refusal::BadSignature(_)
        )
    }

    /// A stable kebab-case name for the reason (the `reason` label of `kpc_refusals_total`).
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Malformed(_) => "malformed",
            Refusal::MissingMac => "missing-mac",
            Refusal::BadMac => "bad-mac",
            Refusal::Unsigned => "unsigned",
            Refusal::UntrustedSigner(_) => "untrusted-signer",
            Refusal::BadSignature(_) => "bad-signature",
            Refusal::Entry(_) => "corrupt",
            Refusal::Oversized { .. } => "oversized",
            Refusal::BeforeCutoff { .. } => "before-cutoff",
        }
    }

    /// Whether this refusal is about the writer signature (unsigned, untrusted or bad).
    pub fn is_signature(&self) -> bool {
        matches!(
            self,
            Refusal::Unsigned | Refusal::UntrustedSigner(_) | Refusal::BadSignature(_)
        )
    }
}

/// The version-1 MAC: keyed BLAKE3 over the entry key's digest, the length and the sealed bytes.
fn mac_v1(mac_key: &MacKey, key: &StoreKey, sealed: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(mac_key.bytes());
    h.update(&key.digest().0);
    h.update(&(sealed.len() as u64).to_le_bytes());
    h.update(sealed);
    h.finalize()
}

/// The version-2 MAC: over the key's digest, the header and everything after the MAC.
fn mac_v2(mac_key: &MacKey, key: &StoreKey, header: &[u8], rest: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(mac_key.bytes());
    h.update(b"v2");
    h.update(&key.digest().0);
    h.update(header);
    h.update(&(rest.len() as u64).to_le_bytes());
    h.update(rest);
    h.finalize()
}

/// What a version-2 signature covers.
fn signed_message(key: &StoreKey, header: &[u8], provenance: &[u8], sealed: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SIG_DOMAIN.len() + 32 + HEADER + 12 + provenance.len());
    m.extend_from_slice(SIG_DOMAIN);
    m.extend_from_slice(&key.digest().0);
    m.extend_from_slice(header);
    m.extend_from_slice(&(provenance.len() as u32).to_le_bytes());
    m.extend_from_slice(provenance);
    m.extend_from_slice(&(sealed.len() as u64).to_le_bytes());
    m.extend_from_slice(sealed);
    m
}

/// Wraps `sealed` (the bytes [`seal`](super::seal) made for `key`) in an envelope with `provenance`,
/// signed when `auth` has a signing key and MAC'd when it has a MAC key: version 3, the entry
/// compressed at `auth.compression`, when that is on and makes it smaller; else version 2.
pub fn wrap(auth: &EntryAuth, key: &StoreKey, sealed: &[u8], provenance: &Provenance) -> Vec<u8> {
    let block = (auth.compression > 0)
        .then(|| compress::compress(sealed, auth.compression))
        .flatten();
    let (version, flags, stored) = match &block {
        Some(b) => (V3, FLAG_ZSTD, b.as_slice()),
        None => (V2, 0, sealed),
    };
    wrap_stored(auth, key, version, flags, stored, provenance)
}

/// The envelope of `stored` (the sealed entry, or its compressed block), as [`wrap`] says.
fn wrap_stored(
    auth: &EntryAuth,
    key: &StoreKey,
    version: u8,
    mut flags: u8,
    sealed: &[u8],
    provenance: &Provenance,
) -> Vec<u8> {
    let prov = provenance.encode();
    if auth.mac.is_some() {
        flags |= FLAG_MAC;
    }
    if auth.signer.is_some() {
        flags |= FLAG_SIG;
    }
    let header = [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], version, flags, 0, 0];
    let mut rest = Vec::with_capacity(4 + prov.len() + SIG_BLOCK + sealed.len());
    rest.extend_from_slice(&(prov.len() as u32).to_le_bytes());
    rest.extend_from_slice(&prov);
    if let Some(signer) = &auth.signer {
        let sig = signer.sign(&signed_message(key, &header, &prov, sealed));
        rest.extend_from_slice(&signer.public_key().to_bytes());
        rest.extend_from_slice(&sig);
    }
    rest.extend_from_slice(sealed);
    let mut out = Vec::with_capacity(HEADER + MAC_LEN + rest.len());
    out.extend_from_slice(&header);
    if let Some(k) = &auth.mac {
        out.extend_from_slice(mac_v2(k, key, &header, &rest).as_bytes());
    }
    out.extend_from_slice(&rest);
    out
}

/// The parts of an envelope.
struct Parts<'a> {
    version: u8,
    header: &'a [u8],
    mac: Option<[u8; MAC_LEN]>,
    /// Everything after the MAC (what the version-2 MAC covers).
    rest: &'a [u8],
    provenance: &'a [u8],
    signature: Option<([u8; 32], [u8; 64])>,
    /// The sealed entry as stored: itself, or its compressed block when `compressed`.
    sealed: &'a [u8],
    compressed: bool,
}

fn take<'a>(b: &mut &'a [u8], n: usize, what: &'static str) -> Result<&'a [u8], Refusal> {
    if b.len() < n {
        return Err(Refusal::Malformed(what));
    }
    let (head, tail) = b.split_at(n);
    *b = tail;
    Ok(head)
}

fn split(envelope: &[u8]) -> Result<Parts<'_>, Refusal> {
    let mut b = envelope;
    let header = take(&mut b, HEADER, "shorter than its header")?;
    if &header[..4] != MAGIC {
        return Err(Refusal::Malformed("wrong magic"));
    }
    let (version, flags) = (header[4], header[5]);
    let known = match version {
        V1 => FLAG_MAC,
        V2 => FLAG_MAC | FLAG_SIG,
        V3 => FLAG_MAC | FLAG_SIG | FLAG_ZSTD,
        _ => return Err(Refusal::Malformed("unknown version")),
    };
    if flags & !known != 0 || header[6..8] != [0, 0] {
        return Err(Refusal::Malformed("unknown flags"));
    }
    let mac = if flags & FLAG_MAC != 0 {
        let m = take(&mut b, MAC_LEN, "truncated MAC")?;
        Some(
            m.try_into()
                .map_err(|_| Refusal::Malformed("truncated MAC"))?,
        )
    } else {
        None
    };
    let rest = b;
    let (mut provenance, mut signature): (&[u8], _) = (&[], None);
    if version >= V2 {
        let len = take(&mut b, 4, "truncated provenance")?;
        let len = u32::from_le_bytes(len.try_into().map_err(|_| Refusal::Malformed("length"))?);
        if len as usize > MAX_PROVENANCE {
            return Err(Refusal::Malformed("oversized provenance"));
        }
        provenance = take(&mut b, len as usize, "truncated provenance")?;
        if flags & FLAG_SIG != 0 {
            let block = take(&mut b, SIG_BLOCK, "truncated signature")?;
            let (k, s) = block.split_at(32);
            let bad = |_| Refusal::Malformed("truncated signature");
            signature = Some((k.try_into().map_err(bad)?, s.try_into().map_err(bad)?));
        }
    }
    Ok(Parts {
        version,
        header,
        mac,
        rest,
        provenance,
        signature,
        sealed: b,
        compressed: flags & FLAG_ZSTD != 0,
    })
}

/// The sealed entry inside `envelope` and its provenance (none for version 1), authenticated for
/// `key` as `auth` requires: its MAC with a MAC key, a signature by a trusted key with trusted keys,
/// and any signature present against the key it names.
///
/// Without a MAC key a MAC present is not checked; without trusted keys an unsigned entry is
/// accepted: the entry's own checksums still catch damage, not a forger. A compressed entry is
/// decompressed after these checks (they cover the compressed bytes), within `auth.max_entry`. The
/// returned bytes are not yet verified as an entry: pass them to [`StoreHit::unseal`], or use
/// [`open`], which does both.
pub(crate) fn authenticate<'a>(
    auth: &EntryAuth,
    key: &StoreKey,
    envelope: &'a [u8],
) -> Result<(Cow<'a, [u8]>, Option<Provenance>), Refusal> {
    let p = split(envelope)?;
    if let Some(k) = &auth.mac {
        let Some(mac) = p.mac else {
            return Err(Refusal::MissingMac);
        };
        let expected = match p.version {
            V1 => mac_v1(k, key, p.sealed),
            _ => mac_v2(k, key, p.header, p.rest),
        };
        // blake3::Hash compares in constant time.
        if expected != blake3::Hash::from(mac) {
            return Err(Refusal::BadMac);
        }
    }
    let mut signer = None;
    if let Some((raw_key, sig)) = &p.signature {
        let bad = || Refusal::BadSignature(format!("ed25519:{}", super::key::hex(&raw_key[..8])));
        let public = PublicKey::from_bytes(raw_key).ok_or_else(bad)?;
        let fp = public.fingerprint();
        let message = signed_message(key, p.header, p.provenance, p.sealed);
        if !public.verify(&message, sig) {
            return Err(Refusal::BadSignature(fp));
        }
        if auth.requires_signature() && !auth.trusted.contains(&public) {
            return Err(Refusal::UntrustedSigner(fp));
        }
        signer = Some(fp);
    } else if auth.requires_signature() {
        return Err(Refusal::Unsigned);
    }
    let provenance = if p.version == V1 {
        None
    } else {
        let mut prov =
            Provenance::decode(p.provenance).ok_or(Refusal::Malformed("unreadable provenance"))?;
        prov.signer = signer;
        Some(prov)
    };
    if let Some(not_before) = auth.not_before {
        let built = provenance.as_ref().map(|p| p.built_unix);
        if built.is_none_or(|b| b < not_before) {
            return Err(Refusal::BeforeCutoff { built, not_before });
        }
    }
    if !p.compressed {
        return Ok((Cow::Borrowed(p.sealed), provenance));
    }
    match compress::decompress(p.sealed, auth.max_entry) {
        Ok(sealed) => Ok((Cow::Owned(sealed), provenance)),
        Err(Inflate::Damaged(what)) => Err(Refusal::Malformed(what)),
        Err(Inflate::Oversized { declared, limit }) => Err(Refusal::Oversized { declared, limit }),
    }
}

/// Authenticates `envelope` for `key` (`authenticate`) and verifies the entry inside
/// ([`StoreHit::unseal`]): the only way a shared store's bytes become a [`StoreHit`].
pub fn open(auth: &EntryAuth, key: &StoreKey, envelope: &[u8]) -> Result<StoreHit, Refusal> {
    open_with_provenance(auth, key, envelope).map(|(hit, _)| hit)
}

/// [`open`], also returning the entry's provenance (none for a version-1 envelope). Its `signer` is
/// the fingerprint of the key whose signature verified.
pub fn open_with_provenance(
    auth: &EntryAuth,
    key: &StoreKey,
    envelope: &[u8],
) -> Result<(StoreHit, Option<Provenance>), Refusal> {
    let (sealed, prov) = authenticate(auth, key, envelope)?;
    let hit = StoreHit::unseal(key, &sealed).map_err(Refusal::Entry)?;
    Ok((hit.with_provenance(prov.clone()), prov))
}

/// The key record of an envelope's entry, read without authentication (for listings and for finding
/// the key an imported entry claims, which [`open`] then checks). `None` if it does not parse.
pub(crate) fn claimed_record(envelope: &[u8]) -> Option<super::KeyRecord> {
    let p = split(envelope).ok()?;
    if !p.compressed {
        return super::sealed_record(p.sealed);
    }
    // Only the key record is decompressed (bounded by a key record's size), not the binary.
    let src = compress::decompress_record(p.sealed)?;
    super::sealed_record(&src)
}

/// The provenance an envelope claims, read without authentication (for the remote's collector,
/// which judges age, never trust). `None` for a version-1 envelope or one that does not parse.
#[cfg(all(feature = "remote", not(loom)))]
pub(crate) fn claimed_provenance(envelope: &[u8]) -> Option<Provenance> {
    let p = split(envelope).ok()?;
    if p.version == V1 {
        return None;
    }
    Provenance::decode(p.provenance)
}

/// Whether `envelope` holds its entry compressed (version 3 with the zstd flag); `None` if it is
/// not an envelope.
pub fn is_compressed(envelope: &[u8]) -> Option<bool> {
    split(envelope).ok().map(|p| p.compressed)
}

#[cfg(test)]
mod tests;
