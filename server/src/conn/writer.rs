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
/// that stops reading leaves it waiting. Every wait, once over, is added to its client's
/// [`SendWaits`] total.
#[derive(Debug)]
pub(crate) struct Blocked {
    start: std::time::Instant,
    /// Microseconds after `start` the current wait began (+1); 0: not waiting.
    since: AtomicU64,
    /// The client's total of finished waits, microseconds.
    total: Arc<AtomicU64>,
}

impl Blocked {
    pub(crate) fn new(total: Arc<AtomicU64>) -> Arc<Blocked> {
        Arc::new(Blocked {
            start: std::time::Instant::now(),
            since: AtomicU64::new(0),
            total,
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
                self.total
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
}

/// Per client (its address and Hello name, as the memory budget counts it): how long the
/// writers of its connections have waited for their sockets, summed, for Load's
/// `send_wait_micros` (the `SEND_WAIT` feature). A client's total lives while it has a
/// connection open.
#[derive(Debug, Default)]
pub(crate) struct SendWaits {
    /// Per client: its total (microseconds) and its open connections.
    clients: Mutex<HashMap<u64, (Arc<AtomicU64>, usize)>>,
}

/// One connection's membership of its client's [`SendWaits`] total; leaving with the last
/// connection forgets the total.
#[derive(Debug)]
pub(crate) struct SendWaitMember {
    waits: Arc<SendWaits>,
    client: u64,
    /// The client's total, for the connection's [`Blocked`].
    pub(crate) total: Arc<AtomicU64>,
}

impl SendWaits {
    fn clients(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (Arc<AtomicU64>, usize)>> {
        self.clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A connection of `client` opens.
    pub(crate) fn join(self: &Arc<Self>, client: u64) -> SendWaitMember {
        let mut g = self.clients();
        let entry = g.entry(client).or_default();
        entry.1 += 1;
        SendWaitMember {
            waits: self.clone(),
            client,
            total: entry.0.clone(),
        }
    }

    /// `client`'s total of finished waits, microseconds.
    pub(crate) fn total(&self, client: u64) -> u64 {
        self.clients()
            .get(&client)
            .map_or(0, |(t, _)| t.load(Relaxed))
    }
}

impl Drop for SendWaitMember {
    fn drop(&mut self) {
        let mut g = self.waits.clients();
        if let Some(entry) = g.get_mut(&self.client) {
            entry.1 -= 1;
            if entry.1 == 0 {
                g.remove(&self.client);
            }
        }
    }
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
