//! ferry-server: `ferryd` exports one directory, read-only, over the ferry protocol.
//!
//! - [`export`]: the exported directory; every path is resolved beneath it by the kernel
//!   (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), symlinks are never followed.
//! - `conn`: one connection: preamble, handshake, pipelined requests, bounded memory;
//!   responses written most urgent class first (`conn/writer.rs`), background reads capped
//!   per connection (`conn/handle.rs`).
//! - [`run`]: the accept loop, a connection limit, and shutdown that drains.
//!
//! The binary (`src/main.rs`) only parses arguments, owns the runtime and signals.

mod budget;
mod conn;
pub mod export;
mod fair;
mod names;
pub mod tls;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use ferry_util::{serve_metrics, AbortOnDrop};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tracing::{info, warn, Instrument};

pub use conn::ConnError;
pub use export::Export;

/// Server settings; [`Default`] gives the documented defaults.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Directory to export.
    pub export: PathBuf,
    /// Largest chunk size offered to clients (bytes).
    pub chunk_size: u32,
    /// Requests one connection may have in flight.
    pub max_inflight: u32,
    /// Connections served at once; more are refused with `Busy` (the client retries).
    pub max_connections: usize,
    /// Connections that have not finished their handshake (preamble, TLS, Hello, token) at
    /// once; more are refused with `Busy`.
    pub max_handshakes: usize,
    /// The same, from one source address.
    pub max_handshakes_per_address: usize,
    /// Bytes of file data the server may hold in buffers across all connections.
    pub memory_budget: usize,
    /// Time a client has to complete the preamble and handshake (a fifth of it while more
    /// than half of `max_handshakes` are in progress).
    pub handshake_timeout: Duration,
    /// A response (or flush) not written within this time closes the connection (a
    /// client that stops reading must not hold buffers forever).
    pub write_timeout: Duration,
    /// A connection with no request for this long, and none in flight, is closed (clients
    /// send keepalives well within it; a vanished client's connection does not stay).
    pub idle_timeout: Duration,
    /// TLS: when set, every connection must use it (plain clients are refused with
    /// `TlsRequired`). Replaceable while serving (ferryd's SIGHUP reads `--client-ca` again).
    pub tls: Option<Current<Arc<rustls::ServerConfig>>>,
    /// A shared token clients must prove they hold (challenge-response). Replaceable while
    /// serving (ferryd's SIGHUP reads `--token-file` again).
    pub token: Option<Current<Token>>,
    /// Where to serve Prometheus metrics (`GET /metrics`), if anywhere.
    pub metrics: Option<std::net::SocketAddr>,
    /// The highest zstd level spent on a client's request (a higher one is served at this
    /// level); `None`: zstd is not offered.
    pub max_compression_level: Option<i8>,
}

pub use ferry_proto::auth::Token;

/// A setting each new connection reads when it starts, replaceable while serving: connections
/// made after [`Current::set`] get the new value, those open keep the one they started with.
/// Clones share the value.
#[derive(Debug, Clone)]
pub struct Current<T>(Arc<std::sync::RwLock<T>>);

impl<T: Clone> Current<T> {
    /// Holds `value`.
    pub fn new(value: T) -> Self {
        Current(Arc::new(std::sync::RwLock::new(value)))
    }

    /// The value now.
    pub fn get(&self) -> T {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the value for connections from now on.
    pub fn set(&self, value: T) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = value;
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            export: PathBuf::from("."),
            chunk_size: ferry_proto::DEFAULT_CHUNK_SIZE,
            max_inflight: 64,
            max_connections: 512,
            max_handshakes: 64,
            max_handshakes_per_address: 16,
            memory_budget: 48 << 20,
            handshake_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(600),
            tls: None,
            token: None,
            metrics: None,
            max_compression_level: Some(DEFAULT_MAX_COMPRESSION_LEVEL),
        }
    }
}

/// Demand and prediction reads (Read, ReadDirData; ReadTree too) computed at once; more
/// wait for a fair turn. Half the blocking pool's threads, so stats and listings always find
/// one.
const READS_AT_ONCE: usize = 16;

