//! `ferryd`: export a directory over the ferry protocol.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use ferry_server::{Current, ServerConfig};

/// Export a directory, read-only, to `ferry mount` clients.
///
/// Examples:
///   ferryd --export /srv/oradata                                    (loopback only)
///   ferryd gen-cert --cert /etc/ferry/cert.pem --key /etc/ferry/key.pem --name db1.example.com
///   ferryd --export /srv/oradata --listen 0.0.0.0:7070 \
///       --tls-cert /etc/ferry/cert.pem --tls-key /etc/ferry/key.pem --token-file /etc/ferry/token
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
#[command(
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true,
    args_override_self = true
)]
struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    /// Read settings from this TOML file: `key = value` per option, named as the long
    /// options (`export = "/srv/data"`, `listen = "0.0.0.0:7070"`, `tls_cert = "…"`,
    /// `insecure = true`). Options on the command line override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Directory to export (read-only; nothing outside it is ever served).
    #[arg(long, value_name = "DIR", required = true)]
    export: Option<PathBuf>,
    /// Address to listen on. Port 0 picks a free port (see --port-file).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Write the bound address (ip:port) to this file once listening.
    #[arg(long, value_name = "FILE")]
    port_file: Option<PathBuf>,
    /// Largest chunk size offered to clients, in KiB.
    #[arg(long, value_name = "KIB", default_value_t = 1024)]
    chunk_size: u32,
    /// Requests one connection may have in flight.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_inflight: u32,
    /// Connections served at once; more are refused with "busy" (clients retry).
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_connections: usize,
    /// Connections still in their handshake (not yet authenticated) at once; more are
    /// refused with "busy". While over half are taken, a handshake gets a fifth of the time.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_handshakes: usize,
    /// The same, from one source address.
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_handshakes_per_address: usize,
    /// MiB of file data held in buffers across all connections.
    #[arg(long, value_name = "MIB", default_value_t = 48)]
    memory_budget: usize,
    /// Seconds a connection may stay idle (no request, none in flight) before it is closed.
    /// ferry clients send keepalives every 30 s.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    idle_timeout: u64,
    /// Serve over TLS with this certificate (PEM; with --tls-key). Clients then need
    /// `--tls` and `--ca FILE` or `--tls-fingerprint SHA256:…`; plain clients are refused.
    /// SIGHUP reads it and the key again (new connections get them).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: clients must present a certificate signed by this CA (PEM). SIGHUP reads
    /// it again (new connections are checked against it).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// Clients must prove they hold the token in this file (challenge-response; the token
    /// never travels). At least 16 bytes, e.g. `head -c 32 /dev/urandom | base64 > FILE`.
    /// SIGHUP reads it again (new connections need the new token; open ones go on).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Allow listening on a non-loopback address with neither TLS nor a token.
    #[arg(long)]
    insecure: bool,
    /// Serve Prometheus metrics (names ferry_server_*) on http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// The highest zstd level spent on a client's request (-7 to 22; clients asking for
    /// more get this level), or `off` to offer no zstd (clients then use lz4).
    #[arg(
        long,
        value_name = "LEVEL|off",
        default_value = "6",
        allow_negative_numbers = true,
        value_parser = parse_max_level
    )]
    max_compression_level: MaxLevel,
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Less log output: warnings and errors only.
    #[arg(short, long, conflicts_with = "verbose")]
    quiet: bool,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Write a self-signed certificate and key for TLS, and print the certificate's
    /// fingerprint (SHA256:…) for clients' --tls-fingerprint.
    ///
    /// Example:
    ///   ferryd gen-cert --cert cert.pem --key key.pem --name db1.example.com --name 10.0.0.5
    #[command(verbatim_doc_comment)]
    GenCert {
        /// Where to write the certificate (PEM).
        #[arg(long, value_name = "FILE")]
        cert: PathBuf,
        /// Where to write the private key (PEM, mode 0600).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// Host names or IP addresses the certificate is for (repeat); default: localhost,
        /// 127.0.0.1 and this host's name.
        #[arg(long, value_name = "NAME")]
        name: Vec<String>,
    },
}

