//! The model test's kernel-free subject: `Fs` over an in-process ferryd, driven the way the
//! FUSE adapter drives it, with the kernel's side played here: a dentry cache (each path
//! looked up once, then reused), readdirplus in small replies resumed at the offset of the
//! last entry, and the references the kernel would hold, forgotten at the end of a case.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferry_client::{Client, ClientConfig};
use ferry_mount::fs::{DirReplier, Fs, FsConfig, ROOT_INO};
use ferry_proto::{Attr, FileKind};
use proptest::prelude::*;
use tokio::runtime::{Handle, Runtime};

use super::{Kind, Stat, Target};

/// Entries per readdirplus reply: small, so listings take several replies.
const REPLY_ROOM: usize = 5;

/// Serves `dir` with an in-process ferryd on 127.0.0.1:0 (until `rt` is dropped); returns
/// its address.
pub fn serve(rt: &Runtime, dir: &Path) -> String {
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = ferry_server::ServerConfig {
        export: dir.to_path_buf(),
        ..Default::default()
    };
    rt.spawn(ferry_server::run(listener, config, std::future::pending()));
    addr
}

/// An `Fs` over the ferryd at `addr`, with chunks of `chunk_size` bytes.
pub fn connect(rt: &Runtime, addr: &str, chunk_size: u32) -> Arc<Fs> {
    rt.block_on(async {
        let client = Client::connect(ClientConfig {
            addr: addr.to_string(),
            chunk_size,
            ..Default::default()
        })
        .await
        .unwrap();
        assert_eq!(client.session().chunk_size, chunk_size);
        let cfg = FsConfig::default();
        let root = client.stat(cfg.root.clone()).await.unwrap();
        Arc::new(Fs::new(client, cfg, root))
    })
}

/// `Fs` as one case's subject.
pub struct FsTarget<'a> {
    fs: &'a Fs,
    rt: &'a Handle,
    /// Inode of each path looked up (or sent by readdirplus), as the kernel's dentries.
    dentries: HashMap<String, u64>,
    /// References taken, by inode: what the kernel would forget.
    refs: HashMap<u64, u64>,
}

impl<'a> FsTarget<'a> {
    /// A subject with no references yet.
    pub fn new(fs: &'a Fs, rt: &'a Handle) -> Self {
        FsTarget {
            fs,
            rt,
            dentries: HashMap::new(),
            refs: HashMap::new(),
        }
    }

    /// Forgets every reference the case took, as the kernel does when it evicts them;
    /// then no inode the case saw may remain.
    pub fn forget_all(&mut self) -> Result<(), TestCaseError> {
        let refs: Vec<(u64, u64)> = self.refs.drain().collect();
        for &(ino, n) in &refs {
            prop_assert_eq!(self.fs.lookup_count(ino), Some(n), "references of {}", ino);
            self.fs.forget(ino, n);
        }
        for &(ino, _) in &refs {
            prop_assert_eq!(self.fs.lookup_count(ino), None, "inode {} forgotten", ino);
        }
        Ok(())
    }

    fn took(&mut self, path: String, ino: u64) {
        self.dentries.insert(path, ino);
        *self.refs.entry(ino).or_default() += 1;
    }

    /// The inode of `path`, looking up each component not yet known.
    fn resolve(&mut self, path: &str) -> u64 {
        if path.is_empty() {
            return ROOT_INO;
        }
        if let Some(&ino) = self.dentries.get(path) {
            return ino;
        }
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
        let parent = self.resolve(parent);
        let (ino, _) = self
            .rt
            .block_on(self.fs.lookup(parent, name.as_bytes()))
            .unwrap();
        self.took(path.to_string(), ino);
        ino
    }
}

impl Drop for FsTarget<'_> {
    fn drop(&mut self) {
        // A failed case still gives its references back, so the next case starts clean.
        for (ino, n) in self.refs.drain() {
            self.fs.forget(ino, n);
        }
    }
}

/// A readdirplus reply with room for [`REPLY_ROOM`] entries: (inode, offset, name).
struct Reply(Vec<(u64, u64, String)>);

impl DirReplier for Reply {
    fn add(&mut self, ino: u64, offset: u64, name: &[u8], _attr: &Attr) -> bool {
        if self.0.len() == REPLY_ROOM {
            return true;
        }
        self.0
            .push((ino, offset, String::from_utf8(name.to_vec()).unwrap()));
        false
    }
}

impl Target for FsTarget<'_> {
    type File = u64;

    fn open(&mut self, path: &str) -> u64 {
        let ino = self.resolve(path);
        let o = self.rt.block_on(self.fs.open(ino, false)).unwrap();
        assert!(o.local.is_none() && !o.direct_io, "no local copy here");
        o.fh
    }

    fn read_at(&mut self, fh: &u64, buf: &mut [u8], offset: u64) -> usize {
        let mut n = 0;
        while n < buf.len() {
            let want = u32::try_from(buf.len() - n).unwrap();
            let got = self
                .rt
                .block_on(self.fs.read(*fh, offset + n as u64, want))
                .unwrap();
            if got.is_empty() {
                break;
            }
            assert!(got.len() <= want as usize, "read returned more than asked");
            buf[n..n + got.len()].copy_from_slice(&got);
            n += got.len();
        }
        n
    }

    fn stat(&mut self, path: &str) -> Stat {
        let ino = self.resolve(path);
        let a = self.rt.block_on(self.fs.getattr(ino)).unwrap();
        let (kind, bits) = match a.kind {
            FileKind::File => (Kind::File, libc::S_IFREG),
            FileKind::Directory => (Kind::Dir, libc::S_IFDIR),
            FileKind::Symlink => (Kind::Symlink, libc::S_IFLNK),
            FileKind::Fifo => (Kind::Other, libc::S_IFIFO),
            FileKind::CharDevice => (Kind::Other, libc::S_IFCHR),
            FileKind::BlockDevice => (Kind::Other, libc::S_IFBLK),
            FileKind::Socket => (Kind::Other, libc::S_IFSOCK),
        };
        Stat {
            kind,
            len: a.size,
            // What the kernel reports as st_mode: the type bits and the permission bits.
            mode: bits | u32::from(a.perm),
            mtime: (a.mtime.sec, i64::from(a.mtime.nsec)),
        }
    }

    fn read_dir(&mut self, path: &str) -> BTreeSet<String> {
        let ino = self.resolve(path);
        let fh = self.rt.block_on(self.fs.opendir(ino)).unwrap();
        let mut names = BTreeSet::new();
        let mut offset = 0;
        loop {
            let mut reply = Reply(Vec::new());
            self.fs.readdirplus(ino, fh, offset, &mut reply).unwrap();
            if reply.0.is_empty() {
                break;
            }
            for (child, next, name) in reply.0 {
                match name.as_str() {
                    "." => assert_eq!((child, next), (ino, 1), "{path}/."),
                    ".." => assert_eq!(next, 2, "{path}/.."),
                    _ => {
                        let full = if path.is_empty() {
                            name.clone()
                        } else {
                            format!("{path}/{name}")
                        };
                        assert!(names.insert(name), "{full} listed twice");
                        // The kernel holds a reference for each entry it was sent.
                        self.took(full, child);
                    }
                }
                offset = next;
            }
        }
        self.fs.releasedir(fh);
        names
    }

    fn read_link(&mut self, path: &str) -> PathBuf {
        let ino = self.resolve(path);
        let target = self.rt.block_on(self.fs.readlink(ino)).unwrap();
        PathBuf::from(std::ffi::OsStr::from_bytes(&target))
    }

    fn close(&mut self, fh: u64) {
        self.fs.release(fh);
    }
}
