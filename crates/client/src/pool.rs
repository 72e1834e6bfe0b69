//! The connection pool: several TCP streams to one server, used together.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ferry_proto::preamble::{self, Transport, PREAMBLE_LEN};
use ferry_proto::{
    features, payload, Attr, DirEntry, FileHash, Frame, Handshake, Hello, Request, Response,
    StatFs, Version, Welcome, DEFAULT_CHUNK_SIZE, HANDSHAKE_MAX_FRAME, PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tracing::{debug, info, warn};

use crate::error::ClientError;

/// How to reach the server and how many streams to use.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` of ferryd.
    pub addr: String,
    /// TCP connections used together.
    pub streams: usize,
    /// Chunk size asked for (the server may choose smaller).
    pub chunk_size: u32,
    /// Allow lz4-compressed payloads.
    pub compression: bool,
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
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            addr: "127.0.0.1:7070".into(),
            streams: 8,
            chunk_size: DEFAULT_CHUNK_SIZE,
            compression: true,
            connect_timeout: Duration::from_secs(10),
            client_name: format!("ferry {}", env!("CARGO_PKG_VERSION")),
            request_timeout: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(15),
            keepalive: Duration::from_secs(30),
            tls: None,
            token: None,
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
}

type Reply = oneshot::Sender<Result<Response, ClientError>>;

struct Outgoing {
    request: Request,
    reply: Reply,
}

/// One connection: a writer task fed by `tx`, a reader task completing `pending`, a
/// watchdog for stalls and keepalives.
struct Conn {
    tx: mpsc::Sender<Outgoing>,
    inflight: Arc<Semaphore>,
    alive: Arc<AtomicBool>,
    /// Ends the reader (which then ends the writer and the watchdog).
    kill: Arc<Notify>,
    instance_id: [u8; 16],
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The pool let go of this connection: close it.
        self.kill.notify_one();
    }
}

/// One of the pool's streams: its current connection (replaced when it is reconnected)
/// and what outlives connections.
struct Slot {
    conn: Mutex<Arc<Conn>>,
    /// Bytes requested and not yet answered: the scheduling load.
    load: AtomicU64,
    /// Bytes of background requests in flight allowed (one chunk's worth): a foreground
    /// read on this stream waits behind at most that much background data.
    background: Arc<Semaphore>,
    /// A reconnect task is running for this slot.
    reconnecting: AtomicBool,
}

impl Slot {
    fn current(&self) -> Arc<Conn> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn alive(&self) -> bool {
        self.current().alive.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
struct Pending {
    next_id: u32,
    waiting: HashMap<u32, Reply>,
    closed: bool,
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
/// Requests are foreground (a reader waits for them) or, through a handle from
/// [`Client::background`], background (a mirror filling a local copy). Background requests
/// yield to foreground ones:
/// - each stream carries at most one chunk's worth of background bytes at a time, so a
///   foreground read waits behind at most one background chunk on its stream;
/// - while foreground requests are being made (one in the last second), background
///   requests use only the first half of the streams, leaving the others to the readers,
///   which pick the stream with the least outstanding bytes.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
    background: bool,
}

struct Inner {
    config: ClientConfig,
    slots: Vec<Slot>,
    session: SessionInfo,
    /// The server instance the streams are connected to (changes when it restarts).
    instance: Mutex<[u8; 16]>,
    compression: bool,
    next: AtomicUsize,
    counters: Arc<Counters>,
    /// Reference point of `last_foreground`.
    started: Instant,
    /// When the last foreground request was made (ms since `started`, plus one; 0: never).
    last_foreground: AtomicU64,
    /// Each stream's background budget in bytes (one chunk).
    background_budget: usize,
    /// Woken whenever a stream is (re)connected.
    changed: Notify,
    /// Tells the supervisor that a slot's connection ended.
    dead: mpsc::UnboundedSender<usize>,
}

/// How long after a foreground request background requests keep to their half of the
/// streams.
const FOREGROUND_QUIET: Duration = Duration::from_secs(1);

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("streams", &self.inner.slots.len())
            .field("session", &self.inner.session)
            .finish()
    }
}

/// The two halves of a connection, plain or TLS.
type Halves = (
    Box<dyn AsyncRead + Send + Unpin>,
    Box<dyn AsyncWrite + Send + Unpin>,
);

