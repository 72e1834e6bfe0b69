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
    // What follows the preamble goes in the same segment, without waiting for the
    // server's (PROTOCOL.md §3): on plain TCP the Hello, with TLS its ClientHello. The
    // server reads exactly the 8 bytes of the preamble first, and a round trip is saved on
    // every connection.
    let mut first = preamble::client_preamble(asked).to_vec();
    if asked == Transport::Plain {
        if let Some(hello) = machine.take_output() {
            first.extend_from_slice(&hello);
        }
    }
    stream.write_all(&first).await.map_err(io_err)?;
    let preamble_err = |e: io::Error| match preamble_failure(&e) {
        Some(source) => ClientError::Preamble {
            addr: addr.clone(),
            source,
        },
        None => ClientError::PreambleClosed {
            addr: addr.clone(),
            source: Arc::new(e),
        },
    };
    let tls_err = |source: TlsError| ClientError::Tls {
        addr: addr.clone(),
        source,
    };
    let (mut rd, mut wr): Halves = match &cfg.tls {
        None => {
            let mut pre = [0u8; PREAMBLE_LEN];
            stream.read_exact(&mut pre).await.map_err(preamble_err)?;
            preamble::parse_server_preamble(&pre, asked).map_err(|source| {
                ClientError::Preamble {
                    addr: addr.clone(),
                    source,
                }
            })?;
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        }
        Some(tls) => {
            let name = tls::server_name(addr).map_err(tls_err)?;
            // The TLS handshake starts at once; the server's preamble is read (and checked)
            // in front of its first TLS bytes.
            let s = tokio_rustls::TlsConnector::from(tls.config.clone())
                .connect(name, PreambleFirst::new(stream, asked))
                .await
                .map_err(|e| {
                    if e.get_ref().is_some_and(|x| x.is::<PreambleFailed>()) {
                        preamble_err(e)
                    } else {
                        tls_err(TlsError::Handshake(Arc::new(e)))
                    }
                })?;
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

/// The server's preamble was no acceptance (a refusal or malformed), or (`None`) the
/// server closed before its 8 bytes ([`PreambleFirst`]).
#[derive(Debug, thiserror::Error)]
struct PreambleFailed(Option<preamble::PreambleError>);

impl std::fmt::Display for PreambleFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(e) => e.fmt(f),
            None => f.write_str("closed before its preamble"),
        }
    }
}

/// The refusal or malformed preamble an I/O error carries, if it is one.
fn preamble_failure(e: &io::Error) -> Option<preamble::PreambleError> {
    e.get_ref()
        .and_then(|x| x.downcast_ref::<PreambleFailed>())
        .and_then(|p| p.0.clone())
}

/// A connection whose first 8 bytes read are the server's preamble, taken and checked
/// before anything is handed on: the TLS handshake starts without waiting for it. A refusal
/// or a malformed preamble, or the server closing before its 8 bytes, is an error carrying
/// [`PreambleFailed`].
struct PreambleFirst<S> {
    inner: S,
    asked: Transport,
    pre: [u8; PREAMBLE_LEN],
    got: usize,
}

impl<S> PreambleFirst<S> {
    fn new(inner: S, asked: Transport) -> Self {
        PreambleFirst {
            inner,
            asked,
            pre: [0; PREAMBLE_LEN],
            got: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PreambleFirst<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        use std::task::Poll;
        let me = self.get_mut();
        while me.got < PREAMBLE_LEN {
            let mut rest = tokio::io::ReadBuf::new(&mut me.pre[me.got..]);
            match std::pin::Pin::new(&mut me.inner).poll_read(cx, &mut rest) {
                Poll::Ready(Ok(())) if rest.filled().is_empty() => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        PreambleFailed(None),
                    )));
                }
                Poll::Ready(Ok(())) => me.got += rest.filled().len(),
                other => return other,
            }
            if me.got == PREAMBLE_LEN {
                if let Err(e) = preamble::parse_server_preamble(&me.pre, me.asked) {
                    return Poll::Ready(Err(io::Error::other(PreambleFailed(Some(e)))));
                }
            }
        }
        std::pin::Pin::new(&mut me.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PreambleFirst<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may panic on setup failures

    use super::*;

    /// Bytes the fake server waits for before it answers: the preamble and the first 5
    /// bytes behind it (a frame's length and type, or a TLS record's header).
    const FIRST: usize = PREAMBLE_LEN + 5;

    /// A server that says nothing until it has read [`FIRST`] bytes (within 10 s: what
    /// follows the preamble must come unasked), then refuses with `refusal`, shuts down and
    /// reads on until the client closes (as ferryd does, so the close is not a reset). Its
    /// address, and the bytes it waited for.
    async fn refusing_after_first(refusal: Refusal) -> (String, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut got = vec![0u8; FIRST];
            tokio::time::timeout(std::time::Duration::from_secs(10), tcp.read_exact(&mut got))
                .await
                .expect("what follows the preamble came unasked")
                .unwrap();
            tcp.write_all(&preamble::server_preamble(Err(refusal)))
                .await
                .unwrap();
            tcp.shutdown().await.unwrap();
            let _ = tcp.read_to_end(&mut Vec::new()).await;
            got
        });
        (addr, server)
    }

    /// On plain TCP the Hello comes behind the preamble before the server said anything (a
    /// round trip saved per connection), and a refusal sent after it is still read as such.
    #[tokio::test]
    async fn a_plain_client_sends_its_hello_behind_its_preamble_and_reads_a_refusal() {
        let (addr, server) = refusing_after_first(Refusal::TlsRequired).await;
        let cfg = ClientConfig {
            addr,
            ..Default::default()
        };
        let e = open_stream_once(&cfg).await.err().unwrap();
        let got = server.await.unwrap();
        assert_eq!(&got[..5], b"FERRY");
        assert_eq!(got[6], 0, "plain transport");
        // A frame's 4-byte length, then its type: Hello.
        assert_eq!(got[PREAMBLE_LEN + 4], 0x01, "a Hello frame: {got:?}");
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

    /// With TLS the ClientHello comes behind the preamble before the server said anything,
    /// and the server's preamble, read in front of its TLS bytes, still decides: a refusal
    /// is reported as one, not as a TLS failure.
    #[tokio::test]
    async fn a_tls_client_starts_its_handshake_behind_its_preamble_and_reads_a_refusal() {
        let (addr, server) = refusing_after_first(Refusal::TlsUnavailable).await;
        let tls = crate::tls::TlsClient::new(&crate::tls::TlsOptions {
            ca: None,
            fingerprint: Some([7; 32]),
            cert: None,
            key: None,
        })
        .unwrap();
        let cfg = ClientConfig {
            addr,
            tls: Some(tls),
            ..Default::default()
        };
        let e = open_stream_once(&cfg).await.err().unwrap();
        let got = server.await.unwrap();
        assert_eq!(&got[..5], b"FERRY");
        assert_eq!(got[6], 1, "TLS transport");
        // A TLS record of the handshake type (the ClientHello), version 3.x.
        assert_eq!(&got[PREAMBLE_LEN..PREAMBLE_LEN + 2], &[0x16, 0x03]);
        assert!(
            matches!(
                e,
                ClientError::Preamble {
                    source: preamble::PreambleError::Refused(Refusal::TlsUnavailable),
                    ..
                }
            ),
            "{e}"
        );
    }
}
