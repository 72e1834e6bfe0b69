//! The response writer of one connection: the most urgent waiting response goes next.
//!
//! Request tasks hand their encoded responses ([`Outgoing`]) to the writer over a channel.
//! The writer moves everything that has arrived into a [`ResponseQueue`], one FIFO per
//! [`Class`], and always writes the oldest response of the most urgent non-empty class:
//! a demand response queued behind any number of background responses is written before
//! them. A response being written is never interrupted (frames do not interleave), so a
//! demand response waits at most for the one response already on its way.
//!
//! Invariants:
//! - Within a class, responses are written in the order they reached the writer, and every
//!   response handed over is written (or the connection fails): the queue loses nothing.
//! - A response's permits (its in-flight slot, its memory-budget units, its background-read
//!   slot) travel with it and are released once it has been written, not before.
//! - Background responses are flushed as soon as they are written, so no background bytes
//!   sit in the 64 KiB buffer ahead of a later demand response. Demand and prediction
//!   responses that are ready together are still batched into one write (the buffer is
//!   flushed whenever nothing more waits). Payloads larger than the buffer go straight from
//!   their own buffer to the socket (header, then payload): zero-copy.
//! - Writing one response, or a flush, that takes longer than `write_timeout` ends the
//!   writer with `TimedOut`, which closes the connection (a client that stops reading
//!   must not hold buffers forever).
//! - [`limit_unsent`] keeps little unsent data in the kernel (`TCP_NOTSENT_LOWAT`), so the
//!   order chosen here is still the order on the wire.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferry_proto::Class;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc::{self, error::TryRecvError};

/// Unsent bytes the kernel may hold per socket before it stops taking more
/// (`TCP_NOTSENT_LOWAT`): about 1 ms at 1 Gbit/s. Beyond it a write waits until the
/// connection has sent more, so the writer's next choice is made when it still matters;
/// bytes already sent but not yet acknowledged do not count, so throughput on a long or
/// fast path is not limited by it.
pub(crate) const NOTSENT_LOWAT: u32 = 128 * 1024;

/// Size of the writer's buffer: small responses are batched up to this, larger payloads
/// bypass it.
const WRITE_BUFFER: usize = 64 * 1024;

