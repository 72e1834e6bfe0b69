//! The mount's background mirror (`ferry mount --cache-dir DIR --mirror`): runs
//! [`Mirror`] passes over the export until one completes (with `--rescan`, again a while
//! after each complete pass), a failed pass retried after a backoff, and tells the mount's
//! status where it is. No pass deletes: what the server no longer has stays in the local
//! copy, never served (an open asks the server), rather than an unattended pass removing
//! a local copy because an export looked empty for a moment.
//!
//! Invariants:
//! - One pass at a time; each pass has fresh [`Progress`] counters, and
//!   [`MirrorSupervisor::current`] always returns the counters of the current or last
//!   pass, so the status never mixes two passes.
//! - Everything the mirror wrote goes through one [`Syncer`], flushed by
//!   [`MirrorTask::stop`], so what was copied before an unmount is recorded and the next
//!   mount resumes from it.
//! - A pass stopped before it ended leaves `status.json` saying `interrupted` (as `ferry
//!   mirror` does on Ctrl-C).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use ferry_client::Client;
use ferry_util::human_bytes;
use tracing::{info, warn};

use crate::background::DemandGate;
use crate::mirror::{Mirror, MirrorConfig};
use crate::progress::{Progress, State, Status};
use crate::state::CacheDir;
use crate::syncer::Syncer;

/// Wait before retrying the first failed pass.
pub const FIRST_RETRY_DELAY: Duration = Duration::from_secs(10);
/// Longest wait between passes (the delay doubles up to it).
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(300);
/// How often the mirror's syncer makes written chunks durable and records them.
const SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// Where the background mirror is. Not written anywhere as is: the status shows it as a
/// [`State`] ([`MirrorPhase::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MirrorPhase {
    /// The mount is not yet serving, or has no mirror.
    NotStarted,
    /// A pass is running.
    Running,
    /// A pass completed: the local copy is complete and verified; no more passes, or (with
    /// a re-scan) none until the next is due.
    Complete,
    /// A pass failed; the next one starts after a backoff.
    Retrying,
    /// The mount stopped the mirror before a pass completed.
    Stopped,
}

impl MirrorPhase {
    /// The state a mount's status shows for this phase.
    pub fn state(self) -> State {
        match self {
            MirrorPhase::Running => State::Running,
            MirrorPhase::Complete => State::Complete,
            // The last pass ended with errors; the status says so while the next waits.
            MirrorPhase::Retrying => State::Incomplete,
            MirrorPhase::NotStarted | MirrorPhase::Stopped => State::Mounted,
        }
    }
}

/// Supervises the passes of one mount's background mirror; cheap to clone (all clones
/// share the phase and counters).
#[derive(Debug, Clone)]
pub struct MirrorSupervisor {
    /// What is mirrored (HOST:PORT), for the status.
    label: String,
    shared: Arc<Mutex<Shared>>,
}

#[derive(Debug)]
struct Shared {
    phase: MirrorPhase,
    /// The current or last pass's counters.
    progress: Arc<Progress>,
}

/// The running passes, as [`MirrorSupervisor::start`] returns them.
#[derive(Debug)]
pub struct MirrorTask {
    supervisor: MirrorSupervisor,
    cache: Arc<CacheDir>,
    task: tokio::task::JoinHandle<()>,
    syncer: Syncer,
}

