//! Opening one stream: TCP, the preamble, TLS if configured, then the handshake.
//!
//! The preamble and TLS are done here on the socket; the Hello/Welcome exchange and the
//! token proofs are [`ferry_proto::handshake::ClientHandshake`]'s, which this only drives:
//! it writes what the machine gives it, feeds it what the server sends, and tells it when
//! the server closes. What the machine refuses (unusable parameters, a missing or
//! unproven token) is decided there, once, for every client.
//!
//! The caller bounds the whole of it with the connect timeout. Bytes the server sent past
//! the handshake are kept ([`Opened::leftover`]) for the connection's reader.

use std::io;
use std::sync::Arc;

use bytes::BytesMut;
use ferry_proto::handshake::{ClientAuth, ClientHandshake, ClientParams};
use ferry_proto::preamble::{self, Refusal, Transport, PREAMBLE_LEN};
use ferry_proto::{features, Compression, Welcome};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::ClientConfig;
use crate::error::ClientError;
use crate::tls::{self, TlsError};
use crate::CompressionChoice;

/// The two halves of a connection, plain or TLS.
pub(super) type Halves = (
    Box<dyn AsyncRead + Send + Unpin>,
    Box<dyn AsyncWrite + Send + Unpin>,
);

/// A stream past its handshake.
pub(super) struct Opened {
    pub(super) halves: Halves,
    /// The session's parameters, checked by the handshake machine.
    pub(super) welcome: Welcome,
    /// Bytes received past the handshake.
    pub(super) leftover: BytesMut,
}

/// Connects to `cfg.addr` and completes the preamble, TLS and the handshake. A server that
/// answers `Busy` (no room for another connection now) is asked again with backoff (50 ms,
/// doubling to 2 s) for as long as the connect timeout leaves time.
///
/// # Errors
/// Each step's failure as its own [`ClientError`] variant; the `Busy` refusal when the
/// server stayed busy.
pub(super) async fn open_stream(cfg: &ClientConfig) -> Result<Opened, ClientError> {
    let give_up = tokio::time::Instant::now() + cfg.connect_timeout.mul_f64(0.9);
    let mut wait = std::time::Duration::from_millis(50);
    loop {
        match open_stream_once(cfg).await {
            Err(ClientError::Preamble {
                source: ferry_proto::preamble::PreambleError::Refused(Refusal::Busy),
                ..
            }) if tokio::time::Instant::now() + wait < give_up => {
                tracing::debug!("{}: server busy, asking again in {wait:?}", cfg.addr);
                // Jittered, so clients refused together do not come back together.
                let jitter = u64::from(std::process::id() ^ wait.subsec_nanos()) % 50;
                tokio::time::sleep(wait + std::time::Duration::from_millis(jitter)).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(2));
            }
            r => return r,
        }
    }
}

