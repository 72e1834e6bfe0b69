//! TLS and token authentication end to end: a TLS mount copies identically; every way of
//! getting it wrong is refused promptly with one clear line and no mount.

#![allow(clippy::unwrap_used)] // tests may panic on setup failures

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ferry_tests::{bin, is_mounted, require_fuse, run, write_random, TestMount, TestServer};

/// A CA, a server certificate it signed (for localhost and 127.0.0.1), an expired one, a
/// client certificate, and an unrelated CA; written as PEM files into `dir`.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        use rcgen::{date_time_ymd, BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let write = |name: &str, text: String| std::fs::write(dir.join(name), text).unwrap();
        let ca = |cn: &str| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, cn);
            let cert = p.self_signed(&key).unwrap();
            (cert, key)
        };
        let (ca_cert, ca_key) = ca("ferry test CA");
        let (other_cert, other_key) = ca("some other CA");
        write("ca.pem", ca_cert.pem());
        write("other-ca.pem", other_cert.pem());
        let leaf_of = |names: Vec<String>, expired: bool, file: &str, by: (&_, &_)| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(names).unwrap();
            if expired {
                p.not_before = date_time_ymd(2020, 1, 1);
                p.not_after = date_time_ymd(2021, 1, 1);
            }
            let cert = p.signed_by(&key, by.0, by.1).unwrap();
            write(&format!("{file}.pem"), cert.pem());
            write(&format!("{file}-key.pem"), key.serialize_pem());
        };
        let leaf = |names, expired, file: &str| leaf_of(names, expired, file, (&ca_cert, &ca_key));
        leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            false,
            "server",
        );
        leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            true,
            "expired",
        );
        leaf(vec!["client.example".into()], false, "client");
        leaf_of(
            vec!["client.example".into()],
            false,
            "other-client",
            (&other_cert, &other_key),
        );
        Pki {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }
}

/// `ferry mount` expected to fail: its one-line error, after checking it came promptly, left
/// nothing mounted and names each cause once.
fn mount_fails(remote: &str, args: &[&str]) -> String {
    let mnt = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let out = ferry_tests::ferry()
        .arg("mount")
        .arg(remote)
        .arg(mnt.path())
        .args(["--connect-timeout", "5"])
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!out.status.success(), "mount with {args:?} should fail");
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "{args:?}: took {:?}",
        t.elapsed()
    );
    assert!(!is_mounted(mnt.path()), "{args:?} left a mount");
    let last = err.lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("ferry: "), "{args:?}: {err}");
    // Each cause once (errors that name their cause in their own message also return it as
    // their source: printed by walking the chain, it came twice).
    let clauses: Vec<&str> = last.split(": ").collect();
    for (i, c) in clauses.iter().enumerate() {
        assert!(
            c.len() < 12 || !clauses[i + 1..].contains(c),
            "a cause printed twice: {last}"
        );
    }
    last
}

/// Sends `server` SIGHUP (ferryd then reads its certificate, client CA and token again).
fn sighup(server: &TestServer) {
    // SAFETY: kill(2) with a pid of ours and a signal number; no memory involved.
    assert_eq!(unsafe { libc::kill(server.pid() as i32, libc::SIGHUP) }, 0);
}

/// ferryd serving `export` over TLS with `cert` and `key`, and `extra` options.
fn tls_server(export: &Path, cert: &str, key: &str, extra: &[&str]) -> TestServer {
    let args = [&["--tls-cert", cert, "--tls-key", key][..], extra].concat();
    TestServer::start_with(export, &args)
}

