//! The handshake as two sans-IO state machines: [`ClientHandshake`] and [`ServerHandshake`].
//!
//! Each machine takes the peer's bytes in ([`receive`](ClientHandshake::receive), in pieces of
//! any size), hands out the bytes to send ([`take_output`](ClientHandshake::take_output)), and
//! ends with the session's parameters or a [`HandshakeError`]. They own no socket, no clock and
//! no source of randomness: the driver reads and writes, enforces the time limit, and passes in
//! the server's challenge and the client's nonce.
//!
//! The exchange, after the [`crate::preamble`] and the TLS handshake if one was chosen (both
//! stay outside the machines: TLS starts between them and the Hello):
//!
//! ```text
//! client                                 server
//!   Hello ─────────────────────────────►   checks version and chunk size, negotiates
//!         ◄───────────────────────────── Welcome (or Failed, then closes)
//!   checks the parameters and the auth
//!   method against its own token
//!   [AuthProof] ───────────────────────►   checks the proof (constant time)
//!         ◄───────────────────────────── [AuthOk, proving the server holds the token
//!                                          too — or Failed, then closes]
//!   checks the server's proof
//! ```
//!
//! Every handshake frame is bounded by [`HANDSHAKE_MAX_FRAME`] (the session's `max_frame`
//! applies only after the handshake). A client may pipeline requests behind its last
//! handshake message: bytes past the handshake come back as the `leftover` of
//! [`Established`] / [`Accepted`], to be read as requests or responses.
//!
//! Invariants: after a machine has returned its outcome or an error it is finished, and
//! further input is refused ([`HandshakeError::Finished`]); when it fails, the bytes still to
//! be sent (a Failed frame telling the peer why) are in `take_output`, and a driver sends
//! them before closing. No input makes a machine panic or buffer more than one handshake
//! frame plus what one `receive` call hands it.

mod client;
mod server;

use bytes::BytesMut;

pub use client::{ClientAuth, ClientHandshake, ClientParams, Established};
pub use server::{Accepted, ServerAuth, ServerHandshake, ServerParams};

use crate::codec::DecodeError;
use crate::frame::{Frame, FrameError};
use crate::message::{Handshake, Welcome};
use crate::status::Status;
use crate::{
    HANDSHAKE_MAX_FRAME, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

/// Why a handshake failed. Each message is one line for the user (client side) or the log
/// (server side).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// A handshake frame's length field is invalid (too short, or over
    /// [`HANDSHAKE_MAX_FRAME`]).
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A handshake frame's body did not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// A well-formed message that is not the one this step expects (client side).
    #[error("unexpected handshake message {0:?}")]
    UnexpectedMessage(Box<Handshake>),
    /// A well-formed message that is not the one this step expects (server side).
    #[error("expected {expected}, got {got:?}")]
    Expected {
        /// The message the server waited for.
        expected: &'static str,
        /// What came instead.
        got: Box<Handshake>,
    },
    /// The server refused the client with a Failed message.
    #[error("{status}: {message}")]
    Refused {
        /// Why, as a status.
        status: Status,
        /// The server's explanation.
        message: String,
    },
    /// The Welcome's parameters are out of range: a chunk size outside
    /// [`MIN_CHUNK_SIZE`]`..=`[`MAX_CHUNK_SIZE`], a `max_frame` too small for a chunk or
    /// larger than any chunk needs, or no requests allowed in flight.
    #[error("unusable session parameters {0:?}")]
    UnusableWelcome(Box<Welcome>),
    /// The client holds a token but the server did not ask for one, so it cannot prove it
    /// holds it: whoever answered is not trusted.
    #[error("the server did not ask for the token, so it cannot prove it holds it: it is not the ferryd you meant, or it runs without --token-file")]
    TokenNotAsked,
    /// The server asks for a token and the client has none.
    #[error("the server requires a token: give --token-file FILE (the same token as ferryd's)")]
    TokenRequired,
    /// The server's AuthOk proof does not match the client's token.
    #[error("the server could not prove it holds the token: it is not the ferryd you meant")]
    ServerProofWrong,
    /// The client's AuthProof does not match the server's token (the client was told with a
    /// Failed message).
    #[error("authentication failed: wrong token")]
    WrongToken,
    /// The client's Hello asks for a version or chunk size this server cannot serve (the
    /// client was told with a Failed message carrying this text).
    #[error("unsupported version {version} or chunk size {chunk_size} (server speaks version {PROTOCOL_VERSION}, chunk sizes {MIN_CHUNK_SIZE}..={MAX_CHUNK_SIZE})")]
    Unsupported {
        /// The Hello's version.
        version: u16,
        /// The Hello's chunk size.
        chunk_size: u32,
    },
    /// The client speaks only a protocol version older than [`MIN_PROTOCOL_VERSION`]
    /// (server side; the client was told with a Failed message carrying this text).
    #[error("the client speaks protocol version {0}, this ferryd needs {MIN_PROTOCOL_VERSION} or later (file versions include the ctime): upgrade ferry on the client")]
    ClientTooOld(u16),
    /// The server speaks only a protocol version older than [`MIN_PROTOCOL_VERSION`]
    /// (client side).
    #[error("the server speaks protocol version {0}, this ferry needs {MIN_PROTOCOL_VERSION} or later (file versions include the ctime): upgrade ferryd")]
    ServerTooOld(u16),
    /// The server closed the connection before the handshake completed (client side).
    #[error("the server closed the connection during the handshake (wrong token, or a client certificate required?)")]
    ServerClosed,
    /// The client closed the connection before the handshake completed (server side).
    /// Between messages this is a client giving up, not a violation.
    #[error("connection closed {}", if *mid_frame { "in the middle of a frame" } else { "during the handshake" })]
    ClientClosed {
        /// Part of a frame had arrived.
        mid_frame: bool,
    },
    /// Input after the machine finished: a driver bug, never the peer's doing.
    #[error("the handshake is already over")]
    Finished,
}

/// Bytes received and not yet consumed; handshake messages are cut off its front.
#[derive(Debug, Default)]
struct Inbox(BytesMut);

impl Inbox {
    /// The next complete handshake message, if one is buffered.
    fn next(&mut self) -> Result<Option<Handshake>, HandshakeError> {
        match Frame::parse(&mut self.0, HANDSHAKE_MAX_FRAME)? {
            Some(frame) => Ok(Some(Handshake::decode(frame)?)),
            None => Ok(None),
        }
    }
}

/// Bytes waiting to be sent.
#[derive(Debug, Default)]
struct Outbox(BytesMut);

impl Outbox {
    fn push(&mut self, msg: &Handshake) {
        msg.encode(&mut self.0);
    }

    fn take(&mut self) -> Option<bytes::Bytes> {
        (!self.0.is_empty()).then(|| self.0.split().freeze())
    }
}
