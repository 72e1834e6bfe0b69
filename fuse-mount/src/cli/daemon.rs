//! `ferry mount`: with `-f` the mount runs in the foreground; otherwise the process forks,
//! the child mounts and serves, and the parent returns once the mount is ready (exit 0) or
//! failed (the child's one-line error, exit 1), like sshfs and mount(8) expect.
//!
//! What the parent reads from the pipe decides its exit:
//! - `ok`: exits 0;
//! - an error message: prints it, exits 1 (the child exits 1 without printing it, so the
//!   error appears once);
//! - nothing (the child died): says the mount process exited during start-up, exits 1.
//!
//! Invariants: the fork happens before any thread exists (logging and the mount's runtime
//! start in the child); the parent is released exactly once, by the child writing `ok` or
//! its error into a pipe and closing it (or dying: then the parent says so); the child
//! detaches from the terminal (setsid, stdio to /dev/null) once the parent has gone, and
//! from then on logs only to `--log-file`, if one was given.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;

use ferry_mount::mount::MountSession;

use super::args::MountArgs;
use super::config::mount_config;
use super::logging::init_logging_at;

/// What the child writes into the pipe when the mount is ready.
const READY: &str = "ok";

/// Runs `ferry mount`: until unmounted in the foreground (`-f`), or until the mount is
/// ready with the mount left serving in a background process.
///
/// # Errors
/// Bad arguments, or the mount failed to start (reported by the child), as one line.
pub fn mount(args: MountArgs) -> anyhow::Result<()> {
    let cfg = mount_config(&args)?;
    let log_level = if args.quiet { "warn" } else { "info" };
    if args.foreground {
        init_logging_at(args.verbose, args.log_file.as_ref(), log_level)?;
        MountSession::start(cfg)?.wait()?;
        return Ok(());
    }
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
        if msg == READY {
            std::process::exit(0);
        }
        if msg.is_empty() {
            msg = "the mount process exited during start-up (run with -f to see why)".into();
        }
        anyhow::bail!("{msg}");
    }
    drop(rd);
    // Closing the pipe's write end (after READY or an error) is what releases the parent.
    let mut report = std::fs::File::from(wr);
    // SAFETY: setsid has no memory effects; it detaches from the terminal's session.
    unsafe { libc::setsid() };
    let started = init_logging_at(args.verbose, args.log_file.as_ref(), log_level)
        .and_then(|()| Ok(MountSession::start(cfg)?));
    let session = match started {
        Ok(s) => s,
        Err(e) => {
            // The parent prints it; printing here too would show the error twice.
            let _ = report.write_all(ferry_util::error_line(e.as_ref()).as_bytes());
            drop(report);
            std::process::exit(1);
        }
    };
    let _ = report.write_all(READY.as_bytes());
    drop(report);
    detach_stdio();
    session.wait()?;
    Ok(())
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
