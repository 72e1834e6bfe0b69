//! A test-only TCP proxy that injects faults between ferry and ferryd: resets, stalls,
//! delays, truncation and flipped bits, on chosen connections at chosen moments.
//!
//! Each accepted connection is connected to the upstream address and pumped by two threads
//! (client → server, server → client). Faults apply to the server → client direction, where
//! the payloads are, except a stall, which stops both directions. Everything ends when the
//! proxy is dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the proxy does to the traffic it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward faithfully.
    None,
    /// Reset (RST) the connection that carries the byte at each multiple of this many
    /// bytes sent to clients (counted over all connections).
    ResetEvery(u64),
    /// Flip one bit at each multiple of this many bytes sent to clients (over all
    /// connections).
    FlipEvery(u64),
    /// Close a connection (cleanly, mid-stream) after this many bytes to the client.
    TruncateAfter(u64),
    /// Wait this long before forwarding each read from the server.
    Delay(Duration),
}

#[derive(Debug, Default)]
struct Shared {
    fault: Mutex<Option<Fault>>,
    /// Bytes per second to the client, over all connections (0: unlimited).
    rate: AtomicU64,
    stop: AtomicBool,
    accepted: AtomicUsize,
    resets: AtomicU64,
    flips: AtomicU64,
    truncations: AtomicU64,
    bytes_down: AtomicU64,
    /// Connections (by accept order) that must not pass any byte.
    stalled: Mutex<Vec<usize>>,
    /// Token bucket state for `rate`: when the bytes so far are paid for.
    paid_until: Mutex<Option<Instant>>,
    /// Position (in `bytes_down`) of the next reset or flip.
    next_event: Mutex<Option<u64>>,
}

/// A running proxy. Dropping it stops accepting and cuts every connection.
#[derive(Debug)]
pub struct FaultProxy {
    /// `127.0.0.1:port` to give ferry instead of the server's address.
    pub addr: String,
    shared: Arc<Shared>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
}

impl FaultProxy {
    /// Listens on 127.0.0.1:0 and forwards to `upstream`.
    pub fn start(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let addr = listener.local_addr().expect("proxy addr").to_string();
        listener.set_nonblocking(true).expect("nonblocking");
        let shared = Arc::new(Shared::default());
        let sockets = Arc::new(Mutex::new(Vec::new()));
        let (sh, socks, up) = (shared.clone(), sockets.clone(), upstream.to_string());
        std::thread::spawn(move || {
            while !sh.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let _ = client.set_nonblocking(false);
                        let index = sh.accepted.fetch_add(1, Ordering::Relaxed);
                        let Ok(server) = TcpStream::connect(&up) else {
                            // Upstream down: the client sees a closed connection.
                            continue;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        {
                            let mut s = socks.lock().unwrap_or_else(|e| e.into_inner());
                            for t in [&client, &server] {
                                if let Ok(c) = t.try_clone() {
                                    s.push(c);
                                }
                            }
                        }
                        start_pumps(sh.clone(), index, client, server);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        FaultProxy {
            addr,
            shared,
            sockets,
        }
    }

    /// Sets the fault applied from now on.
    pub fn set(&self, fault: Fault) {
        *self.shared.fault.lock().unwrap_or_else(|e| e.into_inner()) = Some(fault);
        *self
            .shared
            .next_event
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Limits bytes per second to the client, over all connections (0: no limit).
    pub fn set_rate(&self, bytes_per_sec: u64) {
        self.shared.rate.store(bytes_per_sec, Ordering::Relaxed);
    }

    /// Stops all traffic, both ways, on the connection accepted `index`-th (from 0); the
    /// sockets stay open.
    pub fn stall(&self, index: usize) {
        self.shared
            .stalled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(index);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::Relaxed)
    }

    /// Connections reset by [`Fault::ResetEvery`].
    pub fn resets(&self) -> u64 {
        self.shared.resets.load(Ordering::Relaxed)
    }

    /// Bits flipped by [`Fault::FlipEvery`].
    pub fn flips(&self) -> u64 {
        self.shared.flips.load(Ordering::Relaxed)
    }

    /// Connections cut by [`Fault::TruncateAfter`].
    pub fn truncations(&self) -> u64 {
        self.shared.truncations.load(Ordering::Relaxed)
    }

    /// Bytes forwarded to clients.
    pub fn bytes_down(&self) -> u64 {
        self.shared.bytes_down.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for s in self
            .sockets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn stalled(sh: &Shared, index: usize) -> bool {
    sh.stalled
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&index)
}

/// Sets SO_LINGER to 0, so closing sends a reset.
fn reset(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on an open socket with a correctly sized linger struct.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(l).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    let _ = s.shutdown(Shutdown::Both);
}

fn start_pumps(sh: Arc<Shared>, index: usize, client: TcpStream, server: TcpStream) {
    // client → server: only stalls apply.
    {
        let (sh, mut from, mut to) = (
            sh.clone(),
            client.try_clone().expect("clone"),
            server.try_clone().expect("clone"),
        );
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                while stalled(&sh, index) && !sh.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
    }
    // server → client: every fault.
    std::thread::spawn(move || {
        let (mut from, mut to) = (server, client);
        let mut buf = vec![0u8; 64 << 10];
        let mut carried: u64 = 0;
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            while stalled(&sh, index) && !sh.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let fault = sh
                .fault
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or(Fault::None);
            match fault {
                Fault::None => {}
                Fault::Delay(d) => std::thread::sleep(d),
                Fault::ResetEvery(every) => {
                    if event_in(&sh, n as u64, every).is_some() {
                        sh.resets.fetch_add(1, Ordering::Relaxed);
                        reset(&to);
                        reset(&from);
                        return;
                    }
                }
                Fault::TruncateAfter(after) => {
                    if carried + n as u64 >= after {
                        let keep = after.saturating_sub(carried) as usize;
                        let _ = to.write_all(&buf[..keep]);
                        sh.truncations.fetch_add(1, Ordering::Relaxed);
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                        return;
                    }
                }
                Fault::FlipEvery(every) => {
                    if let Some(i) = event_in(&sh, n as u64, every) {
                        buf[i] ^= 0x10;
                        sh.flips.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            pace(&sh, n as u64);
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
            carried += n as u64;
            if !matches!(fault, Fault::ResetEvery(_) | Fault::FlipEvery(_)) {
                sh.bytes_down.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Whether the next event position falls within the `n` bytes about to be sent (reserving
/// them); its index in them if so.
fn event_in(sh: &Shared, n: u64, every: u64) -> Option<usize> {
    let mut next = sh.next_event.lock().unwrap_or_else(|e| e.into_inner());
    // The bytes are counted here, under the same lock, so events fall exactly every `every`.
    let start = sh.bytes_down.fetch_add(n, Ordering::Relaxed);
    let at = *next.get_or_insert(start + every);
    if at < start + n {
        *next = Some(at + every);
        Some((at - start) as usize)
    } else {
        None
    }
}

/// Sleeps as long as the shared rate requires for `n` more bytes.
fn pace(sh: &Shared, n: u64) {
    let rate = sh.rate.load(Ordering::Relaxed);
    if rate == 0 {
        return;
    }
    let wait = {
        let mut p = sh.paid_until.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let start = p.filter(|t| *t > now).unwrap_or(now);
        let until = start + Duration::from_secs_f64(n as f64 / rate as f64);
        *p = Some(until);
        until.saturating_duration_since(now)
    };
    std::thread::sleep(wait);
}
