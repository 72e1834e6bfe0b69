//! The command line of `ferry` (clap derive): `ferry mount`, `ferry mirror`,
//! `ferry status`, and the options they share. Parsing only; [`super::config`] checks the
//! values and builds the library's config structs.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// ferry: a remote directory at network speed.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
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
pub struct MirrorArgs {
    /// Server and directory: HOST[:PORT][:/PATH] (default port 7070).
    pub remote: String,
    /// Local directory to fill (created if missing). It holds exactly the source: the
    /// state (journal, status) goes in the state directory.
    pub dir: PathBuf,
    /// Where the state of destinations goes, one folder per destination (default:
    /// /var/lib/ferry as root, else $XDG_STATE_HOME/ferry or ~/.local/state/ferry).
    #[arg(long, value_name = "DIR", env = "FERRY_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub net: NetArgs,
    /// Files copied at once (each has a request in flight: many are needed to fill a
    /// long link with small files).
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub files: usize,
    /// Memory for chunks in flight, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub chunk_memory: usize,
    /// Cap on the transfer rate, bytes per second on the wire, with K, M, G (powers of
    /// 1024), e.g. 100M.
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub bwlimit: Option<u64>,
    /// Do not compare each file's BLAKE3 with the server's.
    #[arg(long)]
    pub no_verify: bool,
    /// Verify every file already complete in DIR again, against the server's BLAKE3 now
    /// (otherwise a file verified by an earlier run is trusted while its local inode,
    /// size, mtime and ctime are still the ones recorded then).
    #[arg(long, conflicts_with = "no_verify")]
    pub checksum: bool,
    /// Owners by the server's numbers, not mapped by name (when run as root; otherwise
    /// owners are left alone).
    #[arg(long)]
    pub numeric_ids: bool,
    /// Give everything this owner and/or group (names or numbers): USER, USER:GROUP or
    /// :GROUP; the other, if not given, as the source's (mapped by name).
    #[arg(long, value_name = "USER:GROUP", conflicts_with = "numeric_ids")]
    pub chown: Option<String>,
    /// Remove local files, directories and links the server no longer has (each is named
    /// in the summary).
    #[arg(long)]
    pub delete: bool,
    /// Do not copy extended attributes and POSIX ACLs.
    #[arg(long)]
    pub no_xattrs: bool,
    /// No progress output (a bar on a terminal; otherwise a plain line every 5 s).
    #[arg(short, long)]
    pub quiet: bool,
    /// Write the log here instead of stderr.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// A ferry mount point, or a directory filled by `ferry mirror` or `--cache-dir`.
    pub path: PathBuf,
    /// The state directory the mirror was given (default: this user's, then
    /// /var/lib/ferry).
    #[arg(long, value_name = "DIR", env = "FERRY_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Machine-readable output: the status object (schema in docs/CONFIGURATION.md).
    #[arg(long)]
    pub json: bool,
    /// Follow a running mirror until it ends: a progress bar on a terminal, a line every
    /// 5 s otherwise (one JSON object per line with --json). Exit status 0 when complete.
    #[arg(long)]
    pub watch: bool,
}

