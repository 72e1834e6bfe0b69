//! `HOST[:PORT][:/PATH]`, as `ferry mount` takes it (sshfs style).

use bytes::Bytes;

/// Default ferryd port.
pub const DEFAULT_PORT: u16 = 7070;

/// A parsed remote: where ferryd listens and which directory beneath its export to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Host name or address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Path beneath the export, validated, without leading or trailing `/` (empty = root).
    pub path: Bytes,
}

impl Target {
    /// `host:port` for connecting (IPv6 in brackets).
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Parses `HOST`, `HOST:PORT`, `HOST:/PATH`, `HOST:PORT:/PATH`; IPv6 as `[::1]:PORT`.
    ///
    /// # Errors
    /// A one-line description of what is wrong.
    pub fn parse(s: &str) -> Result<Target, String> {
        let usage = "expected HOST[:PORT][:/PATH], e.g. db1:7070:/oradata";
        let (host, rest) = if let Some(r) = s.strip_prefix('[') {
            let end = r
                .find(']')
                .ok_or_else(|| format!("unclosed '[' in {s:?}: {usage}"))?;
            (r[..end].to_string(), &r[end + 1..])
        } else {
            let end = s.find(':').unwrap_or(s.len());
            (s[..end].to_string(), &s[end..])
        };
        if host.is_empty() {
            return Err(format!("missing host in {s:?}: {usage}"));
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
                port = r[..end]
                    .parse()
                    .map_err(|_| format!("bad port {:?} in {s:?}: {usage}", &r[..end]))?;
                rest = &r[end..];
            }
        }
        if let Some(r) = rest.strip_prefix(':') {
            if !r.starts_with('/') {
                return Err(format!("the path in {s:?} must start with '/': {usage}"));
            }
            path = r;
        } else if !rest.is_empty() {
            return Err(format!("unexpected {rest:?} in {s:?}: {usage}"));
        }
        let trimmed = path.trim_matches('/');
        // Collapse repeated slashes; refuse '.' and '..' components.
        let clean: Vec<&str> = trimmed.split('/').filter(|c| !c.is_empty()).collect();
        let joined = clean.join("/");
        ferry_proto::name::validate_path(joined.as_bytes())
            .map_err(|e| format!("bad remote path {path:?}: {e}"))?;
        Ok(Target {
            host,
            port,
            path: Bytes::from(joined),
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
            path: Bytes::from(path.to_string()),
        }
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
}
