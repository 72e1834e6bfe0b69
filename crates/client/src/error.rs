//! Client errors: [`ClientError`], everything that can go wrong talking to a server.
//!
//! Errors are `Clone` (a single-flight fetch hands one failure to every waiter), so the
//! I/O errors they keep as sources are shared behind an `Arc`. Each message is one line
//! that already includes its source's text: callers print it with `{}`.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_proto::name::NameError;
use ferry_proto::preamble::PreambleError;
use ferry_proto::{DecodeError, HandshakeError, PayloadError, Status, Version};

use crate::tls::TlsError;

/// Everything that can go wrong talking to a server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// TCP connect failed (refused, unreachable, bad address).
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// Address tried.
        addr: String,
        /// The operating system's reason.
        #[source]
        source: Arc<io::Error>,
    },
    /// The server did not answer in time.
    #[error("timed out after {0:?} waiting for the server")]
    Timeout(Duration),
    /// The server's preamble was not what ferry expects, or it refused ours.
    #[error("handshake with {addr} failed: {source}")]
    Preamble {
        /// Address.
        addr: String,
        /// What was wrong.
        #[source]
        source: PreambleError,
    },
    /// The server closed the connection (or it failed) before its preamble arrived.
    #[error("handshake with {addr} failed: the server closed the connection during the preamble ({source}); is it a ferryd?")]
    PreambleClosed {
        /// Address.
        addr: String,
        /// The read's error.
        #[source]
        source: Arc<io::Error>,
    },
    /// TLS could not be set up with the server.
    #[error("handshake with {addr} failed: {source}")]
    Tls {
        /// Address.
        addr: String,
        /// Why, explained.
        #[source]
        source: TlsError,
    },
    /// The Hello/Welcome exchange or the token proofs failed.
    #[error("handshake with {addr} failed: {source}")]
    Handshake {
        /// Address.
        addr: String,
        /// Why.
        #[source]
        source: HandshakeError,
    },
    /// Sending or receiving failed during the preamble or the handshake.
    #[error("handshake with {addr} failed: {source}")]
    HandshakeIo {
        /// Address.
        addr: String,
        /// The socket's error.
        #[source]
        source: Arc<io::Error>,
    },
    /// No random numbers for the token proof's nonce.
    #[error("handshake with {addr} failed: no random numbers for the token proof")]
    NoRandom {
        /// Address.
        addr: String,
    },
    /// The server sent something that breaks the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A response frame did not decode.
    #[error("protocol error: undecodable response: {0}")]
    Decode(#[source] DecodeError),
    /// The server sent a directory entry name no file can have (`..`, containing `/`...).
    #[error("protocol error: server sent entry name: {0}")]
    BadEntryName(#[source] NameError),
    /// No stream could reach the server for the whole request timeout.
    #[error("cannot reach {}{addr}: no connection for {} s (still trying to reconnect)", if addr.starts_with("s3://") { "" } else { "ferryd at " }, waited.as_secs())]
    Unreachable {
        /// Address.
        addr: String,
        /// How long the request waited.
        waited: Duration,
    },
    /// An S3 source cannot be used (no gateway answers, no such bucket, access denied, …).
    #[error("{0}")]
    S3(String),
    /// The connection carrying the request closed before the answer arrived.
    #[error("connection to the server was lost")]
    ConnectionLost,
    /// The server answered with an error status.
    #[error("server: {status}: {message}")]
    Remote {
        /// Status code.
        status: Status,
        /// Server's detail.
        message: String,
    },
    /// A read payload failed to decode or its checksum did not match.
    #[error("corrupt payload: {0}")]
    Payload(#[from] PayloadError),
    /// A name or path cannot be sent (e.g. `..` or containing NUL).
    #[error("invalid name: {0}")]
    InvalidName(#[from] NameError),
    /// The file changed on the server: a read for one version was answered from another
    /// ([`crate::ChunkStore`]), with what the server sent.
    #[error("the file changed on the server while read (now inode {}, {} bytes)", .0.version.ino, .0.version.size)]
    Changed(Box<ChangedRead>),
}

impl ClientError {
    /// The server status, when the error is one.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientError::Remote { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Whether trying the same request again may succeed: a corrupt payload, a lost
    /// connection, a timeout, or a busy server.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Payload(_) | ClientError::ConnectionLost | ClientError::Timeout(_) => true,
            ClientError::Remote { status, .. } => *status == Status::Busy,
            // Setting up a connection failed: the pool already retries reconnects itself,
            // and a request only sees these from `Client::connect`.
            ClientError::Connect { .. }
            | ClientError::Preamble { .. }
            | ClientError::PreambleClosed { .. }
            | ClientError::Tls { .. }
            | ClientError::Handshake { .. }
            | ClientError::HandshakeIo { .. }
            | ClientError::NoRandom { .. } => false,
            // The server broke the protocol: asking again gets the same answer.
            ClientError::Protocol(_) | ClientError::Decode(_) | ClientError::BadEntryName(_) => {
                false
            }
            // Already waited the whole request timeout for a connection.
            ClientError::Unreachable { .. } | ClientError::S3(_) => false,
            ClientError::InvalidName(_) => false,
            ClientError::Changed(_) => false,
        }
    }
}

/// A read of one version of a file answered from another ([`ClientError::Changed`]).
#[derive(Debug, Clone)]
pub struct ChangedRead {
    /// The version the server read from.
    pub version: Version,
    /// The bytes it sent: all of that version, what the file holds now at that offset
    /// (shorter than asked when it shrank). The caller decides whether a reader may have
    /// them.
    pub data: Bytes,
}
