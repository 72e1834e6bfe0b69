//! The fetch scheduler: what each request may do, how big a background piece is, which
//! stream carries it, and how many bytes each class may have in flight. It never sends
//! anything itself (but for its probes, `schedule/probe.rs`).
//!
//! Classes ([`Class`]): demand (a reader waits now) before prediction (read-ahead) before
//! background (the mirror). A call takes its place through [`Schedule::assign`], which
//! returns an [`Assignment`]: the stream's current connection, holding the request's share
//! of the stream's load (and, for background work, of the background budgets) until it is
//! dropped — however the call ends, cancellation included.
//!
//! Policy:
//! - Demand and prediction requests go to the live stream with the least outstanding
//!   bytes; ties rotate. Each marks readers active for `delay::READERS_QUIET` (1 s).
//! - A background request first waits for room in the total background window W
//!   (`schedule/window.rs`), then for room in its stream's budget — one chunk's worth, so a
//!   demand read waits behind at most one background chunk on its stream. While readers
//!   are active, background requests use only the first half of the streams, leaving the
//!   others to readers; among those it picks the stream with the most budget left, then
//!   the least load.
//! - W comes from the delay controller (`schedule/delay.rs`), fed with round trips of
//!   Pings and small demand reads (measured by `pool/conn.rs`) and with delivered bytes.
//!   While background requests are in flight, a probe (`schedule/probe.rs`) pings the
//!   least-loaded stream every clamp(2 × base, 1 ms, 100 ms).
//! - Where the CPUs rather than the link are the limit (loopback, a fast LAN beside a
//!   small host), a window of even one small piece lets the mirror take the CPU readers
//!   need: while a reader read within the last 10 s and this process's foreground threads
//!   wait for a CPU, background requests are also paced (`schedule/cpu.rs`, sampled by the
//!   prober), down to a trickle; with no read for 10 s there is no pace.
//! - Background reads larger than the piece size ([`Schedule::piece`]: a chunk with no
//!   reader, ≈0.5 ms of link time while readers are active) are fetched as several pieces
//!   (`pool/calls.rs`).
//!
//! Invariants: background bytes in flight never exceed W when a request is admitted
//! (except one request alone); no stream carries more than one chunk of background bytes;
//! demand and prediction requests never wait for the schedule. So a demand read waits on
//! the wire behind at most W background bytes (and the server writes its response before
//! queued background ones when the session has the PRIORITY feature).
//!
//! Load is counted in bytes asked for: a read counts its length, any other request 4 KiB.

mod cpu;
mod delay;
pub(super) mod probe;
mod window;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_proto::{Class, Request};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::conn::Conn;
use crate::error::ClientError;
use cpu::CpuPace;
use delay::DelayController;
pub(crate) use delay::{Sample, SMALL_SAMPLE};
pub(super) use probe::run as run_probes;
use window::{BackgroundWindow, WindowPermit};

/// Weight of a request that is not a read.
const SMALL_REQUEST: u64 = 4096;

/// What the scheduler is doing now ([`super::Client::scheduler_stats`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerStats {
    /// The base round trip: the minimum of the last minute (zero before the first sample).
    pub base_rtt: Duration,
    /// The queueing delay: recent round trips above the base.
    pub queue_delay: Duration,
    /// The queueing delay the background window aims at.
    pub target: Duration,
    /// Background bytes allowed in flight (W).
    pub background_window: u64,
    /// Background bytes in flight now.
    pub background_in_flight: u64,
    /// Size of a background piece now.
    pub piece_size: u64,
    /// Delivered bytes per second (EWMA over all classes; 0 until known).
    pub rate: u64,
    /// Bytes received (decoded) for demand reads.
    pub demand_bytes: u64,
    /// Bytes received (decoded) for prediction reads (read-ahead).
    pub prediction_bytes: u64,
    /// Bytes received (decoded) for background reads (the mirror).
    pub background_bytes: u64,
    /// Whether readers are active (a demand or prediction read within the last second; a stat or listing alone does not count).
    pub readers_active: bool,
    /// How long this process's foreground threads (normal priority) waited for a CPU over
    /// the last 100 ms, as a share of it, summed over the threads (`None`: not measured, as
    /// while no background work is in flight).
    pub cpu_wait: Option<f64>,
    /// Background bytes per second allowed while readers are short of CPU (`None`: no
    /// pace).
    pub background_pace: Option<u64>,
}

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
    /// Reference point of the controller's clock.
    started: Instant,
    /// Each stream's background budget in bytes (one chunk).
    background_budget: usize,
    /// Demand and prediction requests assigned and not yet answered.
    foreground_in_flight: AtomicUsize,
    /// The total background window's admission.
    window: BackgroundWindow,
    controller: Mutex<DelayController>,
    /// The background's pace while readers are short of CPU.
    cpu: Mutex<CpuPace>,
    /// When the next paced background request may be admitted (time since `started`);
    /// held, in arrival order, by the request waiting for its turn.
    paced: tokio::sync::Mutex<Duration>,
    /// Decoded bytes received, by class (demand, prediction, background).
    received: [AtomicU64; 3],
}