impl MirrorSupervisor {
    /// A supervisor for a mirror of `label` (HOST:PORT), not started.
    pub fn new(label: String) -> MirrorSupervisor {
        MirrorSupervisor {
            label,
            shared: Arc::new(Mutex::new(Shared {
                phase: MirrorPhase::NotStarted,
                progress: Arc::new(Progress::default()),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The phase and the counters of the current or last pass.
    pub fn current(&self) -> (MirrorPhase, Arc<Progress>) {
        let g = self.lock();
        (g.phase, g.progress.clone())
    }

    /// The status of the current or last pass, in the state its phase shows as.
    pub fn status(&self) -> Status {
        let (phase, progress) = self.current();
        progress.snapshot(phase.state(), &self.label)
    }

    /// Starts the passes on `rt`: a mirror of `root` on `client` into `cache`, capped at
    /// `bwlimit` bytes per second if given. The returned task runs until a pass completes
    /// or [`MirrorTask::stop`]; with `rescan`, until [`MirrorTask::stop`], a pass starting
    /// that long after each complete one.
    pub fn start(
        &self,
        rt: &tokio::runtime::Handle,
        client: Client,
        cache: Arc<CacheDir>,
        root: Bytes,
        bwlimit: Option<u64>,
        rescan: Option<Duration>,
    ) -> MirrorTask {
        let _rt = rt.enter();
        let this = self.clone();
        let (syncer, _task) = Syncer::start_gated(
            cache.clone(),
            SYNC_INTERVAL,
            Arc::new(move |m| this.current().1.error(m)),
            None,
            DemandGate::client(&client),
        );
        let task = rt.spawn(self.clone().passes(
            client,
            cache.clone(),
            root,
            bwlimit,
            rescan,
            syncer.clone(),
        ));
        MirrorTask {
            supervisor: self.clone(),
            cache,
            task,
            syncer,
        }
    }

    /// Runs passes until one completes, waiting [`FIRST_RETRY_DELAY`] (doubling up to
    /// [`MAX_RETRY_DELAY`]) after each failure; with `rescan`, a pass that long after each
    /// complete one, for ever.
    async fn passes(
        self,
        client: Client,
        cache: Arc<CacheDir>,
        root: Bytes,
        bwlimit: Option<u64>,
        rescan: Option<Duration>,
        syncer: Syncer,
    ) {
        let mut delay = FIRST_RETRY_DELAY;
        loop {
            let engine = MirrorConfig {
                bwlimit,
                // Beside readers: the listings a standalone mirror keeps in flight to fill
                // a WAN (256) are not needed by a mirror that yields to them.
                listings_in_flight: 64,
                ..MirrorConfig::default()
            };
            let m = Mirror::new(
                client.clone(),
                cache.clone(),
                root.clone(),
                self.label.clone(),
                engine,
            )
            .with_syncer(syncer.clone());
            {
                let mut g = self.lock();
                g.phase = MirrorPhase::Running;
                g.progress = m.progress();
            }
            info!(
                "background mirror into {} started{}",
                cache.root().display(),
                bwlimit.map_or_else(String::new, |b| format!(", capped at {}/s", human_bytes(b)))
            );
            match m.run().await {
                Ok(s) => {
                    self.lock().phase = MirrorPhase::Complete;
                    let secs = m.progress().elapsed();
                    info!(
                        "background mirror complete: {} files, {}, {} fetched in {secs:.1} s; the local copy is complete and verified",
                        s.files,
                        human_bytes(s.bytes),
                        human_bytes(s.fetched)
                    );
                    let Some(every) = rescan else {
                        return;
                    };
                    tokio::time::sleep(every).await;
                    delay = FIRST_RETRY_DELAY;
                    info!(
                        "background mirror: going over the export again (--rescan {} s)",
                        every.as_secs()
                    );
                }
                Err(e) => {
                    self.lock().phase = MirrorPhase::Retrying;
                    warn!(
                        "background mirror: {e}; trying again in {} s",
                        delay.as_secs()
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_RETRY_DELAY);
                }
            }
        }
    }

    /// The mount stops: a pass in progress is left for the next mount to resume, and the
    /// status file says so (`ferry status DIR`).
    fn stopped(&self, cache: &CacheDir) {
        let (phase, progress) = self.current();
        if matches!(phase, MirrorPhase::Running | MirrorPhase::Retrying) {
            self.lock().phase = MirrorPhase::Stopped;
            let _ = progress
                .snapshot(State::Interrupted, &self.label)
                .write(cache.meta());
        }
    }
}

impl MirrorTask {
    /// Stops the passes: the running one is cancelled, what it wrote is recorded (the
    /// syncer flushed), and an unfinished pass is marked interrupted.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
        self.syncer.flush().await;
        self.supervisor.stopped(&self.cache);
    }
}