/// The default highest zstd level ferryd compresses at: level 6 costs about four times the
/// CPU of level 1 per byte; above it the ratio grows little while the cost keeps climbing,
/// so a client asking for level 19 on every read cannot make ferryd spend 50 times the CPU.
pub const DEFAULT_MAX_COMPRESSION_LEVEL: i8 = 6;

/// State shared by all connections.
pub(crate) struct Shared {
    pub(crate) config: ServerConfig,
    pub(crate) export: Export,
    pub(crate) instance_id: [u8; 16],
    /// Every byte of responses computed and not yet written, shared fairly between the
    /// connections ([`budget`]).
    pub(crate) budget: Arc<budget::Budget>,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Whole-file hashes computed, by path and version (a mirror asks once per file).
    pub(crate) hashes: std::sync::Mutex<HashCache>,
    /// How busy the CPUs are, for [`Request::Load`](ferry_proto::Request::Load): the meter
    /// and its last reading.
    pub(crate) cpu: std::sync::Mutex<(ferry_util::cpu::CpuMeter, Option<ferry_util::cpu::CpuLoad>)>,
    /// Hashes computed at once: each reads a whole file, so they must not crowd out reads.
    pub(crate) hash_slots: Arc<Semaphore>,
    /// Turns at reading file data for demand and prediction reads, shared fairly between
    /// clients and their connections ([`fair`]).
    pub(crate) reads: Arc<fair::FairPool>,
    /// Per client, how long its connections were sending and the network set the pace.
    pub(crate) link_limits: Arc<conn::writer::LinkLimits>,
    pub(crate) stats: Stats,
}

/// What `--metrics` reports.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) connections: AtomicU64,
    pub(crate) connections_open: AtomicU64,
    pub(crate) requests: AtomicU64,
    pub(crate) inflight: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) bytes_wire: AtomicU64,
    pub(crate) bytes_decoded: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) auth_failures: AtomicU64,
    pub(crate) tls_failures: AtomicU64,
    pub(crate) protocol_errors: AtomicU64,
    pub(crate) stalled_closes: AtomicU64,
    pub(crate) busy_refusals: AtomicU64,
    /// Response bytes written (whole frames), indexed by the class's wire value.
    pub(crate) written: [AtomicU64; 3],
    /// Chunks of file data sent, by encoding (raw, lz4, zstd).
    pub(crate) encoded: [AtomicU64; 3],
    /// Listing requests received, by kind (ReadDir, ReadDirData, ReadTree).
    pub(crate) listings: [AtomicU64; 3],
}

