//! The protocol suite written from docs/PROTOCOL.md alone (`tests/spec-client/`, Python: a
//! client of its own and 270-odd checks of what the specification says), run against this
//! workspace's ferryd: every operation byte-exact against its export, the handshake and
//! its refusals, TLS and tokens, the limits and timeouts of §16, confinement (paths, and
//! symlinks swapped in while requests run), and escaped logs. A check that fails names the
//! section it holds ferryd to.

use std::process::Command;

use ferry_tests::{bin, is_root, skip};

/// The Python modules the suite's client needs (scripts/prereqs.sh installs them).
const MODULES: &str = "blake3, xxhash, lz4, zstandard";

#[test]
fn ferryd_meets_the_protocol_suite_written_from_the_specification_alone() {
    if !is_root() {
        skip("the protocol suite needs root (device nodes, trusted.* attributes, 127.0.0.2-4)");
        return;
    }
    let have = Command::new("python3")
        .args(["-c", &format!("import {MODULES}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        skip(&format!(
            "python3 with the modules {MODULES} is needed (scripts/prereqs.sh installs them)"
        ));
        return;
    }
    let suite = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("spec-client/suite.py");
    let out = Command::new("python3")
        // No __pycache__ left in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .arg(&suite)
        .arg("--ferryd")
        .arg(bin("ferryd"))
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let failed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("FAIL")).collect();
    let summary = stdout.lines().last().unwrap_or("");
    assert!(
        out.status.success() && failed.is_empty(),
        "the protocol suite failed ({summary}):\n{}\nstderr:\n{}",
        failed.join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every check ran: a suite that stopped early fails above, one that ran none fails here.
    let passed: u32 = summary
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= 250, "only {passed} checks passed: {summary}");
}
