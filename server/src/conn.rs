//! One client connection: preamble, handshake, then pipelined requests.
//!
//! The reader half decodes frames and spawns one task per request ([`handle`]), holding a
//! per-connection permit (at most `max_inflight` requests at once; when none is free the
//! reader stops reading, which pushes back on the client through TCP). File reads also
//! take bytes from a server-wide memory budget, held until the response has been written,
//! so the memory of all connections together is bounded; a connection's background reads
//! hold at most [`handle::BACKGROUND_READS`] places in the blocking pool and the budget at
//! once, so its demand and prediction reads never wait behind them there.
//!
//! The writer half ([`writer`]) writes the most urgent waiting response next (demand, then
//! prediction, then background; every non-Read response is demand), batches small demand
//! and prediction responses, flushes each background response at once and writes large
//! read payloads straight from their buffers; a response (or flush) not written within
//! `write_timeout` closes the connection. Every accepted socket gets `TCP_NOTSENT_LOWAT`
//! ([`writer::NOTSENT_LOWAT`]), so little data waits in the kernel where the order can no
//! longer change.
//!
//! The handshake itself (Hello checks, negotiation, the Welcome, the token proof) is
//! [`ferry_proto::handshake::ServerHandshake`]'s; [`handshake`] only drives it over the
//! socket, drawing the token challenge and enforcing the time limit.
//!
//! Anything malformed — bad magic, a frame over the limit, an undecodable message — ends
//! this connection with a logged reason and touches nothing else.

mod handle;
pub(crate) mod writer;

use std::io;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use ferry_proto::handshake::{ServerAuth, ServerHandshake, ServerParams};
use ferry_proto::preamble::{self, PreambleError, Refusal, Transport, PREAMBLE_LEN};
use ferry_proto::{
    features, Class, Compression, DecodeError, Frame, FrameCheck, FrameError, HandshakeError,
    Request, Response, Welcome,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Semaphore};
use tracing::{debug, info};

use crate::{Current, Shared};
use handle::Session;

use writer::Outgoing;

