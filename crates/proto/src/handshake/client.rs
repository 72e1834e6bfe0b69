//! The client's side of the handshake: sends Hello, checks the Welcome, answers a token
//! challenge and checks the server's proof in turn.
//!
//! What the client refuses, whatever the server says: session parameters it cannot work
//! with; a server that does not ask for the token the client holds (it could not prove it
//! knows the token, so it may be an impostor); a server that asks for a token the client
//! does not have; an AuthOk whose proof is wrong (compared in constant time).

use bytes::{Bytes, BytesMut};

use super::{HandshakeError, Inbox, Outbox};
use crate::auth::{self, Token};
use crate::message::{AuthMethod, AuthProof, Handshake, Hello, Welcome};
use crate::{
    FRAME_OVERHEAD, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};

/// The client's token and the fresh random nonce for this connection's proof.
#[derive(Debug, Clone)]
pub struct ClientAuth {
    /// The shared token.
    pub token: Token,
    /// 32 random bytes, new for every connection (the driver draws them).
    pub client_nonce: [u8; 32],
}

/// What the client asks for.
#[derive(Debug, Clone)]
pub struct ClientParams {
    /// Chunk size wanted (the server may choose smaller).
    pub chunk_size: u32,
    /// Feature bits supported ([`crate::features`]).
    pub features: u64,
    /// Identification for the server's log.
    pub client_name: String,
    /// The token to prove, if the client has one.
    pub auth: Option<ClientAuth>,
}

/// A completed client handshake.
#[derive(Debug)]
pub struct Established {
    /// The session's parameters, checked.
    pub welcome: Welcome,
    /// Bytes received past the last handshake frame: the start of the responses.
    pub leftover: BytesMut,
}

#[derive(Debug)]
enum State {
    AwaitWelcome,
    AwaitAuthOk {
        welcome: Welcome,
        challenge: [u8; 32],
        auth: ClientAuth,
    },
    Finished,
}

/// The client's handshake machine. Created with the Hello queued for sending.
#[derive(Debug)]
pub struct ClientHandshake {
    state: State,
    auth: Option<ClientAuth>,
    inbox: Inbox,
    outbox: Outbox,
}

/// Whether a client can work with these parameters.
fn usable(w: &Welcome) -> bool {
    (MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&w.chunk_size)
        // Room for a whole chunk and a read response's fields.
        && w.max_frame >= w.chunk_size + 256
        && w.max_frame <= MAX_CHUNK_SIZE + FRAME_OVERHEAD
        && w.max_inflight > 0
}

impl ClientHandshake {
    /// A machine for one connection; its Hello is the first output.
    pub fn new(params: ClientParams) -> ClientHandshake {
        let mut outbox = Outbox::default();
        outbox.push(&Handshake::Hello(Hello {
            version: PROTOCOL_VERSION,
            features: params.features,
            chunk_size: params.chunk_size,
            client_name: params.client_name,
        }));
        ClientHandshake {
            state: State::AwaitWelcome,
            auth: params.auth,
            inbox: Inbox::default(),
            outbox,
        }
    }

    /// Bytes to send to the server now, if any.
    pub fn take_output(&mut self) -> Option<Bytes> {
        self.outbox.take()
    }

    /// Takes bytes from the server. `Ok(None)`: send [`take_output`](Self::take_output) and
    /// read more. `Ok(Some(_))`: the handshake is complete.
    ///
    /// # Errors
    /// The server refused the client, broke the protocol, or cannot be trusted; see
    /// [`HandshakeError`]. The machine is finished after an error.
    pub fn receive(&mut self, data: &[u8]) -> Result<Option<Established>, HandshakeError> {
        if matches!(self.state, State::Finished) {
            return Err(HandshakeError::Finished);
        }
        self.inbox.0.extend_from_slice(data);
        let r = self.advance();
        if !matches!(r, Ok(None)) {
            self.state = State::Finished;
        }
        r
    }

    /// The server closed the connection: the error to report.
    pub fn closed(&mut self) -> HandshakeError {
        self.state = State::Finished;
        HandshakeError::ServerClosed
    }

    fn advance(&mut self) -> Result<Option<Established>, HandshakeError> {
        loop {
            let Some(msg) = self.inbox.next()? else {
                return Ok(None);
            };
            match (std::mem::replace(&mut self.state, State::Finished), msg) {
                (_, Handshake::Failed { status, message }) => {
                    return Err(HandshakeError::Refused { status, message })
                }
                (State::AwaitWelcome, Handshake::Welcome(welcome)) => {
                    if let Some(done) = self.welcome(welcome)? {
                        return Ok(Some(done));
                    }
                }
                (
                    State::AwaitAuthOk {
                        welcome,
                        challenge,
                        auth: a,
                    },
                    Handshake::AuthOk(ok),
                ) => {
                    let want = auth::server_proof(a.token.key(), &challenge, &a.client_nonce);
                    if !auth::same(&want, &ok.server_proof) {
                        return Err(HandshakeError::ServerProofWrong);
                    }
                    return Ok(Some(self.established(welcome)));
                }
                (_, other) => return Err(HandshakeError::UnexpectedMessage(Box::new(other))),
            }
        }
    }

    /// Checks the Welcome; answers a challenge (then waits for AuthOk) or completes.
    fn welcome(&mut self, welcome: Welcome) -> Result<Option<Established>, HandshakeError> {
        if welcome.version < MIN_PROTOCOL_VERSION {
            return Err(HandshakeError::ServerTooOld(welcome.version));
        }
        if !usable(&welcome) {
            return Err(HandshakeError::UnusableWelcome(Box::new(welcome)));
        }
        match (&welcome.auth, self.auth.take()) {
            (AuthMethod::None, Some(_)) => Err(HandshakeError::TokenNotAsked),
            (AuthMethod::None, None) => Ok(Some(self.established(welcome))),
            (AuthMethod::Token { .. }, None) => Err(HandshakeError::TokenRequired),
            (AuthMethod::Token { challenge }, Some(auth)) => {
                let challenge = *challenge;
                self.outbox.push(&Handshake::AuthProof(AuthProof {
                    client_nonce: auth.client_nonce,
                    proof: auth::client_proof(auth.token.key(), &challenge, &auth.client_nonce),
                }));
                self.state = State::AwaitAuthOk {
                    welcome,
                    challenge,
                    auth,
                };
                Ok(None)
            }
        }
    }

    fn established(&mut self, welcome: Welcome) -> Established {
        Established {
            welcome,
            leftover: std::mem::take(&mut self.inbox.0),
        }
    }
}
