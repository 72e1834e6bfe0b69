//! The connection pool: several TCP streams to one server, used together.
//!
//! A [`Client`] opens `streams` connections at once and keeps them: each pipelines many
//! requests, and each request goes to the stream the schedule picks, so one big file's
//! chunks are spread over all streams. A request whose stream is lost is sent again on
//! another (all requests are reads, so this is safe), and lost streams are reconnected in
//! the background.
//!
//! Layout, one stage per file:
//! - `pool/handshake.rs`: opening a stream — TCP, preamble, TLS, then ferry-proto's
//!   handshake machine;
//! - `pool/conn.rs`: a connection's tasks — writer, reader, watchdog — and its pending
//!   requests;
//! - `pool/schedule.rs`: the fetch scheduler — per class (demand, prediction, background)
//!   which stream carries each request, how many background bytes may be in flight (a
//!   delay controller's window, fed by round-trip samples and probes), how big a
//!   background piece is;
//! - `pool/reconnect.rs`: the supervisor that re-establishes lost streams;
//! - `pool/calls.rs`: the typed calls (`stat`, `read`, `read_dir`, ...) over
//!   [`Client::call`].
//!
//! Invariant: every stream reaches the same server process with the same chunk size and
//! features; a stream that would not is refused (at connect) or not adopted (at reconnect).

mod calls;
mod compress;
mod conn;
mod handshake;
mod reconnect;
mod s3conn;
mod schedule;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ferry_proto::{Class, DirEntry, Request, Response, Version, DEFAULT_CHUNK_SIZE};
use tokio::sync::{mpsc, oneshot, Notify};

use self::conn::{start_conn, Outgoing};
use self::handshake::open_stream;
use self::schedule::{Sample, Schedule, SMALL_SAMPLE};
use crate::error::ClientError;

pub use self::compress::CompressionStatus;
pub use self::schedule::SchedulerStats;
use crate::codec::CompressionChoice;

/// How to reach the server and how many streams to use.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` of ferryd.
    pub addr: String,
    /// TCP connections used together.
    pub streams: usize,
    /// Chunk size asked for (the server may choose smaller).
    pub chunk_size: u32,
    /// How reads are compressed: `auto` (the default) or one codec.
    pub compression: CompressionChoice,
    /// Limit for connecting and the handshake.
    pub connect_timeout: Duration,
    /// Identification in the server's log.
    pub client_name: String,
    /// How long a request may wait for the server — through lost streams and reconnects —
    /// before it fails ([`ClientError::Unreachable`]).
    pub request_timeout: Duration,
    /// A stream with requests outstanding that receives nothing for this long is taken for
    /// dead: it is closed, its requests go to other streams, and it is reconnected.
    pub stall_timeout: Duration,
    /// An idle stream sends a Ping after this long without traffic (finds dead connections
    /// before a reader does, and keeps the server's idle timeout from closing it).
    pub keepalive: Duration,
    /// Connect with TLS, verifying the server this way.
    pub tls: Option<crate::tls::TlsClient>,
    /// Prove this token when the server asks for one.
    pub token: Option<crate::tls::Token>,
    /// Read an S3 bucket instead of a ferryd (`addr` is then its `s3://BUCKET` label;
    /// `tls` and `token` do not apply).
    pub s3: Option<crate::s3::S3Config>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            addr: "127.0.0.1:7070".into(),
            streams: 8,
            chunk_size: DEFAULT_CHUNK_SIZE,
            compression: CompressionChoice::Auto,
            connect_timeout: Duration::from_secs(10),
            client_name: format!("ferry {}", env!("CARGO_PKG_VERSION")),
            request_timeout: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(15),
            keepalive: Duration::from_secs(30),
            tls: None,
            token: None,
            s3: None,
        }
    }
}

/// Parameters of the session, from the server's Welcome.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// Chunk size in effect.
    pub chunk_size: u32,
    /// Feature bits in effect.
    pub features: u64,
    /// The server process's random id.
    pub instance_id: [u8; 16],
    /// Requests allowed in flight per stream.
    pub max_inflight: u32,
    /// The highest zstd level the server compresses at (`None`: no zstd).
    pub zstd_max_level: Option<i8>,
}

