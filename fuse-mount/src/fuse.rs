//! The `fuser::Filesystem` adapter: translates kernel requests into calls on [`Fs`].
//!
//! Every request that may touch the network runs on the FUSE worker thread as far as it
//! can without waiting, and continues as a task on the mount's tokio runtime when it must
//! wait ([`run_here_first`]): answers from memory go back at once, while a worker thread
//! never blocks on the network and many reads are in flight at once. Writes of any kind
//! answer EROFS.
//!
//! Nothing here decides what a reply holds: directory positions, `.`/`..` and the lookup
//! references of readdirplus are [`Fs::readdir`]/[`Fs::readdirplus`]'s, filled through the
//! [`DirReplier`] implementations below over fuser's reply buffers. What stays here is
//! kernel-facing only: attribute conversion, open flags, and the passthrough backing files
//! (fuser's `BackingId`s) kept alive while their handles are open.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_proto::{Attr, FileKind, Timestamp};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use tokio::runtime::Handle;
use tracing::{debug, warn};

use crate::error::Error;
use crate::fs::{DirReplier, Fs};

/// The adapter handed to fuser.
pub struct FerryFuse {
    fs: Arc<Fs>,
    rt: Handle,
    /// Told when the kernel ends the session (unmount from outside).
    on_destroy: Option<tokio::sync::mpsc::UnboundedSender<()>>,
    /// Ask the kernel for passthrough (a local copy is configured).
    want_passthrough: bool,
    /// The kernel agreed to passthrough.
    passthrough: Arc<std::sync::atomic::AtomicBool>,
    backing: Arc<std::sync::Mutex<Backing>>,
    /// Produces the mount's status (JSON) for `ferry status MOUNTPOINT`.
    status: Option<StatusFn>,
    /// Tells the kernel to drop what it caches (set once the session runs).
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
}

/// Produces a mount's status as JSON.
pub type StatusFn = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// The extended attribute of the mount's root that `ferry status MOUNTPOINT` reads. Not
/// listed by listxattr, so `cp -a` and `rsync -X` do not copy it.
pub const STATUS_XATTR: &str = "user.ferry.status";

/// Backing files handed to the kernel: one per inode at a time (a second one for the same
/// inode is refused), kept alive by the handles that use it.
#[derive(Default)]
struct Backing {
    /// By inode and version: a new version of the file never gets the old one's backing.
    by_inode:
        std::collections::HashMap<(u64, ferry_proto::Version), std::sync::Weak<fuser::BackingId>>,
    by_handle: std::collections::HashMap<u64, Arc<fuser::BackingId>>,
}

impl std::fmt::Debug for FerryFuse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FerryFuse").field("fs", &self.fs).finish()
    }
}

impl FerryFuse {
    /// Wraps `fs`; async work runs on `rt`.
    pub fn new(
        fs: Arc<Fs>,
        rt: Handle,
        on_destroy: tokio::sync::mpsc::UnboundedSender<()>,
    ) -> Self {
        FerryFuse {
            fs,
            rt,
            on_destroy: Some(on_destroy),
            want_passthrough: false,
            passthrough: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            backing: Arc::new(std::sync::Mutex::new(Backing::default())),
            status: None,
            notifier: Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// Where the session's notifier goes once the mount runs (close-to-open invalidates
    /// the kernel's attributes through it).
    pub fn notifier_cell(&self) -> Arc<std::sync::OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    /// Answers `ferry status MOUNTPOINT` (the root's [`STATUS_XATTR`]) with `f`'s JSON.
    pub fn with_status(mut self, f: StatusFn) -> Self {
        self.status = Some(f);
        self
    }

    /// Asks the kernel for FUSE passthrough at init, for complete local copies.
    pub fn with_passthrough(mut self, on: bool) -> Self {
        self.want_passthrough = on;
        self
    }

    /// Runs a request's work ([`run_here_first`] on the mount's runtime).
    fn run(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        run_here_first(&self.rt, work);
    }
}

/// Runs `work` first on the calling thread (a FUSE worker), as far as it goes without
/// waiting: a lookup, open or read answered from memory — most of a tree copy's — is then
/// replied to there, without a hand-off to a tokio worker and back (two thread wake-ups per
/// request, which on a busy machine cost more than the work). If it must wait (the network,
/// the local copy), the rest runs as a task on `rt`, polled again with a waker that works,
/// so what it waits on is registered anew.
fn run_here_first(rt: &Handle, work: impl std::future::Future<Output = ()> + Send + 'static) {
    // Timers, spawns and blocking hops inside `work` need the runtime's context.
    let _in_runtime = rt.enter();
    let mut work = Box::pin(work);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if work.as_mut().poll(&mut cx).is_pending() {
        rt.spawn(work);
    }
}

fn lock_backing(b: &std::sync::Mutex<Backing>) -> std::sync::MutexGuard<'_, Backing> {
    b.lock().unwrap_or_else(|e| e.into_inner())
}

fn time(t: Timestamp) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        // Before 1970: subtract whole seconds, add the nanoseconds back.
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec.into())
    }
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Directory => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
        FileKind::Socket => FileType::Socket,
    }
}