/// Why a connection ended early.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Socket error.
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    /// The client's preamble is not a ferry preamble.
    #[error("protocol violation: {0}")]
    Preamble(#[source] PreambleError),
    /// A frame's length field is invalid (too short, or over the negotiated maximum).
    #[error("protocol violation: {0}")]
    Frame(#[source] FrameError),
    /// A request did not decode.
    #[error("protocol violation: {0}")]
    Decode(#[source] DecodeError),
    /// The client broke the handshake (other than with a wrong token).
    #[error("protocol violation: {0}")]
    Handshake(#[source] HandshakeError),
    /// The client broke the protocol in a way no lower layer reports.
    #[error("protocol violation: {0}")]
    Protocol(&'static str),
    /// No complete handshake within the time limit.
    #[error("handshake timed out")]
    HandshakeTimeout,
    /// The TLS handshake failed (the client's certificate, versions, a plaintext peer...).
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] io::Error),
    /// The client's token proof was wrong.
    #[error("authentication failed: wrong token")]
    AuthFailed,
    /// The client stopped reading responses while holding memory other clients wait for.
    #[error("closed: the client stopped reading its responses while others waited for the memory they hold")]
    Stalled,
}

/// A connection that holds memory while the budget is in demand, and whose client has taken
/// no response byte for this long, is closed: it sits on its share ([`crate::budget`]).
pub(crate) const STALL_UNDER_CONTENTION: Duration = Duration::from_secs(5);

/// The same for a connection holding more than its share now (it took it before others
/// came): it keeps what others need, so it goes sooner.
pub(crate) const STALL_OVER_SHARE: Duration = Duration::from_secs(2);

/// The same, sooner, for a connection over its share whose client has taken hardly
/// anything since it connected ([`NOTHING_TAKEN_BYTES`]) and nothing at all for this long
/// while the writer waited (TCP had nothing acknowledged: its receive window stays shut).
/// Such a connection asked for responses only to sit on them; with hundreds of them each
/// holding a response for 2 s, honest clients waited for their turns for tens of seconds.
/// A client that has been taking its responses keeps the longer grace.
pub(crate) const STALL_NOTHING_TAKEN: Duration = Duration::from_millis(500);

/// "Hardly anything" for [`STALL_NOTHING_TAKEN`]: bytes acknowledged since the connection's
/// first look (a quarter second after its handshake).
pub(crate) const NOTHING_TAKEN_BYTES: u64 = 256 << 10;

/// The next frame if `buf` holds the whole of it (taken out of `buf`), else how many more
/// bytes it needs.
fn buffered_frame(buf: &mut BytesMut, max: u32) -> Result<Result<Frame, usize>, ConnError> {
    match Frame::check(buf, max).map_err(ConnError::Frame)? {
        FrameCheck::Complete(_) => {
            let f = Frame::parse(buf, max)
                .map_err(ConnError::Frame)?
                .ok_or(ConnError::Protocol("a frame checked whole did not parse"))?;
            // Each request in an allocation of its own: a slice of `buf` would keep the
            // whole block it was read into (64-256 KiB) alive for as long as the request
            // (a path in it) is in flight, and a connection has up to `max_inflight` in
            // flight, each perhaps in another block: 16 mirrors through the WAN profile
            // beside 16 fast ones (2,000 requests in flight) pinned 130 MiB beyond the
            // memory budget that way. Requests are small; copying them costs nothing.
            Ok(Ok(Frame {
                body: bytes::Bytes::copy_from_slice(&f.body),
                ..f
            }))
        }
        FrameCheck::Incomplete { needed } => Ok(Err(needed)),
    }
}

/// Reads one frame, buffering at most `max` bytes of it.
async fn read_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    max: u32,
) -> Result<Option<Frame>, ConnError> {
    loop {
        let needed = match buffered_frame(buf, max)? {
            Ok(f) => return Ok(Some(f)),
            Err(needed) => needed,
        };
        // Room for the rest of the frame, but never more than 256 KiB ahead of what the
        // client has sent: an announced length costs nothing until the bytes come.
        buf.reserve(needed.clamp(64 * 1024, 256 * 1024));
        if rd.read_buf(buf).await? == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(ConnError::Protocol(
                "connection closed in the middle of a frame",
            ));
        }
    }
}

/// Serves one accepted TCP connection: the preamble in plain bytes, then TLS if asked for
/// and configured, then [`serve`]. The whole handshake (preamble, TLS, Hello/Welcome, token)
/// must finish within the handshake timeout.
pub(crate) async fn serve_tcp(
    mut tcp: tokio::net::TcpStream,
    shared: Arc<Shared>,
    handshake: crate::InHandshake,
) -> Result<(), ConnError> {
    // Under pressure (many handshakes in progress: perhaps silent sockets), each gets a
    // fifth of the time: honest clients finish in milliseconds.
    let limit = if handshake.under_pressure() {
        shared.config.handshake_timeout / 5
    } else {
        shared.config.handshake_timeout
    };
    let deadline = tokio::time::Instant::now() + limit;
    let peer = tcp.peer_addr().ok().map(|a| a.ip());
    let socket = std::os::fd::AsRawFd::as_raw_fd(&tcp);
    if let Err(e) = writer::limit_unsent(&tcp) {
        debug!("TCP_NOTSENT_LOWAT not set: {e}");
    }
    let transport = tokio::time::timeout_at(deadline, answer_preamble(&mut tcp, &shared))
        .await
        .map_err(|_| ConnError::HandshakeTimeout)??;
    match transport {
        None => Ok(()),
        Some(Transport::Plain) => {
            serve(tcp, shared, deadline, Some(handshake), peer, Some(socket)).await
        }
        Some(Transport::Tls) => {
            let Some(tls) = shared.config.tls.as_ref().map(Current::get) else {
                return Err(ConnError::Protocol("TLS accepted without a configuration"));
            };
            let stream =
                tokio::time::timeout_at(deadline, tokio_rustls::TlsAcceptor::from(tls).accept(tcp))
                    .await
                    .map_err(|_| ConnError::HandshakeTimeout)?
                    .map_err(ConnError::Tls)?;
            serve(
                stream,
                shared,
                deadline,
                Some(handshake),
                peer,
                Some(socket),
            )
            .await
        }
    }
}

