//! The mount's lifetime: [`MountSession`] takes a [`MountConfig`] to a serving FUSE mount
//! ([`MountSession::start`]) and back to a clean unmount ([`MountSession::wait`],
//! [`MountSession::shutdown`], or dropping it).
//!
//! Start-up, in order: the config is checked; the mount point is checked and a dead mount
//! a killed ferry left there is detached (`mount/mountpoint.rs`); the session's tokio runtime is
//! built; the client connects and the remote root is looked up; the local copy is opened
//! (`mount/local.rs`); `/metrics` is served if asked; SIGINT, SIGTERM and SIGHUP are caught; the
//! file system is mounted and the kernel readahead of its bdi raised; then the background
//! mirror starts (it comes after the mount so that readers are served first).
//!
//! Invariants:
//! - Anything that can fail is checked before mounting, so a failed start leaves nothing
//!   mounted and reports one error ([`MountError`]).
//! - A session that was started is unmounted exactly once: by `wait` (after a signal, or
//!   nothing to do when unmounted from outside), by `shutdown`, or by `Drop`. A busy mount
//!   (a reader still has files open) is detached lazily; the kernel finishes later.
//! - At unmount the mirror is stopped and everything it and the reads wrote into the local
//!   copy is recorded before the runtime ends, so the next mount resumes from it.
//! - The session owns its runtime: use it from synchronous code (it blocks on the runtime;
//!   starting or dropping it inside another runtime's async context panics).

mod error;
mod local;
mod mountpoint;
mod status;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferry_client::{Client, ClientConfig};
use ferry_proto::FileKind;
use ferry_util::AbortOnDrop;
use fuser::{Config, MountOption, SessionACL};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tracing::{info, warn};

pub use error::MountError;
pub use mountpoint::detach;

use crate::fs::{Fs, FsConfig};
use crate::fuse::FerryFuse;
use crate::target::Target;
use local::Local;

/// Time the runtime's tasks get to end after the unmount.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

/// Everything `ferry mount` needs; [`Default`] gives the documented defaults.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Remote server and path.
    pub target: Target,
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// Client pool settings (`addr` is taken from `target`).
    pub client: ClientConfig,
    /// File system settings (`root` is taken from `target`).
    pub fs: FsConfig,
    /// Let other users (e.g. postgres, oracle) use the mount.
    pub allow_other: bool,
    /// FUSE worker threads.
    pub threads: usize,
    /// Kernel readahead for the mount, in KiB (written to the mount's bdi).
    pub read_ahead_kb: u32,
    /// Tokio worker threads.
    pub io_threads: usize,
    /// Local copy: chunks read through the mount are kept here and read locally later.
    pub cache_dir: Option<PathBuf>,
    /// Where the local copy's state goes (`None`: the user's default,
    /// [`ferry_cache::StateBase::default_for_user`]).
    pub state_dir: Option<PathBuf>,
    /// Fill the local copy in the background with a mirror of the whole export.
    pub mirror: bool,
    /// Cap on the background mirror's transfer, bytes per second.
    pub bwlimit: Option<u64>,
    /// Go over the export again this long after each complete pass of the background
    /// mirror (new and changed files fetched); `None`: one complete pass.
    pub rescan: Option<std::time::Duration>,
    /// Serve Prometheus metrics here (`GET /metrics`).
    pub metrics: Option<std::net::SocketAddr>,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            target: Target {
                host: "127.0.0.1".into(),
                port: crate::target::DEFAULT_PORT,
                s3: false,
                path: bytes::Bytes::new(),
            },
            mountpoint: PathBuf::new(),
            client: ClientConfig::default(),
            fs: FsConfig::default(),
            allow_other: false,
            threads: 2,
            read_ahead_kb: 8192,
            io_threads: 2,
            cache_dir: None,
            state_dir: None,
            mirror: false,
            bwlimit: None,
            rescan: None,
            metrics: None,
        }
    }
}

