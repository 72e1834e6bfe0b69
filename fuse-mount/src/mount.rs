//! Mount session: from a config to a serving mount, and back to a clean unmount.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use ferry_client::{Client, ClientConfig};
use ferry_proto::FileKind;
use fuser::{Config, MountOption, SessionACL};
use tracing::{info, warn};

use crate::fs::{Fs, FsConfig};
use crate::fuse::FerryFuse;
use crate::target::Target;

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
    /// Fill the local copy in the background with a mirror of the whole export.
    pub mirror: bool,
    /// Cap on the background mirror's transfer, bytes per second.
    pub bwlimit: Option<u64>,
    /// Serve Prometheus metrics here (`GET /metrics`).
    pub metrics: Option<std::net::SocketAddr>,
}

impl Default for MountConfig {
    fn default() -> Self {
        MountConfig {
            target: Target {
                host: "127.0.0.1".into(),
                port: crate::target::DEFAULT_PORT,
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
            mirror: false,
            bwlimit: None,
            metrics: None,
        }
    }
}

/// Mount points in this namespace, decoded from /proc/self/mountinfo: (path, fs type).
fn mounts() -> Vec<(PathBuf, String)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some((
                PathBuf::from(unescape(f.get(4)?)),
                f.get(sep + 1)?.to_string(),
            ))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Detaches whatever is mounted at `p` (lazy: works even while busy or dead).
pub fn detach(p: &Path) -> anyhow::Result<()> {
    let c = CString::new(p.as_os_str().as_bytes()).context("mount point contains NUL")?;
    // SAFETY: a valid NUL-terminated path; umount2 has no other memory effects.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc == 0 {
        return Ok(());
    }
    let umount_err = std::io::Error::last_os_error();
    // Not root: fusermount3 may unmount FUSE mounts of the calling user.
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg("-z")
        .arg(p)
        .status();
    match status {
        Ok(s) if s.success() => Ok(()),
        _ => bail!(
            "cannot unmount {}: {umount_err}; try `fusermount3 -u -z {}`",
            p.display(),
            p.display()
        ),
    }
}

/// Checks the mount point; replaces a dead mount left by a killed process.
///
/// A FUSE mount already on the path is probed with `opendir`, which the kernel always
/// sends to the daemon (a `stat` may be answered from the attribute cache even when the
/// daemon is gone): ENOTCONN means dead, and it is detached.
fn prepare_mountpoint(p: &Path) -> anyhow::Result<()> {
    let abs = absolute(p);
    let fuse_here = mounts()
        .into_iter()
        .rev()
        .find(|(mp, _)| *mp == abs)
        .filter(|(_, fstype)| fstype.starts_with("fuse"));
    let dead = |e: &std::io::Error| e.raw_os_error() == Some(libc::ENOTCONN);
    let probe = if fuse_here.is_some() {
        std::fs::read_dir(p).map(|_| ())
    } else {
        std::fs::metadata(p).map(|_| ())
    };
    match probe {
        Err(e) if dead(&e) => {
            warn!(
                "{}: replacing a dead mount left by an earlier ferry",
                p.display()
            );
            detach(p)?;
        }
        Err(e) => bail!("mount point {}: {e}", p.display()),
        Ok(()) => {
            if let Some((_, fstype)) = fuse_here {
                bail!(
                    "{} is already a mounted {fstype} file system: unmount it first (fusermount3 -u {})",
                    p.display(),
                    p.display()
                );
            }
        }
    }
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => bail!("mount point {} is not a directory", p.display()),
        Err(e) => bail!("mount point {}: {e}", p.display()),
    }
}

/// Raises the kernel readahead of the mount (fuser can only lower it during init).
fn set_read_ahead(mountpoint: &Path, kb: u32) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = meta.dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    );
    match std::fs::write(&path, format!("{kb}\n")) {
        Ok(()) => info!("kernel readahead {kb} KiB ({path})"),
        Err(e) => {
            warn!("cannot raise kernel readahead ({path}: {e}); sequential reads may be slower")
        }
    }
}

