//! Admission of background requests into the total background window W.
//!
//! A background request takes room for its bytes before it is sent and gives it back when
//! its call ends (answered, failed or cancelled). Invariant: a request is admitted only
//! when the background bytes in flight plus its own fit in W at that moment ([`fits`]), or
//! when nothing else is in flight (so a request larger than W still goes, alone).
//!
//! Waiters queue in arrival order and are admitted from the head when room comes back or W
//! grows — each release wakes only the requests it admits (thousands of background pieces
//! may wait while readers are active; waking all of them at every release would cost the
//! CPU readers need).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, Notify};

/// Whether a request of `bytes` may start with `in_flight` background bytes already in
/// flight under window `window`.
pub(crate) fn fits(in_flight: u64, bytes: u64, window: u64) -> bool {
    in_flight == 0 || in_flight.saturating_add(bytes) <= window
}

/// The background bytes in flight and the requests waiting for room.
#[derive(Default)]
pub(crate) struct BackgroundWindow {
    state: Mutex<State>,
    /// Told when background work starts after none was in flight (wakes the prober).
    pub(crate) busy: Arc<Notify>,
}

#[derive(Default)]
struct State {
    in_flight: u64,
    /// W as last set.
    window: u64,
    next_id: u64,
    /// Oldest first.
    waiters: VecDeque<Waiter>,
}

struct Waiter {
    id: u64,
    bytes: u64,
    /// Told once the bytes are admitted (and counted in flight).
    admitted: oneshot::Sender<()>,
}

impl State {
    /// Admits waiters from the head while they fit. Returns whether background work
    /// started from idle.
    fn admit_waiters(&mut self) -> bool {
        let idle = self.in_flight == 0;
        while let Some(w) = self.waiters.front() {
            if !fits(self.in_flight, w.bytes, self.window) {
                break;
            }
            if let Some(w) = self.waiters.pop_front() {
                // A waiter that is gone takes nothing (its guard normally dequeues it).
                if w.admitted.send(()).is_ok() {
                    self.in_flight += w.bytes;
                }
            }
        }
        idle && self.in_flight > 0
    }
}

/// Room for one request's bytes in the window; given back when dropped.
pub(crate) struct WindowPermit<'a> {
    window: &'a BackgroundWindow,
    bytes: u64,
}

impl Drop for WindowPermit<'_> {
    fn drop(&mut self) {
        self.window.release(self.bytes);
    }
}

/// A request waiting in the queue; leaves it (or gives back what it was admitted with)
/// when its wait is cancelled.
struct Waiting<'a> {
    window: &'a BackgroundWindow,
    id: u64,
    bytes: u64,
    admitted: oneshot::Receiver<()>,
    done: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut s = self.window.lock();
        if let Some(at) = s.waiters.iter().position(|w| w.id == self.id) {
            s.waiters.remove(at);
            // Those behind may fit now.
            let started = s.admit_waiters();
            drop(s);
            self.window.started(started);
        } else if self.admitted.try_recv().is_ok() {
            drop(s);
            // Admitted, but the caller is gone: the bytes go back.
            self.window.release(self.bytes);
        }
    }
}

impl BackgroundWindow {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn started(&self, started: bool) {
        if started {
            self.busy.notify_one();
        }
    }

    fn release(&self, bytes: u64) {
        let mut s = self.lock();
        s.in_flight = s.in_flight.saturating_sub(bytes);
        let started = s.admit_waiters();
        drop(s);
        self.started(started);
    }

    /// Background bytes in flight now.
    pub(crate) fn in_flight(&self) -> u64 {
        self.lock().in_flight
    }

    /// Requests waiting for room.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Sets W (admitting waiters that fit now).
    pub(crate) fn set_window(&self, window: u64) {
        let mut s = self.lock();
        s.window = window;
        let started = s.admit_waiters();
        drop(s);
        self.started(started);
    }

    /// Waits until `bytes` fit under W (set to `window` now), behind the requests already
    /// waiting, then takes room for them.
    pub(crate) async fn admit(&self, bytes: u64, window: u64) -> WindowPermit<'_> {
        loop {
            let (id, admitted) = {
                let mut s = self.lock();
                s.window = window;
                let started = s.admit_waiters();
                let now = s.waiters.is_empty() && fits(s.in_flight, bytes, s.window);
                let idle = s.in_flight == 0;
                if now {
                    s.in_flight += bytes;
                }
                let entry = (!now).then(|| {
                    let (tx, rx) = oneshot::channel();
                    s.next_id += 1;
                    let id = s.next_id;
                    s.waiters.push_back(Waiter {
                        id,
                        bytes,
                        admitted: tx,
                    });
                    (id, rx)
                });
                drop(s);
                self.started(started || (now && idle));
                match entry {
                    None => {
                        return WindowPermit {
                            window: self,
                            bytes,
                        }
                    }
                    Some(e) => e,
                }
            };
            let mut wait = Waiting {
                window: self,
                id,
                bytes,
                admitted,
                done: false,
            };
            let granted = (&mut wait.admitted).await.is_ok();
            wait.done = true;
            if granted {
                return WindowPermit {
                    window: self,
                    bytes,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oversized_request_goes_alone_and_others_fit_under_the_window() {
        assert!(fits(0, 10 << 20, 1 << 20));
        assert!(fits(1 << 19, 1 << 19, 1 << 20));
        assert!(!fits(1 << 19, (1 << 19) + 1, 1 << 20));
    }

    /// Polls a future once; its output if it was ready.
    async fn poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }

    #[tokio::test]
    async fn waiters_are_admitted_in_order_as_room_comes_back_or_the_window_grows() {
        let w = BackgroundWindow::default();
        let a = w.admit(600, 1000).await;
        let b = w.admit(600, 1000);
        tokio::pin!(b);
        assert!(poll_once(b.as_mut()).await.is_none());
        let c = w.admit(100, 1000);
        tokio::pin!(c);
        // Behind b, though it would fit: arrival order.
        assert!(poll_once(c.as_mut()).await.is_none());
        assert_eq!((w.in_flight(), w.waiting()), (600, 2));
        drop(a);
        // Both fit in 1000 now: admitted together.
        let b = b.await;
        let c = c.await;
        assert_eq!((w.in_flight(), w.waiting()), (700, 0));
        let d = w.admit(400, 1000);
        tokio::pin!(d);
        assert!(poll_once(d.as_mut()).await.is_none());
        w.set_window(1100);
        let d = d.await;
        assert_eq!(w.in_flight(), 1100);
        drop((b, c, d));
        assert_eq!(w.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_cancelled_wait_takes_nothing_and_lets_the_next_one_in() {
        let w = BackgroundWindow::default();
        let a = w.admit(900, 1000).await;
        let mut big = Box::pin(w.admit(500, 1000));
        assert!(poll_once(big.as_mut()).await.is_none());
        let mut small = Box::pin(w.admit(100, 1000));
        assert!(poll_once(small.as_mut()).await.is_none(), "behind `big`");
        // `big` is cancelled: `small`, which fits, goes.
        drop(big);
        let small = poll_once(small.as_mut()).await.expect("admitted");
        assert_eq!((w.in_flight(), w.waiting()), (1000, 0));
        // Admitted but never collected: the bytes come back.
        let mut late = Box::pin(w.admit(100, 1000));
        assert!(poll_once(late.as_mut()).await.is_none());
        drop(small);
        assert_eq!(w.in_flight(), 1000, "`late` was admitted");
        drop(late);
        assert_eq!(w.in_flight(), 900);
        drop(a);
        assert_eq!(w.in_flight(), 0);
    }
}