impl Shared {
    /// How busy the CPUs were since the last time anyone asked (at least 50 ms; within
    /// that, the last reading again), and with `link` how the client's connections sent
    /// ([`conn::writer::LinkLimits`]).
    ///
    /// The process's CPU time is reported as `share` of it: the part spent for the asking
    /// client (its share of the work done for all clients), which is what the server can
    /// give that client's compression besides its idle time.
    pub(crate) fn load(
        &self,
        link: Option<ferry_proto::LinkTime>,
        share: f64,
    ) -> ferry_proto::ServerLoad {
        let mut g = self
            .cpu
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (meter, last) = &mut *g;
        if let Some(l) = meter.sample() {
            *last = Some(l);
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let permille = |x: f64| (x * 1000.0).round().clamp(0.0, f64::from(u32::MAX)) as u32;
        match last {
            Some(l) => ferry_proto::ServerLoad {
                cores: u16::try_from(l.cores).unwrap_or(u16::MAX),
                idle_permille: permille(l.idle),
                process_permille: permille(l.process * share),
                boot_id: ferry_util::cpu::boot_id().unwrap_or_default(),
                link,
            },
            None => ferry_proto::ServerLoad {
                cores: u16::try_from(cores).unwrap_or(u16::MAX),
                idle_permille: permille(cores as f64),
                process_permille: 0,
                boot_id: ferry_util::cpu::boot_id().unwrap_or_default(),
                link,
            },
        }
    }

    /// The Prometheus page.
    fn metrics_page(&self) -> String {
        let s = &self.stats;
        let g = |a: &AtomicU64| a.load(Relaxed);
        let mut e = ferry_proto::metrics::Exposition::new();
        e.gauge(
            "server_connected_clients",
            "Connections open now.",
            g(&s.connections_open) as f64,
        )
        .counter(
            "server_connections_total",
            "Connections accepted.",
            g(&s.connections),
        )
        .counter(
            "server_requests_total",
            "Requests received.",
            g(&s.requests),
        )
        .gauge(
            "server_inflight_requests",
            "Requests being served now.",
            g(&s.inflight) as f64,
        )
        .gauge(
            "server_budget_used_bytes",
            "Bytes of the memory budget reserved or held by responses now.",
            self.budget.used() as f64,
        )
        .counter(
            "server_busy_refusals_total",
            "Connections refused with Busy: the connection or handshake limits were reached.",
            g(&s.busy_refusals),
        )
        .counter(
            "server_stalled_closes_total",
            "Connections closed for sitting on memory others waited for (their client stopped reading).",
            g(&s.stalled_closes),
        )
        .counter(
            "server_chunks_total",
            "Read requests answered with data.",
            g(&s.reads),
        )
        .counter_by(
            "server_sent_bytes_total",
            "File bytes sent: as sent (wire, after compression) and decoded.",
            "kind",
            &[("wire", g(&s.bytes_wire)), ("decoded", g(&s.bytes_decoded))],
        )
        .counter_by(
            "server_encoded_chunks_total",
            "Chunks of file data sent, by how they went on the wire (a chunk asked for compressed goes raw when compressing does not save 1/16).",
            "encoding",
            &[
                ("raw", g(&s.encoded[0])),
                ("lz4", g(&s.encoded[1])),
                ("zstd", g(&s.encoded[2])),
            ],
        )
        .counter_by(
            "server_listings_total",
            "Listing requests received, by kind: a directory page, a page with small files' contents, a page of a tree's listings.",
            "kind",
            &[
                ("read_dir", g(&s.listings[0])),
                ("read_dir_data", g(&s.listings[1])),
                ("read_tree", g(&s.listings[2])),
            ],
        )
        .counter_by(
            "server_written_bytes_total",
            "Response bytes written to clients (whole frames), by the class they were written at: a read's class; every other response is demand.",
            "class",
            &ferry_proto::Class::ALL.map(|c| (c.as_str(), g(&s.written[usize::from(c.to_bits())]))),
        )
        .gauge(
            "server_compression_ratio",
            "Decoded bytes over wire bytes of file data sent so far.",
            g(&s.bytes_decoded) as f64 / (g(&s.bytes_wire).max(1)) as f64,
        )
        .counter(
            "server_error_responses_total",
            "Requests answered with an error status.",
            g(&s.errors),
        )
        .counter(
            "server_auth_failures_total",
            "Connections refused for a wrong token.",
            g(&s.auth_failures),
        )
        .counter(
            "server_tls_failures_total",
            "TLS handshakes that failed.",
            g(&s.tls_failures),
        )
        .counter(
            "server_protocol_errors_total",
            "Connections closed for breaking the protocol (or timing out the handshake).",
            g(&s.protocol_errors),
        );
        e.finish()
    }
}

impl Shared {
    fn new(config: ServerConfig, shutdown: watch::Receiver<bool>) -> std::io::Result<Arc<Shared>> {
        let export = Export::open(&config.export)?;
        let mut instance_id = [0u8; 16];
        rustix::rand::getrandom(&mut instance_id, rustix::rand::GetRandomFlags::empty())
            .map_err(std::io::Error::from)?;
        Ok(Arc::new(Shared {
            budget: budget::Budget::new(config.memory_budget as u64),
            export,
            instance_id,
            shutdown,
            config,
            hashes: std::sync::Mutex::new(HashCache::default()),
            cpu: std::sync::Mutex::new((ferry_util::cpu::CpuMeter::new(), None)),
            hash_slots: Arc::new(Semaphore::new(2)),
            reads: fair::FairPool::new(READS_AT_ONCE),
            link_limits: Arc::default(),
            stats: Stats::default(),
        }))
    }
}

/// For fuzzing (`fuzz/`): serves `input` as everything one client sends after the preamble
/// (so it starts with a Hello) on an export of `export`, collects and drops the server's
/// output, and returns when the connection ends (or after 2 s). Not a stable API.
#[doc(hidden)]
pub fn fuzz_serve(export: &std::path::Path, input: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    rt.block_on(async {
        let (_stop, stop_rx) = watch::channel(false);
        let config = ServerConfig {
            export: export.to_path_buf(),
            chunk_size: 64 << 10,
            ..ServerConfig::default()
        };
        let Ok(shared) = Shared::new(config, stop_rx) else {
            return;
        };
        let (client, server) = tokio::io::duplex(256 << 10);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        let serve = conn::serve(server, shared, deadline, None, None, None);
        let feed = async move {
            let (mut r, mut w) = tokio::io::split(client);
            let write = async {
                let _ = w.write_all(input).await;
                let _ = w.shutdown().await;
            };
            let drain = async {
                let mut sink = vec![0u8; 64 << 10];
                while matches!(r.read(&mut sink).await, Ok(n) if n > 0) {}
            };
            tokio::join!(write, drain);
        };
        let _ =
            tokio::time::timeout(Duration::from_secs(2), async { tokio::join!(serve, feed) }).await;
    });
}

/// Recently computed whole-file hashes, by path and kind (sparse or not) and version,
/// least recently inserted dropped first.
#[derive(Default)]
pub(crate) struct HashCache {
    map: std::collections::HashMap<(HashKey, ferry_proto::Version), [u8; 32]>,
    order: std::collections::VecDeque<(HashKey, ferry_proto::Version)>,
}

/// A file's path, and whether its hash is the sparse one.
pub(crate) type HashKey = (bytes::Bytes, bool);

impl HashCache {
    const KEEP: usize = 4096;