/// A mounted ferry file system. Unmounted by [`MountSession::wait`] (once signalled),
/// [`MountSession::shutdown`], or when dropped.
pub struct MountSession {
    /// `None` once unmounted (by `wait` or `shutdown`, before `Drop` runs).
    running: Option<Running>,
}

/// What a serving mount holds, torn down in [`Running::finish`].
struct Running {
    rt: tokio::runtime::Runtime,
    fuse: fuser::BackgroundSession,
    mountpoint: PathBuf,
    fs: Arc<Fs>,
    local: Option<Local>,
    mirror: Option<ferry_cache::MirrorTask>,
    /// Told by the adapter when the kernel ends the session (an unmount from outside).
    destroyed: mpsc::UnboundedReceiver<()>,
    signals: Signals,
    _metrics: Option<AbortOnDrop<()>>,
}

impl std::fmt::Debug for MountSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MountSession")
            .field("mountpoint", &self.running.as_ref().map(|r| &r.mountpoint))
            .finish()
    }
}

impl MountSession {
    /// Connects, mounts, starts the background mirror if configured, and returns once the
    /// mount serves requests. From then on SIGINT, SIGTERM and SIGHUP are caught: they end
    /// [`MountSession::wait`].
    ///
    /// # Errors
    /// Inconsistent config, mount point unusable or already mounted, server unreachable,
    /// remote path missing or not a directory, cache directory unusable, metrics address
    /// taken, mount refused. Nothing is left mounted.
    pub fn start(mut cfg: MountConfig) -> Result<MountSession, MountError> {
        if cfg.mirror && cfg.cache_dir.is_none() {
            return Err(MountError::MirrorNeedsCacheDir);
        }
        if cfg.bwlimit.is_some() && !cfg.mirror {
            return Err(MountError::BwlimitNeedsMirror);
        }
        if cfg.rescan.is_some() && !cfg.mirror {
            return Err(MountError::RescanNeedsMirror);
        }
        mountpoint::prepare(&cfg.mountpoint)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(cfg.io_threads.max(1))
            .thread_name("ferry-io")
            .enable_all()
            .build()
            .map_err(MountError::Runtime)?;
        let label = cfg.target.addr();
        cfg.client.addr = label.clone();
        cfg.fs.root = cfg.target.path.clone();
        let (client, root_attr) = rt.block_on(connect(&cfg))?;
        let chunk_size = client.session().chunk_size;
        info!(
            "connected to {label} with {} streams, chunk {} KiB",
            cfg.client.streams,
            chunk_size / 1024
        );

        let local = match &cfg.cache_dir {
            Some(dir) => Some(Local::open(
                rt.handle(),
                dir,
                &ferry_cache::StateBase::choose(cfg.state_dir.as_deref())?,
                &client,
                cfg.fs.root.clone(),
                chunk_size,
            )?),
            None => None,
        };
        let backing = local
            .as_ref()
            .map(|l| l.copy.clone() as Arc<dyn ferry_client::ChunkBacking>);
        let mut fs_cfg = cfg.fs.clone();
        fs_cfg.passthrough = local.is_some();
        let fs = Arc::new(Fs::with_backing(client.clone(), fs_cfg, root_attr, backing));
        let supervisor = ferry_cache::MirrorSupervisor::new(label.clone());
        let status = status::source(
            &cfg,
            label.clone(),
            client.clone(),
            fs.clone(),
            local.as_ref().map(|l| l.copy.clone()),
            supervisor.clone(),
        );
        // Metrics are served from the status the mount reports.
        let metrics = match cfg.metrics {
            Some(addr) => {
                let st = status.clone();
                Some(rt.block_on(bind_metrics(addr, Arc::new(move || st().to_prometheus())))?)
            }
            None => None,
        };
        let signals = {
            let _rt = rt.enter();
            Signals::catch()
        };

        let (destroyed_tx, destroyed) = mpsc::unbounded_channel();
        let adapter = FerryFuse::new(fs.clone(), rt.handle().clone(), destroyed_tx)
            .with_passthrough(local.is_some())
            .with_status(Arc::new(move || {
                serde_json::to_vec_pretty(&status()).unwrap_or_default()
            }));
        let notifier = adapter.notifier_cell();
        let fuse = fuser::spawn_mount(adapter, &cfg.mountpoint, &fuse_config(&cfg, chunk_size))
            .map_err(|source| MountError::Mount {
                path: cfg.mountpoint.clone(),
                source,
            })?;
        let _ = notifier.set(fuse.notifier());
        mountpoint::set_read_ahead(&cfg.mountpoint, cfg.read_ahead_kb);
        info!("mounted {label} on {}", cfg.mountpoint.display());

        // The background mirror starts once the mount serves readers.
        let mirror = match (&local, cfg.mirror) {
            (Some(l), true) => Some(supervisor.start(
                rt.handle(),
                client.background(),
                l.copy.cache().clone(),
                cfg.fs.root.clone(),
                cfg.bwlimit,
                cfg.rescan,
            )),
            _ => None,
        };
        Ok(MountSession {
            running: Some(Running {
                rt,
                fuse,
                mountpoint: cfg.mountpoint,
                fs,
                local,
                mirror,
                destroyed,
                signals,
                _metrics: metrics,
            }),
        })
    }

