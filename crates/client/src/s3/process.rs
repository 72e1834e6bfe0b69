//! Credentials from a profile's `credential_process`, as the AWS tools run it: the command
//! (through `sh -c`) prints one JSON object,
//!
//! ```text
//! {"Version": 1, "AccessKeyId": "…", "SecretAccessKey": "…", "SessionToken": "…",
//!  "Expiration": "2026-11-25T18:00:00Z"}
//! ```
//!
//! (`SessionToken` and `Expiration` optional). Credentials with an expiration are fetched
//! again before it: once less than a fifth of their life, and at most 5 minutes, is left. A
//! failed refresh keeps the credentials held (logged); the store refuses them once expired.

use std::process::{Command, Stdio};

use jiff::Timestamp;
use rusty_s3::Credentials;

/// What a run of the command gave.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    pub(crate) credentials: Credentials,
    /// When they were fetched.
    pub(crate) at: Timestamp,
    /// When they expire (`None`: never).
    pub(crate) expires: Option<Timestamp>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Output {
    version: u32,
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    expiration: Option<String>,
}

/// Runs `command` and reads its credentials.
///
/// # Errors
/// One line naming the command and what went wrong (it could not run, exited non-zero with
/// the first line of its error output, or printed no credentials of version 1).
pub(crate) fn run(command: &str) -> Result<Fetched, String> {
    let what = format!("credential_process {command:?}");
    let out = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: cannot run it: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        return Err(format!("{what} failed ({}): {first}", out.status));
    }
    parse(&out.stdout).map_err(|e| format!("{what}: {e}"))
}

/// The credentials in a command's output.
fn parse(stdout: &[u8]) -> Result<Fetched, String> {
    let o: Output = serde_json::from_slice(stdout)
        .map_err(|e| format!("its output is not the credentials JSON: {e}"))?;
    if o.version != 1 {
        return Err(format!(
            "its output has Version {}; version 1 is read",
            o.version
        ));
    }
    if o.access_key_id.is_empty() || o.secret_access_key.is_empty() {
        return Err("its output has an empty AccessKeyId or SecretAccessKey".into());
    }
    let expires = match o.expiration.as_deref() {
        None | Some("") => None,
        Some(t) => Some(
            t.parse::<Timestamp>()
                .map_err(|e| format!("its Expiration {t:?} is not an RFC 3339 time: {e}"))?,
        ),
    };
    let credentials = match o.session_token.filter(|t| !t.is_empty()) {
        Some(t) => Credentials::new_with_token(o.access_key_id, o.secret_access_key, t),
        None => Credentials::new(o.access_key_id, o.secret_access_key),
    };
    Ok(Fetched {
        credentials,
        at: Timestamp::now(),
        expires,
    })
}

impl Fetched {
    /// Whether it is time to fetch them again, at `now`.
    pub(crate) fn stale(&self, now: Timestamp) -> bool {
        let Some(expires) = self.expires else {
            return false;
        };
        let life = expires.duration_since(self.at).as_secs_f64();
        let left = expires.duration_since(now).as_secs_f64();
        left <= (life / 5.0).min(300.0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn output_is_read_and_refused_with_a_reason() {
        let f = parse(
            br#"{"Version":1,"AccessKeyId":"AK","SecretAccessKey":"SK","SessionToken":"T","Expiration":"2026-11-25T18:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(f.expires, Some("2026-11-25T18:00:00Z".parse().unwrap()));
        let f = parse(br#"{"Version":1,"AccessKeyId":"AK","SecretAccessKey":"SK"}"#).unwrap();
        assert_eq!(f.expires, None);
        for (bad, why) in [
            (
                &br#"{"Version":2,"AccessKeyId":"A","SecretAccessKey":"S"}"#[..],
                "Version 2",
            ),
            (
                br#"{"Version":1,"AccessKeyId":"","SecretAccessKey":"S"}"#,
                "empty",
            ),
            (
                br#"{"Version":1,"AccessKeyId":"A"}"#,
                "not the credentials JSON",
            ),
            (
                br#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"S","Expiration":"soon"}"#,
                "RFC 3339",
            ),
            (b"not json", "not the credentials JSON"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn fetched_again_before_they_expire() {
        let at: Timestamp = "2026-11-25T12:00:00Z".parse().unwrap();
        let f = |expires: &str| Fetched {
            credentials: Credentials::new("a", "b"),
            at,
            expires: Some(expires.parse().unwrap()),
        };
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        // An hour's credentials: 5 minutes before.
        let hour = f("2026-11-25T13:00:00Z");
        assert!(!hour.stale(t("2026-11-25T12:54:00Z")));
        assert!(hour.stale(t("2026-11-25T12:55:01Z")));
        assert!(hour.stale(t("2026-11-25T13:30:00Z")));
        // Ten minutes' credentials: with a fifth (2 minutes) left.
        let short = f("2026-11-25T12:10:00Z");
        assert!(!short.stale(t("2026-11-25T12:07:00Z")));
        assert!(short.stale(t("2026-11-25T12:08:30Z")));
        // None: never.
        let never = Fetched {
            expires: None,
            ..hour
        };
        assert!(!never.stale(t("2099-01-01T00:00:00Z")));
    }

    #[test]
    fn a_command_that_fails_is_one_line_naming_it() {
        let e = run("echo 'no session: run aws sso login' >&2; exit 3").unwrap_err();
        assert!(
            e.contains("credential_process") && e.contains("aws sso login"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
        let ok = run(r#"printf '{"Version":1,"AccessKeyId":"A","SecretAccessKey":"S"}'"#).unwrap();
        assert_eq!(ok.expires, None);
    }
}
