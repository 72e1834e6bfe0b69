//! Stream choice: which of the pool's streams carries each request.
//!
//! This module decides, per request, the stream it goes on and how long it may have to
//! wait for room there; it never sends anything. Its one entry point is
//! [`Schedule::assign`], which returns an [`Assignment`]: the stream's current connection,
//! holding the request's share of the stream's load (and, for background work, of its
//! background budget) until it is dropped — however the call ends, cancellation included.
//!
//! Policy:
//! - A foreground request (a reader waits for it) goes to the live stream with the least
//!   outstanding bytes; ties rotate.
//! - A background request (a mirror filling a local copy) first takes room in its stream's
//!   background budget — one chunk's worth — so a foreground read waits behind at most one
//!   background chunk on its stream. While foreground requests are being made (one within
//!   [`FOREGROUND_QUIET`]), background requests use only the first half of the streams,
//!   leaving the others to readers; among those it picks the stream with the most budget
//!   left, then the least load.
//!
//! Load is counted in bytes asked for: a read counts its length, any other request 4 KiB.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_proto::Request;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::conn::Conn;
use crate::error::ClientError;

/// How long after a foreground request background requests keep to their half of the
/// streams.
pub(super) const FOREGROUND_QUIET: Duration = Duration::from_secs(1);

/// Weight of a request that is not a read.
const SMALL_REQUEST: u64 = 4096;

/// One of the pool's streams: its current connection (replaced when it is reconnected)
/// and what outlives connections.
pub(super) struct Slot {
    pub(super) conn: Mutex<Arc<Conn>>,
    /// Bytes requested and not yet answered: the scheduling load.
    load: AtomicU64,
    /// Bytes of background requests in flight allowed (one chunk's worth).
    background: Arc<Semaphore>,
    /// A reconnect task is running for this slot.
    pub(super) reconnecting: AtomicBool,
}

impl Slot {
    /// The stream's connection now.
    pub(super) fn current(&self) -> Arc<Conn> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether its connection is up.
    pub(super) fn alive(&self) -> bool {
        self.current().alive.load(Ordering::Relaxed)
    }
}

/// The pool's streams and what the choice among them depends on.
pub(super) struct Schedule {
    slots: Vec<Slot>,
    /// Rotates the starting point of each choice, so ties spread.
    next: AtomicUsize,
    /// Reference point of `last_foreground`.
    started: Instant,
    /// When the last foreground request was assigned (ms since `started`, plus one; 0: never).
    last_foreground: AtomicU64,
    /// Each stream's background budget in bytes (one chunk).
    background_budget: usize,
    /// Foreground requests assigned and not yet answered.
    foreground_in_flight: AtomicUsize,
}

/// A request's place on a stream; gives its load (and background budget) back when dropped.
pub(super) struct Assignment<'a> {
    /// The connection to send on.
    pub(super) conn: Arc<Conn>,
    load: &'a AtomicU64,
    weight: u64,
    _background: Option<OwnedSemaphorePermit>,
    /// The schedule's count of foreground requests in flight, for foreground requests.
    foreground: Option<&'a AtomicUsize>,
}

