//! `ferry`: mount a ferryd export (`ferry mount`), mirror one into a local directory
//! (`ferry mirror`), report on a mirror (`ferry status`).

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ferry_client::{ClientConfig, PrefetchConfig};
use ferry_mount::fs::FsConfig;
use ferry_mount::mount::MountConfig;
use ferry_mount::target::Target;

/// ferry: a remote directory at network speed.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Mount a ferryd export read-only with FUSE.
    ///
    /// Returns once the mount is ready and keeps serving in the background (-f stays in
    /// the foreground). Unmount with `fusermount3 -u MOUNTPOINT`, or SIGINT/SIGTERM to the
    /// ferry process.
    ///
    /// Every --flag below is also accepted sshfs-style as `-o flag` or `-o flag=value`
    /// (underscores or dashes), several at once: `-o allow_other,streams=16,cache_dir=/x`.
    /// mount(8)'s generic options (_netdev, nofail, noauto, x-systemd.*, ro, rw, …) are
    /// ignored, so /etc/fstab lines work through the mount.fuse.ferry helper
    /// (`make install`):
    ///   db1:7070:/u01/oradata /mnt/oradata fuse.ferry _netdev,allow_other,cache_dir=/nvme/o,mirror 0 0
    ///
    /// Examples:
    ///   ferry mount db1:/u01/oradata /mnt/oradata
    ///   ferry mount db1:7070 /mnt/db1 --streams 16 --allow-other
    ///   ferry mount db1:/u01/oradata /mnt/oradata --cache-dir /nvme/oradata --mirror --bwlimit 100M
    ///   ferry mount db1:/u01/oradata /mnt/oradata -o allow_other,streams=16,tls_fingerprint=SHA256:…
    ///   mount -t fuse.ferry db1:7070:/u01/oradata /mnt/oradata -o allow_other,cache_dir=/nvme/o
    #[command(verbatim_doc_comment)]
    Mount(MountArgs),
    /// Copy a ferryd export into a local directory: complete, verified, resumable.
    ///
    /// Big files are split into chunks fetched in parallel over several streams, many
    /// small files are in flight at once, every file is checked against the server's
    /// BLAKE3. Run it again after an interruption: only missing or changed chunks move.
    /// Exits 0 only when the whole tree is complete and verified.
    ///
    /// Examples:
    ///   ferry mirror db1:/u01/oradata /restore/oradata
    ///   ferry mirror db1:7070 /data/copy --streams 16 --bwlimit 200M
    #[command(verbatim_doc_comment)]
    Mirror(MirrorArgs),
    /// Report on a mount or a mirror directory: bytes and files done, rate, ETA,
    /// verification, errors; for a mount also its reads and local copy.
    ///
    /// Examples:
    ///   ferry status /mnt/oradata
    ///   ferry status /restore/oradata --json
    #[command(verbatim_doc_comment)]
    Status(StatusArgs),
}

#[derive(Debug, clap::Args)]
struct MirrorArgs {
    /// Server and directory: HOST[:PORT][:/PATH] (default port 7070).
    remote: String,
    /// Local directory to fill (created if missing; its state goes in DIR/.ferry/).
    dir: PathBuf,
    #[command(flatten)]
    net: NetArgs,
    /// Files copied at once (each has a request in flight: many are needed to fill a
    /// long link with small files).
    #[arg(long, value_name = "N", default_value_t = 512)]
    files: usize,
    /// Memory for chunks in flight, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    chunk_memory: usize,
    /// Cap on the transfer rate, bytes per second on the wire, with K, M, G (powers of
    /// 1024), e.g. 100M.
    #[arg(long, value_name = "RATE", value_parser = ferry_mount::mirror_cli::parse_rate)]
    bwlimit: Option<u64>,
    /// Do not compare each file's BLAKE3 with the server's.
    #[arg(long)]
    no_verify: bool,
    /// No progress output (a bar on a terminal; otherwise a plain line every 5 s).
    #[arg(short, long)]
    quiet: bool,
    /// Write the log here instead of stderr.
    #[arg(long, value_name = "FILE")]
    log_file: Option<PathBuf>,
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, clap::Args)]
struct StatusArgs {
    /// A ferry mount point, or a directory filled by `ferry mirror` or `--cache-dir`.
    path: PathBuf,
    /// Machine-readable output: the status object (schema in docs/CONFIGURATION.md).
    #[arg(long)]
    json: bool,
    /// Follow a running mirror until it ends: a progress bar on a terminal, a line every
    /// 5 s otherwise (one JSON object per line with --json). Exit status 0 when complete.
    #[arg(long)]
    watch: bool,
}

