//! `ferry mirror` and `ferry status`: the mirror engine without FUSE, and the report of a
//! cache directory's state.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use ferry_cache::{CacheDir, Mirror, MirrorConfig, Status, STATE_DIR};
use ferry_client::{Client, ClientConfig};

use crate::target::Target;

/// Everything `ferry mirror` needs.
#[derive(Debug, Clone)]
pub struct MirrorOptions {
    /// The remote directory.
    pub target: Target,
    /// The local directory to fill.
    pub dir: PathBuf,
    /// Connection settings.
    pub client: ClientConfig,
    /// Engine settings.
    pub engine: MirrorConfig,
    /// Show a progress bar (when stderr is a terminal).
    pub progress: bool,
    /// Serve Prometheus metrics here (`GET /metrics`).
    pub metrics: Option<std::net::SocketAddr>,
}

/// Parses a rate such as `100M`, `1.5G`, `750K` or `12345` (bytes per second; K, M, G, T
/// are powers of 1024).
///
/// # Errors
/// Anything else, with a one-line explanation.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => {
                    return Err(format!(
                        "--bwlimit {s}: unknown unit '{c}' (use K, M, G or T, e.g. 100M)"
                    ))
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok((v * mult as f64) as u64),
        _ => Err(format!(
            "--bwlimit {s}: not a rate; give bytes per second with K, M, G or T, e.g. 100M"
        )),
    }
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
    let cache = Arc::new(CacheDir::open(&opts.dir)?);
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
            Some(tokio::spawn(ferry_util::serve_metrics(
                l,
                Arc::new(move || p.snapshot("running", &label).to_prometheus()),
            )))
        }
        None => None,
    };
    let bar = (opts.progress && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bytes:>10}/{total_bytes:<10} {bar:30} {percent:>3}% {binary_bytes_per_sec:>12} ETA {eta:<5} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let ticker = bar.clone().map(|b| {
        let p = progress.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
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
        })
    });
    // Not a terminal (a log, a pipe): a plain progress line every 5 s.
    let plain = (opts.progress && bar.is_none()).then(|| {
        let (p, label) = (progress.clone(), label.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            tick.tick().await;
            loop {
                tick.tick().await;
                eprintln!(
                    "ferry mirror: {}",
                    progress_line(&p.snapshot("running", &label))
                );
            }
        })
    });
    let result = tokio::select! {
        r = mirror.run() => r,
        _ = tokio::signal::ctrl_c() => {
            if let Some(b) = &bar {
                b.abandon();
            }
            // What was recorded so far stays; the next run resumes from it.
            let _ = progress.snapshot("interrupted", &label).write(cache.meta());
            bail!("interrupted: run the same command again to resume");
        }
    };
    for t in [ticker, plain].into_iter().flatten() {
        t.abort();
    }
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
    Ok(())
}

/// `8.0 MiB/s ETA 4 s files 1/4` (a `+` after the files while the tree is still listed).
fn rate_eta_files(s: &Status) -> String {
    let eta = s
        .eta_secs
        .map_or_else(|| "?".to_string(), |e| format!("{e:.0} s"));
    format!(
        "{}/s ETA {eta} files {}/{}{}",
        human_bytes(s.rate_bytes_per_sec as u64),
        s.files_done,
        s.files_total,
        if s.walk_done { "" } else { "+" }
    )
}

/// One plain progress line, for output that is not a terminal.
fn progress_line(s: &Status) -> String {
    format!(
        "{} {} of {} ({:.1} %), {}",
        s.state,
        human_bytes(s.bytes_done),
        human_bytes(s.bytes_total),
        100.0 * s.bytes_done as f64 / s.bytes_total.max(1) as f64,
        rate_eta_files(s)
    )
}

/// `1.5 GiB` style.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The status a ferry mount serves at its root (see [`crate::fuse::STATUS_XATTR`]): `None`
/// when `path` is not a ferry mount.
///
/// # Errors
/// A ferry mount whose process is gone.
fn mount_status(path: &Path) -> anyhow::Result<Option<Status>> {
    let mut buf = vec![0u8; 256 << 10];
    match rustix::fs::getxattr(path, crate::fuse::STATUS_XATTR, &mut buf[..]) {
        Ok(n) => {
            let s = serde_json::from_slice(&buf[..n])
                .with_context(|| format!("{}: unreadable status from the mount", path.display()))?;
            Ok(Some(s))
        }
        Err(rustix::io::Errno::NOTCONN) => bail!(
            "{} is a mount whose ferry process is gone: unmount it with `fusermount3 -u {}`",
            path.display(),
            path.display()
        ),
        Err(_) => Ok(None),
    }
}

/// The current status of PATH: a mount point or a cache directory.
///
/// # Errors
/// PATH is neither a ferry mount nor holds ferry state.
fn read_status(path: &Path) -> anyhow::Result<Status> {
    if let Some(s) = mount_status(path)? {
        return Ok(s);
    }
    let meta = path.join(STATE_DIR);
    if !meta.is_dir() {
        bail!(
            "{} is not a ferry mount and holds no ferry state ({STATE_DIR}/ is missing): give a mount point or the directory of a `ferry mirror` or `--cache-dir`",
            path.display()
        );
    }
    let mut s = Status::read(&meta).with_context(|| {
        format!(
            "{}: no status yet (no mirror has run there)",
            meta.join("status.json").display()
        )
    })?;
    if s.state == "running" && !pid_alive(s.pid) {
        s.state = "interrupted".into();
    }
    Ok(s)
}

