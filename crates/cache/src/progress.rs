//! Progress counters of a mirror run ([`Progress`]) and the status `ferry status` shows
//! ([`Status`], with its [`State`]): for a directory the file `status.json` in its state folder
//! (replaced in place about once a second), for a mount the JSON it serves at its root;
//! the same status is the `--metrics` page ([`Status::to_prometheus`]).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Errors kept for the status file (the most recent ones).
const KEPT_ERRORS: usize = 20;
/// Bytes allocated for the status file (its JSON is padded with spaces to this size).
pub const STATUS_SPACE: usize = 64 << 10;

/// Live counters of one run. Shared by the engine's tasks.
#[derive(Debug)]
pub struct Progress {
    started: Instant,
    started_unix: u64,
    /// Bytes of all files found so far.
    pub bytes_total: AtomicU64,
    /// Bytes present locally (already there, or fetched this run).
    pub bytes_done: AtomicU64,
    /// Bytes fetched from the server this run (decoded).
    pub bytes_fetched: AtomicU64,
    /// Regular files found so far.
    pub files_total: AtomicU64,
    /// Files complete and verified.
    pub files_done: AtomicU64,
    /// Files verified this run (hash compared).
    pub files_verified: AtomicU64,
    /// Chunks fetched this run.
    pub chunks_fetched: AtomicU64,
    /// Chunks fetched again after a failed attempt (checksum, I/O).
    pub chunks_refetched: AtomicU64,
    /// Whole files fetched again because the hash did not match.
    pub hash_mismatches: AtomicU64,
    /// Files that changed on the server while being copied (then copied again).
    pub files_changed: AtomicU64,
    /// Directories, symlinks and other entries created.
    pub others_done: AtomicU64,
    /// Sockets, and devices when not root, not copied.
    pub specials_skipped: AtomicU64,
    /// Local entries removed because the server no longer has them (`--delete`).
    pub deleted: AtomicU64,
    /// The first of them, export-relative, for the summary.
    pub deleted_paths: Mutex<Vec<String>>,
    /// The whole tree has been listed.
    pub walk_done: AtomicBool,
    errors: Mutex<Vec<String>>,
    error_count: AtomicU64,
    rate: Mutex<RateWindow>,
    /// The connection pool whose fault counters the status shows.
    client: std::sync::OnceLock<ferry_client::Client>,
}