/// Connects, mounts, calls `ready` once the mount is usable, then serves until SIGINT,
/// SIGTERM or an unmount from outside, and unmounts cleanly.
///
/// # Errors
/// Server unreachable, remote path missing, mount point unusable, mount refused.
pub fn run(mut cfg: MountConfig, ready: impl FnOnce()) -> anyhow::Result<()> {
    if cfg.mirror && cfg.cache_dir.is_none() {
        bail!("--mirror fills a local copy: give --cache-dir DIR too (a directory on fast local disk)");
    }
    if cfg.bwlimit.is_some() && !cfg.mirror {
        bail!("--bwlimit caps the background mirror: give --mirror too (reads through the mount are never capped)");
    }
    prepare_mountpoint(&cfg.mountpoint)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.io_threads.max(1))
        .thread_name("ferry-io")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    cfg.client.addr = cfg.target.addr();
    cfg.fs.root = cfg.target.path.clone();
    let client = rt
        .block_on(Client::connect(cfg.client.clone()))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let root_attr = rt.block_on(client.stat(cfg.fs.root.clone())).map_err(|e| {
        anyhow::anyhow!(
            "remote path /{} on {}: {e}",
            String::from_utf8_lossy(&cfg.fs.root),
            cfg.target.addr()
        )
    })?;
    if root_attr.kind != FileKind::Directory {
        bail!(
            "remote path /{} is not a directory",
            String::from_utf8_lossy(&cfg.fs.root)
        );
    }
    let session = client.session().clone();
    info!(
        "connected to {} with {} streams, chunk {} KiB",
        cfg.target.addr(),
        cfg.client.streams,
        session.chunk_size / 1024
    );

    // The cache directory is opened (and locked) before mounting, so a bad one is a
    // one-line error and nothing is mounted.
    let local = match &cfg.cache_dir {
        Some(dir) => {
            let cache = Arc::new(ferry_cache::CacheDir::open(dir)?);
            let (done_tx, done_rx) = tokio::sync::mpsc::unbounded_channel();
            // Files left complete but unverified by an earlier mount (a crash, an unmount
            // before their check) are verified now too.
            for (rel, st) in cache.all() {
                if st.complete() && st.verified.is_none() {
                    let _ = done_tx.send((rel, st.version, st.generation));
                }
            }
            let (syncer, task) = {
                let _rt = rt.enter();
                ferry_cache::Syncer::start_with(
                    cache.clone(),
                    Duration::from_secs(1),
                    Arc::new(|m| warn!("{m}")),
                    Some(done_tx),
                )
            };
            let local = Arc::new(ferry_cache::LocalCopy::new(
                cache,
                cfg.fs.root.clone(),
                session.chunk_size,
                syncer.clone(),
            ));
            // Files completed through the mount are verified, then opened with passthrough.
            rt.spawn(local.clone().verify_completed(client.background(), done_rx));
            info!("local copy in {}", dir.display());
            Some((local, syncer, task))
        }
        None => None,
    };
    let backing = local
        .as_ref()
        .map(|(l, _, _)| l.clone() as Arc<dyn ferry_client::ChunkBacking>);
    let mut fs_cfg = cfg.fs.clone();
    fs_cfg.passthrough = local.is_some();
    let fs = Arc::new(Fs::with_backing(client.clone(), fs_cfg, root_attr, backing));
    let label = cfg.target.addr();
    let background = BackgroundMirror::new(label.clone());
    let status = status_fn(
        &cfg,
        label.clone(),
        client.clone(),
        fs.clone(),
        local.as_ref().map(|(l, _, _)| l.clone()),
        background.clone(),
    );
    // Metrics are served from the status the mount reports.
    let _metrics = match cfg.metrics {
        Some(addr) => {
            let l = rt
                .block_on(tokio::net::TcpListener::bind(addr))
                .with_context(|| format!("--metrics {addr}: cannot listen there"))?;
            info!("metrics on http://{}/metrics", l.local_addr()?);
            let st = status.clone();
            Some(rt.spawn(ferry_util::serve_metrics(
                l,
                Arc::new(move || st().to_prometheus()),
            )))
        }
        None => None,
    };
    let (destroyed_tx, mut destroyed_rx) = tokio::sync::mpsc::unbounded_channel();
    let json_status = status.clone();
    let adapter = FerryFuse::new(fs.clone(), rt.handle().clone(), destroyed_tx)
        .with_passthrough(local.is_some())
        .with_status(Arc::new(move || {
            serde_json::to_vec_pretty(&json_status()).unwrap_or_default()
        }));
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
        MountOption::CUSTOM(format!("max_read={}", session.chunk_size.max(1 << 20))),
    ];
    if cfg.allow_other {
        fcfg.acl = SessionACL::All;
    }
    fcfg.n_threads = Some(cfg.threads.max(1));
    fcfg.clone_fd = cfg.threads > 1;
    let session = fuser::spawn_mount(adapter, &cfg.mountpoint, &fcfg).with_context(|| {
        format!(
            "cannot mount on {} (is /dev/fuse available and fuse3 installed?)",
            cfg.mountpoint.display()
        )
    })?;
    set_read_ahead(&cfg.mountpoint, cfg.read_ahead_kb);
    info!(
        "mounted {} on {}",
        cfg.target.addr(),
        cfg.mountpoint.display()
    );
    ready();
    // The background mirror starts once the mount serves readers.
    let mirror_task = match (&local, cfg.mirror) {
        (Some((l, _, _)), true) => Some(background.start(
            &rt,
            client.background(),
            l.cache().clone(),
            cfg.fs.root.clone(),
            cfg.bwlimit,
        )),
        _ => None,
    };

    let external = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).ok();
        let mut int = signal(SignalKind::interrupt()).ok();
        let mut hup = signal(SignalKind::hangup()).ok();
        async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = recv(&mut term) => { info!("SIGTERM: unmounting"); false }
            _ = recv(&mut int) => { info!("SIGINT: unmounting"); false }
            _ = recv(&mut hup) => { info!("SIGHUP: unmounting"); false }
            _ = destroyed_rx.recv() => { info!("unmounted from outside"); true }
        }
    });
    if external {
        let _ = session.join();
    } else if let Err(e) = session.umount_and_join() {
        // Busy (a reader still has files open): detach now, the kernel finishes later.
        warn!("unmount: {e}; detaching lazily");
        detach(&cfg.mountpoint)?;
    }
    if let Some((task, syncer)) = mirror_task {
        task.abort();
        // What the mirror wrote is recorded before the process ends; the next mount resumes.
        rt.block_on(async {
            let _ = task.await;
            syncer.flush().await;
        });
        if let Some((l, _, _)) = &local {
            background.stopped(l.cache());
        }
    }
    if let Some((local, syncer, task)) = local {
        // What was written is recorded before the process ends.
        rt.block_on(async {
            syncer.flush().await;
            drop(syncer);
        });
        use std::sync::atomic::Ordering::Relaxed;
        info!(
            "local copy: {} chunks served locally, {} stored, {} store errors, {} files verified, {} mismatches, {} passthrough opens",
            local.served.load(Relaxed),
            local.stored.load(Relaxed),
            local.store_errors.load(Relaxed),
            local.verified.load(Relaxed),
            local.mismatches.load(Relaxed),
            fs.passthrough_opens()
        );
        drop(local);
        drop(task);
    }
    rt.shutdown_timeout(Duration::from_secs(1));
    info!("stopped");
    Ok(())
}