/// The host part of `host:port` (`[v6]:port` too), as a TLS server name.
fn server_name(addr: &str) -> Result<rustls::pki_types::ServerName<'static>, String> {
    let host = match addr.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']'),
        None => addr,
    };
    rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host} cannot be checked against a certificate: {e}"))
}

async fn open_stream(cfg: &ClientConfig) -> Result<(Halves, Welcome, BytesMut), ClientError> {
    let addr = cfg.addr.clone();
    let hs_err = |reason: String| ClientError::Handshake {
        addr: addr.clone(),
        reason,
    };
    let mut stream = TcpStream::connect(&cfg.addr)
        .await
        .map_err(|e| ClientError::Connect {
            addr: cfg.addr.clone(),
            reason: e.to_string(),
        })?;
    stream.set_nodelay(true).ok();
    let asked = if cfg.tls.is_some() {
        Transport::Tls
    } else {
        Transport::Plain
    };
    stream
        .write_all(&preamble::client_preamble(asked))
        .await
        .map_err(|e| hs_err(e.to_string()))?;
    let mut pre = [0u8; PREAMBLE_LEN];
    stream.read_exact(&mut pre).await.map_err(|e| {
        hs_err(format!(
            "the server closed the connection during the preamble ({e}); is it a ferryd?"
        ))
    })?;
    let transport = preamble::parse_server_preamble(&pre).map_err(|e| hs_err(e.to_string()))?;
    if transport != asked {
        return Err(hs_err(format!(
            "server answered with transport {transport:?}, asked for {asked:?}"
        )));
    }
    let (mut rd, mut wr): Halves = match &cfg.tls {
        None => {
            let (r, w) = stream.into_split();
            (Box::new(r), Box::new(w))
        }
        Some(tls) => {
            let name = server_name(&cfg.addr).map_err(hs_err)?;
            let s = tokio_rustls::TlsConnector::from(tls.config.clone())
                .connect(name, stream)
                .await
                .map_err(|e| hs_err(crate::tls::explain(&e)))?;
            let (r, w) = tokio::io::split(s);
            (Box::new(r), Box::new(w))
        }
    };
    let mut out = BytesMut::new();
    Handshake::Hello(Hello {
        version: PROTOCOL_VERSION,
        features: if cfg.compression {
            features::ALL
        } else {
            features::ALL & !features::LZ4
        },
        chunk_size: cfg.chunk_size,
        client_name: cfg.client_name.clone(),
    })
    .encode(&mut out);
    wr.write_all(&out)
        .await
        .map_err(|e| hs_err(e.to_string()))?;
    wr.flush().await.map_err(|e| hs_err(e.to_string()))?;
    let mut buf = BytesMut::with_capacity(1024);
    let w = match read_handshake(&mut rd, &mut buf).await.map_err(&hs_err)? {
        Handshake::Welcome(w) => w,
        Handshake::Failed { status, message } => {
            return Err(hs_err(format!("{status}: {message}")))
        }
        other => return Err(hs_err(format!("unexpected handshake message {other:?}"))),
    };
    if !(ferry_proto::MIN_CHUNK_SIZE..=ferry_proto::MAX_CHUNK_SIZE).contains(&w.chunk_size)
        || w.max_frame < w.chunk_size + 256
        || w.max_frame > ferry_proto::MAX_CHUNK_SIZE + ferry_proto::FRAME_OVERHEAD
        || w.max_inflight == 0
    {
        return Err(hs_err(format!("unusable session parameters {w:?}")));
    }
    if cfg.token.is_some() && w.auth == ferry_proto::AuthMethod::None {
        return Err(hs_err(
            "the server did not ask for the token, so it cannot prove it holds it: it is not the ferryd you meant, or it runs without --token-file"
                .into(),
        ));
    }
    if let ferry_proto::AuthMethod::Token { challenge } = &w.auth {
        let Some(token) = &cfg.token else {
            return Err(hs_err(
                "the server requires a token: give --token-file FILE (the same token as ferryd's)"
                    .into(),
            ));
        };
        let mut nonce = [0u8; 32];
        rustls::crypto::ring::default_provider()
            .secure_random
            .fill(&mut nonce)
            .map_err(|_| hs_err("no random numbers for the token proof".into()))?;
        let key = token.key();
        let mut out = BytesMut::new();
        Handshake::AuthProof(ferry_proto::AuthProof {
            client_nonce: nonce,
            proof: ferry_proto::auth::client_proof(key, challenge, &nonce),
        })
        .encode(&mut out);
        wr.write_all(&out)
            .await
            .map_err(|e| hs_err(e.to_string()))?;
        wr.flush().await.map_err(|e| hs_err(e.to_string()))?;
        match read_handshake(&mut rd, &mut buf).await.map_err(&hs_err)? {
            Handshake::AuthOk(ok) => {
                let want = ferry_proto::auth::server_proof(key, challenge, &nonce);
                if !ferry_proto::auth::same(&want, &ok.server_proof) {
                    return Err(hs_err(
                        "the server could not prove it holds the token: it is not the ferryd you meant"
                            .into(),
                    ));
                }
            }
            Handshake::Failed { status, message } => {
                return Err(hs_err(format!("{status}: {message}")))
            }
            other => return Err(hs_err(format!("unexpected handshake message {other:?}"))),
        }
    }
    Ok(((rd, wr), w, buf))
}

