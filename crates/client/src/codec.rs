//! Choosing how reads are compressed: a fixed codec, or `auto`, which picks raw, lz4 or a
//! zstd level so that the bytes delivered per second are highest, and keeps re-deciding.
//!
//! What `auto` knows, all measured while the transfer runs:
//! - **The data**: a sampler thread compresses 64 KiB slices of chunks just received
//!   with every candidate (and decompresses them), at most about 2 % of one core, giving
//!   each candidate's ratio and its encode and decode cost per byte on the data actually
//!   sent. Its encode cost stands for the server's (same class of CPU assumed; the
//!   learned efficiency below corrects the scale).
//! - **The link**: wire bytes per second in windows when requests were outstanding all
//!   along, the highest of the recent ones ([`Chooser::link`]).
//! - **The CPUs**: what each end can give — its process's CPU use plus its machine's idle
//!   time; the server reports its own every second (Load, with the ZSTD feature) — and the
//!   efficiency each codec reached — delivered over predicted — while it was in use: a slow
//!   disk, or work the model does not count, shows up there.
//!
//! Each candidate's prediction is `min(link × ratio, encode speed × server cores,
//! decode speed × client cores) × efficiency`; the highest wins, a dearer codec must gain
//! 5 %, and a tie goes to the cheaper one. After ten seconds on one codec that delivers
//! within reach of its CPU ceiling, the next cheaper one is tried for half a second: when
//! the CPU, not the link, limits a codec, the link looks as slow as that codec sends, and
//! only a cheaper codec shows what it really carries. An
//! unused codec's efficiency drifts back to the average, so codecs judged in other
//! conditions get tried again.

use std::str::FromStr;
use std::time::Duration;

use ferry_proto::Compression;

/// What a client asks for: one codec for every read, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompressionChoice {
    /// Chosen from the measured link, data and CPUs, and re-chosen as they change.
    #[default]
    Auto,
    /// Always this (still sent raw per chunk when it does not shrink).
    Fixed(Compression),
}

impl FromStr for CompressionChoice {
    type Err = String;

    /// `auto`, or a [`Compression`]: `none`, `lz4`, `zstd`, `zstd:LEVEL`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(CompressionChoice::Auto);
        }
        s.parse()
            .map(CompressionChoice::Fixed)
            .map_err(|e: String| e.replace("is not one of", "is not one of auto,"))
    }
}

impl std::fmt::Display for CompressionChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CompressionChoice::Auto => f.write_str("auto"),
            CompressionChoice::Fixed(c) => c.fmt(f),
        }
    }
}

/// The codecs `auto` chooses among, cheapest first.
pub const CANDIDATES: [Compression; 7] = [
    Compression::None,
    Compression::Lz4,
    Compression::Zstd(-3),
    Compression::Zstd(-1),
    Compression::Zstd(1),
    Compression::Zstd(3),
    Compression::Zstd(6),
];

/// A change of codec must promise this much more.
const HYSTERESIS: f64 = 1.05;
/// Predictions within this factor count as a tie (the cheaper codec wins).
const TIE: f64 = 1.02;
/// Weight of a new measurement in the running averages.
const ALPHA: f64 = 0.25;
/// Per window, the link estimate falls by this share towards the newest measurement.
const LINK_DECAY: f64 = 0.03;
/// Windows a codec must have been in use before its delivery counts for it (requests sent
/// before the change are still coming in).
const SETTLE: u32 = 1;
/// After this many windows on one codec, the next cheaper one is tried for a moment: a
/// codec whose CPU is the limit sends less than the link could carry, and only a cheaper
/// codec shows how much more the link takes.
const PROBE_EVERY: u32 = 40;

/// An exponentially weighted average (`None` until the first value).
#[derive(Debug, Clone, Copy, Default)]
struct Ewma(Option<f64>);

impl Ewma {
    fn add(&mut self, v: f64) {
        self.0 = Some(match self.0 {
            Some(old) => old + ALPHA * (v - old),
            None => v,
        });
    }
}

