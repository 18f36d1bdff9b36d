//! `KPC_CACHE_REMOTE_KEY`: the fleet's shared secret, parsed into the key kpc MACs shared entries with
//! (the MAC itself is the cache layer's: `cache::store::auth`).

use std::fmt;

use super::ConfigError;

/// Shortest secret accepted: 16 bytes, the strength of a 128-bit key written as text.
pub(crate) const MIN_SECRET_LEN: usize = 16;
const SECRET_ACCEPTED: &str = "a shared secret of at least 16 bytes, the same on every machine of the fleet (e.g. the output of `openssl rand -hex 32`); unset it for unauthenticated entries";
/// BLAKE3's key-derivation context: a secret used for kpc's MACs gives a key used for nothing else.
const KDF_CONTEXT: &str = "kpc 2026-11-25 shared cache entry MAC v1";

/// The fleet's MAC key, derived from the shared secret. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct MacKey {
    key: [u8; 32],
}

impl fmt::Debug for MacKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MacKey(<redacted>)")
    }
}

impl PartialEq for MacKey {
    fn eq(&self, other: &MacKey) -> bool {
        // Constant time, through blake3's Hash equality.
        blake3::Hash::from(self.key) == blake3::Hash::from(other.key)
    }
}

impl MacKey {
    /// The key for `secret`, as read from the variable `var`.
    ///
    /// Errors: a secret shorter than `MIN_SECRET_LEN` (16) bytes (or only whitespace) is
    /// [`ConfigError::Invalid`] naming `var`; the value in the error is redacted.
    pub fn from_secret(var: &'static str, secret: &str) -> Result<MacKey, ConfigError> {
        if secret.len() < MIN_SECRET_LEN || secret.trim().is_empty() {
            return Err(ConfigError::Invalid {
                var,
                value: format!("<{} bytes, redacted>", secret.len()),
                accepted: SECRET_ACCEPTED,
            });
        }
        Ok(MacKey {
            key: blake3::derive_key(KDF_CONTEXT, secret.as_bytes()),
        })
    }

    /// The derived 32-byte key, for the MAC itself (kpc's cache layer).
    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.key
    }
}
