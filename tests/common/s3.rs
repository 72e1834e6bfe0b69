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
    pub fn start(nodes: usize) -> Garage {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.path())
            .arg(nodes.to_string())
            .output()
            .expect("run garage-cluster.sh");
        if !out.status.success() {
            // Nothing is left running: the script stops what it started on failure.
            panic!(
                "garage-cluster.sh start failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
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

    /// The key's environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).
    pub fn credentials(&self) -> Vec<(String, String)> {
        ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
            .iter()
            .map(|k| (k.to_string(), self.env[*k].clone()))
            .collect()
    }

    /// A `ferry` command with the key in its environment.
    pub fn ferry(&self) -> Command {
        let mut c = crate::ferry();
        c.env_remove("AWS_PROFILE").envs(self.credentials());
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
        let (bucket, creds) = (self.bucket(0), self.creds());
        let mut a = bucket.put_object(Some(&creds), key);
        let crc = crc32c.then(|| {
            let mut d = ferry_client::Digester::new(ferry_client::DigestKind::Crc32c);
            d.update(data);
            base64::engine::general_purpose::STANDARD.encode(d.finish().value)
        });
        if let Some(c) = &crc {
            a.headers_mut().insert("x-amz-checksum-crc32c", c.clone());
        }
        let url = a.sign(Duration::from_secs(600));
        let mut req = self.http.put(url).body(data.to_vec());
        if let Some(c) = &crc {
            req = req.header("x-amz-checksum-crc32c", c);
        }
        let r = self.rt.block_on(req.send()).expect("PUT");
        assert!(
            r.status().is_success(),
            "PUT {key}: {} {}",
            r.status(),
            self.rt.block_on(r.text()).unwrap_or_default()
        );
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