/// One codec compressing and expanding one sample.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Which candidate ([`CANDIDATES`] index).
    pub codec: usize,
    /// Bytes in.
    pub raw: usize,
    /// Bytes out (`raw` when it did not shrink).
    pub compressed: usize,
    /// Time to compress.
    pub encode: Duration,
    /// Time to decompress.
    pub decode: Duration,
}

/// What one window (a quarter second) of transfer showed.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Its length.
    pub elapsed: Duration,
    /// Payload bytes received on the wire.
    pub wire: u64,
    /// The same bytes decoded.
    pub decoded: u64,
    /// Whether requests were outstanding all along: the transfer, not the reader, set the
    /// pace (only such windows say what a codec and the link can do).
    pub busy: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Costs {
    /// Decoded bytes over compressed bytes, on samples.
    ratio: Ewma,
    /// Decoded bytes over wire bytes of the chunks that arrived while this codec was in use
    /// (chunks sent raw because they did not shrink count as they went).
    delivered_ratio: Ewma,
    /// Seconds of one core per byte to compress.
    encode: Ewma,
    /// Seconds of one core per byte to decompress.
    decode: Ewma,
    /// Delivered over predicted while in use.
    efficiency: Ewma,
}

/// The decisions of `auto` (pure: time and measurements come in, a codec comes out).
#[derive(Debug, Clone)]
pub struct Chooser {
    /// How many of [`CANDIDATES`] the server allows (its highest zstd level).
    allowed: Vec<bool>,
    costs: [Costs; CANDIDATES.len()],
    /// Wire bytes per second the link carried at best lately (`None`: not yet measured).
    link: Option<f64>,
    current: usize,
    /// Windows since the last change.
    held: u32,
    server_cores: f64,
    client_cores: f64,
}

impl Chooser {
    /// A chooser for a session whose server compresses zstd at most at `zstd_max_level`
    /// (`None`: no zstd) and may send lz4 when `lz4`; `cores` on each end. It starts with
    /// zstd 1 (lz4 without zstd) until the first measurements: it compresses about as fast
    /// as lz4 and packs more.
    pub fn new(lz4: bool, zstd_max_level: Option<i8>, cores: usize) -> Chooser {
        let allowed: Vec<bool> = CANDIDATES
            .iter()
            .map(|c| match c {
                Compression::None => true,
                Compression::Lz4 => lz4,
                Compression::Zstd(l) => zstd_max_level.is_some_and(|max| *l <= max),
            })
            .collect();
        let start = CANDIDATES
            .iter()
            .position(|c| *c == Compression::Zstd(1))
            .filter(|&i| allowed[i])
            .unwrap_or(usize::from(lz4));
        let cores = cores.max(1) as f64;
        Chooser {
            allowed,
            costs: Default::default(),
            link: None,
            current: start,
            held: 0,
            server_cores: cores * 0.75,
            client_cores: cores * 0.5,
        }
    }

    /// The codec in use.
    pub fn current(&self) -> Compression {
        CANDIDATES[self.current]
    }

    /// The link's estimated capacity, wire bytes per second.
    pub fn link(&self) -> Option<f64> {
        self.link
    }

    /// Takes what the CPUs can give, in cores: the server's (its process's use plus its
    /// machine's idle time, as it reports them) and this process's (the same here). Until
    /// the first call, three quarters of the server's cores and half of the client's are
    /// assumed.
    pub fn set_cpus(&mut self, server: Option<f64>, client: Option<f64>) {
        if let Some(s) = server {
            self.server_cores = s.max(0.25);
        }
        if let Some(c) = client {
            self.client_cores = c.max(0.25);
        }
    }

    /// Cores for compressing (server) and decompressing (client) the model assumes now.
    pub fn cpus(&self) -> (f64, f64) {
        (self.server_cores, self.client_cores)
    }

    /// Whether candidate `i` may be used with this server.
    pub fn allowed(&self, i: usize) -> bool {
        self.allowed[i]
    }

    /// Takes one codec's result on a sample.
    pub fn sample(&mut self, s: Sample) {
        if s.raw == 0 {
            return;
        }
        let c = &mut self.costs[s.codec];
        c.ratio
            .add(s.raw as f64 / s.compressed.clamp(1, s.raw) as f64);
        c.encode.add(s.encode.as_secs_f64() / s.raw as f64);
        c.decode.add(s.decode.as_secs_f64() / s.raw as f64);
    }