#[derive(Debug, clap::Args)]
struct MountArgs {
    /// Server and directory: HOST[:PORT][:/PATH] (default port 7070).
    remote: String,
    /// Empty directory to mount on.
    mountpoint: PathBuf,
    #[command(flatten)]
    net: NetArgs,
    /// Largest read-ahead window of a sequential reader, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    max_window: u64,
    /// Memory for chunks in flight and read ahead, in MiB (also caps the read-ahead window).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    chunk_memory: usize,
    /// Seconds the kernel caches attributes and names.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    attr_timeout: f64,
    /// Allow other users (e.g. postgres, oracle) to use the mount. Non-root users need
    /// `user_allow_other` in /etc/fuse.conf.
    #[arg(long)]
    allow_other: bool,
    /// Stay in the foreground.
    #[arg(short, long)]
    foreground: bool,
    /// FUSE worker threads.
    #[arg(long, value_name = "N", default_value_t = 2)]
    threads: usize,
    /// Kernel readahead for the mount, in KiB.
    #[arg(long, value_name = "KIB", default_value_t = 8192)]
    read_ahead_kb: u32,
    /// Write the log here (in the background the log is otherwise discarded).
    #[arg(long, value_name = "FILE")]
    log_file: Option<PathBuf>,
    /// Keep a local copy here: every chunk read through the mount is written into it, and
    /// read from it (not the network) afterwards, also after a remount. Same layout and
    /// state as `ferry mirror` (DIR/.ferry/).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Fill the local copy (--cache-dir) in the background with the whole export, while
    /// reads through the mount come first. Once a file is complete and verified, its opens
    /// are served from local disk. `ferry status MOUNTPOINT` shows the progress.
    #[arg(long, requires = "cache_dir")]
    mirror: bool,
    /// Cap the background mirror's transfer: bytes per second with K, M, G or T (powers of
    /// 1024), e.g. 100M. Reads through the mount are not capped.
    #[arg(long, value_name = "RATE", value_parser = ferry_mount::mirror_cli::parse_rate, requires = "mirror")]
    bwlimit: Option<u64>,
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Less log output: warnings and errors only.
    #[arg(short, long, conflicts_with = "verbose")]
    quiet: bool,
}

