//! Fetching a chunk (or a run of chunks) of a known version (retrying transient failures)
//! and the token bucket that caps the mirror's rate on the wire (`--bwlimit`).
//!
//! Invariant: a chunk is returned only when the server answered for exactly the version
//! asked and with exactly the length that version implies; anything else means the file
//! is changing ([`ChunkError::Changed`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_client::ClientError;
use ferry_proto::{Status, Version};
use tracing::debug;

use super::Ctx;

#[derive(Debug)]
pub(super) enum ChunkError {
    Changed,
    Vanished,
    Remote(ClientError),
    Io(std::io::Error),
}

/// Fetches `len` bytes at `offset` of `version` (one chunk, or a run of consecutive chunks
/// from a source that prefers long reads), retrying transient failures (a payload that
/// failed its checksum, a broken stream) a few times.
pub(super) async fn fetch_chunk(
    ctx: &Ctx,
    remote: &Bytes,
    offset: u64,
    len: u32,
    version: Version,
) -> Result<(Bytes, Option<[u8; 32]>), ChunkError> {
    let mut tries = 0;
    loop {
        match ctx.client.read_chunk(remote.clone(), offset, len).await {
            Ok(chunk) => {
                let (data, v) = (chunk.data, chunk.version);
                if let Some(l) = &ctx.limiter {
                    l.take(chunk.wire_len as u64).await;
                }
                if v != version {
                    return Err(ChunkError::Changed);
                }
                if data.len() != len as usize {
                    // Shorter than the version's size says: the file is being changed.
                    return Err(ChunkError::Changed);
                }
                let cs = u64::from(ctx.client.session().chunk_size).max(1);
                ctx.progress
                    .chunks_fetched
                    .fetch_add((data.len() as u64).div_ceil(cs).max(1), Ordering::Relaxed);
                ctx.progress
                    .bytes_fetched
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                return Ok((data, chunk.file_hash));
            }
            Err(ClientError::Remote {
                status: Status::NotFound,
                ..
            }) => return Err(ChunkError::Vanished),
            Err(e) if tries < 3 && e.is_transient() => {
                tries += 1;
                ctx.progress
                    .chunks_refetched
                    .fetch_add(1, Ordering::Relaxed);
                debug!(
                    "chunk at {offset} of /{}: {e}; fetching again",
                    String::from_utf8_lossy(remote)
                );
                tokio::time::sleep(Duration::from_millis(100 << tries)).await;
            }
            Err(e) => return Err(ChunkError::Remote(e)),
        }
    }
}

/// A token bucket on wire bytes: callers sleep as long as the rate requires.
pub(super) struct Limiter {
    rate: f64,
    state: std::sync::Mutex<(Instant, f64)>,
}

impl Limiter {
    pub(super) fn new(rate: u64) -> Limiter {
        Limiter {
            rate: rate.max(1) as f64,
            state: std::sync::Mutex::new((Instant::now(), 0.0)),
        }
    }

    /// Accounts `n` bytes; sleeps until the average rate is back under the cap.
    pub(super) async fn take(&self, n: u64) {
        let wait = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            // `s.1` is the time (s) by which the bytes so far are paid for, relative to s.0.
            let paid_until = (s.1 - now.duration_since(s.0).as_secs_f64()).max(0.0);
            let new = paid_until + n as f64 / self.rate;
            *s = (now, new);
            // Up to a quarter second of burst is allowed.
            (new - 0.25).max(0.0)
        };
        if wait > 0.0 {
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
}