/// Reads one handshake frame (bytes past it stay in `buf`).
async fn read_handshake(
    rd: &mut Box<dyn AsyncRead + Send + Unpin>,
    buf: &mut BytesMut,
) -> Result<Handshake, String> {
    let frame = loop {
        if let Some(f) = Frame::parse(buf, HANDSHAKE_MAX_FRAME).map_err(|e| e.to_string())? {
            break f;
        }
        let n = rd.read_buf(buf).await.map_err(|e| {
            // TLS 1.3 reports a refused client certificate only now, as an alert.
            if e.get_ref().is_some_and(|x| x.is::<rustls::Error>()) {
                crate::tls::explain(&e)
            } else {
                e.to_string()
            }
        })?;
        if n == 0 {
            return Err(
                "the server closed the connection during the handshake (wrong token, or a client certificate required?)"
                    .into(),
            );
        }
    };
    Handshake::decode(frame).map_err(|e| e.to_string())
}

impl Client {
    /// Opens `config.streams` connections (concurrently) and completes their handshakes.
    ///
    /// # Errors
    /// Any stream fails to connect or handshake within `connect_timeout`.
    pub async fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        let n = config.streams.max(1);
        let attempts = (0..n).map(|_| {
            let cfg = config.clone();
            async move {
                tokio::time::timeout(cfg.connect_timeout, open_stream(&cfg))
                    .await
                    .map_err(|_| ClientError::Timeout(cfg.connect_timeout))?
            }
        });
        let mut opened = Vec::with_capacity(n);
        for r in futures_join_all(attempts).await {
            opened.push(r?);
        }
        // All streams must reach the same server process with the same parameters (a
        // load balancer in front of several ferryd would break chunk consistency).
        let first = &opened[0].1;
        if let Some((_, other, _)) = opened.iter().find(|(_, w, _)| {
            w.instance_id != first.instance_id
                || w.chunk_size != first.chunk_size
                || w.features != first.features
        }) {
            return Err(ClientError::Handshake {
                addr: config.addr.clone(),
                reason: format!(
                    "streams reached different server instances or settings ({:?} vs {:?})",
                    first, other
                ),
            });
        }
        let session = {
            let w = &opened[0].1;
            SessionInfo {
                chunk_size: w.chunk_size,
                features: w.features,
                instance_id: w.instance_id,
                max_inflight: w.max_inflight,
            }
        };
        let counters = Arc::new(Counters::default());
        let (dead_tx, dead_rx) = mpsc::unbounded_channel();
        let background_budget = session.chunk_size.max(4096) as usize;
        let slots = opened
            .into_iter()
            .enumerate()
            .map(|(i, (stream, w, leftover))| Slot {
                conn: Mutex::new(Arc::new(start_conn(
                    stream,
                    &w,
                    leftover,
                    i,
                    dead_tx.clone(),
                    &config,
                    counters.clone(),
                ))),
                load: AtomicU64::new(0),
                background: Arc::new(Semaphore::new(background_budget)),
                reconnecting: AtomicBool::new(false),
            })
            .collect();
        let inner = Arc::new(Inner {
            compression: config.compression && session.features & features::LZ4 != 0,
            instance: Mutex::new(session.instance_id),
            config,
            slots,
            session,
            next: AtomicUsize::new(0),
            counters,
            started: Instant::now(),
            last_foreground: AtomicU64::new(0),
            background_budget,
            changed: Notify::new(),
            dead: dead_tx,
        });
        tokio::spawn(supervise(Arc::downgrade(&inner), dead_rx));
        Ok(Client {
            inner,
            background: false,
        })
    }

    /// A handle on the same streams whose requests are background work: they yield to
    /// foreground requests (see [`Client`]).
    pub fn background(&self) -> Client {
        Client {
            inner: self.inner.clone(),
            background: true,
        }
    }

    /// Whether this handle's requests are background work.
    pub fn is_background(&self) -> bool {
        self.background
    }

    /// Session parameters.
    pub fn session(&self) -> &SessionInfo {
        &self.inner.session
    }

    /// Transfer counters.
    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Background bytes in flight on each stream (each at most one chunk).
    pub fn background_in_flight(&self) -> Vec<u64> {
        let budget = self.inner.background_budget;
        self.inner
            .slots
            .iter()
            .map(|s| budget.saturating_sub(s.background.available_permits()) as u64)
            .collect()
    }

    /// Requests sent and not yet answered, over all streams.
    pub fn inflight(&self) -> usize {
        let max = self.inner.session.max_inflight as usize;
        self.inner
            .slots
            .iter()
            .map(|s| max.saturating_sub(s.current().inflight.available_permits()))
            .sum()
    }

    /// Streams connected now.
    pub fn live_streams(&self) -> usize {
        self.inner.slots.iter().filter(|s| s.alive()).count()
    }

    /// Picks the live stream with the least outstanding bytes; ties rotate.
    fn pick(&self) -> Result<(&Slot, Arc<Conn>), ClientError> {
        let slots = &self.inner.slots;
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
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

    fn now_ms(&self) -> u64 {
        self.inner.started.elapsed().as_millis() as u64 + 1
    }

    /// Whether a foreground request was made within [`FOREGROUND_QUIET`].
    fn foreground_active(&self) -> bool {
        let last = self.inner.last_foreground.load(Ordering::Relaxed);
        last != 0 && self.now_ms().saturating_sub(last) < FOREGROUND_QUIET.as_millis() as u64
    }

    /// Picks a stream for a background request: among the streams background work may use
    /// now, the live one with the most background budget left (ties: least load).
    fn pick_background(&self) -> Result<(&Slot, Arc<Conn>), ClientError> {
        let slots = &self.inner.slots;
        let usable = if self.foreground_active() {
            slots.len().div_ceil(2)
        } else {
            slots.len()
        };
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
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
    /// connected it waits for a reconnect, up to the request timeout.
    ///
    /// # Errors
    /// The server stays unreachable for the request timeout; protocol violations; the
    /// server's error status.
    pub async fn call(&self, request: Request) -> Result<Response, ClientError> {
        let timeout = self.inner.config.request_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.call_once(request.clone()).await {
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
                r => return r,
            }
        }
    }

    async fn call_once(&self, request: Request) -> Result<Response, ClientError> {
        let weight = match &request {
            Request::Read { len, .. } => u64::from(*len),
            _ => 4096,
        };
        let (slot, conn, _background) = if self.background {
            let (slot, conn) = self.pick_background()?;
            let budget = self.inner.background_budget as u64;
            let units = weight.clamp(4096, budget) as u32;
            let permit = slot
                .background
                .clone()
                .acquire_many_owned(units)
                .await
                .map_err(|_| ClientError::ConnectionLost)?;
            (slot, conn, Some(permit))
        } else {
            self.inner
                .last_foreground
                .store(self.now_ms(), Ordering::Relaxed);
            let (slot, conn) = self.pick()?;
            (slot, conn, None)
        };
        slot.load.fetch_add(weight, Ordering::Relaxed);
        // Taken back however this call ends (also when it is cancelled).
        struct Unload<'a>(&'a AtomicU64, u64);
        impl Drop for Unload<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(self.1, Ordering::Relaxed);
            }
        }
        let _unload = Unload(&slot.load, weight);
        let result = async {
            let _permit = conn
                .inflight
                .acquire()
                .await
                .map_err(|_| ClientError::ConnectionLost)?;
            let (tx, rx) = oneshot::channel();
            conn.tx
                .send(Outgoing { request, reply: tx })
                .await
                .map_err(|_| ClientError::ConnectionLost)?;
            rx.await.map_err(|_| ClientError::ConnectionLost)?
        }
        .await;
        match result? {
            Response::Error { status, message } => Err(ClientError::Remote { status, message }),
            r => Ok(r),
        }
    }

    /// Attributes of `path` (not following a final symlink).
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn stat(&self, path: Bytes) -> Result<Attr, ClientError> {
        match self.call(Request::Stat { path }).await? {
            Response::Attr(a) => Ok(a),
            r => Err(unexpected(&r)),
        }
    }

    /// BLAKE3 of the whole regular file at `path`, with the version it was computed over.
    ///
    /// # Errors
    /// As [`Client::call`]; [`ClientError::Protocol`] if the server lacks the HASH feature.
    pub async fn hash(&self, path: Bytes) -> Result<FileHash, ClientError> {
        if self.session().features & features::HASH == 0 {
            return Err(ClientError::Protocol(
                "the server cannot hash files (ferryd too old): upgrade ferryd".into(),
            ));
        }
        match self.call(Request::Hash { path }).await? {
            Response::Hash(h) => Ok(h),
            r => Err(unexpected(&r)),
        }
    }

    /// Target of the symlink at `path`.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn readlink(&self, path: Bytes) -> Result<Bytes, ClientError> {
        match self.call(Request::ReadLink { path }).await? {
            Response::Link(t) => Ok(t),
            r => Err(unexpected(&r)),
        }
    }

    /// File system statistics of the export.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn statfs(&self) -> Result<StatFs, ClientError> {
        match self.call(Request::StatFs).await? {
            Response::StatFs(s) => Ok(s),
            r => Err(unexpected(&r)),
        }
    }

    /// The whole listing of the directory at `path`, fetched page by page. Entry names
    /// are validated: a server sending `..` or a name with `/` is a protocol error.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub async fn read_dir(&self, path: Bytes) -> Result<Vec<DirEntry>, ClientError> {
        let mut all = Vec::new();
        let mut cookie = 0;
        loop {
            let page = match self
                .call(Request::ReadDir {
                    path: path.clone(),
                    cookie,
                    max_entries: 4096,
                })
                .await?
            {
                Response::DirPage(p) => p,
                r => return Err(unexpected(&r)),
            };
            for e in &page.entries {
                ferry_proto::name::validate_name(&e.name).map_err(|err| {
                    ClientError::Protocol(format!("server sent entry name: {err}"))
                })?;
            }
            let progressed = !page.entries.is_empty();
            if let Some(last) = page.entries.last() {
                cookie = last.cookie;
            }
            all.extend(page.entries);
            if page.eof {
                return Ok(all);
            }
            if !progressed {
                return Err(ClientError::Protocol(
                    "server sent an empty directory page without eof".into(),
                ));
            }
        }
    }

    /// Reads up to `len` bytes (≤ chunk size) at `offset`: decoded and checksum-verified.
    ///
    /// # Errors
    /// As [`Client::call`], and [`ClientError::Payload`] on corruption.
    pub async fn read(
        &self,
        path: Bytes,
        offset: u64,
        len: u32,
    ) -> Result<(Bytes, Version), ClientError> {
        let c = self.read_chunk(path, offset, len).await?;
        Ok((c.data, c.version))
    }

    /// As [`Client::read`], with everything the response carries.
    ///
    /// # Errors
    /// As [`Client::read`].
    pub async fn read_chunk(
        &self,
        path: Bytes,
        offset: u64,
        len: u32,
    ) -> Result<Chunk, ClientError> {
        let mut failures = 0;
        loop {
            match self.read_chunk_once(path.clone(), offset, len).await {
                Err(ClientError::Payload(e)) => {
                    self.inner
                        .counters
                        .checksum_failures
                        .fetch_add(1, Ordering::Relaxed);
                    failures += 1;
                    warn!(
                        "read of /{} at {offset}: {e}; fetching it again",
                        String::from_utf8_lossy(&path)
                    );
                    if failures >= 3 {
                        return Err(ClientError::Payload(e));
                    }
                }
                r => return r,
            }
        }
    }

    async fn read_chunk_once(
        &self,
        path: Bytes,
        offset: u64,
        len: u32,
    ) -> Result<Chunk, ClientError> {
        let r = match self
            .call(Request::Read {
                path,
                offset,
                len,
                allow_lz4: self.inner.compression,
            })
            .await?
        {
            Response::Read(r) => r,
            r => return Err(unexpected(&r)),
        };
        if r.decoded_len > len {
            return Err(ClientError::Protocol(format!(
                "server returned {} bytes for a read of {len}",
                r.decoded_len
            )));
        }
        let c = &self.inner.counters;
        c.wire_bytes
            .fetch_add(r.data.len() as u64, Ordering::Relaxed);
        c.decoded_bytes
            .fetch_add(u64::from(r.decoded_len), Ordering::Relaxed);
        c.reads.fetch_add(1, Ordering::Relaxed);
        let version = r.version;
        let wire_len = r.data.len();
        let file_hash = r.file_hash;
        let data = payload::decode(r.encoding, r.decoded_len, r.checksum, r.data)?;
        Ok(Chunk {
            data,
            version,
            wire_len,
            file_hash,
        })
    }
}