/// Kernel attributes for mount inode `ino`; `st_blksize` is the chunk size because
/// coreutils `cp` sizes its buffer from it.
fn fuse_attr(ino: u64, a: &Attr, blksize: u32) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize,
        flags: 0,
    }
}

fn errno(e: &Error) -> Errno {
    if e.errno == libc::EIO {
        warn!("{e}");
    } else {
        debug!("{e}");
    }
    Errno::from_i32(e.errno)
}

/// A plain readdir reply as [`Fs::readdir`] fills it.
struct DirReply<'a>(&'a mut ReplyDirectory);

impl DirReplier for DirReply<'_> {
    fn add(&mut self, ino: u64, offset: u64, name: &[u8], attr: &Attr) -> bool {
        self.0.add(
            INodeNo(ino),
            offset,
            file_type(attr.kind),
            OsStr::from_bytes(name),
        )
    }
}

/// A readdirplus reply as [`Fs::readdirplus`] fills it (entries valid for `ttl`).
struct DirPlusReply<'a> {
    reply: &'a mut ReplyDirectoryPlus,
    ttl: Duration,
    blksize: u32,
}

impl DirReplier for DirPlusReply<'_> {
    fn add(&mut self, ino: u64, offset: u64, name: &[u8], attr: &Attr) -> bool {
        self.reply.add(
            INodeNo(ino),
            offset,
            OsStr::from_bytes(name),
            &self.ttl,
            &fuse_attr(ino, attr, self.blksize),
            Generation(0),
        )
    }
}

