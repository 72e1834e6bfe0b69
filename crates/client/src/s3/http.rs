//! The HTTP side of the S3 source: signed requests (rusty-s3, AWS signature version 4 in
//! the query string) sent with one keep-alive HTTP client to one of the gateways, and
//! their answers read into what the source needs.
//!
//! Errors: a gateway that cannot be reached or stops sending is [`Unreachable`] (the pool
//! then tries another stream); 404 is NotFound, 403 PermissionDenied; 429, 500 and 503
//! are tried again with a growing pause (the store is busy or a node is down), up to four
//! times, then reported as an I/O error with the store's message.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use ferry_proto::{Response, Status};
use reqwest::StatusCode;
use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};
use tracing::debug;

use super::meta::Meta;
use super::process::{self, Fetched};
use super::{error, Addressing, S3Config, Unreachable};
use crate::digest::{Digest, DigestKind};

/// How long a signed URL is valid (it is used at once).
const SIGN_FOR: Duration = Duration::from_secs(15 * 60);
/// Keys per page of ListObjectsV2 (the largest S3 gives).
const LIST_PAGE: usize = 1000;
/// Tries of a request the store answers with "busy".
const BUSY_TRIES: u32 = 5;

/// An object as a HEAD, a listing or a GET describes it.
#[derive(Debug, Clone)]
pub(crate) struct Object {
    pub(crate) key: String,
    pub(crate) size: u64,
    /// Last-Modified, whole seconds (listings give milliseconds, HEAD and GET seconds).
    pub(crate) last_modified: i64,
    /// The ETag, without its quotes.
    pub(crate) etag: String,
    /// The store's digest of the whole object, if it gives one (HEAD and GET only).
    pub(crate) digest: Option<Digest>,
    /// Modes, owners and times in its user metadata (HEAD and GET only).
    pub(crate) meta: Option<Meta>,
}

/// A ranged GET's answer.
#[derive(Debug)]
pub(crate) struct Got {
    /// The object the bytes belong to (size: the whole object's).
    pub(crate) object: Object,
    pub(crate) data: Bytes,
    /// The whole object's digest, when the store sent one.
    pub(crate) digest: Option<Digest>,
}

pub(crate) struct Http {
    config: S3Config,
    client: reqwest::Client,
    buckets: Vec<Bucket>,
    /// Given, or the last a `credential_process` gave.
    credentials: std::sync::Mutex<Option<Fetched>>,
    /// One refresh at a time.
    refreshing: tokio::sync::Mutex<()>,
}

fn unreachable(e: reqwest::Error, url: &url::Url) -> Unreachable {
    let host = url.host_str().unwrap_or("?");
    let port = url.port_or_known_default().unwrap_or(0);
    // Never the URL: it carries a signature valid for minutes.
    let e = e.without_url();
    // The full chain: reqwest's own text says little ("error sending request").
    let mut msg = ferry_util::error_line(&e);
    if msg.contains("invalid peer certificate") {
        msg.push_str(" (give the CA that signed the endpoint's certificate with --ca)");
    }
    Unreachable(format!("S3 endpoint {host}:{port}: {msg}"))
}

/// Seconds since the epoch of an HTTP date or an ISO 8601 time.
fn parse_time(s: &str) -> Option<i64> {
    if let Ok(t) = s.parse::<jiff::Timestamp>() {
        return Some(t.as_second());
    }
    jiff::fmt::rfc2822::parse(s)
        .ok()
        .map(|z| z.timestamp().as_second())
}

fn unquote(etag: &str) -> String {
    etag.trim().trim_matches('"').to_string()
}

/// The ETag's MD5 when it is one (a single-part upload without SSE-KMS: 32 hex digits).
fn etag_md5(etag: &str) -> Option<Digest> {
    if etag.len() != 32 {
        return None;
    }
    let mut v = Vec::with_capacity(16);
    for i in 0..16 {
        v.push(u8::from_str_radix(etag.get(2 * i..2 * i + 2)?, 16).ok()?);
    }
    Some(Digest {
        kind: DigestKind::Md5,
        value: v,
    })
}

