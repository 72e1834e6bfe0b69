//! The pool's compression: the codec its requests ask for now and, with `auto`, the
//! sampler thread and the task that re-decide it four times a second ([`crate::codec`]).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_proto::{features, payload, Compression, LinkTime, Request, Response};
use ferry_util::lock;

use super::Inner;
use crate::codec::{Chooser, CompressionChoice, CpuShare, LinkSignal, Sample, Window, CANDIDATES};

/// Payloads this large and larger are sampled alone; smaller ones (a tree's small files,
/// each compressed on its own by the server) are gathered into a batch of at least this
/// many bytes, each compressed on its own in the sample too: on small payloads a codec's
/// fixed cost per frame (zstd builds its tables for every one) is much of its cost, and its
/// ratio is lower, and a sample of large chunks only would hide both.
const MIN_SAMPLE: usize = 64 << 10;
/// The most of a chunk the sampler compresses with every candidate: a whole default chunk,
/// as the server compresses it (a smaller slice packs worse, and not by the same factor for
/// every codec). Also the most a batch of small payloads gathers.
const MAX_SAMPLE: usize = 1 << 20;
/// Payloads under this size go raw whatever is asked (`payload::encode`): not sampled.
const MIN_ENCODED: usize = 512;
/// The sampler spends at most 1/DUTY of one core (it waits this many times as long as
/// its last sample took).
const DUTY: u32 = 50;
/// How often `auto` decides.
const WINDOW: Duration = Duration::from_millis(250);
/// How often, within a window, whether requests are outstanding is looked at.
const TICK: Duration = Duration::from_millis(10);
/// How long the server's last word on the link stands for the windows after it (it is
/// asked every window; an answer may be late or missing).
const SIGNAL_FRESH: Duration = Duration::from_millis(2500);

/// The server's reports of how this client's connections sent (Load's `link`), made into
/// [`LinkSignal`]s.
#[derive(Debug, Default)]
struct LinkReadings {
    /// The counters at the last reading (at first zero, as the server starts them).
    last: LinkTime,
    /// What the last two readings said, and when.
    signal: Option<(LinkSignal, Instant)>,
    /// The share of the last reading (for the trace log).
    share: Option<f64>,
}

impl LinkReadings {
    /// Takes new counters: of the sending time since the last reading, the share the
    /// network set the pace. Counters that went down started again (every connection had
    /// closed), and a reading with no sending says nothing new.
    fn read(&mut self, at: Instant, now: LinkTime) {
        let before = self.last;
        if now.sending_micros > before.sending_micros && now.limited_micros >= before.limited_micros
        {
            let share = (now.limited_micros - before.limited_micros) as f64
                / (now.sending_micros - before.sending_micros) as f64;
            self.signal = Some((LinkSignal::from_share(share), at));
            self.share = Some(share);
        }
        self.last = now;
    }

    /// The latest reading's signal, while it stands for the window ending `now`.
    fn fresh(&self, now: Instant) -> Option<LinkSignal> {
        self.signal
            .filter(|(_, at)| now.saturating_duration_since(*at) < SIGNAL_FRESH)
            .map(|(s, _)| s)
    }

    /// The share of the latest reading, while it stands for the window ending `now`.
    fn share(&self, now: Instant) -> Option<f64> {
        self.fresh(now).and(self.share)
    }

    /// The signal for a window ending `now`.
    fn signal(&self, now: Instant) -> LinkSignal {
        self.fresh(now).unwrap_or(LinkSignal::Pending)
    }
}

/// What the pool's reads ask for, and how it is going.
pub(super) struct Codec {
    choice: CompressionChoice,
    /// The compression asked for now ([`to_bits`]).
    current: AtomicU32,
    /// The compression a listing's small files are asked for with now ([`to_bits`];
    /// [`Chooser::small_files`]).
    small_files: AtomicU32,
    /// Decoded over wire bytes in the last window (a quarter second) with traffic (f64 bits).
    ratio: AtomicU64,
    /// Decoded bytes of responses to requests that asked for the compression in use when
    /// they arrived ([`Codec::delivered`]).
    fresh: AtomicU64,
    /// With `auto`: the decisions (shared with the sampler thread).
    chooser: Option<Arc<Mutex<Chooser>>>,
    /// Set by the sampler when it is ready for a new slice.
    wants_sample: Arc<AtomicBool>,
    /// Small payloads gathered for the next sample, and their bytes.
    batch: Mutex<(Vec<Bytes>, usize)>,
    /// Samples to the sampler: one slice of a large chunk, or a batch of small payloads
    /// (closing it ends the thread).
    to_sampler: Option<Mutex<mpsc::SyncSender<Vec<Bytes>>>>,
}