/// Counters for benchmarks and status.
#[derive(Debug, Default)]
pub struct Counters {
    /// Payload bytes received on the wire.
    pub wire_bytes: AtomicU64,
    /// Bytes after decoding.
    pub decoded_bytes: AtomicU64,
    /// Read requests completed.
    pub reads: AtomicU64,
    /// Requests sent again because their stream was lost.
    pub retries: AtomicU64,
    /// Read payloads that failed their checksum (each was fetched again).
    pub checksum_failures: AtomicU64,
    /// Streams re-established after being lost.
    pub reconnects: AtomicU64,
    /// Streams closed because they stalled (requests outstanding, nothing received).
    pub stalls: AtomicU64,
    /// Times the server was found to have restarted (a new instance id).
    pub server_restarts: AtomicU64,
}

/// One entry of a listing with contents ([`Client::read_dir_data`]).
#[derive(Debug, Clone)]
pub struct Listed {
    /// Name, cookie and attributes. With `data`, the attributes of the version read.
    pub entry: DirEntry,
    /// The whole file, decoded and verified, when it came with the listing.
    pub data: Option<SmallFile>,
}

/// The verified contents of a small file that came with its listing.
#[derive(Debug, Clone)]
pub struct SmallFile {
    /// All the file's bytes.
    pub data: Bytes,
    /// Their BLAKE3-256 (the server's; the bytes passed the transfer checksum).
    pub blake3: [u8; 32],
    /// Bytes they took on the wire (encoded).
    pub wire_len: usize,
}

/// A read's result.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// The bytes, decoded and checksum-verified.
    pub data: Bytes,
    /// The version of the file they were read from.
    pub version: Version,
    /// Their size on the wire.
    pub wire_len: usize,
    /// The whole file's BLAKE3, when the read returned the whole file.
    pub file_hash: Option<[u8; 32]>,
}

/// A pool of connections to one ferryd. Cheap to clone.
///
/// Every request has a class ([`Class`]), the handle's: demand (a reader waits for it; the
/// default), prediction (read-ahead; [`Client::with_class`]) or background (a mirror
/// filling a local copy; [`Client::background`]). Reads carry their class on the wire
/// when the session has the PRIORITY feature, so ferryd answers the urgent ones first.
/// Background requests yield to the others:
/// - all background bytes in flight together stay within a window that a delay
///   controller keeps small while readers are active (so the link's queue stays short)
///   and large when none is (so the mirror runs at full speed);
/// - while readers are active, background reads go in pieces of about 0.5 ms of link time;
/// - each stream carries at most one chunk's worth of background bytes at a time, and
///   while readers are active (a demand or prediction request in the last second),
///   background requests use only the first half of the streams, leaving the others to
///   the readers, which pick the stream with the least outstanding bytes.
///
/// (`pool/schedule.rs` has the details.)
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    class: Class,
}

struct Inner {
    config: ClientConfig,
    /// The streams and the choice among them.
    schedule: Schedule,
    session: SessionInfo,
    /// The server instance the streams are connected to (changes when it restarts).
    instance: Mutex<[u8; 16]>,
    /// The compression reads ask for.
    codec: compress::Codec,
    counters: Arc<Counters>,
    /// Woken whenever a stream is (re)connected.
    changed: Notify,
    /// Tells the supervisor that a slot's connection ended.
    dead: mpsc::UnboundedSender<usize>,
    /// The bucket the streams read, for an S3 source.
    s3: Option<Arc<crate::s3::S3Source>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("streams", &self.inner.schedule.slots().len())
            .field("session", &self.inner.session)
            .finish()
    }
}

