//! Property tests of the handshake machines: a client and a server machine driven against
//! each other — arbitrary parameters and tokens, the byte streams cut at arbitrary points —
//! agree on the outcome the rules predict; arbitrary bytes never make either panic.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use bytes::BytesMut;
use ferry_proto::auth::Token;
use ferry_proto::handshake::{
    Accepted, ClientAuth, ClientHandshake, ClientParams, Established, HandshakeError, ServerAuth,
    ServerHandshake, ServerParams,
};
use ferry_proto::*;
use proptest::prelude::*;

fn token(which: u8) -> Token {
    Token::from_file_contents(format!("0123456789abcdef-{which}").as_bytes()).unwrap()
}

/// Cuts `queue`'s front into pieces whose sizes cycle through `splits`.
struct Pipe {
    queue: Vec<u8>,
    splits: Vec<usize>,
    next: usize,
}

impl Pipe {
    fn new(splits: Vec<usize>) -> Pipe {
        Pipe {
            queue: Vec::new(),
            splits,
            next: 0,
        }
    }

    fn piece(&mut self) -> Vec<u8> {
        let n = self.splits[self.next % self.splits.len()].clamp(1, self.queue.len());
        self.next += 1;
        self.queue.drain(..n).collect()
    }
}

type Outcome = (
    Result<Established, HandshakeError>,
    Result<Accepted, HandshakeError>,
    Vec<u8>,
);

/// Runs both machines to their ends; `trailing` is what the client pipelines behind its
/// handshake once it is established. Also returns the client bytes the server never took.
fn drive(
    mut client: ClientHandshake,
    mut server: ServerHandshake,
    c2s_splits: Vec<usize>,
    s2c_splits: Vec<usize>,
    trailing: &[u8],
) -> Outcome {
    let (mut c2s, mut s2c) = (Pipe::new(c2s_splits), Pipe::new(s2c_splits));
    let (mut c_res, mut s_res) = (None, None);
    for _ in 0..100_000 {
        if let Some(b) = client.take_output() {
            c2s.queue.extend_from_slice(&b);
        }
        if let Some(b) = server.take_output() {
            s2c.queue.extend_from_slice(&b);
        }
        (c_res, s_res) = match (c_res, s_res) {
            (Some(c), Some(s)) => return (c, s, c2s.queue),
            other => other,
        };
        if s_res.is_none() && !c2s.queue.is_empty() {
            match server.receive(&c2s.piece()) {
                Ok(None) => {}
                Ok(Some(a)) => s_res = Some(Ok(a)),
                Err(e) => s_res = Some(Err(e)),
            }
        } else if c_res.is_none() && !s2c.queue.is_empty() {
            match client.receive(&s2c.piece()) {
                Ok(None) => {}
                Ok(Some(est)) => {
                    c2s.queue.extend_from_slice(trailing);
                    c_res = Some(Ok(est));
                }
                Err(e) => c_res = Some(Err(e)),
            }
        } else if s_res.is_none() && c_res.is_some() {
            s_res = Some(Err(server.closed()));
        } else if c_res.is_none() && s_res.is_some() {
            c_res = Some(Err(client.closed()));
        } else if c_res.is_none() && s_res.is_none() {
            panic!("both machines wait for each other");
        }
    }
    panic!("the handshake did not end");
}

fn splits() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(prop_oneof![1usize..8, 1usize..200, Just(usize::MAX)], 1..6)
}

