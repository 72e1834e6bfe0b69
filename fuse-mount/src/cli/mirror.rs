//! `ferry mirror`: the ferry-cache mirror engine without FUSE, with progress output: a bar
//! on a terminal, otherwise a plain line every 5 s; a summary line at the end.
//!
//! Ctrl-C leaves the status file saying `interrupted` and what was copied recorded, so the
//! same command resumes. The exit status is 0 only when the tree is complete and verified.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use ferry_cache::{CacheDir, Mirror, MirrorConfig, State};
use ferry_client::{Client, ClientConfig};
use ferry_mount::target::Target;
use ferry_util::{human_bytes, AbortOnDrop};

use super::args::MirrorArgs;
use super::config::mirror_options;
use super::logging::init_logging_at;
use super::render::{progress_bar, progress_line};

/// How often the bar is redrawn.
const BAR_TICK: Duration = Duration::from_millis(200);
/// How often a plain progress line is printed (output that is not a terminal).
const LINE_TICK: Duration = Duration::from_secs(5);

/// Everything `ferry mirror` needs.
#[derive(Debug, Clone)]
pub struct MirrorOptions {
    /// The remote directory.
    pub target: Target,
    /// The local directory to fill.
    pub dir: PathBuf,
    /// Where its state goes.
    pub state: ferry_cache::StateBase,
    /// Connection settings.
    pub client: ClientConfig,
    /// Engine settings.
    pub engine: MirrorConfig,
    /// Show progress (a bar when stderr is a terminal, else a line every 5 s).
    pub progress: bool,
    /// Serve Prometheus metrics here (`GET /metrics`).
    pub metrics: Option<std::net::SocketAddr>,
}

/// `ferry mirror REMOTE DIR [OPTIONS]`.
///
/// # Errors
/// Bad arguments; connection, cache directory or copy failures, as one line each.
pub fn mirror(args: MirrorArgs) -> anyhow::Result<()> {
    let (verbose, log_file) = (args.verbose, args.log_file.clone());
    let opts = mirror_options(args)?;
    init_logging_at(verbose, log_file.as_ref(), "warn")?;
    run(opts)
}

/// Runs a mirror to the end. Exit status 0 only when the tree is complete and verified.
///
/// # Errors
/// Connection, cache directory or copy failures, as one line each.
pub fn run(opts: MirrorOptions) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(run_async(opts))
}

async fn run_async(opts: MirrorOptions) -> anyhow::Result<()> {
    let cache = Arc::new(CacheDir::open(&opts.dir, &opts.state)?);
    let client = Client::connect(ClientConfig {
        addr: opts.target.addr(),
        ..opts.client.clone()
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let label = opts.target.addr();
    let mirror = Mirror::new(
        client,
        cache.clone(),
        opts.target.path.clone(),
        label.clone(),
        opts.engine.clone(),
    );
    let progress = mirror.progress();
    let _metrics = match opts.metrics {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics {addr}: cannot listen there"))?;
            let (p, label) = (progress.clone(), label.clone());
            Some(AbortOnDrop(tokio::spawn(ferry_util::serve_metrics(
                l,
                Arc::new(move || p.snapshot(State::Running, &label).to_prometheus()),
            ))))
        }
        None => None,
    };
    let bar = (opts.progress && std::io::stderr().is_terminal()).then(|| {
        progress_bar(
            indicatif::ProgressDrawTarget::stderr(),
            "{bytes:>10}/{total_bytes:<10} {bar:30} {percent:>3}% {binary_bytes_per_sec:>12} ETA {eta:<5} {msg}",
        )
    });
    let ticker = bar.clone().map(|b| {
        let p = progress.clone();
        AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(BAR_TICK);
            loop {
                tick.tick().await;
                b.set_length(p.bytes_total.load(Ordering::Relaxed));
                b.set_position(p.bytes_done.load(Ordering::Relaxed));
                b.set_message(format!(
                    "files {}/{}{}",
                    p.files_done.load(Ordering::Relaxed),
                    p.files_total.load(Ordering::Relaxed),
                    if p.walk_done.load(Ordering::Relaxed) {
                        ""
                    } else {
                        "+"
                    }
                ));
            }
        }))
    });
    // Not a terminal (a log, a pipe): a plain progress line every 5 s.
    let plain = (opts.progress && bar.is_none()).then(|| {
        let (p, label) = (progress.clone(), label.clone());
        AbortOnDrop(tokio::spawn(async move {
            let mut tick = tokio::time::interval(LINE_TICK);
            tick.tick().await;
            loop {
                tick.tick().await;
                eprintln!(
                    "ferry mirror: {}",
                    progress_line(&p.snapshot(State::Running, &label))
                );
            }
        }))
    });
    let result = tokio::select! {
        r = mirror.run() => r,
        _ = tokio::signal::ctrl_c() => {
            if let Some(b) = &bar {
                b.abandon();
            }
            // What was recorded so far stays; the next run resumes from it.
            let _ = progress.snapshot(State::Interrupted, &label).write(cache.meta());
            bail!("interrupted: run the same command again to resume");
        }
    };
    drop((ticker, plain));
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let s = result?;
    let secs = progress.elapsed();
    eprintln!(
        "ferry mirror: {} files, {} complete and verified in {}; {} fetched in {:.1} s ({}/s)",
        s.files,
        human_bytes(s.bytes),
        opts.dir.display(),
        human_bytes(s.fetched),
        secs,
        human_bytes((s.fetched as f64 / secs.max(1e-3)) as u64),
    );
    let skipped = progress
        .specials_skipped
        .load(std::sync::atomic::Ordering::Relaxed);
    if skipped > 0 {
        eprintln!(
            "ferry mirror: {skipped} special files not copied (sockets; device nodes need root)"
        );
    }
    let deleted = progress.deleted.load(std::sync::atomic::Ordering::Relaxed);
    if deleted > 0 {
        let listed = progress
            .deleted_paths
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        eprintln!("ferry mirror: {deleted} local entries deleted (gone from the server):");
        for p in &listed {
            eprintln!("  {p}");
        }
        if deleted > listed.len() as u64 {
            eprintln!("  … and {} more", deleted - listed.len() as u64);
        }
    }
    Ok(())
}
