//! The controller on a simulated link: a deterministic, fixed-step simulator of one FIFO
//! bottleneck (a rate and a base round trip) carrying background pieces admitted under the
//! controller's window, and a small demand probe (or read) every tick.

use std::collections::VecDeque;
use std::time::Duration;

use super::super::window::fits;
use super::*;

const CHUNK: u64 = 1 << 20;
const STREAMS: u64 = 8;

/// What sits in the bottleneck queue, or travels to or from it.
#[derive(Debug, Clone, Copy)]
enum Item {
    /// A background piece of `bytes`, admitted at `sent` while the window was `window`.
    Background {
        bytes: u64,
        window: u64,
        sent: Duration,
    },
    /// A small demand request sent at `sent`, of `bytes` (its response's size).
    Demand { sent: Duration, bytes: u64 },
}

/// One demand read (or probe) as it went through the queue.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// When it was sent.
    at: Duration,
    /// Background bytes ahead of it in the queue when its response joined it.
    ahead: u64,
    /// The largest window any of those bytes was admitted under.
    admitted_under: u64,
    /// Its queueing delay (round trip minus the link's base).
    delay: Duration,
}

/// A FIFO bottleneck of `rate` bytes/s between client and server, `base` round trip.
struct Sim {
    rate: f64,
    base: Duration,
    dt: Duration,
    now: Duration,
    ctl: DelayController,
    /// Requests on their way to the server: (arrival, item).
    to_server: VecDeque<(Duration, Item)>,
    /// The bottleneck queue: (bytes left, item).
    queue: VecDeque<(f64, Item)>,
    /// Responses on their way back: (arrival, item).
    to_client: VecDeque<(Duration, Item)>,
    in_flight: u64,
    /// The reader (or prober) sends a small request every `tick`.
    tick: Duration,
    next_tick: Duration,
    reader: bool,
    /// Ahead-of-demand records of the reads in flight: (sent, ahead, admitted_under).
    pending: VecDeque<(Duration, u64, u64)>,
    seen: Vec<Seen>,
    /// The controller's queueing delay after each sample: (when, delay).
    q: Vec<(Duration, Duration)>,
    /// Background bytes delivered.
    delivered: u64,
    /// Window bounds seen: (min over time of window − piece, max window).
    window_ok: bool,
}

impl Sim {
    fn new(rate: f64, base: Duration, tick: Duration) -> Sim {
        Sim {
            rate,
            base,
            dt: Duration::from_micros(10),
            now: Duration::ZERO,
            ctl: DelayController::new(CHUNK, STREAMS * CHUNK),
            to_server: VecDeque::new(),
            queue: VecDeque::new(),
            to_client: VecDeque::new(),
            in_flight: 0,
            tick,
            next_tick: Duration::ZERO,
            reader: false,
            pending: VecDeque::new(),
            seen: Vec::new(),
            q: Vec::new(),
            delivered: 0,
            window_ok: true,
        }
    }

    /// Runs the simulation for `d`; returns the background bytes delivered meanwhile.
    fn run(&mut self, d: Duration) -> u64 {
        let before = self.delivered;
        let end = self.now + d;
        while self.now < end {
            self.step();
        }
        self.delivered - before
    }

