//! The server's memory budget, shared fairly between connections.
//!
//! Every response is buffered between the moment it is computed and the moment its last
//! byte is written: file reads, directory pages, extended attributes, data maps, all of it.
//! Each request reserves a bound of what its response may hold before it is computed
//! ([`Account::take`]), the reservation becomes the encoded response's size once it is known
//! ([`Hold::settle`]), and it is given back when the response has been written.
//!
//! Fairness: the budget is split between the clients that use it (a client is a source
//! address and the name its Hello gave: ferry names all streams of one process alike), and
//! a client's share between its connections that use it (holding bytes or waiting for
//! some). A client may hold at most its fair share — the budget over the active clients and
//! one more (room for the next to turn up) — and a connection its client's share over the
//! client's active connections, except that one holding nothing may always take one
//! request's worth while the budget has room, so every connection progresses. A connection
//! whose client is not taking its responses (its writer waits for the socket) gets nothing
//! more while it holds anything: memory goes to those that drain, and one that stops reading
//! keeps at most what it held when it stopped, the others going on with the rest; such a
//! connection is closed once it has sat on its bytes for a while with the budget in demand
//! (`conn.rs`, [`Account::over_share`], [`Account::stalled_holder`]).
//!
//! Readers first: a background response (a mirror's, [`ferry_proto::Class::Background`])
//! is measured against its shares with everything its connection and client hold, a demand
//! or prediction response only with what they hold for such responses. The background bytes
//! of a connection never make a reader's read wait for a share, only the budget's total
//! (which still bounds everything). With one share for all classes a mount's 8 connections
//! of 3 MiB each (48 MiB over one client and one more, over 8) held one 1 MiB mirror read
//! each (2 MiB reserved), and the readahead of a `cp` of the mount waited for them to be
//! written: up to 0.5 s per read on loopback.
//!
//! Waiters are served by client in turn (round robin), each client's demand and prediction
//! requests before its background ones and each kind in arrival order, skipping those held
//! back by their own share (which do not block the others); the client
//! whose turn it is and whose request the budget cannot hold yet stops the round and keeps
//! its turn, so a large request is not starved by a stream of small ones. In turn, not in
//! arrival order: with the budget full of one group of clients' large reads, a newcomer's
//! first request used to wait behind every read already queued (each of a new `ferry
//! mirror`'s first steps took 2-3 s beside 16 mirrors of large files, and the WAN clients
//! among them got nothing for over 10 s); now it waits for one turn of each client.
//!
//! Small requests ([`SMALL`]: Stat, Ping, Load, ReadLink, StatFs, DataMap, IdNames of a few
//! ids) are not queued behind large reservations at all: they take their bytes from a
//! reserve of a sixteenth of the budget, at most [`SMALL`] bytes per connection, while their
//! connection's client is taking its responses; past that they wait like the others. A
//! client's round trips for metadata, its Pings and its Loads then measure the network and
//! the server's work, not the queue of other clients' reads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The budget of the whole server.
#[derive(Debug)]
pub(crate) struct Budget {
    total: u64,
    inner: Mutex<Inner>,
}

/// Responses of at most this many bytes (their reservation) may take the small requests'
/// reserve (see the module docs); also the most one connection holds there.
pub(crate) const SMALL: u64 = 128 << 10;

/// Connections whose held-back requests one scan of a client's queue remembers
/// ([`Budget::dispatch`]).
const HELD_BACK_KEPT: usize = 16;

#[derive(Debug, Default)]
struct Inner {
    /// Bytes held, the small requests' reserve included.
    used: u64,
    /// Of `used`, held in the small requests' reserve.
    small_used: u64,
    /// Per connection: bytes held and requests waiting.
    accounts: HashMap<u64, Use>,
    /// Per client: its active connections and the bytes they hold.
    clients: HashMap<u64, Client>,
    /// Accounts holding bytes or waiting.
    active: usize,
    next_id: u64,
    /// Per client with requests waiting, those requests in arrival order.
    waiters: HashMap<u64, VecDeque<Waiter>>,
    /// The clients with requests waiting, the one whose turn it is first.
    turns: VecDeque<u64>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Client {
    active: usize,
    held: u64,
    /// Of `held`, for background responses.
    background: u64,
}

#[derive(Default, Clone)]
struct Use {
    /// The client the connection belongs to.
    client: u64,
    /// Bytes held, outside the small requests' reserve.
    held: u64,
    /// Of `held`, for background responses.
    background: u64,
    /// Bytes held in the small requests' reserve.
    small: u64,
    waiting: usize,
    /// Whether the connection's client is not taking its responses now (its writer waits
    /// for the socket): then it gets nothing more while it holds anything.
    stalled: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

impl std::fmt::Debug for Use {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Use")
            .field("held", &self.held)
            .field("background", &self.background)
            .field("small", &self.small)
            .field("waiting", &self.waiting)
            .finish()
    }
}

impl Use {
    fn active(&self) -> bool {
        self.held > 0 || self.waiting > 0
    }

