//! How much CPU is to be had: the machine's idle time (`/proc/stat`) and this process's own
//! CPU time (`getrusage`), as averages between two samples. Both ends of a transfer use it to
//! judge what compression they can afford.

use std::time::{Duration, Instant};

/// What the CPUs did between two samples, in cores (1.0 = one core all the time).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuLoad {
    /// Cores of this machine.
    pub cores: u32,
    /// Cores' worth of idle time (idle and I/O wait).
    pub idle: f64,
    /// Cores' worth of CPU time this process used (user and system).
    pub process: f64,
}

impl CpuLoad {
    /// What this process could use: what it used plus what nobody did.
    pub fn available(&self) -> f64 {
        (self.process + self.idle).clamp(0.0, f64::from(self.cores))
    }
}

/// This machine's boot id (`/proc/sys/kernel/random/boot_id`, a UUID, as 16 bytes): the
/// same on both ends of a connection exactly when they run on one machine. `None` where it
/// cannot be read.
pub fn boot_id() -> Option<[u8; 16]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: Vec<u8> = text.trim().bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        id[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    (id != [0; 16]).then_some(id)
}

/// Samples CPU use; each [`CpuMeter::sample`] reports the average since the previous one.
#[derive(Debug, Default)]
pub struct CpuMeter {
    last: Option<Snapshot>,
}

#[derive(Debug, Clone, Copy)]
struct Snapshot {
    at: Instant,
    /// Idle and total clock ticks of all CPUs (`None` without `/proc/stat`).
    ticks: Option<(u64, u64)>,
    process: Duration,
}

fn snapshot() -> Snapshot {
    Snapshot {
        at: Instant::now(),
        ticks: machine_ticks(),
        process: process_cpu_time(),
    }
}

/// Idle (idle + iowait) and total ticks from the first line of `/proc/stat`.
fn machine_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line
        .split_whitespace()
        .take(8) // user nice system idle iowait irq softirq steal (guest is inside user)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    (v.len() == 8).then(|| (v[3] + v[4], v.iter().sum()))
}

/// User and system CPU time of this process.
fn process_cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct it is given; zeroed is a valid rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage for the calling process.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

impl CpuMeter {
    /// A meter whose first sample covers the time from now.
    pub fn new() -> CpuMeter {
        CpuMeter {
            last: Some(snapshot()),
        }
    }

    /// The average since the previous sample (or since [`CpuMeter::new`]); `None` when
    /// less than 50 ms passed (too little to say).
    pub fn sample(&mut self) -> Option<CpuLoad> {
        let now = snapshot();
        let Some(prev) = self.last else {
            self.last = Some(now);
            return None;
        };
        let wall = now.at.duration_since(prev.at).as_secs_f64();
        if wall < 0.05 {
            return None;
        }
        self.last = Some(now);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let idle = match (prev.ticks, now.ticks) {
            (Some((i0, t0)), Some((i1, t1))) if t1 > t0 => {
                f64::from(cores) * (i1.saturating_sub(i0)) as f64 / (t1 - t0) as f64
            }
            // No /proc/stat: assume nothing else runs here.
            _ => f64::from(cores),
        };
        let process = now.process.saturating_sub(prev.process).as_secs_f64() / wall;
        Some(CpuLoad {
            cores,
            idle,
            process,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_shows_as_process_time() {
        let mut m = CpuMeter::new();
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let load = m.sample().unwrap();
        assert!(x > 0);
        assert!(load.process > 0.5, "{load:?}");
        assert!(
            load.idle >= 0.0 && load.idle <= f64::from(load.cores) + 0.01,
            "{load:?}"
        );
        assert!(load.available() <= f64::from(load.cores));
        // Too soon for another.
        assert!(m.sample().is_none());
    }

    #[test]
    fn the_boot_id_is_read_and_stable() {
        let a = boot_id();
        assert!(a.is_some() || !std::path::Path::new("/proc/sys/kernel/random/boot_id").exists());
        assert_eq!(a, boot_id());
    }
}
