//! The arguments checked and turned into the library's plain config structs
//! ([`MountConfig`], [`ClientConfig`], [`MirrorOptions`]); tests and other front ends build
//! the same structs without clap.

use std::time::Duration;

use ferry_client::{ClientConfig, PrefetchConfig};
use ferry_mount::fs::FsConfig;
use ferry_mount::mount::MountConfig;
use ferry_mount::target::Target;

use super::args::{MirrorArgs, MountArgs, NetArgs, SecurityArgs};
use super::mirror::MirrorOptions;

/// `ferry mirror`'s arguments, checked, as the options of [`super::mirror::run`].
///
/// # Errors
/// A value out of range, a bad remote, unreadable TLS or token files: one line each.
pub fn mirror_options(a: MirrorArgs) -> anyhow::Result<MirrorOptions> {
    let (target, client) = connection(&a.remote, &a.net, "mirror")?;
    anyhow::ensure!((1..=4096).contains(&a.files), "--files must be 1 to 4096");
    Ok(MirrorOptions {
        target,
        dir: a.dir,
        state: ferry_cache::StateBase::choose(a.state_dir.as_deref())?,
        client,
        engine: ferry_cache::MirrorConfig {
            files_in_flight: a.files,
            chunk_memory: a.chunk_memory.max(1) << 20,
            verify: !a.no_verify,
            checksum: a.checksum,
            owners: owners(a.numeric_ids, a.chown.as_deref())?,
            delete: a.delete,
            xattrs: !a.no_xattrs,
            bwlimit: a.bwlimit,
            ..ferry_cache::MirrorConfig::default()
        },
        progress: !a.quiet,
        metrics: a.net.metrics,
    })
}

/// How `ferry mirror` sets owners, from `--numeric-ids` and `--chown USER:GROUP`.
fn owners(numeric: bool, chown: Option<&str>) -> anyhow::Result<ferry_cache::Owners> {
    use nix::unistd::{Group, User};
    let Some(spec) = chown else {
        return Ok(if numeric {
            ferry_cache::Owners::Numeric
        } else {
            ferry_cache::Owners::Auto
        });
    };
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, g),
        None => (spec, ""),
    };
    anyhow::ensure!(
        !user.is_empty() || !group.is_empty(),
        "--chown {spec}: give USER, USER:GROUP or :GROUP"
    );
    let uid = match user {
        "" => None,
        u => Some(match u.parse::<u32>() {
            Ok(n) => n,
            Err(_) => User::from_name(u)
                .ok()
                .flatten()
                .ok_or_else(|| anyhow::anyhow!("--chown {spec}: no user named {u} here"))?
                .uid
                .as_raw(),
        }),
    };
    let gid = match group {
        "" => None,
        g => Some(match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => Group::from_name(g)
                .ok()
                .flatten()
                .ok_or_else(|| anyhow::anyhow!("--chown {spec}: no group named {g} here"))?
                .gid
                .as_raw(),
        }),
    };
    Ok(ferry_cache::Owners::Chown { uid, gid })
}

/// The remote and the connection settings `mount` and `mirror` share, checked.
pub fn connection(remote: &str, n: &NetArgs, what: &str) -> anyhow::Result<(Target, ClientConfig)> {
    let (streams, chunk_kib, compression, connect_timeout) = (
        n.streams,
        n.chunk_size,
        if n.no_compression {
            ferry_client::CompressionChoice::Fixed(ferry_proto::Compression::None)
        } else {
            n.compression
        },
        n.connect_timeout,
    );
    let (faults, security) = (&n.faults, &n.security);
    let target = Target::parse(remote)?;
    let s3 = if target.s3 {
        anyhow::ensure!(
            !security.tls
                && security.tls_fingerprint.is_none()
                && security.cert.is_none()
                && security.token_file.is_none(),
            "{remote}: --tls, --tls-fingerprint, --cert and --token-file are for ferryd; an S3 source uses https endpoints (--ca to trust a CA) and AWS credentials"
        );
        let opts = ferry_client::s3::S3Options {
            endpoints: n.s3.endpoint.clone(),
            region: n.s3.region.clone(),
            profile: n.s3.profile.clone(),
            addressing: n.s3.s3_addressing.as_deref().map(|a| match a {
                "virtual" => ferry_client::s3::Addressing::VirtualHost,
                _ => ferry_client::s3::Addressing::Path,
            }),
            ca_file: security.ca.clone(),
            metadata: match n.s3.s3_metadata.as_deref() {
                Some("on") => ferry_client::s3::Metadata::On,
                Some("off") => ferry_client::s3::Metadata::Off,
                _ => ferry_client::s3::Metadata::Auto,
            },
        };
        Some(
            ferry_client::s3::S3Config::resolve(&target.host, &opts, &ferry_client::s3::ProcessEnv)
                .map_err(|e| anyhow::anyhow!("{remote}: {e}"))?,
        )
    } else {
        anyhow::ensure!(
            n.s3.endpoint.is_none()
                && n.s3.region.is_none()
                && n.s3.profile.is_none()
                && n.s3.s3_addressing.is_none()
                && n.s3.s3_metadata.is_none(),
            "--endpoint, --region, --profile, --s3-addressing and --s3-metadata are for s3://BUCKET sources"
        );
        None
    };
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
        tls: if s3.is_some() {
            None
        } else {
            tls_client(security)?
        },
        token: security
            .token_file
            .as_deref()
            .map(ferry_util::read_token_file)
            .transpose()?,
        s3,
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
        Some(f) => {
            Some(ferry_proto::auth::parse_fingerprint(f).map_err(|e| anyhow::anyhow!("{e}"))?)
        }
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

pub fn mount_config(a: &MountArgs) -> anyhow::Result<MountConfig> {
    let (target, client) = connection(&a.remote, &a.net, "mount")?;
    anyhow::ensure!(
        a.attr_timeout.is_finite() && a.attr_timeout >= 0.0,
        "--attr-timeout must be a number of seconds ≥ 0"
    );
    anyhow::ensure!(
        a.open_timeout.is_finite() && a.open_timeout >= 0.0,
        "--open-timeout must be a number of seconds ≥ 0"
    );
    let max_window = a.max_window.max(1) << 20;
    Ok(MountConfig {
        target,
        mountpoint: a.mountpoint.clone(),
        client,
        fs: FsConfig {
            attr_ttl: Duration::from_secs_f64(a.attr_timeout),
            open_ttl: Duration::from_secs_f64(a.open_timeout),
            strict: a.strict,
            idmap_names: a.idmap == "names",
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
        state_dir: a.state_dir.clone(),
        mirror: a.mirror,
        bwlimit: a.bwlimit,
        rescan: a.rescan.map(std::time::Duration::from_secs),
        metrics: a.net.metrics,
        ..MountConfig::default()
    })
}
