//! The status a mount reports: the JSON of `ferry status MOUNTPOINT` (served as the root's
//! status xattr) and the `--metrics` page, both from one [`ferry_cache::Status`].
//!
//! With `mirror` the state and the progress counters are the background mirror's
//! ([`MirrorSupervisor::status`]); without it the state is always
//! [`ferry_cache::State::Mounted`]. The `mount` section adds the reads and the local copy;
//! the `scheduler` section is always the mount's own pool (readers and mirror share it).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use ferry_cache::{
    LocalCopy, MirrorSupervisor, MountStatus, Progress, SchedulerStatus, State, Status,
};
use ferry_client::Client;

use super::mountpoint::absolute;
use super::MountConfig;
use crate::fs::Fs;

/// Produces the mount's current status.
pub(crate) type StatusSource = Arc<dyn Fn() -> Status + Send + Sync>;

/// The status source of a mount configured by `cfg`, labelled `label` (HOST:PORT).
pub(crate) fn source(
    cfg: &MountConfig,
    label: String,
    client: Client,
    fs: Arc<Fs>,
    local: Option<Arc<LocalCopy>>,
    mirror: MirrorSupervisor,
) -> StatusSource {
    // Without a mirror, the counters are the mount's own (its client's faults).
    let mounted = Arc::new(Progress::default());
    mounted.attach_client(&client);
    let mountpoint = absolute(&cfg.mountpoint).display().to_string();
    let cache_dir = cfg
        .cache_dir
        .as_ref()
        .map(|d| absolute(d).display().to_string());
    let (with_mirror, bwlimit) = (cfg.mirror, cfg.bwlimit);
    let rescan_secs = cfg.rescan.map(|d| d.as_secs());
    Arc::new(move || {
        let mut s = if with_mirror {
            mirror.status()
        } else {
            mounted.snapshot(State::Mounted, &label)
        };
        s.scheduler = Some(SchedulerStatus::of(&client));
        let c = client.counters();
        let l = local.as_deref();
        let count = |f: fn(&LocalCopy) -> u64| l.map_or(0, f);
        s.mount = Some(MountStatus {
            mountpoint: mountpoint.clone(),
            cache_dir: cache_dir.clone(),
            mirror: with_mirror,
            bwlimit,
            rescan_secs,
            wire_bytes: c.wire_bytes.load(Relaxed),
            decoded_bytes: c.decoded_bytes.load(Relaxed),
            chunks_served_locally: count(|l| l.served.load(Relaxed)),
            chunks_stored: count(|l| l.stored.load(Relaxed)),
            store_errors: count(|l| l.store_errors.load(Relaxed)),
            files_verified_by_reads: count(|l| l.verified.load(Relaxed)),
            passthrough_opens: fs.passthrough_opens(),
            files_given_at_open: fs.given_at_open(),
        });
        s
    })
}
