//! Shared harness for ferry's end-to-end tests: real `ferryd` processes on
//! `127.0.0.1:0`, real FUSE mounts in temporary directories, and cleanup in `Drop` so a
//! failing test leaves no process or mount behind.
//!
//! The binaries are taken from the cargo target directory (`target/debug`), so build them
//! first: `cargo build --workspace --bins` (`make test` does).
//!
//! Without FUSE (no /dev/fuse, no fusermount3 for non-root), mount tests skip with a
//! message, unless `FERRY_REQUIRE_FUSE=1`, which makes them fail instead.

use std::ffi::CString;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};

pub mod pg;
pub mod proxy;
pub mod s3;

/// Path of a workspace binary (`ferryd`, `ferry`) next to the test executable.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/debug/deps/<test> → target/debug/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} not found: build the binaries first with `cargo build --workspace --bins` (make test does)",
        p.display()
    );
    p
}

/// The state directory (`FERRY_STATE_DIR`) of every `ferry` the tests start: one per
/// test process, removed when it exits, so no test leaves state in /var/lib/ferry.
pub fn state_base() -> &'static Path {
    static BASE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    extern "C" fn remove() {
        if let Some(p) = BASE.get() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
    BASE.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("ferry-test-state")
            .tempdir()
            .expect("state tempdir")
            .keep();
        // SAFETY: `remove` is an `extern "C" fn()` that touches only the OnceLock.
        unsafe { libc::atexit(remove) };
        dir
    })
}

/// A `ferry` command with the tests' state directory ([`state_base`]).
pub fn ferry() -> Command {
    let mut c = Command::new(bin("ferry"));
    c.env("FERRY_STATE_DIR", state_base());
    c
}

/// Opens the state of the cache directory `root` as the `ferry` of [`ferry`] keeps it.
pub fn open_cache(root: &Path) -> ferry_cache::CacheDir {
    ferry_cache::CacheDir::open(root, &ferry_cache::StateBase::new(state_base()))
        .expect("open cache directory")
}

/// Bytes of the files under cache directory `root` that its journal records as present.
pub fn present_bytes(root: &Path) -> u64 {
    let c = open_cache(root);
    c.all().iter().map(|(_, s)| s.present_bytes()).sum()
}

/// Whether FUSE mounts can work here. Returns false (after printing why) when the test
/// should skip; panics instead when `FERRY_REQUIRE_FUSE=1`.
pub fn fuse_available() -> bool {
    let why = if !Path::new("/dev/fuse").exists() {
        Some("/dev/fuse does not exist")
    } else if !is_root() && which("fusermount3").is_none() {
        Some("fusermount3 is not installed (apt-get install fuse3)")
    } else {
        None
    };
    match why {
        None => true,
        Some(why) => {
            if std::env::var("FERRY_REQUIRE_FUSE").as_deref() == Ok("1") {
                panic!("FUSE is required (FERRY_REQUIRE_FUSE=1) but unavailable: {why}");
            }
            eprintln!("skipping: FUSE unavailable: {why}");
            false
        }
    }
}

/// Skips the calling test (returns from it) when FUSE is unavailable.
#[macro_export]
macro_rules! require_fuse {
    () => {
        if !$crate::fuse_available() {
            return;
        }
    };
}

/// True when running as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The calling test cannot run here because of `why`: returns false (the test skips, saying
/// why), or fails under `FERRY_REQUIRE_FUSE=1` (CI, where the prerequisites are installed).
pub fn skip(why: &str) -> bool {
    assert!(
        std::env::var_os("FERRY_REQUIRE_FUSE").is_none(),
        "{why} (FERRY_REQUIRE_FUSE=1 is set; scripts/prereqs.sh installs what tests need)"
    );
    eprintln!("skipped: {why}");
    false
}

/// Whether every command of `tools` is on PATH; else [`skip`]s naming those missing.
pub fn have_tools(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| which(t).is_none())
        .collect();
    missing.is_empty() || skip(&format!("{} not installed", missing.join(", ")))
}

/// Full path of a command on PATH.
pub fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(cmd))
            .find(|p| p.is_file())
    })
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Pids of processes one of whose command-line arguments is `needle`.
pub fn pids_with_arg(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in procs.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            if String::from_utf8_lossy(&cmd)
                .split('\0')
                .any(|a| a == needle)
            {
                out.push(pid);
            }
        }
    }
    out
}

/// Runs a command to completion; panics with its output when it fails.
pub fn run(cmd: &mut Command) -> String {
    run_explained(cmd, String::new)
}

