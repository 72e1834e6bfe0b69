//! `--metrics ADDR`: ferryd and ferry serve Prometheus text on /metrics; scraped and parsed
//! after a copy, the counters say what happened. And `ferry mirror` on a terminal draws a
//! progress bar.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::Command;

use ferry_tests::{bin, require_fuse, run, which, write_random, TestMount, TestServer};

/// The address a process logged as `metrics on http://ADDR/metrics`.
fn metrics_addr(log: &str) -> Option<String> {
    let at = log.find("metrics on http://")? + "metrics on http://".len();
    let rest = &log[at..];
    Some(rest[..rest.find("/metrics")?].to_string())
}

/// GET /metrics, parsed into `name{labels}` → value; every sample line must parse.
fn scrape(addr: &str) -> HashMap<String, f64> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let mut out = HashMap::new();
    for line in body.lines() {
        if line.starts_with('#') || line.is_empty() {
            assert!(
                line.is_empty()
                    || line.starts_with("# HELP ferry_")
                    || line.starts_with("# TYPE ferry_"),
                "{line}"
            );
            continue;
        }
        let (name, value) = line.rsplit_once(' ').unwrap();
        assert!(name.starts_with("ferry_"), "{line}");
        out.insert(
            name.to_string(),
            value.parse::<f64>().unwrap_or_else(|_| panic!("{line}")),
        );
    }
    out
}

#[test]
fn ferryd_and_the_mount_serve_prometheus_metrics() {
    require_fuse!();
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f.bin"), 6 << 20, 4);
    let server = TestServer::start_with(src.path(), &["--metrics", "127.0.0.1:0"]);
    let mount = TestMount::mount(
        &server.addr,
        &["--metrics", "127.0.0.1:0", "--streams", "3"],
    );
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("f.bin"))
        .arg(dst.path()));

    let m = scrape(&metrics_addr(&mount.log_text()).expect("mount metrics address"));
    assert!(
        m["ferry_received_bytes_total{kind=\"decoded\"}"] >= (6 << 20) as f64,
        "{m:?}"
    );
    assert!(m["ferry_chunks_total"] >= 6.0, "{m:?}");
    assert_eq!(m["ferry_connected_streams"], 3.0);
    assert_eq!(m["ferry_checksum_failures_total"], 0.0);
    assert!(m.contains_key("ferry_compression_ratio"));
    // The fetch scheduler: the copy's bytes were readers' (demand or read-ahead), none the
    // mirror's (there is none), and the round trip has been measured.
    let class = |c: &str| m[&format!("ferry_scheduler_received_bytes_total{{class=\"{c}\"}}")];
    assert!(
        class("demand") + class("prediction") >= (6 << 20) as f64,
        "{m:?}"
    );
    assert_eq!(class("background"), 0.0);
    assert!(m["ferry_scheduler_base_rtt_seconds"] > 0.0, "{m:?}");
    for g in [
        "ferry_scheduler_queue_delay_seconds",
        "ferry_scheduler_target_delay_seconds",
        "ferry_scheduler_background_window_bytes",
        "ferry_scheduler_background_in_flight_bytes",
        "ferry_scheduler_piece_bytes",
        "ferry_scheduler_rate_bytes_per_second",
        "ferry_scheduler_readers_active",
        "ferry_scheduler_cpu_wait_ratio",
        "ferry_scheduler_background_pace_bytes_per_second",
    ] {
        assert!(m.contains_key(g), "{g} missing: {m:?}");
    }

    let s = scrape(&metrics_addr(&server.log_text()).expect("ferryd metrics address"));
    assert!(
        s["ferry_server_sent_bytes_total{kind=\"decoded\"}"] >= (6 << 20) as f64,
        "{s:?}"
    );
    assert_eq!(s["ferry_server_connected_clients"], 3.0, "{s:?}");
    assert!(s["ferry_server_requests_total"] >= 6.0);

    // Anything but /metrics is a 404.
    let mut c = std::net::TcpStream::connect(metrics_addr(&server.log_text()).unwrap()).unwrap();
    c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut r = String::new();
    c.read_to_string(&mut r).unwrap();
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
}