impl Client {
    /// Opens `config.streams` connections (concurrently) and returns once the first has
    /// completed its handshake; the others join the pool as they complete theirs (one that
    /// fails, or reaches another server process or settings, is opened again with backoff,
    /// as after a lost connection).
    ///
    /// # Errors
    /// No stream connects and completes its handshake within `connect_timeout`: the first
    /// failure.
    pub async fn connect(mut config: ClientConfig) -> Result<Client, ClientError> {
        if let Some(s3) = config.s3.clone() {
            return Client::connect_s3(config, s3).await;
        }
        // One name for all this client's streams (and their reconnects), told apart from
        // other clients': the server shares its memory per client as well as per connection.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        config.client_name = format!(
            "{} session {:08x}{:08x}",
            config.client_name,
            std::process::id(),
            nanos
        );
        let n = config.streams.max(1);
        // Every stream is opened at once; the pool starts on the first one open and the
        // others join as they open ([`join_late_streams`]). Beside a link others fill, each
        // leg of a handshake waits in the link's queue, and a copy need not wait for the
        // slowest of them.
        let (opened_tx, mut opened_rx) = mpsc::unbounded_channel();
        for _ in 0..n {
            let (cfg, tx) = (config.clone(), opened_tx.clone());
            tokio::spawn(async move {
                let r = tokio::time::timeout(cfg.connect_timeout, open_stream(&cfg))
                    .await
                    .map_err(|_| ClientError::Timeout(cfg.connect_timeout))
                    .and_then(|r| r);
                let _ = tx.send(r);
            });
        }
        drop(opened_tx);
        let mut failed = 0;
        let mut first_error = None;
        let opened = loop {
            match opened_rx.recv().await {
                Some(Ok(o)) => break o,
                Some(Err(e)) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
                // Every stream failed: the first failure says why.
                None => return Err(first_error.unwrap_or(ClientError::ConnectionLost)),
            }
        };
        if let Some(e) = first_error {
            tracing::debug!(
                "a stream to {} did not open: {e}; trying again",
                config.addr
            );
        }
        let first = &opened.welcome;
        let session = SessionInfo {
            chunk_size: first.chunk_size,
            features: first.features,
            instance_id: first.instance_id,
            max_inflight: first.max_inflight,
            zstd_max_level: first.zstd_max_level,
        };
        let counters = Arc::new(Counters::default());
        let config_auto = config.compression == CompressionChoice::Auto;
        let (dead_tx, dead_rx) = mpsc::unbounded_channel();
        let chunk = session.chunk_size.max(4096) as usize;
        let mut conns = vec![start_conn(
            opened,
            0,
            dead_tx.clone(),
            &config,
            counters.clone(),
        )];
        conns.extend((1..n).map(|_| conn::not_open()));
        let inner = Arc::new(Inner {
            codec: compress::Codec::new(
                config.compression,
                session.features,
                session.zstd_max_level,
            ),
            instance: Mutex::new(session.instance_id),
            config,
            schedule: Schedule::new(conns, chunk),
            session,
            counters,
            changed: Notify::new(),
            dead: dead_tx,
            s3: None,
        });
        // Streams that failed to open are the supervisor's to open; the others join.
        for slot in n - failed..n {
            let _ = inner.dead.send(slot);
        }
        tokio::spawn(join_late_streams(
            Arc::downgrade(&inner),
            opened_rx,
            1..n - failed,
        ));
        tokio::spawn(reconnect::supervise(Arc::downgrade(&inner), dead_rx));
        tokio::spawn(schedule::run_probes(Arc::downgrade(&inner)));
        if config_auto {
            tokio::spawn(compress::run(Arc::downgrade(&inner)));
        }
        Ok(Client {
            inner,
            class: Class::Demand,
        })
    }

    /// A pool over an S3 bucket: `config.streams` streams spread over its gateways (see
    /// [`crate::s3`]). At least one gateway must answer; the others are opened once they do.
    async fn connect_s3(
        config: ClientConfig,
        s3: crate::s3::S3Config,
    ) -> Result<Client, ClientError> {
        let source = Arc::new(crate::s3::S3Source::new(s3, config.stall_timeout)?);
        let endpoints = source.endpoints();
        let probes = (0..endpoints).map(|e| {
            let (s, t) = (source.clone(), config.connect_timeout);
            async move {
                match tokio::time::timeout(t, s.probe(e)).await {
                    Ok(r) => r,
                    Err(_) => Err(format!("no answer within {t:?}")),
                }
            }
        });
        let up = futures_join_all(probes).await;
        if up.iter().all(Result::is_err) {
            let why: Vec<String> = up.into_iter().filter_map(Result::err).collect();
            return Err(ClientError::S3(format!(
                "cannot use {}: {}",
                source.label(),
                why.join("; ")
            )));
        }
        for (e, r) in up.iter().enumerate() {
            if let Err(why) = r {
                tracing::warn!(
                    "S3 endpoint {}: {why}; skipped until it answers",
                    source.config().endpoints[e]
                );
            }
        }
        let session = SessionInfo {
            chunk_size: config.chunk_size.clamp(4096, 16 << 20),
            features: ferry_proto::features::PRIORITY | ferry_proto::features::READ_HASH,
            instance_id: source.instance(),
            max_inflight: s3conn::S3_INFLIGHT,
            zstd_max_level: None,
        };
        let (dead_tx, dead_rx) = mpsc::unbounded_channel();
        let n = config.streams.max(1);
        let mut down = Vec::new();
        let conns = (0..n)
            .map(|slot| {
                let e = slot % endpoints;
                if up[e].is_ok() {
                    s3conn::start_s3_conn(source.clone(), e, slot, dead_tx.clone())
                } else {
                    down.push(slot);
                    conn::not_open()
                }
            })
            .collect();
        let chunk = session.chunk_size as usize;
        let inner = Arc::new(Inner {
            codec: compress::Codec::new(
                CompressionChoice::Fixed(ferry_proto::Compression::None),
                session.features,
                None,
            ),
            instance: Mutex::new(session.instance_id),
            config: ClientConfig {
                addr: source.label(),
                ..config
            },
            schedule: Schedule::new(conns, chunk),
            session,
            counters: Arc::new(Counters::default()),
            changed: Notify::new(),
            dead: dead_tx.clone(),
            s3: Some(source),
        });
        for slot in down {
            let _ = dead_tx.send(slot);
        }
        tokio::spawn(reconnect::supervise(Arc::downgrade(&inner), dead_rx));
        tokio::spawn(schedule::run_probes(Arc::downgrade(&inner)));
        Ok(Client {
            inner,
            class: Class::Demand,
        })
    }

    /// The S3 source the streams read, if the pool reads one.
    pub fn s3(&self) -> Option<&Arc<crate::s3::S3Source>> {
        self.inner.s3.as_ref()
    }

    /// How many bytes of consecutive chunks one read should bring, when the source prefers
    /// long reads to one per chunk: an S3 store, where each ranged GET costs the store a
    /// request and a look-up of the object's blocks ([`crate::chunks::RUN_BYTES`], in
    /// aligned groups). `None` for ferryd, which streams chunks over its connections anyway.
    pub fn run_bytes(&self) -> Option<u64> {
        let chunk = u64::from(self.session().chunk_size);
        (self.inner.s3.is_some() && chunk < crate::chunks::RUN_BYTES)
            .then_some(crate::chunks::RUN_BYTES)
    }

    /// A handle on the same streams whose requests have class `class` (see [`Client`]).
    pub fn with_class(&self, class: Class) -> Client {
        Client {
            inner: self.inner.clone(),
            class,
        }
    }

    /// A handle on the same streams whose requests are background work: they yield to
    /// demand and prediction requests (see [`Client`]). Same as
    /// `with_class(Class::Background)`.
    pub fn background(&self) -> Client {
        self.with_class(Class::Background)
    }

    /// Whether this handle's requests are background work.
    pub fn is_background(&self) -> bool {
        self.class == Class::Background
    }

    /// The class of this handle's requests.
    pub fn class(&self) -> Class {
        self.class
    }

    /// What the fetch scheduler is doing now: base round trip, queueing delay and its
    /// target, the background window and piece size, bytes received per class.
    pub fn scheduler_stats(&self) -> SchedulerStats {
        self.inner.schedule.stats()
    }

    /// Session parameters.
    pub fn session(&self) -> &SessionInfo {
        &self.inner.session
    }

    /// Transfer counters.
    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Background bytes in flight on each stream (each at most one chunk; all together at
    /// most the background window when each was admitted).
    pub fn background_in_flight(&self) -> Vec<u64> {
        self.inner.schedule.background_in_flight()
    }

    /// Requests sent and not yet answered, over all streams.
    pub fn inflight(&self) -> usize {
        inflight_of(&self.inner)
    }

    /// The compression reads ask for now, and how well it does.
    pub fn compression(&self) -> CompressionStatus {
        self.inner.codec.status()
    }

    /// Demand and prediction requests (readers wait for them) sent and not yet answered.
    /// Background work that competes for CPU or disk defers to them.
    pub fn demand_in_flight(&self) -> usize {
        self.inner.schedule.foreground_in_flight()
    }

    /// Whether readers are active: a demand or prediction request was made within the
    /// last second.
    pub fn readers_active(&self) -> bool {
        self.inner.schedule.foreground_active()
    }

    /// Streams connected now.
    pub fn live_streams(&self) -> usize {
        self.inner
            .schedule
            .slots()
            .iter()
            .filter(|s| s.alive())
            .count()
    }

    /// Waits until some stream is connected, or `deadline`. Returns whether one is.
    async fn wait_for_stream(&self, deadline: tokio::time::Instant) -> bool {
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.live_streams() > 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.live_streams() > 0;
            }
        }
    }

    /// Sends one request and waits for its response. A request whose stream is lost is
    /// sent again on another (all requests are reads, so this is safe); while no stream is
    /// connected it waits for a reconnect, up to the request timeout. So is one whose
    /// response was garbled on the way, up to [`UNDECODABLE_TRIES`] times: one that did not
    /// decode (its stream is closed then; a flipped bit in a frame header does that), or a
    /// response of another request's kind (a flipped bit in its request id).
    ///
    /// # Errors
    /// The server stays unreachable for the request timeout; protocol violations (a
    /// response garbled [`UNDECODABLE_TRIES`] times); the server's error status.
    pub async fn call(&self, request: Request) -> Result<Response, ClientError> {
        let timeout = self.inner.config.request_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut garbled = 0;
        loop {
            let result = match self.call_once(request.clone()).await {
                // Error responses became `Remote`: a success answers with its request's
                // kind and the response bit.
                Ok((r, _)) if r.kind() != request.kind() | 0x80 => {
                    Err(ClientError::Protocol(format!(
                        "a response of kind 0x{:02x} answered a request of kind 0x{:02x}",
                        r.kind(),
                        request.kind()
                    )))
                }
                r => r,
            };
            match result {
                Err(e @ (ClientError::Decode(_) | ClientError::Protocol(_)))
                    if garbled + 1 < UNDECODABLE_TRIES =>
                {
                    garbled += 1;
                    tracing::warn!(
                        "a response from {} was garbled ({e}); asking again",
                        self.inner.config.addr
                    );
                    if !self.wait_for_stream(deadline).await {
                        return Err(e);
                    }
                    self.inner.counters.retries.fetch_add(1, Ordering::Relaxed);
                }
                Err(ClientError::ConnectionLost) => {
                    if tokio::time::Instant::now() >= deadline
                        || !self.wait_for_stream(deadline).await
                    {
                        return Err(ClientError::Unreachable {
                            addr: self.inner.config.addr.clone(),
                            waited: timeout,
                        });
                    }
                    self.inner.counters.retries.fetch_add(1, Ordering::Relaxed);
                }
                Ok((mut response, id)) => {
                    // The binding to the request (BOUND) taken out: callers check the
                    // plain checksums, and fail them if this does not answer `request`.
                    if self.session().features & ferry_proto::features::BOUND != 0 {
                        response.bind(id, &request);
                    }
                    return Ok(response);
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn call_once(&self, request: Request) -> Result<(Response, u32), ClientError> {
        // Holds the stream's load (and background budgets) until this call ends, also when
        // it is cancelled.
        let assignment = self.inner.schedule.assign(&request, self.class).await?;
        let conn = &assignment.conn;
        // The scheduler's samples: small demand requests (their own transfer time is
        // negligible next to the queue's).
        let sample = match &request {
            Request::Ping => Some(Sample::Probe),
            Request::Read { len, .. }
                if self.class == Class::Demand && u64::from(*len) <= SMALL_SAMPLE =>
            {
                Some(Sample::Read)
            }
            _ => None,
        };
        // A background read's round trip sizes the pieces at the window's floor
        // (`schedule/delay.rs`).
        let piece = match &request {
            Request::Read { len, .. } if self.class == Class::Background => Some(u64::from(*len)),
            _ => None,
        };
        let timed = sample.is_some() || piece.is_some();
        let result = async {
            let _permit = conn
                .inflight
                .acquire()
                .await
                .map_err(|_| ClientError::ConnectionLost)?;
            let (tx, rx) = oneshot::channel();
            conn.tx
                .send(Outgoing {
                    request,
                    reply: tx,
                    timed,
                })
                .await
                .map_err(|_| ClientError::ConnectionLost)?;
            rx.await.map_err(|_| ClientError::ConnectionLost)?
        }
        .await;
        let answer = result?;
        drop(assignment);
        if let (Some(rtt), Some(kind)) = (answer.rtt, sample) {
            self.inner.schedule.on_sample(kind, rtt);
        }
        if let (Some(rtt), Some(bytes)) = (answer.rtt, piece) {
            self.inner.schedule.on_piece(bytes, rtt);
        }
        match answer.response {
            Response::Error { status, message } => Err(ClientError::Remote { status, message }),
            r => Ok((r, answer.id)),
        }
    }
}

/// How many times a request whose response comes garbled ([`Client::call`]) is sent: a
/// frame garbled on the way comes right the next time; a server that keeps sending one
/// breaks the protocol.
pub const UNDECODABLE_TRIES: u32 = 3;

/// Runs futures concurrently and collects their outputs in order (small helper to avoid
/// a dependency on `futures` for one function).
async fn futures_join_all<F>(futs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futs.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        match h.await {
            Ok(v) => out.push(v),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    out
}

/// Takes the streams [`Client::connect`] opened after the first into `slots` as they open
/// (`opened` yields each attempt's result). One that fails to open, or reaches another
/// server, is left to the supervisor, which keeps trying with backoff.
async fn join_late_streams(
    inner: std::sync::Weak<Inner>,
    mut opened: mpsc::UnboundedReceiver<Result<handshake::Opened, ClientError>>,
    mut slots: std::ops::Range<usize>,
) {
    while let Some(r) = opened.recv().await {
        let (Some(inner), Some(slot)) = (inner.upgrade(), slots.next()) else {
            return;
        };
        let why = match r {
            Ok(o) => match inner.adopt(slot, o) {
                Ok(()) => {
                    inner.changed.notify_waiters();
                    continue;
                }
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        tracing::debug!(
            "stream {slot} to {} did not open: {why}; trying again",
            inner.config.addr
        );
        let _ = inner.dead.send(slot);
    }
}

/// Requests sent on `inner`'s streams and not yet answered.
fn inflight_of(inner: &Inner) -> usize {
    let max = inner.session.max_inflight as usize;
    inner
        .schedule
        .slots()
        .iter()
        .map(|s| s.current())
        // A stream not open (or lost) has nothing in flight, whatever its placeholder's
        // permits say.
        .filter(|c| c.alive.load(Ordering::Relaxed))
        .map(|c| max.saturating_sub(c.inflight.available_permits()))
        .sum()
}