#[derive(Debug, Default)]
struct RateWindow {
    samples: std::collections::VecDeque<(Instant, u64)>,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            started: Instant::now(),
            started_unix: unix_now(),
            bytes_total: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
            bytes_fetched: AtomicU64::new(0),
            files_total: AtomicU64::new(0),
            files_done: AtomicU64::new(0),
            files_verified: AtomicU64::new(0),
            chunks_fetched: AtomicU64::new(0),
            chunks_refetched: AtomicU64::new(0),
            hash_mismatches: AtomicU64::new(0),
            files_changed: AtomicU64::new(0),
            others_done: AtomicU64::new(0),
            specials_skipped: AtomicU64::new(0),
            deleted: AtomicU64::new(0),
            deleted_paths: Mutex::new(Vec::new()),
            walk_done: AtomicBool::new(false),
            errors: Mutex::new(Vec::new()),
            error_count: AtomicU64::new(0),
            rate: Mutex::new(RateWindow::default()),
            client: std::sync::OnceLock::new(),
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Progress {
    /// Records an error (kept for the status file, counted).
    pub fn error(&self, mut msg: String) {
        tracing::warn!("{msg}");
        self.error_count.fetch_add(1, Ordering::Relaxed);
        if msg.len() > 1000 {
            let mut at = 1000;
            while !msg.is_char_boundary(at) {
                at -= 1;
            }
            msg.truncate(at);
        }
        let mut e = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        if e.len() == KEPT_ERRORS {
            e.remove(0);
        }
        e.push(msg);
    }

    /// Errors so far.
    pub fn error_count(&self) -> u64 {
        self.error_count.load(Ordering::Relaxed)
    }

    /// Seconds since the run started.
    pub fn elapsed(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Fetch rate over the last ~5 s (bytes/s); the run's average before that.
    pub fn rate(&self) -> f64 {
        let now = Instant::now();
        let fetched = self.bytes_fetched.load(Ordering::Relaxed);
        let mut w = self.rate.lock().unwrap_or_else(|e| e.into_inner());
        w.samples.push_back((now, fetched));
        while w.samples.len() > 2
            && w.samples
                .front()
                .is_some_and(|(t, _)| now.duration_since(*t).as_secs_f64() > 5.0)
        {
            w.samples.pop_front();
        }
        match w.samples.front() {
            Some((t, b)) if now.duration_since(*t).as_secs_f64() > 0.5 => {
                (fetched - b) as f64 / now.duration_since(*t).as_secs_f64()
            }
            _ => fetched as f64 / self.elapsed().max(1e-3),
        }
    }

    /// Shows `client`'s fault counters (retries, checksum failures, reconnects, stalls,
    /// server restarts) and its fetch scheduler in the snapshots.
    pub fn attach_client(&self, client: &ferry_client::Client) {
        let _ = self.client.set(client.clone());
    }

    /// A snapshot for the status file, in `state`, of a run of `remote`.
    pub fn snapshot(&self, state: State, remote: &str) -> Status {
        let faults = self.client.get().map(|c| {
            let k = c.counters();
            Faults {
                retries: k.retries.load(Ordering::Relaxed),
                checksum_failures: k.checksum_failures.load(Ordering::Relaxed),
                reconnects: k.reconnects.load(Ordering::Relaxed),
                stalls: k.stalls.load(Ordering::Relaxed),
                server_restarts: k.server_restarts.load(Ordering::Relaxed),
                live_streams: c.live_streams() as u64,
                inflight_requests: c.inflight() as u64,
                wire_bytes: k.wire_bytes.load(Ordering::Relaxed),
                decoded_bytes: k.decoded_bytes.load(Ordering::Relaxed),
                chunks: k.reads.load(Ordering::Relaxed),
            }
        });
        let scheduler = self.client.get().map(SchedulerStatus::of);
        let rate = self.rate();
        let total = self.bytes_total.load(Ordering::Relaxed);
        let done = self.bytes_done.load(Ordering::Relaxed);
        let walk_done = self.walk_done.load(Ordering::Relaxed);
        Status {
            state,
            pid: std::process::id(),
            remote: remote.to_string(),
            started_unix: self.started_unix,
            updated_unix: unix_now(),
            elapsed_secs: self.elapsed(),
            walk_done,
            bytes_total: total,
            bytes_done: done,
            bytes_fetched: self.bytes_fetched.load(Ordering::Relaxed),
            files_total: self.files_total.load(Ordering::Relaxed),
            files_done: self.files_done.load(Ordering::Relaxed),
            files_verified: self.files_verified.load(Ordering::Relaxed),
            chunks_fetched: self.chunks_fetched.load(Ordering::Relaxed),
            chunks_refetched: self.chunks_refetched.load(Ordering::Relaxed),
            hash_mismatches: self.hash_mismatches.load(Ordering::Relaxed),
            files_changed: self.files_changed.load(Ordering::Relaxed),
            specials_skipped: self.specials_skipped.load(Ordering::Relaxed),
            deleted: self.deleted.load(Ordering::Relaxed),
            rate_bytes_per_sec: rate,
            eta_secs: (walk_done && rate > 0.0).then(|| total.saturating_sub(done) as f64 / rate),
            error_count: self.error_count(),
            errors: self
                .errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            faults: faults.unwrap_or_default(),
            scheduler,
            mount: None,
        }
    }
}

/// The `state` of a status: where a mirror run (or a mount) is. The serde names are the
/// values of the status JSON (`ferry status --json`), documented in docs/CONFIGURATION.md;
/// no other value is ever written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// A mirror pass is running (or was, when its process died: `ferry status` then
    /// reports [`State::Interrupted`]).
    Running,
    /// The last pass ended with the whole tree complete and verified.
    Complete,
    /// The last pass ended with errors; for a mount's mirror also: waiting to retry.
    Incomplete,
    /// The run was stopped (Ctrl-C, unmount, a dead process) before it ended; the next run
    /// resumes.
    Interrupted,
    /// A mount without `--mirror`, or whose mirror has not started (or was stopped).
    Mounted,
}

impl State {
    /// The value as it appears in the status JSON (`"running"`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Complete => "complete",
            State::Incomplete => "incomplete",
            State::Interrupted => "interrupted",
            State::Mounted => "mounted",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `ferry status` shows: the state of the last or running mirror of a directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// Where the run (or the mount) is.
    pub state: State,
    /// Process that wrote it.
    pub pid: u32,
    /// What is mirrored (HOST:PORT:/PATH).
    pub remote: String,
    /// When the run started (Unix seconds).
    pub started_unix: u64,
    /// When this was written (Unix seconds).
    pub updated_unix: u64,
    /// Seconds the run has taken.
    pub elapsed_secs: f64,
    /// The whole export has been listed (totals are final).
    pub walk_done: bool,
    /// Bytes of all regular files.
    pub bytes_total: u64,
    /// Bytes present locally.
    pub bytes_done: u64,
    /// Bytes fetched this run.
    pub bytes_fetched: u64,
    /// Regular files.
    pub files_total: u64,
    /// Files complete and verified.
    pub files_done: u64,
    /// Files whose hash was compared this run.
    pub files_verified: u64,
    /// Chunks fetched this run.
    pub chunks_fetched: u64,
    /// Chunks fetched again after a failed attempt.
    pub chunks_refetched: u64,
    /// Files fetched again after a hash mismatch.
    pub hash_mismatches: u64,
    /// Files that changed on the server while being copied.
    pub files_changed: u64,
    /// Sockets, and devices when not root, not copied.
    #[serde(default)]
    pub specials_skipped: u64,
    /// Local entries removed because the server no longer has them (`--delete`).
    #[serde(default)]
    pub deleted: u64,
    /// Recent fetch rate.
    pub rate_bytes_per_sec: f64,
    /// Estimated seconds left (once the walk is done).
    pub eta_secs: Option<f64>,
    /// Errors so far.
    pub error_count: u64,
    /// The most recent errors.
    pub errors: Vec<String>,
    /// What the connection pool went through.
    #[serde(default)]
    pub faults: Faults,
    /// The fetch scheduler of the process's connection pool (absent in a status file
    /// written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerStatus>,
    /// Present when the status is a mount's (`ferry status MOUNTPOINT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<MountStatus>,
}

/// What the connection pool's fetch scheduler is doing: the delay controller that keeps
/// background (mirror) traffic from queueing ahead of readers, and the bytes received per
/// class ([`ferry_client::SchedulerStats`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SchedulerStatus {
    /// The base round trip (minimum of the last minute), microseconds; 0 before the first
    /// sample.
    pub base_rtt_us: u64,
    /// Recent round trips above the base, microseconds.
    pub queue_delay_us: u64,
    /// The queueing delay the background window aims at, microseconds.
    pub target_us: u64,
    /// Background bytes allowed in flight.
    pub background_window: u64,
    /// Background bytes in flight.
    pub background_in_flight: u64,
    /// Size of a background read piece, bytes.
    pub piece_size: u64,
    /// Delivered bytes per second (all classes; 0 until measured).
    pub rate_bytes_per_sec: u64,
    /// Bytes received for demand reads (readers waiting).
    pub demand_bytes: u64,
    /// Bytes received for prediction reads (read-ahead).
    pub prediction_bytes: u64,
    /// Bytes received for background reads (the mirror).
    pub background_bytes: u64,
    /// A reader made a request within the last second.
    pub readers_active: bool,
    /// How long the process's foreground threads waited for a CPU over the last 100 ms, per
    /// mille of it, summed over the threads; `None` while not measured (no background work
    /// in flight).
    #[serde(default)]
    pub cpu_wait_permille: Option<u64>,
    /// Background bytes per second allowed while readers are short of CPU; 0: no pace.
    #[serde(default)]
    pub background_pace: u64,
    /// What was asked for: `auto`, or a fixed codec (`zstd:3`, `lz4`, `none`).
    #[serde(default)]
    pub compression_choice: String,
    /// The codec reads ask for now (`zstd:1`, `lz4`, `none`).
    #[serde(default)]
    pub compression: String,
    /// Decoded over wire bytes in the last half second with traffic.
    #[serde(default)]
    pub compression_ratio: f64,
    /// With `auto`: the link's estimated capacity, wire bytes per second (0: not yet
    /// measured).
    #[serde(default)]
    pub link_bytes_per_sec: u64,
    /// With `auto` and a server that says whether the network set the pace: whether it did
    /// in the last busy quarter second (`false`: `link_bytes_per_sec` may be only what the
    /// link carried, not its capacity).
    #[serde(default)]
    pub link_limits: Option<bool>,
}

