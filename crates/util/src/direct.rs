//! Direct I/O for the local copy's bulk data: the mirror's chunks and the chunks readers
//! fetched are written, and complete files are read back for their BLAKE3, with `O_DIRECT`,
//! past the page cache.
//!
//! Why: the page cache is the machine's, shared with readers. Bulk data copied through it
//! costs a copy into freshly allocated pages, their write-back, and — worst — evicts what
//! readers (the database on this host, the kernel's read-ahead of the mount) had cached. A
//! mirror of terabytes would flush every other cache on the machine. Measured on the 2-core
//! VM of docs/MIRROR.md: writing 1 GiB through the page cache takes 3.5–4.4 s of CPU,
//! `O_DIRECT` 0.7 s of wall time. Data written this way is durable only after the syncer's
//! `fdatasync`/`syncfs`, as before (the device may still cache it).
//!
//! ferryd's background reads (a mirror's) likewise leave the server's page cache as it was:
//! [`pread_uncached`] reads with `RWF_DONTCACHE` (Linux 6.14+: pages the read brings in are
//! dropped once read; pages that were cached stay), else as a plain `pread`.
//!
//! How: the aligned body of each write goes through a second descriptor of the same open
//! file (`/proc/self/fd/N` reopened with `O_DIRECT`, so the same inode even if the path was
//! replaced since), from a per-thread buffer aligned to [`ALIGN`]; an unaligned tail (a
//! file's last chunk) goes through the ordinary descriptor. Where direct I/O is not possible
//! (a file system without it, an unaligned offset), the ordinary descriptor does all of it:
//! the result is the same bytes, only through the page cache. The first refusal is logged at
//! debug level; after a refused open the process does not try direct I/O again.

use std::cell::RefCell;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Offsets, lengths and buffers of direct I/O are multiples of this (the largest logical
/// block size in common use; a multiple of every smaller one).
pub const ALIGN: usize = 4096;

/// Bytes per direct read or write (a multiple of [`ALIGN`]): the aligned buffer each thread
/// keeps is this large.
const BLOCK: usize = 1 << 20;

/// A refusal of direct I/O was logged already.
static LOGGED: AtomicBool = AtomicBool::new(false);

/// A direct open was refused once (a file system without `O_DIRECT`, no `/proc`): the
/// process does not try again, rather than pay a failed open per chunk.
static NO_DIRECT: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Over-allocated by [`ALIGN`] so an aligned slice of any length up to its size fits.
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

fn refused(what: &str, e: &std::io::Error) {
    if !LOGGED.swap(true, Ordering::Relaxed) {
        tracing::debug!(
            "direct I/O not possible for the local copy ({what}: {e}); using the page cache"
        );
    }
}

/// `file` opened again, with `O_DIRECT` and the given access.
fn reopen_direct(file: &File, write: bool) -> std::io::Result<File> {
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// Runs `f` with an [`ALIGN`]-aligned buffer of `len` bytes (this thread's, reused).
fn with_aligned<T>(len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
    BUFFER.with(|b| {
        let mut b = b.borrow_mut();
        if b.len() < len + ALIGN {
            b.resize(len + ALIGN, 0);
        }
        let at = b.as_ptr().align_offset(ALIGN).min(ALIGN);
        f(&mut b[at..at + len])
    })
}

/// Writes all of `data` at `offset` of `file` (opened for writing), its aligned part with
/// direct I/O where possible (see the module docs).
///
/// # Errors
/// The write failed (disk full, I/O error): as `write_all_at` would.
pub fn write_all_at(file: &File, data: &[u8], offset: u64) -> std::io::Result<()> {
    let body = data.len() / ALIGN * ALIGN;
    if body == 0 || !offset.is_multiple_of(ALIGN as u64) || NO_DIRECT.load(Ordering::Relaxed) {
        return file.write_all_at(data, offset);
    }
    let direct = match reopen_direct(file, true) {
        Ok(d) => d,
        Err(e) => {
            NO_DIRECT.store(true, Ordering::Relaxed);
            refused("open", &e);
            return file.write_all_at(data, offset);
        }
    };
    // In blocks of at most BLOCK through this thread's aligned buffer (so a large chunk
    // size does not make every background thread keep a buffer of its size).
    let r = data[..body]
        .chunks(BLOCK)
        .zip((offset..).step_by(BLOCK))
        .try_for_each(|(part, at)| {
            with_aligned(part.len(), |buf| {
                buf.copy_from_slice(part);
                direct.write_all_at(buf, at)
            })
        });
    match r {
        Ok(()) => {}
        // Not for this file or this alignment after all: the same bytes, buffered.
        Err(e) if e.kind() == ErrorKind::InvalidInput => {
            refused("write", &e);
            return file.write_all_at(data, offset);
        }
        Err(e) => return Err(e),
    }
    if body < data.len() {
        file.write_all_at(&data[body..], offset + body as u64)?;
    }
    Ok(())
}

/// Whether `RWF_DONTCACHE` was refused once (an older kernel or a file system without it):
/// then every read is a plain `pread`.
static NO_DONTCACHE: AtomicBool = AtomicBool::new(false);

/// Reads into `buf`'s spare capacity at `offset` (like `pread`; appends what was read and
/// returns its length, 0 at the end of the file), without leaving pages it brought into
/// the page cache behind where the kernel can do that (`RWF_DONTCACHE`); else a plain read.
///
/// # Errors
/// The read failed.
pub fn pread_uncached(file: &File, buf: &mut Vec<u8>, offset: u64) -> std::io::Result<usize> {
    let spare = buf.capacity() - buf.len();
    if spare == 0 {
        return Ok(0);
    }
    let Ok(off) = libc::off_t::try_from(offset) else {
        return Err(ErrorKind::InvalidInput.into());
    };
    loop {
        let flags = if NO_DONTCACHE.load(Ordering::Relaxed) {
            0
        } else {
            libc::RWF_DONTCACHE
        };
        let iov = libc::iovec {
            // SAFETY: `len..capacity` is allocated and ours; the kernel writes at most
            // `spare` bytes there.
            iov_base: unsafe { buf.as_mut_ptr().add(buf.len()) }.cast(),
            iov_len: spare,
        };
        // SAFETY: one valid iovec over memory we own exclusively for the call.
        let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, off, flags) };
        if n >= 0 {
            let n = n as usize;
            // SAFETY: the kernel initialised exactly `n ≤ spare` bytes after `len`.
            unsafe { buf.set_len(buf.len() + n) };
            return Ok(n);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            Some(libc::EOPNOTSUPP | libc::EINVAL) if flags != 0 => {
                NO_DONTCACHE.store(true, Ordering::Relaxed);
                tracing::debug!(
                    "RWF_DONTCACHE not supported ({e}): background reads use the page cache"
                );
            }
            _ => return Err(e),
        }
    }
}

