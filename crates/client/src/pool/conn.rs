//! One connection's tasks, once its handshake is done: a writer, a reader and a watchdog.
//!
//! - The writer takes requests from a channel, gives each the next request id, records
//!   its reply channel in [`Pending`] (and, for a timed request, when it was written), and
//!   writes them in batches.
//! - Round trips: a timed request (a Ping, a small demand read: the scheduler's samples)
//!   is answered with its round trip, from its hand-over to the socket to the moment its
//!   response frame is complete.
//! - The reader cuts frames off the socket and completes the waiting request with the same
//!   id. Small frames share one buffer; a large frame (a read payload) gets an exact-size
//!   buffer of its own, so a chunk kept in a cache pins only its own bytes. A response
//!   that does not decode, or one for an id nobody waits for, ends the connection.
//! - The watchdog closes a stream that stalls (requests outstanding, nothing received for
//!   the stall timeout) and pings one that has been quiet for the keepalive interval.
//!
//! Invariants: when any of the three ends, the stream is marked dead, every waiting
//! request fails with [`ClientError::ConnectionLost`] (the pool sends it again elsewhere),
//! and the pool's supervisor is told the slot's number so it reconnects it. Request id 0
//! is never used (it belongs to the handshake).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ferry_proto::{Frame, FrameCheck, Request, Response};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tracing::{debug, warn};

use super::handshake::Opened;
use super::{ClientConfig, Counters};
use crate::error::ClientError;

/// Where a request's response goes.
pub(super) type Reply = oneshot::Sender<Result<Answer, ClientError>>;

/// A response, and its round trip when the request was timed.
pub(super) struct Answer {
    pub(super) response: Response,
    pub(super) rtt: Option<Duration>,
    /// The request id the response came back under (what its checksum is bound to with
    /// BOUND; 0 where no ids travel).
    pub(super) id: u32,
}

/// A request on its way to the writer.
pub(super) struct Outgoing {
    pub(super) request: Request,
    pub(super) reply: Reply,
    /// Measure the round trip (a sample for the scheduler).
    pub(super) timed: bool,
}

/// One connection: a writer task fed by `tx`, a reader task completing the pending
/// requests, a watchdog for stalls and keepalives.
pub(super) struct Conn {
    pub(super) tx: mpsc::Sender<Outgoing>,
    /// Requests allowed in flight (the server's `max_inflight`).
    pub(super) inflight: Arc<Semaphore>,
    pub(super) alive: Arc<AtomicBool>,
    /// Ends the reader (which then ends the writer and the watchdog).
    pub(super) kill: Arc<Notify>,
    /// The server process this connection reached.
    pub(super) instance_id: [u8; 16],
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The pool let go of this connection: close it.
        self.kill.notify_one();
    }
}

/// Requests sent and waiting for their response, by request id.
#[derive(Default)]
struct Pending {
    next_id: u32,
    /// Reply channels, with when the request was written if it is timed.
    waiting: HashMap<u32, (Reply, Option<Instant>)>,
    closed: bool,
}

/// Milliseconds since a process-wide reference point (for last-received stamps).
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// The connection of a slot whose stream is not open yet (never picked: it is not alive):
/// one still opening, or an S3 gateway that did not answer at connect.
pub(super) fn not_open() -> Conn {
    let (tx, _) = mpsc::channel(1);
    Conn {
        tx,
        inflight: Arc::new(Semaphore::new(1)),
        alive: Arc::new(AtomicBool::new(false)),
        kill: Arc::new(Notify::new()),
        instance_id: [0; 16],
    }
}