/// The mount's background mirror: runs passes over the export until one completes (a
/// failed pass is retried with backoff), reporting through the status.
#[derive(Clone)]
struct BackgroundMirror {
    label: String,
    state: Arc<std::sync::Mutex<MirrorState>>,
}

struct MirrorState {
    /// "not started", "running", "complete", "retrying", "stopped".
    phase: &'static str,
    /// The current or last pass's counters.
    progress: Arc<ferry_cache::Progress>,
}

impl BackgroundMirror {
    fn new(label: String) -> BackgroundMirror {
        BackgroundMirror {
            label,
            state: Arc::new(std::sync::Mutex::new(MirrorState {
                phase: "not started",
                progress: Arc::new(ferry_cache::Progress::default()),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MirrorState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The phase and the counters of the current or last pass.
    fn current(&self) -> (&'static str, Arc<ferry_cache::Progress>) {
        let g = self.lock();
        (g.phase, g.progress.clone())
    }

    /// The mount stops: a pass in progress is left for the next mount to resume, and the
    /// status file says so (`ferry status DIR`).
    fn stopped(&self, cache: &ferry_cache::CacheDir) {
        let (phase, progress) = self.current();
        if phase == "running" || phase == "retrying" {
            self.lock().phase = "stopped";
            let _ = progress
                .snapshot("interrupted", &self.label)
                .write(cache.meta());
        }
    }

    /// Starts the passes on `rt`. Returns the task and the syncer that records what the
    /// mirror writes (flushed at unmount).
    fn start(
        &self,
        rt: &tokio::runtime::Runtime,
        client: Client,
        cache: Arc<ferry_cache::CacheDir>,
        root: bytes::Bytes,
        bwlimit: Option<u64>,
    ) -> (tokio::task::JoinHandle<()>, ferry_cache::Syncer) {
        let _rt = rt.enter();
        let this = self.clone();
        let (syncer, _task) = ferry_cache::Syncer::start(
            cache.clone(),
            Duration::from_secs(1),
            Arc::new(move |m| this.current().1.error(m)),
        );
        let this = self.clone();
        let sync = syncer.clone();
        let task = rt.spawn(async move {
            let mut delay = Duration::from_secs(10);
            loop {
                let engine = ferry_cache::MirrorConfig {
                    bwlimit,
                    ..ferry_cache::MirrorConfig::default()
                };
                let m = ferry_cache::Mirror::new(
                    client.clone(),
                    cache.clone(),
                    root.clone(),
                    this.label.clone(),
                    engine,
                )
                .with_syncer(sync.clone());
                {
                    let mut g = this.lock();
                    g.phase = "running";
                    g.progress = m.progress();
                }
                info!(
                    "background mirror into {} started{}",
                    cache.root().display(),
                    bwlimit.map_or_else(String::new, |b| format!(
                        ", capped at {}/s",
                        crate::mirror_cli::human_bytes(b)
                    ))
                );
                match m.run().await {
                    Ok(s) => {
                        this.lock().phase = "complete";
                        let secs = m.progress().elapsed();
                        info!(
                            "background mirror complete: {} files, {}, {} fetched in {secs:.1} s; the local copy is complete and verified",
                            s.files,
                            crate::mirror_cli::human_bytes(s.bytes),
                            crate::mirror_cli::human_bytes(s.fetched)
                        );
                        return;
                    }
                    Err(e) => {
                        this.lock().phase = "retrying";
                        warn!(
                            "background mirror: {e}; trying again in {} s",
                            delay.as_secs()
                        );
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(300));
                    }
                }
            }
        });
        (task, syncer)
    }
}

/// The JSON `ferry status MOUNTPOINT` shows.
fn status_fn(
    cfg: &MountConfig,
    label: String,
    client: Client,
    fs: Arc<Fs>,
    local: Option<Arc<ferry_cache::LocalCopy>>,
    background: BackgroundMirror,
) -> Arc<dyn Fn() -> ferry_cache::Status + Send + Sync> {
    use std::sync::atomic::Ordering::Relaxed;
    let mounted = Arc::new(ferry_cache::Progress::default());
    mounted.attach_client(&client);
    let mountpoint = absolute(&cfg.mountpoint).display().to_string();
    let cache_dir = cfg
        .cache_dir
        .as_ref()
        .map(|d| absolute(d).display().to_string());
    let (mirror, bwlimit) = (cfg.mirror, cfg.bwlimit);
    Arc::new(move || {
        let (phase, progress) = background.current();
        let mut s = if mirror {
            let state = match phase {
                "complete" => "complete",
                "retrying" => "incomplete",
                "running" => "running",
                _ => "mounted",
            };
            progress.snapshot(state, &label)
        } else {
            mounted.snapshot("mounted", &label)
        };
        let c = client.counters();
        s.mount = Some(ferry_cache::MountStatus {
            mountpoint: mountpoint.clone(),
            cache_dir: cache_dir.clone(),
            mirror,
            bwlimit,
            wire_bytes: c.wire_bytes.load(Relaxed),
            decoded_bytes: c.decoded_bytes.load(Relaxed),
            chunks_served_locally: local.as_ref().map_or(0, |l| l.served.load(Relaxed)),
            chunks_stored: local.as_ref().map_or(0, |l| l.stored.load(Relaxed)),
            store_errors: local.as_ref().map_or(0, |l| l.store_errors.load(Relaxed)),
            files_verified_by_reads: local.as_ref().map_or(0, |l| l.verified.load(Relaxed)),
            passthrough_opens: fs.passthrough_opens(),
        });
        s
    })
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/tmp/a\040b"), "/tmp/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
