//! The CPU pace: how fast background bytes may be admitted while readers are active and the
//! machine's CPUs, not the link, are the limit.
//!
//! The delay controller (`delay.rs`) sees the link's queue. Where the link outruns the
//! machine (loopback, a fast LAN beside a small host) the queue that readers wait in is the
//! CPUs' run queue instead, and a window of even one small piece, answered in tens of
//! microseconds, lets the mirror take the CPU time readers need: its receive path and
//! checksums (on the async threads readers use too), and the server's work when it runs on
//! the same host. The signal is how long **this process's foreground threads** — those at
//! normal priority: the FUSE threads, the async threads, the blocking pool that reads the
//! local copy for readers — waited for a CPU while runnable (`/proc/self/task/*/schedstat`,
//! the scheduler's run delay), as a share of wall time over the last [`SPAN`], summed over
//! the threads. The background's own threads (nice 10) are left out: their waiting is the
//! point, not a sign that readers are short. (Two machine-wide signals were tried first and
//! do not fit: the kernel's CPU pressure counts the background's waiting threads, and idle
//! time in `/proc/stat` counts the background's kernel time as busy; with either, the mirror
//! throttled itself at 1 Gbit/s during light reads.)
//!
//! Policy, pure and deterministic like the delay controller's (every call takes `now`):
//! - No read for [`LINGER`] (10 s): no pace (the mirror alone runs as fast as the machine
//!   allows). Longer than the delay controller's one second: tools such as `pg_restore`
//!   read in bursts and leave the CPU to the database in between, and a pace that ended
//!   with each burst let the mirror take it then.
//! - Within it, the wait share over [`WAIT_TARGET`]: the pace halves, starting from the
//!   background's own delivered rate, down to [`MIN_PACE`] (background work is slowed to a
//!   trickle, never stopped).
//! - Within it, the share at or under the target: the pace grows by a quarter plus
//!   [`MIN_PACE`] per sample, and is lifted once it passes twice the background rate it
//!   started from (it no longer holds anything back).
//!
//! Samples come every [`INTERVAL`] while background work is in flight and a reader read
//! within [`LINGER`] (from the prober); with no reader, none are taken.
//! Where the scheduler's statistics cannot be read there is no sample, so no pace: the
//! delay controller alone governs.

use std::time::Duration;

use super::delay::Rate;

/// How often the wait is sampled while background work is in flight.
pub(crate) const INTERVAL: Duration = Duration::from_millis(25);
/// The span a wait share is measured over.
pub(crate) const SPAN: Duration = Duration::from_millis(100);
/// The wait share (summed over the foreground threads) over which readers are taken to be
/// short of CPU: a third of a thread waiting on average.
pub(crate) const WAIT_TARGET: f64 = 0.35;
/// How long after a read the pace applies. (With 1 s and a target of 1, a loopback
/// `pg_restore` kept 0.59–0.61× of alone; with 10 s and 0.5, 0.75–0.78×; with 10 s and 0.35,
/// 0.88–0.92×, while 4 KiB reads at 1 Gbit/s kept p50 1.26× and p99 3.5× with the mirror at
/// 62–71 MB/s beside them. Measured before the delay controller gave reads their own base,
/// 10 s and 0.5 had cost those reads p50 2–2.2×; that did not recur.)
pub(crate) const LINGER: Duration = Duration::from_secs(10);
/// The slowest pace: background bytes per second while readers are short of CPU.
pub(crate) const MIN_PACE: f64 = (1 << 20) as f64;
/// Multiplicative decrease per interval over the target.
const DECREASE: f64 = 0.5;
/// Multiplicative increase per interval at or under the target (plus [`MIN_PACE`]).
const INCREASE: f64 = 1.25;

/// The pace and what it is computed from. See the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct CpuPace {
    /// Recent samples (when, the foreground threads' total wait), oldest first, covering at
    /// least [`SPAN`] when there are enough.
    samples: std::collections::VecDeque<(Duration, Duration)>,
    /// The wait share over the last span (`None` until measured).
    wait: Option<f64>,
    /// Background bytes per second allowed, if limited; with the rate it started from.
    pace: Option<(f64, f64)>,
    /// The background's delivered rate.
    background: Rate,
    /// When a reader last read.
    last_read: Option<Duration>,
}

impl CpuPace {
    /// `n` background bytes were delivered at `now`.
    pub(crate) fn on_background(&mut self, now: Duration, n: u64) {
        self.background.on_bytes(now, n);
    }

    /// A reader read at `now`.
    pub(crate) fn on_read(&mut self, now: Duration) {
        self.last_read = Some(now);
    }

    /// Whether a reader read within [`LINGER`] of `now`.
    fn readers_near(&self, now: Duration) -> bool {
        self.last_read
            .is_some_and(|t| now.saturating_sub(t) < LINGER)
    }

