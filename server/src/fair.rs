//! Fair turns at reading files: a fixed number of reads run at once, and when more wait, the
//! next turn goes by deficit round robin over the clients (by bytes: a client asking for
//! 16 KiB pieces gets as many bytes as one asking for 1 MiB chunks), and within a client in
//! the order below. tokio's blocking pool alone serves in arrival order, so a client with
//! hundreds of reads queued would make every other client's read wait behind them all.
//!
//! Within a client (one process: all its streams), its demand reads (someone waits for them)
//! go before its prediction reads (read-ahead, a tree walk's files fetched ahead), as its
//! connections' response writers order them, and each kind goes in the order the client sent
//! it, whatever the connection: a client sends its predictions nearest first (a walk's next
//! files before those further on), and taking its connections in turn served them in an
//! order of its streams', not its own. Across clients the round robin stands: a client's
//! class buys no place ahead of another client.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// Bytes a client's deficit grows by each round.
const QUANTUM: u64 = 1 << 20;

/// The turns.
#[derive(Debug)]
pub(crate) struct FairPool {
    slots: usize,
    inner: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Reads running now.
    busy: usize,
    /// Clients with reads waiting, in round order.
    order: VecDeque<u64>,
    clients: HashMap<u64, Waiting>,
}

/// One client's waiting reads, whatever their connection: its demand reads, served before
/// its prediction reads, each line in arrival order.
#[derive(Debug, Default)]
struct Waiting {
    deficit: u64,
    demand: VecDeque<Waiter>,
    prediction: VecDeque<Waiter>,
}

impl Waiting {
    /// The line whose front is served next.
    fn next_line(&mut self) -> &mut VecDeque<Waiter> {
        if self.demand.is_empty() {
            &mut self.prediction
        } else {
            &mut self.demand
        }
    }
}

#[derive(Debug)]
struct Waiter {
    cost: u64,
    tx: oneshot::Sender<()>,
}

/// A turn: the read may run; the next waiter gets it when this is dropped.
#[derive(Debug)]
pub(crate) struct Turn {
    pool: Arc<FairPool>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.pool.release();
    }
}

/// A wait for a turn; a wait given up (its request cancelled) after the turn was granted
/// passes the turn on.
struct Wait {
    pool: Arc<FairPool>,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Wait {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            // No turn granted after this look.
            rx.close();
            if rx.try_recv().is_ok() {
                self.pool.release();
            }
        }
    }
}