/// As [`run`], with what `more` says appended to the failure message (a server's own log,
/// gathered only on failure: the temporary directories holding it are gone once the test
/// has failed).
pub fn run_explained(cmd: &mut Command, more: impl FnOnce() -> String) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        more()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ferry mirror REMOTE DIR --quiet ARGS…`; panics with its output unless it succeeds.
pub fn mirror(remote: &str, dir: &Path, args: &[&str]) {
    run(ferry()
        .arg("mirror")
        .arg(remote)
        .arg(dir)
        .arg("--quiet")
        .args(args));
}

/// Writes `len` pseudo-random bytes (deterministic per seed) to `path`.
pub fn write_random(path: &Path, len: usize, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut buf = vec![0u8; len];
    rng.fill_bytes(&mut buf);
    std::fs::write(path, &buf).expect("write test file");
}

/// Whether `path` is a mount point in this namespace (from /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy().replace(' ', "\\040");
    text.lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// Detaches a mount (lazy), ignoring errors: last-resort cleanup.
pub fn force_unmount(path: &Path) {
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(path)
        .stderr(Stdio::null())
        .status();
    if is_mounted(path) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(path)
            .stderr(Stdio::null())
            .status();
    }
}

/// A running `ferryd`, killed on drop.
#[derive(Debug)]
pub struct TestServer {
    child: Option<Child>,
    /// `127.0.0.1:PORT` it listens on.
    pub addr: String,
    /// The exported directory.
    pub export: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Starts ferryd exporting `export` on a free loopback port.
    pub fn start(export: &Path) -> TestServer {
        Self::start_with(export, &[])
    }

    /// Starts ferryd with extra arguments.
    pub fn start_with(export: &Path, args: &[&str]) -> TestServer {
        Self::start_on(export, "127.0.0.1:0", args)
    }

    /// Starts ferryd listening on `listen` (port 0: any free port), with extra arguments.
    pub fn start_on(export: &Path, listen: &str, args: &[&str]) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("ferryd.log");
        let mut server = TestServer {
            child: None,
            addr: listen.into(),
            export: export.to_path_buf(),
            log,
            args: args.iter().map(|a| a.to_string()).collect(),
            _dir: dir,
        };
        server.spawn();
        server
    }

    /// Starts the process on `self.addr` (port 0 at first) and records the bound address.
    fn spawn(&mut self) {
        let port_file = self._dir.path().join("port");
        let _ = std::fs::remove_file(&port_file);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let child = Command::new(bin("ferryd"))
            .arg("--export")
            .arg(&self.export)
            .args(["--listen", &self.addr, "--port-file"])
            .arg(&port_file)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn ferryd");
        self.child = Some(child);
        let ok = wait_for(Duration::from_secs(10), || port_file.exists());
        assert!(ok, "ferryd did not start: {}", self.log_text());
        self.addr = std::fs::read_to_string(&port_file)
            .expect("port file")
            .trim()
            .to_string();
    }

    /// Kills the server with SIGKILL (no chance to say goodbye) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same address (after [`TestServer::kill9`]).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A `ferry mount -f` process and its mount point; unmounted and stopped on drop.
#[derive(Debug)]
pub struct TestMount {
    child: Option<Child>,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl TestMount {
    /// Mounts `remote` (e.g. the server's addr) with extra `ferry mount` arguments, and
    /// waits until the mount is live.
    pub fn mount(remote: &str, args: &[&str]) -> TestMount {
        let dir = tempfile::tempdir().expect("tempdir");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mkdir mnt");
        Self::mount_at(dir, remote, args)
    }

    /// Mounts on `dir/mnt` (which must exist).
    pub fn mount_at(dir: tempfile::TempDir, remote: &str, args: &[&str]) -> TestMount {
        Self::mount_env(dir, remote, args, &[])
    }

    /// As [`TestMount::mount_at`], with `envs` added to ferry's environment (an S3 key).
    pub fn mount_env(
        dir: tempfile::TempDir,
        remote: &str,
        args: &[&str],
        envs: &[(String, String)],
    ) -> TestMount {
        let mnt = dir.path().join("mnt");
        let log = dir.path().join("ferry.log");
        let child = ferry()
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .arg("mount")
            .arg(remote)
            .arg(&mnt)
            .arg("-f")
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn ferry");
        let mut m = TestMount {
            child: Some(child),
            dir,
            log,
        };
        // Listed and answering: a dead mount left at the same path by an earlier process
        // is listed too, but fails opendir until ferry has replaced it.
        let live = |p: &Path| is_mounted(p) && std::fs::read_dir(p).is_ok();
        let up = wait_for(Duration::from_secs(15), || live(&mnt) || !m.is_running());
        assert!(up && live(&mnt), "mount did not come up: {}", m.log_text());
        m
    }

    /// The mount point.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// The mount process's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Process id of `ferry mount`.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Whether the mount process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Sends `sig` to the mount process and waits (up to 10 s) for it to exit.
    pub fn signal_and_wait(&mut self, sig: i32) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        // SAFETY: kill on a pid we spawned and have not reaped.
        unsafe { libc::kill(child.id() as i32, sig) };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Takes the temp dir, leaving the mount (if any) to the caller; for re-mount tests.
    pub fn into_dir(mut self) -> tempfile::TempDir {
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"));
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        dir
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        let mnt = self.path();
        if self.child.is_some() {
            let _ = self.signal_and_wait(libc::SIGTERM);
        }
        if is_mounted(&mnt) {
            force_unmount(&mnt);
        }
    }
}

/// Reads a whole file, returning its bytes.
pub fn read_all(path: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut v))
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    v
}

/// One object's metadata as compared between the source and the mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    /// Path relative to the tree root.
    pub rel: PathBuf,
    /// `st_mode` (type and permission bits).
    pub mode: u32,
    /// Size (regular files and symlinks).
    pub size: u64,
    /// mtime seconds.
    pub mtime: i64,
    /// mtime nanoseconds.
    pub mtime_nsec: i64,
    /// Symlink target, if a symlink.
    pub target: Option<PathBuf>,
    /// uid and gid.
    pub owner: (u32, u32),
}

/// Walks a tree with `lstat` (never following links), sorted by path.
pub fn walk(root: &Path) -> Vec<Meta> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for p in entries {
            let m = meta(root, &p);
            if m.mode & 0o170_000 == 0o040_000 {
                stack.push(p);
            }
            out.push(m);
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    out
}

/// The [`Meta`] of `p` (not followed if a symlink), named relative to `root`.
pub fn meta(root: &Path, p: &Path) -> Meta {
    let m = std::fs::symlink_metadata(p).expect("lstat");
    let target = m
        .file_type()
        .is_symlink()
        .then(|| std::fs::read_link(p).expect("readlink"));
    Meta {
        rel: p.strip_prefix(root).expect("prefix").to_path_buf(),
        mode: m.mode(),
        size: if m.is_dir() { 0 } else { m.size() },
        mtime: m.mtime(),
        mtime_nsec: m.mtime_nsec(),
        target,
        owner: (m.uid(), m.gid()),
    }
}

/// Sets atime/mtime to the nanosecond, without following a final symlink.
pub fn set_mtime(p: &Path, sec: i64, nsec: i64) {
    let c = CString::new(p.as_os_str().as_bytes()).expect("building the test tree");
    let ts = [
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
        libc::timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
    ];
    // SAFETY: valid path and two timespecs, as utimensat requires.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat {}", p.display());
}

pub fn build_tree(root: &Path) {
    let d = |p: &str| std::fs::create_dir_all(root.join(p)).expect("building the test tree");
    d("a/b/c");
    d("empty");
    d("a/empty2");
    d("big");
    for (i, size) in [0usize, 1, 4095, 4096, 65537, (1 << 20) - 1, (1 << 20) + 1]
        .iter()
        .enumerate()
    {
        write_random(&root.join(format!("a/f{size}")), *size, i as u64);
    }
    std::fs::write(root.join("a/b/c/deep.txt"), b"deep\n").expect("building the test tree");
    std::fs::write(root.join("name with spaces & ünïcode"), b"x").expect("building the test tree");
    symlink("b/c/deep.txt", root.join("a/rel_link")).expect("building the test tree");
    symlink("../../nowhere", root.join("a/dangling")).expect("building the test tree");
    symlink("/etc/hostname", root.join("abs_link")).expect("building the test tree");
    symlink("a/b", root.join("dir_link")).expect("building the test tree");
    for i in 0..20_000 {
        std::fs::write(root.join(format!("big/entry{i:05}")), b"").expect("building the test tree");
    }
    let mode = |p: &str, m: u32| {
        std::fs::set_permissions(root.join(p), std::fs::Permissions::from_mode(m))
            .expect("building the test tree")
    };
    mode("a/f0", 0o600);
    mode("a/f1", 0o755);
    mode("a/f4095", 0o4751);
    mode("a/f4096", 0o444);
    mode("empty", 0o1777);
    mode("a/empty2", 0o700);
    // Distinct nanosecond mtimes everywhere, set last (children before parents).
    let mut n = 0;
    let all = walk(root);
    for m in all.iter().rev() {
        n += 1;
        set_mtime(
            &root.join(&m.rel),
            1_600_000_000 + n,
            (n * 7_777_777) % 1_000_000_000,
        );
    }
    set_mtime(root, 1_500_000_000, 123_456_789);
}

/// A tmpfs of a given size mounted on a fresh temp dir (root only), unmounted on drop: a
/// disk that fills up.
#[derive(Debug)]
pub struct SmallTmpfs {
    dir: tempfile::TempDir,
}

impl SmallTmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it, e.g. "2m").
    pub fn mount(size: &str) -> SmallTmpfs {
        let dir = tempfile::tempdir().expect("tempdir");
        run(Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "ferry-test-full",
            ])
            .arg(dir.path()));
        SmallTmpfs { dir }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// `ferry status PATH --json`, parsed (panics with ferry's message if it fails).
pub fn status(path: &Path) -> serde_json::Value {
    let out = ferry()
        .arg("status")
        .arg(path)
        .arg("--json")
        .output()
        .expect("run ferry status");
    assert!(
        out.status.success(),
        "ferry status {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("ferry status --json output")
}
