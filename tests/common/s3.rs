//! A real S3 server for the tests: a Garage cluster on 127.0.0.1, started by
//! `scripts/garage-cluster.sh` (Garage itself installed by `scripts/prereqs-garage.sh`),
//! stopped on drop. Objects are put with signed requests (rusty-s3 + reqwest), as a backup
//! tool would upload them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

/// Whether a Garage binary is here. Returns false (after printing why) when the test should
/// skip; panics instead when `FERRY_REQUIRE_FUSE=1` (CI: the prerequisites install it).
pub fn garage_available() -> bool {
    let found = std::env::var_os("GARAGE_BIN")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/opt/ferry/garage/bin/garage")])
        .any(|p| p.is_file())
        || crate::which("garage").is_some();
    if !found {
        let why = "Garage is not installed (run scripts/prereqs-garage.sh)";
        if std::env::var("FERRY_REQUIRE_FUSE").as_deref() == Ok("1") {
            panic!("a real S3 server is required (FERRY_REQUIRE_FUSE=1) but unavailable: {why}");
        }
        eprintln!("skipping: {why}");
    }
    found
}

/// Skips the calling test (returns from it) when no S3 server can be started.
#[macro_export]
macro_rules! require_s3 {
    () => {
        if !$crate::s3::garage_available() {
            return;
        }
    };
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("scripts")
        .join("garage-cluster.sh")
}

/// A running Garage cluster with one bucket and a key that may read and write it.
#[derive(Debug)]
pub struct Garage {
    dir: tempfile::TempDir,
    env: HashMap<String, String>,
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
}

