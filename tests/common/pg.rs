//! A real PostgreSQL for the tests whose copy must start as a database: a cluster made with
//! `initdb`, a server on a data directory (stopped on drop), run as user `postgres`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{is_root, run};

/// Whether this is root; else [`crate::skip`]s (only root may give files away).
pub fn root_or_skip(what: &str) -> bool {
    is_root() || crate::skip(&format!("{what} needs root"))
}

/// Gives `p` (not following a symlink) to `uid`:`gid`.
pub fn chown(p: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(p, Some(uid), Some(gid)).expect("lchown");
}

/// The binaries of the newest PostgreSQL installed (Debian's layout), if any.
pub fn pg_bin() -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("initdb").exists())
        .collect();
    v.sort();
    v.pop()
}

/// A PostgreSQL server on a data directory, stopped on drop.
#[derive(Debug)]
pub struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    socket: PathBuf,
}

impl Postgres {
    pub fn as_postgres(&self, prog: &str) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(self.bin.join(prog));
        c
    }

    pub fn start(bin: &Path, data: &Path, socket: &Path) -> Postgres {
        let pg = Postgres {
            bin: bin.to_path_buf(),
            data: data.to_path_buf(),
            socket: socket.to_path_buf(),
        };
        let opts = format!(
            "-c listen_addresses='' -c unix_socket_directories={} -c fsync=off",
            socket.display()
        );
        let log = socket.join("log");
        let mut cmd = pg.as_postgres("pg_ctl");
        cmd.arg("-D")
            .arg(data)
            .args(["-w", "-t", "60", "-l"])
            .arg(&log)
            .args(["-o", &opts, "start"]);
        // The server's own log says why it did not start.
        crate::run_explained(&mut cmd, || {
            let log = std::fs::read_to_string(&log).unwrap_or_else(|e| format!("({e})"));
            format!("server log:\n{log}")
        });
        pg
    }

    pub fn sql(&self, q: &str) -> String {
        run(self
            .as_postgres("psql")
            .arg("-h")
            .arg(&self.socket)
            .args(["-X", "-A", "-t", "-d", "postgres", "-c", q]))
        .trim()
        .to_string()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = self
            .as_postgres("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A stopped PostgreSQL cluster with a table of 20,000 rows in `top/export/pgdata`, in
/// directories postgres can enter; `None` (skipped) without root or PostgreSQL. Returns the
/// binaries' directory, the export, and postgres's uid and gid.
pub fn source_cluster(top: &Path) -> Option<(PathBuf, PathBuf, (u32, u32))> {
    if !root_or_skip("a PostgreSQL data directory") {
        return None;
    }
    let Some(pg) = pg_bin() else {
        crate::skip("PostgreSQL is not installed");
        return None;
    };
    std::fs::set_permissions(top, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let (export, sock) = (top.join("export"), top.join("sock"));
    let (uid, gid) = {
        use nix::unistd::User;
        let u = User::from_name("postgres")
            .expect("user database")
            .expect("user postgres (the package makes it)");
        (u.uid.as_raw(), u.gid.as_raw())
    };
    for d in [&export, &sock] {
        std::fs::create_dir(d).expect("mkdir");
        chown(d, uid, gid);
    }
    let data = export.join("pgdata");
    run(Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(pg.join("initdb"))
        .args(["-D"])
        .arg(&data)
        .args(["-A", "trust", "--no-sync", "-E", "UTF8"])
        .stdout(Stdio::null()));
    let src = Postgres::start(&pg, &data, &sock);
    src.sql("create table t as select g as id, md5(g::text) as v from generate_series(1, 20000) g");
    run(src
        .as_postgres("pg_ctl")
        .arg("-D")
        .arg(&data)
        .args(["-m", "fast", "-w", "stop"]));
    Some((pg, export, (uid, gid)))
}

/// A directory postgres may keep its socket in.
pub fn socket_dir(top: &Path, name: &str, owner: (u32, u32)) -> PathBuf {
    let d = top.join(name);
    std::fs::create_dir(&d).expect("mkdir");
    chown(&d, owner.0, owner.1);
    d
}
