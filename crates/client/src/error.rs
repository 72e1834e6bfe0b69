//! Client errors.

use ferry_proto::{PayloadError, Status};

/// Everything that can go wrong talking to a server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// TCP connect failed (refused, unreachable, bad address).
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// Address tried.
        addr: String,
        /// OS reason.
        reason: String,
    },
    /// The server did not answer in time.
    #[error("timed out after {0:?} waiting for the server")]
    Timeout(std::time::Duration),
    /// The peer's preamble or handshake was not what ferry expects, or it refused us.
    #[error("handshake with {addr} failed: {reason}")]
    Handshake {
        /// Address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The server sent something that breaks the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// No stream could reach the server for the whole request timeout.
    #[error("cannot reach ferryd at {addr}: no connection for {} s (still trying to reconnect)", waited.as_secs())]
    Unreachable {
        /// Address.
        addr: String,
        /// How long the request waited.
        waited: std::time::Duration,
    },
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
    InvalidName(#[from] ferry_proto::name::NameError),
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
            _ => false,
        }
    }
}