/// The whole-object digest in `headers`: a full-object `x-amz-checksum-*` (the strongest
/// first), else the ETag's MD5.
fn digest_of(headers: &reqwest::header::HeaderMap, etag: &str) -> Option<Digest> {
    let composite = headers
        .get("x-amz-checksum-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.eq_ignore_ascii_case("COMPOSITE"));
    if !composite {
        for (name, kind, len) in [
            ("x-amz-checksum-sha256", DigestKind::Sha256, 32),
            ("x-amz-checksum-crc64nvme", DigestKind::Crc64Nvme, 8),
            ("x-amz-checksum-crc32c", DigestKind::Crc32c, 4),
            ("x-amz-checksum-crc32", DigestKind::Crc32, 4),
        ] {
            let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) else {
                continue;
            };
            if v.contains('-') {
                continue; // a checksum of part checksums
            }
            if let Ok(value) = base64::engine::general_purpose::STANDARD.decode(v) {
                if value.len() == len {
                    return Some(Digest { kind, value });
                }
            }
        }
    }
    etag_md5(etag)
}

fn header<'a>(h: &'a reqwest::header::HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// The object a HEAD or GET response describes (`size`: given, or Content-Length).
fn object_of(key: &str, h: &reqwest::header::HeaderMap, size: Option<u64>) -> Option<Object> {
    let etag = unquote(header(h, "etag")?);
    let size = match size {
        Some(s) => s,
        None => header(h, "content-length")?.parse().ok()?,
    };
    Some(Object {
        key: key.to_string(),
        size,
        last_modified: parse_time(header(h, "last-modified")?)?,
        digest: digest_of(h, &etag),
        meta: Meta::from_headers(
            h.iter()
                .filter_map(|(n, v)| Some((n.as_str(), v.to_str().ok()?))),
        ),
        etag,
    })
}

/// `bytes A-B/TOTAL` or `bytes */TOTAL` → TOTAL.
fn range_total(h: &reqwest::header::HeaderMap) -> Option<u64> {
    header(h, "content-range")?.rsplit('/').next()?.parse().ok()
}

/// The store's error message (the XML's `<Message>`, else the status).
fn store_message(status: StatusCode, body: &str) -> String {
    let msg = body
        .split_once("<Message>")
        .and_then(|(_, r)| r.split_once("</Message>"))
        .map(|(m, _)| m.to_string());
    match msg {
        Some(m) => format!("{status}: {m}"),
        None => status.to_string(),
    }
}

fn status_error(what: &str, status: StatusCode, body: &str) -> Response {
    let st = match status.as_u16() {
        404 => Status::NotFound,
        403 | 401 => Status::PermissionDenied,
        400 => Status::InvalidArgument,
        _ => Status::Io,
    };
    error(st, format!("{what}: {}", store_message(status, body)))
}