    fn hold(&mut self, bytes: u64, background: bool) {
        self.held += bytes;
        if background {
            self.background += bytes;
        }
    }

    fn give_back(&mut self, bytes: u64, background: bool) {
        self.held -= bytes;
        if background {
            self.background -= bytes;
        }
    }
}

#[derive(Debug)]
struct Waiter {
    account: u64,
    bytes: u64,
    background: bool,
    tx: oneshot::Sender<()>,
}

/// One connection's use of the budget.
#[derive(Debug)]
pub(crate) struct Account {
    budget: Arc<Budget>,
    id: u64,
}

/// Bytes held by one response; given back on drop.
#[derive(Debug)]
pub(crate) struct Hold {
    account: Arc<Account>,
    bytes: u64,
    /// Held in the small requests' reserve.
    small: bool,
    /// For a background response.
    background: bool,
}

impl Budget {
    /// A budget of `total` bytes.
    pub(crate) fn new(total: u64) -> Arc<Budget> {
        Arc::new(Budget {
            total,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new connection's account, its own client.
    #[cfg(test)]
    pub(crate) fn account(self: &Arc<Self>) -> Arc<Account> {
        let id = self.lock().next_id + 1;
        self.account_draining(u64::MAX - id, || false)
    }

    /// A new connection's account; `stalled` says whether its client is not taking its
    /// responses now (then, while it holds anything, it gets nothing more: a connection
    /// does not compute ahead of a client that does not read).
    pub(crate) fn account_draining(
        self: &Arc<Self>,
        client: u64,
        stalled: impl Fn() -> bool + Send + Sync + 'static,
    ) -> Arc<Account> {
        let mut g = self.lock();
        g.next_id += 1;
        let id = g.next_id;
        g.accounts.insert(
            id,
            Use {
                client,
                stalled: Some(Arc::new(stalled)),
                ..Use::default()
            },
        );
        Arc::new(Account {
            budget: self.clone(),
            id,
        })
    }

    /// Bytes held now, in all.
    pub(crate) fn used(&self) -> u64 {
        self.lock().used
    }

    /// Whether the budget is in demand: a request waits for room, or more than half of it
    /// is held.
    pub(crate) fn pressed(&self) -> bool {
        let g = self.lock();
        !g.turns.is_empty() || g.used.saturating_mul(2) > self.total
    }

    /// Whether `bytes` fit in the small requests' reserve for `account` (see the module
    /// docs).
    fn fits_small(&self, g: &Inner, account: u64, bytes: u64) -> bool {
        let Some(u) = g.accounts.get(&account) else {
            return false;
        };
        let stalled = u.stalled.as_ref().is_some_and(|f| f());
        bytes <= SMALL
            && u.small + bytes <= SMALL
            && g.small_used + bytes <= self.total / 16
            && !(stalled && u.small + u.held > 0)
    }

    /// The fair shares of `account` and of its client: the budget over the active clients
    /// and one more (so a client that turns up finds room at once even when the others
    /// hold all they may), the client's share over its active connections.
    fn shares(&self, g: &Inner, account: u64) -> (u64, u64) {
        let client = g.accounts.get(&account).map_or(0, |u| u.client);
        let of_client = self.total / (g.clients.len() as u64 + 1);
        let conns = g.clients.get(&client).map_or(1, |c| c.active.max(1));
        (of_client / conns as u64, of_client)
    }

    /// Whether `bytes` more fit for `account`, for a `background` response or not (see the
    /// module docs): `Err(true)` when its share holds it back, `Err(false)` when the budget
    /// does.
    fn fits(&self, g: &Inner, account: u64, bytes: u64, background: bool) -> Result<(), bool> {
        // What it holds in the small requests' reserve counts here too: a connection whose
        // client is not reading gets nothing more while it holds anything. A reader's
        // response does not count the background's bytes.
        let (held, stalled, client) = g.accounts.get(&account).map_or((0, false, 0), |u| {
            let bg = if background { 0 } else { u.background };
            (
                u.held - bg + u.small,
                u.stalled.as_ref().is_some_and(|f| f()),
                u.client,
            )
        });
        if held > 0 {
            let (mine, clients) = self.shares(g, account);
            let client_held = g.clients.get(&client).map_or(0, |c| {
                if background {
                    c.held
                } else {
                    c.held - c.background
                }
            });
            if stalled || held + bytes > mine || client_held + bytes > clients {
                return Err(true);
            }
        }
        if g.used + bytes > self.total && g.used > 0 {
            return Err(false);
        }
        Ok(())
    }

    fn change(g: &mut Inner, account: u64, f: impl FnOnce(&mut Use)) {
        let Some(u) = g.accounts.get_mut(&account) else {
            return;
        };
        let (before, held_before, bg_before) = (u.active(), u.held, u.background);
        f(u);
        let (after, held_after, bg_after, client) = (u.active(), u.held, u.background, u.client);
        let c = g.clients.entry(client).or_default();
        c.held = c.held + held_after - held_before;
        c.background = c.background + bg_after - bg_before;
        match (before, after) {
            (false, true) => {
                g.active += 1;
                c.active += 1;
            }
            (true, false) => {
                g.active -= 1;
                c.active -= 1;
            }
            _ => {}
        }
        if c.active == 0 && c.held == 0 {
            g.clients.remove(&client);
        }
    }

    /// Grants waiters, client by client in turn, while the budget has room (see the module
    /// docs).
    fn dispatch(&self, g: &mut Inner) {
        // Clients passed over in a row because their shares hold all their requests back.
        let mut passed = 0;
        // Per connection whose share held a waiter back in this scan, the fewest bytes held
        // back: its other waiters of as many bytes or more are held back too, and are not
        // looked at again (a client's queue can hold hundreds of one connection's requests,
        // and this runs at every release). A few connections are remembered: a client of
        // many connections has few requests waiting on each.
        let mut held_back: Vec<(u64, u64)> = Vec::new();
        while passed < g.turns.len() {
            let client = g.turns[0];
            let Some(queue) = g.waiters.get(&client) else {
                g.turns.pop_front();
                continue;
            };
            let mut pick = None;
            // Readers' requests first, then the background's.
            'scan: for background in [false, true] {
                held_back.clear();
                for (i, w) in queue.iter().enumerate() {
                    if w.background != background {
                        continue;
                    }
                    let known = held_back.iter().find(|(a, _)| *a == w.account);
                    if known.is_some_and(|(_, bytes)| w.bytes >= *bytes) {
                        continue;
                    }
                    match self.fits(g, w.account, w.bytes, background) {
                        Ok(()) => {
                            pick = Some(i);
                            break 'scan;
                        }
                        // The budget cannot hold it yet: the round ends, the turn stays.
                        Err(false) => return,
                        Err(true) => {
                            if let Some((_, bytes)) =
                                held_back.iter_mut().find(|(a, _)| *a == w.account)
                            {
                                *bytes = (*bytes).min(w.bytes);
                            } else if held_back.len() < HELD_BACK_KEPT {
                                held_back.push((w.account, w.bytes));
                            }
                        }
                    }
                }
            }
            let Some(i) = pick else {
                g.turns.rotate_left(1);
                passed += 1;
                continue;
            };
            passed = 0;
            let queue = g.waiters.get_mut(&client).expect("looked up above");
            let w = queue.remove(i).expect("index in range");
            if queue.is_empty() {
                g.waiters.remove(&client);
                g.turns.pop_front();
            } else {
                g.turns.rotate_left(1);
            }
            Self::change(g, w.account, |u| u.waiting -= 1);
            if w.tx.send(()).is_ok() {
                g.used += w.bytes;
                Self::change(g, w.account, |u| u.hold(w.bytes, w.background));
            }
        }
    }

    fn release(&self, account: u64, bytes: u64, small: bool, background: bool) {
        if bytes == 0 {
            return;
        }
        let mut g = self.lock();
        g.used -= bytes;
        if small {
            g.small_used -= bytes;
            if let Some(u) = g.accounts.get_mut(&account) {
                u.small -= bytes;
            }
        } else {
            Self::change(&mut g, account, |u| u.give_back(bytes, background));
        }
        self.dispatch(&mut g);
    }
}

impl Account {
    /// Reserves `bytes` for one response (a `background` one or a reader's), waiting for
    /// room (see the module docs).
    pub(crate) async fn take(self: &Arc<Self>, bytes: u64, background: bool) -> Hold {
        let b = &self.budget;
        let rx = {
            let mut g = b.lock();
            if b.fits_small(&g, self.id, bytes) {
                g.used += bytes;
                g.small_used += bytes;
                if let Some(u) = g.accounts.get_mut(&self.id) {
                    u.small += bytes;
                }
                return Hold {
                    account: self.clone(),
                    bytes,
                    small: true,
                    background,
                };
            }
            if g.turns.is_empty() && b.fits(&g, self.id, bytes, background).is_ok() {
                g.used += bytes;
                Budget::change(&mut g, self.id, |u| u.hold(bytes, background));
                return Hold {
                    account: self.clone(),
                    bytes,
                    small: false,
                    background,
                };
            }
            let (tx, rx) = oneshot::channel();
            let client = g.accounts.get(&self.id).map_or(0, |u| u.client);
            let queue = g.waiters.entry(client).or_default();
            queue.push_back(Waiter {
                account: self.id,
                bytes,
                background,
                tx,
            });
            if queue.len() == 1 {
                g.turns.push_back(client);
            }
            Budget::change(&mut g, self.id, |u| u.waiting += 1);
            b.dispatch(&mut g);
            rx
        };
        // Dropped (its request cancelled: its connection ended) after the bytes were
        // granted, the wait gives them back.
        let mut wait = Wait {
            account: self,
            bytes,
            background,
            rx: Some(rx),
        };
        // The sender is only dropped with the budget, which outlives every account.
        if let Some(rx) = wait.rx.as_mut() {
            let _ = rx.await;
        }
        wait.rx = None;
        Hold {
            account: self.clone(),
            bytes,
            small: false,
            background,
        }
    }

    /// Bytes this connection holds, in the small requests' reserve too.
    pub(crate) fn held(&self) -> u64 {
        let g = self.budget.lock();
        g.accounts.get(&self.id).map_or(0, |u| u.held + u.small)
    }

    /// Whether this connection holds more than its fair share now (others turned up since
    /// it took its bytes) while the budget is in demand.
    pub(crate) fn over_share(&self) -> bool {
        let b = &self.budget;
        let g = b.lock();
        let held = g.accounts.get(&self.id).map_or(0, |u| u.held);
        let pressed = !g.turns.is_empty() || g.used.saturating_mul(2) > b.total;
        pressed && held > b.shares(&g, self.id).0
    }

    /// Whether this connection holds bytes while the budget is in demand
    /// ([`Budget::pressed`]): if its client has also stopped reading, it is sitting on its
    /// share.
    pub(crate) fn stalled_holder(&self) -> bool {
        self.held() > 0 && self.budget.pressed()
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        let mut g = self.budget.lock();
        // Nothing held any more (its holds keep it alive); waiting requests, if any, were
        // dropped with their tasks.
        Budget::change(&mut g, self.id, |u| u.waiting = 0);
        let client = g.accounts.remove(&self.id).map_or(0, |u| u.client);
        // Its waiters (if any) were dropped with their tasks: forgotten, and its client's
        // turn with them if they were all it had.
        if let Some(queue) = g.waiters.get_mut(&client) {
            queue.retain(|w| w.account != self.id);
            if queue.is_empty() {
                g.waiters.remove(&client);
                g.turns.retain(|c| *c != client);
            }
        }
        self.budget.dispatch(&mut g);
    }
}

impl Hold {
    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Holds exactly `bytes` from now on (the encoded response): gives back the rest of the
    /// reservation, or, should the response exceed it, counts the excess without waiting
    /// (the bytes exist already; the count stays true).
    pub(crate) fn settle(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.account.budget.release(
                self.account.id,
                self.bytes - bytes,
                self.small,
                self.background,
            );
        } else if bytes > self.bytes {
            let extra = bytes - self.bytes;
            let mut g = self.account.budget.lock();
            g.used += extra;
            if self.small {
                g.small_used += extra;
                if let Some(u) = g.accounts.get_mut(&self.account.id) {
                    u.small += extra;
                }
            } else {
                Budget::change(&mut g, self.account.id, |u| u.hold(extra, self.background));
            }
        }
        self.bytes = bytes;
    }
}

/// A request waiting for its bytes.
struct Wait<'a> {
    account: &'a Arc<Account>,
    bytes: u64,
    background: bool,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                self.account
                    .budget
                    .release(self.account.id, self.bytes, false, self.background);
            }
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.account
            .budget
            .release(self.account.id, self.bytes, self.small, self.background);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    async fn pending(f: &mut (impl std::future::Future + Unpin)) -> bool {
        tokio::time::timeout(Duration::from_millis(30), f)
            .await
            .is_err()
    }