impl SchedulerStatus {
    /// The scheduler of `client`'s pool now.
    pub fn of(client: &ferry_client::Client) -> SchedulerStatus {
        let s = client.scheduler_stats();
        let z = client.compression();
        let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        SchedulerStatus {
            base_rtt_us: us(s.base_rtt),
            queue_delay_us: us(s.queue_delay),
            target_us: us(s.target),
            background_window: s.background_window,
            background_in_flight: s.background_in_flight,
            piece_size: s.piece_size,
            rate_bytes_per_sec: s.rate,
            demand_bytes: s.demand_bytes,
            prediction_bytes: s.prediction_bytes,
            background_bytes: s.background_bytes,
            readers_active: s.readers_active,
            cpu_wait_permille: s.cpu_wait.map(|x| (x * 1000.0).round() as u64),
            background_pace: s.background_pace.unwrap_or(0),
            compression_choice: z.choice.to_string(),
            compression: z.current.to_string(),
            compression_ratio: z.ratio,
            link_bytes_per_sec: z.link.map_or(0, |l| l as u64),
            link_limits: z.link_limits,
        }
    }
}

/// Faults the connection pool met and recovered from (all zero on a healthy network).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Faults {
    /// Requests sent again because their stream was lost.
    pub retries: u64,
    /// Read payloads that failed their checksum and were fetched again.
    pub checksum_failures: u64,
    /// Streams re-established after being lost.
    pub reconnects: u64,
    /// Streams closed because they stalled.
    pub stalls: u64,
    /// Times the server was found restarted (a new instance id).
    pub server_restarts: u64,
    /// Streams connected when the status was taken.
    pub live_streams: u64,
    /// Requests sent and not yet answered.
    #[serde(default)]
    pub inflight_requests: u64,
    /// File bytes received as sent (after lz4).
    #[serde(default)]
    pub wire_bytes: u64,
    /// The same after decoding.
    #[serde(default)]
    pub decoded_bytes: u64,
    /// Read requests answered with data.
    #[serde(default)]
    pub chunks: u64,
}

