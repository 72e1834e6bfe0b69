//! Where an S3 source is and who we are there: endpoints, region, addressing, credentials,
//! resolved like the AWS tools resolve them.
//!
//! Order, first found wins:
//! - endpoints: `--endpoint`, `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's
//!   `endpoint_url`, else `https://s3.REGION.amazonaws.com`;
//! - region: `--region`, `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's `region`, else
//!   `us-east-1`;
//! - credentials: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`),
//!   else the profile (`--profile`, `AWS_PROFILE`, else `default`) in
//!   `AWS_SHARED_CREDENTIALS_FILE` (`~/.aws/credentials`), then in `AWS_CONFIG_FILE`
//!   (`~/.aws/config`, where profiles are `[profile NAME]`): its keys, else its
//!   `credential_process` ([`super::process`]), else none: requests go unsigned (a public
//!   bucket);
//! - CA bundle for `https` endpoints (besides the system's): `--ca`, `AWS_CA_BUNDLE`;
//! - addressing: `--s3-addressing`, else path style for a given endpoint (what Garage,
//!   MinIO and most gateways serve) and virtual-hosted style for AWS itself.
//!
//! The files are INI as the AWS tools write them; a nested block (`s3 =` followed by
//! indented `key = value` lines) is read as `s3.key` so it never shadows a top-level key.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// How bucket and key appear in a request's URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addressing {
    /// `https://host/BUCKET/KEY`.
    Path,
    /// `https://BUCKET.host/KEY`.
    VirtualHost,
}

/// Whether modes, owners and times are read from objects' user metadata (the conventions
/// of rclone, s3fs and s3cmd: [`crate::s3`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Metadata {
    /// Read when one of the first keys under the source's path carries some (decided once
    /// per session).
    #[default]
    Auto,
    /// Always read: a HEAD of every object listed.
    On,
    /// Never: the documented defaults.
    Off,
}

/// Credentials for signing requests (AWS signature version 4).
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    /// Access key id.
    pub key: String,
    /// Secret access key.
    pub secret: String,
    /// Session token of temporary credentials.
    pub token: Option<String>,
}

impl std::fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret, not even in a debug log.
        f.debug_struct("S3Credentials")
            .field("key", &self.key)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

/// An S3 source, resolved.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// The bucket.
    pub bucket: String,
    /// Gateways of one store; requests are spread over all, one failing is skipped.
    pub endpoints: Vec<url::Url>,
    /// Region named in signatures.
    pub region: String,
    /// Path or virtual-hosted addressing.
    pub addressing: Addressing,
    /// `None` (and no `credential_process`): unsigned requests.
    pub credentials: Option<S3Credentials>,
    /// The profile's `credential_process`: a command whose output (JSON, `Version` 1) gives
    /// the credentials, run again before they expire.
    pub credential_process: Option<String>,
    /// Trust this CA (PEM) for `https` endpoints, besides the system's.
    pub ca_file: Option<PathBuf>,
    /// Whether object metadata gives modes, owners and times.
    pub metadata: Metadata,
}

/// What the user gave on the command line (each `None` when not given).
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    /// `--endpoint URL[,URL…]`.
    pub endpoints: Option<String>,
    /// `--region`.
    pub region: Option<String>,
    /// `--profile`.
    pub profile: Option<String>,
    /// `--s3-addressing`.
    pub addressing: Option<Addressing>,
    /// `--ca` (for `https` endpoints).
    pub ca_file: Option<PathBuf>,
    /// `--s3-metadata`.
    pub metadata: Metadata,
}

/// Why an S3 source could not be set up; each says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum S3ConfigError {
    /// An endpoint is not an `http://` or `https://` URL.
    #[error(
        "bad S3 endpoint {0:?}: give a URL such as http://127.0.0.1:3900 or https://s3.example.com"
    )]
    BadEndpoint(String),
    /// The bucket name cannot be one.
    #[error("bad bucket name {0:?}: expected s3://BUCKET[/PREFIX] with a bucket of 3 to 63 letters, digits, '-', '.' or '_'")]
    BadBucket(String),
    /// A named profile does not exist in either file.
    #[error("AWS profile {profile:?} not found in {files}: check --profile or AWS_PROFILE")]
    NoProfile {
        /// The profile asked for.
        profile: String,
        /// The files searched.
        files: String,
    },
    /// Only half of a key pair is given.
    #[error("{0}: give both the access key id and the secret access key")]
    HalfKey(String),
}