    #[tokio::test]
    async fn bytes_granted_to_a_request_cancelled_before_it_saw_them_come_back() {
        let b = Budget::new(1000);
        let (a, c) = (b.account(), b.account());
        let all = a.take(1000, false).await;
        let mut waiting = Box::pin(c.take(1000, false));
        assert!(pending(&mut waiting).await, "the budget is full");
        // The bytes go to the waiter, whose request is then cancelled (its connection
        // ended) before it looked.
        drop(all);
        drop(waiting);
        let again = tokio::time::timeout(Duration::from_secs(1), a.take(1000, false)).await;
        assert!(
            again.is_ok(),
            "the cancelled request's bytes were never given back"
        );
    }

    #[tokio::test]
    async fn a_connection_that_holds_its_share_cannot_take_the_others() {
        let b = Budget::new(1200);
        let (stuck, honest) = (b.account(), b.account());
        let h0 = honest.take(100, false).await;
        // Two connections active: a share is 1200 / 3 = 400.
        let s1 = stuck.take(400, false).await;
        let mut s2 = Box::pin(stuck.take(100, false));
        assert!(pending(&mut s2).await, "over its share");
        // The honest one passes the stuck waiter: it is within its share and there is room.
        let h1 = honest.take(300, false).await;
        assert_eq!(b.used(), 800);
        let mut h2 = Box::pin(honest.take(100, false));
        assert!(pending(&mut h2).await, "over its own share now");
        drop(h0);
        let _h2 = h2.await;
        assert_eq!(b.used(), 800);
        // The stuck connection's response was written: its waiter goes.
        drop(s1);
        let _s2 = s2.await;
        assert_eq!(b.used(), 500);
        drop(h1);
        assert_eq!(b.used(), 200);
    }