/// Why `--config FILE` could not be used; each is one line naming the file.
#[derive(Debug, thiserror::Error)]
enum ConfigFileError {
    /// `--config` at the end of the command line.
    #[error("--config needs a file")]
    NeedsFile,
    /// The file cannot be read.
    #[error("--config {shown}: cannot read it")]
    Read {
        /// The file, as shown.
        shown: String,
        /// What reading returned.
        #[source]
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("--config {shown}: not valid TOML: {message}")]
    Toml {
        /// The file, as shown.
        shown: String,
        /// The first line of the parser's message (its full text spans several lines and
        /// quotes the file, which a one-line error cannot hold).
        message: String,
    },
    /// A setting that is not one of ferryd's long options.
    #[error("--config {shown}: unknown setting '{key}' (settings are ferryd's long options, e.g. export, listen, tls_cert)")]
    Unknown {
        /// The file, as shown.
        shown: String,
        /// The setting.
        key: String,
    },
    /// A value of the wrong TOML type for its setting.
    #[error("--config {shown}: {key} is a {found}: expected {expected}")]
    WrongType {
        /// The file, as shown.
        shown: String,
        /// The setting.
        key: String,
        /// The TOML type found.
        found: &'static str,
        /// What the setting takes.
        expected: &'static str,
    },
}

/// `--config FILE`: its settings become options placed before the command line's, so the
/// command line wins (`args_override_self`).
///
/// # Errors
/// [`ConfigFileError`]: an unreadable file, bad TOML, an unknown setting or a value of the
/// wrong kind.
fn expand_config(
    argv: Vec<std::ffi::OsString>,
) -> Result<Vec<std::ffi::OsString>, ConfigFileError> {
    use clap::CommandFactory;
    let mut rest = Vec::with_capacity(argv.len());
    let mut path = None;
    let mut it = argv.into_iter();
    let program = it.next().unwrap_or_default();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--config") => {
                path = Some(it.next().ok_or(ConfigFileError::NeedsFile)?);
            }
            Some(s) if s.starts_with("--config=") => path = Some(s["--config=".len()..].into()),
            _ => rest.push(a),
        }
    }
    let Some(path) = path else {
        let mut out = vec![program];
        out.extend(rest);
        return Ok(out);
    };
    let shown = std::path::Path::new(&path).display().to_string();
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigFileError::Read {
        shown: shown.clone(),
        source,
    })?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| ConfigFileError::Toml {
            shown: shown.clone(),
            message: e.message().lines().next().unwrap_or("").to_string(),
        })?;
    let cmd = Args::command();
    let mut from_file: Vec<std::ffi::OsString> = Vec::new();
    for (key, value) in table {
        let long = key.replace('_', "-");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && long != "config" && long != "help")
            .ok_or_else(|| ConfigFileError::Unknown {
                shown: shown.clone(),
                key: key.clone(),
            })?;
        let takes_value = arg.get_action().takes_values();
        match value {
            toml::Value::Boolean(b) if !takes_value => {
                if b {
                    from_file.push(format!("--{long}").into());
                }
            }
            toml::Value::Integer(n) if long == "verbose" => {
                for _ in 0..n.clamp(0, 3) {
                    from_file.push("-v".into());
                }
            }
            toml::Value::String(v) if takes_value => {
                from_file.push(format!("--{long}").into());
                from_file.push(v.into());
            }
            toml::Value::Integer(n) if takes_value => {
                from_file.push(format!("--{long}").into());
                from_file.push(n.to_string().into());
            }
            other => {
                return Err(ConfigFileError::WrongType {
                    shown,
                    key,
                    found: other.type_str(),
                    expected: if takes_value {
                        "a string or a number"
                    } else {
                        "true or false"
                    },
                })
            }
        }
    }
    let mut out = vec![program];
    out.extend(from_file);
    out.extend(rest);
    Ok(out)
}

