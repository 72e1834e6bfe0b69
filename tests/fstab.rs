//! Fitting in like sshfs: `mount -t fuse.ferry HOST:PORT:/PATH DIR -o …` through the
//! mount.fuse.ferry helper (what an /etc/fstab line runs), and `ferry mount … -o …`.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use ferry_tests::{
    bin, is_mounted, is_root, require_fuse, run, wait_for, write_random, TestServer,
};

/// The helper, installed where mount(8) looks for it (/sbin/mount.fuse.ferry), pointing at
/// the built ferry; on drop, any mount left behind is removed and an installed helper that
/// was there before is put back.
struct Helper {
    path: PathBuf,
    saved: Option<Vec<u8>>,
    mounts: Vec<PathBuf>,
}

impl Helper {
    fn install() -> Helper {
        let path = PathBuf::from("/sbin/mount.fuse.ferry");
        let saved = std::fs::read(&path).ok();
        let script = std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/mount.fuse.ferry"),
        )
        .unwrap()
        .replace("@FERRY@", bin("ferry").to_str().unwrap());
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        Helper {
            path,
            saved,
            mounts: Vec::new(),
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        for m in &self.mounts {
            if is_mounted(m) {
                ferry_tests::force_unmount(m);
            }
        }
        match &self.saved {
            Some(old) => {
                let _ = std::fs::write(&self.path, old);
            }
            None => {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

#[test]
fn mount_t_fuse_ferry_with_fstab_style_options() {
    require_fuse!();
    if !is_root() {
        eprintln!("skipped: installing a mount helper needs root");
        return;
    }
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("sub")).unwrap();
    write_random(&src.path().join("sub/f.bin"), (3 << 20) + 11, 5);
    let server = TestServer::start(src.path());
    let mut helper = Helper::install();
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    helper.mounts.push(mnt.clone());
    let log = dir.path().join("ferry.log");
    let source = format!("{}:/sub", server.addr);
    let opts = format!(
        "_netdev,nofail,x-systemd.automount,defaults,allow_other,streams=3,attr_timeout=2,log_file={}",
        log.display()
    );
    run(Command::new("mount")
        .args(["-t", "fuse.ferry"])
        .arg(&source)
        .arg(&mnt)
        .args(["-o", &opts]));
    assert!(is_mounted(&mnt));
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let line = mounts
        .lines()
        .find(|l| l.contains(mnt.to_str().unwrap()))
        .unwrap()
        .to_string();
    // Source ferry:ADDR:/PATH; the type is fuse (fuse.ferry where the subtype is kept).
    assert!(line.starts_with(&format!("ferry:{source} ")), "{line}");
    assert!(line.contains(" fuse"), "{line}");
    assert!(line.contains("allow_other"), "{line}");
    run(Command::new("cmp")
        .arg(src.path().join("sub/f.bin"))
        .arg(mnt.join("f.bin")));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("with 3 streams"), "{text}");
    run(Command::new("umount").arg(&mnt));
    assert!(wait_for(Duration::from_secs(5), || !is_mounted(&mnt)));

    // A bad option is one line from mount, and nothing is mounted.
    let out = Command::new("mount")
        .args(["-t", "fuse.ferry"])
        .arg(&source)
        .arg(&mnt)
        .args(["-o", "frobnicate"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("-o frobnicate: not a ferry mount option"),
        "{err}"
    );
    assert!(!is_mounted(&mnt));
}