/// The environment the resolution reads (a map in tests, the process's otherwise).
pub trait Env {
    /// The variable's value, if set and not empty.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Clone, Copy)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

impl Env for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).filter(|v| !v.is_empty()).cloned()
    }
}

/// Sections of an AWS INI file: section name → key → value.
type Ini = HashMap<String, HashMap<String, String>>;

/// Parses an AWS credentials or config file (see the module docs for nested blocks).
fn parse_ini(text: &str) -> Ini {
    let mut out = Ini::new();
    let mut section: Option<String> = None;
    let mut nested: Option<String> = None;
    for raw in text.lines() {
        let line = raw.trim_end();
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
            continue;
        }
        if let Some(name) = trimmed.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            section = Some(name.trim().to_string());
            nested = None;
            continue;
        }
        let Some(sec) = &section else { continue };
        let Some((k, v)) = trimmed.split_once('=') else {
            continue;
        };
        let (k, v) = (k.trim().to_string(), v.trim().to_string());
        let indented = line.len() != trimmed.len();
        let key = match (&nested, indented) {
            (Some(n), true) => format!("{n}.{k}"),
            _ => {
                // `s3 =` with nothing after it opens a nested block.
                nested = v.is_empty().then(|| k.clone());
                k
            }
        };
        out.entry(sec.clone()).or_default().insert(key, v);
    }
    out
}

fn home_file(env: &dyn Env, var: &str, default: &str) -> Option<PathBuf> {
    env.var(var)
        .map(PathBuf::from)
        .or_else(|| env.var("HOME").map(|h| Path::new(&h).join(default)))
}

fn read_ini(path: Option<&Path>) -> Ini {
    path.and_then(|p| std::fs::read_to_string(p).ok())
        .map(|t| parse_ini(&t))
        .unwrap_or_default()
}

