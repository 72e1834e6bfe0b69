//! Both handshake machines on arbitrary peer bytes, fed in pieces of varying size: errors
//! are fine, panics, hangs and unbounded buffering are not. The first byte picks whether
//! each side holds a token and whether the input starts with a valid Welcome / Hello (so the
//! token steps are reached); the second, the size of the pieces.
#![no_main]

use bytes::BytesMut;
use ferry_proto::auth::Token;
use ferry_proto::handshake::{
    ClientAuth, ClientHandshake, ClientParams, ServerAuth, ServerHandshake, ServerParams,
};
use ferry_proto::{features, AuthMethod, Handshake, Hello, Welcome, DEFAULT_CHUNK_SIZE};
use libfuzzer_sys::fuzz_target;

fn token() -> Option<Token> {
    Token::from_file_contents(b"fuzzing-token-0123456789").ok()
}

fn pieces(data: &[u8], size: usize) -> impl Iterator<Item = &[u8]> {
    data.chunks(size.max(1))
}

fuzz_target!(|data: &[u8]| {
    let (flags, piece, rest) = match data {
        [f, p, rest @ ..] => (*f, usize::from(*p), rest),
        _ => return,
    };

    let mut client = ClientHandshake::new(ClientParams {
        chunk_size: DEFAULT_CHUNK_SIZE,
        features: features::ALL,
        client_name: "fuzz".into(),
        auth: (flags & 1 != 0)
            .then(token)
            .flatten()
            .map(|token| ClientAuth {
                token,
                client_nonce: [1; 32],
            }),
    });
    let mut input = BytesMut::new();
    if flags & 2 != 0 {
        Handshake::Welcome(Welcome {
            version: 1,
            features: features::ALL,
            chunk_size: DEFAULT_CHUNK_SIZE,
            max_frame: DEFAULT_CHUNK_SIZE + 4096,
            max_inflight: 8,
            instance_id: [0; 16],
            auth: AuthMethod::Token {
                challenge: [2; 32],
            },
            zstd_max_level: Some(3),
        })
        .encode(&mut input);
    }
    input.extend_from_slice(rest);
    for p in pieces(&input, piece) {
        let r = client.receive(p);
        let _ = client.take_output();
        if r.is_err() {
            break;
        }
    }
    let _ = client.closed();

    let mut server = ServerHandshake::new(ServerParams {
        chunk_size: DEFAULT_CHUNK_SIZE,
        max_inflight: 8,
        instance_id: [3; 16],
        auth: (flags & 4 != 0)
            .then(token)
            .flatten()
            .map(|token| ServerAuth {
                token,
                challenge: [2; 32],
            }),
        zstd_max_level: (flags & 16 != 0).then_some(3),
    });
    let mut input = BytesMut::new();
    if flags & 8 != 0 {
        Handshake::Hello(Hello {
            version: 1,
            features: features::ALL,
            chunk_size: DEFAULT_CHUNK_SIZE,
            client_name: "fuzz".into(),
        })
        .encode(&mut input);
    }
    input.extend_from_slice(rest);
    for p in pieces(&input, piece) {
        let r = server.receive(p);
        let _ = server.take_output();
        if r.is_err() {
            break;
        }
    }
    let _ = server.closed();
});