    /// What candidate `i` should deliver, decoded bytes per second, before efficiency
    /// (`None`: not enough known).
    fn model(&self, i: usize) -> Option<f64> {
        let link = self.link?;
        if CANDIDATES[i] == Compression::None {
            return Some(link);
        }
        let c = &self.costs[i];
        let ratio = c.ratio.0? * self.ratio_correction();
        let encode = c.encode.0?.max(1e-12);
        let decode = c.decode.0?.max(1e-12);
        Some(
            (link * ratio)
                .min(self.server_cores / encode)
                .min(self.client_cores / decode),
        )
    }

    /// What the codec in use delivers over what its samples promised: applied to every
    /// codec's sampled ratio (chunks that went raw, or data unlike the samples, cost them
    /// all alike).
    fn ratio_correction(&self) -> f64 {
        let c = &self.costs[self.current];
        match (c.delivered_ratio.0, c.ratio.0) {
            (Some(got), Some(sampled)) if sampled > 0.0 => (got / sampled).clamp(0.25, 4.0),
            _ => 1.0,
        }
    }

    /// The average efficiency of the codecs measured so far (1 before any).
    fn mean_efficiency(&self) -> f64 {
        let known: Vec<f64> = self.costs.iter().filter_map(|c| c.efficiency.0).collect();
        if known.is_empty() {
            1.0
        } else {
            known.iter().sum::<f64>() / known.len() as f64
        }
    }

    /// Whether the current codec delivered within reach of what the CPUs allow it (so the
    /// CPU, not the link, may be what limits it): only then is a cheaper codec tried.
    fn near_cpu_limit(&self, w: &Window) -> bool {
        let c = &self.costs[self.current];
        let (Some(encode), Some(decode)) = (c.encode.0, c.decode.0) else {
            return false;
        };
        let ceiling =
            (self.server_cores / encode.max(1e-12)).min(self.client_cores / decode.max(1e-12));
        w.decoded as f64 / w.elapsed.as_secs_f64() >= 0.4 * ceiling
    }

    /// What candidate `i` is expected to deliver now: never more than raw would times its
    /// ratio (a codec that does not shrink the data cannot beat sending it raw, whatever
    /// the efficiencies learned at other times say).
    pub fn predict(&self, i: usize) -> Option<f64> {
        let eff = |i: usize| {
            self.costs[i]
                .efficiency
                .0
                .unwrap_or_else(|| self.mean_efficiency())
        };
        let p = self.model(i)? * eff(i);
        if i == 0 {
            return Some(p);
        }
        let ratio = self.costs[i].ratio.0? * self.ratio_correction();
        Some(match self.model(0) {
            Some(raw) => p.min(raw * eff(0) * ratio.max(1.0)),
            None => p,
        })
    }