#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// Server and directory: HOST[:PORT][:/PATH] (default port 7070).
    pub remote: String,
    /// Empty directory to mount on.
    pub mountpoint: PathBuf,
    #[command(flatten)]
    pub net: NetArgs,
    /// Largest read-ahead window of a sequential reader, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub max_window: u64,
    /// Memory for chunks in flight and read ahead, in MiB (also caps the read-ahead window).
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub chunk_memory: usize,
    /// Seconds the kernel caches attributes and names.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub attr_timeout: f64,
    /// Close-to-open: an open takes a file's version from what the server said less than
    /// SECS ago (e.g. a listing fetched ahead of a tree copy), else asks the server first;
    /// changed attributes and pages are then dropped from the kernel. 0: every open asks.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub open_timeout: f64,
    /// A handle reads one version of its file only: any change on the server while it is
    /// open fails its reads with EIO (for copies where any change must be noticed).
    #[arg(long)]
    pub strict: bool,
    /// Owners as the mount shows them: `none`, the server's numbers; `names`, mapped by
    /// name like tar and rsync (a user or group the server names is shown as the local one
    /// of that name; names unknown here keep their numbers).
    #[arg(long, value_name = "MAP", default_value = "none", value_parser = ["none", "names"])]
    pub idmap: String,
    /// Allow other users (e.g. postgres, oracle) to use the mount. Non-root users need
    /// `user_allow_other` in /etc/fuse.conf.
    #[arg(long)]
    pub allow_other: bool,
    /// Stay in the foreground.
    #[arg(short, long)]
    pub foreground: bool,
    /// FUSE worker threads.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub threads: usize,
    /// Kernel readahead for the mount, in KiB.
    #[arg(long, value_name = "KIB", default_value_t = 8192)]
    pub read_ahead_kb: u32,
    /// Write the log here (in the background the log is otherwise discarded).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Keep a local copy here: every chunk read through the mount is written into it, and
    /// read from it (not the network) afterwards, also after a remount. Same layout and
    /// state as `ferry mirror`: DIR holds exactly the export, the state goes in the state
    /// directory.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Where the state of the local copy goes, one folder per cache directory (default:
    /// /var/lib/ferry as root, else $XDG_STATE_HOME/ferry or ~/.local/state/ferry).
    #[arg(long, value_name = "DIR", env = "FERRY_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Fill the local copy (--cache-dir) in the background with the whole export, while
    /// reads through the mount come first. Once a file is complete and verified, its opens
    /// are served from local disk. `ferry status MOUNTPOINT` shows the progress.
    #[arg(long, requires = "cache_dir")]
    pub mirror: bool,
    /// Cap the background mirror's transfer: bytes per second with K, M, G or T (powers of
    /// 1024), e.g. 100M. Reads through the mount are not capped.
    #[arg(long, value_name = "RATE", value_parser = parse_rate, requires = "mirror")]
    pub bwlimit: Option<u64>,
    /// Keep the local copy following the export: SECS seconds after the background mirror
    /// completes, it goes over the export again, fetching new and changed files; and again
    /// SECS seconds after each pass. Without it the mirror stops at its first complete pass.
    #[arg(long, value_name = "SECS", requires = "mirror", value_parser = clap::value_parser!(u64).range(1..))]
    pub rescan: Option<u64>,
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Less log output: warnings and errors only.
    #[arg(short, long, conflicts_with = "verbose")]
    pub quiet: bool,
}

/// How to reach the server (mount and mirror).
#[derive(Debug, clap::Args)]
pub struct NetArgs {
    /// TCP connections used together.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub streams: usize,
    /// Chunk size to request, in KiB (the server may choose smaller).
    #[arg(long, value_name = "KIB", default_value_t = 1024)]
    pub chunk_size: u32,
    /// How the server compresses what it sends: `auto` picks none, lz4 or a zstd level
    /// from the measured link, data and CPUs and keeps re-deciding; `zstd` (level 1),
    /// `zstd:LEVEL` (-7 to 22; the server may cap it), `lz4` or `none` fix it.
    #[arg(
        long,
        value_name = "auto|zstd[:LEVEL]|lz4|none",
        default_value = "auto"
    )]
    pub compression: ferry_client::CompressionChoice,
    /// The same as --compression none.
    #[arg(long, conflicts_with = "compression")]
    pub no_compression: bool,
    /// Seconds to wait for the server when connecting.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub connect_timeout: u64,
    #[command(flatten)]
    pub faults: FaultArgs,
    #[command(flatten)]
    pub security: SecurityArgs,
    #[command(flatten)]
    pub s3: S3Args,
    /// Serve Prometheus metrics (names ferry_*: bytes, chunks, compression, retries,
    /// checksum failures, streams, mirror progress, cache hits) on http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
}