/// A request's place on a stream; gives its load (and background budgets) back when
/// dropped.
pub(super) struct Assignment<'a> {
    /// The connection to send on.
    pub(super) conn: Arc<Conn>,
    load: &'a AtomicU64,
    weight: u64,
    _background: Option<(WindowPermit<'a>, OwnedSemaphorePermit)>,
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
    /// Streams over these connections, each allowed `chunk` bytes of background requests
    /// in flight, all of them together at most a window the controller sets (at most
    /// streams × chunk).
    pub(super) fn new(conns: Vec<Conn>, chunk: usize) -> Schedule {
        let slots: Vec<Slot> = conns
            .into_iter()
            .map(|c| Slot {
                conn: Mutex::new(Arc::new(c)),
                load: AtomicU64::new(0),
                background: Arc::new(Semaphore::new(chunk)),
                reconnecting: AtomicBool::new(false),
            })
            .collect();
        let w_max = (chunk * slots.len().max(1)) as u64;
        Schedule {
            slots,
            next: AtomicUsize::new(0),
            started: Instant::now(),
            background_budget: chunk,
            foreground_in_flight: AtomicUsize::new(0),
            window: BackgroundWindow::default(),
            controller: Mutex::new(DelayController::new(chunk as u64, w_max)),
            cpu: Mutex::default(),
            paced: tokio::sync::Mutex::new(Duration::ZERO),
            received: Default::default(),
        }
    }

    /// The streams, in slot order.
    pub(super) fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The controller's clock: time since the schedule started.
    fn now(&self) -> Duration {
        self.started.elapsed()
    }

    fn controller(&self) -> std::sync::MutexGuard<'_, DelayController> {
        self.controller.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Background bytes in flight on each stream (each at most one chunk).
    pub(super) fn background_in_flight(&self) -> Vec<u64> {
        let budget = self.background_budget;
        self.slots
            .iter()
            .map(|s| budget.saturating_sub(s.background.available_permits()) as u64)
            .collect()
    }

    /// Chooses the stream for `request` of class `class` and takes its place there; a
    /// background request may wait for room in the background window and in its stream's
    /// background budget.
    ///
    /// # Errors
    /// [`ClientError::ConnectionLost`]: no stream is connected.
    pub(super) async fn assign(
        &self,
        request: &Request,
        class: Class,
    ) -> Result<Assignment<'_>, ClientError> {
        let weight = match request {
            Request::Read { len, .. } => u64::from(*len),
            _ => SMALL_REQUEST,
        };
        let (slot, conn, background) = if class == Class::Background {
            self.pace(weight).await;
            let w = self.controller().window(self.now());
            let room = self.window.admit(weight, w).await;
            let (slot, conn) = self.pick_background()?;
            let budget = self.background_budget as u64;
            let units = weight.clamp(SMALL_REQUEST, budget) as u32;
            let permit = slot
                .background
                .clone()
                .acquire_many_owned(units)
                .await
                .map_err(|_| ClientError::ConnectionLost)?;
            (slot, conn, Some((room, permit)))
        } else {
            let w = {
                let mut c = self.controller();
                // Reads make readers active; a lone stat or listing (`ls`, `ferry status`)
                // goes first on the wire anyway and must not collapse the window for the
                // seconds it takes to grow back on a long link.
                if matches!(request, Request::Read { .. }) {
                    c.on_demand(self.now());
                    self.cpu().on_read(self.now());
                }
                c.window(self.now())
            };
            self.window.set_window(w);
            let (slot, conn) = self.pick()?;
            (slot, conn, None)
        };
        slot.load.fetch_add(weight, Ordering::Relaxed);
        let foreground = background.is_none().then(|| {
            self.foreground_in_flight.fetch_add(1, Ordering::Relaxed);
            &self.foreground_in_flight
        });
        Ok(Assignment {
            conn,
            load: &slot.load,
            weight,
            _background: background,
            foreground,
        })
    }

    /// Waits for a background request's turn under the CPU pace, if there is one: paced
    /// requests go one after the other, `bytes / pace` apart. The pace is looked at again
    /// at least every [`cpu::INTERVAL`], so a lifted pace frees the waiters at once.
    async fn pace(&self, bytes: u64) {
        if self.background_pace().is_none() {
            return;
        }
        let mut next = self.paced.lock().await;
        loop {
            let Some(pace) = self.background_pace() else {
                return;
            };
            let now = self.now();
            if now >= *next {
                *next = now + Duration::from_secs_f64(bytes as f64 / pace);
                return;
            }
            tokio::time::sleep((*next - now).min(cpu::INTERVAL)).await;
        }
    }

    /// Background bytes per second allowed now (`None`: no pace).
    fn background_pace(&self) -> Option<f64> {
        self.cpu().pace(self.now())
    }

    fn cpu(&self) -> std::sync::MutexGuard<'_, CpuPace> {
        self.cpu.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the prober should sample the foreground threads' wait now (a reader read
    /// recently); see `cpu.rs`.
    pub(super) fn wants_cpu_samples(&self) -> bool {
        let now = self.now();
        self.cpu().wants_samples(now)
    }

    /// A sample of the foreground threads' total wait for a CPU (the prober's, every
    /// [`cpu::INTERVAL`] while background work is in flight).
    pub(super) fn on_cpu_sample(&self, waited: Duration) {
        let now = self.now();
        self.cpu().on_sample(now, waited);
    }

    /// A round-trip sample (a Ping, or a small demand read).
    pub(super) fn on_sample(&self, kind: Sample, rtt: Duration) {
        let w = {
            let mut c = self.controller();
            c.on_sample(self.now(), kind, rtt);
            c.window(self.now())
        };
        self.window.set_window(w);
    }

    /// A background read of `bytes` took `rtt` (from its write to its last byte).
    pub(super) fn on_piece(&self, bytes: u64, rtt: Duration) {
        let w = {
            let mut c = self.controller();
            let now = self.now();
            c.on_piece(now, bytes, rtt);
            c.window(now)
        };
        self.window.set_window(w);
    }

    /// `n` decoded bytes were received for a read of class `class`.
    pub(super) fn on_delivered(&self, class: Class, n: u64) {
        self.received[class as usize].fetch_add(n, Ordering::Relaxed);
        let now = self.now();
        self.controller().on_delivered(now, n);
        if class == Class::Background {
            self.cpu().on_background(now, n);
        }
    }

    /// The size of a background piece now: background reads larger than this are fetched
    /// as several pieces.
    pub(super) fn piece(&self) -> u64 {
        self.controller().piece(self.now())
    }

    /// How often the prober pings while background work is in flight:
    /// clamp(2 × base, 1 ms, 100 ms).
    fn probe_interval(&self) -> Duration {
        let base = self
            .controller()
            .base()
            .unwrap_or(Duration::from_millis(10));
        (base * 2).clamp(Duration::from_millis(1), Duration::from_millis(100))
    }

    /// What the scheduler is doing now.
    pub(super) fn stats(&self) -> SchedulerStats {
        let now = self.now();
        let (cpu_wait, background_pace) = {
            let cpu = self.cpu();
            (cpu.wait(), cpu.pace(now).map(|p| p as u64))
        };
        let c = self.controller();
        let received = |i: usize| self.received[i].load(Ordering::Relaxed);
        SchedulerStats {
            base_rtt: c.base().unwrap_or_default(),
            queue_delay: c.queue_delay(),
            target: c.target(now),
            background_window: c.window(now),
            background_in_flight: self.window.in_flight(),
            piece_size: c.piece(now),
            rate: c.rate() as u64,
            demand_bytes: received(0),
            prediction_bytes: received(1),
            background_bytes: received(2),
            readers_active: c.readers_active(now),
            cpu_wait,
            background_pace,
        }
    }

    /// Picks the live stream with the least outstanding bytes; ties rotate.
    pub(super) fn pick(&self) -> Result<(&Slot, Arc<Conn>), ClientError> {
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

    /// Demand and prediction requests sent and not yet answered (readers waiting now).
    pub(super) fn foreground_in_flight(&self) -> usize {
        self.foreground_in_flight.load(Ordering::Relaxed)
    }

    /// Whether readers are active: a demand or prediction request within the last
    /// second.
    pub(super) fn foreground_active(&self) -> bool {
        self.controller().readers_active(self.now())
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