    /// Takes a window's measurements and returns the codec to use from now on.
    pub fn window(&mut self, w: Window) -> Compression {
        let secs = w.elapsed.as_secs_f64();
        self.held = self.held.saturating_add(1);
        if secs <= 0.0 || w.wire == 0 {
            return self.current();
        }
        let wire_rate = w.wire as f64 / secs;
        let settled = self.held > SETTLE;
        if w.busy {
            // The link carried at least this; a slower link shows as a lower rate when the
            // codec is not the limit.
            self.link = Some(match self.link {
                Some(l) if wire_rate < l => l - LINK_DECAY * (l - wire_rate),
                _ => wire_rate,
            });
            if settled {
                self.costs[self.current]
                    .delivered_ratio
                    .add(w.decoded as f64 / w.wire as f64);
                if let Some(m) = self.model(self.current) {
                    let got = w.decoded as f64 / secs;
                    self.costs[self.current]
                        .efficiency
                        .add((got / m).clamp(0.05, 1.5));
                }
            }
        }
        // Codecs not in use forget slowly what they showed, so they are tried again when
        // conditions change.
        let mean = self.mean_efficiency();
        for (i, c) in self.costs.iter_mut().enumerate() {
            if i != self.current {
                if let Some(e) = c.efficiency.0.as_mut() {
                    *e += 0.02 * (mean - *e);
                }
            }
        }
        if !w.busy || !settled {
            return self.current();
        }
        let now = self.predict(self.current).unwrap_or(0.0);
        let predicted: Vec<Option<f64>> = (0..CANDIDATES.len())
            .map(|i| self.predict(i).filter(|_| self.allowed[i]))
            .collect();
        let top = predicted.iter().flatten().fold(now, |a, &b| a.max(b));
        // The cheapest codec within a tie of the best; a dearer one than now only when it
        // clearly gains.
        let rate = |i: usize| {
            if i == self.current {
                Some(now)
            } else {
                predicted[i]
            }
        };
        let best = (0..CANDIDATES.len())
            .find(|&i| rate(i).is_some_and(|p| p * TIE >= top))
            .unwrap_or(self.current);
        let best = if best > self.current && predicted[best].unwrap_or(0.0) < now * HYSTERESIS {
            self.current
        } else {
            best
        };
        let best = if best == self.current && self.held >= PROBE_EVERY && self.near_cpu_limit(&w) {
            (0..self.current)
                .rev()
                .find(|&i| self.allowed[i])
                .unwrap_or(best)
        } else {
            best
        };
        if best != self.current {
            self.current = best;
            self.held = 0;
        }
        self.current()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated link and codec table: what each candidate costs and gives on some data.
    struct Sim {
        /// Link capacity, wire bytes/s.
        link: f64,
        /// Per candidate: ratio, encode and decode MB/s on one core.
        table: [(f64, f64, f64); 7],
        /// Cores on each end.
        cores: usize,
    }

    impl Sim {
        /// Decoded bytes/s candidate `i` really delivers: the link or a CPU, whichever
        /// is slower (the chooser only sees this).
        fn delivered(&self, i: usize) -> f64 {
            let (ratio, enc, dec) = self.table[i];
            let cores = self.cores as f64;
            let mut r = self.link * ratio;
            if i != 0 {
                r = r.min(enc * 1e6 * cores * 0.6).min(dec * 1e6 * cores * 0.6);
            }
            r
        }

        /// Runs the chooser for `windows` half-second windows; returns its choice.
        fn run(&self, c: &mut Chooser, windows: usize) -> Compression {
            for _ in 0..windows {
                for (i, &(ratio, enc, dec)) in self.table.iter().enumerate() {
                    let raw = 65536usize;
                    c.sample(Sample {
                        codec: i,
                        raw,
                        compressed: (raw as f64 / ratio) as usize,
                        encode: Duration::from_secs_f64(raw as f64 / (enc * 1e6)),
                        decode: Duration::from_secs_f64(raw as f64 / (dec * 1e6)),
                    });
                }
                let i = CANDIDATES.iter().position(|&x| x == c.current()).unwrap();
                let decoded = self.delivered(i) * 0.5;
                let ratio = self.table[i].0;
                c.window(Window {
                    elapsed: Duration::from_millis(500),
                    wire: (decoded / ratio) as u64,
                    decoded: decoded as u64,
                    busy: true,
                });
            }
            c.current()
        }
    }

    /// Codec speeds (MB/s, one core) of the kind measured on mixed binaries and on
    /// database pages.
    const MIXED: [(f64, f64, f64); 7] = [
        (1.0, f64::INFINITY, f64::INFINITY),
        (1.7, 600.0, 3000.0),
        (1.75, 700.0, 1500.0),
        (1.9, 480.0, 1300.0),
        (2.1, 330.0, 1100.0),
        (2.2, 160.0, 1100.0),
        (2.3, 60.0, 1100.0),
    ];
    const PAGES: [(f64, f64, f64); 7] = [
        (1.0, f64::INFINITY, f64::INFINITY),
        (15.0, 2500.0, 4000.0),
        (30.0, 2000.0, 3000.0),
        (38.0, 1600.0, 2800.0),
        (42.0, 1100.0, 2500.0),
        (45.0, 500.0, 2500.0),
        (47.0, 150.0, 2500.0),
    ];
    const RANDOM: [(f64, f64, f64); 7] = [
        (1.0, f64::INFINITY, f64::INFINITY),
        (1.0, 3000.0, 20000.0),
        (1.0, 2000.0, 20000.0),
        (1.0, 1500.0, 20000.0),
        (1.0, 1000.0, 20000.0),
        (1.0, 400.0, 20000.0),
        (1.0, 150.0, 20000.0),
    ];

    #[test]
    fn a_slow_link_with_compressible_pages_gets_zstd() {
        let sim = Sim {
            link: 12.5e6,
            table: PAGES,
            cores: 2,
        };
        let mut c = Chooser::new(true, Some(6), 2);
        let got = sim.run(&mut c, 40);
        assert!(matches!(got, Compression::Zstd(_)), "{got}");
        // At least twice what lz4 delivers there.
        let i = CANDIDATES.iter().position(|&x| x == got).unwrap();
        assert!(sim.delivered(i) >= 2.0 * sim.delivered(1));
    }

    #[test]
    fn a_gigabit_link_with_mixed_data_gets_the_level_the_cpus_can_feed() {
        let sim = Sim {
            link: 117e6,
            table: MIXED,
            cores: 2,
        };
        let mut c = Chooser::new(true, Some(6), 2);
        let got = sim.run(&mut c, 60);
        let i = CANDIDATES.iter().position(|&x| x == got).unwrap();
        let best = (0..7).map(|j| sim.delivered(j)).fold(0.0, f64::max);
        assert!(
            sim.delivered(i) >= 0.95 * best,
            "{got}: {} of {best}",
            sim.delivered(i)
        );
        assert!(sim.delivered(i) >= 1.15 * sim.delivered(1), "{got}");
    }

    #[test]
    fn incompressible_data_on_a_fast_link_goes_raw() {
        let sim = Sim {
            link: 2e9,
            table: RANDOM,
            cores: 2,
        };
        let mut c = Chooser::new(true, Some(6), 2);
        assert_eq!(sim.run(&mut c, 20), Compression::None);
    }

    #[test]
    fn it_follows_the_link_when_it_changes() {
        let mut sim = Sim {
            link: 12.5e6,
            table: PAGES,
            cores: 2,
        };
        let mut c = Chooser::new(true, Some(6), 2);
        let slow = sim.run(&mut c, 40);
        assert!(matches!(slow, Compression::Zstd(l) if l >= 1), "{slow}");
        // Much faster link: the CPU is the limit now, a cheaper codec wins.
        sim.link = 5e9;
        let fast = sim.run(&mut c, 400);
        let (i, j) = (
            CANDIDATES.iter().position(|&x| x == slow).unwrap(),
            CANDIDATES.iter().position(|&x| x == fast).unwrap(),
        );
        assert!(j < i, "{slow} then {fast}");
        let best = (0..7).map(|k| sim.delivered(k)).fold(0.0, f64::max);
        assert!(sim.delivered(j) >= 0.9 * best, "{fast}");
    }

    #[test]
    fn a_server_cap_and_a_server_without_zstd_are_respected() {
        let sim = Sim {
            link: 12.5e6,
            table: PAGES,
            cores: 2,
        };
        let mut capped = Chooser::new(true, Some(-1), 2);
        let got = sim.run(&mut capped, 40);
        assert!(matches!(got, Compression::Zstd(l) if l <= -1), "{got}");
        let mut old = Chooser::new(true, None, 2);
        assert_eq!(sim.run(&mut old, 40), Compression::Lz4);
    }

    #[test]
    fn windows_where_the_reader_set_the_pace_change_nothing() {
        let mut c = Chooser::new(true, Some(6), 2);
        for _ in 0..20 {
            c.window(Window {
                elapsed: Duration::from_millis(500),
                wire: 1000,
                decoded: 1000,
                busy: false,
            });
        }
        assert_eq!(c.current(), Compression::Zstd(1));
        assert_eq!(c.link(), None);
    }

    #[test]
    fn choices_parse() {
        assert_eq!("auto".parse(), Ok(CompressionChoice::Auto));
        assert_eq!(
            "zstd:3".parse(),
            Ok(CompressionChoice::Fixed(Compression::Zstd(3)))
        );
        let e = "fast".parse::<CompressionChoice>().unwrap_err();
        assert!(e.contains("auto, none, lz4"), "{e}");
    }
}