impl Http {
    pub(crate) fn new(config: S3Config, timeout: Duration) -> Result<Http, crate::ClientError> {
        // rustls with the ring provider, as the rest of ferry (once per process).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let style = match config.addressing {
            Addressing::Path => UrlStyle::Path,
            Addressing::VirtualHost => UrlStyle::VirtualHost,
        };
        let buckets = config
            .endpoints
            .iter()
            .map(|e| {
                Bucket::new(
                    e.clone(),
                    style,
                    config.bucket.clone(),
                    config.region.clone(),
                )
                .map_err(|e| crate::ClientError::S3(format!("S3 endpoint: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut b = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .read_timeout(timeout)
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .no_proxy();
        if let Some(ca) = &config.ca_file {
            let pem = std::fs::read(ca).map_err(|e| {
                crate::ClientError::S3(format!("CA file {}: cannot read it: {e}", ca.display()))
            })?;
            for c in reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| crate::ClientError::S3(format!("CA file {}: {e}", ca.display())))?
            {
                b = b.add_root_certificate(c);
            }
        }
        let client = b
            .build()
            .map_err(|e| crate::ClientError::S3(format!("HTTP client: {e}")))?;
        let credentials = match (&config.credentials, &config.credential_process) {
            (Some(c), _) => Some(Fetched {
                credentials: match &c.token {
                    Some(t) => {
                        Credentials::new_with_token(c.key.clone(), c.secret.clone(), t.clone())
                    }
                    None => Credentials::new(c.key.clone(), c.secret.clone()),
                },
                at: jiff::Timestamp::now(),
                expires: None,
            }),
            (None, Some(command)) => Some(process::run(command).map_err(crate::ClientError::S3)?),
            (None, None) => None,
        };
        Ok(Http {
            config,
            client,
            buckets,
            credentials: std::sync::Mutex::new(credentials),
            refreshing: tokio::sync::Mutex::new(()),
        })
    }

    /// The credentials to sign with now: those a `credential_process` gave are fetched
    /// again before they expire ([`process`]); a failed refresh keeps them (logged).
    async fn creds(&self) -> Option<Credentials> {
        let now = jiff::Timestamp::now();
        let held = || {
            self.credentials
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        };
        let current = held();
        let Some(command) = &self.config.credential_process else {
            return current.map(|f| f.credentials);
        };
        if current.as_ref().is_some_and(|f| !f.stale(now)) {
            return current.map(|f| f.credentials);
        }
        let _one = self.refreshing.lock().await;
        // Another request may have refreshed them meanwhile.
        let current = held();
        if current.as_ref().is_some_and(|f| !f.stale(now)) {
            return current.map(|f| f.credentials);
        }
        let command = command.clone();
        match tokio::task::spawn_blocking(move || process::run(&command)).await {
            Ok(Ok(f)) => {
                let c = f.credentials.clone();
                *self.credentials.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
                Some(c)
            }
            Ok(Err(e)) => {
                tracing::warn!("S3 credentials not renewed: {e}");
                current.map(|f| f.credentials)
            }
            Err(e) => {
                tracing::warn!("S3 credentials not renewed: {e}");
                current.map(|f| f.credentials)
            }
        }
    }

    pub(crate) fn config(&self) -> &S3Config {
        &self.config
    }

    fn bucket(&self, endpoint: usize) -> &Bucket {
        &self.buckets[endpoint % self.buckets.len()]
    }

    /// Sends `req` (built anew for each try), trying again while the store is busy.
    async fn send(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
        url: &url::Url,
    ) -> Result<reqwest::Response, Unreachable> {
        let mut pause = Duration::from_millis(50);
        let mut tries = 0;
        loop {
            tries += 1;
            let r = build().send().await.map_err(|e| unreachable(e, url))?;
            let busy = matches!(r.status().as_u16(), 429 | 500 | 502 | 503 | 504);
            if !busy || tries >= BUSY_TRIES {
                return Ok(r);
            }
            debug!(
                "S3 {} answered {}; again in {pause:?}",
                url.host_str().unwrap_or("?"),
                r.status()
            );
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }

    pub(crate) async fn head_bucket(&self, endpoint: usize) -> Result<u16, Unreachable> {
        let creds = self.creds().await;
        let url = self
            .bucket(endpoint)
            .head_bucket(creds.as_ref())
            .sign(SIGN_FOR);
        let r = self.send(|| self.client.head(url.clone()), &url).await?;
        Ok(r.status().as_u16())
    }

    pub(crate) async fn head(
        &self,
        endpoint: usize,
        key: &str,
    ) -> Result<Result<Object, Response>, Unreachable> {
        let creds = self.creds().await;
        let mut a = self.bucket(endpoint).head_object(creds.as_ref(), key);
        a.headers_mut().insert("x-amz-checksum-mode", "ENABLED");
        let url = a.sign(SIGN_FOR);
        let r = self
            .send(
                || {
                    self.client
                        .head(url.clone())
                        .header("x-amz-checksum-mode", "ENABLED")
                },
                &url,
            )
            .await?;
        if !r.status().is_success() {
            return Ok(Err(status_error(key, r.status(), "")));
        }
        Ok(object_of(key, r.headers(), None).ok_or_else(|| {
            error(
                Status::Io,
                format!("{key}: HEAD without ETag, size or Last-Modified"),
            )
        }))
    }

    pub(crate) async fn prefix_exists(
        &self,
        endpoint: usize,
        prefix: &str,
    ) -> Result<bool, Unreachable> {
        let creds = self.creds().await;
        let mut a = self.bucket(endpoint).list_objects_v2(creds.as_ref());
        a.with_prefix(prefix);
        a.with_max_keys(1);
        let url = a.sign(SIGN_FOR);
        let r = self.send(|| self.client.get(url.clone()), &url).await?;
        if !r.status().is_success() {
            return Ok(false);
        }
        let body = r.text().await.map_err(|e| unreachable(e, &url))?;
        Ok(rusty_s3::actions::ListObjectsV2::parse_response(&body)
            .is_ok_and(|l| !l.contents.is_empty() || !l.common_prefixes.is_empty()))
    }

    /// The first `n` keys (at any depth) that begin with `prefix`.
    pub(crate) async fn sample(
        &self,
        endpoint: usize,
        prefix: &str,
        n: usize,
    ) -> Result<Vec<String>, Unreachable> {
        let creds = self.creds().await;
        let mut a = self.bucket(endpoint).list_objects_v2(creds.as_ref());
        a.with_prefix(prefix);
        a.with_max_keys(n);
        let url = a.sign(SIGN_FOR);
        let r = self.send(|| self.client.get(url.clone()), &url).await?;
        if !r.status().is_success() {
            return Ok(Vec::new());
        }
        let body = r.text().await.map_err(|e| unreachable(e, &url))?;
        Ok(rusty_s3::actions::ListObjectsV2::parse_response(&body)
            .map(|l| l.contents.into_iter().map(|c| c.key).collect())
            .unwrap_or_default())
    }

    /// Every object and common prefix directly under `prefix` (all pages).
    pub(crate) async fn list(
        &self,
        endpoint: usize,
        prefix: &str,
    ) -> Result<Result<(Vec<Object>, Vec<String>), Response>, Unreachable> {
        let (mut objects, mut prefixes) = (Vec::new(), Vec::new());
        let mut token: Option<String> = None;
        loop {
            let creds = self.creds().await;
            let mut a = self.bucket(endpoint).list_objects_v2(creds.as_ref());
            a.with_prefix(prefix);
            a.with_delimiter("/");
            a.with_max_keys(LIST_PAGE);
            if let Some(t) = &token {
                a.with_continuation_token(t.clone());
            }
            let url = a.sign(SIGN_FOR);
            let r = self.send(|| self.client.get(url.clone()), &url).await?;
            let status = r.status();
            let body = r.text().await.map_err(|e| unreachable(e, &url))?;
            if !status.is_success() {
                return Ok(Err(status_error(
                    &format!("listing {prefix:?}"),
                    status,
                    &body,
                )));
            }
            let page = match rusty_s3::actions::ListObjectsV2::parse_response(&body) {
                Ok(p) => p,
                Err(e) => {
                    return Ok(Err(error(
                        Status::Io,
                        format!("listing {prefix:?}: the store's answer does not parse: {e}"),
                    )))
                }
            };
            for c in page.contents {
                let (Some(size), Some(lm), Some(etag)) = (c.size, c.last_modified, c.etag) else {
                    continue;
                };
                let Some(last_modified) = parse_time(&lm) else {
                    continue;
                };
                objects.push(Object {
                    key: c.key,
                    size,
                    last_modified,
                    etag: unquote(&etag),
                    digest: None,
                    meta: None,
                });
            }
            prefixes.extend(page.common_prefixes.into_iter().map(|p| p.prefix));
            match page.next_continuation_token {
                Some(t) => token = Some(t),
                None => return Ok(Ok((objects, prefixes))),
            }
        }
    }

    /// Bytes `offset..offset+len` of `key`, of the version with ETag `etag` when given (a
    /// replaced object: the current version's bytes, which the engine tells apart by their
    /// version).
    pub(crate) async fn get_range(
        &self,
        endpoint: usize,
        key: &str,
        offset: u64,
        len: u32,
        etag: Option<&str>,
    ) -> Result<Result<Got, Response>, Unreachable> {
        let creds = self.creds().await;
        let mut a = self.bucket(endpoint).get_object(creds.as_ref(), key);
        a.headers_mut().insert("x-amz-checksum-mode", "ENABLED");
        let url = a.sign(SIGN_FOR);
        let last = offset + u64::from(len.max(1)) - 1;
        let range = format!("bytes={offset}-{last}");
        let mut if_match = etag.map(|e| format!("\"{e}\""));
        loop {
            let r = self
                .send(
                    || {
                        let mut b = self
                            .client
                            .get(url.clone())
                            .header("range", &range)
                            .header("x-amz-checksum-mode", "ENABLED");
                        if let Some(m) = &if_match {
                            b = b.header("if-match", m);
                        }
                        b
                    },
                    &url,
                )
                .await?;
            let status = r.status();
            match status.as_u16() {
                // The object was replaced since: the new version's bytes, told apart by
                // their version.
                412 if if_match.is_some() => {
                    if_match = None;
                    continue;
                }
                // At or past the end (or an empty object): no bytes, and the version.
                416 => {
                    return Ok(match self.head(endpoint, key).await? {
                        Ok(object) => Ok(Got {
                            object,
                            data: Bytes::new(),
                            digest: None,
                        }),
                        Err(e) => Err(e),
                    })
                }
                200 | 206 => {}
                _ => {
                    let body = r.text().await.unwrap_or_default();
                    return Ok(Err(status_error(key, status, &body)));
                }
            }
            let headers = r.headers().clone();
            // 200: the store ignored the range (a whole small object).
            let total = if status.as_u16() == 206 {
                range_total(&headers)
            } else {
                header(&headers, "content-length").and_then(|v| v.parse().ok())
            };
            let Some(object) = object_of(key, &headers, total) else {
                return Ok(Err(error(
                    Status::Io,
                    format!("{key}: GET without ETag, Content-Range or Last-Modified"),
                )));
            };
            let mut data = r.bytes().await.map_err(|e| unreachable(e, &url))?;
            if status.as_u16() == 200 {
                let start = (offset as usize).min(data.len());
                let end = (start + len as usize).min(data.len());
                data = data.slice(start..end);
            }
            let digest = object.digest.clone();
            return Ok(Ok(Got {
                object,
                data,
                digest,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn times_etags_and_checksums_are_read() {
        assert_eq!(parse_time("2026-11-25T12:00:01.999Z"), Some(1_795_608_001));
        assert_eq!(
            parse_time("Wed, 25 Nov 2026 12:00:01 GMT"),
            Some(1_795_608_001)
        );
        assert_eq!(unquote("\"abc\""), "abc");
        let md5 = etag_md5("d41d8cd98f00b204e9800998ecf8427e").unwrap();
        assert_eq!(md5, Digest::of(DigestKind::Md5, b""));
        assert!(etag_md5("d41d8cd98f00b204e9800998ecf8427e-2").is_none());
        let mut h = reqwest::header::HeaderMap::new();
        let crc = Digest::of(DigestKind::Crc32c, b"hello");
        h.insert(
            "x-amz-checksum-crc32c",
            base64::engine::general_purpose::STANDARD
                .encode(&crc.value)
                .parse()
                .unwrap(),
        );
        assert_eq!(digest_of(&h, "d41d8cd98f00b204e9800998ecf8427e"), Some(crc));
        // The strongest the store keeps: SHA-256 before a CRC (and before the ETag's MD5).
        let sha = Digest::of(DigestKind::Sha256, b"hello");
        let b64 = base64::engine::general_purpose::STANDARD.encode(&sha.value);
        h.insert("x-amz-checksum-sha256", b64.parse().unwrap());
        assert_eq!(digest_of(&h, "d41d8cd98f00b204e9800998ecf8427e"), Some(sha));
        h.remove("x-amz-checksum-sha256");
        h.insert("x-amz-checksum-type", "COMPOSITE".parse().unwrap());
        assert_eq!(digest_of(&h, "x-2"), None);
        h.insert("content-range", "bytes 0-9/1234".parse().unwrap());
        assert_eq!(range_total(&h), Some(1234));
        assert_eq!(
            store_message(
                StatusCode::FORBIDDEN,
                "<Error><Code>AccessDenied</Code><Message>no</Message></Error>"
            ),
            "403 Forbidden: no"
        );
    }
}