fn chunk_size() -> impl Strategy<Value = u32> {
    prop_oneof![
        MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE,
        Just(MIN_CHUNK_SIZE),
        Just(MAX_CHUNK_SIZE),
        any::<u32>(),
        0u32..MIN_CHUNK_SIZE,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn client_and_server_agree(
        client_chunk in chunk_size(),
        server_chunk in chunk_size(),
        client_features in any::<u64>(),
        max_inflight in 0u32..4,
        client_token in proptest::option::of(0u8..2),
        server_token in proptest::option::of(0u8..2),
        nonce in any::<[u8; 32]>(),
        challenge in any::<[u8; 32]>(),
        instance_id in any::<[u8; 16]>(),
        zstd_max_level in proptest::option::of(ZSTD_MIN_LEVEL..=ZSTD_MAX_LEVEL),
        c2s in splits(),
        s2c in splits(),
        trailing in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let client = ClientHandshake::new(ClientParams {
            chunk_size: client_chunk,
            features: client_features,
            client_name: "prop".into(),
            auth: client_token.map(|t| ClientAuth { token: token(t), client_nonce: nonce }),
        });
        let server = ServerHandshake::new(ServerParams {
            chunk_size: server_chunk,
            max_inflight,
            instance_id,
            auth: server_token.map(|t| ServerAuth { token: token(t), challenge }),
            zstd_max_level,
        });
        let (c, s, unread) = drive(client, server, c2s, s2c, &trailing);
        let chunk = client_chunk.min(server_chunk);
        if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&chunk) {
            prop_assert!(matches!(s, Err(HandshakeError::Unsupported { .. })), "{s:?}");
            prop_assert!(
                matches!(&c, Err(HandshakeError::Refused { status: Status::Unsupported, .. })),
                "{c:?}"
            );
            return Ok(());
        }
        if max_inflight == 0 {
            prop_assert!(matches!(c, Err(HandshakeError::UnusableWelcome(_))), "{c:?}");
            // The client leaves before proving anything.
            if server_token.is_some() {
                prop_assert_eq!(s.unwrap_err(), HandshakeError::ClientClosed { mid_frame: false });
            } else {
                prop_assert!(s.is_ok());
            }
            return Ok(());
        }
        match (client_token, server_token) {
            (Some(a), Some(b)) if a != b => {
                prop_assert_eq!(s.unwrap_err(), HandshakeError::WrongToken);
                prop_assert!(
                    matches!(&c, Err(HandshakeError::Refused { status: Status::AuthFailed, message })
                        if message.contains("wrong token")),
                    "{c:?}"
                );
                return Ok(());
            }
            _ => {}
        }
        match (client_token, server_token) {
            (Some(_), None) => {
                prop_assert_eq!(c.unwrap_err(), HandshakeError::TokenNotAsked);
                prop_assert!(s.is_ok());
            }
            (None, Some(_)) => {
                prop_assert_eq!(c.unwrap_err(), HandshakeError::TokenRequired);
                prop_assert_eq!(s.unwrap_err(), HandshakeError::ClientClosed { mid_frame: false });
            }
            _ => {
                let (c, s) = (c.unwrap(), s.unwrap());
                prop_assert_eq!(&c.welcome, &s.welcome);
                prop_assert_eq!(c.welcome.chunk_size, chunk);
                prop_assert_eq!(c.welcome.max_frame, chunk + FRAME_OVERHEAD);
                // zstd only when both offer it, and then with the server's highest level.
                let offered = if zstd_max_level.is_some() {
                    features::ALL
                } else {
                    features::ALL & !features::ZSTD
                };
                prop_assert_eq!(c.welcome.features, client_features & offered);
                prop_assert_eq!(
                    c.welcome.zstd_max_level,
                    zstd_max_level.filter(|_| client_features & features::ZSTD != 0)
                );
                prop_assert_eq!(c.welcome.instance_id, instance_id);
                prop_assert_eq!(s.client_name, "prop");
                prop_assert!(c.leftover.is_empty());
                // Whatever the client pipelined reaches the session, in order.
                let mut got = s.leftover.to_vec();
                got.extend_from_slice(&unread);
                prop_assert_eq!(got, trailing);
            }
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_client(
        data in proptest::collection::vec(any::<u8>(), 0..2048),
        valid_welcome in any::<bool>(),
        with_token in any::<bool>(),
        cuts in splits(),
    ) {
        let mut m = ClientHandshake::new(ClientParams {
            chunk_size: DEFAULT_CHUNK_SIZE,
            features: features::ALL,
            client_name: "fuzz".into(),
            auth: with_token.then(|| ClientAuth { token: token(0), client_nonce: [1; 32] }),
        });
        let mut input = BytesMut::new();
        if valid_welcome {
            Handshake::Welcome(Welcome {
                version: PROTOCOL_VERSION,
                features: 0,
                chunk_size: DEFAULT_CHUNK_SIZE,
                max_frame: DEFAULT_CHUNK_SIZE + FRAME_OVERHEAD,
                max_inflight: 4,
                instance_id: [0; 16],
                auth: AuthMethod::Token { challenge: [2; 32] },
                zstd_max_level: None,
            })
            .encode(&mut input);
        }
        input.extend_from_slice(&data);
        let mut pipe = Pipe::new(cuts);
        pipe.queue = input.to_vec();
        let mut finished = false;
        while !pipe.queue.is_empty() {
            let r = m.receive(&pipe.piece());
            let _ = m.take_output();
            if finished {
                prop_assert_eq!(r.unwrap_err(), HandshakeError::Finished);
            } else if !matches!(r, Ok(None)) {
                finished = true;
            }
        }
        let _ = m.closed();
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_server(
        data in proptest::collection::vec(any::<u8>(), 0..2048),
        valid_hello in any::<bool>(),
        with_token in any::<bool>(),
        cuts in splits(),
    ) {
        let mut m = ServerHandshake::new(ServerParams {
            chunk_size: DEFAULT_CHUNK_SIZE,
            max_inflight: 4,
            instance_id: [3; 16],
            auth: with_token.then(|| ServerAuth { token: token(0), challenge: [2; 32] }),
            zstd_max_level: Some(3),
        });
        let mut input = BytesMut::new();
        if valid_hello {
            Handshake::Hello(Hello {
                version: PROTOCOL_VERSION,
                features: features::ALL,
                chunk_size: DEFAULT_CHUNK_SIZE,
                client_name: "fuzz".into(),
            })
            .encode(&mut input);
        }
        input.extend_from_slice(&data);
        let mut pipe = Pipe::new(cuts);
        pipe.queue = input.to_vec();
        let mut finished = false;
        while !pipe.queue.is_empty() {
            let r = m.receive(&pipe.piece());
            let _ = m.take_output();
            if finished {
                prop_assert_eq!(r.unwrap_err(), HandshakeError::Finished);
            } else if !matches!(r, Ok(None)) {
                finished = true;
            }
        }
        let _ = m.closed();
    }
}

#[test]
fn a_wrong_server_proof_is_refused() {
    let mut client = ClientHandshake::new(ClientParams {
        chunk_size: DEFAULT_CHUNK_SIZE,
        features: features::ALL,
        client_name: "t".into(),
        auth: Some(ClientAuth {
            token: token(0),
            client_nonce: [1; 32],
        }),
    });
    let mut welcome = BytesMut::new();
    Handshake::Welcome(Welcome {
        version: PROTOCOL_VERSION,
        features: 0,
        chunk_size: DEFAULT_CHUNK_SIZE,
        max_frame: DEFAULT_CHUNK_SIZE + FRAME_OVERHEAD,
        max_inflight: 4,
        instance_id: [0; 16],
        auth: AuthMethod::Token { challenge: [2; 32] },
        zstd_max_level: None,
    })
    .encode(&mut welcome);
    assert!(client.receive(&welcome).unwrap().is_none());
    let _hello_and_proof = client.take_output().unwrap();
    let mut ok = BytesMut::new();
    Handshake::AuthOk(AuthOk {
        server_proof: [9; 32],
    })
    .encode(&mut ok);
    assert_eq!(
        client.receive(&ok).unwrap_err(),
        HandshakeError::ServerProofWrong
    );
}

#[test]
fn a_client_closing_mid_frame_is_a_violation() {
    let mut server = ServerHandshake::new(ServerParams {
        chunk_size: DEFAULT_CHUNK_SIZE,
        max_inflight: 4,
        instance_id: [0; 16],
        auth: None,
        zstd_max_level: Some(3),
    });
    assert!(server.receive(&[0, 0, 0, 9, 1]).unwrap().is_none());
    assert_eq!(
        server.closed(),
        HandshakeError::ClientClosed { mid_frame: true }
    );
}