    #[tokio::test]
    async fn a_connection_s_background_bytes_never_hold_back_its_readers() {
        let b = Budget::new(1200);
        let a = b.account();
        // One connection of one client: its share is 1200 / 2 = 600.
        let bg = a.take(600, true).await;
        let mut more_bg = Box::pin(a.take(100, true));
        assert!(
            pending(&mut more_bg).await,
            "the background is at its share"
        );
        // A reader's read is measured without the background's bytes: it goes at once.
        let r1 = tokio::time::timeout(Duration::from_secs(1), a.take(500, false))
            .await
            .expect("a reader's read is not held back by the background's bytes");
        assert_eq!(b.used(), 1100);
        // Readers among themselves keep to the share, and the total bounds everything.
        let mut r2 = Box::pin(a.take(200, false));
        assert!(pending(&mut r2).await, "the readers are at their share");
        drop(r1);
        let _r2 = r2.await;
        drop(bg);
        let _more_bg = more_bg.await;
        assert_eq!(b.used(), 300);
    }

    #[tokio::test]
    async fn a_client_s_readers_waiting_go_before_its_background_waiting() {
        let b = Budget::new(1000);
        let (a, c) = (
            b.account_draining(1, || false),
            b.account_draining(1, || false),
        );
        let all = a.take(1000, false).await;
        // The background's request came first; both wait for the budget.
        let mut bg = Box::pin(c.take(600, true));
        assert!(pending(&mut bg).await);
        let mut reader = Box::pin(c.take(600, false));
        assert!(pending(&mut reader).await);
        drop(all);
        let _reader = tokio::time::timeout(Duration::from_secs(1), reader)
            .await
            .expect("the reader's request goes first");
        assert!(pending(&mut bg).await, "no room for both");
        assert_eq!(b.used(), 600);
    }