/// Reads this large and larger may go past the page cache ([`read_cold`]); smaller ones (a
/// tree's small files) cost a syscall more to check and gain little.
pub const COLD_MIN: usize = 256 << 10;

/// `cachestat(2)` (Linux 6.5+) was refused once: [`read_cold`] then declines every read (a
/// refused direct read declines that read only: another file of the export may be on a
/// file system with direct I/O).
static NO_COLD: AtomicBool = AtomicBool::new(false);

/// A refused direct read was logged already.
static COLD_LOGGED: AtomicBool = AtomicBool::new(false);

fn cold_refused(e: &std::io::Error) {
    if !COLD_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::debug!("a direct read was refused ({e}); such reads go through the page cache");
    }
}

/// How long a range read past the page cache is remembered ([`read_cold`]'s `share`).
const RECENT_FOR: Duration = Duration::from_secs(10);
/// The most ranges remembered (older ones are forgotten first; past that, all).
const RECENT_MAX: usize = 4096;

/// (device, inode, offset) of a range read past the page cache, and when.
type Recent = std::collections::HashMap<(u64, u64, u64), Instant>;

/// Ranges read past the page cache lately.
static RECENT: LazyLock<Mutex<Recent>> = LazyLock::new(Default::default);

/// Records that `offset` of `file` is read past the page cache now; says whether it was
/// within the last [`RECENT_FOR`] already.
fn read_lately(file: &File, offset: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = file.metadata() else { return false };
    let key = (m.dev(), m.ino(), offset);
    let now = Instant::now();
    let mut map = RECENT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if map.len() >= RECENT_MAX {
        map.retain(|_, at| now.duration_since(*at) < RECENT_FOR);
        if map.len() >= RECENT_MAX {
            map.clear();
        }
    }
    map.insert(key, now)
        .is_some_and(|at| now.duration_since(at) < RECENT_FOR)
}

