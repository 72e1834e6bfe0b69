//! The 8 bytes each side sends first, before any frame and before TLS.
//!
//! Client: `"FERRY" | version u8 | transport u8 | 0`.
//! Server: `"FERRY" | version u8 | transport u8 | refusal u8`, where the transport echoes
//! the client's choice when accepted. A refusal tells the client, in plain bytes it can
//! always read, that it asked for plain TCP from a TLS-only server or vice versa, so the
//! mismatch becomes a clear one-line error instead of a garbled TLS alert.

/// The five magic bytes that open every ferry connection.
pub const MAGIC: [u8; 5] = *b"FERRY";
/// Preamble wire version (independent of the framed protocol version).
pub const PREAMBLE_VERSION: u8 = 1;
/// Length of a preamble in either direction.
pub const PREAMBLE_LEN: usize = 8;

/// What runs on the connection after the preamble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Frames travel in plain TCP.
    Plain,
    /// A TLS handshake follows; frames travel inside TLS.
    Tls,
}

impl Transport {
    fn to_byte(self) -> u8 {
        match self {
            Transport::Plain => 0,
            Transport::Tls => 1,
        }
    }
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Transport::Plain),
            1 => Some(Transport::Tls),
            _ => None,
        }
    }
}

/// Why a server refused the client's preamble.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The server only accepts TLS connections.
    TlsRequired,
    /// The server has no TLS certificate configured.
    TlsUnavailable,
    /// The client's preamble version is not spoken by this server.
    VersionUnsupported,
    /// The server has no room for another connection now (connections, or handshakes in
    /// progress, at their limit): retry later, with backoff.
    Busy,
}

impl Refusal {
    fn to_byte(self) -> u8 {
        match self {
            Refusal::TlsRequired => 1,
            Refusal::TlsUnavailable => 2,
            Refusal::VersionUnsupported => 3,
            Refusal::Busy => 4,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::TlsRequired => "the server requires TLS (add --tls-fingerprint SHA256:… or --ca FILE)",
            Refusal::TlsUnavailable => "the server does not offer TLS (drop --tls, or start ferryd with --tls-cert/--tls-key)",
            Refusal::VersionUnsupported => "the server does not speak this preamble version (upgrade ferry or ferryd)",
            Refusal::Busy => "the server is busy (its connections or handshakes in progress are at their limit): retry later",
        })
    }
}

/// Problems reading a peer's preamble.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreambleError {
    /// The first bytes were not `FERRY`: the peer is not a ferry endpoint (or speaks TLS
    /// where plain was expected).
    #[error("peer is not a ferry endpoint (first bytes {0:02x?})")]
    BadMagic([u8; 5]),
    /// An unknown transport byte.
    #[error("unknown transport 0x{0:02x} in preamble")]
    BadTransport(u8),
    /// The server refused the connection; the text says why and what to do.
    #[error("server refused the connection: {0}")]
    Refused(Refusal),
    /// The server accepted another transport than the one the client asked for.
    #[error("server answered with transport {answered:?}, asked for {asked:?}")]
    TransportMismatch {
        /// What the client asked for.
        asked: Transport,
        /// What the server's preamble says.
        answered: Transport,
    },
}

/// The client's preamble.
pub fn client_preamble(transport: Transport) -> [u8; PREAMBLE_LEN] {
    let mut out = [0u8; PREAMBLE_LEN];
    out[..5].copy_from_slice(&MAGIC);
    out[5] = PREAMBLE_VERSION;
    out[6] = transport.to_byte();
    out
}

/// The server's answer: acceptance of `transport`, or a refusal.
pub fn server_preamble(answer: Result<Transport, Refusal>) -> [u8; PREAMBLE_LEN] {
    let mut out = [0u8; PREAMBLE_LEN];
    out[..5].copy_from_slice(&MAGIC);
    out[5] = PREAMBLE_VERSION;
    match answer {
        Ok(t) => out[6] = t.to_byte(),
        Err(r) => {
            out[6] = 0xff;
            out[7] = r.to_byte();
        }
    }
    out
}

fn check_magic(bytes: &[u8; PREAMBLE_LEN]) -> Result<(), PreambleError> {
    if bytes[..5] != MAGIC {
        let mut m = [0u8; 5];
        m.copy_from_slice(&bytes[..5]);
        return Err(PreambleError::BadMagic(m));
    }
    Ok(())
}

/// Server side: parse the client's preamble. `Ok(Err(refusal))` means a well-formed
/// preamble this server must refuse (answer with [`server_preamble`]).
pub fn parse_client_preamble(
    bytes: &[u8; PREAMBLE_LEN],
) -> Result<Result<Transport, Refusal>, PreambleError> {
    check_magic(bytes)?;
    if bytes[5] != PREAMBLE_VERSION {
        return Ok(Err(Refusal::VersionUnsupported));
    }
    Transport::from_byte(bytes[6])
        .map(Ok)
        .ok_or(PreambleError::BadTransport(bytes[6]))
}

/// Client side: parse the server's answer to a preamble that asked for `asked`.
///
/// # Errors
/// Not a ferry preamble, a refusal, or acceptance of another transport than asked.
pub fn parse_server_preamble(
    bytes: &[u8; PREAMBLE_LEN],
    asked: Transport,
) -> Result<Transport, PreambleError> {
    check_magic(bytes)?;
    if bytes[6] == 0xff {
        let refusal = match bytes[7] {
            1 => Refusal::TlsRequired,
            2 => Refusal::TlsUnavailable,
            4 => Refusal::Busy,
            _ => Refusal::VersionUnsupported,
        };
        return Err(PreambleError::Refused(refusal));
    }
    let answered = Transport::from_byte(bytes[6]).ok_or(PreambleError::BadTransport(bytes[6]))?;
    if answered != asked {
        return Err(PreambleError::TransportMismatch { asked, answered });
    }
    Ok(answered)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for t in [Transport::Plain, Transport::Tls] {
            assert_eq!(parse_client_preamble(&client_preamble(t)), Ok(Ok(t)));
            assert_eq!(parse_server_preamble(&server_preamble(Ok(t)), t), Ok(t));
        }
        for r in [
            Refusal::TlsRequired,
            Refusal::TlsUnavailable,
            Refusal::VersionUnsupported,
            Refusal::Busy,
        ] {
            assert_eq!(
                parse_server_preamble(&server_preamble(Err(r)), Transport::Tls),
                Err(PreambleError::Refused(r))
            );
        }
        assert_eq!(
            parse_server_preamble(&server_preamble(Ok(Transport::Plain)), Transport::Tls),
            Err(PreambleError::TransportMismatch {
                asked: Transport::Tls,
                answered: Transport::Plain
            })
        );
    }

    #[test]
    fn tls_client_hello_is_bad_magic() {
        // A TLS ClientHello record starts 0x16 0x03 …: a plaintext server sees bad magic.
        let b = [0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01];
        assert!(matches!(
            parse_client_preamble(&b),
            Err(PreambleError::BadMagic(_))
        ));
    }
}