    fn step(&mut self) {
        let half = self.base / 2;
        // Requests reaching the server join the queue (the server sends at once).
        while self.to_server.front().is_some_and(|(t, _)| *t <= self.now) {
            let Some((_, item)) = self.to_server.pop_front() else {
                break;
            };
            let bytes = match item {
                Item::Background { bytes, .. } => bytes,
                Item::Demand { sent, bytes } => {
                    let (mut ahead, mut under) = (0.0, 0);
                    for (left, i) in &self.queue {
                        if let Item::Background { window, .. } = i {
                            ahead += left;
                            under = under.max(*window);
                        }
                    }
                    self.pending.push_back((sent, ahead as u64, under));
                    bytes
                }
            };
            self.queue.push_back((bytes as f64, item));
        }
        // The bottleneck serves `rate` bytes per second, in order.
        let mut budget = self.rate * self.dt.as_secs_f64();
        while budget > 0.0 {
            let Some((left, item)) = self.queue.front_mut() else {
                break;
            };
            let n = left.min(budget);
            *left -= n;
            budget -= n;
            if *left <= 0.0 {
                let item = *item;
                self.queue.pop_front();
                self.to_client.push_back((self.now + half, item));
            }
        }
        // Responses reaching the client complete their requests.
        while self.to_client.front().is_some_and(|(t, _)| *t <= self.now) {
            let Some((_, item)) = self.to_client.pop_front() else {
                break;
            };
            match item {
                Item::Background { bytes, sent, .. } => {
                    self.in_flight -= bytes;
                    self.delivered += bytes;
                    self.ctl.on_delivered(self.now, bytes);
                    self.ctl.on_piece(self.now, bytes, self.now - sent);
                }
                Item::Demand { sent, bytes } => {
                    let rtt = self.now - sent;
                    self.ctl.on_delivered(self.now, bytes);
                    self.ctl.on_sample(self.now, Sample::Probe, rtt);
                    self.q.push((self.now, self.ctl.queue_delay()));
                    if let Some((at, ahead, admitted_under)) = self.pending.pop_front() {
                        assert_eq!(at, sent);
                        self.seen.push(Seen {
                            at,
                            ahead,
                            admitted_under,
                            delay: rtt.saturating_sub(self.base),
                        });
                    }
                }
            }
        }
        // The reader's read (or the prober's Ping) of this tick.
        if self.now >= self.next_tick {
            self.next_tick += self.tick;
            let bytes = if self.reader {
                self.ctl.on_demand(self.now);
                4096
            } else {
                64
            };
            let item = Item::Demand {
                sent: self.now,
                bytes,
            };
            self.to_server.push_back((self.now + half, item));
        }
        // Background pieces, as the window admits them.
        loop {
            let (piece, window) = (self.ctl.piece(self.now), self.ctl.window(self.now));
            self.window_ok &=
                piece <= window && self.ctl.w_min(self.now) <= window && window <= STREAMS * CHUNK;
            if !fits(self.in_flight, piece, window) {
                break;
            }
            self.in_flight += piece;
            let item = Item::Background {
                bytes: piece,
                window,
                sent: self.now,
            };
            self.to_server.push_back((self.now + half, item));
        }
        self.now += self.dt;
    }

    /// The demand reads sent in `from..to`.
    fn reads(&self, from: Duration, to: Duration) -> impl Iterator<Item = &Seen> {
        self.seen.iter().filter(move |s| s.at >= from && s.at < to)
    }