fn main() {
    ferry_util::limit_malloc_arenas();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let is_subcommand = argv.get(1).and_then(|a| a.to_str()) == Some("gen-cert");
    let argv = if is_subcommand {
        argv
    } else {
        match expand_config(argv) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("ferryd: {}", ferry_util::error_line(&e));
                std::process::exit(1);
            }
        }
    };
    let args = match <Args as clap::Parser>::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => ferry_util::one_line_usage_error("ferryd", e),
    };
    init_logging(if args.quiet { None } else { Some(args.verbose) });
    if let Some(Command::GenCert { cert, key, name }) = &args.command {
        let mut names = name.clone();
        if names.is_empty() {
            names = vec!["localhost".into(), "127.0.0.1".into()];
            if let Ok(h) = rustix::system::uname().nodename().to_str() {
                names.push(h.to_string());
            }
        }
        match ferry_server::tls::gen_cert(cert, key, &names) {
            Ok(fp) => {
                println!("{fp}");
                eprintln!(
                    "ferryd: wrote {} and {} for {}; clients: ferry mount --tls-fingerprint {fp} ...",
                    cert.display(),
                    key.display(),
                    names.join(", ")
                );
                return;
            }
            Err(e) => {
                eprintln!("ferryd: {e}");
                std::process::exit(1);
            }
        }
    }
    if let Err(e) = run(args) {
        eprintln!("ferryd: {}", ferry_util::error_line(e.as_ref()));
        std::process::exit(1);
    }
}

/// `None`: quiet (warnings only); `Some(n)`: -v count.
fn init_logging(verbose: Option<u8>) {
    let default = match verbose {
        None => "warn",
        Some(0) => "info",
        Some(1) => "debug",
        Some(_) => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a log file or journald gets plain text.
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

fn run(args: Args) -> anyhow::Result<()> {
    let Some(export) = args.export.clone() else {
        anyhow::bail!("--export DIR is required");
    };
    let meta = std::fs::metadata(&export)
        .with_context(|| format!("cannot export {}: check the path", export.display()))?;
    anyhow::ensure!(
        meta.is_dir(),
        "cannot export {}: not a directory",
        export.display()
    );
    let (tls, certificate) = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => {
            let (cfg, cert) = ferry_server::tls::server_config(c, k, args.client_ca.as_deref())?;
            (Some(cfg), Some(cert))
        }
        _ => (None, None),
    };
    let token = args
        .token_file
        .as_deref()
        .map(ferry_util::read_token_file)
        .transpose()?;
    if !args.listen.ip().is_loopback() && tls.is_none() && token.is_none() && !args.insecure {
        anyhow::bail!(
            "refusing to serve {} on {} without encryption or authentication: add --tls-cert/--tls-key and/or --token-file, or --insecure on a network you trust",
            export.display(),
            args.listen
        );
    }
    let kib = args.chunk_size;
    anyhow::ensure!(
        (4..=16 * 1024).contains(&kib),
        "--chunk-size {kib} KiB is out of range: use 4 to 16384"
    );
    let config = ServerConfig {
        export: export.clone(),
        chunk_size: kib * 1024,
        max_inflight: args.max_inflight.max(1),
        max_connections: args.max_connections.max(1),
        max_handshakes: args.max_handshakes.max(1),
        max_handshakes_per_address: args.max_handshakes_per_address.max(1),
        memory_budget: args.memory_budget.max(1) << 20,
        idle_timeout: std::time::Duration::from_secs(args.idle_timeout.max(1)),
        tls: tls.clone().map(Current::new),
        token: token.map(Current::new),
        metrics: args.metrics,
        max_compression_level: args.max_compression_level.0,
        ..ServerConfig::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ferryd")
        // File reads run on the blocking pool: enough threads to keep an NVMe queue busy,
        // few enough that their stacks and buffers stay a bounded cost.
        .max_blocking_threads(32)
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        // Before the first connection: SIGHUP's default would end ferryd.
        if let Ok(hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            let again = ReadAgain {
                certificate: certificate.clone(),
                client_ca: args.client_ca.clone().zip(config.tls.clone()),
                token: args.token_file.clone().zip(config.token.clone()),
            };
            tokio::spawn(reload_on_sighup(hup, again));
        }
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| {
                format!(
                    "cannot listen on {}: is another ferryd running there?",
                    args.listen
                )
            })?;
        let addr = listener.local_addr()?;
        if let Some(pf) = &args.port_file {
            // Written atomically so a watcher never reads a half-written address.
            let tmp = pf.with_extension("tmp");
            std::fs::write(&tmp, format!("{addr}\n"))
                .and_then(|_| std::fs::rename(&tmp, pf))
                .with_context(|| format!("cannot write --port-file {}", pf.display()))?;
        }
        tracing::info!(
            "listening on {addr}, exporting {} read-only ({}, {})",
            export.display(),
            match &certificate {
                Some(c) if args.client_ca.is_some() => {
                    format!(
                        "TLS with client certificates, certificate {}",
                        c.fingerprint()
                    )
                }
                Some(c) => format!("TLS, certificate {}", c.fingerprint()),
                None => "plain TCP".to_string(),
            },
            if config.token.is_some() {
                "token required"
            } else {
                "no token"
            }
        );
        ferry_server::run(listener, config, shutdown_signal()).await?;
        tracing::info!("stopped");
        anyhow::Ok(())
    })
}