impl Drop for Assignment<'_> {
    fn drop(&mut self) {
        self.load.fetch_sub(self.weight, Ordering::Relaxed);
        if let Some(n) = self.foreground {
            n.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Schedule {
    /// Streams over these connections, each allowed `background_budget` bytes of
    /// background requests in flight.
    pub(super) fn new(conns: Vec<Conn>, background_budget: usize) -> Schedule {
        let slots = conns
            .into_iter()
            .map(|c| Slot {
                conn: Mutex::new(Arc::new(c)),
                load: AtomicU64::new(0),
                background: Arc::new(Semaphore::new(background_budget)),
                reconnecting: AtomicBool::new(false),
            })
            .collect();
        Schedule {
            slots,
            next: AtomicUsize::new(0),
            started: Instant::now(),
            last_foreground: AtomicU64::new(0),
            background_budget,
            foreground_in_flight: AtomicUsize::new(0),
        }
    }

    /// The streams, in slot order.
    pub(super) fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Background bytes in flight on each stream (each at most one chunk).
    pub(super) fn background_in_flight(&self) -> Vec<u64> {
        let budget = self.background_budget;
        self.slots
            .iter()
            .map(|s| budget.saturating_sub(s.background.available_permits()) as u64)
            .collect()
    }

    /// Chooses the stream for `request` and takes its place there; a background request
    /// may wait for room in its stream's background budget.
    ///
    /// # Errors
    /// [`ClientError::ConnectionLost`]: no stream is connected.
    pub(super) async fn assign(
        &self,
        request: &Request,
        background: bool,
    ) -> Result<Assignment<'_>, ClientError> {
        let weight = match request {
            Request::Read { len, .. } => u64::from(*len),
            _ => SMALL_REQUEST,
        };
        let (slot, conn, permit) = if background {
            let (slot, conn) = self.pick_background()?;
            let budget = self.background_budget as u64;
            let units = weight.clamp(SMALL_REQUEST, budget) as u32;
            let permit = slot
                .background
                .clone()
                .acquire_many_owned(units)
                .await
                .map_err(|_| ClientError::ConnectionLost)?;
            (slot, conn, Some(permit))
        } else {
            self.last_foreground.store(self.now_ms(), Ordering::Relaxed);
            let (slot, conn) = self.pick()?;
            (slot, conn, None)
        };
        slot.load.fetch_add(weight, Ordering::Relaxed);
        let foreground = permit.is_none().then(|| {
            self.foreground_in_flight.fetch_add(1, Ordering::Relaxed);
            &self.foreground_in_flight
        });
        Ok(Assignment {
            conn,
            load: &slot.load,
            weight,
            _background: permit,
            foreground,
        })
    }

    /// Picks the live stream with the least outstanding bytes; ties rotate.
    fn pick(&self) -> Result<(&Slot, Arc<Conn>), ClientError> {
        let slots = &self.slots;
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(&Slot, Arc<Conn>, u64)> = None;
        for i in 0..slots.len() {
            let s = &slots[(start + i) % slots.len()];
            let c = s.current();
            if !c.alive.load(Ordering::Relaxed) {
                continue;
            }
            let load = s.load.load(Ordering::Relaxed);
            if best.as_ref().is_none_or(|(_, _, l)| load < *l) {
                best = Some((s, c, load));
            }
        }
        best.map(|(s, c, _)| (s, c))
            .ok_or(ClientError::ConnectionLost)
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64 + 1
    }

    /// Foreground requests sent and not yet answered (readers waiting now).
    pub(super) fn foreground_in_flight(&self) -> usize {
        self.foreground_in_flight.load(Ordering::Relaxed)
    }

    /// Whether a foreground request was made within [`FOREGROUND_QUIET`].
    pub(super) fn foreground_active(&self) -> bool {
        let last = self.last_foreground.load(Ordering::Relaxed);
        last != 0 && self.now_ms().saturating_sub(last) < FOREGROUND_QUIET.as_millis() as u64
    }

    /// Picks a stream for a background request: among the streams background work may use
    /// now, the live one with the most background budget left (ties: least load).
    fn pick_background(&self) -> Result<(&Slot, Arc<Conn>), ClientError> {
        let slots = &self.slots;
        let usable = if self.foreground_active() {
            slots.len().div_ceil(2)
        } else {
            slots.len()
        };
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(&Slot, Arc<Conn>, usize, u64)> = None;
        for i in 0..usable {
            let s = &slots[(start + i) % usable];
            let c = s.current();
            if !c.alive.load(Ordering::Relaxed) {
                continue;
            }
            let free = s.background.available_permits();
            let load = s.load.load(Ordering::Relaxed);
            if best
                .as_ref()
                .is_none_or(|(_, _, f, l)| free > *f || (free == *f && load < *l))
            {
                best = Some((s, c, free, load));
            }
        }
        match best {
            Some((s, c, _, _)) => Ok((s, c)),
            // The background half is gone: any live stream will do.
            None => self.pick(),
        }
    }
}