    fn median_delay(&self, from: Duration, to: Duration) -> Duration {
        let mut d: Vec<Duration> = self.reads(from, to).map(|s| s.delay).collect();
        assert!(!d.is_empty());
        d.sort();
        d[d.len() / 2]
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Mirror alone, then a reader, then the mirror alone again, on a link of `rate` bytes/s
/// and `base` round trip; checks convergence, back-off, recovery and the window's bounds.
fn three_phases(rate: f64, base: Duration, phase: f64) {
    let tick = (base * 2).clamp(Duration::from_millis(1), Duration::from_millis(100));
    let mut sim = Sim::new(rate, base, tick);
    let p = secs(phase);

    // 1. Mirror alone: the link is full, the queue bounded near the target.
    sim.run(p / 2);
    let alone = sim.run(p / 2) as f64 / (phase / 2.0);
    assert!(
        alone >= 0.9 * rate,
        "mirror alone: {alone:.0} B/s of {rate}"
    );
    let target = sim.ctl.target(sim.now);
    let q = sim.median_delay(p / 2, p);
    assert!(
        q <= target * 2,
        "mirror alone: median queueing delay {q:?}, target {target:?}"
    );
    assert!(sim.ctl.window(sim.now) < STREAMS * CHUNK, "no bloat");

    // 2. A reader: the window drops at once; its reads' delay falls under the reader's
    // target within a few round trips of the queue draining.
    sim.reader = true;
    let start = sim.now;
    let drain = Duration::from_secs_f64(sim.in_flight as f64 / rate);
    let during = sim.run(p) as f64 / phase;
    let target = sim.ctl.target(sim.now);
    let piece = sim.ctl.piece(sim.now);
    let piece_time = Duration::from_secs_f64(piece as f64 / rate);
    // The controller sees the queue under the reader's target within a few round trips
    // (probe ticks) once what was in flight before the reader came has drained.
    let under = sim
        .q
        .iter()
        .find(|(t, q)| *t >= start && *q <= target)
        .map(|(t, _)| *t - start);
    let few = drain + (base + tick) * 5;
    assert!(
        under.is_some_and(|u| u <= few),
        "queueing delay under {target:?} after {under:?}, drain {drain:?}"
    );
    let settled = start + drain + base * 10 + tick * 10;
    let q = sim.median_delay(settled, sim.now);
    assert!(
        q <= target + piece_time,
        "with a reader: median queueing delay {q:?}, target {target:?}, piece {piece}"
    );
    assert!(
        during >= 0.5 * rate,
        "with a reader the mirror still moves: {during:.0} B/s of {rate}"
    );
    // What a read waits behind is at most the window its bytes were admitted under, and
    // once the queue has drained, the reader's windows are small.
    for s in sim.reads(settled, sim.now) {
        assert!(s.ahead <= s.admitted_under, "{s:?}");
        assert!(s.admitted_under <= STREAMS * CHUNK / 4, "{s:?}");
    }

    // 3. The reader goes away: the window grows back and the link is full again.
    let reader_window = sim.ctl.window(sim.now);
    sim.reader = false;
    sim.run(p / 2);
    let after = sim.run(p / 2) as f64 / (phase / 2.0);
    assert!(
        after >= 0.9 * rate,
        "after the reader: {after:.0} B/s of {rate}"
    );
    assert!(
        sim.ctl.window(sim.now) > reader_window,
        "the window grew back"
    );

    assert!(sim.window_ok, "the window left [W_min, streams × chunk]");
    for s in &sim.seen {
        assert!(s.ahead <= s.admitted_under.max(CHUNK), "{s:?}");
    }
}

#[test]
fn a_1gbit_lan_converges_backs_off_for_a_reader_and_recovers() {
    three_phases(125e6, Duration::from_micros(200), 4.0);
}

#[test]
fn a_wan_converges_backs_off_for_a_reader_and_recovers() {
    three_phases(12.5e6, Duration::from_millis(50), 20.0);
}

#[test]
fn a_demand_read_never_waits_behind_more_than_the_background_window() {
    let mut sim = Sim::new(125e6, Duration::from_micros(200), Duration::from_millis(1));
    sim.reader = true;
    sim.run(secs(2.0));
    assert!(!sim.seen.is_empty());
    for s in &sim.seen {
        // Each byte ahead was admitted while the window allowed it.
        assert!(s.ahead <= s.admitted_under, "{s:?}");
    }
    let w = sim.ctl.window(sim.now);
    assert!(w <= 4 * sim.ctl.piece(sim.now), "window {w}");
}

#[test]
fn the_window_drops_at_once_when_a_reader_starts_after_a_quiet_spell() {
    let mut c = DelayController::new(CHUNK, STREAMS * CHUNK);
    assert_eq!(c.window(Duration::ZERO), STREAMS * CHUNK);
    c.on_demand(secs(1.0));
    assert_eq!(c.window(secs(1.0)), DROP_PIECES * c.piece(secs(1.0)));
    assert_eq!(c.piece(secs(1.0)), MIN_PIECE, "no rate known yet");
    // A second read within the quiet time does not drop it again.
    c.on_sample(secs(1.1), Sample::Probe, Duration::from_micros(200));
    let w = c.window(secs(1.2));
    c.on_demand(secs(1.2));
    assert_eq!(c.window(secs(1.2)), w);
    // No reader for a while: pieces are chunks again, and so is the window's minimum.
    assert_eq!(c.piece(secs(3.0)), CHUNK);
    assert!(c.window(secs(3.0)) >= ALONE_MIN_PIECES * CHUNK);
}

#[test]
fn the_base_is_a_sliding_minimum_that_can_rise_again() {
    let mut c = DelayController::new(CHUNK, STREAMS * CHUNK);
    c.on_sample(secs(1.0), Sample::Probe, Duration::from_millis(5));
    c.on_sample(secs(2.0), Sample::Probe, Duration::from_millis(9));
    assert_eq!(c.base(), Some(Duration::from_millis(5)));
    assert_eq!(
        c.queue_delay(),
        Duration::from_millis(4),
        "the latest sample above the base"
    );
    // A route change: a minute later only the new, longer round trips count.
    for i in 0..80 {
        c.on_sample(
            secs(3.0 + f64::from(i)),
            Sample::Probe,
            Duration::from_millis(20),
        );
    }
    assert_eq!(c.base(), Some(Duration::from_millis(20)));
}

#[test]
fn piece_size_is_about_half_a_millisecond_of_link_time_while_readers_are_active() {
    let mut c = DelayController::new(CHUNK, STREAMS * CHUNK);
    // 100 MB/s delivered.
    for i in 0..200u64 {
        c.on_delivered(Duration::from_millis(i), 100_000);
    }
    assert!((c.rate() - 1e8).abs() < 1e6, "{}", c.rate());
    let now = Duration::from_millis(200);
    assert_eq!(c.piece(now), CHUNK, "no reader: whole chunks");
    c.on_demand(now);
    let p = c.piece(now);
    assert_eq!(p % 4096, 0);
    assert!((45_000..=50_000).contains(&p), "{p}");
}

#[test]
fn pieces_follow_the_links_peak_rate_not_the_mirrors_current_one() {
    let mut c = DelayController::new(CHUNK, STREAMS * CHUNK);
    // 100 MB/s for 0.2 s, then 10 MB/s for 2 s (the mirror held back beside a reader).
    for i in 0..200u64 {
        c.on_delivered(Duration::from_millis(i), 100_000);
    }
    for i in 200..2200u64 {
        c.on_delivered(Duration::from_millis(i), 10_000);
    }
    assert!(c.rate() < 2e7, "the current rate fell: {}", c.rate());
    let now = Duration::from_millis(2200);
    c.on_demand(now);
    let p = c.piece(now);
    assert!(
        (45_000..=50_000).contains(&p),
        "pieces of the peak's 0.5 ms: {p}"
    );
    // A minute later the old peak is gone.
    let mut t = 2200u64;
    while t < 80_000 {
        c.on_delivered(Duration::from_millis(t), 10_000);
        t += 1;
    }
    let now = Duration::from_millis(t);
    c.on_demand(now);
    let p = c.piece(now);
    assert_eq!(
        p, MIN_PIECE,
        "the peak slid away: 10 MB/s × 0.5 ms is under the floor"
    );
}

#[test]
fn a_reads_service_time_is_not_queueing_but_its_tail_is() {
    let mut c = DelayController::new(CHUNK, STREAMS * CHUNK);
    let ping = Duration::from_micros(30);
    // A cold 4 KiB read: the server's disk adds 200 µs to every one of them.
    let read = Duration::from_micros(230);
    c.on_demand(secs(1.0));
    c.on_sample(secs(1.0), Sample::Probe, ping);
    c.on_sample(secs(1.0), Sample::Read, read);
    let floor = c.window(secs(1.0));
    let mut t = 1.0;
    for _ in 0..200 {
        t += 0.0005;
        c.on_demand(secs(t));
        c.on_sample(secs(t), Sample::Probe, ping);
        t += 0.0005;
        c.on_sample(secs(t), Sample::Read, read);
        assert_eq!(c.queue_delay(), Duration::ZERO, "at {t}");
    }
    let grown = c.window(secs(t));
    assert!(grown > 4 * floor, "the window grew: {floor} → {grown}");
    assert_eq!(c.base(), Some(ping), "the base shown is the Pings'");
    // Reads that now take 1 ms longer than their base: a queue, at once.
    t += 0.001;
    c.on_sample(secs(t), Sample::Read, read + Duration::from_millis(1));
    assert_eq!(c.queue_delay(), Duration::from_millis(1));
    assert!(c.window(secs(t)) <= grown / 2, "it shrank by half");
}

#[test]
fn a_lan_whose_round_trip_is_far_below_a_piece_time_backs_off_for_a_reader() {
    // The emulated 1 Gbit/s link measures a 28 µs base round trip: a 0.5 ms piece alone keeps
    // the link busy there, so the window has to go below one such piece.
    three_phases(125e6, Duration::from_micros(30), 4.0);
}

#[test]
fn the_floor_piece_is_what_the_link_sends_in_half_a_pieces_round_trip_beyond_its_own_time() {
    let mut c = DelayController::new(CHUNK, STREAMS * CHUNK);
    // A 1 Gbit/s link seen at its peak; a reader active.
    for i in 0..200u64 {
        c.on_delivered(Duration::from_millis(i), 125_000);
    }
    c.on_demand(Duration::from_millis(200));
    // Pieces still behind the window of chunks in flight before: not counted.
    c.on_piece(
        Duration::from_millis(210),
        MIN_PIECE,
        Duration::from_millis(10),
    );
    assert_eq!(c.floor_piece(), MIN_PIECE, "no piece's round trip yet");
    // The window's chunks drained (8 MiB at 125 MB/s: 67 ms).
    let now = Duration::from_millis(280);
    c.on_demand(now);
    let on_link = |bytes: u64| Duration::from_secs_f64(bytes as f64 / 125e6);
    // Pieces that come back a network round trip after their time on the link (fast hosts,
    // the link kept busy): the floor stays the smallest piece.
    for _ in 0..100 {
        c.on_piece(
            now,
            MIN_PIECE,
            Duration::from_micros(30) + on_link(MIN_PIECE),
        );
    }
    assert_eq!(c.floor_piece(), MIN_PIECE);
    // Pieces that take 0.4 ms beyond their time on the link (both ends' CPUs, the server's
    // disk): two in flight leave the link idle most of the time, so the floor grows to
    // what it sends in 0.2 ms (25 kB), in 4 KiB steps, and the window's floor with it.
    for _ in 0..100 {
        c.on_piece(
            now,
            MIN_PIECE,
            Duration::from_micros(400) + on_link(MIN_PIECE),
        );
    }
    assert_eq!(c.floor_piece(), 24 << 10);
    assert_eq!(c.w_min(now), 48 << 10);
    // A server that takes 10 ms: two floor pieces never more than 0.5 ms on the link.
    for _ in 0..100 {
        c.on_piece(now, MIN_PIECE, Duration::from_millis(10));
    }
    assert_eq!(c.floor_piece(), 28 << 10, "31.25 kB, in 4 KiB steps");
    // The mirror alone: round trips of whole chunks say nothing about the floor.
    let quiet = now + READERS_QUIET * 2;
    let before = c.floor_piece();
    c.on_piece(quiet, CHUNK, Duration::from_micros(50));
    assert_eq!(c.floor_piece(), before);
}

#[test]
fn at_its_floor_the_window_holds_two_pieces_so_the_server_works_while_the_link_sends() {
    let mut c = DelayController::new(CHUNK, STREAMS * CHUNK);
    // A 1 Gbit/s link seen at its peak: pieces of 0.5 ms would be about 60 KiB.
    for i in 0..200u64 {
        c.on_delivered(Duration::from_millis(i), 125_000);
    }
    let mut now = Duration::from_millis(200);
    c.on_demand(now);
    c.on_sample(now, Sample::Probe, Duration::from_micros(30));
    // Then every sample far over the target: the window falls to its floor.
    for _ in 0..200 {
        now += Duration::from_millis(5);
        c.on_demand(now);
        c.on_sample(now, Sample::Probe, Duration::from_millis(3));
    }
    let (w, p) = (c.window(now), c.piece(now));
    assert_eq!(w, c.w_min(now), "at the floor");
    assert_eq!(p, MIN_PIECE);
    assert!(w >= 2 * p, "window {w}, piece {p}: two in flight");
}