impl Filesystem for FerryFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Each capability on its own: an old kernel lacking one must not fail the mount.
        for cap in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_CACHE_SYMLINKS,
        ] {
            if config.add_capabilities(cap).is_err() {
                debug!("kernel lacks {cap:?}");
            }
        }
        // max_pages follows max(max_write, max_readahead): 1 MiB requests need max_write ≥ 1 MiB.
        let _ = config.set_max_write(self.fs.chunk_size().max(1 << 20));
        // Many readahead requests in flight at once.
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        if self.want_passthrough {
            // Passthrough needs kernel ≥ 6.9 and CAP_SYS_ADMIN; without it, complete local
            // copies are still read locally, through ferry.
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(2).is_ok();
            self.passthrough
                .store(ok, std::sync::atomic::Ordering::Relaxed);
            if ok {
                tracing::info!("FUSE passthrough on: complete, verified files are read from the local copy by the kernel");
            } else {
                tracing::info!("FUSE passthrough unavailable (kernel ≥ 6.9 and CAP_SYS_ADMIN needed): complete files are served from the local copy through ferry");
            }
        }
        Ok(())
    }

    fn destroy(&mut self) {
        if let Some(tx) = self.on_destroy.take() {
            let _ = tx.send(());
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let fs = self.fs.clone();
        let name = name.as_bytes().to_vec();
        self.run(async move {
            match fs.lookup(parent.0, &name).await {
                Ok((ino, attr)) => reply.entry(
                    &fs.ttl(),
                    &fuse_attr(ino, &attr, fs.chunk_size()),
                    Generation(0),
                ),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let fs = self.fs.clone();
        self.run(async move {
            match fs.getattr(ino.0).await {
                Ok(attr) => reply.attr(&fs.ttl(), &fuse_attr(ino.0, &attr, fs.chunk_size())),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let fs = self.fs.clone();
        self.run(async move {
            match fs.readlink(ino.0).await {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY
            || flags.0 & (libc::O_TRUNC | libc::O_APPEND | libc::O_CREAT) != 0;
        let fs = self.fs.clone();
        let passthrough = self.passthrough.load(std::sync::atomic::Ordering::Relaxed);
        let backing = self.backing.clone();
        let notifier = self.notifier.clone();
        self.run(async move {
            match fs.open(ino.0, write).await {
                Ok(o) => {
                    if o.attr_changed {
                        // Close-to-open: the size and times the kernel holds are of the old
                        // version; dropped before the open is answered (attributes only: a
                        // negative offset; the pages go with the open's flags), so the
                        // reader's fstat and reads see the new size. Safe also when this
                        // runs on the fuser thread handling the open: without pages to
                        // drop, the kernel takes no page lock a pending read could hold.
                        if let Some(n) = notifier.get() {
                            if let Err(e) = n.inval_inode(ino, -1, 0) {
                                debug!("invalidating the attributes of inode {}: {e}", ino.0);
                            }
                        }
                    }
                    if let (Some(file), true) = (o.local.as_ref(), passthrough) {
                        let id = {
                            let mut b = lock_backing(&backing);
                            let existing = b
                                .by_inode
                                .get(&(ino.0, o.version))
                                .and_then(std::sync::Weak::upgrade);
                            match existing {
                                Some(id) => Ok(id),
                                None => reply.open_backing(file).map(|id| {
                                    let id = Arc::new(id);
                                    b.by_inode.retain(|_, w| w.strong_count() > 0);
                                    b.by_inode.insert((ino.0, o.version), Arc::downgrade(&id));
                                    id
                                }),
                            }
                        };
                        match id {
                            Ok(id) => {
                                lock_backing(&backing).by_handle.insert(o.fh, id.clone());
                                fs.count_passthrough_open();
                                debug!("open of inode {} with passthrough", ino.0);
                                // No KEEP_CACHE: the kernel refuses it with passthrough.
                                return reply.opened_passthrough(
                                    FileHandle(o.fh),
                                    FopenFlags::empty(),
                                    &id,
                                );
                            }
                            Err(e) => {
                                debug!("passthrough refused for inode {}: {e}", ino.0);
                                fs.passthrough_refused(o.fh);
                            }
                        }
                    } else if o.local.is_some() {
                        fs.passthrough_refused(o.fh);
                    }
                    if let (Some(data), Some(n)) = (o.pages.as_ref(), notifier.get()) {
                        // Before the answer, so the open keeps these pages (keep_cache).
                        match n.store(ino, 0, data) {
                            Ok(()) => fs.count_given_at_open(),
                            Err(e) => debug!("storing inode {} in the page cache: {e}", ino.0),
                        }
                    }
                    let f = if o.direct_io {
                        // Beside a passthrough open of the same file the kernel allows only
                        // uncached opens.
                        FopenFlags::FOPEN_DIRECT_IO
                    } else if o.keep_cache {
                        FopenFlags::FOPEN_KEEP_CACHE
                    } else {
                        FopenFlags::empty()
                    };
                    reply.opened(FileHandle(o.fh), f)
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let fs = self.fs.clone();
        self.run(async move {
            match fs.read(fh.0, offset, size).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Read-only: nothing to write back at close. ENOSYS tells the kernel never to send
        // FLUSH again (one request less per file closed: a tree copy closes thousands).
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.release(fh.0);
        lock_backing(&self.backing).by_handle.remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fs = self.fs.clone();
        self.run(async move {
            match fs.opendir(ino.0).await {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self
            .fs
            .readdir(ino.0, fh.0, offset, &mut DirReply(&mut reply))
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut plus = DirPlusReply {
            reply: &mut reply,
            ttl: self.fs.ttl(),
            blksize: self.fs.chunk_size(),
        };
        match self.fs.readdirplus(ino.0, fh.0, offset, &mut plus) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(fh.0);
        reply.ok();
    }

    fn getxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &std::ffi::OsStr,
        size: u32,
        reply: fuser::ReplyXattr,
    ) {
        if let Some(f) = self
            .status
            .as_ref()
            .filter(|_| ino == INodeNo::ROOT && name == STATUS_XATTR)
        {
            return reply_xattr(reply, size, &f());
        }
        let (fs, name) = (self.fs.clone(), name.as_bytes().to_vec());
        self.run(async move {
            match fs.xattrs(ino.0).await {
                Ok(all) => match all.iter().find(|(n, _)| n[..] == name[..]) {
                    Some((_, v)) => reply_xattr(reply, size, v),
                    None => reply.error(Errno::ENODATA),
                },
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        let fs = self.fs.clone();
        self.run(async move {
            match fs.xattrs(ino.0).await {
                Ok(all) => {
                    // Names, each ended by a NUL (the mount's own status is not listed).
                    let mut names = Vec::new();
                    for (n, _) in &all {
                        names.extend_from_slice(n);
                        names.push(0);
                    }
                    reply_xattr(reply, size, &names);
                }
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: fuser::ReplyLseek,
    ) {
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            // The kernel answers the other kinds itself.
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(offset) = u64::try_from(offset) else {
            return reply.error(Errno::ENXIO);
        };
        let fs = self.fs.clone();
        self.run(async move {
            match fs.seek(ino.0, fh.0, offset, data).await {
                Ok(at) => reply.offset(at as i64),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let fs = self.fs.clone();
        self.run(async move {
            match fs.statfs().await {
                Ok(s) => reply.statfs(
                    s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
                ),
                Err(e) => reply.error(errno(&e)),
            }
        });
    }

    // Every modifying operation: read-only file system. The mount is also `ro`, so the
    // kernel normally refuses these before they arrive; these answers cover the rest.

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }
}

/// Answers a getxattr or listxattr: the size when asked with size 0, ERANGE when the
/// caller's buffer is too small, else the bytes.
fn reply_xattr(reply: fuser::ReplyXattr, size: u32, value: &[u8]) {
    if size == 0 {
        reply.size(value.len() as u32);
    } else if (size as usize) < value.len() {
        reply.error(Errno::ERANGE);
    } else {
        reply.data(value);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may panic on setup failures

    use super::run_here_first;
    use std::time::Duration;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn work_that_need_not_wait_runs_on_the_calling_thread() {
        let rt = runtime();
        let (tx, rx) = std::sync::mpsc::channel();
        run_here_first(rt.handle(), async move {
            tx.send(std::thread::current().id()).unwrap();
        });
        assert_eq!(
            rx.try_recv().unwrap(),
            std::thread::current().id(),
            "answered before run_here_first returned, on this thread"
        );
    }

    #[test]
    fn work_that_waits_finishes_on_the_runtime() {
        let rt = runtime();
        // Waits on a channel filled later, then on a timer (which needs the runtime's
        // context already in the first poll).
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        run_here_first(rt.handle(), async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let v = rx.await.unwrap();
            done_tx.send((v, std::thread::current().id())).unwrap();
        });
        assert!(done_rx.try_recv().is_err(), "it had to wait");
        std::thread::sleep(Duration::from_millis(20));
        tx.send(7).unwrap();
        let (v, thread) = done_rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(v, 7);
        assert_ne!(
            thread,
            std::thread::current().id(),
            "finished on a runtime worker"
        );
    }
}