/// `ferry status PATH [--json] [--watch]`: PATH is a mount point or a cache directory.
///
/// # Errors
/// PATH is neither a ferry mount nor holds ferry state; with `--watch`, the mirror ended
/// incomplete.
pub fn status(path: &Path, json: bool, watch: bool) -> anyhow::Result<()> {
    if watch {
        return watch_status(path, json);
    }
    let s = read_status(path)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print_status(path, &s);
    }
    Ok(())
}

/// Follows a running mirror (of a directory or a mount's `--mirror`) until it ends: a
/// progress bar on a terminal, a line every 5 s otherwise (a JSON object per line with
/// `--json`). Exit status 0 when it completed.
fn watch_status(path: &Path, json: bool) -> anyhow::Result<()> {
    let bar = (!json && std::io::stdout().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::with_draw_target(
            Some(0),
            indicatif::ProgressDrawTarget::stdout(),
        );
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bytes:>10}/{total_bytes:<10} {bar:30} {percent:>3}% {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let mut last_line = std::time::Instant::now() - Duration::from_secs(10);
    loop {
        let s = read_status(path)?;
        if s.state == "mounted" {
            bail!(
                "{} is a mount without --mirror: nothing to watch (`ferry status {}` shows its counters)",
                path.display(),
                path.display()
            );
        }
        let running = s.state == "running";
        let msg = rate_eta_files(&s);
        if let Some(b) = &bar {
            b.set_length(s.bytes_total);
            b.set_position(s.bytes_done);
            b.set_message(msg.clone());
        } else if !running || last_line.elapsed() >= Duration::from_secs(5) {
            last_line = std::time::Instant::now();
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!("{}: {}", path.display(), progress_line(&s));
            }
        }
        if !running {
            if let Some(b) = &bar {
                b.finish_with_message(format!("{} {msg}", s.state));
            }
            if s.state == "complete" {
                return Ok(());
            }
            bail!(
                "the mirror ended {} with {} error(s): see `ferry status {}`",
                s.state,
                s.error_count,
                path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn print_status(path: &Path, s: &Status) {
    if let Some(m) = &s.mount {
        println!(
            "{}: ferry mount of {} (pid {}, up {:.0} s)",
            path.display(),
            s.remote,
            s.pid,
            s.elapsed_secs
        );
        println!(
            "  read    {} from the server ({} on the wire), {} chunks from the local copy",
            human_bytes(m.decoded_bytes),
            human_bytes(m.wire_bytes),
            m.chunks_served_locally
        );
        match &m.cache_dir {
            Some(d) => println!(
                "  local   {d}: {} chunks stored by reads, {} store errors, {} files verified by reads, {} passthrough opens",
                m.chunks_stored, m.store_errors, m.files_verified_by_reads, m.passthrough_opens
            ),
            None => println!("  local   none (no --cache-dir)"),
        }
        if !m.mirror {
            println!("  mirror  off (--mirror not given)");
            return;
        }
        println!(
            "  mirror  {}{}",
            s.state,
            m.bwlimit
                .map_or_else(String::new, |b| format!(", capped at {}/s", human_bytes(b)))
        );
        if s.state == "mounted" {
            return;
        }
    } else {
        println!(
            "{}: {} (mirror of {}, pid {}, {:.0} s{})",
            path.display(),
            s.state,
            s.remote,
            s.pid,
            s.elapsed_secs,
            if s.state == "running" { " so far" } else { "" }
        );
    }
    let pct = if s.bytes_total > 0 {
        100.0 * s.bytes_done as f64 / s.bytes_total as f64
    } else {
        100.0
    };
    println!(
        "  files   {} of {}{} complete and verified ({} verified by this run)",
        s.files_done,
        s.files_total,
        if s.walk_done { "" } else { "+ (still listing)" },
        s.files_verified
    );
    println!(
        "  bytes   {} of {} ({pct:.1} %), {} fetched by this run",
        human_bytes(s.bytes_done),
        human_bytes(s.bytes_total),
        human_bytes(s.bytes_fetched)
    );
    if s.state == "running" {
        println!(
            "  rate    {}/s, ETA {}",
            human_bytes(s.rate_bytes_per_sec as u64),
            s.eta_secs
                .map_or_else(|| "unknown".to_string(), |e| format!("{e:.0} s"))
        );
    }
    println!(
        "  checks  {} chunks fetched again, {} hash mismatches, {} files changed during the copy",
        s.chunks_refetched, s.hash_mismatches, s.files_changed
    );
    let f = &s.faults;
    println!(
        "  network {} streams connected; {} reconnects, {} requests sent again, {} checksum failures (fetched again), {} stalled streams, {} server restarts",
        f.live_streams, f.reconnects, f.retries, f.checksum_failures, f.stalls, f.server_restarts
    );
    println!("  errors  {}", s.error_count);
    for e in &s.errors {
        println!("    {e}");
    }
}