/// How to reach the server (mount and mirror).
#[derive(Debug, clap::Args)]
struct NetArgs {
    /// TCP connections used together.
    #[arg(long, value_name = "N", default_value_t = 8)]
    streams: usize,
    /// Chunk size to request, in KiB (the server may choose smaller).
    #[arg(long, value_name = "KIB", default_value_t = 1024)]
    chunk_size: u32,
    /// Never ask for lz4-compressed data.
    #[arg(long)]
    no_compression: bool,
    /// Seconds to wait for the server when connecting.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    connect_timeout: u64,
    #[command(flatten)]
    faults: FaultArgs,
    #[command(flatten)]
    security: SecurityArgs,
    /// Serve Prometheus metrics (names ferry_*: bytes, chunks, compression, retries,
    /// checksum failures, streams, mirror progress, cache hits) on http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

/// Encryption and authentication (mount and mirror).
#[derive(Debug, clap::Args)]
struct SecurityArgs {
    /// Connect with TLS. The server is checked with --ca or --tls-fingerprint (either
    /// implies --tls).
    #[arg(long)]
    tls: bool,
    /// Trust server certificates signed by this CA (PEM); the certificate must be for the
    /// host name or address given.
    #[arg(long, value_name = "FILE", conflicts_with = "tls_fingerprint")]
    ca: Option<PathBuf>,
    /// Trust exactly the server certificate with this fingerprint, as `ferryd gen-cert`
    /// prints it: SHA256:<base64>.
    #[arg(long, value_name = "SHA256:…")]
    tls_fingerprint: Option<String>,
    /// Client certificate for servers that require one (PEM; with --key).
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// Private key of --cert (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Prove the token in this file when the server asks (the same file as ferryd's
    /// --token-file; the token itself never travels).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
}

/// How long to wait through faults (mount and mirror).
#[derive(Debug, clap::Args)]
struct FaultArgs {
    /// Seconds a read may wait for the server while it is unreachable (streams are
    /// reconnected meanwhile); then it fails with EIO (the mount) or an error (mirror).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    timeout: u64,
    /// Seconds a stream may receive nothing while requests wait on it before it is taken
    /// for dead, closed and reconnected (its requests go to other streams).
    #[arg(long, value_name = "SECS", default_value_t = 15)]
    stall_timeout: u64,
}

fn init_logging_at(verbose: u8, file: Option<&PathBuf>, quiet: &str) -> anyhow::Result<()> {
    let default = match verbose {
        0 => quiet,
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let b = tracing_subscriber::fmt().with_env_filter(filter);
    match file {
        Some(path) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("cannot open --log-file {}: {e}", path.display()))?;
            b.with_ansi(false)
                .with_writer(std::sync::Mutex::new(f))
                .init();
        }
        None => b.with_writer(std::io::stderr).init(),
    }
    // A panic in a FUSE or runtime thread ends the mount; in daemon mode stderr goes
    // nowhere, so it is logged where the operator looks.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!("panic: {info}");
        default_hook(info);
    }));
    Ok(())
}

/// Caps glibc's malloc arenas. By default every thread that allocates may get an arena of
/// its own (up to 8 per core), and each keeps freed 1 MiB chunk buffers for reuse, which
/// showed as tens of MiB of extra resident memory under load.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Raises the open-file limit to its hard maximum: a mirror keeps hundreds of files open at
/// once (and the syncer holds the ones written until they are durable).
fn raise_nofile_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
}

fn main() {
    limit_malloc_arenas();
    raise_nofile_limit();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let argv = match expand_mount_options(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ferry: {e}");
            std::process::exit(1);
        }
    };
    let cli = match <Cli as clap::Parser>::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => one_line_usage_error(e),
    };
    let r = match cli.command {
        Command::Mount(args) => mount(args),
        Command::Mirror(args) => mirror(args),
        Command::Status(args) => ferry_mount::mirror_cli::status(&args.path, args.json, args.watch),
    };
    if let Err(e) = r {
        eprintln!("ferry: {e:#}");
        std::process::exit(1);
    }
}

/// Options mount(8) and fstab pass that mean nothing to ferry (or that ferry always does):
/// accepted and ignored.
const IGNORED_MOUNT_OPTIONS: &[&str] = &[
    "_netdev",
    "nofail",
    "noauto",
    "auto",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
    "defaults",
    "ro",
    "rw",
    "nodev",
    "nosuid",
    "dev",
    "suid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "diratime",
    "nodiratime",
    "lazytime",
    "sync",
    "async",
    "dirsync",
    "loud",
    "silent",
    "nomand",
    "delay_connect",
];

