//! The delay controller: how many background bytes may be in flight (the window W), from
//! measured round trips, LEDBAT/Vegas style; and how big a background piece is.
//!
//! Pure and deterministic: no clock and no I/O inside. Every method takes `now` (time since
//! an arbitrary start) and the samples as arguments, so the policy is unit-tested on a
//! simulated link (`delay/tests.rs`).
//!
//! - Samples are round trips of small requests (Ping probes, demand reads of at most
//!   [`SMALL_SAMPLE`] bytes), from the request's write to its response's last byte, of two
//!   kinds ([`Sample`]): a Ping's round trip is the network's and both ends' event loops; a
//!   read's adds the server's read of the file (its disk, its checksum), which is not
//!   queueing but was counted as such when both shared one base (on the 1 Gbit/s link a
//!   cold 4 KiB read takes ~200 µs more than a Ping, so every read looked like a queue over
//!   the target and held the window at its minimum).
//! - Each kind has its own base: the minimum of its samples over the last
//!   [`BASE_WINDOWS`] × [`BASE_WINDOW`] (kept as one minimum per window, so it can rise
//!   again after a route change). A sample's queueing delay is its round trip minus its own
//!   kind's base; q = min of the last [`FILTER`] samples' delays (1: the latest; a
//!   min-filter over 2 hid the reads' tail and let the window grow until the readers' p99
//!   was 5–6× of alone at 1 Gbit/s). The base shown and used for the target is the Pings'.
//! - Readers are active while a demand (or prediction) read was made within
//!   [`READERS_QUIET`]. Target: clamp(base / 2, 125 µs, 5 ms) then; otherwise
//!   clamp(2 × base, 1 ms, 25 ms), but at least one chunk's time on the link (a queue of
//!   whole chunks cannot be kept shorter than one chunk without idling the link, and with
//!   no reader full speed comes first).
//! - Per sample: under target, W += [`GAIN`] × piece × (target − q) / target, at most
//!   doubling per round trip; over target, W ×= 1 − [`BETA`] × min(1, (q − target) /
//!   target), at most once per round trip.
//! - W stays within [W_min, streams × chunk], W_min being two floor pieces (below) while
//!   readers are active (one piece at a time would idle the link through each piece's round
//!   trip, the server's read included) and [`ALONE_MIN_PIECES`] chunks otherwise (the same,
//!   for chunks); it starts at the maximum (no reader: today's behaviour) and drops at once
//!   to [`DROP_PIECES`] pieces when readers become active after a quiet spell (readers
//!   first: no waiting for the samples to tell).
//! - Piece size: a chunk while no reader is active; while readers are, about
//!   [`PIECE_TIME`] (0.5 ms) of link time and at most half the window: clamp(min(peak ×
//!   0.5 ms, W / 2), floor piece, chunk) rounded down to 4 KiB, peak being the highest
//!   delivered rate of the last minute ([`Rate::peak`], the link's capacity as far as
//!   seen). Sized from the current rate instead, pieces grew with the mirror's own speed,
//!   and so did each step of the window: the controller jumped between the window's floor
//!   and the whole link. On a LAN whose base round trip is far below a piece's time on the
//!   wire, one piece in flight keeps the link busy on its own and every read waits behind
//!   it; the window then shrinks below one such piece, and the pieces with it.
//! - The floor piece (and W_min, two of them) is what the link sends in half a background
//!   piece's round trip beyond its own time on the link (R_eff: an EWMA of the pieces' round
//!   trips minus their bytes over the peak rate, while readers are active, once what was in
//!   flight before they came can have drained), within [[`MIN_PIECE`], min(peak ×
//!   [`PIECE_TIME`] / 2, [`MAX_FLOOR_PIECE`])]: two pieces in flight then rarely wait for
//!   each other on the link, and a read waits behind at most [`PIECE_TIME`] of them. Where
//!   R_eff is the network's round trip (fast hosts: the pieces keep the link busy) that is
//!   [`MIN_PIECE`]; where it is both ends' CPUs and the server's disk (two busy cores:
//!   0.5-0.6 ms at 1 Gbit/s), 16 KiB pieces left the link three-fifths idle and the mirror
//!   at 42-46 MB/s beside 4 KiB reads. (Up to peak × [`PIECE_TIME`] for one floor piece,
//!   the pieces' round trips on two busy cores grew with them and the reads' p99 went to
//!   4-8× of alone.)