    #[tokio::test]
    async fn an_idle_connection_may_always_take_one_request_and_shrinks_give_back() {
        let b = Budget::new(100);
        let a = b.account();
        // Larger than the whole budget: allowed when nothing else is held.
        let mut big = a.take(300, false).await;
        assert_eq!(b.used(), 300);
        big.settle(40);
        assert_eq!((b.used(), big.bytes()), (40, 40));
        // A response larger than its reservation is counted all the same.
        big.settle(70);
        assert_eq!((b.used(), big.bytes()), (70, 70));
        big.settle(40);
        let other = b.account();
        let c = other.take(60, false).await;
        assert_eq!(b.used(), 100);
        drop((big, c));
        assert_eq!(b.used(), 0);
        assert_eq!(b.lock().active, 0);
    }

    #[tokio::test]
    async fn waiters_of_a_closed_connection_are_forgotten() {
        let b = Budget::new(100);
        let (a, c) = (b.account(), b.account());
        let h = a.take(100, false).await;
        let mut w = Box::pin(c.take(50, false));
        assert!(pending(&mut w).await);
        drop(w);
        drop(c);
        drop(h);
        assert_eq!(b.used(), 0);
        assert!(b.lock().waiters.is_empty() && b.lock().turns.is_empty());
        assert_eq!(b.lock().active, 0);
    }