fn unexpected(r: &Response) -> ClientError {
    ClientError::Protocol(format!("unexpected response kind 0x{:02x}", r.kind()))
}

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

/// Milliseconds since a process-wide reference point (for last-received stamps).
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

fn start_conn(
    stream: Halves,
    welcome: &Welcome,
    leftover: BytesMut,
    slot: usize,
    dead: mpsc::UnboundedSender<usize>,
    config: &ClientConfig,
    counters: Arc<Counters>,
) -> Conn {
    let (rd, wr) = stream;
    let pending = Arc::new(Mutex::new(Pending {
        next_id: 1,
        ..Pending::default()
    }));
    let alive = Arc::new(AtomicBool::new(true));
    let kill = Arc::new(Notify::new());
    let last_rx = Arc::new(AtomicU64::new(now_ms()));
    let (tx, rx) = mpsc::channel(welcome.max_inflight as usize);
    let writer = tokio::spawn(write_loop(
        wr,
        rx,
        pending.clone(),
        alive.clone(),
        kill.clone(),
        last_rx.clone(),
    ));
    let reader = read_loop(
        rd,
        welcome.max_frame,
        leftover,
        pending.clone(),
        last_rx.clone(),
        kill.clone(),
    );
    let (a, p) = (alive.clone(), pending.clone());
    tokio::spawn(async move {
        reader.await;
        close(&p, &a);
        // A writer blocked on a socket the server stopped reading ends here too.
        writer.abort();
        let _ = dead.send(slot);
    });
    tokio::spawn(watchdog(
        tx.clone(),
        pending,
        alive.clone(),
        last_rx,
        kill.clone(),
        config.stall_timeout,
        config.keepalive,
        counters,
        slot,
    ));
    Conn {
        tx,
        inflight: Arc::new(Semaphore::new(welcome.max_inflight as usize)),
        alive,
        kill,
        instance_id: welcome.instance_id,
    }
}