use std::collections::VecDeque;
use std::time::Duration;

/// Requests up to this many bytes give round-trip samples (their own transfer time is
/// negligible next to the queue).
pub(crate) const SMALL_SAMPLE: u64 = 16 << 10;
/// Length of one window of the base round trip's sliding minimum.
pub(crate) const BASE_WINDOW: Duration = Duration::from_secs(10);
/// Windows kept: the base is the minimum of the last minute.
pub(crate) const BASE_WINDOWS: u64 = 6;
/// Samples in the queueing delay's min-filter (1: the latest sample only).
pub(crate) const FILTER: usize = 1;
/// Readers are active while a demand request was made this recently.
pub(crate) const READERS_QUIET: Duration = Duration::from_secs(1);
/// Window growth per round trip, in pieces, at zero queueing delay.
pub(crate) const GAIN: f64 = 1.0;
/// Multiplicative decrease at (or beyond) twice the target.
pub(crate) const BETA: f64 = 0.5;
/// Pieces the window drops to when readers become active after a quiet spell.
pub(crate) const DROP_PIECES: u64 = 2;
/// The window's minimum with no reader, in chunks.
pub(crate) const ALONE_MIN_PIECES: u64 = 2;
/// Link time of one background piece while readers are active.
pub(crate) const PIECE_TIME: Duration = Duration::from_micros(500);
/// Smallest background piece.
pub(crate) const MIN_PIECE: u64 = 16 << 10;
/// The largest floor piece (see the module docs). Bounded by a quarter millisecond of the
/// peak rate only, the mirror took nearly the whole 1 Gbit/s link beside 4 KiB reads
/// (113-120 MB/s, the reads' p99 6-8× of alone; why the floor grew that far was not looked
/// into); with this bound it behaves as fixed 32 KiB pieces did (63-77 MB/s, p99 about 3×).
const MAX_FLOOR_PIECE: u64 = 32 << 10;
/// Weight of a new piece's round trip in R_eff (see the module docs).
const PIECE_TRIP_ALPHA: f64 = 0.125;
/// Pieces are multiples of this.
const PIECE_ALIGN: u64 = 4 << 10;

/// Target bounds while readers are active.
const ACTIVE_TARGET: (Duration, Duration) = (Duration::from_micros(125), Duration::from_millis(5));
/// The longest chunk time the target with no reader grows to (a bound on a bad rate
/// estimate: beyond it one chunk in flight nearly fills the link anyway).
const MAX_CHUNK_TIME: Duration = Duration::from_secs(1);
/// Target bounds with no reader (the mirror alone).
const ALONE_TARGET: (Duration, Duration) = (Duration::from_millis(1), Duration::from_millis(25));

/// The minimum (or the maximum) of a value over the last [`BASE_WINDOWS`] ×
/// [`BASE_WINDOW`], kept as one extreme per window, so that it can move back after a change
/// (a new route, a slower link).
#[derive(Debug, Clone)]
pub(crate) struct Sliding<T> {
    /// The extreme per window, by window number, oldest first.
    by_window: VecDeque<(u64, T)>,
    /// Which of two values is kept: `min` or `max`.
    keep: fn(T, T) -> T,
}

impl Sliding<Duration> {
    /// A sliding minimum.
    pub(crate) fn min() -> Self {
        Sliding {
            by_window: VecDeque::new(),
            keep: std::cmp::min,
        }
    }
}

impl Sliding<f64> {
    /// A sliding maximum.
    pub(crate) fn max() -> Self {
        Sliding {
            by_window: VecDeque::new(),
            keep: f64::max,
        }
    }
}