async fn open_stream_once(cfg: &ClientConfig) -> Result<Opened, ClientError> {
    let addr = &cfg.addr;
    let io_err = |e: io::Error| ClientError::HandshakeIo {
        addr: addr.clone(),
        source: Arc::new(e),
    };
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| ClientError::Connect {
            addr: addr.clone(),
            source: Arc::new(e),
        })?;
    stream.set_nodelay(true).ok();
    let asked = if cfg.tls.is_some() {
        Transport::Tls
    } else {
        Transport::Plain
    };
    let auth = match &cfg.token {
        Some(token) => {
            let mut client_nonce = [0u8; 32];
            rustls::crypto::ring::default_provider()
                .secure_random
                .fill(&mut client_nonce)
                .map_err(|_| ClientError::NoRandom { addr: addr.clone() })?;
            Some(ClientAuth {
                token: token.clone(),
                client_nonce,
            })
        }
        None => None,
    };
    let mut machine = ClientHandshake::new(ClientParams {
        chunk_size: cfg.chunk_size,
        // Asked for no compression: the server is not offered any (an older one then
        // never compresses either).
        features: if cfg.compression == CompressionChoice::Fixed(Compression::None) {
            features::ALL & !features::LZ4 & !features::ZSTD
        } else {
            features::ALL
        },
        client_name: cfg.client_name.clone(),
        auth,
    });
    // On plain TCP the Hello goes right behind the preamble, in the same segment: the
    // server reads exactly its 8 bytes first (PROTOCOL.md §3), and a round trip is saved
    // on every connection. With TLS the handshake has to wait for the server's preamble.
    let mut first = preamble::client_preamble(asked).to_vec();
    if asked == Transport::Plain {
        if let Some(hello) = machine.take_output() {
            first.extend_from_slice(&hello);
        }
    }
    stream.write_all(&first).await.map_err(io_err)?;
    let mut pre = [0u8; PREAMBLE_LEN];
    stream
        .read_exact(&mut pre)
        .await
        .map_err(|e| ClientError::PreambleClosed {
            addr: addr.clone(),
            source: Arc::new(e),
        })?;
    preamble::parse_server_preamble(&pre, asked).map_err(|source| ClientError::Preamble {
        addr: addr.clone(),
        source,
    })?;
    let tls_err = |source: TlsError| ClientError::Tls {
        addr: addr.clone(),
        source,
    };
    let (mut rd, mut wr): Halves = match &cfg.tls {
        None => {
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        }
        Some(tls) => {
            let name = tls::server_name(addr).map_err(tls_err)?;
            let s = tokio_rustls::TlsConnector::from(tls.config.clone())
                .connect(name, stream)
                .await
                .map_err(|e| tls_err(TlsError::Handshake(Arc::new(e))))?;
            let (r, w) = tokio::io::split(s);
            (Box::new(r), Box::new(w))
        }
    };

    let mut buf = BytesMut::with_capacity(4096);
    loop {
        if let Some(out) = machine.take_output() {
            wr.write_all(&out).await.map_err(io_err)?;
            wr.flush().await.map_err(io_err)?;
        }
        buf.clear();
        let n = rd.read_buf(&mut buf).await.map_err(|e| {
            // TLS 1.3 reports a refused client certificate only now, as an alert.
            if e.get_ref().is_some_and(|x| x.is::<rustls::Error>()) {
                tls_err(TlsError::Handshake(Arc::new(e)))
            } else {
                io_err(e)
            }
        })?;
        let step = if n == 0 {
            Err(machine.closed())
        } else {
            machine.receive(&buf)
        };
        match step {
            Ok(None) => {}
            Ok(Some(done)) => {
                return Ok(Opened {
                    halves: (rd, wr),
                    welcome: done.welcome,
                    leftover: done.leftover,
                })
            }
            Err(source) => {
                return Err(ClientError::Handshake {
                    addr: addr.clone(),
                    source,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may panic on setup failures

    use super::*;

    /// On plain TCP the Hello comes behind the preamble before the server said anything (a
    /// round trip saved per connection), and a refusal sent after it is still read as such.
    #[tokio::test]
    async fn a_plain_client_sends_its_hello_behind_its_preamble_and_reads_a_refusal() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            // The preamble (8 bytes) and a whole Hello frame (a 4-byte length, then the
            // frame), all before this side sends a byte.
            let hello = async {
                let mut got = vec![0u8; PREAMBLE_LEN + 4];
                tcp.read_exact(&mut got).await.unwrap();
                let len = u32::from_be_bytes(got[PREAMBLE_LEN..].try_into().unwrap()) as usize;
                let mut frame = vec![0u8; len];
                tcp.read_exact(&mut frame).await.unwrap();
                (got, frame)
            };
            let (got, frame) = tokio::time::timeout(std::time::Duration::from_secs(10), hello)
                .await
                .expect("the Hello came behind the preamble, unasked");
            tcp.write_all(&preamble::server_preamble(Err(Refusal::TlsRequired)))
                .await
                .unwrap();
            tcp.shutdown().await.unwrap();
            (got, frame)
        });
        let cfg = ClientConfig {
            addr,
            ..Default::default()
        };
        let e = open_stream_once(&cfg).await.err().unwrap();
        let (got, frame) = server.await.unwrap();
        assert_eq!(&got[..5], b"FERRY");
        assert_eq!(got[6], 0, "plain transport");
        assert_eq!(frame[0], 0x01, "a Hello frame: {frame:?}");
        assert!(
            matches!(
                e,
                ClientError::Preamble {
                    source: preamble::PreambleError::Refused(Refusal::TlsRequired),
                    ..
                }
            ),
            "{e}"
        );
    }
}