impl Garage {
    /// Starts `nodes` nodes (replication factor `nodes`).
    /// A start that fails is tried once more, its output on stderr: one start beside tests
    /// loading this 2-core machine failed once (its message was not kept; this keeps it).
    pub fn start(nodes: usize) -> Garage {
        let mut tries = 0;
        let dir = loop {
            let dir = tempfile::tempdir().expect("tempdir");
            let out = Command::new("bash")
                .arg(script())
                .arg("start")
                .arg(dir.path())
                .arg(nodes.to_string())
                .output()
                .expect("run garage-cluster.sh");
            if out.status.success() {
                break dir;
            }
            // Nothing is left running: the script stops what it started on failure.
            let why = format!(
                "garage-cluster.sh start failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            tries += 1;
            assert!(tries < 2, "{why}");
            eprintln!("{why}\ntrying once more");
        };
        let text = std::fs::read_to_string(dir.path().join("env")).expect("env file");
        let env = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect();
        let _ = rustls::crypto::ring::default_provider().install_default();
        Garage {
            dir,
            env,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime"),
            http: reqwest::Client::new(),
        }
    }

    /// `s3://BUCKET/PREFIX` (`prefix` may be empty).
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.env["FERRY_S3_BUCKET"])
    }

    /// The S3 endpoints, comma-separated.
    pub fn endpoints(&self) -> &str {
        &self.env["FERRY_S3_ENDPOINTS"]
    }

    /// `ferry` arguments naming the endpoints and region.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--endpoint".into(),
            self.endpoints().into(),
            "--region".into(),
            self.env["AWS_REGION"].clone(),
        ]
    }

    /// The key's environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), and empty values
    /// (which ferry takes for unset) for what the caller's environment might add to it.
    pub fn credentials(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
            .iter()
            .map(|k| (k.to_string(), self.env[*k].clone()))
            .collect();
        for k in [
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_ENDPOINT_URL",
            "AWS_ENDPOINT_URL_S3",
        ] {
            v.push((k.to_string(), String::new()));
        }
        v
    }

    /// A `ferry` command with the key in its environment.
    pub fn ferry(&self) -> Command {
        let mut c = crate::ferry();
        c.envs(self.credentials());
        c
    }

    fn bucket(&self, node: usize) -> Bucket {
        let ep = self.endpoints().split(',').nth(node).expect("node");
        Bucket::new(
            url::Url::parse(ep).expect("endpoint"),
            UrlStyle::Path,
            self.env["FERRY_S3_BUCKET"].clone(),
            self.env["AWS_REGION"].clone(),
        )
        .expect("bucket")
    }

    fn creds(&self) -> Credentials {
        Credentials::new(
            self.env["AWS_ACCESS_KEY_ID"].clone(),
            self.env["AWS_SECRET_ACCESS_KEY"].clone(),
        )
    }

    /// Puts object `key` (through node 0), with a CRC32C checksum when `crc32c`.
    pub fn put(&self, key: &str, data: &[u8], crc32c: bool) {
        let kind = crc32c.then_some(ferry_client::DigestKind::Crc32c);
        self.put_checked(key, data, kind);
    }

    /// Puts object `key` (through node 0) with a full-object checksum of `kind` (SHA-256,
    /// CRC64NVME, CRC32C or CRC32), which the store checks and keeps; none with `None`.
    pub fn put_checked(&self, key: &str, data: &[u8], kind: Option<ferry_client::DigestKind>) {
        use ferry_client::DigestKind as K;
        let (bucket, creds) = (self.bucket(0), self.creds());
        let mut a = bucket.put_object(Some(&creds), key);
        let sum = kind.map(|k| {
            let name = match k {
                K::Sha256 => "x-amz-checksum-sha256",
                K::Crc64Nvme => "x-amz-checksum-crc64nvme",
                K::Crc32c => "x-amz-checksum-crc32c",
                K::Crc32 => "x-amz-checksum-crc32",
                other => panic!("S3 has no checksum {other:?}"),
            };
            let mut d = ferry_client::Digester::new(k);
            d.update(data);
            let v = base64::engine::general_purpose::STANDARD.encode(d.finish().value);
            (name, v)
        });
        if let Some((name, v)) = &sum {
            a.headers_mut().insert(*name, v.clone());
        }
        let url = a.sign(Duration::from_secs(600));
        let mut req = self.http.put(url).body(data.to_vec());
        if let Some((name, v)) = &sum {
            req = req.header(*name, v);
        }
        let r = self.rt.block_on(req.send()).expect("PUT");
        assert!(
            r.status().is_success(),
            "PUT {key}: {} {}",
            r.status(),
            self.rt.block_on(r.text()).unwrap_or_default()
        );
    }

    /// Puts `key` as a multipart upload of parts of `part` bytes, without checksums: its
    /// ETag is then no MD5 of the bytes, and the store keeps no digest of them.
    pub fn put_multipart(&self, key: &str, data: &[u8], part: usize) {
        self.put_multipart_checked(key, data, part, None);
    }

    /// As [`Garage::put_multipart`], with a full-object checksum of `kind` (CRC64NVME,
    /// CRC32C or CRC32: the kinds S3 combines from its parts) when given: the store then
    /// keeps that digest of the whole object, and its ETag is still no MD5 of it.
    pub fn put_multipart_checked(
        &self,
        key: &str,
        data: &[u8],
        part: usize,
        kind: Option<ferry_client::DigestKind>,
    ) {
        use ferry_client::DigestKind as K;
        let (bucket, creds) = (self.bucket(0), self.creds());
        let sign = Duration::from_secs(600);
        let (algorithm, header) = match kind {
            None => ("", ""),
            Some(K::Crc64Nvme) => ("CRC64NVME", "x-amz-checksum-crc64nvme"),
            Some(K::Crc32c) => ("CRC32C", "x-amz-checksum-crc32c"),
            Some(K::Crc32) => ("CRC32", "x-amz-checksum-crc32"),
            Some(other) => panic!("no full-object checksum {other:?} of parts"),
        };
        let sum = |bytes: &[u8]| {
            let mut d = ferry_client::Digester::new(kind.expect("a kind"));
            d.update(bytes);
            base64::engine::general_purpose::STANDARD.encode(d.finish().value)
        };
        let mut a = bucket.create_multipart_upload(Some(&creds), key);
        let mut headers = Vec::new();
        if kind.is_some() {
            headers.push(("x-amz-checksum-algorithm", algorithm.to_string()));
            headers.push(("x-amz-checksum-type", "FULL_OBJECT".to_string()));
        }
        for (k, v) in &headers {
            a.headers_mut().insert(*k, v.clone());
        }
        let url = a.sign(sign);
        let mut req = self.http.post(url);
        for (k, v) in &headers {
            req = req.header(*k, v);
        }
        let body = self
            .rt
            .block_on(async { req.send().await?.text().await })
            .expect("create multipart upload");
        let id = rusty_s3::actions::CreateMultipartUpload::parse_response(&body)
            .unwrap_or_else(|e| panic!("create multipart upload {key}: {e}: {body}"))
            .upload_id()
            .to_string();
        let mut etags = Vec::new();
        for (i, chunk) in data.chunks(part).enumerate() {
            let n = u16::try_from(i + 1).expect("part number");
            let mut a = bucket.upload_part(Some(&creds), key, n, &id);
            let part_sum = kind.map(|_| sum(chunk));
            if let Some(v) = &part_sum {
                a.headers_mut().insert(header, v.clone());
            }
            let mut req = self.http.put(a.sign(sign)).body(chunk.to_vec());
            if let Some(v) = &part_sum {
                req = req.header(header, v);
            }
            let r = self.rt.block_on(req.send()).expect("upload part");
            assert!(r.status().is_success(), "part {n} of {key}: {}", r.status());
            let etag = r.headers().get("etag").expect("part ETag");
            etags.push(etag.to_str().expect("ETag text").to_string());
        }
        let mut a = bucket.complete_multipart_upload(
            Some(&creds),
            key,
            &id,
            etags.iter().map(String::as_str),
        );
        let whole = kind.map(|_| sum(data));
        if let Some(v) = &whole {
            a.headers_mut().insert(header, v.clone());
            a.headers_mut().insert("x-amz-checksum-type", "FULL_OBJECT");
        }
        let url = a.sign(sign);
        let mut req = self.http.post(url).body(a.body());
        if let Some(v) = &whole {
            req = req
                .header(header, v)
                .header("x-amz-checksum-type", "FULL_OBJECT");
        }
        let r = self
            .rt
            .block_on(req.send())
            .expect("complete multipart upload");
        assert!(
            r.status().is_success(),
            "complete {key}: {} {}",
            r.status(),
            self.rt.block_on(r.text()).unwrap_or_default()
        );
    }

    /// Puts many small objects at once (32 requests in flight): `(key, bytes)`.
    pub fn put_many(&self, objects: Vec<(String, Vec<u8>)>) {
        let (bucket, creds) = (self.bucket(0), self.creds());
        let reqs: Vec<_> = objects
            .into_iter()
            .map(|(key, data)| {
                let url = bucket
                    .put_object(Some(&creds), &key)
                    .sign(Duration::from_secs(600));
                (key, self.http.put(url).body(data))
            })
            .collect();
        self.rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for (key, req) in reqs {
                if set.len() >= 32 {
                    let r = set.join_next().await.expect("task").expect("join");
                    check_put(r);
                }
                set.spawn(async move { (key, req.send().await) });
            }
            while let Some(r) = set.join_next().await {
                check_put(r.expect("join"));
            }
        });
    }

    /// Puts every regular file under `root` as `prefix/RELATIVE`.
    pub fn put_tree(&self, root: &Path, prefix: &str) -> usize {
        let mut n = 0;
        for m in crate::walk(root) {
            if m.mode & 0o170000 != 0o100000 {
                continue;
            }
            let data = std::fs::read(root.join(&m.rel)).expect("read");
            let rel = m.rel.to_str().expect("UTF-8 names");
            let key = if prefix.is_empty() {
                rel.to_string()
            } else {
                format!("{prefix}/{rel}")
            };
            self.put(&key, &data, n % 2 == 0);
            n += 1;
        }
        n
    }

    /// Deletes object `key`.
    pub fn delete(&self, key: &str) {
        let (bucket, creds) = (self.bucket(0), self.creds());
        let url = bucket
            .delete_object(Some(&creds), key)
            .sign(Duration::from_secs(600));
        let r = self
            .rt
            .block_on(self.http.delete(url).send())
            .expect("DELETE");
        assert!(r.status().is_success(), "DELETE {key}: {}", r.status());
    }

    /// `rclone` (the real one, as users upload trees with it) with a remote `g:` for this
    /// cluster's first node, e.g. `g.rclone().args(["copy", "-M", SRC, "g:ferry-test/P"])`.
    pub fn rclone(&self) -> Command {
        let conf = self.dir.path().join("rclone.conf");
        if !conf.exists() {
            let ep = self.endpoints().split(',').next().expect("endpoint");
            std::fs::write(
                &conf,
                format!(
                    "[g]\ntype = s3\nprovider = Other\naccess_key_id = {}\nsecret_access_key = {}\nendpoint = {ep}\nregion = {}\n",
                    self.env["AWS_ACCESS_KEY_ID"], self.env["AWS_SECRET_ACCESS_KEY"], self.env["AWS_REGION"]
                ),
            )
            .expect("rclone.conf");
        }
        let mut c = Command::new("rclone");
        // Debian's rclone 1.60 fails on an AWS_CA_BUNDLE naming no CA it can use.
        c.env_remove("AWS_CA_BUNDLE").arg("--config").arg(conf);
        c
    }

    /// Writes `src` into the bucket under `prefix` with `cp -a` through s3fs, as users do,
    /// and makes sure the store then holds the owners, modes and file mtimes `cp -a` set.
    ///
    /// s3fs applies each chown, chmod and utimes as a copy of the object onto itself with
    /// new metadata; Garage 2.5 stamps such a copy with the current millisecond (not one past
    /// the object's newest version, as it does a PUT), and of two versions with one stamp
    /// either may be the one a HEAD returns. So when s3fs's create and `cp -a`'s first
    /// change land in the same millisecond — an empty directory's mkdir and chown, now and
    /// then — the store can keep the created object: 1 of 300 empty directories came back
    /// owned by root here, and CI once saw a PostgreSQL `pg_notify/` so. Read back through a
    /// fresh s3fs, whatever differs from `src` is set again, each kind of change in a pass
    /// of its own (never two on one object in one millisecond), at most three rounds; the
    /// tests' own assertions judge what is left.
    pub fn copy_in_with_s3fs(&self, src: &Path, prefix: &str) {
        let s3fs = self.s3fs();
        crate::run(
            Command::new("cp")
                .arg("-a")
                .arg(src)
                .arg(s3fs.mnt.join(prefix)),
        );
        s3fs.unmount();
        // The top directory too (its rel is empty).
        let want: HashMap<PathBuf, crate::Meta> = crate::walk(src)
            .into_iter()
            .chain([crate::meta(src, src)])
            .map(|m| (m.rel.clone(), m))
            .collect();
        for _round in 0..3 {
            let s3fs = self.s3fs();
            let top = s3fs.mnt.join(prefix);
            let wrong: Vec<(PathBuf, &crate::Meta)> = crate::walk(&top)
                .into_iter()
                .chain([crate::meta(&top, &top)])
                .filter_map(|have| {
                    let w = want.get(&have.rel)?;
                    let file = w.mode & 0o170_000 == 0o100_000;
                    // As the tests compare: a file's set-id bits are not kept.
                    let bits = if file { 0o1777 } else { 0o7777 };
                    let differs = have.owner != w.owner
                        || (w.target.is_none() && have.mode & bits != w.mode & bits)
                        || (file && (have.mtime, have.mtime_nsec) != (w.mtime, w.mtime_nsec));
                    differs.then(|| (top.join(&have.rel), w))
                })
                .collect();
            if wrong.is_empty() {
                return;
            }
            eprintln!(
                "{} entries as s3fs created them, not as cp -a set them: set again",
                wrong.len()
            );
            for (p, w) in &wrong {
                std::os::unix::fs::lchown(p, Some(w.owner.0), Some(w.owner.1)).expect("lchown");
            }
            std::thread::sleep(Duration::from_millis(5));
            for (p, w) in wrong.iter().filter(|(_, w)| w.target.is_none()) {
                let mode = std::os::unix::fs::PermissionsExt::from_mode(w.mode & 0o7777);
                std::fs::set_permissions(p, mode).expect("chmod");
            }
            std::thread::sleep(Duration::from_millis(5));
            for (p, w) in wrong.iter().filter(|(_, w)| w.target.is_none()) {
                let at = std::time::UNIX_EPOCH
                    + Duration::new(w.mtime.try_into().expect("mtime"), w.mtime_nsec as u32);
                std::fs::File::open(p)
                    .and_then(|f| f.set_times(std::fs::FileTimes::new().set_modified(at)))
                    .expect("set mtime");
            }
            s3fs.unmount();
        }
    }

    /// The bucket mounted with s3fs (the real one, as users write trees with it) at a new
    /// directory; unmounted on drop.
    pub fn s3fs(&self) -> S3fs {
        let dir = tempfile::tempdir().expect("tempdir");
        let (pw, mnt) = (dir.path().join("passwd"), dir.path().join("mnt"));
        std::fs::write(
            &pw,
            format!(
                "{}:{}\n",
                self.env["AWS_ACCESS_KEY_ID"], self.env["AWS_SECRET_ACCESS_KEY"]
            ),
        )
        .expect("passwd file");
        std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        std::fs::create_dir(&mnt).expect("mkdir");
        let ep = self.endpoints().split(',').next().expect("endpoint");
        let out = Command::new("s3fs")
            .arg(format!("{}:/", self.env["FERRY_S3_BUCKET"]))
            .arg(&mnt)
            .arg("-o")
            .arg(format!(
                "passwd_file={},url={ep},use_path_request_style,endpoint={}",
                pw.display(),
                self.env["AWS_REGION"]
            ))
            .output()
            .expect("run s3fs (scripts/prereqs.sh installs it)");
        assert!(
            out.status.success(),
            "s3fs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let m = S3fs { dir, mnt };
        assert!(
            crate::wait_for(Duration::from_secs(10), || crate::is_mounted(&m.mnt)),
            "s3fs did not mount"
        );
        m
    }

    /// GET requests node `k` (1-based) answered without an error for keys starting with
    /// `prefix`, from its log (Garage logs every request it serves).
    pub fn gets(&self, k: usize, prefix: &str) -> usize {
        self.get_lines(k, prefix).len()
    }

    /// The client addresses (`IP:PORT`, one per TCP connection) that sent node `k` the
    /// GETs [`Garage::gets`] counts.
    pub fn get_clients(&self, k: usize, prefix: &str) -> std::collections::HashSet<String> {
        self.get_lines(k, prefix)
            .iter()
            .filter_map(|l| {
                let at = l.find("generic_server: ")? + "generic_server: ".len();
                l[at..].split_whitespace().next().map(str::to_string)
            })
            .collect()
    }

    /// LISTs of the bucket node `k` (1-based) answered, from its log.
    pub fn lists(&self, k: usize) -> usize {
        self.log(k)
            .lines()
            .filter(|l| l.contains(" GET /") && l.contains("list-type=2"))
            .count()
    }

    /// Node `k`'s log so far (empty when it has none yet).
    fn log(&self, k: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("node{k}/log"))).unwrap_or_default()
    }

    fn get_lines(&self, k: usize, prefix: &str) -> Vec<String> {
        let text = self.log(k);
        let needle = format!(" GET /{}/{prefix}", self.env["FERRY_S3_BUCKET"]);
        text.lines()
            .filter(|l| l.contains(&needle) && !l.contains("error"))
            .map(str::to_string)
            .collect()
    }

    /// Kills node `k` (1-based).
    pub fn kill_node(&self, k: usize) {
        let out = Command::new("bash")
            .arg(script())
            .arg("kill-node")
            .arg(self.dir.path())
            .arg(k.to_string())
            .output()
            .expect("garage-cluster.sh kill-node");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(self.dir.path())
            .output();
    }
}