impl<T: Copy> Sliding<T> {
    /// `v` was seen at `now`; windows older than the last [`BASE_WINDOWS`] are dropped.
    pub(crate) fn add(&mut self, now: Duration, v: T) {
        let slot = now.as_nanos() as u64 / BASE_WINDOW.as_nanos() as u64;
        match self.by_window.back_mut() {
            Some((s, m)) if *s == slot => *m = (self.keep)(*m, v),
            _ => self.by_window.push_back((slot, v)),
        }
        while self
            .by_window
            .front()
            .is_some_and(|(s, _)| s + BASE_WINDOWS <= slot)
        {
            self.by_window.pop_front();
        }
    }

    /// The extreme over the windows kept (`None`: nothing seen).
    pub(crate) fn get(&self) -> Option<T> {
        self.by_window.iter().map(|(_, m)| *m).reduce(self.keep)
    }
}

/// What a round-trip sample is of: each kind has its own base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sample {
    /// A Ping probe: the network and both ends' event loops.
    Probe = 0,
    /// A small demand read: that plus the server's read of the file (its disk, its
    /// checksum), which is not queueing on the link but is what readers wait for.
    Read = 1,
}

/// The delivered rate: an EWMA of bytes per second over intervals of at least
/// [`Rate::INTERVAL`] while data flows (idle gaps are not counted as slowness).
#[derive(Debug, Clone)]
pub(crate) struct Rate {
    /// Bytes per second; 0 until the first interval ends.
    ewma: f64,
    /// Start of the interval being counted and its bytes.
    start: Option<Duration>,
    bytes: u64,
    /// When bytes last arrived.
    last: Duration,
    /// The highest average of the last minute (the link's capacity as far as seen).
    peak: Sliding<f64>,
}

impl Default for Rate {
    fn default() -> Rate {
        Rate {
            ewma: 0.0,
            start: None,
            bytes: 0,
            last: Duration::ZERO,
            peak: Sliding::max(),
        }
    }
}

impl Rate {
    /// Shortest interval of one rate sample.
    pub(crate) const INTERVAL: Duration = Duration::from_millis(10);
    /// A gap this long without data starts a new interval (shorter gaps are the lumps of
    /// whole responses: a 1 MiB response arrives as one delivery).
    const IDLE: Duration = Duration::from_secs(2);
    /// Weight of a new interval in the average.
    const ALPHA: f64 = 0.25;

    /// `n` bytes were delivered at `now`.
    pub(crate) fn on_bytes(&mut self, now: Duration, n: u64) {
        let start = match self.start {
            Some(s) if now.saturating_sub(self.last) < Self::IDLE => s,
            _ => {
                // After an idle gap the interval starts with this delivery (its bytes
                // took an unknown time to arrive: they are not counted).
                self.start = Some(now);
                self.bytes = 0;
                self.last = now;
                return;
            }
        };
        self.bytes += n;
        self.last = now;
        let span = now.saturating_sub(start);
        if span >= Self::INTERVAL {
            let sample = self.bytes as f64 / span.as_secs_f64();
            self.ewma = if self.ewma == 0.0 {
                sample
            } else {
                self.ewma + Self::ALPHA * (sample - self.ewma)
            };
            self.peak.add(now, self.ewma);
            self.start = Some(now);
            self.bytes = 0;
        }
    }

    /// Bytes per second (0: not known yet).
    pub(crate) fn get(&self) -> f64 {
        self.ewma
    }

    /// The highest rate of the last minute, bytes per second (0: not known yet).
    pub(crate) fn peak(&self) -> f64 {
        self.peak.get().unwrap_or(0.0).max(self.ewma)
    }
}

/// The controller. See the module docs for the policy.
#[derive(Debug, Clone)]
pub(crate) struct DelayController {
    chunk: u64,
    w_max: u64,
    /// The window in bytes (fractional: growth comes in small steps).
    window: f64,
    /// The base round trip of each [`Sample`] kind (a read's round trip includes the
    /// server's service time, which a Ping's does not: that difference is not queueing).
    base: [Sliding<Duration>; 2],
    /// The queueing delays of the last [`FILTER`] samples, each against its own kind's base.
    recent: VecDeque<Duration>,
    last_sample: Option<Duration>,
    last_decrease: Option<Duration>,
    last_demand: Option<Duration>,
    rate: Rate,
    /// R_eff of background pieces (see the module docs), seconds; `None` until measured.
    piece_trip: Option<f64>,
    /// When readers last became active after a quiet spell.
    active_since: Duration,
}