/// Answers a connection the server has no room for with a `Busy` refusal (after its
/// preamble, read within a second, so the answer is not lost to a reset) and closes it.
pub(crate) async fn refuse_busy(mut tcp: tokio::net::TcpStream) {
    let answer = async {
        let mut pre = [0u8; PREAMBLE_LEN];
        tcp.read_exact(&mut pre).await?;
        tcp.write_all(&preamble::server_preamble(Err(Refusal::Busy)))
            .await?;
        tcp.shutdown().await?;
        drain(&mut tcp).await;
        Ok::<(), std::io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), answer).await;
}

/// After a refusal, sent and shut down: reads what the client sent behind its preamble (a
/// plain client's Hello comes in the same segment, PROTOCOL.md §3) until it closes, at
/// most 64 KiB. A socket closed with unread bytes is reset, and a reset can reach the
/// client before it read the refusal, which then reads as a connection lost.
async fn drain(tcp: &mut tokio::net::TcpStream) {
    let mut sink = [0u8; 4096];
    let mut left = 64usize << 10;
    while left > 0 {
        match tcp.read(&mut sink).await {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// Reads the client's preamble and answers it: the transport to go on with, or `None`
/// after a refusal.
async fn answer_preamble(
    tcp: &mut tokio::net::TcpStream,
    shared: &Shared,
) -> Result<Option<Transport>, ConnError> {
    let mut pre = [0u8; PREAMBLE_LEN];
    tcp.read_exact(&mut pre).await?;
    let tls = shared.config.tls.is_some();
    let answer = match preamble::parse_client_preamble(&pre).map_err(ConnError::Preamble)? {
        Ok(Transport::Plain) if tls => Err(Refusal::TlsRequired),
        Ok(Transport::Tls) if !tls => Err(Refusal::TlsUnavailable),
        other => other,
    };
    tcp.write_all(&preamble::server_preamble(answer)).await?;
    match answer {
        Ok(t) => Ok(Some(t)),
        Err(refusal) => {
            info!("refused a client: {refusal}");
            tcp.shutdown().await?;
            // Within a second, and within the handshake's deadline around this.
            let _ = tokio::time::timeout(Duration::from_secs(1), drain(tcp)).await;
            Ok(None)
        }
    }
}

/// Serves one connection, past its preamble (and TLS), until the client leaves, misbehaves
/// or shutdown.
pub(crate) async fn serve<S>(
    stream: S,
    shared: Arc<Shared>,
    deadline: tokio::time::Instant,
    place: Option<crate::InHandshake>,
    peer: Option<std::net::IpAddr>,
    socket: Option<std::os::fd::RawFd>,
) -> Result<(), ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    // No legal request is longer than this, whatever the frame limit: a client announcing
    // more is refused at once rather than buffered.
    let request_limit = ferry_proto::MAX_REQUEST_FRAME;
    // The handshake's buffer carries on: a client may pipeline requests right behind its
    // Hello, and those bytes must not be lost.
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let welcome = tokio::time::timeout_at(deadline, handshake(&mut rd, &mut wr, &shared, &mut buf))
        .await
        .map_err(|_| ConnError::HandshakeTimeout)??;
    let Some((welcome, client_name)) = welcome else {
        return Ok(());
    };
    // A client is its address and the name it gave (ferry names all streams of one
    // process alike): memory is shared per client as well as per connection.
    let client = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        peer.hash(&mut h);
        client_name.hash(&mut h);
        h.finish()
    };
    // Authenticated: its place among the handshakes goes to the next client.
    drop(place);

    let (tx, rx) = mpsc::channel::<Outgoing>(welcome.max_inflight as usize);
    let sh = shared.clone();
    let mut link = shared.link_limits.join(client);
    let blocked = writer::Blocked::new();
    let mut writer = tokio::spawn(writer::write_loop(
        writer::Watched {
            inner: wr,
            blocked: blocked.clone(),
        },
        rx,
        shared.config.write_timeout,
        move |class: Class, n| {
            sh.stats.written[usize::from(class.to_bits())].fetch_add(n, Relaxed);
        },
    ));
    let mut writer_ended = false;
    // The connection's requests being answered: when it ends, those not yet answered are
    // dropped with it (a client that pipelined 64 directory listings and vanished must not
    // keep the server computing them for no one).
    let mut tasks = tokio::task::JoinSet::new();
    let inflight = Arc::new(Semaphore::new(welcome.max_inflight as usize));
    let session = Arc::new(Session {
        features: welcome.features,
        chunk_size: welcome.chunk_size,
        max_frame: welcome.max_frame,
        account: {
            let blocked = blocked.clone();
            shared.budget.account_draining(client, move || {
                blocked.waiting_for() > Duration::from_millis(100)
            })
        },
        background: Arc::new(Semaphore::new(handle::BACKGROUND_READS)),
        client,
        work: link.work(),
    });
    let mut shutdown = shared.shutdown.clone();
    let idle = shared.config.idle_timeout;
    let mut check = tokio::time::interval(Duration::from_millis(250));
    let mut idle_at = tokio::time::Instant::now() + idle;
    // When TCP last had bytes acknowledged while the writer waited (or it did not wait),
    // and its count of bytes acknowledged then and at the first look.
    let mut progress_at = tokio::time::Instant::now();
    let (mut last_acked, mut first_acked) = (None, None);
    // Told to stop: the socket is read no more, but the requests already read (whole in
    // `buf`) are taken up and answered like those before them; then the loop ends.
    // Places among `max_inflight` are waited for until this deadline (then it ends too: a
    // client that takes no responses frees none).
    let mut stop_by: Option<tokio::time::Instant> = None;
    let result = loop {
        let frame = if stop_by.is_some() {
            match buffered_frame(&mut buf, request_limit) {
                Ok(Ok(f)) => Some(Ok(Some(f))),
                Ok(Err(_)) => break Ok(()),
                Err(e) => break Err(e),
            }
        } else {
            tokio::select! {
                f = read_frame(&mut rd, &mut buf, request_limit) => Some(f),
                _ = shutdown.changed() => {
                    stop_by = Some(tokio::time::Instant::now() + Duration::from_secs(5));
                    continue;
                }
                _ = check.tick() => {
                    let acked = link.look(&blocked, socket);
                    // Sitting on its share while others wait: closed, its memory freed.
                    let waiting = blocked.waiting_for();
                    if acked.is_none() || acked != last_acked || waiting.is_zero() {
                        progress_at = tokio::time::Instant::now();
                    }
                    last_acked = acked;
                    let first = *first_acked.get_or_insert(acked.unwrap_or(0));
                    let taken_nothing = acked
                        .is_some_and(|a| a.saturating_sub(first) < NOTHING_TAKEN_BYTES)
                        && waiting > STALL_NOTHING_TAKEN
                        && progress_at.elapsed() > STALL_NOTHING_TAKEN;
                    let over = waiting > STALL_OVER_SHARE || taken_nothing;
                    if (over && session.account.over_share())
                        || (waiting > STALL_UNDER_CONTENTION && session.account.stalled_holder())
                    {
                        break Err(ConnError::Stalled);
                    }
                    continue;
                }
                // read_frame keeps partial frames in `buf`: cancelling it loses nothing.
                _ = tokio::time::sleep_until(idle_at) => None,
                // The writer only ends early on a socket error or a stalled client: then the
                // whole connection goes, freeing its slot and buffers.
                w = &mut writer => {
                    writer_ended = true;
                    break match w {
                        Ok(Err(e)) => Err(ConnError::Io(e)),
                        _ => Err(ConnError::Protocol("response writer ended")),
                    };
                }
            }
        };
        let Some(frame) = frame else {
            // Nothing in flight: an idle client, or one that vanished mid-frame.
            if inflight.available_permits() == welcome.max_inflight as usize {
                debug!("closing a connection idle for {} s", idle.as_secs());
                break Ok(());
            }
            idle_at = tokio::time::Instant::now() + idle;
            continue;
        };
        idle_at = tokio::time::Instant::now() + idle;
        let frame = match frame {
            Ok(Some(f)) => f,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let id = frame.request_id;
        if id == 0 {
            break Err(ConnError::Protocol(
                "request id 0 is reserved for the handshake",
            ));
        }
        let request = match Request::decode(frame) {
            Ok(r) => r,
            Err(e) => break Err(ConnError::Decode(e)),
        };
        if let Request::Read { class, .. } | Request::ReadDirData { class, .. } = &request {
            if *class != Class::Demand && welcome.features & features::PRIORITY == 0 {
                break Err(ConnError::Protocol(
                    "a read with a class needs the PRIORITY feature",
                ));
            }
        }
        if matches!(request, Request::ReadDirData { .. })
            && welcome.features & features::DIR_DATA == 0
        {
            break Err(ConnError::Protocol(
                "ReadDirData needs the DIR_DATA feature",
            ));
        }
        if matches!(request, Request::ReadTree { .. }) && welcome.features & features::TREE == 0 {
            break Err(ConnError::Protocol("ReadTree needs the TREE feature"));
        }
        if matches!(request, Request::IdNames { .. }) && welcome.features & features::ID_NAMES == 0
        {
            break Err(ConnError::Protocol("IdNames needs the ID_NAMES feature"));
        }
        if matches!(request, Request::DataMap { .. }) && welcome.features & features::DATA_MAP == 0
        {
            break Err(ConnError::Protocol("DataMap needs the DATA_MAP feature"));
        }
        if matches!(request, Request::DirXattrs { .. }) && welcome.features & features::XATTRS == 0
        {
            break Err(ConnError::Protocol("DirXattrs needs the XATTRS feature"));
        }
        if matches!(request, Request::DirXattrsPage { .. })
            && welcome.features & features::XATTRS_PAGED == 0
        {
            break Err(ConnError::Protocol(
                "DirXattrsPage needs the XATTRS_PAGED feature",
            ));
        }
        if matches!(
            request,
            Request::Read {
                compression: Compression::Zstd(_),
                ..
            } | Request::ReadDirData {
                compression: Compression::Zstd(_),
                ..
            }
        ) && welcome.features & features::ZSTD == 0
        {
            break Err(ConnError::Protocol(
                "zstd compression needs the ZSTD feature",
            ));
        }
        if matches!(request, Request::Load) && welcome.features & features::ZSTD == 0 {
            break Err(ConnError::Protocol("Load needs the ZSTD feature"));
        }
        if matches!(request, Request::Hash { .. }) && welcome.features & features::HASH == 0 {
            break Err(ConnError::Protocol("Hash needs the HASH feature"));
        }
        if matches!(request, Request::HashSparse { .. })
            && welcome.features & features::HASH_SPARSE == 0
        {
            break Err(ConnError::Protocol(
                "HashSparse needs the HASH_SPARSE feature",
            ));
        }
        let permit = if let Some(by) = stop_by {
            match tokio::time::timeout_at(by, inflight.clone().acquire_owned()).await {
                Ok(Ok(p)) => p,
                _ => break Ok(()),
            }
        } else {
            match inflight.clone().acquire_owned().await {
                Ok(p) => p,
                Err(_) => break Ok(()),
            }
        };
        let shared = shared.clone();
        let tx = tx.clone();
        let session = session.clone();
        shared.stats.requests.fetch_add(1, Relaxed);
        let listing = match &request {
            Request::ReadDir { .. } => Some(0),
            Request::ReadDirData { .. } => Some(1),
            Request::ReadTree { .. } => Some(2),
            _ => None,
        };
        if let Some(i) = listing {
            shared.stats.listings[i].fetch_add(1, Relaxed);
        }
        shared.stats.inflight.fetch_add(1, Relaxed);
        while tasks.try_join_next().is_some() {}
        tasks.spawn(async move {
            // Counted in flight until answered, or dropped with its connection.
            let counted = InFlight(&shared.stats.inflight);
            let mut held = handle::Held {
                slots: vec![permit],
                bytes: None,
            };
            let class = handle::request_class(&request);
            // What the checksums are bound to (BOUND), kept before the request is handed on.
            let bound = (session.features & features::BOUND != 0).then(|| request.clone());
            let mut response = handle::handle(&shared, &session, request, &mut held).await;
            if let Some(request) = &bound {
                response.bind(id, request);
            }
            let st = &shared.stats;
            match &response {
                Response::Read(r) => {
                    st.reads.fetch_add(1, Relaxed);
                    st.encoded[encoding_index(r.encoding)].fetch_add(1, Relaxed);
                    st.bytes_wire.fetch_add(r.data.len() as u64, Relaxed);
                    st.bytes_decoded
                        .fetch_add(u64::from(r.decoded_len), Relaxed);
                }
                Response::DirData(p) => {
                    for d in p.entries.iter().filter_map(|e| e.data.as_ref()) {
                        st.reads.fetch_add(1, Relaxed);
                        st.encoded[encoding_index(d.encoding)].fetch_add(1, Relaxed);
                        st.bytes_wire.fetch_add(d.data.len() as u64, Relaxed);
                        st.bytes_decoded
                            .fetch_add(u64::from(d.decoded_len), Relaxed);
                    }
                }
                Response::Error { .. } => {
                    st.errors.fetch_add(1, Relaxed);
                }
                _ => {}
            }
            drop(counted);
            let (head, tail) = encode_within(&mut response, id, session.max_frame);
            // Errors are small and answer someone: demand, whatever the request's class.
            let class = if matches!(response, Response::Error { .. }) {
                Class::Demand
            } else {
                class
            };
            drop(response);
            // Held from now on: the encoded response.
            if let Some(h) = &mut held.bytes {
                h.settle((head.len() + tail.len()) as u64);
            }
            // A send error means the writer is gone: the connection is closing anyway.
            let _ = tx
                .send(Outgoing {
                    class,
                    head,
                    tail,
                    _held: held,
                })
                .await;
        });
    };
    drop(tx);
    if matches!(result, Err(ConnError::Stalled)) {
        // Its client does not read: what it holds goes now, not after a drain.
        writer.abort();
    } else if !writer_ended {
        // Let responses already being computed go out before closing, briefly.
        match tokio::time::timeout(Duration::from_secs(5), &mut writer).await {
            Ok(Ok(Err(e))) => debug!("writer ended: {e}"),
            Ok(_) => {}
            Err(_) => {
                debug!("writer did not drain in time");
                writer.abort();
            }
        }
    }
    result
}

/// A request counted in [`Stats::inflight`] while it lives.
struct InFlight<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Drives the handshake machine: Hello/Welcome, and the token proof when the server has a
/// token. `Ok(None)`: the client left, or was refused politely (it was told why); close.
/// Bytes the client pipelined behind its handshake are left in `buf`.
async fn handshake<R, W>(
    rd: &mut R,
    wr: &mut W,
    shared: &Shared,
    buf: &mut BytesMut,
) -> Result<Option<(Welcome, String)>, ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let cfg = &shared.config;
    let auth = match cfg.token.as_ref().map(Current::get) {
        Some(token) => {
            let mut challenge = [0u8; 32];
            rustix::rand::getrandom(&mut challenge, rustix::rand::GetRandomFlags::empty())
                .map_err(io::Error::from)?;
            Some(ServerAuth { token, challenge })
        }
        None => None,
    };
    let mut machine = ServerHandshake::new(ServerParams {
        chunk_size: cfg.chunk_size,
        max_inflight: cfg.max_inflight,
        instance_id: shared.instance_id,
        auth,
        zstd_max_level: cfg.max_compression_level,
    });
    loop {
        buf.reserve(16 * 1024);
        let step = if rd.read_buf(buf).await? == 0 {
            Err(machine.closed())
        } else {
            let step = machine.receive(buf);
            buf.clear();
            step
        };
        // The Welcome, the AuthOk, or the Failed message telling the client why not.
        if let Some(out) = machine.take_output() {
            wr.write_all(&out).await?;
            wr.flush().await?;
        }
        match step {
            Ok(None) => {}
            Ok(Some(accepted)) => {
                debug!(
                    // Sent before authentication: escaped, so it cannot forge log lines or
                    // reach the operator's terminal as escape sequences.
                    client = %accepted.client_name.escape_debug(),
                    chunk_size = accepted.welcome.chunk_size,
                    "handshake"
                );
                *buf = accepted.leftover;
                return Ok(Some((accepted.welcome, accepted.client_name)));
            }
            Err(
                HandshakeError::Unsupported { .. }
                | HandshakeError::ClientClosed { mid_frame: false },
            ) => return Ok(None),
            Err(HandshakeError::WrongToken) => return Err(ConnError::AuthFailed),
            Err(e) => return Err(ConnError::Handshake(e)),
        }
    }
}

/// Where an encoding is counted in `Stats::encoded`.
pub(crate) fn encoding_index(e: ferry_proto::Encoding) -> usize {
    match e {
        ferry_proto::Encoding::Raw => 0,
        ferry_proto::Encoding::Lz4 => 1,
        ferry_proto::Encoding::Zstd => 2,
    }
}

/// Encodes `response` to request `id`. One whose frame would pass the session's
/// `max_frame` (a handler that did not bound it: a server bug) goes as a `TooLarge` error
/// instead, so no client is sent a frame it must refuse.
fn encode_within(response: &mut Response, id: u32, max_frame: u32) -> (BytesMut, bytes::Bytes) {
    let mut head = BytesMut::with_capacity(128);
    let tail = response.encode(id, &mut head);
    // The frame's length field counts all but itself.
    let length = (head.len() + tail.len()).saturating_sub(4);
    if length <= max_frame as usize {
        return (head, tail);
    }
    tracing::error!(
        "a response of {length} bytes would pass the session's frame of {max_frame}: \
         answered TooLarge instead (a bug: please report it)"
    );
    *response = Response::Error {
        status: ferry_proto::Status::TooLarge,
        message: format!("the response ({length} bytes) does not fit the session's frame"),
    };
    let mut head = BytesMut::with_capacity(128);
    let tail = response.encode(id, &mut head);
    (head, tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_over_the_sessions_frame_goes_as_too_large() {
        let frame = |head: &BytesMut, tail: &bytes::Bytes| {
            let mut all = head.clone();
            all.extend_from_slice(tail);
            Frame::parse(&mut all, 8192)
                .expect("within the frame")
                .expect("whole")
        };
        // Within the frame: as it is.
        let mut small = Response::Link(bytes::Bytes::from(vec![b'a'; 100]));
        let (head, tail) = encode_within(&mut small, 7, 8192);
        assert!(matches!(
            Response::decode(frame(&head, &tail)).unwrap(),
            Response::Link(l) if l.len() == 100
        ));
        // Past it: an error that fits, to the same request.
        let mut big = Response::Link(bytes::Bytes::from(vec![b'a'; 20_000]));
        let (head, tail) = encode_within(&mut big, 7, 8192);
        let f = frame(&head, &tail);
        assert_eq!(f.request_id, 7);
        match Response::decode(f).unwrap() {
            Response::Error { status, .. } => assert_eq!(status, ferry_proto::Status::TooLarge),
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(big, Response::Error { .. }),
            "the caller sees the error"
        );
    }

    #[tokio::test]
    async fn a_request_read_holds_no_part_of_the_connections_read_buffer() {
        // Three requests arriving together, read into one buffer.
        let mut wire = BytesMut::new();
        for id in 1..=3u32 {
            let body = format!("some/path/of/request/{id}");
            ferry_proto::Frame::put_header(&mut wire, 0x11, id, body.len());
            wire.extend_from_slice(body.as_bytes());
        }
        let mut rd: &[u8] = &wire;
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut frames = Vec::new();
        while let Some(f) = read_frame(&mut rd, &mut buf, 1 << 20).await.expect("frame") {
            frames.push(f);
        }
        assert_eq!(frames.len(), 3);
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(f.request_id, i as u32 + 1);
            assert_eq!(f.body, format!("some/path/of/request/{}", i + 1).as_bytes());
            // A slice of `buf` would keep its whole block alive while the request is in
            // flight.
            assert!(
                f.body.is_unique(),
                "request {} shares the read buffer",
                i + 1
            );
        }
    }
}