    #[tokio::test]
    async fn a_connection_whose_client_does_not_read_gets_nothing_more() {
        let b = Budget::new(1000);
        let (a, stalled) = stallable(&b, 7);
        let first = a.take(100, false).await;
        stalled.store(true, Ordering::Relaxed);
        let mut more = Box::pin(a.take(100, false));
        assert!(pending(&mut more).await, "not reading: nothing more");
        // Its client reads again; the next release anywhere lets it go on.
        stalled.store(false, Ordering::Relaxed);
        let other = b.account();
        drop(other.take(10, false).await);
        let _more = more.await;
        drop(first);
        assert_eq!(b.used(), 100);
    }

    #[tokio::test]
    async fn a_connection_that_took_its_share_alone_is_over_it_once_others_come() {
        let b = Budget::new(1000);
        let early = b.account();
        // Alone, its share is 500.
        let _held = [early.take(250, false).await, early.take(250, false).await];
        assert!(!early.over_share());
        // Three more wait for room: shares are 1000 / 5 = 200 now, and the budget is in
        // demand.
        let others: Vec<_> = (0..3).map(|_| b.account()).collect();
        let _h: Vec<_> = futures_take(&others).await;
        let mut w = Box::pin(others[0].take(400, false));
        assert!(pending(&mut w).await);
        assert!(early.over_share());
    }

    async fn futures_take(accounts: &[Arc<Account>]) -> Vec<Hold> {
        let mut out = Vec::new();
        for a in accounts {
            out.push(a.take(100, false).await);
        }
        out
    }

    #[tokio::test]
    async fn a_smaller_request_queued_behind_larger_ones_its_share_holds_back_goes() {
        const MIB: u64 = 1 << 20;
        let b = Budget::new(12 * MIB);
        let (a, other) = (b.account(), b.account());
        let _o = other.take(MIB, false).await;
        // Two clients active: a share is 12 / 3 = 4 MiB.
        let _held = a.take(3 * MIB, false).await;
        let mut large = Box::pin(a.take(2 * MIB, false));
        assert!(pending(&mut large).await, "3 + 2 MiB is over its share");
        let mut larger = Box::pin(a.take(3 * MIB, false));
        assert!(pending(&mut larger).await);
        // Held back in the scan above at 2 MiB, the connection still gets half a MiB (more
        // than the small requests' reserve takes).
        let small = tokio::time::timeout(Duration::from_secs(1), a.take(MIB / 2, false)).await;
        assert!(small.is_ok(), "3.5 MiB is within its share");
        assert!(pending(&mut large).await && pending(&mut larger).await);
        assert_eq!(b.used(), 4 * MIB + MIB / 2);
    }

    #[tokio::test]
    async fn a_client_with_many_connections_gets_one_clients_share() {
        let b = Budget::new(1200);
        // Client 1 has three connections, client 2 one: shares are 1200 / 3 = 400 a client,
        // a third of that for each of client 1's connections.
        let many: Vec<_> = (0..3).map(|_| b.account_draining(1, || false)).collect();
        let one = b.account_draining(2, || false);
        let mut held: Vec<_> = Vec::new();
        for a in &many {
            held.push(a.take(100, false).await);
        }
        held.push(one.take(100, false).await);
        // 100 + 100 > 400 / 3 for a connection of client 1: it waits...
        let mut more = Box::pin(many[0].take(100, false));
        assert!(pending(&mut more).await);
        // ...while client 2's one connection may hold up to 400.
        held.push(one.take(250, false).await);
        assert_eq!(b.used(), 650);
    }