    /// Where the file system is mounted (as configured); `None` once unmounted.
    pub fn mountpoint(&self) -> Option<&Path> {
        self.running.as_ref().map(|r| r.mountpoint.as_path())
    }

    /// Serves until SIGINT, SIGTERM or SIGHUP (then unmounts) or an unmount from outside,
    /// then stops the mirror and records the local copy's state.
    ///
    /// # Errors
    /// The mount could neither be unmounted nor detached.
    pub fn wait(mut self) -> Result<(), MountError> {
        let Some(mut r) = self.running.take() else {
            return Ok(());
        };
        let external = r.rt.block_on(async {
            tokio::select! {
                name = r.signals.recv() => { info!("{name}: unmounting"); false }
                _ = r.destroyed.recv() => { info!("unmounted from outside"); true }
            }
        });
        r.finish(external)
    }

    /// Unmounts now, then stops the mirror and records the local copy's state.
    ///
    /// # Errors
    /// The mount could neither be unmounted nor detached.
    pub fn shutdown(mut self) -> Result<(), MountError> {
        match self.running.take() {
            Some(r) => r.finish(false),
            None => Ok(()),
        }
    }
}

impl Drop for MountSession {
    /// Unmounts if still mounted (a failure is logged).
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            if let Err(e) = r.finish(false) {
                // The whole chain, as the binary prints errors.
                warn!("{}", ferry_util::error_line(&e));
            }
        }
    }
}

impl Running {
    /// Unmounts (unless the kernel already ended the session: `external`), stops the
    /// mirror, records what was written, and ends the runtime.
    fn finish(self, external: bool) -> Result<(), MountError> {
        let mut result = Ok(());
        if external {
            let _ = self.fuse.join();
        } else if let Err(e) = self.fuse.umount_and_join() {
            // Busy (a reader still has files open): detach now, the kernel finishes later.
            warn!("unmount: {e}; detaching lazily");
            result = detach(&self.mountpoint);
        }
        let (fs, mirror, local) = (self.fs, self.mirror, self.local);
        // What the mirror and the reads wrote is recorded before the process ends; the next
        // mount resumes from it.
        if let Some(m) = mirror {
            self.rt.block_on(m.stop());
        }
        if let Some(l) = local {
            // Chunks still in the write-back queue reach the local copy first (this waits
            // for the disk, so not on the runtime), then the syncer records them.
            fs.store().flush();
            self.rt.block_on(l.close(fs.passthrough_opens()));
        }
        drop(self._metrics);
        self.rt.shutdown_timeout(RUNTIME_SHUTDOWN);
        info!("stopped");
        result
    }
}

