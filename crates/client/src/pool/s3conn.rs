//! A stream of the pool that reaches one gateway of an S3 store ([`crate::s3`]).
//!
//! It takes requests from the same channel a ferryd stream's writer does and answers each
//! in a task of its own (the slot's request permits bound how many run at once) with the
//! source's HTTP requests to its gateway; timed requests get their round trip (from the
//! hand-over to the answer), so the scheduler's delay controller works as with ferryd.
//!
//! Invariant: a gateway that cannot be reached ends the stream as a lost ferryd
//! connection does — the request fails with [`ClientError::ConnectionLost`] (the pool
//! sends it again on another stream), the stream is marked dead and the supervisor is
//! told its slot, which it opens again once the gateway answers a probe.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, Notify, Semaphore};
use tracing::warn;

use super::conn::{Answer, Conn, Outgoing};
use crate::error::ClientError;
use crate::s3::S3Source;

/// Requests one S3 stream runs at once.
pub(super) const S3_INFLIGHT: u32 = 16;

/// Starts a stream to gateway `endpoint` of `source` in slot `slot`; `dead` is told `slot`
/// when the gateway stops answering.
pub(super) fn start_s3_conn(
    source: Arc<S3Source>,
    endpoint: usize,
    slot: usize,
    dead: mpsc::UnboundedSender<usize>,
) -> Conn {
    let (tx, mut rx) = mpsc::channel::<Outgoing>(S3_INFLIGHT as usize);
    let alive = Arc::new(AtomicBool::new(true));
    let kill = Arc::new(Notify::new());
    let (a, k) = (alive.clone(), kill.clone());
    let instance_id = source.instance();
    tokio::spawn(async move {
        loop {
            let out = tokio::select! {
                _ = k.notified() => break,
                m = rx.recv() => match m {
                    Some(m) => m,
                    None => break,
                },
            };
            let (source, alive, dead) = (source.clone(), a.clone(), dead.clone());
            tokio::spawn(async move {
                let start = Instant::now();
                let answered = source.answer(endpoint, out.request).await;
                let reply = match answered {
                    Ok(response) => Ok(Answer {
                        response,
                        rtt: out.timed.then(|| start.elapsed()),
                        id: 0,
                    }),
                    Err(e) => {
                        if alive.swap(false, Ordering::AcqRel) {
                            warn!("stream {slot}: {}; its requests go to other streams", e.0);
                            let _ = dead.send(slot);
                        }
                        Err(ClientError::ConnectionLost)
                    }
                };
                let _ = out.reply.send(reply);
            });
        }
        a.store(false, Ordering::Release);
    });
    Conn {
        tx,
        inflight: Arc::new(Semaphore::new(S3_INFLIGHT as usize)),
        alive,
        kill,
        instance_id,
    }
}