    pub(crate) fn get(&self, key: &HashKey, v: ferry_proto::Version) -> Option<[u8; 32]> {
        self.map.get(&(key.clone(), v)).copied()
    }

    pub(crate) fn insert(&mut self, key: HashKey, v: ferry_proto::Version, h: [u8; 32]) {
        if self.map.insert((key.clone(), v), h).is_none() {
            self.order.push_back((key, v));
            while self.order.len() > Self::KEEP {
                if let Some(k) = self.order.pop_front() {
                    self.map.remove(&k);
                }
            }
        }
    }
}

/// How long a connection with a place among the connections waits for a place among the
/// handshakes before it is refused `Busy`. A burst of connections from one address (many
/// streams of many clients behind one proxy or NAT) then queues briefly instead of being
/// refused and coming back with backoff: with 128 streams opening at once from one address,
/// the last clients' streams opened seconds late, and a handshake takes one round trip. As
/// many may wait as may handshake (in all and per address); the next are refused at once, so
/// what silent sockets from one address can hold stays bounded.
const HANDSHAKE_PLACE_WAIT: Duration = Duration::from_millis(500);

/// Handshakes in progress, in all and per source address.
#[derive(Debug)]
pub(crate) struct Handshakes {
    max: usize,
    per_address: usize,
    inner: std::sync::Mutex<Counts>,
    /// Connections waiting for a place ([`HANDSHAKE_PLACE_WAIT`]), in all and per address.
    waiting: std::sync::Mutex<Counts>,
    /// Woken whenever a place is given back.
    freed: tokio::sync::Notify,
}

/// Connections counted in all and per source address, each count bounded.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    total: usize,
    by_ip: std::collections::HashMap<std::net::IpAddr, usize>,
}

impl Counts {
    /// Counts one more from `ip` if neither bound is reached. No entry is left behind for an
    /// address refused with none counted: the map stays as small as the counts, whatever
    /// addresses knock.
    fn take(&mut self, ip: std::net::IpAddr, max: usize, per_address: usize) -> bool {
        let mine = self.by_ip.entry(ip).or_default();
        if self.total >= max || *mine >= per_address {
            if *mine == 0 {
                self.by_ip.remove(&ip);
            }
            return false;
        }
        *mine += 1;
        self.total += 1;
        true
    }