/// Where an `s3://BUCKET[/PREFIX]` source is (mount and mirror). Credentials come from
/// AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the ~/.aws/credentials profile; --ca
/// trusts a CA for https endpoints.
#[derive(Debug, clap::Args)]
pub struct S3Args {
    /// The store's S3 endpoint(s), comma-separated gateways of one store: requests are
    /// spread over all, one failing is skipped (default: AWS_ENDPOINT_URL, the profile's
    /// endpoint_url, else AWS S3 in the region).
    #[arg(long, value_name = "URL[,URL…]")]
    pub endpoint: Option<String>,
    /// Region for request signatures (default: AWS_REGION, the profile's, else us-east-1).
    #[arg(long, value_name = "REGION")]
    pub region: Option<String>,
    /// The AWS profile in ~/.aws/credentials and ~/.aws/config (default: AWS_PROFILE, else
    /// default).
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Bucket in the URL path (path; the default with --endpoint) or in the host name
    /// (virtual; the default for AWS).
    #[arg(long, value_name = "path|virtual", value_parser = ["path", "virtual"])]
    pub s3_addressing: Option<String>,
    /// Modes, owners and times from objects' metadata as rclone, s3fs and s3cmd write it:
    /// auto (when one of the first 16 objects has some), on (a HEAD of every object
    /// listed), off (files 0644, directories 0755, the store's times, your user).
    #[arg(long, value_name = "auto|on|off", value_parser = ["auto", "on", "off"])]
    pub s3_metadata: Option<String>,
}

/// Encryption and authentication (mount and mirror).
#[derive(Debug, clap::Args)]
pub struct SecurityArgs {
    /// Connect with TLS. The server is checked with --ca or --tls-fingerprint (either
    /// implies --tls).
    #[arg(long)]
    pub tls: bool,
    /// Trust server certificates signed by this CA (PEM); the certificate must be for the
    /// host name or address given.
    #[arg(long, value_name = "FILE", conflicts_with = "tls_fingerprint")]
    pub ca: Option<PathBuf>,
    /// Trust exactly the server certificate with this fingerprint, as `ferryd gen-cert`
    /// prints it: SHA256:<base64>.
    #[arg(long, value_name = "SHA256:…")]
    pub tls_fingerprint: Option<String>,
    /// Client certificate for servers that require one (PEM; with --key).
    #[arg(long, value_name = "FILE", requires = "key")]
    pub cert: Option<PathBuf>,
    /// Private key of --cert (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Prove the token in this file when the server asks (the same file as ferryd's
    /// --token-file; the token itself never travels).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

/// How long to wait through faults (mount and mirror).
#[derive(Debug, clap::Args)]
pub struct FaultArgs {
    /// Seconds a read may wait for the server while it is unreachable (streams are
    /// reconnected meanwhile); then it fails with EIO (the mount) or an error (mirror).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub timeout: u64,
    /// Seconds a stream may receive nothing while requests wait on it before it is taken
    /// for dead, closed and reconnected (its requests go to other streams).
    #[arg(long, value_name = "SECS", default_value_t = 15)]
    pub stall_timeout: u64,
}

/// Why a `--bwlimit` rate was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    /// The last character is a letter other than K, M, G, T.
    #[error("--bwlimit {input}: unknown unit '{unit}' (use K, M, G or T, e.g. 100M)")]
    UnknownUnit {
        /// The rate as given.
        input: String,
        /// The letter found.
        unit: char,
    },
    /// Not a positive number (with an optional unit).
    #[error("--bwlimit {input}: not a rate; give bytes per second with K, M, G or T, e.g. 100M")]
    NotARate {
        /// The rate as given.
        input: String,
    },
}

/// Parses a rate such as `100M`, `1.5G`, `750K` or `12345` (bytes per second; K, M, G, T
/// are powers of 1024).
///
/// # Errors
/// [`RateError`]: an unknown unit, or not a positive number.
pub fn parse_rate(s: &str) -> Result<u64, RateError> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: u64 = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => {
                    return Err(RateError::UnknownUnit {
                        input: s.to_string(),
                        unit: c,
                    })
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok((v * mult as f64) as u64),
        _ => Err(RateError::NotARate {
            input: s.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("12345"), Ok(12345));
        assert_eq!(parse_rate("750K"), Ok(750 << 10));
        assert_eq!(parse_rate("100m"), Ok(100 << 20));
        assert_eq!(parse_rate(" 1.5G "), Ok(3 << 29));
        assert_eq!(parse_rate("2T"), Ok(2 << 40));
        assert_eq!(
            parse_rate("100X"),
            Err(RateError::UnknownUnit {
                input: "100X".into(),
                unit: 'X'
            })
        );
        for bad in ["", "M", "-1M", "0", "fast", "infG"] {
            assert!(
                matches!(parse_rate(bad), Err(RateError::NotARate { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
