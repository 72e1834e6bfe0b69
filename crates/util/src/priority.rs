//! Lower CPU and I/O priority for the calling thread, for work that must not compete with
//! readers: the mirror's background threads and the chunk store's write-back threads.
//!
//! On Linux both priorities are per thread: `setpriority(PRIO_PROCESS, tid, ..)` changes
//! the nice value of that one thread (not of the process), and `ioprio_set(IOPRIO_WHO_PROCESS,
//! tid, ..)` its I/O priority, which the block layer's schedulers (BFQ, mq-deadline) use to
//! order the requests it submits (direct writes and reads, `fdatasync` write-back, reads of
//! files not in the page cache). Lowering is best effort: a failure (a container without permission to change
//! priorities, another OS) is logged once at debug level and the thread runs on as it was.

use std::sync::atomic::{AtomicBool, Ordering};

/// The nice value background threads run at (0 is normal, 19 the lowest): the scheduler
/// gives a nice-10 thread about a tenth of the CPU time of a normal one it competes with,
/// and all of it when nothing else wants the CPU.
pub const BACKGROUND_NICE: i32 = 10;

/// The I/O priority background threads run at: the idle class, whose requests the block
/// layer's schedulers (mq-deadline, BFQ) dispatch only when no request of a higher class is
/// waiting (mq-deadline still serves them after `prio_aging_expire`, 10 s by default, so
/// they are delayed, never starved). The best-effort levels alone would not do: mq-deadline
/// orders by class only, so a best-effort level 7 read waits no less than a reader's.
pub const BACKGROUND_IOPRIO: u32 = IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT;

/// `IOPRIO_CLASS_IDLE` (linux/ioprio.h): served when nothing else is.
const IOPRIO_CLASS_IDLE: u32 = 3;
/// `IOPRIO_CLASS_SHIFT`: the class sits above 13 bits of level/data.
const IOPRIO_CLASS_SHIFT: u32 = 13;
/// `IOPRIO_WHO_PROCESS`: the target is a thread id.
const IOPRIO_WHO_PROCESS: i32 = 1;

/// Whether a failure was logged already (once per process is enough).
static LOGGED: AtomicBool = AtomicBool::new(false);

/// What [`lower_current_thread`] managed to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lowered {
    /// The thread's nice value is now [`BACKGROUND_NICE`] (or was already at least that).
    pub cpu: bool,
    /// The thread's I/O priority is now [`BACKGROUND_IOPRIO`] (the idle class).
    pub io: bool,
}

/// Lowers the calling thread's CPU priority to nice [`BACKGROUND_NICE`] and its I/O
/// priority to the idle class ([`BACKGROUND_IOPRIO`]). Never fails: what could not be
/// done is logged once (debug) and reported in the result. Call it first thing in a thread
/// that does background work; it affects that thread only (and threads it starts later).
pub fn lower_current_thread() -> Lowered {
    let cpu = lower_cpu();
    let io = lower_io();
    if let (Err(e), _) | (_, Err(e)) = (&cpu, &io) {
        if !LOGGED.swap(true, Ordering::Relaxed) {
            tracing::debug!("cannot lower the priority of background threads: {e}");
        }
    }
    Lowered {
        cpu: cpu.is_ok(),
        io: io.is_ok(),
    }
}

/// The calling thread's nice value.
///
/// # Errors
/// `getpriority` failed (not expected for the calling thread).
pub fn current_thread_nice() -> std::io::Result<i32> {
    #[cfg(target_os = "linux")]
    {
        let tid = current_tid();
        // getpriority may legitimately return -1: errno tells an error apart.
        // SAFETY: plain system calls on the calling thread's id; errno is thread-local.
        unsafe {
            *libc::__errno_location() = 0;
            let n = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
            if n == -1 && *libc::__errno_location() != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(n)
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

/// The calling thread's I/O priority, as `ioprio_get` returns it (class << 13 | level).
///
/// # Errors
/// `ioprio_get` failed.
pub fn current_thread_ioprio() -> std::io::Result<u32> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: ioprio_get only reads the priority of the given thread.
        let r = unsafe {
            libc::syscall(
                libc::SYS_ioprio_get,
                IOPRIO_WHO_PROCESS,
                current_tid() as libc::c_long,
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(r as u32)
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

/// CPU time the calling thread has used (user and system): what a piece of work cost,
/// unlike wall time, whatever preemption it met. `None` where it cannot be read.
pub fn thread_cpu_time() -> Option<std::time::Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (r == 0).then(|| std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

#[cfg(target_os = "linux")]
fn current_tid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

fn lower_cpu() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // Raising a nice value needs no privilege; lowering it back would. Never raise
        // the priority of a thread already below BACKGROUND_NICE.
        if current_thread_nice()? >= BACKGROUND_NICE {
            return Ok(());
        }
        // SAFETY: changes the nice value of the calling thread only.
        let r = unsafe {
            libc::setpriority(
                libc::PRIO_PROCESS,
                current_tid() as libc::id_t,
                BACKGROUND_NICE,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

fn lower_io() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: changes the I/O priority of the calling thread only.
        let r = unsafe {
            libc::syscall(
                libc::SYS_ioprio_set,
                IOPRIO_WHO_PROCESS,
                current_tid() as libc::c_long,
                BACKGROUND_IOPRIO as libc::c_long,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn thread_cpu_time_counts_work_not_sleep() {
        let t0 = thread_cpu_time().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = thread_cpu_time().unwrap() - t0;
        assert!(slept < std::time::Duration::from_millis(20), "{slept:?}");
        let mut x = 0u64;
        let wall = std::time::Instant::now();
        while thread_cpu_time().unwrap() - t0 < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(x > 0 && wall.elapsed() >= std::time::Duration::from_millis(20));
    }

    #[test]
    fn lowers_only_the_calling_thread() {
        let before = current_thread_nice().expect("getpriority");
        let (lowered, nice, ioprio) = std::thread::spawn(|| {
            let l = lower_current_thread();
            (l, current_thread_nice(), current_thread_ioprio())
        })
        .join()
        .expect("thread");
        assert!(lowered.cpu, "setpriority on the thread failed");
        assert_eq!(nice.expect("getpriority"), before.max(BACKGROUND_NICE));
        if lowered.io {
            assert_eq!(ioprio.expect("ioprio_get"), BACKGROUND_IOPRIO);
        }
        // This thread (and so the process) kept its priority.
        assert_eq!(current_thread_nice().expect("getpriority"), before);
    }

    #[test]
    fn lowering_twice_is_harmless() {
        std::thread::spawn(|| {
            lower_current_thread();
            let once = current_thread_nice().expect("getpriority");
            assert!(lower_current_thread().cpu);
            assert_eq!(current_thread_nice().expect("getpriority"), once);
        })
        .join()
        .expect("thread");
    }
}