/// A bucket mounted with s3fs ([`Garage::s3fs`]).
#[derive(Debug)]
pub struct S3fs {
    dir: tempfile::TempDir,
    /// The mount point.
    pub mnt: PathBuf,
}

impl S3fs {
    /// Unmounts and waits for the s3fs process to exit: only then has it sent everything
    /// (`umount` returns once the kernel lets go, while s3fs may still be uploading what
    /// was closed last: `cp -a` sets the top directory's owner and mode last, and a test
    /// that mirrored straight after found them missing now and then).
    pub fn unmount(self) {}

    /// The s3fs processes serving this mount point.
    fn daemons(&self) -> Vec<u32> {
        crate::pids_with_arg(&self.mnt.to_string_lossy())
            .into_iter()
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim_end() == "s3fs")
            })
            .collect()
    }
}

impl Drop for S3fs {
    fn drop(&mut self) {
        let daemons = self.daemons();
        let _ = Command::new("umount").arg(&self.mnt).status();
        if crate::is_mounted(&self.mnt) {
            crate::force_unmount(&self.mnt);
        }
        let gone = crate::wait_for(Duration::from_secs(30), || {
            daemons.iter().all(|pid| {
                // Gone, or a zombie nobody reaped yet (its work is done either way).
                std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |st| {
                    st.rsplit_once(')')
                        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
                })
            })
        });
        if !gone {
            // Nothing is left behind: an s3fs that did not finish is killed.
            eprintln!(
                "s3fs on {} still running 30 s after unmount; killed",
                self.mnt.display()
            );
            for pid in &daemons {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
        let _ = &self.dir;
    }
}

fn check_put((key, r): (String, reqwest::Result<reqwest::Response>)) {
    let r = r.unwrap_or_else(|e| panic!("PUT {key}: {e}"));
    assert!(r.status().is_success(), "PUT {key}: {}", r.status());
}

/// A TLS front for a gateway, as a TLS-terminating load balancer before a store: TLS with a
/// certificate for 127.0.0.1 signed by a CA made for the test (`ca`, PEM), the bytes relayed
/// to the gateway unchanged.
#[derive(Debug)]
pub struct TlsFront {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// The CA that signed the front's certificate.
    pub ca: PathBuf,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TlsFront {
    /// A front for `upstream` (`http://127.0.0.1:PORT`).
    pub fn start(upstream: &str) -> TlsFront {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(DnType::CommonName, "ferry S3 test CA");
        let ca_cert = p.self_signed(&ca_key).expect("CA");
        let key = KeyPair::generate().expect("key");
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .expect("params")
            .signed_by(&key, &ca_cert, &ca_key)
            .expect("leaf");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, ca_cert.pem()).expect("write CA");
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let up = upstream
            .strip_prefix("http://")
            .expect("an http:// upstream")
            .to_string();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener).expect("listener");
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        a = l.accept() => {
                            let Ok((s, _)) = a else { continue };
                            let (acc, up) = (acceptor.clone(), up.clone());
                            tokio::spawn(async move {
                                let Ok(mut tls) = acc.accept(s).await else { return };
                                let Ok(mut u) = tokio::net::TcpStream::connect(up).await else {
                                    return;
                                };
                                let _ = tokio::io::copy_bidirectional(&mut tls, &mut u).await;
                            });
                        }
                    }
                }
            });
        });
        TlsFront {
            url: format!("https://127.0.0.1:{port}"),
            ca,
            _dir: dir,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