    #[tokio::test]
    async fn a_newcomer_is_served_in_its_turn_not_behind_every_queued_request() {
        const MIB: u64 = 1 << 20;
        let b = Budget::new(4 * MIB);
        // Client 1 (a mirror of a large file) fills the budget on two connections, and three
        // more of its connections wait for room.
        let c: Vec<_> = (0..5).map(|_| b.account_draining(1, || false)).collect();
        let mut h1 = Some(c[0].take(2 * MIB, false).await);
        let mut h2 = Some(c[1].take(2 * MIB, false).await);
        let mut queued: Vec<_> = c[2..]
            .iter()
            .map(|a| Box::pin(a.take(2 * MIB, false)))
            .collect();
        for q in &mut queued {
            assert!(pending(q).await);
        }
        // Client 2 turns up with a listing's reservation (too large for the small reserve).
        let newcomer = b.account_draining(2, || false);
        let mut listing = Box::pin(newcomer.take(MIB, false));
        assert!(pending(&mut listing).await);
        // The first room goes to client 1, whose turn it was...
        h1.take();
        let _g1 = granted(&mut queued[0]).await;
        assert!(pending(&mut listing).await);
        // ...the next to client 2, ahead of client 1's other two requests queued before it.
        h2.take();
        let _l = granted(&mut listing).await;
        assert!(pending(&mut queued[1]).await && pending(&mut queued[2]).await);
    }

    #[tokio::test]
    async fn small_requests_do_not_wait_behind_large_ones_within_their_reserve() {
        const MIB: u64 = 1 << 20;
        let b = Budget::new(16 * MIB);
        let big: Vec<_> = (0..9).map(|_| b.account_draining(1, || false)).collect();
        let mut held = Vec::new();
        for a in &big[..8] {
            held.push(a.take(2 * MIB, false).await);
        }
        let mut waiting = Box::pin(big[8].take(2 * MIB, false));
        assert!(pending(&mut waiting).await, "the budget is full");
        // A Stat of another client goes at once: the small reserve is 1 MiB here.
        let other = b.account_draining(2, || false);
        let stats: Vec<_> = granted(&mut Box::pin(futures_take_n(&other, 8192, 16))).await;
        assert_eq!(b.used(), 16 * MIB + 16 * 8192);
        // Past SMALL bytes on one connection, the next waits like any request.
        let mut more = Box::pin(other.take(8192, false));
        assert!(pending(&mut more).await);
        // Then it is served in its client's turn, after client 1's waiting request.
        drop(stats);
        assert!(pending(&mut more).await);
        held.truncate(6);
        let _waiting = granted(&mut waiting).await;
        let _more = granted(&mut more).await;
        // A connection whose client is not reading gets nothing from the reserve while it
        // holds anything.
        let (stuck, stalled) = stallable(&b, 3);
        let _first = stuck.take(8192, false).await;
        stalled.store(true, Ordering::Relaxed);
        let mut second = Box::pin(stuck.take(8192, false));
        assert!(pending(&mut second).await);
    }

    /// A connection of `client` and the switch saying its client does not read.
    fn stallable(b: &Arc<Budget>, client: u64) -> (Arc<Account>, Arc<AtomicBool>) {
        let stalled = Arc::new(AtomicBool::new(false));
        let s = stalled.clone();
        (
            b.account_draining(client, move || s.load(Ordering::Relaxed)),
            stalled,
        )
    }

    /// The output of `f`, which must come at once (a grant owed, not a wait for room).
    async fn granted<T>(f: &mut (impl std::future::Future<Output = T> + Unpin)) -> T {
        tokio::time::timeout(Duration::from_secs(5), f)
            .await
            .expect("the request was not granted")
    }

    async fn futures_take_n(a: &Arc<Account>, bytes: u64, n: usize) -> Vec<Hold> {
        let mut out = Vec::new();
        for _ in 0..n {
            out.push(a.take(bytes, false).await);
        }
        out
    }
}
