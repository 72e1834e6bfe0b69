//! Token authentication and certificate fingerprints: pure functions, no I/O.
//!
//! **Token challenge-response** ([PROTOCOL.md §6.5]): both sides hold the same token (the
//! bytes of a token file, surrounding whitespace removed). Its key is
//! `BLAKE3-derive_key("ferry token v1", token)`. The server's Welcome carries a fresh random
//! 32-byte `challenge`; the client answers with a fresh random `client_nonce` and
//! `proof = BLAKE3-keyed(key, "client" ‖ challenge ‖ client_nonce)`; the server checks it and
//! answers with `server_proof = BLAKE3-keyed(key, "server" ‖ challenge ‖ client_nonce)`, which
//! the client checks. The token never travels, and a recorded exchange is useless against
//! another challenge.
//!
//! **Fingerprints**: `SHA256:` followed by the standard base64 (with padding) of the SHA-256
//! of a certificate's DER encoding — the form `ferryd gen-cert` prints and
//! `--tls-fingerprint` takes.

use base64::Engine;
use sha2::Digest;

const CONTEXT: &str = "ferry token v1";

/// The key both sides derive from a shared token.
pub fn token_key(token: &[u8]) -> [u8; 32] {
    blake3::derive_key(CONTEXT, token)
}

fn keyed(key: &[u8; 32], side: &[u8], challenge: &[u8; 32], nonce: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(side);
    h.update(challenge);
    h.update(nonce);
    *h.finalize().as_bytes()
}

/// The client's proof for `challenge` and its `client_nonce`.
pub fn client_proof(key: &[u8; 32], challenge: &[u8; 32], client_nonce: &[u8; 32]) -> [u8; 32] {
    keyed(key, b"client", challenge, client_nonce)
}

/// The server's proof, sent back once the client's proof checked out.
pub fn server_proof(key: &[u8; 32], challenge: &[u8; 32], client_nonce: &[u8; 32]) -> [u8; 32] {
    keyed(key, b"server", challenge, client_nonce)
}

/// Equality that takes the same time whatever the contents.
pub fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Fewest bytes a token may have (shorter ones are too easy to guess).
pub const MIN_TOKEN_LEN: usize = 16;

/// A token file whose contents cannot be a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Fewer than [`MIN_TOKEN_LEN`] bytes once whitespace is removed.
    #[error("the token is {len} bytes long: use at least 16 (e.g. `head -c 32 /dev/urandom | base64 > FILE`)")]
    TooShort {
        /// Its length.
        len: usize,
    },
}

/// A `--tls-fingerprint` value that is not `SHA256:<base64 of 32 bytes>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--tls-fingerprint {input}: expected SHA256:<base64 of 32 bytes>, as `ferryd gen-cert` prints"
)]
pub struct FingerprintError {
    /// The value given.
    pub input: String,
}

/// The token in a token file's contents: surrounding whitespace removed.
///
/// # Errors
/// Fewer than [`MIN_TOKEN_LEN`] bytes remain.
pub fn token_from_file_contents(contents: &[u8]) -> Result<Vec<u8>, TokenError> {
    let t = contents.trim_ascii();
    if t.len() < MIN_TOKEN_LEN {
        return Err(TokenError::TooShort { len: t.len() });
    }
    Ok(t.to_vec())
}

/// A shared token, kept only as its derived key ([`token_key`]); never printed.
#[derive(Clone)]
pub struct Token([u8; 32]);

impl Token {
    /// The token in a token file's contents (see [`token_from_file_contents`]).
    ///
    /// # Errors
    /// Too short.
    pub fn from_file_contents(contents: &[u8]) -> Result<Token, TokenError> {
        Ok(Token(token_key(&token_from_file_contents(contents)?)))
    }

    /// The derived key proofs are made with.
    pub fn key(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// `SHA256:<base64>` of a certificate's DER bytes.
pub fn fingerprint(der: &[u8]) -> String {
    format!(
        "SHA256:{}",
        base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(der))
    )
}

/// The SHA-256 in a `SHA256:<base64>` fingerprint.
///
/// # Errors
/// Anything else, with a one-line explanation.
pub fn parse_fingerprint(s: &str) -> Result<[u8; 32], FingerprintError> {
    let bad = || FingerprintError {
        input: s.to_string(),
    };
    let b64 = s.trim().strip_prefix("SHA256:").ok_or_else(bad)?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(b64))
        .map_err(|_| bad())?;
    raw.try_into().map_err(|_| bad())
}

/// SHA-256 of `der`.
pub fn sha256(der: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(der).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_depend_on_every_input() {
        let k = token_key(b"0123456789abcdef");
        let (c, n) = ([1u8; 32], [2u8; 32]);
        let p = client_proof(&k, &c, &n);
        assert!(same(&p, &client_proof(&k, &c, &n)));
        assert!(!same(
            &p,
            &client_proof(&token_key(b"0123456789abcdeX"), &c, &n)
        ));
        assert!(!same(&p, &client_proof(&k, &[3; 32], &n)));
        assert!(!same(&p, &client_proof(&k, &c, &[3; 32])));
        assert!(!same(&p, &server_proof(&k, &c, &n)));
    }

    #[test]
    fn fingerprints_round_trip_and_bad_ones_are_explained() {
        let f = fingerprint(b"certificate");
        assert!(f.starts_with("SHA256:"));
        assert_eq!(parse_fingerprint(&f).unwrap(), sha256(b"certificate"));
        assert!(parse_fingerprint("SHA1:abc")
            .unwrap_err()
            .to_string()
            .contains("expected SHA256:"));
        assert!(parse_fingerprint("SHA256:AAAA").is_err());
    }

    #[test]
    fn short_tokens_are_refused() {
        assert!(token_from_file_contents(b"  short \n").is_err());
        assert_eq!(
            token_from_file_contents(b" 0123456789abcdef\n").unwrap(),
            b"0123456789abcdef"
        );
    }
}