/// sshfs-style `-o opt,opt=val,…` for `ferry mount`: each option becomes the long flag of
/// the same name (`cache_dir=/x` → `--cache-dir /x`, `allow_other` → `--allow-other`);
/// mount(8)'s generic options (`_netdev`, `noauto`, `x-systemd.*`, `comment=…`, …) are
/// ignored (`rw` too, which mount(8) always passes: the mount is read-only whatever it says).
///
/// # Errors
/// An option that is not a `ferry mount` flag, with a one-line explanation.
fn expand_mount_options(argv: Vec<std::ffi::OsString>) -> Result<Vec<std::ffi::OsString>, String> {
    use clap::CommandFactory;
    if argv.get(1).and_then(|a| a.to_str()) != Some("mount") {
        return Ok(argv);
    }
    let cmd = Cli::command();
    let mount = cmd
        .find_subcommand("mount")
        .ok_or_else(|| "no mount subcommand".to_string())?;
    let mut out = Vec::with_capacity(argv.len());
    let mut flags = Vec::new();
    let mut it = argv.into_iter();
    while let Some(arg) = it.next() {
        let list = match arg.to_str() {
            Some("-o") => match it.next() {
                Some(v) => v.to_string_lossy().into_owned(),
                None => {
                    return Err("-o needs a list of options, e.g. -o allow_other,streams=16".into())
                }
            },
            Some(a) if a.starts_with("-o") && a.len() > 2 => a[2..].to_string(),
            _ => {
                out.push(arg);
                continue;
            }
        };
        for opt in list.split(',').filter(|o| !o.is_empty()) {
            let (key, value) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            if IGNORED_MOUNT_OPTIONS.contains(&key) || key.starts_with("x-") || key == "comment" {
                continue;
            }
            let long = key.replace('_', "-");
            let Some(def) = mount
                .get_arguments()
                .find(|a| a.get_long() == Some(long.as_str()))
            else {
                return Err(format!(
                    "-o {key}: not a ferry mount option (see `ferry mount --help`; every --flag works as -o flag or -o flag=value)"
                ));
            };
            let takes_value = def.get_action().takes_values();
            match (takes_value, value) {
                (true, Some(v)) => {
                    flags.push(format!("--{long}").into());
                    flags.push(v.into());
                }
                (true, None) => return Err(format!("-o {key} needs a value: -o {key}=VALUE")),
                (false, None) => flags.push(format!("--{long}").into()),
                (false, Some(_)) => return Err(format!("-o {key} takes no value: write -o {key}")),
            }
        }
    }
    out.extend(flags);
    Ok(out)
}

fn mirror(a: MirrorArgs) -> anyhow::Result<()> {
    let (target, client) = connection(&a.remote, &a.net, "mirror")?;
    anyhow::ensure!((1..=4096).contains(&a.files), "--files must be 1 to 4096");
    init_logging_at(a.verbose, a.log_file.as_ref(), "warn")?;
    ferry_mount::mirror_cli::run(ferry_mount::mirror_cli::MirrorOptions {
        target,
        dir: a.dir,
        client,
        engine: ferry_cache::MirrorConfig {
            files_in_flight: a.files,
            chunk_memory: a.chunk_memory.max(1) << 20,
            verify: !a.no_verify,
            bwlimit: a.bwlimit,
            ..ferry_cache::MirrorConfig::default()
        },
        progress: !a.quiet,
        metrics: a.net.metrics,
    })
}

/// The remote and the connection settings `mount` and `mirror` share, checked.
fn connection(remote: &str, n: &NetArgs, what: &str) -> anyhow::Result<(Target, ClientConfig)> {
    let (streams, chunk_kib, compression, connect_timeout) = (
        n.streams,
        n.chunk_size,
        !n.no_compression,
        n.connect_timeout,
    );
    let (faults, security) = (&n.faults, &n.security);
    let target = Target::parse(remote).map_err(|e| anyhow::anyhow!(e))?;
    anyhow::ensure!(
        (4..=16 * 1024).contains(&chunk_kib),
        "--chunk-size {chunk_kib} KiB is out of range: use 4 to 16384"
    );
    anyhow::ensure!((1..=256).contains(&streams), "--streams must be 1 to 256");
    anyhow::ensure!(faults.timeout >= 1, "--timeout must be at least 1 second");
    anyhow::ensure!(
        faults.stall_timeout >= 1,
        "--stall-timeout must be at least 1 second"
    );
    let client = ClientConfig {
        streams,
        chunk_size: chunk_kib * 1024,
        compression,
        connect_timeout: Duration::from_secs(connect_timeout.max(1)),
        client_name: format!("ferry {} {what}", env!("CARGO_PKG_VERSION")),
        request_timeout: Duration::from_secs(faults.timeout),
        stall_timeout: Duration::from_secs(faults.stall_timeout),
        tls: tls_client(security)?,
        token: match &security.token_file {
            Some(p) => {
                let raw = std::fs::read(p).map_err(|e| {
                    anyhow::anyhow!("--token-file {}: cannot read it: {e}", p.display())
                })?;
                Some(
                    ferry_client::Token::from_file_contents(&raw)
                        .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", p.display()))?,
                )
            }
            None => None,
        },
        ..ClientConfig::default()
    };
    Ok((target, client))
}

