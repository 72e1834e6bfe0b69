//! [`MountSession`] against an in-process ferryd on 127.0.0.1:0 and a real FUSE mount in a
//! temporary directory (skipped without /dev/fuse).

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

/// ferryd serving `export` on a thread of its own until dropped.
struct Server {
    port: u16,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(export: &Path) -> Server {
        let config = ferry_server::ServerConfig {
            export: export.to_path_buf(),
            ..ferry_server::ServerConfig::default()
        };
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener).unwrap();
                ferry_server::run(l, config, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        Server {
            port,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn config(&self, mountpoint: &Path) -> MountConfig {
        MountConfig {
            target: Target {
                host: "127.0.0.1".into(),
                port: self.port,
                s3: false,
                path: bytes::Bytes::new(),
            },
            mountpoint: mountpoint.to_path_buf(),
            ..MountConfig::default()
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn fuse_available() -> bool {
    let ok = Path::new("/dev/fuse").exists();
    if !ok {
        eprintln!("skipping: /dev/fuse does not exist");
    }
    ok
}

fn is_mounted(p: &Path) -> bool {
    let abs = mountpoint::absolute(p);
    mountpoint::mounts().iter().any(|(m, _)| *m == abs)
}

/// The status the mount serves at its root (what `ferry status MOUNTPOINT` reads).
fn status(mnt: &Path) -> ferry_cache::Status {
    let mut buf = vec![0u8; 256 << 10];
    let n = rustix::fs::getxattr(mnt, crate::fuse::STATUS_XATTR, &mut buf[..]).unwrap();
    serde_json::from_slice(&buf[..n]).unwrap()
}

#[test]
fn inconsistent_configs_are_refused_before_anything_happens() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = MountConfig {
        mountpoint: dir.path().to_path_buf(),
        mirror: true,
        ..MountConfig::default()
    };
    assert!(matches!(
        MountSession::start(cfg.clone()),
        Err(MountError::MirrorNeedsCacheDir)
    ));
    let cfg = MountConfig {
        mirror: false,
        bwlimit: Some(1 << 20),
        ..cfg
    };
    assert!(matches!(
        MountSession::start(cfg.clone()),
        Err(MountError::BwlimitNeedsMirror)
    ));
    let cfg = MountConfig {
        bwlimit: None,
        rescan: Some(std::time::Duration::from_secs(60)),
        ..cfg
    };
    assert!(matches!(
        MountSession::start(cfg),
        Err(MountError::RescanNeedsMirror)
    ));
}

#[test]
fn start_serves_shutdown_unmounts_and_drop_unmounts_too() {
    if !fuse_available() {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("hello"), b"world").unwrap();
    let server = Server::start(src.path());
    let dir = tempfile::tempdir().unwrap();

    let session = MountSession::start(server.config(dir.path())).unwrap();
    assert_eq!(session.mountpoint(), Some(dir.path()));
    // Ready means ready: no waiting before the first read.
    assert!(is_mounted(dir.path()));
    assert_eq!(std::fs::read(dir.path().join("hello")).unwrap(), b"world");
    let s = status(dir.path());
    assert_eq!(s.state, ferry_cache::State::Mounted);
    let m = s.mount.unwrap();
    assert!(!m.mirror && m.cache_dir.is_none());
    assert!(m.decoded_bytes >= 5, "{m:?}");
    session.shutdown().unwrap();
    assert!(!is_mounted(dir.path()));

    // A second mount on the same point, ended by dropping the session.
    let session = MountSession::start(server.config(dir.path())).unwrap();
    assert!(is_mounted(dir.path()));
    drop(session);
    assert!(!is_mounted(dir.path()));
}

#[test]
fn a_mounted_point_is_refused_and_wait_returns_after_an_outside_unmount() {
    if !fuse_available() {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    let server = Server::start(src.path());
    let dir = tempfile::tempdir().unwrap();
    let session = MountSession::start(server.config(dir.path())).unwrap();
    assert!(matches!(
        MountSession::start(server.config(dir.path())),
        Err(MountError::AlreadyMounted { .. })
    ));
    let waiter = std::thread::spawn(move || session.wait());
    detach(dir.path()).unwrap();
    waiter.join().unwrap().unwrap();
    assert!(!is_mounted(dir.path()));
}

#[test]
fn the_background_mirror_completes_and_is_recorded() {
    if !fuse_available() {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("d")).unwrap();
    std::fs::write(src.path().join("d/a"), vec![7u8; 3 << 20]).unwrap();
    std::fs::write(src.path().join("b"), b"small").unwrap();
    let server = Server::start(src.path());
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let cfg = MountConfig {
        cache_dir: Some(cache.path().to_path_buf()),
        state_dir: Some(state.path().to_path_buf()),
        mirror: true,
        ..server.config(dir.path())
    };
    let session = MountSession::start(cfg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        let s = status(dir.path());
        if s.state == ferry_cache::State::Complete || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(done.state, ferry_cache::State::Complete, "{done:?}");
    assert_eq!((done.files_done, done.bytes_done), (2, (3 << 20) + 5));
    assert!(done.mount.unwrap().mirror);
    session.shutdown().unwrap();
    assert_eq!(
        std::fs::read(cache.path().join("d/a")).unwrap(),
        vec![7u8; 3 << 20]
    );
    let folder = ferry_cache::find_state(cache.path(), Some(state.path())).unwrap();
    assert!(folder.starts_with(state.path()));
    let recorded = ferry_cache::Status::read(&folder).unwrap();
    assert_eq!(recorded.state, ferry_cache::State::Complete);
}