/// `cachestat(2)`'s number (common to every architecture since Linux 6.5).
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Whether no page of `offset..offset + len` of `file` is in the page cache (none cached,
/// dirty or under write-back). `None` where the kernel cannot say.
fn uncached(file: &File, offset: u64, len: usize) -> Option<bool> {
    let range = CachestatRange {
        off: offset,
        len: len as u64,
    };
    let mut st = Cachestat::default();
    // SAFETY: `range` and `st` are valid for the call, laid out as the kernel's structs.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &raw const range,
            &raw mut st,
            0u32,
        )
    };
    if r != 0 {
        return None;
    }
    Some(st.nr_cache == 0 && st.nr_dirty == 0 && st.nr_writeback == 0)
}

/// Reads up to `len` bytes at `offset` of `file` with direct I/O (`O_DIRECT`), when none of
/// them is in the page cache: into a buffer allocated here, returned with where the bytes
/// start in it and how many were read (fewer only at the end of the file). `None` when
/// the read should go through the page cache instead: part of the range is cached (the
/// cached bytes are cheaper to copy, and a writer's dirty pages are the newest bytes),
/// `offset` is not a multiple of [`ALIGN`], the read is under [`COLD_MIN`], or the kernel or
/// file system cannot (a kernel without `cachestat(2)`: the process does not ask again).
///
/// Why: a read through the page cache allocates a page for every 4 KiB, copies it out and
/// leaves it for reclaim; measured on the 2-core VM of docs/BENCHMARKS-COMPRESSION.md, 1 GiB
/// of a file not cached cost 0.37-0.64 s of system time read buffered, 0.06-0.08 s direct.
/// A file served once (a copy, a mirror) gains nothing from the cache either, and evicts
/// what the server's own programs had cached.
///
/// `share`: a range read past the cache within the last 10 s is read through it this time
/// (`None`), so that many clients reading the same cold file (one data set read through
/// mounts on many hosts at once) read the disk about twice, not once each. Background reads
/// (mirrors), which leave the cache as they found it anyway, do not ask for that; every
/// direct read is remembered, whatever `share`.
///
/// `file` is this caller's own descriptor (its status flags are changed during the read and
/// restored after).
///
/// # Errors
/// The read failed.
pub fn read_cold(
    file: &File,
    offset: u64,
    len: usize,
    share: bool,
) -> std::io::Result<Option<(Vec<u8>, usize, usize)>> {
    let mut buf = Vec::new();
    Ok(read_cold_into(file, offset, len, share, &mut buf)?.map(|(start, got)| (buf, start, got)))
}

