//! Writer signatures' keys: `KPC_CACHE_SIGNING_KEY` (a private key file: this process signs what it
//! publishes to the remote or exports to a bundle) and `KPC_CACHE_TRUSTED_KEYS` (public keys: readers
//! refuse shared entries no trusted key signed). Ed25519, through `ed25519-dalek`. The signature itself
//! is the cache layer's (`cache::store::auth`).
//!
//! File formats (text, written by `kpc cache keygen FILE`):
//! - private key file: one line `kpc-ed25519-private:<64 hex digits>` (the 32-byte seed), mode 0600;
//!   a file that group or others may read is refused, as ssh refuses one;
//! - public key: `ed25519:<64 hex digits>`, optionally followed by a space and a comment (FILE.pub
//!   holds one such line; a file of trusted keys may hold several, `#` starts a comment line).

use std::fmt;
use std::io::{self, Write};
use std::path::Path;

use ed25519_dalek::Signer;

use super::ConfigError;

const PRIVATE_PREFIX: &str = "kpc-ed25519-private:";
const PUBLIC_PREFIX: &str = "ed25519:";
/// What `KPC_CACHE_SIGNING_KEY` accepts.
pub const SIGNING_ACCEPTED: &str = "the path of a private key file written by `kpc cache keygen FILE` (one line `kpc-ed25519-private:<64 hex digits>`, mode 0600, readable by its owner only); unset it to publish unsigned entries";
/// What `KPC_CACHE_TRUSTED_KEYS` accepts.
pub const TRUSTED_ACCEPTED: &str = "a comma-separated list whose elements are public keys `ed25519:<64 hex digits>` (as in FILE.pub from `kpc cache keygen FILE`) or paths of files holding such keys, one per line (`#` comments allowed); unset it to accept unsigned entries";

fn key_error(
    var: &'static str,
    value: &str,
    problem: String,
    accepted: &'static str,
) -> ConfigError {
    ConfigError::InvalidKey {
        var,
        value: value.to_owned(),
        problem,
        accepted,
    }
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An Ed25519 public key: what a reader trusts and a signed entry names as its signer.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(ed25519_dalek::VerifyingKey);

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.fingerprint())
    }
}

impl fmt::Display for PublicKey {
    /// The key as a public key file holds it: `ed25519:<64 hex digits>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PUBLIC_PREFIX}{}", hex(self.0.as_bytes()))
    }
}

impl PublicKey {
    /// Parses `ed25519:<64 hex digits>` (a trailing comment after whitespace is ignored); `None` if it
    /// is not one, or not a valid curve point.
    pub fn parse(text: &str) -> Option<PublicKey> {
        let first = text.split_whitespace().next()?;
        let raw = unhex32(first.strip_prefix(PUBLIC_PREFIX)?)?;
        ed25519_dalek::VerifyingKey::from_bytes(&raw)
            .ok()
            .map(PublicKey)
    }

    /// The key from its 32 raw bytes, as a signed entry carries it; `None` if not a curve point.
    pub(crate) fn from_bytes(raw: &[u8; 32]) -> Option<PublicKey> {
        ed25519_dalek::VerifyingKey::from_bytes(raw)
            .ok()
            .map(PublicKey)
    }

    /// The 32 raw bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// A short, stable name for the key: `ed25519:` and 16 hex digits of BLAKE3 over it. What
    /// provenance and listings show as the signer.
    pub fn fingerprint(&self) -> String {
        let h = blake3::hash(self.0.as_bytes());
        format!("{PUBLIC_PREFIX}{}", &h.to_hex()[..16])
    }

    /// Whether `signature` is this key's over `message` (strict verification: no malleable
    /// signatures, no small-order keys).
    pub(crate) fn verify(&self, message: &[u8], signature: &[u8; 64]) -> bool {
        let sig = ed25519_dalek::Signature::from_bytes(signature);
        self.0.verify_strict(message, &sig).is_ok()
    }
}

/// An Ed25519 private key (`KPC_CACHE_SIGNING_KEY`). Its `Debug` shows only the public key's
/// fingerprint.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey(ed25519_dalek::SigningKey);

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SigningKey(<redacted>, public {})",
            self.public_key().fingerprint()
        )
    }
}

impl SigningKey {
    /// The key whose 32-byte seed is `seed` (from a good random source: `kpc cache keygen` uses the
    /// operating system's).
    pub fn from_seed(seed: &[u8; 32]) -> SigningKey {
        SigningKey(ed25519_dalek::SigningKey::from_bytes(seed))
    }