impl DelayController {
    /// A controller for background pieces of at most `chunk` bytes and a window of at most
    /// `w_max` bytes (streams × chunk). It starts at `w_max`.
    pub(crate) fn new(chunk: u64, w_max: u64) -> DelayController {
        let chunk = chunk.max(1);
        let w_max = w_max.max(chunk);
        DelayController {
            chunk,
            w_max,
            window: w_max as f64,
            base: [Sliding::min(), Sliding::min()],
            recent: VecDeque::new(),
            last_sample: None,
            last_decrease: None,
            last_demand: None,
            rate: Rate::default(),
            piece_trip: None,
            active_since: Duration::ZERO,
        }
    }

    /// Whether readers are active: a demand request within [`READERS_QUIET`] of `now`.
    pub(crate) fn readers_active(&self, now: Duration) -> bool {
        self.last_demand
            .is_some_and(|t| now.saturating_sub(t) < READERS_QUIET)
    }

    /// A demand (or prediction) request starts at `now`. After a quiet spell the window
    /// drops at once to [`DROP_PIECES`] pieces.
    pub(crate) fn on_demand(&mut self, now: Duration) {
        let was_active = self.readers_active(now);
        self.last_demand = Some(now);
        if !was_active {
            let floor = (DROP_PIECES * self.piece(now)) as f64;
            self.window = self.window.min(floor);
            self.active_since = now;
        }
    }

    /// A background piece of `bytes` took `rtt` from its request's write to its response's
    /// last byte at `now`: feeds R_eff while readers are active (see the module docs).
    pub(crate) fn on_piece(&mut self, now: Duration, bytes: u64, rtt: Duration) {
        let peak = self.rate.peak();
        if !self.readers_active(now) || peak <= 0.0 {
            return;
        }
        // What was in flight before readers came (up to the whole window of chunks) drains
        // first: pieces that waited behind it say nothing of their own round trip.
        let drain = Duration::from_secs_f64(self.w_max as f64 / peak);
        if now.saturating_sub(self.active_since) < drain {
            return;
        }
        let trip = (rtt.as_secs_f64() - bytes as f64 / peak).max(0.0);
        self.piece_trip = Some(match self.piece_trip {
            Some(t) => t + PIECE_TRIP_ALPHA * (trip - t),
            None => trip,
        });
    }

    /// The smallest piece while readers are active (see the module docs).
    pub(crate) fn floor_piece(&self) -> u64 {
        let peak = self.rate.peak();
        let Some(trip) = self.piece_trip.filter(|_| peak > 0.0) else {
            return MIN_PIECE.min(self.chunk);
        };
        // Two floor pieces, all a read can wait behind at the floor, are at most PIECE_TIME
        // on the link, and [`MAX_FLOOR_PIECE`] each whatever the peak says.
        let most =
            ((peak * PIECE_TIME.as_secs_f64() / 2.0) as u64).clamp(MIN_PIECE, MAX_FLOOR_PIECE);
        // MIN_PIECE is a multiple of PIECE_ALIGN: rounding down keeps p at least MIN_PIECE.
        let p = ((peak * trip / 2.0) as u64).clamp(MIN_PIECE, most) / PIECE_ALIGN * PIECE_ALIGN;
        p.min(self.chunk)
    }

    /// `n` bytes (any class) were delivered at `now`: feeds the rate estimate.
    pub(crate) fn on_delivered(&mut self, now: Duration, n: u64) {
        self.rate.on_bytes(now, n);
    }