/// Starts the tasks of a freshly opened connection for slot number `slot`; `dead` is told
/// `slot` when the connection ends.
pub(super) fn start_conn(
    opened: Opened,
    slot: usize,
    dead: mpsc::UnboundedSender<usize>,
    config: &ClientConfig,
    counters: Arc<Counters>,
) -> Conn {
    let Opened {
        halves: (rd, wr),
        welcome,
        leftover,
    } = opened;
    let pending = Arc::new(Mutex::new(Pending {
        next_id: 1,
        ..Pending::default()
    }));
    let alive = Arc::new(AtomicBool::new(true));
    let kill = Arc::new(Notify::new());
    let last_rx = Arc::new(AtomicU64::new(now_ms()));
    let (tx, rx) = mpsc::channel(welcome.max_inflight as usize);
    let writer = tokio::spawn(write_loop(
        wr,
        rx,
        pending.clone(),
        alive.clone(),
        kill.clone(),
        last_rx.clone(),
    ));
    let reader = read_loop(
        rd,
        welcome.max_frame,
        leftover,
        pending.clone(),
        alive.clone(),
        last_rx.clone(),
        kill.clone(),
    );
    let (a, p) = (alive.clone(), pending.clone());
    tokio::spawn(async move {
        reader.await;
        close(&p, &a);
        // A writer blocked on a socket the server stopped reading ends here too.
        writer.abort();
        let _ = dead.send(slot);
    });
    tokio::spawn(watchdog(
        tx.clone(),
        pending,
        alive.clone(),
        last_rx,
        kill.clone(),
        config.stall_timeout,
        config.keepalive,
        counters,
        slot,
    ));
    Conn {
        tx,
        inflight: Arc::new(Semaphore::new(welcome.max_inflight as usize)),
        alive,
        kill,
        instance_id: welcome.instance_id,
    }
}