impl FairPool {
    /// Turns for `slots` reads at once.
    pub(crate) fn new(slots: usize) -> Arc<FairPool> {
        Arc::new(FairPool {
            slots: slots.max(1),
            inner: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a turn to read `cost` bytes for `client` (any of its connections);
    /// `demand`: a demand read, served before the client's prediction reads (see the module
    /// docs).
    pub(crate) async fn turn(self: &Arc<Self>, client: u64, cost: u64, demand: bool) -> Turn {
        let rx = {
            let mut g = self.lock();
            if g.busy < self.slots && g.order.is_empty() {
                g.busy += 1;
                return Turn { pool: self.clone() };
            }
            let (tx, rx) = oneshot::channel();
            let w = Waiter { cost, tx };
            if !g.clients.contains_key(&client) {
                g.order.push_back(client);
            }
            let q = g.clients.entry(client).or_default();
            if demand {
                q.demand.push_back(w);
            } else {
                q.prediction.push_back(w);
            }
            Self::grant(&mut g, self.slots);
            rx
        };
        let mut wait = Wait {
            pool: self.clone(),
            rx: Some(rx),
        };
        let granted = wait.rx.as_mut().map(|rx| async { rx.await.is_ok() });
        let ok = match granted {
            Some(f) => f.await,
            None => false,
        };
        // Granted (or the pool is gone): the turn is ours now, not the wait's to give back.
        wait.rx = None;
        if !ok {
            self.lock().busy += 1;
        }
        Turn { pool: self.clone() }
    }

    fn release(&self) {
        let mut g = self.lock();
        g.busy = g.busy.saturating_sub(1);
        Self::grant(&mut g, self.slots);
    }

    /// Gives free turns to waiters, by deficit round robin over the clients.
    fn grant(g: &mut State, slots: usize) {
        while g.busy < slots {
            let Some(w) = Self::next(g) else { return };
            if w.tx.send(()).is_ok() {
                g.busy += 1;
            }
        }
    }

    /// The next waiter to serve.
    fn next(g: &mut State) -> Option<Waiter> {
        loop {
            let client = *g.order.front()?;
            let Some(q) = g.clients.get_mut(&client) else {
                g.order.pop_front();
                continue;
            };
            let Some(cost) = q.next_line().front().map(|w| w.cost) else {
                g.clients.remove(&client);
                g.order.pop_front();
                continue;
            };
            if q.deficit < cost {
                // Its round is over: more next time, and the next client's turn.
                q.deficit += QUANTUM;
                g.order.rotate_left(1);
                continue;
            }
            q.deficit -= cost;
            let w = q.next_line().pop_front();
            if q.demand.is_empty() && q.prediction.is_empty() {
                g.clients.remove(&client);
                g.order.pop_front();
            }
            if w.is_some() {
                return w;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Who got the turns, in order.
    type Log = Arc<Mutex<Vec<&'static str>>>;

    /// What the order tests share: a pool of one turn, the log of who got it, and the
    /// permits that end the turns ([`waiter`]).
    fn one_turn() -> (Arc<FairPool>, Log, Arc<tokio::sync::Semaphore>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        (
            FairPool::new(1),
            log,
            Arc::new(tokio::sync::Semaphore::new(0)),
        )
    }

    /// Starts a task waiting for a turn for `who` (client, cost, whether a demand read) and
    /// recording its name in `log` when it gets it; it keeps the turn until `hold` gives it
    /// a permit.
    fn waiter(
        pool: &Arc<FairPool>,
        who: (u64, u64, bool),
        name: &'static str,
        log: &Log,
        hold: &Arc<tokio::sync::Semaphore>,
    ) -> tokio::task::JoinHandle<()> {
        let (pool, log, hold) = (pool.clone(), log.clone(), hold.clone());
        let (client, cost, demand) = who;
        tokio::spawn(async move {
            let _turn = pool.turn(client, cost, demand).await;
            log.lock().unwrap().push(name);
            hold.acquire().await.unwrap().forget();
        })
    }

    /// Gives up `first` (the one turn, held while the waiters queued), then lets the
    /// waiters' turns end one at a time, `gap` apart, and waits for them all.
    async fn release_in_turn(
        first: Turn,
        hold: &tokio::sync::Semaphore,
        tasks: Vec<tokio::task::JoinHandle<()>>,
        gap: Duration,
    ) {
        drop(first);
        for _ in 0..tasks.len() {
            tokio::time::sleep(gap).await;
            hold.add_permits(1);
        }
        for t in tasks {
            t.await.unwrap();
        }
    }

    #[tokio::test]
    async fn a_client_with_many_reads_queued_does_not_keep_another_waiting_behind_them() {
        let (pool, log, hold) = one_turn();
        let first = pool.turn(1, QUANTUM, false).await;
        let mut tasks = Vec::new();
        for _ in 0..20 {
            tasks.push(waiter(&pool, (1, QUANTUM, false), "a", &log, &hold));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        tasks.push(waiter(&pool, (2, QUANTUM, false), "b", &log, &hold));
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Each granted task holds its turn until released one at a time.
        release_in_turn(first, &hold, tasks, Duration::from_millis(5)).await;
        let order = log.lock().unwrap().clone();
        assert_eq!(order.len(), 21);
        let b = order.iter().position(|n| *n == "b").unwrap();
        assert!(b <= 1, "b served at {b}: {order:?}");
    }

    #[tokio::test]
    async fn shares_are_by_bytes_and_a_clients_reads_go_in_arrival_order() {
        let (pool, log, hold) = one_turn();
        let first = pool.turn(9, 1, false).await;
        let mut tasks = Vec::new();
        // Client 1: 1 MiB reads (on two connections). Client 2: 256 KiB reads.
        for _ in 0..4 {
            tasks.push(waiter(&pool, (1, QUANTUM, false), "1a", &log, &hold));
            tasks.push(waiter(&pool, (1, QUANTUM, false), "1b", &log, &hold));
            for _ in 0..4 {
                tasks.push(waiter(&pool, (2, QUANTUM / 4, false), "2", &log, &hold));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        release_in_turn(first, &hold, tasks, Duration::from_millis(2)).await;
        let order = log.lock().unwrap().clone();
        // In the first half of the turns, both clients got about half of the bytes, and
        // client 1's reads went as they arrived.
        let half = &order[..order.len() / 2];
        let bytes =
            |who: &str, each: u64| half.iter().filter(|n| n.starts_with(who)).count() as u64 * each;
        let (one, two) = (bytes("1", QUANTUM), bytes("2", QUANTUM / 4));
        assert!(
            one.abs_diff(two) <= 2 * QUANTUM,
            "{one} vs {two}: {order:?}"
        );
        let ones: Vec<_> = order.iter().filter(|n| n.starts_with('1')).collect();
        assert!(ones.windows(2).all(|w| w[0] != w[1]), "{ones:?}");
    }

    #[tokio::test]
    async fn a_clients_reads_go_in_the_order_it_sent_them_whatever_the_connection() {
        // A walk's runs, nearest first, spread over a client's streams as they were free:
        // the turns know clients, not connections, and serve them in that order (taking the
        // connections in turn, 1 and 4 and 6 on one, 2 and 3 on another, 5 on a third,
        // served 1, 2, 5, 4, 3, 6).
        let (pool, log, hold) = one_turn();
        let first = pool.turn(9, 1, false).await;
        let mut tasks = Vec::new();
        for name in ["1", "2", "3", "4", "5", "6"] {
            tasks.push(waiter(&pool, (1, QUANTUM / 8, false), name, &log, &hold));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        release_in_turn(first, &hold, tasks, Duration::from_millis(2)).await;
        let order = log.lock().unwrap().clone();
        assert_eq!(order, ["1", "2", "3", "4", "5", "6"]);
    }

    #[tokio::test]
    async fn a_clients_demand_reads_go_before_its_prediction_reads_not_before_other_clients() {
        let (pool, log, hold) = one_turn();
        let first = pool.turn(9, 1, false).await;
        let mut tasks = Vec::new();
        // Client 1 fetches six files ahead; client 2 reads one; then client 1's walker waits
        // for a file, twice (on any of its connections).
        for _ in 0..6 {
            tasks.push(waiter(&pool, (1, QUANTUM / 4, false), "p", &log, &hold));
        }
        tasks.push(waiter(&pool, (2, QUANTUM / 4, false), "o", &log, &hold));
        tokio::time::sleep(Duration::from_millis(20)).await;
        tasks.push(waiter(&pool, (1, QUANTUM / 4, true), "d", &log, &hold));
        tasks.push(waiter(&pool, (1, QUANTUM / 4, true), "d", &log, &hold));
        tokio::time::sleep(Duration::from_millis(20)).await;
        release_in_turn(first, &hold, tasks, Duration::from_millis(2)).await;
        let order = log.lock().unwrap().clone();
        assert_eq!(order.len(), 9);
        assert_eq!(&order[..2], ["d", "d"], "{order:?}");
        // Client 2's turn comes where it would without them: after client 1's quantum.
        let o = order.iter().position(|n| *n == "o").unwrap();
        assert!(o <= 4, "client 2 served at {o}: {order:?}");
    }

    #[tokio::test]
    async fn a_wait_given_up_after_its_turn_came_passes_the_turn_on() {
        let pool = FairPool::new(1);
        let first = pool.turn(1, 10, false).await;
        let gave_up = {
            let pool = pool.clone();
            tokio::spawn(async move {
                let _t = pool.turn(2, 10, false).await;
                std::future::pending::<()>().await;
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        gave_up.abort();
        drop(first);
        // The turn is free again (or was passed on and given back): a new read gets one.
        tokio::time::timeout(Duration::from_secs(2), pool.turn(3, 10, false))
            .await
            .expect("a turn");
    }
}
