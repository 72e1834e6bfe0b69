//! The mirror's background threads and the rule by which its work yields to readers.
//!
//! - **Threads.** [`run`] runs a blocking closure on one of [`THREADS`] named threads
//!   (`ferry-bg-N`), started on first use and shared by every mirror and syncer of the
//!   process, each at lower CPU and I/O priority ([`ferry_util::lower_current_thread`]).
//!   They take the mirror's blocking work: writes to the local copy, BLAKE3 hashing,
//!   metadata, directory creation, `fdatasync`/`syncfs` and journal commits, status-file
//!   writes. The mount's own reads of the local copy stay on tokio's blocking pool: they
//!   serve readers. The queue in front of the threads is bounded ([`QUEUE`] jobs): a
//!   submitter waits for room, so background work never piles up without bound. Long jobs
//!   (hashing a whole file, [`run_long`]) take at most `THREADS − 1` threads, so writes and
//!   syncs always have one.
//! - **Deferral.** [`DemandGate::wait`]: before a piece of CPU or disk work that is not on
//!   the network path (hashing a completed file, a sync batch, a journal compaction), the
//!   mirror waits while demand reads are in flight ([`ferry_client::Client::demand_in_flight`]),
//!   polled every [`DEFER_POLL`], until none was seen on two polls in a row, and never longer
//!   than [`MAX_DEFERRAL`], so background work is delayed but never starved. Deferrals are
//!   counted ([`deferrals`]).
//!
//! The pool itself is [`ferry_util::background::Pool`] (a job that panics does not take its
//! thread with it; its caller gets [`BackgroundError::Panicked`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ferry_client::Client;

/// Background threads. Several keep writes going while others hash or sync (with two,
/// the mirror alone on loopback fell to ~0.7× of the spawn_blocking pool it replaced; with
/// four it is within noise of it); their lowered priority keeps them behind readers.
pub const THREADS: usize = 4;
/// Jobs queued in front of the threads, at most.
pub const QUEUE: usize = 64;
/// How often a deferred job looks again whether demand reads are still in flight.
pub const DEFER_POLL: Duration = Duration::from_millis(1);
/// Longest a job waits for demand reads to finish before it runs anyway.
pub const MAX_DEFERRAL: Duration = Duration::from_millis(50);

pub use ferry_util::background::BackgroundError;

/// The mirror's threads (`ferry-bg-N`), shared by every mirror and syncer of the process.
static POOL: ferry_util::background::Pool =
    ferry_util::background::Pool::new("ferry-bg", THREADS, QUEUE);

/// Runs `f` on a background thread (lower CPU and I/O priority) and returns its result,
/// like `tokio::task::spawn_blocking` for the mirror's work. Waits for room in the queue
/// first. The job runs to its end even if the caller stops waiting.
///
/// # Errors
/// The job panicked.
pub async fn run<T, F>(f: F) -> Result<T, BackgroundError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    POOL.run(f).await
}

/// Runs a long job (hashing a whole file) like [`run`], at most `THREADS − 1` of them at once:
/// the mirror's writes and syncs keep a thread while a big file is hashed.
///
/// # Errors
/// The job panicked.
pub async fn run_long<T, F>(f: F) -> Result<T, BackgroundError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    static LONG: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(THREADS - 1);
    // The semaphore is never closed.
    let _turn = LONG.acquire().await.ok();
    run(f).await
}

/// Deferrals so far, over the process (every [`DemandGate::wait`] that waited).
pub fn deferrals() -> u64 {
    DEFERRALS.load(Ordering::Relaxed)
}

static DEFERRALS: AtomicU64 = AtomicU64::new(0);

/// How many demand reads are in flight now.
type Probe = Arc<dyn Fn() -> usize + Send + Sync>;

/// Defers background work while demand reads are in flight (see the module docs). Cheap to
/// clone.
#[derive(Clone, Default)]
pub struct DemandGate {
    probe: Option<Probe>,
}

impl std::fmt::Debug for DemandGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemandGate")
            .field("gated", &self.probe.is_some())
            .finish()
    }
}

impl DemandGate {
    /// A gate that never waits.
    pub fn open() -> DemandGate {
        DemandGate { probe: None }
    }

    /// A gate that waits while `client` has demand reads in flight.
    pub fn client(client: &Client) -> DemandGate {
        let c = client.clone();
        DemandGate::probe(move || c.demand_in_flight())
    }

    /// A gate that waits while `in_flight` returns more than zero.
    pub fn probe(in_flight: impl Fn() -> usize + Send + Sync + 'static) -> DemandGate {
        DemandGate {
            probe: Some(Arc::new(in_flight)),
        }
    }

    /// Returns at once when no demand read is in flight; else waits until none was seen on
    /// two polls [`DEFER_POLL`] apart, at most [`MAX_DEFERRAL`]. Returns whether it waited.
    pub async fn wait(&self) -> bool {
        let Some(probe) = &self.probe else {
            return false;
        };
        if probe() == 0 {
            return false;
        }
        DEFERRALS.fetch_add(1, Ordering::Relaxed);
        let until = tokio::time::Instant::now() + MAX_DEFERRAL;
        let mut quiet = 0;
        while quiet < 2 && tokio::time::Instant::now() < until {
            tokio::time::sleep(DEFER_POLL).await;
            quiet = if probe() == 0 { quiet + 1 } else { 0 };
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;

    #[tokio::test]
    async fn jobs_run_on_the_mirror_threads() {
        let name = run(|| std::thread::current().name().map(str::to_string))
            .await
            .expect("job");
        assert!(name.is_some_and(|n| n.starts_with("ferry-bg-")));
    }

    #[tokio::test]
    async fn long_jobs_leave_a_thread_for_the_others() {
        // Long jobs that only end when told: the others still run meanwhile.
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = Arc::new(Mutex::new(rx));
        let long: Vec<_> = (0..THREADS)
            .map(|_| {
                let rx = rx.clone();
                tokio::spawn(run_long(move || {
                    let _ = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                }))
            })
            .collect();
        assert_eq!(run(|| 7).await.expect("job"), 7);
        for _ in 0..THREADS {
            tx.send(()).expect("send");
        }
        for h in long {
            h.await.expect("task").expect("job");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_demand_no_wait() {
        let t = tokio::time::Instant::now();
        assert!(!DemandGate::probe(|| 0).wait().await);
        assert!(!DemandGate::open().wait().await);
        assert_eq!(t.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_until_demand_is_quiet() {
        // Demand in flight for the first 5 polls, then none.
        let polls = Arc::new(AtomicUsize::new(0));
        let p = polls.clone();
        let gate = DemandGate::probe(move || usize::from(p.fetch_add(1, Ordering::SeqCst) < 6));
        let before = deferrals();
        let t = tokio::time::Instant::now();
        assert!(gate.wait().await);
        let waited = t.elapsed();
        // Five busy polls after the first look, then two quiet ones.
        assert!(waited >= DEFER_POLL * 7, "{waited:?}");
        assert!(waited < MAX_DEFERRAL, "{waited:?}");
        assert!(deferrals() > before);
    }

    #[tokio::test(start_paused = true)]
    async fn never_waits_longer_than_the_bound() {
        let t = tokio::time::Instant::now();
        assert!(DemandGate::probe(|| 3).wait().await);
        let waited = t.elapsed();
        assert!(waited >= MAX_DEFERRAL, "{waited:?}");
        assert!(waited <= MAX_DEFERRAL + DEFER_POLL * 2, "{waited:?}");
    }
}
