//! A small pool of named threads at lower CPU and I/O priority, for background work that
//! must not compete with readers: the mirror's disk and hashing work (`ferry-bg-N`, in
//! ferry-cache) and ferryd's background reads (`ferryd-bg-N`).
//!
//! [`Pool::run`] is `tokio::task::spawn_blocking` for such work: the closure runs on one of
//! the pool's threads, each lowered by [`crate::lower_current_thread`] when it starts. The
//! queue in front of the threads is bounded: a submitter waits for room, so background work
//! never piles up without bound. The threads start on first use and live as long as the
//! process.
//!
//! Invariant: a job that panics does not take its thread with it; its caller gets
//! [`BackgroundError::Panicked`]. A job whose caller stops waiting still runs to its end.

use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{mpsc, oneshot};

/// Why a background job gave no result.
#[derive(Debug, thiserror::Error)]
pub enum BackgroundError {
    /// The job panicked (its thread goes on with the next job).
    #[error("a background job panicked")]
    Panicked,
}

impl From<BackgroundError> for std::io::Error {
    fn from(e: BackgroundError) -> Self {
        std::io::Error::other(e)
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A pool of low-priority threads; meant to live in a `static` (see [`Pool::new`]).
#[derive(Debug)]
pub struct Pool {
    name: &'static str,
    threads: usize,
    queue: usize,
    started: OnceLock<Started>,
}

#[derive(Debug)]
struct Started {
    tx: mpsc::Sender<Job>,
    /// Threads that started; with none, jobs run on tokio's blocking pool instead.
    count: usize,
}

impl Pool {
    /// A pool of `threads` threads named `NAME-N`, with at most `queue` jobs waiting for
    /// them. Nothing starts before the first job.
    pub const fn new(name: &'static str, threads: usize, queue: usize) -> Pool {
        Pool {
            name,
            threads,
            queue,
            started: OnceLock::new(),
        }
    }

    fn started(&self) -> &Started {
        self.started.get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>(self.queue.max(1));
            let rx = Arc::new(Mutex::new(rx));
            let mut count = 0;
            for n in 0..self.threads {
                let rx = rx.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("{}-{n}", self.name))
                    .spawn(move || {
                        crate::lower_current_thread();
                        worker(&rx);
                    });
                match spawned {
                    Ok(_) => count += 1,
                    Err(e) => tracing::warn!("cannot start a background thread: {e}"),
                }
            }
            Started { tx, count }
        })
    }

    /// Runs `f` on one of the pool's threads and returns its result. Waits for room in the
    /// queue first. The job runs to its end even if the caller stops waiting.
    ///
    /// # Errors
    /// The job panicked.
    pub async fn run<T, F>(&self, f: F) -> Result<T, BackgroundError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let p = self.started();
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            if r.is_err() {
                tracing::error!("a background job panicked");
            }
            let _ = tx.send(r);
        });
        if p.count == 0 {
            // No thread could be started: the work still has to be done.
            let _ = tokio::task::spawn_blocking(job).await;
        } else if let Err(mpsc::error::SendError(job)) = p.tx.send(job).await {
            // The receivers live as long as the process; run it here rather than lose it.
            let _ = tokio::task::spawn_blocking(job).await;
        }
        match rx.await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) | Err(_) => Err(BackgroundError::Panicked),
        }
    }
}

/// One thread: runs jobs in the order queued, for the life of the process.
fn worker(rx: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        // One thread waits in the channel at a time; the others wait for the lock.
        let job = rx.lock().unwrap_or_else(|e| e.into_inner()).blocking_recv();
        match job {
            Some(job) => job(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TEST_POOL: Pool = Pool::new("test-bg", 2, 4);

    #[tokio::test]
    async fn jobs_run_on_named_low_priority_threads() {
        let (name, nice) = TEST_POOL
            .run(|| {
                let name = std::thread::current().name().map(str::to_string);
                (name, crate::priority::current_thread_nice().ok())
            })
            .await
            .expect("job");
        assert!(name.is_some_and(|n| n.starts_with("test-bg-")));
        if let Some(n) = nice {
            assert!(n >= crate::priority::BACKGROUND_NICE, "nice {n}");
        }
    }

    #[tokio::test]
    async fn a_panicking_job_is_an_error_and_the_threads_go_on() {
        assert!(matches!(
            TEST_POOL.run(|| panic!("boom")).await,
            Err(BackgroundError::Panicked)
        ));
        // More jobs than threads and queue together: every one still runs.
        let mut all = Vec::new();
        for i in 0..32 {
            all.push(tokio::spawn(TEST_POOL.run(move || i * 2)));
        }
        for (i, h) in all.into_iter().enumerate() {
            assert_eq!(h.await.expect("task").expect("job"), i * 2);
        }
    }
}