    /// Whether samples are wanted at `now` (a reader read within [`LINGER`]). When not, what
    /// was measured is dropped: the next span starts afresh, and the mirror alone does not
    /// pay for reading every thread's statistics.
    pub(crate) fn wants_samples(&mut self, now: Duration) -> bool {
        if self.readers_near(now) {
            return true;
        }
        self.samples.clear();
        self.wait = None;
        self.pace = None;
        false
    }

    /// A sample of the foreground threads' total wait for a CPU at `now` (a cumulative
    /// figure). Samples closer than half an [`INTERVAL`] to the previous one are ignored.
    pub(crate) fn on_sample(&mut self, now: Duration, waited: Duration) {
        if self
            .samples
            .back()
            .is_some_and(|(t, _)| now.saturating_sub(*t) < INTERVAL / 2)
        {
            return;
        }
        self.samples.push_back((now, waited));
        // Keep the newest sample at least SPAN old as the reference.
        while self.samples.len() > 2
            && self
                .samples
                .get(1)
                .is_some_and(|(t, _)| now.saturating_sub(*t) >= SPAN)
        {
            self.samples.pop_front();
        }
        let Some((t0, old)) = self.samples.front().copied() else {
            return;
        };
        let span = now.saturating_sub(t0);
        if span < SPAN / 2 {
            return; // not enough to tell yet
        }
        let wait = waited.saturating_sub(old).as_secs_f64() / span.as_secs_f64();
        self.wait = Some(wait);
        if !self.readers_near(now) {
            self.pace = None;
            return;
        }
        self.pace = if wait > WAIT_TARGET {
            let (p, from) = self.pace.unwrap_or_else(|| {
                let r = self.background.get().max(MIN_PACE);
                (r, r)
            });
            Some(((p * DECREASE).max(MIN_PACE), from))
        } else {
            self.pace.and_then(|(p, from)| {
                let p = p * INCREASE + MIN_PACE;
                (p <= 2.0 * from).then_some((p, from))
            })
        };
    }

    /// Background bytes per second allowed at `now` (`None`: no limit).
    pub(crate) fn pace(&self, now: Duration) -> Option<f64> {
        self.pace.filter(|_| self.readers_near(now)).map(|(p, _)| p)
    }

    /// The foreground threads' wait share over the last span (`None` before it is
    /// measured).
    pub(crate) fn wait(&self) -> Option<f64> {
        self.wait
    }
}

/// The cumulative run delay of this process's foreground threads (those at nice 0 or
/// below), kept across samples so that threads coming and going do not count: only each
/// thread's growth between two samples is added.
#[derive(Debug, Default)]
pub(crate) struct WaitSampler {
    /// Per thread id: whether it is a foreground thread, and its run delay last seen.
    threads: std::collections::HashMap<u32, (bool, u64)>,
    /// When the thread list was last read.
    listed: Option<std::time::Instant>,
    /// The sum of growths, nanoseconds.
    total: u64,
}

impl WaitSampler {
    /// How often the thread list is read again (threads of tokio's blocking pool come and
    /// go).
    const RELIST: Duration = Duration::from_secs(1);

    /// The total wait now; `None` where the scheduler's statistics cannot be read.
    pub(crate) fn sample(&mut self) -> Option<Duration> {
        if self.listed.is_none_or(|t| t.elapsed() >= Self::RELIST) {
            self.listed = Some(std::time::Instant::now());
            let mut seen = std::collections::HashMap::new();
            for e in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
                let Some(tid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                let known = self.threads.get(&tid).copied();
                let entry = match known {
                    Some(k) => k,
                    None => match thread_nice(tid) {
                        Some(nice) => (nice <= 0, run_delay(tid).unwrap_or(0)),
                        None => continue,
                    },
                };
                seen.insert(tid, entry);
            }
            self.threads = seen;
        }
        for (tid, (foreground, last)) in &mut self.threads {
            if !*foreground {
                continue;
            }
            if let Some(d) = run_delay(*tid) {
                self.total += d.saturating_sub(*last);
                *last = d;
            }
        }
        Some(Duration::from_nanos(self.total))
    }
}

/// The nice value of thread `tid` of this process (`stat`'s 19th field).
fn thread_nice(tid: u32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    parse_nice(&stat)
}

/// The nice value in a `/proc/…/stat` line; the command name (field 2) may hold spaces
/// and parentheses, so fields are counted after its last `)`.
fn parse_nice(stat: &str) -> Option<i64> {
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(16)?
        .parse()
        .ok()
}