/// The TLS configuration the security options ask for, if any.
fn tls_client(s: &SecurityArgs) -> anyhow::Result<Option<ferry_client::TlsClient>> {
    if !s.tls && s.ca.is_none() && s.tls_fingerprint.is_none() {
        anyhow::ensure!(
            s.cert.is_none(),
            "--cert/--key are for TLS: give --ca or --tls-fingerprint too"
        );
        return Ok(None);
    }
    let fingerprint = match &s.tls_fingerprint {
        Some(f) => Some(ferry_proto::auth::parse_fingerprint(f).map_err(|e| anyhow::anyhow!(e))?),
        None => None,
    };
    let t = ferry_client::TlsClient::new(&ferry_client::TlsOptions {
        ca: s.ca.clone(),
        fingerprint,
        cert: s.cert.clone(),
        key: s.key.clone(),
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(Some(t))
}

fn mount_config(a: &MountArgs) -> anyhow::Result<MountConfig> {
    let (target, client) = connection(&a.remote, &a.net, "mount")?;
    anyhow::ensure!(
        a.attr_timeout.is_finite() && a.attr_timeout >= 0.0,
        "--attr-timeout must be a number of seconds ≥ 0"
    );
    let max_window = a.max_window.max(1) << 20;
    Ok(MountConfig {
        target,
        mountpoint: a.mountpoint.clone(),
        client,
        fs: FsConfig {
            attr_ttl: Duration::from_secs_f64(a.attr_timeout),
            chunk_memory: a.chunk_memory.max(1) << 20,
            prefetch: PrefetchConfig {
                max_window,
                ..PrefetchConfig::default()
            },
            ..FsConfig::default()
        },
        allow_other: a.allow_other,
        threads: a.threads.max(1),
        read_ahead_kb: a.read_ahead_kb,
        cache_dir: a.cache_dir.clone(),
        mirror: a.mirror,
        bwlimit: a.bwlimit,
        metrics: a.net.metrics,
        ..MountConfig::default()
    })
}

fn mount(args: MountArgs) -> anyhow::Result<()> {
    let cfg = mount_config(&args)?;
    if args.foreground {
        init_logging_at(
            args.verbose,
            args.log_file.as_ref(),
            if args.quiet { "warn" } else { "info" },
        )?;
        return ferry_mount::mount::run(cfg, || {});
    }
    // Fork before any thread exists; the parent waits until the child reports the mount
    // ready (exit 0) or failed (its error, exit 1).
    // Close-on-exec: helpers the child runs (fusermount3) must not hold the pipe open.
    let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| anyhow::anyhow!("pipe: {e}"))?;
    // SAFETY: no threads have been started yet (logging is initialised after the fork), so
    // the child is a complete copy of a single-threaded process.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        anyhow::bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid > 0 {
        drop(wr);
        let mut msg = String::new();
        let _ = std::fs::File::from(rd).read_to_string(&mut msg);
        if msg == "ok" {
            std::process::exit(0);
        }
        if msg.is_empty() {
            msg = "the mount process exited during start-up (run with -f to see why)".into();
        }
        anyhow::bail!("{msg}");
    }
    drop(rd);
    // Closing the pipe's write end (after "ok" or an error) is what releases the parent.
    let report = std::cell::RefCell::new(Some(std::fs::File::from(wr)));
    // SAFETY: setsid has no memory effects; it detaches from the terminal's session.
    unsafe { libc::setsid() };
    if let Err(e) = init_logging_at(
        args.verbose,
        args.log_file.as_ref(),
        if args.quiet { "warn" } else { "info" },
    ) {
        // Reported once, by the parent.
        if let Some(mut f) = report.borrow_mut().take() {
            let _ = f.write_all(format!("{e:#}").as_bytes());
        }
        std::process::exit(1);
    }
    let result = ferry_mount::mount::run(cfg, || {
        if let Some(mut f) = report.borrow_mut().take() {
            let _ = f.write_all(b"ok");
        }
        detach_stdio();
    });
    if let (Err(e), Some(mut f)) = (&result, report.borrow_mut().take()) {
        // The parent prints it; printing here too would show the error twice.
        let _ = f.write_all(format!("{e:#}").as_bytes());
        drop(f);
        std::process::exit(1);
    }
    result
}

