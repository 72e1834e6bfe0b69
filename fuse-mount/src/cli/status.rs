//! `ferry status PATH [--json] [--watch]`: the state of a mount (asked through its root's
//! status xattr) or of a cache directory (its `.ferry/status.json`), printed for people,
//! as JSON, or followed until the mirror ends.
//!
//! A `running` status whose process is gone is reported as `interrupted`; a mount whose
//! process is gone (ENOTCONN) is an error that says how to unmount it.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context};
use ferry_cache::{find_state, State, Status};
use ferry_util::human_bytes;

use super::render::{progress_bar, progress_line, rate_eta_files};

/// How often `--watch` reads the status.
const POLL: Duration = Duration::from_millis(500);
/// How often `--watch` prints a line when the output is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// Whether process `pid` still exists (a `running` status whose writer is gone was
/// interrupted).
fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The status a ferry mount serves at its root (see [`ferry_mount::fuse::STATUS_XATTR`]): `None`
/// when `path` is not a ferry mount.
///
/// # Errors
/// A ferry mount whose process is gone.
fn mount_status(path: &Path) -> anyhow::Result<Option<Status>> {
    let mut buf = vec![0u8; 256 << 10];
    match rustix::fs::getxattr(path, ferry_mount::fuse::STATUS_XATTR, &mut buf[..]) {
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
fn read_status(path: &Path, state_dir: Option<&Path>) -> anyhow::Result<Status> {
    if let Some(s) = mount_status(path)? {
        return Ok(s);
    }
    let Some(meta) = find_state(path, state_dir) else {
        bail!(
            "{} is not a ferry mount and no ferry state was found for it{}: give a mount point or the directory of a `ferry mirror` or `--cache-dir` (and its --state-dir if one was given)",
            path.display(),
            state_dir.map_or(String::new(), |d| format!(" in {}", d.display()))
        );
    };
    let mut s = Status::read(&meta).with_context(|| {
        format!(
            "{}: no status yet (no mirror has run there)",
            meta.join("status.json").display()
        )
    })?;
    if s.state == State::Running && !pid_alive(s.pid) {
        s.state = State::Interrupted;
    }
    Ok(s)
}

/// `ferry status PATH [--json] [--watch]`: PATH is a mount point or a cache directory.
///
/// # Errors
/// PATH is neither a ferry mount nor holds ferry state; with `--watch`, the mirror ended
/// incomplete.
pub fn status(
    path: &Path,
    state_dir: Option<&Path>,
    json: bool,
    watch: bool,
) -> anyhow::Result<()> {
    if watch {
        return watch_status(path, state_dir, json);
    }
    let s = read_status(path, state_dir)?;
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
fn watch_status(path: &Path, state_dir: Option<&Path>, json: bool) -> anyhow::Result<()> {
    let bar = (!json && std::io::stdout().is_terminal()).then(|| {
        progress_bar(
            indicatif::ProgressDrawTarget::stdout(),
            "{bytes:>10}/{total_bytes:<10} {bar:30} {percent:>3}% {msg}",
        )
    });
    // Long enough ago that the first status is printed at once.
    let mut last_line = std::time::Instant::now() - LINE_EVERY * 2;
    loop {
        let s = read_status(path, state_dir)?;
        if s.state == State::Mounted {
            bail!(
                "{} is a mount without --mirror: nothing to watch (`ferry status {}` shows its counters)",
                path.display(),
                path.display()
            );
        }
        let running = s.state == State::Running;
        let msg = rate_eta_files(&s);
        if let Some(b) = &bar {
            b.set_length(s.bytes_total);
            b.set_position(s.bytes_done);
            b.set_message(msg.clone());
        } else if !running || last_line.elapsed() >= LINE_EVERY {
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
            if s.state == State::Complete {
                return Ok(());
            }
            bail!(
                "the mirror ended {} with {} error(s): see `ferry status {}`",
                s.state,
                s.error_count,
                path.display()
            );
        }
        std::thread::sleep(POLL);
    }
}

/// The human-readable report of `ferry status PATH`.
/// The `compress` line: the codec in use, what was asked for, the ratio lately and (auto)
/// the link it measured.
fn print_compression(k: &ferry_cache::progress::SchedulerStatus) {
    if k.compression.is_empty() {
        return; // written by a ferry before compression was reported
    }
    println!(
        "  compress {}{}, ratio {:.2} lately{}",
        k.compression,
        if k.compression_choice == "auto" {
            " (chosen by auto)"
        } else {
            ""
        },
        k.compression_ratio,
        if k.link_limits == Some(false) {
            format!(
                "; the link carried {}/s on the wire and was not the limit lately",
                human_bytes(k.link_bytes_per_sec)
            )
        } else if k.link_bytes_per_sec > 0 {
            format!(
                "; link measured at {}/s on the wire",
                human_bytes(k.link_bytes_per_sec)
            )
        } else {
            String::new()
        }
    );
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
        let f = &s.faults;
        println!(
            "  network {} streams connected{}; {} reconnects, {} server restarts",
            f.live_streams,
            if f.live_streams == 0 {
                " (server unreachable: stat answers from what it last said, reads from the local copy only)"
            } else {
                ""
            },
            f.reconnects,
            f.server_restarts
        );
        if let Some(k) = &s.scheduler {
            let ms = |us: u64| us as f64 / 1000.0;
            println!(
                "  sched   base RTT {:.2} ms, queueing {:.2} ms (target {:.2} ms); background window {} in pieces of {}{}",
                ms(k.base_rtt_us),
                ms(k.queue_delay_us),
                ms(k.target_us),
                human_bytes(k.background_window),
                human_bytes(k.piece_size),
                if k.readers_active { ", readers active" } else { "" }
            );
            if k.background_pace > 0 {
                println!(
                    "          CPU short for readers (their threads waited {:.0} % of the time): the mirror paced at {}/s",
                    k.cpu_wait_permille.unwrap_or(0) as f64 / 10.0,
                    human_bytes(k.background_pace)
                );
            }
            println!(
                "          received for readers {}, read-ahead {}, the mirror {}",
                human_bytes(k.demand_bytes),
                human_bytes(k.prediction_bytes),
                human_bytes(k.background_bytes)
            );
            print_compression(k);
        }
        if m.files_given_at_open > 0 {
            println!(
                "  kernel  {} small files fetched ahead given to the page cache at their open",
                m.files_given_at_open
            );
        }
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
            "  mirror  {}{}{}",
            s.state,
            m.bwlimit
                .map_or_else(String::new, |b| format!(", capped at {}/s", human_bytes(b))),
            m.rescan_secs
                .map_or_else(String::new, |r| format!(", again {r} s after each pass"))
        );
        if s.state == State::Mounted {
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
            if s.state == State::Running {
                " so far"
            } else {
                ""
            }
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
    if s.state == State::Running {
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
    if let Some(k) = &s.scheduler {
        print_compression(k);
    }
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