    /// Counts one less from `ip`.
    fn give_back(&mut self, ip: std::net::IpAddr) {
        self.total -= 1;
        if let Some(n) = self.by_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.by_ip.remove(&ip);
            }
        }
    }
}

fn lock_counts(m: &std::sync::Mutex<Counts>) -> std::sync::MutexGuard<'_, Counts> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One handshake's place; given back when it ends (or the connection does).
#[derive(Debug)]
pub(crate) struct InHandshake {
    handshakes: Arc<Handshakes>,
    ip: std::net::IpAddr,
}

impl Handshakes {
    fn new(max: usize, per_address: usize) -> Handshakes {
        Handshakes {
            max: max.max(1),
            per_address: per_address.max(1),
            inner: std::sync::Mutex::default(),
            waiting: std::sync::Mutex::default(),
            freed: tokio::sync::Notify::new(),
        }
    }

    /// A place for a handshake from `ip`, waiting up to `within` for one to be given back,
    /// if there is room to wait (as many as there are places, in all and per address).
    async fn wait_enter(
        self: &Arc<Self>,
        ip: std::net::IpAddr,
        within: Duration,
    ) -> Option<InHandshake> {
        struct Waiting<'a>(&'a Handshakes, std::net::IpAddr);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                lock_counts(&self.0.waiting).give_back(self.1);
            }
        }
        if !lock_counts(&self.waiting).take(ip, self.max, self.per_address) {
            return None;
        }
        let _waiting = Waiting(self, ip);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before looking, so a place given back in between is not missed.
            freed.as_mut().enable();
            if let Some(h) = self.enter(ip) {
                return Some(h);
            }
            tokio::time::timeout_at(deadline, freed).await.ok()?;
        }
    }

    fn enter(self: &Arc<Self>, ip: std::net::IpAddr) -> Option<InHandshake> {
        if !lock_counts(&self.inner).take(ip, self.max, self.per_address) {
            return None;
        }
        Some(InHandshake {
            handshakes: self.clone(),
            ip,
        })
    }
}

impl InHandshake {
    /// Whether more than half the handshake places are taken: handshakes then get a
    /// shorter deadline.
    pub(crate) fn under_pressure(&self) -> bool {
        lock_counts(&self.handshakes.inner).total * 2 > self.handshakes.max
    }
}

impl Drop for InHandshake {
    fn drop(&mut self) {
        lock_counts(&self.handshakes.inner).give_back(self.ip);
        self.handshakes.freed.notify_waiters();
    }
}