/// What [`super::Client::compression`] reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompressionStatus {
    /// What was asked for (`auto` or a fixed codec).
    pub choice: CompressionChoice,
    /// The codec requests ask for now (each chunk still goes raw when it does not shrink).
    pub current: Compression,
    /// Decoded over wire bytes in the last quarter second with traffic (1 before any).
    pub ratio: f64,
    /// With `auto`: the link's estimated capacity, wire bytes per second.
    pub link: Option<f64>,
    /// With `auto` and a server that says whether the network set the pace (`LINK_LIMITS`):
    /// whether it did in the last busy window (`Some(false)`: `link` may be only what the
    /// link carried, not its capacity).
    pub link_limits: Option<bool>,
}

fn to_bits(c: Compression) -> u32 {
    match c {
        Compression::None => 0,
        Compression::Lz4 => 1,
        Compression::Zstd(l) => 0x100 | u32::from(l as u8),
    }
}

fn from_bits(b: u32) -> Compression {
    match b {
        0 => Compression::None,
        1 => Compression::Lz4,
        b => Compression::Zstd((b & 0xff) as u8 as i8),
    }
}

impl Codec {
    /// The codec for a session with `session_features` whose server compresses zstd up to
    /// `zstd_max_level`. A fixed choice the session cannot do falls back: zstd to lz4, lz4
    /// to none; a zstd level above the server's highest to that.
    pub(super) fn new(
        choice: CompressionChoice,
        session_features: u64,
        zstd_max_level: Option<i8>,
    ) -> Codec {
        let lz4 = session_features & features::LZ4 != 0;
        let zstd = zstd_max_level.filter(|_| session_features & features::ZSTD != 0);
        let mut codec = Codec {
            choice,
            current: AtomicU32::new(0),
            small_files: AtomicU32::new(0),
            ratio: AtomicU64::new(1f64.to_bits()),
            fresh: AtomicU64::new(0),
            chooser: None,
            wants_sample: Arc::new(AtomicBool::new(false)),
            batch: Mutex::new((Vec::new(), 0)),
            to_sampler: None,
        };
        let mut small_files = None;
        let start = match choice {
            CompressionChoice::Fixed(Compression::Zstd(l)) => match zstd {
                Some(max) => Compression::Zstd(l.min(max)),
                None if lz4 => Compression::Lz4,
                None => Compression::None,
            },
            CompressionChoice::Fixed(Compression::Lz4) if !lz4 => Compression::None,
            CompressionChoice::Fixed(c) => c,
            CompressionChoice::Auto => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                let chooser = Arc::new(Mutex::new(Chooser::new(lz4, zstd, cores)));
                let (tx, rx) = mpsc::sync_channel(1);
                let sampler = Sampler {
                    rx,
                    wants: codec.wants_sample.clone(),
                    chooser: chooser.clone(),
                };
                // Without the thread, auto still decides from the link and the ratios of
                // what arrives; it only lacks the other codecs' figures.
                if std::thread::Builder::new()
                    .name("ferry-sampler".into())
                    .spawn(move || sampler.run())
                    .is_ok()
                {
                    codec.to_sampler = Some(Mutex::new(tx));
                    codec.wants_sample.store(true, Relaxed);
                }
                let c = lock(&chooser);
                let start = c.current();
                small_files = Some(c.small_files());
                drop(c);
                codec.chooser = Some(chooser);
                start
            }
        };
        codec.current.store(to_bits(start), Relaxed);
        codec
            .small_files
            .store(to_bits(small_files.unwrap_or(start)), Relaxed);
        codec
    }

    /// The compression a request asks for now.
    pub(super) fn current(&self) -> Compression {
        from_bits(self.current.load(Relaxed))
    }

    /// The compression a listing with its small files asks for now.
    pub(super) fn small_files(&self) -> Compression {
        from_bits(self.small_files.load(Relaxed))
    }

    /// Counts `decoded` bytes of a response to a request that asked for `asked`: with
    /// `auto`, those asked with the codec in use show what it delivers.
    pub(super) fn delivered(&self, asked: Compression, decoded: u64) {
        if self.chooser.is_some() && asked == self.current() {
            self.fresh.fetch_add(decoded, Relaxed);
        }
    }

    /// Offers a payload just received (decoded) to the sampler when it is ready for one: a
    /// large chunk alone (shared, not copied), a small payload copied into the batch being
    /// gathered (cheap otherwise: one atomic load).
    pub(super) fn offer(&self, data: &Bytes) {
        if data.len() < MIN_ENCODED || !self.wants_sample.load(Relaxed) {
            return;
        }
        let Some(tx) = &self.to_sampler else { return };
        let sample = if data.len() >= MIN_SAMPLE {
            vec![data.slice(..data.len().min(MAX_SAMPLE))]
        } else {
            // Copied: a small file's bytes may be a slice of a much larger frame (a listing's
            // page), which a batch must not keep alive.
            let mut batch = lock(&self.batch);
            batch.0.push(Bytes::copy_from_slice(data));
            batch.1 += data.len();
            if batch.1 < MAX_SAMPLE {
                return;
            }
            std::mem::take(&mut *batch).0
        };
        if self.wants_sample.swap(false, Relaxed) {
            let _ = lock(tx).try_send(sample);
        }
    }

    /// What is in use and how well it compresses.
    pub(super) fn status(&self) -> CompressionStatus {
        CompressionStatus {
            choice: self.choice,
            current: self.current(),
            ratio: f64::from_bits(self.ratio.load(Relaxed)),
            link: self.chooser.as_ref().and_then(|c| lock(c).link()),
            link_limits: self.chooser.as_ref().and_then(|c| lock(c).link_bound()),
        }
    }
}

