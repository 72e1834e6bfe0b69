//! The server's side of the handshake: checks the Hello, negotiates the session, sends the
//! Welcome, and with a token checks the client's proof and proves itself in turn.
//!
//! Negotiation: the version is the lower of both sides'; the features are the intersection of
//! the client's and [`features::ALL`]; the chunk size is the lower of the client's wish and the
//! server's limit, and must lie in [`MIN_CHUNK_SIZE`]`..=`[`MAX_CHUNK_SIZE`] (version 0 or an
//! unservable chunk size is refused with a Failed message); `max_frame` is the chunk size
//! plus [`FRAME_OVERHEAD`].

use bytes::{Bytes, BytesMut};

use super::{HandshakeError, Inbox, Outbox};
use crate::auth::{self, Token};
use crate::message::{AuthMethod, AuthOk, Handshake, Hello, Welcome};
use crate::status::Status;
use crate::{
    features, FRAME_OVERHEAD, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE, MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
};

/// The server's token and the fresh random challenge for this connection.
#[derive(Debug, Clone)]
pub struct ServerAuth {
    /// The shared token.
    pub token: Token,
    /// 32 random bytes, new for every connection (the driver draws them).
    pub challenge: [u8; 32],
}

/// What the server offers.
#[derive(Debug, Clone)]
pub struct ServerParams {
    /// Largest chunk size served.
    pub chunk_size: u32,
    /// Requests a client may have outstanding per connection.
    pub max_inflight: u32,
    /// This server process's random id.
    pub instance_id: [u8; 16],
    /// Require a token proof, if set.
    pub auth: Option<ServerAuth>,
    /// The highest zstd level the server compresses at; `None`: it does not offer zstd
    /// (the ZSTD feature).
    pub zstd_max_level: Option<i8>,
}

/// A completed server handshake.
#[derive(Debug)]
pub struct Accepted {
    /// The session's parameters, as sent.
    pub welcome: Welcome,
    /// The client's self-description, for the log.
    pub client_name: String,
    /// Bytes received past the last handshake frame: the first pipelined requests.
    pub leftover: BytesMut,
}

#[derive(Debug)]
enum State {
    AwaitHello,
    AwaitProof {
        welcome: Welcome,
        client_name: String,
        auth: ServerAuth,
    },
    Finished,
}

/// The server's handshake machine. It speaks only when spoken to: nothing is output
/// before the Hello.
#[derive(Debug)]
pub struct ServerHandshake {
    state: State,
    params: ServerParams,
    inbox: Inbox,
    outbox: Outbox,
}

impl ServerHandshake {
    /// A machine for one connection.
    pub fn new(params: ServerParams) -> ServerHandshake {
        ServerHandshake {
            state: State::AwaitHello,
            params,
            inbox: Inbox::default(),
            outbox: Outbox::default(),
        }
    }

    /// Bytes to send to the client now, if any. After an error, the Failed message for
    /// the client (if the failure warrants one).
    pub fn take_output(&mut self) -> Option<Bytes> {
        self.outbox.take()
    }

    /// Takes bytes from the client. `Ok(None)`: send [`take_output`](Self::take_output) and
    /// read more. `Ok(Some(_))`: send `take_output`, and the session starts.
    ///
    /// # Errors
    /// The client broke the protocol, asked for what this server cannot serve
    /// ([`HandshakeError::Unsupported`]) or proved the wrong token
    /// ([`HandshakeError::WrongToken`]). The machine is finished after an error.
    pub fn receive(&mut self, data: &[u8]) -> Result<Option<Accepted>, HandshakeError> {
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

    /// The client closed the connection: why, as an error
    /// ([`HandshakeError::ClientClosed`], a violation only in the middle of a frame).
    pub fn closed(&mut self) -> HandshakeError {
        self.state = State::Finished;
        HandshakeError::ClientClosed {
            mid_frame: !self.inbox.0.is_empty(),
        }
    }

    fn advance(&mut self) -> Result<Option<Accepted>, HandshakeError> {
        loop {
            let Some(msg) = self.inbox.next()? else {
                return Ok(None);
            };
            match (std::mem::replace(&mut self.state, State::Finished), msg) {
                (State::AwaitHello, Handshake::Hello(hello)) => {
                    if let Some(done) = self.hello(hello)? {
                        return Ok(Some(done));
                    }
                }
                (
                    State::AwaitProof {
                        welcome,
                        client_name,
                        auth: a,
                    },
                    Handshake::AuthProof(proof),
                ) => {
                    let (key, challenge) = (a.token.key(), &a.challenge);
                    let want = auth::client_proof(key, challenge, &proof.client_nonce);
                    if !auth::same(&want, &proof.proof) {
                        self.outbox.push(&Handshake::Failed {
                            status: Status::AuthFailed,
                            message:
                                "wrong token: the client's --token-file does not match ferryd's"
                                    .into(),
                        });
                        return Err(HandshakeError::WrongToken);
                    }
                    self.outbox.push(&Handshake::AuthOk(AuthOk {
                        server_proof: auth::server_proof(key, challenge, &proof.client_nonce),
                    }));
                    return Ok(Some(self.accepted(welcome, client_name)));
                }
                (State::AwaitHello, got) => {
                    return Err(HandshakeError::Expected {
                        expected: "Hello",
                        got: Box::new(got),
                    })
                }
                (_, got) => {
                    return Err(HandshakeError::Expected {
                        expected: "AuthProof",
                        got: Box::new(got),
                    })
                }
            }
        }
    }

    /// Negotiates from the Hello and sends the Welcome (or a refusal).
    fn hello(&mut self, hello: Hello) -> Result<Option<Accepted>, HandshakeError> {
        let chunk_size = hello.chunk_size.min(self.params.chunk_size);
        if hello.version == 0 || !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk_size) {
            let e = HandshakeError::Unsupported {
                version: hello.version,
                chunk_size: hello.chunk_size,
            };
            self.outbox.push(&Handshake::Failed {
                status: Status::Unsupported,
                message: e.to_string(),
            });
            return Err(e);
        }
        if hello.version < MIN_PROTOCOL_VERSION {
            let e = HandshakeError::ClientTooOld(hello.version);
            self.outbox.push(&Handshake::Failed {
                status: Status::Unsupported,
                message: e.to_string(),
            });
            return Err(e);
        }
        let offered = match self.params.zstd_max_level {
            Some(_) => features::ALL,
            None => features::ALL & !features::ZSTD,
        };
        let features = hello.features & offered;
        let welcome = Welcome {
            version: hello.version.min(PROTOCOL_VERSION),
            features,
            chunk_size,
            max_frame: chunk_size + FRAME_OVERHEAD,
            max_inflight: self.params.max_inflight,
            instance_id: self.params.instance_id,
            auth: match &self.params.auth {
                Some(a) => AuthMethod::Token {
                    challenge: a.challenge,
                },
                None => AuthMethod::None,
            },
            zstd_max_level: self
                .params
                .zstd_max_level
                .filter(|_| features & features::ZSTD != 0),
        };
        self.outbox.push(&Handshake::Welcome(welcome.clone()));
        if let Some(auth) = self.params.auth.clone() {
            self.state = State::AwaitProof {
                welcome,
                client_name: hello.client_name,
                auth,
            };
            return Ok(None);
        }
        Ok(Some(self.accepted(welcome, hello.client_name)))
    }

    fn accepted(&mut self, welcome: Welcome, client_name: String) -> Accepted {
        Accepted {
            welcome,
            client_name,
            leftover: std::mem::take(&mut self.inbox.0),
        }
    }
}