    /// A round-trip sample of kind `kind` taken at `now`; updates base, queueing delay and
    /// window.
    pub(crate) fn on_sample(&mut self, now: Duration, kind: Sample, rtt: Duration) {
        let own = &mut self.base[kind as usize];
        own.add(now, rtt);
        let own_base = own.get().unwrap_or(rtt);
        self.recent.push_back(rtt.saturating_sub(own_base));
        if self.recent.len() > FILTER {
            self.recent.pop_front();
        }
        let gap = self.last_sample.map_or(rtt, |t| now.saturating_sub(t));
        self.last_sample = Some(now);

        let base = self.base().unwrap_or(rtt);
        let q = self.queue_delay();
        let target = self.target(now);
        let piece = self.piece(now) as f64;
        let round_trip = (base + q).max(Duration::from_micros(1));
        if q < target {
            let off = (target - q).as_secs_f64() / target.as_secs_f64();
            // At most doubling per round trip (when samples come faster than round trips).
            let trips = (gap.as_secs_f64() / round_trip.as_secs_f64()).min(1.0);
            self.window += (GAIN * piece * off).min(self.window * trips);
        } else if self
            .last_decrease
            .is_none_or(|t| now.saturating_sub(t) >= round_trip)
        {
            let over = ((q - target).as_secs_f64() / target.as_secs_f64()).min(1.0);
            self.window *= 1.0 - BETA * over;
            self.last_decrease = Some(now);
        }
        self.window = self.window.clamp(self.w_min(now) as f64, self.w_max as f64);
    }

    /// The base round trip (`None` before the first sample): the network's, from Pings, or
    /// from small reads until a Ping was answered.
    pub(crate) fn base(&self) -> Option<Duration> {
        let [probe, read] = &self.base;
        probe.get().or_else(|| read.get())
    }

    /// The queueing delay: the min-filtered latest samples, each minus its own kind's base.
    pub(crate) fn queue_delay(&self) -> Duration {
        self.recent.iter().min().copied().unwrap_or_default()
    }

    /// The queueing delay aimed at, at `now` (see the module docs).
    pub(crate) fn target(&self, now: Duration) -> Duration {
        let base = self.base().unwrap_or(Duration::ZERO);
        if self.readers_active(now) {
            (base / 2).clamp(ACTIVE_TARGET.0, ACTIVE_TARGET.1)
        } else {
            let rate = self.rate.get();
            let chunk_time = if rate > 0.0 {
                Duration::from_secs_f64(self.chunk as f64 / rate)
            } else {
                Duration::ZERO
            };
            (base * 2)
                .clamp(ALONE_TARGET.0, ALONE_TARGET.1)
                .max(chunk_time.min(MAX_CHUNK_TIME))
        }
    }

    /// The background piece size at `now`. While readers are active it is about
    /// [`PIECE_TIME`] of link time and never more than half the window: when the queue stays over
    /// the target with the window at one piece (a link whose base round trip is far below a
    /// piece's time on the wire, such as a LAN, where one piece in flight already keeps the
    /// link busy), the pieces shrink with the window, down to [`MIN_PIECE`].
    pub(crate) fn piece(&self, now: Duration) -> u64 {
        if !self.readers_active(now) {
            return self.chunk;
        }
        let bytes = (self.rate.peak() * PIECE_TIME.as_secs_f64()) as u64;
        // At least two pieces fit the window: while one is on the wire the server reads the
        // next, instead of the link idling through each piece's round trip.
        let w = self.window(now) / 2;
        let p = bytes.min(w).min(self.chunk) / PIECE_ALIGN * PIECE_ALIGN;
        p.max(self.floor_piece()).min(self.chunk)
    }

    /// The window: background bytes allowed in flight at `now`.
    pub(crate) fn window(&self, now: Duration) -> u64 {
        (self.window as u64).clamp(self.w_min(now), self.w_max)
    }

    /// The smallest window at `now`: two floor pieces while readers are active (while one
    /// is on the wire, the server reads the next); with none, [`ALONE_MIN_PIECES`] chunks (with a single chunk in flight the link
    /// would idle for a round trip and the server's work between chunks).
    pub(crate) fn w_min(&self, now: Duration) -> u64 {
        if self.readers_active(now) {
            (2 * self.floor_piece()).min(self.chunk)
        } else {
            (ALONE_MIN_PIECES * self.chunk).min(self.w_max)
        }
    }

    /// The delivered rate estimate, bytes per second (0: not known yet).
    pub(crate) fn rate(&self) -> f64 {
        self.rate.get()
    }
}

#[cfg(test)]
mod tests;