/// The calling thread's CPU time (wall time where it cannot be read).
fn cpu_now() -> Duration {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    ferry_util::priority::thread_cpu_time()
        .unwrap_or_else(|| EPOCH.get_or_init(Instant::now).elapsed())
}

/// Measures every candidate codec on chunks of what arrives, on its own thread at low
/// priority, within a small share of one core. Costs are the thread's CPU time, not wall
/// time: at low priority on a busy machine it is preempted often, and a codec must not look
/// slow for that.
struct Sampler {
    rx: mpsc::Receiver<Vec<Bytes>>,
    wants: Arc<AtomicBool>,
    chooser: Arc<Mutex<Chooser>>,
}

impl Sampler {
    fn run(self) {
        let _lowered = ferry_util::priority::lower_current_thread();
        let allowed: Vec<usize> = {
            let c = lock(&self.chooser);
            (0..CANDIDATES.len()).filter(|&i| c.allowed(i)).collect()
        };
        // Ends when the pool is dropped (the sender with it).
        while let Ok(items) = self.rx.recv() {
            let started = Instant::now();
            let cpu_started = cpu_now();
            let sums: Vec<u64> = items.iter().map(|i| payload::checksum(i)).collect();
            let samples: Vec<Sample> = allowed
                .iter()
                .filter_map(|&i| sample_items(i, &items, &sums))
                .collect();
            {
                let mut c = lock(&self.chooser);
                for s in samples {
                    c.sample(s);
                }
            }
            // The duty cycle by CPU time spent, so a preempted sampler does not also wait
            // longer; at least the wall time, so it never runs more than half the time.
            let spent = cpu_now().saturating_sub(cpu_started);
            std::thread::sleep((spent * DUTY).max(started.elapsed()));
            self.wants.store(true, Relaxed);
        }
    }
}

/// Candidate `i` on `items` (whose checksums are `sums`), each compressed and decompressed
/// on its own as the server and the client would: the totals (`None` when one fails to come
/// back as it went).
fn sample_items(i: usize, items: &[Bytes], sums: &[u64]) -> Option<Sample> {
    let with = CANDIDATES[i];
    let mut s = Sample {
        codec: i,
        raw: 0,
        compressed: 0,
        encode: Duration::ZERO,
        decode: Duration::ZERO,
    };
    for (raw, &sum) in items.iter().zip(sums) {
        let t0 = cpu_now();
        let packed = match with {
            Compression::None => None,
            c => payload::compress(raw, c),
        };
        let t1 = cpu_now();
        s.encode += t1.saturating_sub(t0);
        s.raw += raw.len();
        s.compressed += match &packed {
            Some(p) => {
                let encoding = match with {
                    Compression::Zstd(_) => ferry_proto::Encoding::Zstd,
                    _ => ferry_proto::Encoding::Lz4,
                };
                payload::decode(encoding, raw.len() as u32, sum, p.clone()).ok()?;
                s.decode += cpu_now().saturating_sub(t1);
                p.len()
            }
            None => raw.len(),
        };
    }
    Some(s)
}

