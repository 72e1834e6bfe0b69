//! ferryd's TOML config file (flags override it) and the systemd unit examples in
//! docs/systemd/.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::path::PathBuf;
use std::process::Command;

use ferry_tests::{bin, require_fuse, which, write_random, TestMount, TestServer};

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/systemd")
}

#[test]
fn config_file_settings_apply_and_flags_override_them() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f"), 3 << 20, 1);
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("ferryd.toml");
    std::fs::write(
        &cfg,
        "export = \"/nonexistent\"\nchunk_size = 256\nmax-inflight = 16\nverbose = 1\n",
    )
    .unwrap();
    // chunk_size comes from the file; the command line's --export (the test server passes
    // one) wins over the file's.
    let server = TestServer::start_with(src.path(), &["--config", cfg.to_str().unwrap()]);
    let mount = TestMount::mount(&server.addr, &[]);
    let log = mount.log_text();
    assert!(log.contains("chunk 256 KiB"), "{log}");
    assert_eq!(
        std::fs::read(mount.path().join("f")).unwrap().len(),
        3 << 20
    );
}

#[test]
fn config_file_mistakes_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for (text, want) in [
        ("bogus = 1\n", "unknown setting 'bogus'"),
        (
            "insecure = \"yes\"\n",
            "insecure is a string: expected true or false",
        ),
        ("export = \n", "not valid TOML"),
    ] {
        let cfg = dir.path().join("c.toml");
        std::fs::write(&cfg, text).unwrap();
        let out = Command::new(bin("ferryd"))
            .arg("--config")
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains(want), "{text:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    let out = Command::new(bin("ferryd"))
        .args(["--config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read it"));
}

#[test]
fn the_example_config_and_systemd_units_are_valid() {
    // Every key of the example is a ferryd option (--help exits 0 after parsing them).
    let out = Command::new(bin("ferryd"))
        .arg("--config")
        .arg(docs().join("ferryd.toml"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let Some(analyze) = which("systemd-analyze") else {
        eprintln!("systemd-analyze not installed: units not verified");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let unit = std::fs::read_to_string(docs().join("ferryd.service"))
        .unwrap()
        .replace("/usr/local/bin/ferryd", bin("ferryd").to_str().unwrap());
    std::fs::write(dir.path().join("ferryd.service"), unit).unwrap();
    std::fs::copy(
        docs().join("mnt-oradata.mount"),
        dir.path().join("mnt-oradata.mount"),
    )
    .unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(dir.path().join("ferryd.service"))
        .arg(dir.path().join("mnt-oradata.mount"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