    /// Reads a private key file, as named by the variable `var`.
    ///
    /// Errors: [`ConfigError::InvalidKey`] naming `var` and the path: the file cannot be read, group or
    /// others may read it, or it does not hold one `kpc-ed25519-private:` line.
    pub fn from_file(var: &'static str, path: &Path) -> Result<SigningKey, ConfigError> {
        let shown = path.display().to_string();
        let err = |problem: String| key_error(var, &shown, problem, SIGNING_ACCEPTED);
        let meta = std::fs::metadata(path).map_err(|e| err(format!("it cannot be read ({e})")))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(err(format!(
                    "group or others may access the private key file (mode {mode:04o}); `chmod 600 {shown}`"
                )));
            }
        }
        if !meta.is_file() || meta.len() > 4096 {
            return Err(err("it is not a small regular file".into()));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| err(format!("it cannot be read ({e})")))?;
        let line = text.trim();
        let seed = line
            .strip_prefix(PRIVATE_PREFIX)
            .and_then(unhex32)
            .ok_or_else(|| {
                if line.starts_with(PUBLIC_PREFIX) {
                    err("it holds a public key, not a private one".into())
                } else {
                    err("it does not hold a kpc Ed25519 private key".into())
                }
            })?;
        Ok(SigningKey::from_seed(&seed))
    }

    /// The public key that verifies this key's signatures.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// Ed25519 signature over `message`.
    pub(crate) fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.0.sign(message).to_bytes()
    }

    /// Writes a new key pair for `seed`: the private key to `path` (created with mode 0600; an
    /// existing file is not overwritten) and the public key to `path.pub` (with `comment`). Returns
    /// the public key.
    ///
    /// Errors: either file exists already or cannot be written.
    pub fn write_pair(seed: &[u8; 32], path: &Path, comment: &str) -> io::Result<PublicKey> {
        let key = SigningKey::from_seed(seed);
        let mut pub_path = path.as_os_str().to_owned();
        pub_path.push(".pub");
        let pub_path = std::path::PathBuf::from(pub_path);
        if pub_path.exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists already", pub_path.display()),
            ));
        }
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts
            .open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        writeln!(f, "{PRIVATE_PREFIX}{}", hex(&key.0.to_bytes()))?;
        f.sync_all()?;
        let public = key.public_key();
        let comment = comment.replace(['\n', '\r'], " ");
        std::fs::write(&pub_path, format!("{public} {comment}\n"))?;
        Ok(public)
    }
}

/// Parses `KPC_CACHE_TRUSTED_KEYS` (`ed25519:<hex>` keys or files of them) as read from `var`:
/// every key, in order, duplicates removed.
///
/// Errors: [`ConfigError::InvalidKey`] naming `var` and the element at fault: an empty element, a
/// malformed inline key, a file that cannot be read or holds a line that is not a public key (or a
/// private key), or no key at all.
pub fn parse_trusted_keys(var: &'static str, value: &str) -> Result<Vec<PublicKey>, ConfigError> {
    let err = |problem: String| key_error(var, value, problem, TRUSTED_ACCEPTED);
    let mut keys: Vec<PublicKey> = Vec::new();
    for (i, element) in value.split(',').map(str::trim).enumerate() {
        let n = i + 1;
        if element.is_empty() {
            return Err(err(format!("element {n} is empty")));
        }
        if element.starts_with(PUBLIC_PREFIX) {
            let k = PublicKey::parse(element).ok_or_else(|| {
                err(format!(
                    "element {n} ({element:?}) is not an Ed25519 public key (64 hex digits of a valid point)"
                ))
            })?;
            keys.push(k);
            continue;
        }
        let text = std::fs::read_to_string(element).map_err(|e| {
            err(format!(
                "element {n}: the file {element:?} cannot be read ({e})"
            ))
        })?;
        let before = keys.len();
        for (l, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.starts_with(PRIVATE_PREFIX) {
                return Err(err(format!(
                    "element {n}: the file {element:?} holds a private key; give readers the .pub file"
                )));
            }
            let k = PublicKey::parse(line).ok_or_else(|| {
                err(format!(
                    "element {n}: line {} of the file {element:?} is not an Ed25519 public key",
                    l + 1
                ))
            })?;
            keys.push(k);
        }
        if keys.len() == before {
            return Err(err(format!(
                "element {n}: the file {element:?} holds no public key"
            )));
        }
    }
    let mut seen = std::collections::HashSet::new();
    keys.retain(|k| seen.insert(*k));
    Ok(keys)
}

/// Checks a host id (`KPC_HOST_ID`): 1 to 255 bytes, no control characters.
pub(crate) fn valid_host_id(id: &str) -> bool {
    !id.trim().is_empty() && id.len() <= 255 && !id.chars().any(char::is_control)
}

/// This machine's host name (Linux: /proc/sys/kernel/hostname, else /etc/hostname), or "unknown".
pub fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_owned())
        .find(|s| valid_host_id(s))
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
#[path = "signing_tests.rs"]
mod tests;