/// Thread `tid`'s time spent runnable but waiting for a CPU, nanoseconds (`schedstat`'s
/// second field).
fn run_delay(tid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    s.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A pace fed one sample per INTERVAL at each wait share, a reader reading at each, the
    /// background having delivered 100 MB/s before.
    fn paced(waits: &[f64]) -> (CpuPace, Vec<Option<f64>>, Duration) {
        let mut c = CpuPace::default();
        let mut now = Duration::ZERO;
        // 100 MB/s of background bytes over the first 100 ms.
        for _ in 0..100 {
            now += MS;
            c.on_background(now, 100_000);
        }
        let mut waited = Duration::ZERO;
        c.on_read(now);
        c.on_sample(now, waited);
        let mut paces = Vec::new();
        for w in waits {
            now += INTERVAL;
            waited += INTERVAL.mul_f64(*w);
            c.on_read(now);
            c.on_sample(now, waited);
            paces.push(c.pace(now));
        }
        (c, paces, now)
    }

    #[test]
    fn parses_the_nice_value_and_the_run_delay_of_this_thread() {
        let line = "1234 (ferry-io (x) 2) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 10 1 0";
        assert_eq!(parse_nice(line), Some(10));
        assert_eq!(parse_nice("garbage"), None);
        // This process's own threads can be read (Linux with schedstat, as here and in CI).
        let tid = std::fs::read_dir("/proc/self/task")
            .expect("task list")
            .flatten()
            .find_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .expect("a thread");
        assert!(thread_nice(tid).is_some());
        assert!(run_delay(tid).is_some());
        let mut s = WaitSampler::default();
        let a = s.sample().expect("sample");
        let b = s.sample().expect("sample");
        assert!(b >= a);
    }

    #[test]
    fn no_wait_no_pace() {
        let (c, paces, _) = paced(&[0.0, 0.3, WAIT_TARGET, 0.1, 0.4, 0.2]);
        assert!(paces.iter().all(Option::is_none), "{paces:?}");
        assert!(c.wait().is_some_and(|w| w <= WAIT_TARGET), "{:?}", c.wait());
    }

    #[test]
    fn waiting_readers_halve_the_pace_down_to_the_floor() {
        let (_, paces, _) = paced(&[2.0; 16]);
        let p: Vec<f64> = paces.iter().flatten().copied().collect();
        // The first samples cover less than half a span: no decision yet.
        assert!(p.len() >= 12, "{paces:?}");
        // Starts at half the background's rate (100 MB/s, give or take the rate's lumps).
        assert!((40e6..=60e6).contains(&p[0]), "{p:?}");
        for w in p.windows(2) {
            assert!(w[1] <= w[0], "{p:?}");
        }
        assert_eq!(p[p.len() - 1], MIN_PACE, "{p:?}");
    }

    #[test]
    fn the_pace_recovers_and_is_lifted_when_readers_no_longer_wait() {
        let mut waits = vec![2.0; 8];
        waits.extend([0.0; 60]);
        let (_, paces, _) = paced(&waits);
        let low = paces[7].expect("paced while short");
        // The span still holds waiting samples for a few intervals; then it grows.
        let later = paces[14].expect("still paced, growing");
        assert!(later > low, "{paces:?}");
        assert!(paces.last().expect("samples").is_none(), "{paces:?}");
    }

    #[test]
    fn the_pace_holds_for_a_while_after_the_last_read_then_ends() {
        let (mut c, _, now) = paced(&[2.0; 8]);
        assert!(c.pace(now).is_some());
        // A reader between bursts: still paced.
        assert!(c.pace(now + LINGER / 2).is_some());
        assert_eq!(c.pace(now + LINGER), None);
        // A sample long after the last read clears it, however long threads wait.
        c.on_sample(now + LINGER, Duration::from_secs(100));
        assert_eq!(c.pace(now + LINGER), None);
        c.on_read(now + LINGER * 2);
        assert_eq!(c.pace(now + LINGER * 2), None);
    }

    #[test]
    fn no_reader_no_pace() {
        let mut c = CpuPace::default();
        let mut waited = Duration::ZERO;
        for i in 0..20u32 {
            waited += INTERVAL * 3;
            c.on_sample(INTERVAL * i, waited);
        }
        assert!(c.wait().is_some_and(|w| w > WAIT_TARGET));
        assert_eq!(c.pace(INTERVAL * 20), None);
    }

    #[test]
    fn samples_are_wanted_only_near_a_read_and_a_quiet_spell_forgets_them() {
        let (mut c, _, now) = paced(&[2.0; 8]);
        assert!(c.wants_samples(now));
        assert!(c.pace(now).is_some());
        assert!(!c.wants_samples(now + LINGER));
        assert_eq!(c.wait(), None);
        // Reads again: the old pace and span are gone; a new span needs half a SPAN.
        c.on_read(now + LINGER * 2);
        assert!(c.wants_samples(now + LINGER * 2));
        assert_eq!(c.pace(now + LINGER * 2), None);
        c.on_sample(now + LINGER * 2, Duration::from_secs(500));
        assert_eq!(c.wait(), None);
    }

    #[test]
    fn samples_too_close_together_are_ignored() {
        let mut c = CpuPace::default();
        c.on_read(Duration::ZERO);
        c.on_sample(Duration::ZERO, Duration::ZERO);
        c.on_sample(MS, Duration::from_secs(1));
        assert_eq!(c.wait(), None);
        assert_eq!(c.pace(MS), None);
    }
}