/// What a mount adds to its status: its reads and its local copy.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MountStatus {
    /// Where it is mounted.
    pub mountpoint: String,
    /// The local copy, if any.
    pub cache_dir: Option<String>,
    /// Whether a background mirror fills the local copy (`--mirror`).
    pub mirror: bool,
    /// Background transfer cap (bytes per second), if any.
    pub bwlimit: Option<u64>,
    /// Seconds between the background mirror's passes once one completed (`--rescan`).
    #[serde(default)]
    pub rescan_secs: Option<u64>,
    /// Bytes received from the server, as sent (compressed) and decoded, for readers and
    /// the mirror together.
    pub wire_bytes: u64,
    /// The same bytes after decoding.
    pub decoded_bytes: u64,
    /// Chunks read from the local copy instead of the server.
    pub chunks_served_locally: u64,
    /// Chunks read for readers and written into the local copy.
    pub chunks_stored: u64,
    /// Failures to write the local copy.
    pub store_errors: u64,
    /// Files completed by readers and verified.
    pub files_verified_by_reads: u64,
    /// Opens served with FUSE passthrough (local disk speed).
    pub passthrough_opens: u64,
    /// Small files fetched ahead whose bytes went into the kernel's page cache at their
    /// open: their reads never reached the mount.
    #[serde(default)]
    pub files_given_at_open: u64,
}