fn token_file(dir: &Path, name: &str) -> String {
    let p = dir.join(name);
    let mut t = vec![0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut t);
    std::fs::write(
        &p,
        format!(
            "{}\n",
            t.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    )
    .unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn a_tls_mount_with_a_token_copies_identically_and_mistakes_are_refused() {
    require_fuse!();
    let keys = tempfile::tempdir().unwrap();
    let pki = Pki::new(keys.path());
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("f.bin"), (24 << 20) + 5, 1);
    let token = token_file(keys.path(), "token");
    let server = tls_server(
        src.path(),
        &pki.path("server.pem"),
        &pki.path("server-key.pem"),
        &["--token-file", &token],
    );
    let ca = pki.path("ca.pem");
    let mount = TestMount::mount(&server.addr, &["--ca", &ca, "--token-file", &token]);
    let dst = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg(mount.path().join("f.bin"))
        .arg(dst.path()));
    run(Command::new("cmp")
        .arg(src.path().join("f.bin"))
        .arg(dst.path().join("f.bin")));
    drop(mount);

    // Plain client to a TLS server.
    let e = mount_fails(&server.addr, &["--token-file", &token]);
    assert!(e.contains("requires TLS"), "{e}");
    // Another CA.
    let e = mount_fails(
        &server.addr,
        &["--ca", &pki.path("other-ca.pem"), "--token-file", &token],
    );
    assert!(e.contains("not signed by the --ca given"), "{e}");
    // A wrong pinned fingerprint.
    let e = mount_fails(
        &server.addr,
        &[
            "--tls-fingerprint",
            "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "--token-file",
            &token,
        ],
    );
    assert!(e.contains("not the one pinned"), "{e}");
    // No token, a wrong token.
    let e = mount_fails(&server.addr, &["--ca", &ca]);
    assert!(e.contains("requires a token"), "{e}");
    let wrong = token_file(keys.path(), "wrong");
    let e = mount_fails(&server.addr, &["--ca", &ca, "--token-file", &wrong]);
    assert!(e.contains("wrong token"), "{e}");
    assert!(server
        .log_text()
        .contains("authentication failed: wrong token"));
}

#[test]
fn an_expired_certificate_and_a_plaintext_server_are_refused_clearly() {
    require_fuse!();
    let keys = tempfile::tempdir().unwrap();
    let pki = Pki::new(keys.path());
    let src = tempfile::tempdir().unwrap();
    let expired = tls_server(
        src.path(),
        &pki.path("expired.pem"),
        &pki.path("expired-key.pem"),
        &[],
    );
    let e = mount_fails(&expired.addr, &["--ca", &pki.path("ca.pem")]);
    assert!(e.contains("has expired"), "{e}");
    // TLS client, plaintext server.
    let plain = TestServer::start(src.path());
    let e = mount_fails(&plain.addr, &["--ca", &pki.path("ca.pem")]);
    assert!(e.contains("does not offer TLS"), "{e}");
    // A client with a token insists that the server proves it holds it.
    let token = token_file(keys.path(), "t");
    let e = mount_fails(&plain.addr, &["--token-file", &token]);
    assert!(e.contains("did not ask for the token"), "{e}");
}