/// Serves `listener` until `shutdown` completes, then stops accepting, lets in-flight
/// responses go out (up to a few seconds) and returns.
///
/// # Errors
/// The export cannot be opened.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let metrics_addr = config.metrics;
    let shared = Shared::new(config, stop_rx)?;
    let _metrics = match metrics_addr {
        Some(addr) => {
            let l = TcpListener::bind(addr).await.map_err(|e| {
                std::io::Error::new(e.kind(), format!("--metrics {addr}: cannot listen: {e}"))
            })?;
            info!("metrics on http://{}/metrics", l.local_addr()?);
            let shared = shared.clone();
            Some(AbortOnDrop(tokio::spawn(serve_metrics(
                l,
                Arc::new(move || shared.metrics_page()),
            ))))
        }
        None => None,
    };
    let limit = Arc::new(Semaphore::new(shared.config.max_connections));
    let handshakes = Arc::new(Handshakes::new(
        shared.config.max_handshakes,
        shared.config.max_handshakes_per_address,
    ));
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        // A place among the connections, or a `Busy` refusal at once (a full server says
        // so); then a place among the handshakes in progress (also per address), waited for
        // briefly ([`HANDSHAKE_PLACE_WAIT`]), else `Busy`: silent sockets cannot queue
        // honest clients out.
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            shared.stats.busy_refusals.fetch_add(1, Relaxed);
            tasks.spawn(conn::refuse_busy(stream));
            continue;
        };
        let shared = shared.clone();
        let handshakes = handshakes.clone();
        let span = tracing::info_span!("conn", %peer);
        tasks.spawn(
            async move {
                let handshake = match handshakes.enter(peer.ip()) {
                    Some(h) => h,
                    None => match handshakes.wait_enter(peer.ip(), HANDSHAKE_PLACE_WAIT).await {
                        Some(h) => h,
                        None => {
                            shared.stats.busy_refusals.fetch_add(1, Relaxed);
                            // The refusal waits for the preamble: not on a connection's
                            // place, which silent sockets would then hold.
                            drop(permit);
                            conn::refuse_busy(stream).await;
                            return;
                        }
                    },
                };
                let st = &shared.stats;
                st.connections.fetch_add(1, Relaxed);
                st.connections_open.fetch_add(1, Relaxed);
                match conn::serve_tcp(stream, shared.clone(), handshake).await {
                    Ok(()) => tracing::debug!("closed"),
                    Err(ConnError::Io(e)) => tracing::debug!("closed: {e}"),
                    Err(e) => {
                        match e {
                            ConnError::AuthFailed => st.auth_failures.fetch_add(1, Relaxed),
                            ConnError::Tls(_) => st.tls_failures.fetch_add(1, Relaxed),
                            ConnError::Stalled => st.stalled_closes.fetch_add(1, Relaxed),
                            _ => st.protocol_errors.fetch_add(1, Relaxed),
                        };
                        warn!("closed connection: {e}")
                    }
                }
                st.connections_open.fetch_sub(1, Relaxed);
                drop(permit);
            }
            .instrument(span),
        );
        while tasks.try_join_next().is_some() {}
    }
    info!("shutting down: draining {} connections", tasks.len());
    let _ = stop_tx.send(true);
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(10), drain)
        .await
        .is_err()
    {
        warn!("connections still open after 10 s; closing them");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_page_shows_bytes_written_per_class() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_stop, rx) = watch::channel(false);
        let config = ServerConfig {
            export: dir.path().to_path_buf(),
            ..ServerConfig::default()
        };
        let shared = Shared::new(config, rx).expect("shared");
        for (i, n) in [7u64, 0, 1 << 20].into_iter().enumerate() {
            shared.stats.written[i].fetch_add(n, Relaxed);
        }
        let page = shared.metrics_page();
        assert!(
            page.contains("# TYPE ferry_server_written_bytes_total counter"),
            "{page}"
        );
        for line in [
            "ferry_server_written_bytes_total{class=\"demand\"} 7",
            "ferry_server_written_bytes_total{class=\"prediction\"} 0",
            "ferry_server_written_bytes_total{class=\"background\"} 1048576",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} in {page}");
        }
    }

    #[tokio::test]
    async fn a_handshake_waits_briefly_for_a_place_from_its_address() {
        let h = Arc::new(Handshakes::new(64, 2));
        let ip: std::net::IpAddr = [127, 0, 0, 1].into();
        let first = h.enter(ip).expect("a place");
        let _second = h.enter(ip).expect("a place");
        assert!(h.enter(ip).is_none(), "two per address");
        // Another address is not held back.
        let _other = h.enter([127, 0, 0, 2].into()).expect("a place");
        // A place given back while the third waits goes to it.
        let waiting = tokio::spawn({
            let h = h.clone();
            async move { h.wait_enter(ip, Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(first);
        let _third = waiting.await.expect("task").expect("the freed place");
        // None given back: refused once the wait is over.
        assert!(h.wait_enter(ip, Duration::from_millis(50)).await.is_none());
        // Addresses refused for the total limit leave nothing behind.
        let full = Arc::new(Handshakes::new(1, 1));
        let _only = full.enter(ip).expect("a place");
        assert!(full.enter([10, 0, 0, 9].into()).is_none());
        assert_eq!(full.inner.lock().unwrap().by_ip.len(), 1);
        // As many wait as may handshake from one address; the next is refused at once.
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let h = h.clone();
                tokio::spawn(async move { h.wait_enter(ip, Duration::from_secs(5)).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t = tokio::time::Instant::now();
        assert!(h.wait_enter(ip, Duration::from_secs(5)).await.is_none());
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "refused without waiting"
        );
        for w in waiters {
            w.abort();
        }
    }
}