/// Points stdin, stdout and stderr at /dev/null once the parent has gone.
fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors, which this process owns.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// Help and version print as usual; a usage error becomes one line (what is wrong, the
/// usage, where to look) instead of clap's block.
fn one_line_usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let text = e.render().to_string();
    let mut what = Vec::new();
    let mut usage = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(u) = line.strip_prefix("Usage: ") {
            usage = Some(u.to_string());
        } else if !line.starts_with("For more information") && !line.starts_with("tip:") {
            what.push(line.trim_start_matches("error: ").to_string());
        }
    }
    eprintln!(
        "ferry: {}{}; see --help",
        what.join(" "),
        usage.map_or_else(String::new, |u| format!(" (usage: {u})"))
    );
    std::process::exit(2);
}

#[cfg(test)]
mod tests {
    use super::expand_mount_options;

    fn expand(args: &[&str]) -> Result<Vec<String>, String> {
        let argv = args.iter().map(std::ffi::OsString::from).collect();
        expand_mount_options(argv).map(|v| {
            v.into_iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        })
    }

    #[test]
    fn dash_o_options_become_flags() {
        type Case<'a> = (&'a [&'a str], Result<&'a [&'a str], &'a str>);
        let table: &[Case] = &[
            (
                &[
                    "ferry",
                    "mount",
                    "h:/p",
                    "/m",
                    "-o",
                    "allow_other,streams=16",
                ],
                Ok(&[
                    "ferry",
                    "mount",
                    "h:/p",
                    "/m",
                    "--allow-other",
                    "--streams",
                    "16",
                ]),
            ),
            (
                &[
                    "ferry",
                    "mount",
                    "h",
                    "/m",
                    "-ocache_dir=/nvme/x,mirror,bwlimit=100M",
                ],
                Ok(&[
                    "ferry",
                    "mount",
                    "h",
                    "/m",
                    "--cache-dir",
                    "/nvme/x",
                    "--mirror",
                    "--bwlimit",
                    "100M",
                ]),
            ),
            (
                &[
                    "ferry",
                    "mount",
                    "h",
                    "/m",
                    "-o",
                    "ro,_netdev,nofail,noauto,x-systemd.automount,comment=x,defaults,dev,suid",
                ],
                Ok(&["ferry", "mount", "h", "/m"]),
            ),
            (
                &[
                    "ferry",
                    "mount",
                    "-o",
                    "tls_fingerprint=SHA256:ab=,token_file=/t",
                    "h",
                    "/m",
                ],
                Ok(&[
                    "ferry",
                    "mount",
                    "h",
                    "/m",
                    "--tls-fingerprint",
                    "SHA256:ab=",
                    "--token-file",
                    "/t",
                ]),
            ),
            (
                &["ferry", "mount", "h", "/m", "-o", "rw"],
                Ok(&["ferry", "mount", "h", "/m"]),
            ),
            (
                &["ferry", "mount", "h", "/m", "-o", "frobnicate"],
                Err("not a ferry mount option"),
            ),
            (
                &["ferry", "mount", "h", "/m", "-o", "streams"],
                Err("needs a value"),
            ),
            (
                &["ferry", "mount", "h", "/m", "-o", "mirror=yes"],
                Err("takes no value"),
            ),
            (&["ferry", "mount", "h", "/m", "-o"], Err("needs a list")),
            (
                &["ferry", "mirror", "-o", "x"],
                Ok(&["ferry", "mirror", "-o", "x"]),
            ),
        ];
        for (args, want) in table {
            match (expand(args), want) {
                (Ok(got), Ok(w)) => assert_eq!(got, *w, "{args:?}"),
                (Err(e), Err(w)) => assert!(e.contains(w), "{args:?}: {e}"),
                (got, w) => panic!("{args:?}: got {got:?}, want {w:?}"),
            }
        }
    }
}