/// Closes a stream that stalls (requests outstanding, nothing received for `stall`), and
/// pings one that has been quiet for `keepalive`.
#[allow(clippy::too_many_arguments)]
async fn watchdog(
    tx: mpsc::Sender<Outgoing>,
    pending: Arc<Mutex<Pending>>,
    alive: Arc<AtomicBool>,
    last_rx: Arc<AtomicU64>,
    kill: Arc<Notify>,
    stall: Duration,
    keepalive: Duration,
    counters: Arc<Counters>,
    slot: usize,
) {
    let tick = (stall / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The `last_rx` a mid-stall Ping was sent for (one per quiet spell).
    let mut pinged_at = u64::MAX;
    loop {
        interval.tick().await;
        if !alive.load(Ordering::Relaxed) {
            kill.notify_one();
            return;
        }
        let waiting = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .waiting
            .len();
        // Quiet: since the last byte received, or since requests started waiting after an
        // idle spell (the writer resets the clock then), whichever is later.
        let rx = last_rx.load(Ordering::Relaxed);
        let quiet = Duration::from_millis(now_ms().saturating_sub(rx));
        let ping = || {
            let (reply, _) = oneshot::channel();
            tx.try_send(Outgoing {
                request: Request::Ping,
                reply,
                timed: false,
            })
        };
        if waiting > 0 {
            if quiet >= stall {
                counters.stalls.fetch_add(1, Ordering::Relaxed);
                warn!(
                    "stream {slot}: nothing received for {:.0} s with {waiting} requests waiting; closing it, its requests go to other streams",
                    quiet.as_secs_f64()
                );
                kill.notify_one();
                return;
            }
            // A slow request (a big Hash) is not a dead stream: a Ping halfway through the
            // stall time proves the stream alive when its Pong comes back.
            if quiet >= stall / 2 && pinged_at != rx {
                match ping() {
                    Ok(()) => pinged_at = rx,
                    Err(mpsc::error::TrySendError::Full(_)) => {}
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
        } else if quiet >= keepalive {
            // The answer only refreshes `last_rx`; a missing one shows up as a stall.
            match ping() {
                // The stall clock starts now: the Pong has `stall` to arrive.
                Ok(()) => last_rx.store(now_ms(), Ordering::Relaxed),
                Err(mpsc::error::TrySendError::Full(_)) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
    }
}

/// Fails every waiting request and marks the stream dead.
fn close(pending: &Mutex<Pending>, alive: &AtomicBool) {
    alive.store(false, Ordering::Relaxed);
    let waiting = {
        let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
        p.closed = true;
        std::mem::take(&mut p.waiting)
    };
    for (_, (reply, _)) in waiting {
        let _ = reply.send(Err(ClientError::ConnectionLost));
    }
}

async fn write_loop(
    wr: Box<dyn AsyncWrite + Send + Unpin>,
    mut rx: mpsc::Receiver<Outgoing>,
    pending: Arc<Mutex<Pending>>,
    alive: Arc<AtomicBool>,
    kill: Arc<Notify>,
    last_rx: Arc<AtomicU64>,
) {
    let mut w = BufWriter::with_capacity(64 * 1024, wr);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(out) = next {
            let id = {
                let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
                if p.closed {
                    let _ = out.reply.send(Err(ClientError::ConnectionLost));
                    next = rx.try_recv().ok();
                    continue;
                }
                let id = p.next_id;
                p.next_id = p.next_id.wrapping_add(1).max(1);
                if p.waiting.is_empty() {
                    // After an idle spell the stall clock starts with this request.
                    last_rx.store(now_ms(), Ordering::Relaxed);
                }
                let sent = out.timed.then(Instant::now);
                p.waiting.insert(id, (out.reply, sent));
                id
            };
            out.request.encode(id, &mut buf);
            next = rx.try_recv().ok();
        }
        if w.write_all(&buf).await.is_err() || w.flush().await.is_err() {
            break;
        }
        buf.clear();
    }
    close(&pending, &alive);
    // The reader may be blocked on a socket that will never say more: end it too, so the
    // stream is reconnected.
    kill.notify_one();
}

/// Frames at least this large are read into a buffer of their own.
const OWN_BUFFER_FRAME: usize = 64 * 1024;

/// Reads the next frame. Small frames share `buf`; a large frame (a read payload) gets an
/// exact-size buffer of its own, so a chunk held in the cache pins only its own bytes,
/// never a shared receive buffer. Its bytes are copied once from the socket, except the
/// few already read into the shared buffer with the header, which are copied twice.
async fn read_frame(
    rd: &mut Box<dyn AsyncRead + Send + Unpin>,
    buf: &mut BytesMut,
    max_frame: u32,
    last_rx: &AtomicU64,
) -> std::io::Result<Option<Frame>> {
    let invalid =
        |e: ferry_proto::FrameError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    loop {
        match Frame::check(buf, max_frame).map_err(invalid)? {
            FrameCheck::Complete(_) => return Frame::parse(buf, max_frame).map_err(invalid),
            FrameCheck::Incomplete { needed } => {
                // Exact once the length field is in; before that, too small to matter.
                let total = buf.len() + needed;
                if total >= OWN_BUFFER_FRAME {
                    let mut own = BytesMut::with_capacity(total);
                    own.extend_from_slice(buf);
                    buf.clear();
                    // Straight into the spare capacity: no zeroing of a buffer about to
                    // be overwritten.
                    while own.len() < total {
                        let want = (total - own.len()) as u64;
                        if (&mut *rd).take(want).read_buf(&mut own).await? == 0 {
                            return Err(std::io::ErrorKind::UnexpectedEof.into());
                        }
                        last_rx.store(now_ms(), Ordering::Relaxed);
                    }
                    return Frame::parse(&mut own, max_frame).map_err(invalid);
                }
            }
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(OWN_BUFFER_FRAME);
        }
        if rd.read_buf(buf).await? == 0 {
            return Ok(None);
        }
        last_rx.store(now_ms(), Ordering::Relaxed);
    }
}

async fn read_loop(
    mut rd: Box<dyn AsyncRead + Send + Unpin>,
    max_frame: u32,
    mut buf: BytesMut,
    pending: Arc<Mutex<Pending>>,
    alive: Arc<AtomicBool>,
    last_rx: Arc<AtomicU64>,
    kill: Arc<Notify>,
) {
    loop {
        let frame = tokio::select! {
            r = read_frame(&mut rd, &mut buf, max_frame, &last_rx) => match r {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    debug!("stream closed: {e}");
                    break;
                }
            },
            _ = kill.notified() => break,
        };
        let id = frame.request_id;
        let complete = Instant::now();
        let response = Response::decode(frame).map_err(ClientError::Decode);
        let bad = response.is_err();
        let reply = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .waiting
            .remove(&id);
        if bad {
            // The stream ends here: marked dead before the caller hears of the garbled
            // response, so its retry goes to another stream (or waits for one), not this.
            close(&pending, &alive);
        }
        match reply {
            Some((reply, sent)) => {
                let rtt = sent.map(|t| complete.saturating_duration_since(t));
                let _ = reply.send(response.map(|response| Answer { response, rtt, id }));
            }
            None => {
                debug!("response for unknown request id {id}");
                break;
            }
        }
        if bad {
            break;
        }
    }
}