/// Connects to the server and looks up the remote root, which must be a directory.
async fn connect(cfg: &MountConfig) -> Result<(Client, ferry_proto::Attr), MountError> {
    let client = Client::connect(cfg.client.clone())
        .await
        .map_err(MountError::Connect)?;
    let root = String::from_utf8_lossy(&cfg.fs.root).into_owned();
    let attr = client
        .stat(cfg.fs.root.clone())
        .await
        .map_err(|source| MountError::RemoteRoot {
            path: root.clone(),
            addr: cfg.client.addr.clone(),
            source,
        })?;
    if attr.kind != FileKind::Directory {
        return Err(MountError::RemoteNotADirectory(root));
    }
    Ok((client, attr))
}

/// Binds `addr` and serves `page` there as `/metrics`, until the returned guard drops.
async fn bind_metrics(
    addr: std::net::SocketAddr,
    page: ferry_util::metrics::PageFn,
) -> Result<AbortOnDrop<()>, MountError> {
    let err = |source| MountError::Metrics { addr, source };
    let l = tokio::net::TcpListener::bind(addr).await.map_err(err)?;
    info!("metrics on http://{}/metrics", l.local_addr().map_err(err)?);
    Ok(AbortOnDrop(tokio::spawn(ferry_util::serve_metrics(
        l, page,
    ))))
}

/// The FUSE mount options and session settings for `cfg`:
/// - `ro`, `nodev`, `nosuid`: read-only; no device files or setuid bits take effect;
/// - `default_permissions`: the kernel checks permission bits against the server's
///   uid/gid, which are not mapped;
/// - `fsname=ferry:HOST:PORT:/PATH`, `subtype=ferry`: how the mount shows in the table;
/// - `max_read=max(chunk, 1 MiB)`: the largest READ the kernel sends;
/// - `allow_other` (fuser's `SessionACL::All`): non-root users need `user_allow_other` in
///   /etc/fuse.conf;
/// - `threads` FUSE workers, each with its own cloned `/dev/fuse` fd when there are
///   several.
fn fuse_config(cfg: &MountConfig, chunk_size: u32) -> Config {
    let mut fcfg = Config::default();
    let fsname = format!(
        "ferry:{}:/{}",
        cfg.target.addr(),
        String::from_utf8_lossy(&cfg.target.path)
    );
    fcfg.mount_options = vec![
        MountOption::RO,
        MountOption::FSName(fsname),
        MountOption::Subtype("ferry".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::CUSTOM(format!("max_read={}", chunk_size.max(1 << 20))),
    ];
    if cfg.allow_other {
        fcfg.acl = SessionACL::All;
    }
    fcfg.n_threads = Some(cfg.threads.max(1));
    fcfg.clone_fd = cfg.threads > 1;
    fcfg
}

/// The signals that unmount: SIGTERM, SIGINT, SIGHUP. One that cannot be caught is
/// simply never received.
struct Signals {
    term: Option<Signal>,
    int: Option<Signal>,
    hup: Option<Signal>,
}

impl Signals {
    /// Catches the signals from now on (in the current runtime's context).
    fn catch() -> Signals {
        Signals {
            term: signal(SignalKind::terminate()).ok(),
            int: signal(SignalKind::interrupt()).ok(),
            hup: signal(SignalKind::hangup()).ok(),
        }
    }

    /// Waits for the next of them; returns its name.
    async fn recv(&mut self) -> &'static str {
        async fn one(s: &mut Option<Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = one(&mut self.term) => "SIGTERM",
            _ = one(&mut self.int) => "SIGINT",
            _ = one(&mut self.hup) => "SIGHUP",
        }
    }
}

#[cfg(test)]
mod tests;