#[test]
fn pinning_the_fingerprint_gen_cert_prints_works() {
    require_fuse!();
    let keys = tempfile::tempdir().unwrap();
    let (cert, key) = (keys.path().join("c.pem"), keys.path().join("k.pem"));
    let fp = gen_cert(&cert, &key);
    assert!(fp.starts_with("SHA256:") && fp.len() == 7 + 44, "{fp}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("x"), 100_000, 2);
    let server = tls_server(
        src.path(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
        &[],
    );
    let mount = TestMount::mount(&server.addr, &["--tls-fingerprint", &fp]);
    run(Command::new("cmp")
        .arg(src.path().join("x"))
        .arg(mount.path().join("x")));
}

/// `ferryd gen-cert` into `cert` and `key` (replacing what they hold); its fingerprint.
fn gen_cert(cert: &Path, key: &Path) -> String {
    run(Command::new(bin("ferryd"))
        .args(["gen-cert", "--cert"])
        .arg(cert)
        .arg("--key")
        .arg(key))
    .trim()
    .to_string()
}

#[test]
fn sighup_presents_a_renewed_certificate_and_keeps_the_old_one_when_the_new_does_not_load() {
    // A certificate renewed in place (certbot, an internal CA): on SIGHUP ferryd presents the
    // new one to new connections, without a restart; a mount made before goes on. Files that
    // do not load are logged in one line and the certificate in use stays.
    require_fuse!();
    let keys = tempfile::tempdir().unwrap();
    let (cert, key) = (keys.path().join("c.pem"), keys.path().join("k.pem"));
    let old = gen_cert(&cert, &key);
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("x"), 100_000, 3);
    let mut server = tls_server(
        src.path(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
        &[],
    );
    assert!(
        ferry_tests::wait_for(Duration::from_secs(5), || server
            .log_text()
            .contains(&format!("certificate {old}"))),
        "the start-up line names the certificate: {}",
        server.log_text()
    );
    let before = TestMount::mount(&server.addr, &["--tls-fingerprint", &old]);

    let new = gen_cert(&cert, &key);
    assert_ne!(old, new);
    sighup(&server);
    assert!(
        ferry_tests::wait_for(Duration::from_secs(10), || server
            .log_text()
            .contains(&format!("now {new}"))),
        "no reload logged: {}",
        server.log_text()
    );
    let after = TestMount::mount(&server.addr, &["--tls-fingerprint", &new]);
    run(Command::new("cmp")
        .arg(src.path().join("x"))
        .arg(after.path().join("x")));
    let e = mount_fails(&server.addr, &["--tls-fingerprint", &old]);
    assert!(e.contains(&new) && e.contains("not the one pinned"), "{e}");
    // The mount made before keeps its connections: a file written since reads through it.
    write_random(&src.path().join("y"), 50_000, 4);
    run(Command::new("cmp")
        .arg(src.path().join("y"))
        .arg(before.path().join("y")));

    // A certificate file that does not load: one line, the certificate in use stays.
    std::fs::write(&cert, "not a certificate\n").unwrap();
    sighup(&server);
    assert!(
        ferry_tests::wait_for(Duration::from_secs(10), || server
            .log_text()
            .contains("cannot read the TLS certificate again")),
        "no failed reload logged: {}",
        server.log_text()
    );
    let line = server
        .log_text()
        .lines()
        .find(|l| l.contains("cannot read the TLS certificate again"))
        .unwrap()
        .to_string();
    assert!(
        line.contains(cert.to_str().unwrap()) && line.contains(&format!("still presenting {new}")),
        "{line}"
    );
    assert!(server.is_running());
    let again = TestMount::mount(&server.addr, &["--tls-fingerprint", &new]);
    run(Command::new("cmp")
        .arg(src.path().join("x"))
        .arg(again.path().join("x")));
}

#[test]
fn sighup_reads_the_client_ca_and_the_token_again_and_keeps_them_when_the_new_do_not_load() {
    // A client CA and a token rotated without a restart: on SIGHUP new connections need the
    // new ones, a mount made before goes on, and files that do not load are logged in one
    // line with what was read before kept.
    require_fuse!();
    let keys = tempfile::tempdir().unwrap();
    let pki = Pki::new(keys.path());
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("x"), 100_000, 5);
    let client_ca = keys.path().join("client-ca.pem");
    std::fs::copy(pki.path("ca.pem"), &client_ca).unwrap();
    let token = token_file(keys.path(), "token");
    let mut server = tls_server(
        src.path(),
        &pki.path("server.pem"),
        &pki.path("server-key.pem"),
        &[
            "--client-ca",
            client_ca.to_str().unwrap(),
            "--token-file",
            &token,
        ],
    );
    let ca = pki.path("ca.pem");
    let addr = server.addr.clone();
    let client = |name: &str, token: &str| -> Vec<String> {
        [
            "--ca",
            &ca,
            "--cert",
            &pki.path(&format!("{name}.pem")),
            "--key",
            &pki.path(&format!("{name}-key.pem")),
            "--token-file",
            token,
        ]
        .map(String::from)
        .to_vec()
    };
    let mount_as = |name: &str, token: &str| {
        let a = client(name, token);
        TestMount::mount(&addr, &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let fails_as = |name: &str, token: &str| {
        let a = client(name, token);
        mount_fails(&addr, &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let before = mount_as("client", &token);
    let e = fails_as("other-client", &token);
    assert!(e.contains("certificate"), "{e}");

    // Rotated: the other CA signs clients now, and a new token.
    let old_token = keys.path().join("old-token");
    std::fs::copy(&token, &old_token).unwrap();
    let old_token = old_token.to_str().unwrap().to_string();
    assert_eq!(token_file(keys.path(), "token"), token);
    std::fs::copy(pki.path("other-ca.pem"), &client_ca).unwrap();
    sighup(&server);
    assert!(
        ferry_tests::wait_for(Duration::from_secs(10), || {
            let log = server.log_text();
            log.contains("client CA") && log.contains("read again; new connections need the token")
        }),
        "no reload logged: {}",
        server.log_text()
    );
    let after = mount_as("other-client", &token);
    run(Command::new("cmp")
        .arg(src.path().join("x"))
        .arg(after.path().join("x")));
    let e = fails_as("client", &token);
    assert!(e.contains("certificate"), "the old CA's client: {e}");
    let e = fails_as("other-client", &old_token);
    assert!(e.contains("wrong token"), "the old token: {e}");
    // The mount made before keeps its connections: a file written since reads through it.
    write_random(&src.path().join("y"), 50_000, 6);
    run(Command::new("cmp")
        .arg(src.path().join("y"))
        .arg(before.path().join("y")));

    // Files that do not load: one line each, what was read before stays.
    let kept_token = keys.path().join("kept-token");
    std::fs::copy(&token, &kept_token).unwrap();
    let kept_token = kept_token.to_str().unwrap().to_string();
    std::fs::write(&client_ca, "not a certificate\n").unwrap();
    std::fs::write(&token, "short\n").unwrap();
    sighup(&server);
    assert!(
        ferry_tests::wait_for(Duration::from_secs(10), || {
            let log = server.log_text();
            log.contains("cannot read the client CA again")
                && log.contains("cannot read the token again")
        }),
        "no failed reload logged: {}",
        server.log_text()
    );
    let log = server.log_text();
    let line = |what: &str| log.lines().find(|l| l.contains(what)).unwrap().to_string();
    let ca_line = line("cannot read the client CA again");
    assert!(
        ca_line.contains(client_ca.to_str().unwrap()) && ca_line.contains("read before"),
        "{ca_line}"
    );
    let token_line = line("cannot read the token again");
    assert!(
        token_line.contains(&token) && token_line.contains("read before"),
        "{token_line}"
    );
    assert!(server.is_running());
    let again = mount_as("other-client", &kept_token);
    run(Command::new("cmp")
        .arg(src.path().join("x"))
        .arg(again.path().join("x")));
}

#[test]
fn mutual_tls_needs_a_client_certificate_from_the_client_ca() {
    require_fuse!();
    let keys = tempfile::tempdir().unwrap();
    let pki = Pki::new(keys.path());
    let src = tempfile::tempdir().unwrap();
    write_random(&src.path().join("x"), 5000, 3);
    let server = tls_server(
        src.path(),
        &pki.path("server.pem"),
        &pki.path("server-key.pem"),
        &["--client-ca", &pki.path("ca.pem")],
    );
    let ca = pki.path("ca.pem");
    let e = mount_fails(&server.addr, &["--ca", &ca]);
    assert!(e.contains("client certificate"), "{e}");
    let mount = TestMount::mount(
        &server.addr,
        &[
            "--ca",
            &ca,
            "--cert",
            &pki.path("client.pem"),
            "--key",
            &pki.path("client-key.pem"),
        ],
    );
    run(Command::new("cmp")
        .arg(src.path().join("x"))
        .arg(mount.path().join("x")));
}

#[test]
fn ferryd_will_not_serve_a_network_in_the_clear_unless_told_to() {
    let src = tempfile::tempdir().unwrap();
    let out = Command::new(bin("ferryd"))
        .arg("--export")
        .arg(src.path())
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("without encryption or authentication"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A token is enough; so is --insecure.
    let keys = tempfile::tempdir().unwrap();
    let token = token_file(keys.path(), "t");
    for extra in [&["--token-file", token.as_str()][..], &["--insecure"][..]] {
        let s = TestServer::start_on(src.path(), "0.0.0.0:0", extra);
        assert!(s.addr.starts_with("0.0.0.0:"), "{}", s.addr);
    }
}