/// Sets `TCP_NOTSENT_LOWAT` to [`NOTSENT_LOWAT`] on an accepted socket (before TLS, which
/// writes through it).
///
/// # Errors
/// The kernel refused the option (a kernel before 3.12).
pub(crate) fn limit_unsent(tcp: &tokio::net::TcpStream) -> io::Result<()> {
    let value = NOTSENT_LOWAT as libc::c_int;
    // SAFETY: setsockopt on a descriptor the stream owns and keeps open for the call, with
    // a pointer to a live c_int and its exact size.
    let rc = unsafe {
        libc::setsockopt(
            tcp.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_NOTSENT_LOWAT,
            std::ptr::from_ref(&value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the writer is waiting for the socket to take bytes, and since when: a client
/// that stops reading leaves it waiting. Also how long it has waited in all.
#[derive(Debug)]
pub(crate) struct Blocked {
    start: std::time::Instant,
    /// Microseconds after `start` the current wait began (+1); 0: not waiting.
    since: AtomicU64,
    /// Microseconds of the waits that ended.
    waited: AtomicU64,
}

impl Blocked {
    pub(crate) fn new() -> Arc<Blocked> {
        Arc::new(Blocked {
            start: std::time::Instant::now(),
            since: AtomicU64::new(0),
            waited: AtomicU64::new(0),
        })
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_micros() as u64 + 1
    }

    fn set(&self, waiting: bool) {
        let since = self.since.load(Relaxed);
        if !waiting {
            if since != 0 {
                self.since.store(0, Relaxed);
                self.waited
                    .fetch_add(self.now().saturating_sub(since), Relaxed);
            }
        } else if since == 0 {
            self.since.store(self.now(), Relaxed);
        }
    }

    /// How long the writer has been waiting for the socket (zero when it is not).
    pub(crate) fn waiting_for(&self) -> Duration {
        match self.since.load(Relaxed) {
            0 => Duration::ZERO,
            t => Duration::from_micros(self.now().saturating_sub(t)),
        }
    }

    /// How long the writer has waited for the socket in all, the current wait included.
    pub(crate) fn waited(&self) -> Duration {
        Duration::from_micros(self.waited.load(Relaxed)) + self.waiting_for()
    }
}

/// Per client (its address and Hello name, as the memory budget counts it): how long its
/// connections were sending and how long the network set their pace, summed, for Load's
/// `link` (the `LINK_LIMITS` feature), and the CPU time of the work done for it, for Load's
/// `process_permille` (its share of the process). A client's counters live while it has a
/// connection open.
#[derive(Debug, Default)]
pub(crate) struct LinkLimits {
    /// Per client: its counters and its open connections.
    clients: Mutex<HashMap<u64, (Arc<ClientLink>, usize)>>,
    /// CPU time of the work done for all clients, nanoseconds.
    work: AtomicU64,
}

/// One client's counters.
#[derive(Debug, Default)]
pub(crate) struct ClientLink {
    /// Microseconds.
    sending: AtomicU64,
    limited: AtomicU64,
    /// CPU time of the work done for it (reading files, checksums, compressing),
    /// nanoseconds.
    work: AtomicU64,
    /// Its `work` and everyone's at its last [`LinkLimits::work_share`].
    seen: Mutex<(u64, u64)>,
}

/// One connection's share of its client's [`LinkLimits`]: what it saw at its last look.
/// Leaving with the last connection forgets the client's counters.
#[derive(Debug)]
pub(crate) struct LinkMember {
    registry: Arc<LinkLimits>,
    client: u64,
    link: Arc<ClientLink>,
    /// When it last looked, the writer's waits and TCP's bytes acknowledged then.
    last: (std::time::Instant, Duration, Option<u64>),
}

impl LinkLimits {
    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (Arc<ClientLink>, usize)>> {
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A connection of `client` opens.
    pub(crate) fn join(self: &Arc<Self>, client: u64) -> LinkMember {
        let mut g = self.clients();
        let entry = g.entry(client).or_insert_with(|| {
            // Its share counts from now: the work done for others before it came is not
            // set against it.
            let link = ClientLink {
                seen: Mutex::new((0, self.work.load(Relaxed))),
                ..ClientLink::default()
            };
            (Arc::new(link), 0)
        });
        entry.1 += 1;
        LinkMember {
            registry: self.clone(),
            client,
            link: entry.0.clone(),
            last: (std::time::Instant::now(), Duration::ZERO, None),
        }
    }

    /// The share of the server's work that was done for `client` since its last call (or
    /// since it came): 0 to 1; 1 when none was done for anyone.
    pub(crate) fn work_share(&self, client: u64) -> f64 {
        let Some(l) = self.clients().get(&client).map(|(l, _)| l.clone()) else {
            return 1.0;
        };
        let now = (l.work.load(Relaxed), self.work.load(Relaxed));
        let mut seen = l
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mine, all) = (now.0.saturating_sub(seen.0), now.1.saturating_sub(seen.1));
        *seen = now;
        if all == 0 {
            1.0
        } else {
            (mine as f64 / all as f64).clamp(0.0, 1.0)
        }
    }

    /// `client`'s counters: microseconds sending, and of those limited by the network.
    pub(crate) fn of(&self, client: u64) -> ferry_proto::LinkTime {
        self.clients()
            .get(&client)
            .map_or_else(Default::default, |(l, _)| ferry_proto::LinkTime {
                sending_micros: l.sending.load(Relaxed),
                limited_micros: l.limited.load(Relaxed),
            })
    }
}

/// Where the work done for one client is counted: its counters and everyone's, held by
/// its connection's session so that counting takes no lock.
#[derive(Debug, Clone)]
pub(crate) struct Work {
    all: Arc<LinkLimits>,
    link: Arc<ClientLink>,
}

impl Work {
    /// Counts `cpu` of work done for the client.
    pub(crate) fn add(&self, cpu: Duration) {
        let ns = u64::try_from(cpu.as_nanos()).unwrap_or(u64::MAX);
        self.all.work.fetch_add(ns, Relaxed);
        self.link.work.fetch_add(ns, Relaxed);
    }

    /// Runs `f` on this thread and counts the CPU time it takes.
    pub(crate) fn counted<T>(&self, f: impl FnOnce() -> T) -> T {
        let t0 = ferry_util::priority::thread_cpu_time();
        let out = f();
        if let (Some(a), Some(b)) = (t0, ferry_util::priority::thread_cpu_time()) {
            self.add(b.saturating_sub(a));
        }
        out
    }
}

impl LinkMember {
    /// Where the work done for this connection's client is counted.
    pub(crate) fn work(&self) -> Work {
        Work {
            all: self.registry.clone(),
            link: self.link.clone(),
        }
    }

    /// Looks at the connection since its last look (every quarter second): it was sending
    /// if TCP had bytes acknowledged or the writer waited for the socket; the network set
    /// the pace for all of that time if TCP's latest delivery-rate sample was not
    /// application-limited, else for as long as the writer waited.
    ///
    /// Returns the bytes TCP has had acknowledged in all (`None` where the kernel does not
    /// say).
    pub(crate) fn look(
        &mut self,
        blocked: &Blocked,
        socket: Option<std::os::fd::RawFd>,
    ) -> Option<u64> {
        let now = std::time::Instant::now();
        let (then, waited_before, acked_before) = self.last;
        let elapsed = now.saturating_duration_since(then);
        let waited = blocked.waited();
        let tcp = socket.and_then(tcp_info);
        let acked = tcp.map(|t| t.0);
        let sent = matches!((acked_before, acked), (Some(a), Some(b)) if b > a);
        let wait = waited.saturating_sub(waited_before).min(elapsed);
        self.last = (now, waited, acked);
        if !sent && wait.is_zero() {
            return acked;
        }
        let network = tcp.is_some_and(|t| sent && !t.1);
        let limited = if network { elapsed } else { wait };
        let us = |d: Duration| d.as_micros() as u64;
        self.link.sending.fetch_add(us(elapsed), Relaxed);
        self.link.limited.fetch_add(us(limited), Relaxed);
        acked
    }
}

impl Drop for LinkMember {
    fn drop(&mut self) {
        let mut g = self.registry.clients();
        if let Some(entry) = g.get_mut(&self.client) {
            entry.1 -= 1;
            if entry.1 == 0 {
                g.remove(&self.client);
            }
        }
    }
}

/// A TCP socket's bytes acknowledged so far and whether its latest delivery-rate sample
/// was application-limited (Linux `TCP_INFO`: `tcpi_bytes_acked`, and the
/// `tcpi_delivery_rate_app_limited` bit); `None` where the kernel does not say (not a TCP
/// socket, a kernel before 4.9).
fn tcp_info(fd: std::os::fd::RawFd) -> Option<(u64, bool)> {
    /// Where the fields sit in `struct tcp_info` (include/uapi/linux/tcp.h): seven `u8`s
    /// and a byte of bit fields whose lowest bit is `delivery_rate_app_limited`, 24 `u32`s,
    /// then `pacing_rate`, `max_pacing_rate` and `bytes_acked` (`u64`s).
    const APP_LIMITED_BYTE: usize = 7;
    const BYTES_ACKED: usize = 8 + 24 * 4 + 2 * 8;
    let mut buf = [0u8; 256];
    let mut len = buf.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `buf`, which is that long, and
    // sets `len` to what it wrote; the descriptor belongs to a connection being served.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            buf.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 || (len as usize) < BYTES_ACKED + 8 {
        return None;
    }
    let acked = u64::from_ne_bytes(buf[BYTES_ACKED..BYTES_ACKED + 8].try_into().ok()?);
    Some((acked, buf[APP_LIMITED_BYTE] & 1 != 0))
}

/// The socket's write half, noting in [`Blocked`] when it makes the writer wait.
pub(crate) struct Watched<W> {
    pub(crate) inner: W,
    pub(crate) blocked: std::sync::Arc<Blocked>,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Watched<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.blocked.set(r.is_pending());
        r
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.blocked.set(r.is_pending());
        r
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One encoded response on its way to the socket.
#[derive(Debug)]
pub(crate) struct Outgoing {
    /// The class it is written at: a Read's class; every other response (errors included)
    /// is [`Class::Demand`].
    pub(crate) class: Class,
    /// The frame header and the response fields.
    pub(crate) head: BytesMut,
    /// A Read's payload (empty for others), written straight from its buffer.
    pub(crate) tail: Bytes,
    /// Held only to be released (dropped) once the response has been written.
    pub(crate) _held: super::handle::Held,
}

/// Responses waiting to be written: one FIFO per class, the most urgent class first.
/// Pure (no I/O); the writer's whole ordering policy.
#[derive(Debug)]
pub(crate) struct ResponseQueue<T> {
    fifos: [VecDeque<T>; Class::ALL.len()],
}

impl<T> Default for ResponseQueue<T> {
    fn default() -> Self {
        ResponseQueue {
            fifos: std::array::from_fn(|_| VecDeque::new()),
        }
    }
}

impl<T> ResponseQueue<T> {
    /// Queues `item` at the back of its class's FIFO.
    pub(crate) fn push(&mut self, class: Class, item: T) {
        self.fifos[usize::from(class.to_bits())].push_back(item);
    }

    /// The next response to write: the oldest of the most urgent class that has one.
    pub(crate) fn pop(&mut self) -> Option<(Class, T)> {
        Class::ALL
            .into_iter()
            .zip(self.fifos.iter_mut())
            .find_map(|(class, fifo)| fifo.pop_front().map(|item| (class, item)))
    }
}

fn stalled() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "client stopped reading responses")
}

/// Writes the responses arriving on `rx`, most urgent first, until the channel closes
/// (then everything queued is written and the stream shut down) or a write fails or
/// stalls past `timeout`. Reports each response written to `record` (its class and
/// bytes, for the metrics).
pub(crate) async fn write_loop<W: AsyncWrite + Unpin>(
    wr: W,
    mut rx: mpsc::Receiver<Outgoing>,
    timeout: Duration,
    record: impl Fn(Class, u64),
) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(WRITE_BUFFER, wr);
    let mut queue = ResponseQueue::default();
    let mut open = true;
    loop {
        // Everything that has arrived competes for the next write.
        while open {
            match rx.try_recv() {
                Ok(out) => queue.push(out.class, out),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        let Some((class, out)) = queue.pop() else {
            // Nothing waiting: send what is buffered, then wait for the next response.
            tokio::time::timeout(timeout, w.flush())
                .await
                .map_err(|_| stalled())??;
            match rx.recv().await {
                Some(out) => queue.push(out.class, out),
                None => break,
            }
            continue;
        };
        let write = async {
            w.write_all(&out.head).await?;
            if !out.tail.is_empty() {
                // Payloads over the buffer size go straight to the socket (BufWriter
                // first sends what it holds); smaller ones are copied in with their header.
                w.write_all(&out.tail).await?;
            }
            io::Result::Ok(())
        };
        tokio::time::timeout(timeout, write)
            .await
            .map_err(|_| stalled())??;
        record(class, (out.head.len() + out.tail.len()) as u64);
        drop(out);
        if class == Class::Background {
            // No less urgent bytes wait in our buffer for a later demand response.
            tokio::time::timeout(timeout, w.flush())
                .await
                .map_err(|_| stalled())??;
        }
    }
    w.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::sync::Semaphore;

    #[test]
    fn each_client_is_told_its_share_of_the_work_done_since_it_last_asked() {
        let limits = Arc::new(LinkLimits::default());
        let ms = Duration::from_millis;
        let (a, b) = (limits.join(1), limits.join(2));
        // Nothing done for anyone yet: the whole process is everyone's to use.
        assert_eq!(limits.work_share(1), 1.0);
        a.work().add(ms(30));
        b.work().add(ms(10));
        assert_eq!(limits.work_share(1), 0.75);
        assert_eq!(limits.work_share(2), 0.25);
        // Since they last asked, only client 2 was served.
        b.work().add(ms(20));
        assert_eq!(limits.work_share(1), 0.0);
        assert_eq!(limits.work_share(2), 1.0);
        // A newcomer's share counts from its arrival: 1 of the 4 ms done since.
        a.work().add(ms(50));
        let c = limits.join(3);
        c.work().add(ms(1));
        a.work().add(ms(3));
        assert_eq!(limits.work_share(3), 0.25);
        // A client that has gone is forgotten (its later asks count as none known).
        drop(c);
        assert_eq!(limits.work_share(3), 1.0);
        drop((a, b));
        assert!(limits.clients().is_empty());
    }

    #[test]
    fn tcp_info_reads_the_bytes_acknowledged_of_a_real_socket() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut rx, _) = listener.accept().unwrap();
        // Linux counts the SYN as one byte acknowledged.
        let (syn, _) = tcp_info(tx.as_raw_fd()).expect("TCP_INFO of a TCP socket");
        assert_eq!(syn, 1, "nothing sent yet but the SYN");
        let sent = vec![7u8; 1 << 20];
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 1 << 20];
            rx.read_exact(&mut got).unwrap();
        });
        tx.write_all(&sent).unwrap();
        reader.join().unwrap();
        // Acknowledgements follow the reads within a round trip on loopback.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let acked = loop {
            let (acked, _) = tcp_info(tx.as_raw_fd()).unwrap();
            if acked > 1 << 20 || std::time::Instant::now() > deadline {
                break acked;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(acked, (1 << 20) + 1, "the field read is tcpi_bytes_acked");
        // Not a TCP socket: nothing.
        let file = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(tcp_info(file.as_raw_fd()), None);
    }

    /// A response whose frame is `tag` repeated `len` times, in `class`, holding one permit.
    fn outgoing(class: Class, tag: u8, len: usize, sem: &Arc<Semaphore>) -> Outgoing {
        let (head, tail) = if len > 16 {
            (BytesMut::from(&[tag][..]), Bytes::from(vec![tag; len - 1]))
        } else {
            (BytesMut::from(&vec![tag; len][..]), Bytes::new())
        };
        Outgoing {
            class,
            head,
            tail,
            _held: super::super::handle::Held {
                slots: vec![sem.clone().try_acquire_owned().unwrap()],
                bytes: None,
            },
        }
    }

    #[tokio::test]
    async fn the_writer_sends_a_late_demand_response_before_queued_background_ones() {
        let sem = Arc::new(Semaphore::new(64));
        let (tx, rx) = mpsc::channel(64);
        // Eight background responses (two large: zero-copy path), then one demand response,
        // all waiting before the writer starts.
        for i in 0..8u8 {
            let len = if i % 4 == 0 { 200 << 10 } else { 100 };
            tx.send(outgoing(Class::Background, b'a' + i, len, &sem))
                .await
                .unwrap();
        }
        tx.send(outgoing(Class::Demand, b'D', 10, &sem))
            .await
            .unwrap();
        tx.send(outgoing(Class::Prediction, b'P', 10, &sem))
            .await
            .unwrap();
        drop(tx);
        let counted = Arc::new(Mutex::new([0u64; 3]));
        let c = counted.clone();
        let mut out = Vec::new();
        write_loop(&mut out, rx, Duration::from_secs(5), move |class, n| {
            c.lock().unwrap()[usize::from(class.to_bits())] += n;
        })
        .await
        .unwrap();
        // Collapse runs of one tag: the order the responses went out in.
        let mut order = out.clone();
        order.dedup();
        let mut want = b"DP".to_vec();
        want.extend(b'a'..=b'h');
        assert_eq!(order, want);
        assert_eq!(out.len(), 2 * (200 << 10) + 6 * 100 + 20, "nothing lost");
        assert_eq!(
            *counted.lock().unwrap(),
            [10, 10, 2 * (200 << 10) + 6 * 100]
        );
        assert_eq!(sem.available_permits(), 64, "every permit released");
    }

    /// Drains the queue in write order.
    fn drain<T>(q: &mut ResponseQueue<T>) -> Vec<(Class, T)> {
        std::iter::from_fn(|| q.pop()).collect()
    }

    #[test]
    fn a_demand_response_queued_after_background_ones_is_written_first() {
        for n in [1, 2, 8, 64] {
            let mut q = ResponseQueue::default();
            for i in 0..n {
                q.push(Class::Background, i);
            }
            q.push(Class::Demand, 1000);
            assert_eq!(q.pop(), Some((Class::Demand, 1000)), "n = {n}");
            let rest = drain(&mut q);
            assert_eq!(
                rest,
                (0..n).map(|i| (Class::Background, i)).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn the_most_urgent_class_goes_first_and_each_class_keeps_its_order() {
        let mut q = ResponseQueue::default();
        q.push(Class::Background, "b1");
        q.push(Class::Prediction, "p1");
        q.push(Class::Background, "b2");
        q.push(Class::Demand, "d1");
        q.push(Class::Prediction, "p2");
        q.push(Class::Demand, "d2");
        assert_eq!(
            drain(&mut q),
            vec![
                (Class::Demand, "d1"),
                (Class::Demand, "d2"),
                (Class::Prediction, "p1"),
                (Class::Prediction, "p2"),
                (Class::Background, "b1"),
                (Class::Background, "b2"),
            ]
        );
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn interleaved_pushes_and_pops_lose_nothing_and_keep_order_within_a_class() {
        // A deterministic mix of arrivals and writes: every item comes out exactly once,
        // in arrival order within its class, and a pop always takes the most urgent class.
        let mut q = ResponseQueue::default();
        let mut next = [0u32; 3];
        let mut written: Vec<(Class, u32)> = vec![];
        let mut state = 0x2545_f491_u32;
        for step in 0..10_000u32 {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            if !state.is_multiple_of(3) || step.is_multiple_of(7) {
                let class = Class::ALL[(state >> 8) as usize % 3];
                let k = usize::from(class.to_bits());
                q.push(class, next[k]);
                next[k] += 1;
            } else if let Some((class, item)) = q.pop() {
                // Nothing more urgent was waiting.
                let more_urgent = Class::ALL.iter().filter(|c| **c < class);
                for c in more_urgent {
                    let k = usize::from(c.to_bits());
                    let done = written.iter().filter(|(wc, _)| wc == c).count() as u32;
                    assert_eq!(done, next[k], "{c} was waiting when {class} was written");
                }
                written.push((class, item));
            }
        }
        written.extend(drain(&mut q));
        for class in Class::ALL {
            let got: Vec<u32> = written
                .iter()
                .filter(|(c, _)| *c == class)
                .map(|(_, i)| *i)
                .collect();
            let k = usize::from(class.to_bits());
            assert_eq!(got, (0..next[k]).collect::<Vec<_>>(), "{class}");
        }
    }
}