impl Status {
    /// Writes `status.json` into state folder `meta`. The file is allocated once at
    /// [`STATUS_SPACE`] bytes and rewritten in place, padded with spaces, so the status can
    /// still be written — and say why — when the disk is full.
    ///
    /// # Errors
    /// I/O errors; a status too large for the space.
    pub fn write(&self, meta: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        if json.len() > STATUS_SPACE {
            return Err(std::io::Error::other("status too large"));
        }
        json.resize(STATUS_SPACE, b' ');
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(meta.join("status.json"))?;
        if f.metadata()?.len() < STATUS_SPACE as u64 {
            rustix::fs::fallocate(
                &f,
                rustix::fs::FallocateFlags::empty(),
                0,
                STATUS_SPACE as u64,
            )?;
        }
        f.write_all_at(&json, 0)
    }

    /// Reads `status.json` from state folder `meta`.
    ///
    /// # Errors
    /// Missing or unreadable file.
    pub fn read(meta: &Path) -> std::io::Result<Status> {
        // A read racing a rewrite may see a mix of two versions: read again once.
        let mut last = None;
        for _ in 0..3 {
            let raw = std::fs::read(meta.join("status.json"))?;
            match serde_json::from_slice(&raw) {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Err(std::io::Error::other(
            last.map_or_else(String::new, |e| e.to_string()),
        ))
    }
}

impl Status {
    /// This status as a Prometheus page (names `ferry_…`), for `--metrics`.
    pub fn to_prometheus(&self) -> String {
        let f = &self.faults;
        let mut e = ferry_proto::metrics::Exposition::new();
        e.counter_by(
            "received_bytes_total",
            "File bytes received from ferryd: as sent (wire, after compression) and decoded.",
            "kind",
            &[("wire", f.wire_bytes), ("decoded", f.decoded_bytes)],
        )
        .gauge(
            "compression_ratio",
            "Decoded bytes over wire bytes received so far.",
            f.decoded_bytes as f64 / f.wire_bytes.max(1) as f64,
        )
        .counter(
            "chunks_total",
            "Read requests answered with data.",
            f.chunks,
        )
        .gauge(
            "inflight_requests",
            "Requests sent and not yet answered.",
            f.inflight_requests as f64,
        )
        .gauge(
            "connected_streams",
            "Streams connected to ferryd now.",
            f.live_streams as f64,
        )
        .counter(
            "retries_total",
            "Requests sent again after their stream was lost.",
            f.retries,
        )
        .counter(
            "checksum_failures_total",
            "Payloads that failed their checksum and were fetched again.",
            f.checksum_failures,
        )
        .counter("reconnects_total", "Streams re-established.", f.reconnects)
        .counter(
            "stalls_total",
            "Streams closed because they stalled.",
            f.stalls,
        )
        .counter(
            "server_restarts_total",
            "Times ferryd was found restarted.",
            f.server_restarts,
        )
        .gauge(
            "mirror_bytes_done",
            "Bytes of regular files present and recorded in the local copy (mirror).",
            self.bytes_done as f64,
        )
        .gauge(
            "mirror_bytes_total",
            "Bytes of regular files in the tree (mirror; grows while listing).",
            self.bytes_total as f64,
        )
        .gauge(
            "mirror_files_done",
            "Files complete and verified (mirror).",
            self.files_done as f64,
        )
        .gauge(
            "mirror_files_total",
            "Regular files in the tree (mirror).",
            self.files_total as f64,
        )
        .counter(
            "mirror_errors_total",
            "Errors of the mirror.",
            self.error_count,
        )
        .gauge(
            "mirror_running",
            "1 while a mirror pass runs.",
            f64::from(u8::from(self.state == State::Running)),
        );
        if let Some(s) = &self.scheduler {
            let (codec, level) = match s.compression.split_once(':') {
                Some((codec, level)) => (codec, level.parse().unwrap_or(0.0)),
                None => (s.compression.as_str(), 0.0),
            };
            e.gauge_labelled(
                "compression_level",
                "The codec reads ask for now (label codec: none, lz4 or zstd; label choice: auto or the fixed codec asked for) and its level (zstd; 0 otherwise).",
                &[("codec", codec), ("choice", &s.compression_choice)],
                level,
            )
            .gauge(
                "compression_recent_ratio",
                "Decoded over wire bytes in the last half second with traffic.",
                s.compression_ratio,
            )
            .gauge(
                "compression_link_bytes_per_second",
                "With --compression auto: the link's estimated capacity, wire bytes per second (0: not measured yet).",
                s.link_bytes_per_sec as f64,
            );
            let secs = |us: u64| us as f64 / 1e6;
            e.gauge(
                "scheduler_base_rtt_seconds",
                "Base round trip to ferryd: the minimum of the last minute.",
                secs(s.base_rtt_us),
            )
            .gauge(
                "scheduler_queue_delay_seconds",
                "Recent round trips above the base (queueing on the way).",
                secs(s.queue_delay_us),
            )
            .gauge(
                "scheduler_target_delay_seconds",
                "Queueing delay the background window aims at.",
                secs(s.target_us),
            )
            .gauge(
                "scheduler_background_window_bytes",
                "Background (mirror) bytes allowed in flight.",
                s.background_window as f64,
            )
            .gauge(
                "scheduler_background_in_flight_bytes",
                "Background (mirror) bytes in flight.",
                s.background_in_flight as f64,
            )
            .gauge(
                "scheduler_piece_bytes",
                "Size of a background read piece.",
                s.piece_size as f64,
            )
            .gauge(
                "scheduler_rate_bytes_per_second",
                "Delivered bytes per second, all classes.",
                s.rate_bytes_per_sec as f64,
            )
            .counter_by(
                "scheduler_received_bytes_total",
                "Bytes received from ferryd (decoded), by request class.",
                "class",
                &[
                    ("demand", s.demand_bytes),
                    ("prediction", s.prediction_bytes),
                    ("background", s.background_bytes),
                ],
            )
            .gauge(
                "scheduler_readers_active",
                "1 while readers are active (a request in the last second).",
                f64::from(u8::from(s.readers_active)),
            )
            .gauge(
                "scheduler_cpu_wait_ratio",
                "Share of the last 100 ms the foreground threads waited for a CPU, summed (0 when not measured).",
                s.cpu_wait_permille.map_or(0.0, |p| p as f64 / 1000.0),
            )
            .gauge(
                "scheduler_background_pace_bytes_per_second",
                "Background bytes per second allowed while readers are short of CPU (0: none).",
                s.background_pace as f64,
            );
        }
        if let Some(m) = &self.mount {
            e.counter(
                "cache_hits_total",
                "Chunks read from the local copy instead of ferryd.",
                m.chunks_served_locally,
            )
            .counter(
                "cache_misses_total",
                "Chunks read from ferryd (not in the local copy).",
                f.chunks,
            )
            .counter(
                "cache_stored_chunks_total",
                "Chunks read for readers and written into the local copy.",
                m.chunks_stored,
            )
            .counter(
                "cache_store_errors_total",
                "Failures to write the local copy.",
                m.store_errors,
            )
            .counter(
                "passthrough_opens_total",
                "Opens served with FUSE passthrough.",
                m.passthrough_opens,
            )
            .counter(
                "files_given_at_open_total",
                "Small files fetched ahead whose bytes went into the kernel's page cache at their open.",
                m.files_given_at_open,
            );
        }
        e.finish()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may panic on setup failures

    use super::*;

    #[test]
    fn states_have_the_documented_json_names() {
        for (state, name) in [
            (State::Running, "running"),
            (State::Complete, "complete"),
            (State::Incomplete, "incomplete"),
            (State::Interrupted, "interrupted"),
            (State::Mounted, "mounted"),
        ] {
            assert_eq!(
                serde_json::to_string(&state).unwrap(),
                format!("\"{name}\"")
            );
            assert_eq!(
                serde_json::from_str::<State>(&format!("\"{name}\"")).unwrap(),
                state
            );
            assert_eq!(state.to_string(), name);
        }
        assert!(serde_json::from_str::<State>("\"retrying\"").is_err());
    }

    #[test]
    fn a_status_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let s = Progress::default().snapshot(State::Interrupted, "h:1");
        s.write(dir.path()).unwrap();
        let raw = std::fs::read_to_string(dir.path().join("status.json")).unwrap();
        assert!(raw.contains("\"state\": \"interrupted\""), "{raw}");
        assert_eq!(Status::read(dir.path()).unwrap(), s);
    }
}