/// With `auto`: every quarter second, gives the chooser what the pool moved and whether
/// requests were outstanding all along, and switches the codec requests ask for. Ends when
/// the pool is dropped.
pub(super) async fn run(inner: Weak<Inner>) {
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut wire, mut decoded, mut fresh) = (0u64, 0u64, 0u64);
    let mut start = Instant::now();
    let (mut seen, mut busy) = (0u32, 0u32);
    let mut windows = 0u64;
    let mut cpu_gate = CpuGate::default();
    let mut cpu = ferry_util::cpu::CpuMeter::new();
    // The server's last report, and whether it runs on this machine.
    let server_cpu: Arc<Mutex<Option<(CpuShare, bool)>>> = Arc::new(Mutex::new(None));
    let link_readings = Arc::new(Mutex::new(LinkReadings::default()));
    loop {
        ticks.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        seen += 1;
        if super::inflight_of(&inner) > 0 {
            busy += 1;
        }
        if start.elapsed() < WINDOW {
            continue;
        }
        let c = &inner.counters;
        let (w, d) = (c.wire_bytes.load(Relaxed), c.decoded_bytes.load(Relaxed));
        let f = inner.codec.fresh.load(Relaxed);
        let reported = inner.session.features & (features::ZSTD | features::LINK_LIMITS)
            == features::ZSTD | features::LINK_LIMITS;
        let window = Window {
            elapsed: start.elapsed(),
            wire: w - wire,
            decoded: d - decoded,
            fresh: f - fresh,
            // Requests outstanding at (nearly) every look: the transfer set the pace.
            busy: busy * 10 >= seen * 9,
            link: if reported {
                lock(&link_readings).signal(Instant::now())
            } else {
                LinkSignal::Unreported
            },
        };
        (wire, decoded, fresh, start, seen, busy) = (w, d, f, Instant::now(), 0, 0);
        let codec = &inner.codec;
        if window.wire > 0 {
            codec.ratio.store(
                (window.decoded as f64 / window.wire as f64).to_bits(),
                Relaxed,
            );
        }
        windows += 1;
        if let Some(chooser) = &codec.chooser {
            // Once a second: both ends' CPUs, when every window of that second moved bytes.
            let due = windows % 4 == 1;
            let take = cpu_gate.window(window.wire, due);
            if due {
                let here = cpu.sample().map(|l| CpuShare {
                    available: l.available(),
                    idle: l.idle,
                    process: l.process,
                });
                if take {
                    let server = *lock(&server_cpu);
                    let mut c = lock(chooser);
                    c.set_cpus(server.map(|s| s.0), here);
                    c.set_same_machine(server.is_some_and(|s| s.1));
                    drop(c);
                }
            }
            // Every window: the server's word on the link (its CPUs are taken once a second).
            if inner.session.features & features::ZSTD != 0 {
                ask_server_load(&inner, server_cpu.clone(), link_readings.clone());
            }
            let mut c = lock(chooser);
            tracing::trace!(
                "window: {:.0} MB/s decoded, {:.1} MB/s wire, {} % of it asked with {}, busy {}, link {:?} (last share {:.2})",
                window.decoded as f64 / window.elapsed.as_secs_f64() / 1e6,
                window.wire as f64 / window.elapsed.as_secs_f64() / 1e6,
                window.fresh * 100 / window.decoded.max(1),
                codec.current(),
                window.busy,
                window.link,
                lock(&link_readings).share.unwrap_or(f64::NAN)
            );
            c.set_link_share(lock(&link_readings).share(Instant::now()));
            let next = c.window(window);
            if next != codec.current() {
                tracing::debug!(
                    "compression now {next} (last {:.0} MB/s decoded, ratio {:.2}; {})",
                    window.decoded as f64 / window.elapsed.as_secs_f64() / 1e6,
                    window.decoded as f64 / window.wire.max(1) as f64,
                    c.explain()
                );
                codec.current.store(to_bits(next), Relaxed);
            }
            codec.small_files.store(to_bits(c.small_files()), Relaxed);
        }
    }
}

