//! `HOST[:PORT][:/PATH]`, as `ferry mount` takes it (sshfs style), or
//! `s3://BUCKET[/PREFIX]` for an S3-compatible object store.

use bytes::Bytes;

/// Default ferryd port.
pub const DEFAULT_PORT: u16 = 7070;

/// What the usage errors suggest.
const USAGE: &str = "expected HOST[:PORT][:/PATH], e.g. db1:7070:/oradata, or s3://BUCKET[/PREFIX]";

/// Why a remote could not be parsed; each names the input and says what is expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// `[` of an IPv6 address without its `]`.
    #[error("unclosed '[' in {input:?}: {USAGE}")]
    UnclosedBracket {
        /// The remote as given.
        input: String,
    },
    /// Nothing before the first `:`.
    #[error("missing host in {input:?}: {USAGE}")]
    MissingHost {
        /// The remote as given.
        input: String,
    },
    /// The port is not a number from 0 to 65535.
    #[error("bad port {port:?} in {input:?}: {USAGE}")]
    BadPort {
        /// The port as given.
        port: String,
        /// The remote as given.
        input: String,
    },
    /// The part after the port does not start with `/`.
    #[error("the path in {input:?} must start with '/': {USAGE}")]
    RelativePath {
        /// The remote as given.
        input: String,
    },
    /// Something follows the host that is neither a port nor a path.
    #[error("unexpected {rest:?} in {input:?}: {USAGE}")]
    Unexpected {
        /// What was not understood.
        rest: String,
        /// The remote as given.
        input: String,
    },
    /// The path has `.` or `..` components, NUL bytes, or is too long.
    #[error("bad remote path {path:?}")]
    BadPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        #[source]
        source: ferry_proto::name::NameError,
    },
}

/// `path` without leading, trailing or repeated slashes, validated (no `.` or `..`).
fn clean_path(path: &str) -> Result<Bytes, TargetError> {
    let clean: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let joined = clean.join("/");
    ferry_proto::name::validate_path(joined.as_bytes()).map_err(|source| TargetError::BadPath {
        path: path.to_string(),
        source,
    })?;
    Ok(Bytes::from(joined))
}

/// A parsed remote: where ferryd listens and which directory beneath its export to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Host name or address (IPv6 without brackets); for S3, the bucket.
    pub host: String,
    /// TCP port (0 for S3).
    pub port: u16,
    /// An S3 bucket (`s3://BUCKET[/PREFIX]`), not a ferryd.
    pub s3: bool,
    /// Path beneath the export, validated, without leading or trailing `/` (empty = root).
    pub path: Bytes,
}

impl Target {
    /// `host:port` for connecting (IPv6 in brackets); `s3://BUCKET` for S3.
    pub fn addr(&self) -> String {
        if self.s3 {
            format!("s3://{}", self.host)
        } else if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Parses `HOST`, `HOST:PORT`, `HOST:/PATH`, `HOST:PORT:/PATH`; IPv6 as `[::1]:PORT`.
    ///
    /// # Errors
    /// [`TargetError`]: what is wrong, in one line.
    pub fn parse(s: &str) -> Result<Target, TargetError> {
        let input = || s.to_string();
        if let Some(r) = s.strip_prefix("s3://") {
            let (bucket, prefix) = r.split_once('/').unwrap_or((r, ""));
            if bucket.is_empty() {
                return Err(TargetError::MissingHost { input: input() });
            }
            return Ok(Target {
                host: bucket.to_string(),
                port: 0,
                s3: true,
                path: clean_path(prefix)?,
            });
        }
        let (host, rest) = if let Some(r) = s.strip_prefix('[') {
            let end = r
                .find(']')
                .ok_or_else(|| TargetError::UnclosedBracket { input: input() })?;
            (r[..end].to_string(), &r[end + 1..])
        } else {
            let end = s.find(':').unwrap_or(s.len());
            (s[..end].to_string(), &s[end..])
        };
        if host.is_empty() {
            return Err(TargetError::MissingHost { input: input() });
        }
        let mut port = DEFAULT_PORT;
        let mut path = "";
        let mut rest = rest;
        if let Some(r) = rest.strip_prefix(':') {
            if r.starts_with('/') {
                path = r;
                rest = "";
            } else {
                let end = r.find(':').unwrap_or(r.len());
                port = r[..end].parse().map_err(|_| TargetError::BadPort {
                    port: r[..end].to_string(),
                    input: input(),
                })?;
                rest = &r[end..];
            }
        }
        if let Some(r) = rest.strip_prefix(':') {
            if !r.starts_with('/') {
                return Err(TargetError::RelativePath { input: input() });
            }
            path = r;
        } else if !rest.is_empty() {
            return Err(TargetError::Unexpected {
                rest: rest.to_string(),
                input: input(),
            });
        }
        Ok(Target {
            host,
            port,
            s3: false,
            path: clean_path(path)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(host: &str, port: u16, path: &str) -> Target {
        Target {
            host: host.into(),
            port,
            s3: false,
            path: Bytes::from(path.to_string()),
        }
    }

    #[test]
    fn s3_buckets_with_and_without_a_prefix() {
        let s3 = |host: &str, path: &str| Target {
            s3: true,
            port: 0,
            ..t(host, 0, path)
        };
        assert_eq!(Target::parse("s3://backups"), Ok(s3("backups", "")));
        assert_eq!(Target::parse("s3://backups/"), Ok(s3("backups", "")));
        assert_eq!(
            Target::parse("s3://backups/pg//base/"),
            Ok(s3("backups", "pg/base"))
        );
        assert_eq!(Target::parse("s3://b/x").unwrap().addr(), "s3://b");
        assert!(Target::parse("s3://").is_err());
        assert!(Target::parse("s3://b/../x").is_err());
    }

    #[test]
    fn forms() {
        assert_eq!(Target::parse("db1"), Ok(t("db1", 7070, "")));
        assert_eq!(Target::parse("db1:9000"), Ok(t("db1", 9000, "")));
        assert_eq!(
            Target::parse("db1:/u01/oradata/"),
            Ok(t("db1", 7070, "u01/oradata"))
        );
        assert_eq!(Target::parse("db1:9000:/x//y"), Ok(t("db1", 9000, "x/y")));
        assert_eq!(Target::parse("[::1]:9000:/x"), Ok(t("::1", 9000, "x")));
        assert_eq!(Target::parse("127.0.0.1:1:/"), Ok(t("127.0.0.1", 1, "")));
        assert_eq!(t("::1", 1, "").addr(), "[::1]:1");
    }

    #[test]
    fn errors() {
        for bad in [
            "",
            ":7070",
            "db1:port",
            "db1:9000:x",
            "db1:/a/../b",
            "[::1",
            "db1:1:/a:b\0",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn errors_name_the_input_and_keep_their_source() {
        use std::error::Error as _;
        let e = Target::parse("db1:port").unwrap_err();
        assert_eq!(
            e,
            TargetError::BadPort {
                port: "port".into(),
                input: "db1:port".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "bad port \"port\" in \"db1:port\": expected HOST[:PORT][:/PATH], e.g. db1:7070:/oradata, or s3://BUCKET[/PREFIX]"
        );
        let e = Target::parse("db1:/a/../b").unwrap_err();
        assert_eq!(e.to_string(), "bad remote path \"/a/../b\"");
        assert_eq!(
            e.source().map(ToString::to_string),
            Some(ferry_proto::name::NameError::Dot.to_string())
        );
        assert!(matches!(
            Target::parse(":7070"),
            Err(TargetError::MissingHost { .. })
        ));
    }
}