#[test]
fn ferry_mirror_draws_a_progress_bar_on_a_terminal_and_plain_lines_otherwise() {
    let Some(script) = which("script") else {
        eprintln!("skipped: script(1) is not installed");
        return;
    };
    let src = tempfile::tempdir().unwrap();
    for i in 0..4 {
        write_random(&src.path().join(format!("f{i}")), 12 << 20, 30 + i);
    }
    let server = TestServer::start(src.path());
    let dst = tempfile::tempdir().unwrap();
    // Slow enough (capped) that the bar is drawn several times.
    let cmd = format!(
        "{} mirror {} {} --bwlimit 24M",
        bin("ferry").display(),
        server.addr,
        dst.path().join("m").display()
    );
    let out = Command::new(script)
        .env("FERRY_STATE_DIR", ferry_tests::state_base())
        .args(["-qefc", &cmd, "/dev/null"])
        .output()
        .unwrap();
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{tty}");
    // indicatif's bar: bytes/total, percent, rate, ETA, files.
    assert!(tty.contains("ETA"), "{tty}");
    assert!(tty.contains("files "), "{tty}");
    assert!(tty.contains("MiB/s") || tty.contains("KiB/s"), "{tty}");
    // Not a terminal: no bar; a plain progress line every 5 s (this run takes about 7 s),
    // then the summary.
    let plain = ferry_tests::ferry()
        .arg("mirror")
        .arg(&server.addr)
        .arg(dst.path().join("n"))
        .args(["--bwlimit", "6M"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(plain.status.success(), "{err}");
    assert!(!err.contains('\r'), "{err}");
    let progress: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("ferry mirror: running "))
        .collect();
    assert!(!progress.is_empty(), "{err}");
    assert!(
        progress[0].contains(" of 48.0 MiB (") && progress[0].contains("ETA"),
        "{err}"
    );
    assert!(err.contains("complete and verified"), "{err}");
}

/// The walk of a fresh `ferry mirror` asks for a directory's listing and the contents of
/// its small files together: one ReadDirData per small directory, not a listing and then
/// runs (on a WAN every round trip on the walk's path counts), as ferryd's request counter
/// shows.
/// `ferry mirror` of `src` from a ferryd serving metrics (the copy must equal the source),
/// then ferryd's metrics.
fn mirror_and_scrape(src: &std::path::Path) -> HashMap<String, f64> {
    let server = TestServer::start_with(src, &["--metrics", "127.0.0.1:0"]);
    let dst = tempfile::tempdir().unwrap();
    let m = dst.path().join("m");
    ferry_tests::mirror(&server.addr, &m, &[]);
    run(Command::new("diff").arg("-r").arg(src).arg(&m));
    scrape(&metrics_addr(&server.log_text()).expect("ferryd metrics address"))
}

#[test]
fn a_fresh_mirror_takes_each_small_directory_with_its_files_in_one_request() {
    const DIRS: usize = 40;
    let src = tempfile::tempdir().unwrap();
    for d in 0..DIRS {
        let dir = src.path().join(format!("d{d:02}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..5 {
            std::fs::write(
                dir.join(format!("f{f}.txt")),
                format!("{d} {f}\n").repeat(40),
            )
            .unwrap();
        }
    }
    // And one directory whose small files overflow the first page: the rest of its listing
    // in plain pages, their contents in runs.
    let big = src.path().join("big");
    std::fs::create_dir(&big).unwrap();
    for f in 0..100 {
        write_random(&big.join(format!("b{f:03}")), 8 << 10, f);
    }
    let s = mirror_and_scrape(src.path());
    let requests = s["ferry_server_requests_total"];
    eprintln!("figures: {requests} requests for {} directories", DIRS + 2);
    // Per directory (and the root and big/): its listing with contents, and its extended
    // attributes; a few more for the whole copy (the root's attributes, owner names) and
    // for big/ (the rest of its listing, a few runs).
    let dirs = (DIRS + 2) as f64;
    assert!(
        requests <= 2.0 * dirs + 16.0,
        "{requests} requests for {dirs} directories"
    );
    // Every file came with a listing or a run: no Read.
    assert_eq!(
        s["ferry_server_chunks_total"],
        (DIRS * 5 + 100) as f64,
        "{s:?}"
    );
}

#[test]
fn directories_past_a_tree_page_with_no_subdirectory_come_with_their_files_not_as_tree_pages() {
    // A root whose own listing overflows a page of a tree's listings (ReadTree): the
    // directories in it are listed afterwards, each on its own. Those without a
    // subdirectory (a link count of 2 on this file system) have no tree under them to
    // bring: each comes as a listing with its files' contents (ReadDirData), not as a
    // tree page of one directory and then a run of its files.
    const LEAVES: usize = 40;
    let src = tempfile::tempdir().unwrap();
    for f in 0..6000 {
        std::fs::write(src.path().join(format!("entry-{f:05}")), format!("{f}\n")).unwrap();
    }
    for d in 0..LEAVES {
        let dir = src.path().join(format!("leaf{d:02}"));
        std::fs::create_dir(&dir).unwrap();
        for f in 0..3 {
            std::fs::write(dir.join(format!("f{f}")), format!("{d} {f}\n").repeat(30)).unwrap();
        }
    }
    let leaf_links = std::fs::metadata(src.path().join("leaf00")).unwrap();
    if std::os::unix::fs::MetadataExt::nlink(&leaf_links) != 2 {
        eprintln!("skipped: this file system does not count subdirectories in link counts");
        return;
    }
    let s = mirror_and_scrape(src.path());
    let kind = |k: &str| s[&format!("ferry_server_listings_total{{kind=\"{k}\"}}")];
    eprintln!(
        "figures: read_tree {}, read_dir_data {}, read_dir {}",
        kind("read_tree"),
        kind("read_dir_data"),
        kind("read_dir")
    );
    // The root's tree page only (its listing then completed in plain pages).
    assert!(kind("read_tree") <= 2.0, "{s:?}");
    assert!(kind("read_dir_data") >= LEAVES as f64, "{s:?}");
    // Every small file came with a listing or a run: no Read.
    assert_eq!(
        s["ferry_server_chunks_total"],
        (6000 + LEAVES * 3) as f64,
        "{s:?}"
    );
}