/// Which CPU readings the chooser takes: those of seconds in which every window moved
/// bytes. A mount's idle seconds before a copy read as idle CPUs; averaged into the first
/// readings of the copy they made the chooser see a core free for seconds on a machine that
/// had none, and climb to codecs the CPUs could not feed (zstd 3 on the WAN profile, both
/// ends and the relay on two cores).
#[derive(Debug, Default)]
struct CpuGate {
    /// A window since the last reading moved nothing.
    quiet: bool,
}

impl CpuGate {
    /// A window that moved `wire` bytes ended; `due`: a reading is taken now. Says whether
    /// the chooser gets it.
    fn window(&mut self, wire: u64, due: bool) -> bool {
        self.quiet |= wire == 0;
        due && !std::mem::take(&mut self.quiet)
    }
}

/// Asks the server how busy its CPUs are (on a task of its own: the answer may take a
/// round trip or more) and keeps what it can give: its process's use plus its idle time;
/// with `LINK_LIMITS`, also whether the network set this client's pace.
fn ask_server_load(
    inner: &Arc<Inner>,
    into: Arc<Mutex<Option<(CpuShare, bool)>>>,
    link_readings: Arc<Mutex<LinkReadings>>,
) {
    // Beside the scheduler, as the prober's Pings: asked four times a second, a Load must
    // not count as a reader's demand.
    let inner = Arc::downgrade(inner);
    tokio::spawn(async move {
        let answer = super::schedule::probe::aside(&inner, Request::Load, false).await;
        if let Some(Response::Load(l)) = answer.map(|a| a.response) {
            if let Some(link) = l.link {
                lock(&link_readings).read(Instant::now(), link);
            }
            let idle = f64::from(l.idle_permille) / 1000.0;
            let available = f64::from(l.process_permille) / 1000.0 + idle;
            let same = l.boot_id != [0; 16] && ferry_util::cpu::boot_id() == Some(l.boot_id);
            *lock(&into) = Some((
                CpuShare {
                    available: available.min(f64::from(l.cores.max(1))),
                    idle,
                    process: f64::from(l.process_permille) / 1000.0,
                },
                same,
            ));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_readings_of_seconds_that_moved_nothing_are_not_taken() {
        let mut g = CpuGate::default();
        // A busy first second.
        assert!(g.window(1, true));
        // A mount idle for a second, then a copy starting within the next.
        for _ in 0..3 {
            assert!(!g.window(0, false));
        }
        assert!(!g.window(0, true), "an idle second is not taken");
        assert!(!g.window(0, false));
        assert!(!g.window(5, false));
        assert!(!g.window(5, false));
        assert!(!g.window(5, true), "a second partly idle is not taken");
        for _ in 0..3 {
            assert!(!g.window(5, false));
        }
        assert!(g.window(5, true), "a busy second is taken");
    }

    #[test]
    fn every_compression_survives_its_bits() {
        for c in [Compression::None, Compression::Lz4].into_iter().chain(
            (ferry_proto::ZSTD_MIN_LEVEL..=ferry_proto::ZSTD_MAX_LEVEL).map(Compression::Zstd),
        ) {
            assert_eq!(from_bits(to_bits(c)), c);
        }
    }

    #[test]
    fn the_servers_link_counters_become_a_signal() {
        let t0 = Instant::now();
        let at = |secs: f64| t0 + Duration::from_secs_f64(secs);
        let t = |sending_micros, limited_micros| LinkTime {
            sending_micros,
            limited_micros,
        };
        let mut r = LinkReadings::default();
        assert_eq!(r.signal(at(0.5)), LinkSignal::Pending, "nothing read yet");
        // Eight connections sent for a second each, the network setting the pace for 90 %.
        r.read(at(1.0), t(8_000_000, 7_200_000));
        assert_eq!(r.signal(at(1.2)), LinkSignal::Limited);
        // Then for a tenth of it.
        r.read(at(2.0), t(16_000_000, 8_000_000));
        assert_eq!(r.signal(at(2.2)), LinkSignal::NotLimited);
        // No sending since: nothing new.
        r.read(at(3.0), t(16_000_000, 8_000_000));
        assert_eq!(r.signal(at(3.1)), LinkSignal::NotLimited);
        // Counters that went down (all connections had closed) say nothing new either.
        r.read(at(4.0), t(100, 100));
        assert_eq!(r.signal(at(4.1)), LinkSignal::NotLimited);
        // And a reading too old stands for nothing.
        assert_eq!(r.signal(at(9.0)), LinkSignal::Pending);
        r.read(at(10.0), t(1_000_100, 800_100));
        assert_eq!(r.signal(at(10.1)), LinkSignal::Limited);
    }

    /// 4 KiB pieces of real text: this crate's own sources, as in a source tree.
    fn source_pieces() -> Vec<Bytes> {
        [
            &include_bytes!("../codec.rs")[..],
            &include_bytes!("calls.rs")[..],
            &include_bytes!("schedule.rs")[..],
        ]
        .iter()
        .flat_map(|f| f.chunks(4096))
        .filter(|c| c.len() >= MIN_ENCODED)
        .map(Bytes::copy_from_slice)
        .collect()
    }

    #[test]
    fn small_payloads_are_sampled_in_batches_each_compressed_on_its_own() {
        let codec = Codec::new(CompressionChoice::Auto, features::ALL, Some(6));
        let chooser = codec.chooser.clone().expect("auto has a chooser");
        let lz4 = CANDIDATES
            .iter()
            .position(|c| *c == Compression::Lz4)
            .unwrap();
        // A tree of small files: none large enough to be sampled alone.
        let pieces = source_pieces();
        let deadline = Instant::now() + Duration::from_secs(20);
        while lock(&chooser).sampled(lz4).is_none() {
            assert!(Instant::now() < deadline, "no sample of small payloads");
            for p in &pieces {
                codec.offer(p);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let (ratio, encode) = lock(&chooser).sampled(lz4).expect("sampled");
        assert!(
            ratio > 1.5 && encode > 0.0,
            "ratio {ratio}, encode {encode}"
        );
    }

    #[test]
    fn a_batch_is_measured_as_the_server_sends_it_one_payload_at_a_time() {
        let items = source_pieces();
        let whole = Bytes::from(items.concat());
        let sums = |v: &[Bytes]| v.iter().map(|i| payload::checksum(i)).collect::<Vec<_>>();
        let zstd1 = CANDIDATES
            .iter()
            .position(|c| *c == Compression::Zstd(1))
            .unwrap();
        let apart = sample_items(zstd1, &items, &sums(&items)).expect("sample");
        let whole = [whole];
        let together = sample_items(zstd1, &whole, &sums(&whole)).expect("sample");
        assert_eq!(apart.raw, together.raw);
        let each: usize = items
            .iter()
            .map(|i| payload::compress(i, Compression::Zstd(1)).map_or(i.len(), |p| p.len()))
            .sum();
        assert_eq!(apart.compressed, each);
        // Each payload alone packs worse than all of them in one frame.
        assert!(
            apart.compressed > together.compressed,
            "{} vs {}",
            apart.compressed,
            together.compressed
        );
        // Payloads the server sends raw whatever is asked are not sampled.
        let codec = Codec::new(CompressionChoice::Auto, features::ALL, Some(6));
        codec.offer(&Bytes::from_static(b"tiny"));
        assert_eq!(lock(&codec.batch).1, 0);
    }

    #[test]
    fn a_fixed_choice_falls_back_to_what_the_session_has() {
        let zstd = CompressionChoice::Fixed(Compression::Zstd(9));
        let all = features::ALL;
        assert_eq!(
            Codec::new(zstd, all, Some(6)).current(),
            Compression::Zstd(6)
        );
        assert_eq!(
            Codec::new(zstd, all & !features::ZSTD, None).current(),
            Compression::Lz4
        );
        assert_eq!(Codec::new(zstd, 0, None).current(), Compression::None);
        let lz4 = CompressionChoice::Fixed(Compression::Lz4);
        assert_eq!(Codec::new(lz4, 0, None).current(), Compression::None);
        assert_eq!(
            Codec::new(CompressionChoice::Auto, all & !features::ZSTD, None).current(),
            Compression::Lz4
        );
        assert_eq!(
            Codec::new(CompressionChoice::Auto, all, Some(6)).current(),
            Compression::Zstd(1)
        );
    }
}