/// Closes a stream that stalls (requests outstanding, nothing received for `stall`), and
/// pings one that has been quiet for `keepalive`.
#[allow(clippy::too_many_arguments)]
async fn watchdog(
    tx: mpsc::Sender<Outgoing>,
    pending: Arc<Mutex<Pending>>,
    alive: Arc<AtomicBool>,
    last_rx: Arc<AtomicU64>,
    kill: Arc<Notify>,
    stall: Duration,
    keepalive: Duration,
    counters: Arc<Counters>,
    slot: usize,
) {
    let tick = (stall / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The `last_rx` a mid-stall Ping was sent for (one per quiet spell).
    let mut pinged_at = u64::MAX;
    loop {
        interval.tick().await;
        if !alive.load(Ordering::Relaxed) {
            kill.notify_one();
            return;
        }
        let waiting = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .waiting
            .len();
        // Quiet: since the last byte received, or since requests started waiting after an
        // idle spell (the writer resets the clock then), whichever is later.
        let rx = last_rx.load(Ordering::Relaxed);
        let quiet = Duration::from_millis(now_ms().saturating_sub(rx));
        let ping = || {
            let (reply, _) = oneshot::channel();
            tx.try_send(Outgoing {
                request: Request::Ping,
                reply,
            })
        };
        if waiting > 0 {
            if quiet >= stall {
                counters.stalls.fetch_add(1, Ordering::Relaxed);
                warn!(
                    "stream {slot}: nothing received for {:.0} s with {waiting} requests waiting; closing it, its requests go to other streams",
                    quiet.as_secs_f64()
                );
                kill.notify_one();
                return;
            }
            // A slow request (a big Hash) is not a dead stream: a Ping halfway through the
            // stall time proves the stream alive when its Pong comes back.
            if quiet >= stall / 2 && pinged_at != rx {
                match ping() {
                    Ok(()) => pinged_at = rx,
                    Err(mpsc::error::TrySendError::Full(_)) => {}
                    Err(mpsc::error::TrySendError::Closed(_)) => return,
                }
            }
        } else if quiet >= keepalive {
            // The answer only refreshes `last_rx`; a missing one shows up as a stall.
            match ping() {
                // The stall clock starts now: the Pong has `stall` to arrive.
                Ok(()) => last_rx.store(now_ms(), Ordering::Relaxed),
                Err(mpsc::error::TrySendError::Full(_)) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        }
    }
}

/// Re-establishes the connections of slots whose connection ended.
async fn supervise(inner: std::sync::Weak<Inner>, mut dead: mpsc::UnboundedReceiver<usize>) {
    while let Some(slot) = dead.recv().await {
        let Some(i) = inner.upgrade() else { return };
        if i.slots[slot].reconnecting.swap(true, Ordering::AcqRel) {
            continue;
        }
        debug!("stream {slot} closed; reconnecting");
        tokio::spawn(reconnect(inner.clone(), slot));
    }
}

async fn reconnect(inner: std::sync::Weak<Inner>, slot: usize) {
    let mut delay = Duration::from_millis(50);
    let mut attempts = 0u32;
    loop {
        tokio::time::sleep(delay).await;
        let Some(config) = inner.upgrade().map(|i| i.config.clone()) else {
            return;
        };
        let r = tokio::time::timeout(config.connect_timeout, open_stream(&config)).await;
        let Some(i) = inner.upgrade() else { return };
        attempts += 1;
        let why = match r {
            Ok(Ok((stream, w, leftover))) => match i.adopt(slot, stream, &w, leftover) {
                Ok(()) => {
                    i.slots[slot].reconnecting.store(false, Ordering::Release);
                    i.counters.reconnects.fetch_add(1, Ordering::Relaxed);
                    info!("stream {slot} reconnected to {}", config.addr);
                    i.changed.notify_waiters();
                    // Its end may have been reported while the flag was still set (and so
                    // ignored): then this task carries on.
                    if i.slots[slot].alive()
                        || i.slots[slot].reconnecting.swap(true, Ordering::AcqRel)
                    {
                        return;
                    }
                    "the new connection ended at once".to_string()
                }
                Err(why) => why,
            },
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", config.connect_timeout),
        };
        // Said once per outage, not at every attempt.
        if attempts == 3 {
            warn!("cannot reconnect to {}: {why}; still trying", config.addr);
        } else {
            debug!("reconnect of stream {slot}: {why}");
        }
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

impl Inner {
    /// Takes a newly opened connection into `slot`, if it reaches a server the pool can use.
    fn adopt(
        &self,
        slot: usize,
        stream: Halves,
        w: &Welcome,
        leftover: BytesMut,
    ) -> Result<(), String> {
        if w.chunk_size != self.session.chunk_size || w.features != self.session.features {
            return Err(format!(
                "the server now runs with other settings (chunk size {}, features {:#x}; this mount has {} and {:#x}): remount",
                w.chunk_size, w.features, self.session.chunk_size, self.session.features
            ));
        }
        {
            let mut instance = self.instance.lock().unwrap_or_else(|e| e.into_inner());
            if w.instance_id != *instance {
                let old_alive = self.slots.iter().any(|s| {
                    let c = s.current();
                    c.alive.load(Ordering::Relaxed) && c.instance_id == *instance
                });
                if old_alive {
                    return Err(
                        "reached another server instance than the other streams (a load balancer?)"
                            .into(),
                    );
                }
                *instance = w.instance_id;
                self.counters
                    .server_restarts
                    .fetch_add(1, Ordering::Relaxed);
                warn!(
                    "{} restarted (new server instance): reconnecting; every read checks the file's version",
                    self.config.addr
                );
            }
        }
        let conn = start_conn(
            stream,
            w,
            leftover,
            slot,
            self.dead.clone(),
            &self.config,
            self.counters.clone(),
        );
        *self.slots[slot]
            .conn
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(conn);
        Ok(())
    }
}

/// Fails every waiting request and marks the stream dead.
fn close(pending: &Mutex<Pending>, alive: &AtomicBool) {
    alive.store(false, Ordering::Relaxed);
    let waiting = {
        let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
        p.closed = true;
        std::mem::take(&mut p.waiting)
    };
    for (_, reply) in waiting {
        let _ = reply.send(Err(ClientError::ConnectionLost));
    }
}

async fn write_loop(
    wr: Box<dyn AsyncWrite + Send + Unpin>,
    mut rx: mpsc::Receiver<Outgoing>,
    pending: Arc<Mutex<Pending>>,
    alive: Arc<AtomicBool>,
    kill: Arc<Notify>,
    last_rx: Arc<AtomicU64>,
) {
    let mut w = BufWriter::with_capacity(64 * 1024, wr);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(out) = next {
            let id = {
                let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
                if p.closed {
                    let _ = out.reply.send(Err(ClientError::ConnectionLost));
                    next = rx.try_recv().ok();
                    continue;
                }
                let id = p.next_id;
                p.next_id = p.next_id.wrapping_add(1).max(1);
                if p.waiting.is_empty() {
                    // After an idle spell the stall clock starts with this request.
                    last_rx.store(now_ms(), Ordering::Relaxed);
                }
                p.waiting.insert(id, out.reply);
                id
            };
            out.request.encode(id, &mut buf);
            next = rx.try_recv().ok();
        }
        if w.write_all(&buf).await.is_err() || w.flush().await.is_err() {
            break;
        }
        buf.clear();
    }
    close(&pending, &alive);
    // The reader may be blocked on a socket that will never say more: end it too, so the
    // stream is reconnected.
    kill.notify_one();
}

/// Frames at least this large are read into a buffer of their own.
const OWN_BUFFER_FRAME: usize = 64 * 1024;

/// Reads the next frame. Small frames share `buf`; a large frame (a read payload) gets an
/// exact-size buffer of its own, so a chunk held in the cache pins only its own bytes,
/// never a shared receive buffer. Its bytes are copied once from the socket, except the
/// few already read into the shared buffer with the header, which are copied twice.
async fn read_frame(
    rd: &mut Box<dyn AsyncRead + Send + Unpin>,
    buf: &mut BytesMut,
    max_frame: u32,
    last_rx: &AtomicU64,
) -> std::io::Result<Option<Frame>> {
    let invalid =
        |e: ferry_proto::FrameError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    loop {
        match Frame::check(buf, max_frame).map_err(invalid)? {
            Some(_) => return Frame::parse(buf, max_frame).map_err(invalid),
            None if buf.len() >= 4 => {
                let total = 4 + u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                if total >= OWN_BUFFER_FRAME {
                    let mut own = BytesMut::with_capacity(total);
                    own.extend_from_slice(buf);
                    buf.clear();
                    // Straight into the spare capacity: no zeroing of a buffer about to
                    // be overwritten.
                    while own.len() < total {
                        let want = (total - own.len()) as u64;
                        if (&mut *rd).take(want).read_buf(&mut own).await? == 0 {
                            return Err(std::io::ErrorKind::UnexpectedEof.into());
                        }
                        last_rx.store(now_ms(), Ordering::Relaxed);
                    }
                    return Frame::parse(&mut own, max_frame).map_err(invalid);
                }
            }
            None => {}
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(OWN_BUFFER_FRAME);
        }
        if rd.read_buf(buf).await? == 0 {
            return Ok(None);
        }
        last_rx.store(now_ms(), Ordering::Relaxed);
    }
}

async fn read_loop(
    mut rd: Box<dyn AsyncRead + Send + Unpin>,
    max_frame: u32,
    mut buf: BytesMut,
    pending: Arc<Mutex<Pending>>,
    last_rx: Arc<AtomicU64>,
    kill: Arc<Notify>,
) {
    loop {
        let frame = tokio::select! {
            r = read_frame(&mut rd, &mut buf, max_frame, &last_rx) => match r {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    debug!("stream closed: {e}");
                    break;
                }
            },
            _ = kill.notified() => break,
        };
        let id = frame.request_id;
        let response = Response::decode(frame)
            .map_err(|e| ClientError::Protocol(format!("undecodable response: {e}")));
        let bad = response.is_err();
        let reply = pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .waiting
            .remove(&id);
        match reply {
            Some(reply) => {
                let _ = reply.send(response);
            }
            None => {
                debug!("response for unknown request id {id}");
                break;
            }
        }
        if bad {
            break;
        }
    }
}