/// Whether `name` can be a bucket (the rules every S3 implementation accepts, loosely).
fn valid_bucket(name: &str) -> bool {
    (3..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

impl S3Config {
    /// Resolves a source for `bucket` from the options, the environment and the AWS files.
    ///
    /// # Errors
    /// A bad endpoint or bucket, a named profile that exists nowhere, half a key pair.
    pub fn resolve(
        bucket: &str,
        opts: &S3Options,
        env: &dyn Env,
    ) -> Result<S3Config, S3ConfigError> {
        if !valid_bucket(bucket) {
            return Err(S3ConfigError::BadBucket(bucket.to_string()));
        }
        let cred_path = home_file(env, "AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
        let conf_path = home_file(env, "AWS_CONFIG_FILE", ".aws/config");
        let (creds_ini, conf_ini) = (
            read_ini(cred_path.as_deref()),
            read_ini(conf_path.as_deref()),
        );
        let named = opts.profile.clone().or_else(|| env.var("AWS_PROFILE"));
        let profile_name = named.clone().unwrap_or_else(|| "default".into());
        let conf_section = if profile_name == "default" {
            "default".to_string()
        } else {
            format!("profile {profile_name}")
        };
        let from_creds = creds_ini.get(&profile_name);
        let from_conf = conf_ini
            .get(&conf_section)
            .or_else(|| conf_ini.get(&profile_name));
        if named.is_some() && from_creds.is_none() && from_conf.is_none() {
            let files = [cred_path, conf_path]
                .iter()
                .flatten()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" and ");
            return Err(S3ConfigError::NoProfile {
                profile: profile_name,
                files,
            });
        }
        let profile = |key: &str| {
            from_creds
                .and_then(|s| s.get(key))
                .or_else(|| from_conf.and_then(|s| s.get(key)))
                .filter(|v| !v.is_empty())
                .cloned()
        };
        let region = opts
            .region
            .clone()
            .or_else(|| env.var("AWS_REGION"))
            .or_else(|| env.var("AWS_DEFAULT_REGION"))
            .or_else(|| profile("region"))
            .unwrap_or_else(|| "us-east-1".into());
        let given = opts
            .endpoints
            .clone()
            .or_else(|| env.var("AWS_ENDPOINT_URL_S3"))
            .or_else(|| env.var("AWS_ENDPOINT_URL"))
            .or_else(|| profile("s3.endpoint_url"))
            .or_else(|| profile("endpoint_url"));
        let aws = given.is_none();
        let list = given.unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        let mut endpoints = Vec::new();
        for e in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let u = url::Url::parse(e).map_err(|_| S3ConfigError::BadEndpoint(e.into()))?;
            if !matches!(u.scheme(), "http" | "https") || u.host_str().is_none() {
                return Err(S3ConfigError::BadEndpoint(e.into()));
            }
            endpoints.push(u);
        }
        if endpoints.is_empty() {
            return Err(S3ConfigError::BadEndpoint(list));
        }
        let addressing = opts
            .addressing
            .or_else(|| match profile("s3.addressing_style").as_deref() {
                Some("path") => Some(Addressing::Path),
                Some("virtual") => Some(Addressing::VirtualHost),
                _ => None,
            })
            .unwrap_or(if aws && !bucket.contains('.') {
                Addressing::VirtualHost
            } else {
                Addressing::Path
            });
        let credentials = match (
            env.var("AWS_ACCESS_KEY_ID"),
            env.var("AWS_SECRET_ACCESS_KEY"),
        ) {
            (Some(key), Some(secret)) => Some(S3Credentials {
                key,
                secret,
                token: env.var("AWS_SESSION_TOKEN"),
            }),
            (Some(_), None) | (None, Some(_)) => {
                return Err(S3ConfigError::HalfKey(
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".into(),
                ))
            }
            (None, None) => match (
                profile("aws_access_key_id"),
                profile("aws_secret_access_key"),
            ) {
                (Some(key), Some(secret)) => Some(S3Credentials {
                    key,
                    secret,
                    token: profile("aws_session_token"),
                }),
                (None, None) => None,
                _ => return Err(S3ConfigError::HalfKey(format!("profile {profile_name:?}"))),
            },
        };
        // A command giving credentials, where none are given otherwise (as the AWS tools).
        let credential_process = credentials
            .is_none()
            .then(|| profile("credential_process"))
            .flatten();
        Ok(S3Config {
            bucket: bucket.to_string(),
            endpoints,
            region,
            addressing,
            credentials,
            credential_process,
            ca_file: opts
                .ca_file
                .clone()
                .or_else(|| env.var("AWS_CA_BUNDLE").map(PathBuf::from)),
            metadata: opts.metadata,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn ini_reads_sections_comments_and_nested_blocks() {
        let ini = parse_ini(
            "# c\n[default]\naws_access_key_id = AK\n; c\n[profile x]\nregion=eu\ns3 =\n  addressing_style = path\n  endpoint_url = http://h:1\nregion2 = r\n",
        );
        assert_eq!(ini["default"]["aws_access_key_id"], "AK");
        assert_eq!(ini["profile x"]["region"], "eu");
        assert_eq!(ini["profile x"]["s3.addressing_style"], "path");
        assert_eq!(ini["profile x"]["s3.endpoint_url"], "http://h:1");
        assert_eq!(ini["profile x"]["region2"], "r");
        assert!(!ini["profile x"].contains_key("addressing_style"));
    }

    #[test]
    fn environment_first_then_profile_files_then_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        let conf = dir.path().join("config");
        std::fs::write(
            &creds,
            "[default]\naws_access_key_id=D\naws_secret_access_key=DS\n[bk]\naws_access_key_id=B\naws_secret_access_key=BS\naws_session_token=T\n",
        )
        .unwrap();
        std::fs::write(
            &conf,
            "[profile bk]\nregion = eu-west-3\nendpoint_url = http://a:1, http://b:2\n[profile sso]\ncredential_process = aws-vault export --format=json sso\n[profile both]\naws_access_key_id=K\naws_secret_access_key=S\ncredential_process = never-run\n",
        )
        .unwrap();
        let files = [
            ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
            ("AWS_CONFIG_FILE", conf.to_str().unwrap()),
        ];
        // The default profile, AWS's endpoint and virtual-hosted style.
        let c = S3Config::resolve("my-bucket", &S3Options::default(), &env(&files)).unwrap();
        assert_eq!(c.credentials.as_ref().unwrap().key, "D");
        assert_eq!(c.region, "us-east-1");
        assert_eq!(
            c.endpoints[0].as_str(),
            "https://s3.us-east-1.amazonaws.com/"
        );
        assert_eq!(c.addressing, Addressing::VirtualHost);
        // A named profile: its keys, region and two endpoints, path style.
        let mut e = env(&files);
        e.insert("AWS_PROFILE".into(), "bk".into());
        let c = S3Config::resolve("b1.x", &S3Options::default(), &e).unwrap();
        let k = c.credentials.unwrap();
        assert_eq!((k.key.as_str(), k.token.as_deref()), ("B", Some("T")));
        assert_eq!(c.region, "eu-west-3");
        assert_eq!(c.endpoints.len(), 2);
        assert_eq!(c.addressing, Addressing::Path);
        // The environment's keys and options beat the files.
        e.insert("AWS_ACCESS_KEY_ID".into(), "E".into());
        e.insert("AWS_SECRET_ACCESS_KEY".into(), "ES".into());
        let o = S3Options {
            endpoints: Some("http://127.0.0.1:3900".into()),
            region: Some("garage".into()),
            addressing: Some(Addressing::VirtualHost),
            ..S3Options::default()
        };
        e.insert("AWS_CA_BUNDLE".into(), "/etc/ca.pem".into());
        let c = S3Config::resolve("bkt", &o, &e).unwrap();
        assert_eq!(c.credentials.unwrap().key, "E");
        assert_eq!(c.ca_file.as_deref(), Some(Path::new("/etc/ca.pem")));
        assert_eq!(c.region, "garage");
        assert_eq!(c.addressing, Addressing::VirtualHost);
        assert_eq!(c.endpoints.len(), 1);
        // No keys anywhere: unsigned.
        let c = S3Config::resolve("bkt", &o, &env(&[])).unwrap();
        assert!(c.credentials.is_none());
        assert!(c.credential_process.is_none());
        // A profile's credential_process, where it has no keys.
        for (profile, process) in [
            ("sso", Some("aws-vault export --format=json sso")),
            ("both", None),
        ] {
            let mut e = env(&files);
            e.insert("AWS_PROFILE".into(), profile.into());
            let c = S3Config::resolve("bkt", &o, &e).unwrap();
            assert_eq!(c.credential_process.as_deref(), process, "{profile}");
            assert_eq!(c.credentials.is_some(), process.is_none(), "{profile}");
        }
    }

    #[test]
    fn bad_input_is_one_clear_error() {
        let none = env(&[]);
        let o = |e: &str| S3Options {
            endpoints: Some(e.into()),
            ..S3Options::default()
        };
        assert!(matches!(
            S3Config::resolve("bkt", &o("ftp://x"), &none),
            Err(S3ConfigError::BadEndpoint(_))
        ));
        assert!(matches!(
            S3Config::resolve("bkt", &o("not a url"), &none),
            Err(S3ConfigError::BadEndpoint(_))
        ));
        assert!(matches!(
            S3Config::resolve("a", &o("http://h"), &none),
            Err(S3ConfigError::BadBucket(_))
        ));
        assert!(matches!(
            S3Config::resolve("bkt", &o("http://h"), &env(&[("AWS_ACCESS_KEY_ID", "k")])),
            Err(S3ConfigError::HalfKey(_))
        ));
        let p = S3Options {
            profile: Some("nope".into()),
            ..o("http://h")
        };
        let e = S3Config::resolve("bkt", &p, &env(&[("HOME", "/nonexistent")])).unwrap_err();
        assert!(e.to_string().contains("nope"), "{e}");
    }
}
