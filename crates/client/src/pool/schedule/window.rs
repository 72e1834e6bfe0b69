//! Admission of background requests into the total background window W.
//!
//! A background request takes room for its bytes before it is sent and gives it back when
//! its call ends (answered, failed or cancelled). Invariant: a request is admitted only
//! when the background bytes in flight plus its own fit in W at that moment ([`fits`]), or
//! when nothing else is in flight (so a request larger than W still goes, alone). Waiters
//! wake when bytes come back or W grows.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Whether a request of `bytes` may start with `in_flight` background bytes already in
/// flight under window `window`.
pub(crate) fn fits(in_flight: u64, bytes: u64, window: u64) -> bool {
    in_flight == 0 || in_flight.saturating_add(bytes) <= window
}

/// The background bytes in flight and the tasks waiting for room.
#[derive(Default)]
pub(crate) struct BackgroundWindow {
    in_flight: Mutex<u64>,
    /// Woken when room may have appeared (bytes given back, or W grew).
    room: Notify,
    /// Told when background work starts after none was in flight (wakes the prober).
    pub(crate) busy: Arc<Notify>,
}

/// Room for one request's bytes in the window; given back when dropped.
pub(crate) struct WindowPermit<'a> {
    window: &'a BackgroundWindow,
    bytes: u64,
}

impl Drop for WindowPermit<'_> {
    fn drop(&mut self) {
        {
            let mut n = self.window.lock();
            *n = n.saturating_sub(self.bytes);
        }
        self.window.room.notify_waiters();
    }
}

impl BackgroundWindow {
    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Background bytes in flight now.
    pub(crate) fn in_flight(&self) -> u64 {
        *self.lock()
    }

    /// Waits until `bytes` fit under the window `window()` returns (asked anew at every
    /// try), then takes room for them.
    pub(crate) async fn admit(&self, bytes: u64, window: impl Fn() -> u64) -> WindowPermit<'_> {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let w = window();
            {
                let mut n = self.lock();
                if fits(*n, bytes, w) {
                    let was_idle = *n == 0;
                    *n += bytes;
                    drop(n);
                    if was_idle {
                        self.busy.notify_one();
                    }
                    return WindowPermit {
                        window: self,
                        bytes,
                    };
                }
            }
            notified.await;
        }
    }

    /// Wakes the waiters: W may have grown.
    pub(crate) fn grew(&self) {
        self.room.notify_waiters();
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

    #[tokio::test]
    async fn a_waiter_is_admitted_when_room_comes_back() {
        let w = BackgroundWindow::default();
        let a = w.admit(600, || 1000).await;
        let waiting = w.admit(600, || 1000);
        tokio::pin!(waiting);
        assert!(futures_poll_once(waiting.as_mut()).await.is_none());
        assert_eq!(w.in_flight(), 600);
        drop(a);
        let b = waiting.await;
        assert_eq!(w.in_flight(), 600);
        drop(b);
        assert_eq!(w.in_flight(), 0);
    }

    /// Polls a future once; its output if it was ready.
    async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
        let mut f = f;
        std::future::poll_fn(|cx| {
            std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
                std::task::Poll::Ready(v) => Some(v),
                std::task::Poll::Pending => None,
            })
        })
        .await
    }
}