/// [`read_cold`] into `buf` (its earlier contents are dropped; its capacity is reused and
/// grown as needed): the bytes are `buf[start..start + got]` of the `(start, got)` returned.
/// For callers that read many ranges in turn (a whole-file hash).
///
/// # Errors
/// The read failed.
pub fn read_cold_into(
    file: &File,
    offset: u64,
    len: usize,
    share: bool,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<(usize, usize)>> {
    if len < COLD_MIN || !offset.is_multiple_of(ALIGN as u64) || NO_COLD.load(Ordering::Relaxed) {
        return Ok(None);
    }
    match uncached(file, offset, len) {
        Some(true) => {}
        Some(false) => return Ok(None),
        None => {
            NO_COLD.store(true, Ordering::Relaxed);
            tracing::debug!("cachestat(2) not available: reads go through the page cache");
            return Ok(None);
        }
    }
    // Every direct read is remembered; a shared one soon after goes through the cache.
    let lately = read_lately(file, offset);
    if lately && share {
        return Ok(None);
    }
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we hold.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) } < 0 {
        // A file system without direct I/O: this file through the page cache (another
        // under the same export may be on one with it).
        cold_refused(&std::io::Error::last_os_error());
        return Ok(None);
    }
    let aligned = len.div_ceil(ALIGN) * ALIGN;
    buf.clear();
    buf.reserve(aligned + ALIGN);
    let start = buf.as_ptr().align_offset(ALIGN).min(ALIGN);
    let mut got = 0usize;
    let result = loop {
        if got >= len {
            break Ok(());
        }
        let Ok(off) = libc::off_t::try_from(offset + got as u64) else {
            break Err(ErrorKind::InvalidInput.into());
        };
        // SAFETY: `start + got .. start + aligned` lies within the allocation and is ours;
        // the kernel writes at most that many bytes there.
        let n = unsafe {
            libc::pread(
                fd,
                buf.as_mut_ptr().add(start + got).cast(),
                aligned - got,
                off,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            break Err(e);
        }
        let n = n as usize;
        got += n;
        // A short read that is not a whole number of blocks is the end of the file.
        if n == 0 || !n.is_multiple_of(ALIGN) {
            break Ok(());
        }
    };
    // SAFETY: as above; restores the descriptor's flags.
    unsafe { libc::fcntl(fd, libc::F_SETFL, flags) };
    match result {
        Ok(()) => {
            let got = got.min(len);
            // SAFETY: the kernel initialised `start..start + got` (and `..start` is not
            // read: the caller takes `start..start + got` only). Zero the head so every
            // byte of the vector is initialised.
            unsafe {
                std::ptr::write_bytes(buf.as_mut_ptr(), 0, start);
                buf.set_len(start + got);
            }
            Ok(Some((start, got)))
        }
        // Refused after all (an alignment this device does not take): the same bytes
        // through the page cache.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            cold_refused(&e);
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Feeds the whole of the file at `path` to `sink`, in order, read with direct I/O where
/// possible (see the module docs).
///
/// # Errors
/// The file cannot be opened or read.
pub fn read_all(path: &std::path::Path, sink: impl FnMut(&[u8])) -> std::io::Result<()> {
    read_range(path, 0, u64::MAX, sink)
}

/// Feeds bytes `from..to` of the file at `path` (fewer at its end) to `sink`, in order, read
/// as [`read_all`] reads. `from` is a multiple of 4 KiB (a direct read starts at an aligned
/// offset).
///
/// # Errors
/// The file cannot be opened or read.
pub fn read_range(
    path: &std::path::Path,
    from: u64,
    to: u64,
    mut sink: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    let opened = if NO_DIRECT.load(Ordering::Relaxed) {
        None
    } else {
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => Some(f),
            Err(e) if e.kind() == ErrorKind::InvalidInput => {
                NO_DIRECT.store(true, Ordering::Relaxed);
                refused("open for reading", &e);
                None
            }
            Err(e) => return Err(e),
        }
    };
    let mut direct = opened.is_some();
    let mut file = match opened {
        Some(f) => f,
        None => std::fs::File::open(path)?,
    };
    let mut at = from;
    if from > 0 {
        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(from))?;
    }
    loop {
        if at >= to {
            return Ok(());
        }
        let n = with_aligned(BLOCK, |buf| -> std::io::Result<usize> {
            let n = loop {
                match file.read(buf) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) if direct && e.kind() == ErrorKind::InvalidInput => {
                        // Direct reads refused after all: go on through the page cache, from
                        // where we are.
                        refused("read", &e);
                        direct = false;
                        file = std::fs::File::open(path)?;
                        std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(at))?;
                    }
                    Err(e) => return Err(e),
                }
            };
            sink(&buf[..n.min(usize::try_from(to - at).unwrap_or(usize::MAX))]);
            Ok(n)
        })?;
        if n == 0 {
            return Ok(());
        }
        at += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        // Not /tmp alone: it may be a tmpfs; the test passes either way (direct or not).
        std::env::temp_dir().join(format!("ferry-direct-{}-{name}", std::process::id()))
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn writes_give_the_same_bytes_aligned_or_not() {
        let path = temp("write");
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("temp file");
        let len = 3 * ALIGN * 100 + 1234;
        f.set_len(len as u64).expect("size");
        let all = pattern(len, 7);
        // An aligned chunk, an aligned chunk with an unaligned tail (a file's end), a small
        // write and an unaligned offset.
        let cut = ALIGN * 100;
        write_all_at(&f, &all[..cut], 0).expect("aligned");
        write_all_at(&f, &all[2 * cut..], 2 * cut as u64).expect("tail");
        write_all_at(&f, &all[cut..cut + 100], cut as u64).expect("small");
        write_all_at(&f, &all[cut + 100..2 * cut], cut as u64 + 100).expect("unaligned");
        let back = std::fs::read(&path).expect("read back");
        assert!(back == all, "bytes differ");

        let mut seen = Vec::new();
        read_all(&path, |b| seen.extend_from_slice(b)).expect("read_all");
        assert!(seen == all, "read_all differs");
        std::fs::remove_file(&path).expect("remove");
    }

    #[test]
    fn uncached_reads_read_the_file() {
        let path = temp("uncached");
        let all = pattern(3 * ALIGN + 77, 3);
        std::fs::write(&path, &all).expect("write");
        let f = File::open(&path).expect("open");
        let mut buf = Vec::with_capacity(all.len() + 10);
        let mut at = 0;
        loop {
            let n = pread_uncached(&f, &mut buf, at).expect("read");
            if n == 0 {
                break;
            }
            at += n as u64;
        }
        assert!(buf == all, "bytes differ");
        let mut part = Vec::with_capacity(100);
        assert_eq!(pread_uncached(&f, &mut part, 50).expect("read"), 100);
        assert!(part[..] == all[50..150]);
        std::fs::remove_file(&path).expect("remove");
    }

    /// Drops the file's pages from the page cache (written back first).
    fn evict(f: &File) {
        f.sync_all().expect("sync");
        // SAFETY: a hint on a descriptor we hold.
        let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0, "fadvise");
    }

    #[test]
    fn cold_reads_give_the_files_bytes_and_decline_what_is_cached() {
        // Not /tmp: a tmpfs keeps every page "cached". The source tree is on a disk.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).expect("temp dir");
        let path = dir.path().join("cold");
        // Five 256 KiB pieces and an unaligned tail.
        let all = pattern(5 * COLD_MIN + 777, 9);
        std::fs::write(&path, &all).expect("write");
        let f = File::open(&path).expect("open");
        evict(&f);
        let direct_possible = File::options()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .is_ok();
        let Some(cachestat) = uncached(&f, 0, all.len()) else {
            eprintln!("kernel without cachestat(2): cold reads are never used here");
            assert!(read_cold(&f, 0, COLD_MIN, true).expect("read").is_none());
            return;
        };
        if !direct_possible {
            eprintln!("file system without O_DIRECT: cold reads are declined");
            assert!(read_cold(&f, 0, COLD_MIN, true).expect("read").is_none());
            return;
        }
        assert!(cachestat, "the evicted file still has cached pages");
        // SAFETY: fcntl on a descriptor we hold (here and below).
        let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };

        // An aligned piece in the middle, and one that runs past the end of the file.
        let (buf, start, got) = read_cold(&f, COLD_MIN as u64, 2 * COLD_MIN, true)
            .expect("read")
            .expect("an uncached range is read direct");
        assert_eq!(got, 2 * COLD_MIN);
        assert!(
            buf[start..start + got] == all[COLD_MIN..3 * COLD_MIN],
            "middle differs"
        );
        let (buf, start, got) = read_cold(&f, 4 * COLD_MIN as u64, 2 * COLD_MIN, false)
            .expect("read")
            .expect("an uncached tail is read direct");
        assert_eq!(got, COLD_MIN + 777, "short only at the end of the file");
        // The same range again soon: through the cache when shared (another client's copy
        // of the same data set), past it when not (a background read).
        assert!(
            read_cold(&f, COLD_MIN as u64, 2 * COLD_MIN, true)
                .expect("read")
                .is_none(),
            "a shared range read past the cache a moment ago goes through it"
        );
        assert!(
            read_cold(&f, 4 * COLD_MIN as u64, 2 * COLD_MIN, false)
                .expect("read")
                .is_some(),
            "a background read stays past the cache"
        );
        assert!(
            buf[start..start + got] == all[4 * COLD_MIN..],
            "tail differs"
        );
        // Into a buffer reused from piece to piece (a whole-file hash), its old bytes gone.
        let mut reused = vec![0xee; 3];
        for piece in 0..5 {
            let at = piece * COLD_MIN;
            let (start, got) = read_cold_into(&f, at as u64, COLD_MIN, false, &mut reused)
                .expect("read")
                .expect("a background read of an uncached range is direct");
            assert!(reused[start..start + got] == all[at..at + COLD_MIN]);
        }
        assert_eq!(
            unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) },
            flags,
            "the descriptor's flags are restored"
        );

        // Declined: small, unaligned, and (after an ordinary read) cached.
        assert!(read_cold(&f, 0, COLD_MIN - 1, true)
            .expect("read")
            .is_none());
        assert!(read_cold(&f, 100, COLD_MIN, true).expect("read").is_none());
        let mut head = vec![0u8; 4096];
        f.read_exact_at(&mut head, 0).expect("buffered read");
        assert!(read_cold(&f, 0, COLD_MIN, true).expect("read").is_none());
    }

    #[test]
    fn reading_a_missing_file_is_an_error() {
        assert!(read_all(&temp("missing"), |_| {}).is_err());
    }
}