/// What SIGHUP reads again, each with where connections find it.
struct ReadAgain {
    certificate: Option<Arc<ferry_server::tls::Certificate>>,
    client_ca: Option<(PathBuf, Current<Arc<rustls::ServerConfig>>)>,
    token: Option<(PathBuf, Current<ferry_server::Token>)>,
}

/// On each SIGHUP, reads the TLS certificate and key, the client CA and the token file again
/// (those ferryd was started with): connections from then on get what they hold, those open
/// keep theirs (a certificate renewed by certbot or an internal CA, a CA or token rotated,
/// without dropping a mount). A file that does not load is logged in one line and what was
/// read before stays. Without any of them there is nothing to read again; ferryd says so and
/// goes on.
async fn reload_on_sighup(mut hup: tokio::signal::unix::Signal, again: ReadAgain) {
    while hup.recv().await.is_some() {
        if let Some(c) = &again.certificate {
            match c.reload() {
                Ok(fp) => tracing::info!(
                    "SIGHUP: TLS certificate read again, now {fp}; new connections get it"
                ),
                Err(e) => tracing::error!(
                    "SIGHUP: cannot read the TLS certificate again: {e}; still presenting {}",
                    c.fingerprint()
                ),
            }
        }
        if let (Some((ca, tls)), Some(c)) = (&again.client_ca, &again.certificate) {
            match ferry_server::tls::config_presenting(c.clone(), Some(ca)) {
                Ok(cfg) => {
                    tls.set(cfg);
                    tracing::info!(
                        "SIGHUP: client CA {} read again; new connections' certificates are checked against it",
                        ca.display()
                    );
                }
                Err(e) => tracing::error!(
                    "SIGHUP: cannot read the client CA again: {e}; new connections are checked against the CA read before"
                ),
            }
        }
        if let Some((path, token)) = &again.token {
            match ferry_util::read_token_file(path) {
                Ok(t) => {
                    token.set(t);
                    tracing::info!(
                        "SIGHUP: --token-file {} read again; new connections need the token it holds",
                        path.display()
                    );
                }
                Err(e) => tracing::error!(
                    "SIGHUP: cannot read the token again: {}; new connections need the token read before",
                    ferry_util::error_line(&e)
                ),
            }
        }
        if again.certificate.is_none() && again.token.is_none() {
            tracing::info!(
                "SIGHUP: no TLS certificate or token file to read again; serving as before"
            );
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers, run until killed.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

/// `--max-compression-level`: a zstd level, or `None` for `off`.
#[derive(Debug, Clone, Copy)]
struct MaxLevel(Option<i8>);

fn parse_max_level(s: &str) -> Result<MaxLevel, String> {
    if s == "off" {
        return Ok(MaxLevel(None));
    }
    match s.parse::<i8>() {
        Ok(l) if ferry_proto::Compression::Zstd(l).is_valid() => Ok(MaxLevel(Some(l))),
        _ => Err(format!(
            "{s:?} is not a zstd level: give -7 to 22, or off to offer no zstd"
        )),
    }
}
