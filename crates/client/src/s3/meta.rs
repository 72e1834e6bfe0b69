//! Modes, owners and times kept in an object's user metadata (`x-amz-meta-*`) by the tools
//! that copy file trees into object stores, read so that a copy out of the bucket is the
//! tree that went in.
//!
//! The conventions, as those tools write them (checked against rclone 1.60 and s3fs 1.90):
//!
//! | key | rclone (`copy -M`) | s3fs | s3cmd (`s3cmd-attrs`) |
//! | --- | --- | --- | --- |
//! | `mtime` | seconds, with 9 decimals | seconds, decimals optional | seconds |
//! | `atime` | RFC 3339 | seconds | seconds |
//! | `mode` | octal with the type (`100600`) | decimal, type optional (`33152`, `493`) | decimal |
//! | `uid`, `gid` | decimal | decimal | decimal |
//!
//! A mode is read as octal when it has a leading zero, when its object also carries an
//! RFC 3339 time (rclone's mark), or when read as decimal it is no mode (too large, or type
//! bits of no file type); otherwise as decimal. Setuid and setgid bits are never taken from metadata (anyone who may write
//! the bucket could otherwise plant a setuid file in a copy made as root); a sticky bit is
//! kept on directories only.

use ferry_proto::Timestamp;

/// The header prefix of user metadata.
const PREFIX: &str = "x-amz-meta-";

/// File type bits of a mode.
pub(crate) const S_IFMT: u32 = 0o170_000;
/// A symbolic link's type bits.
pub(crate) const S_IFLNK: u32 = 0o120_000;

/// What an object's metadata says of the file it stands for; each `None` when absent or
/// unreadable.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    /// Type bits (0 when the convention gave none) and permission bits.
    pub(crate) mode: Option<u32>,
    pub(crate) uid: Option<u32>,
    pub(crate) gid: Option<u32>,
    pub(crate) mtime: Option<Timestamp>,
    pub(crate) atime: Option<Timestamp>,
}

impl Meta {
    /// The metadata among `headers` (names in lower case, as HTTP/1.1 stacks give them);
    /// `None` when no key of a known convention is there.
    pub(crate) fn from_headers<'a>(
        headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Meta> {
        let mut m = Meta::default();
        let (mut mode, mut s3cmd, mut rfc3339) = (None, None, false);
        let mut any = false;
        for (name, value) in headers {
            let Some(key) = name.strip_prefix(PREFIX) else {
                continue;
            };
            let value = value.trim();
            match key {
                "mtime" => m.mtime = stamp(value),
                "atime" => m.atime = stamp(value),
                "mode" => mode = Some(value),
                "uid" => m.uid = value.parse().ok(),
                "gid" => m.gid = value.parse().ok(),
                "s3cmd-attrs" => s3cmd = Some(value),
                "btime" => {} // rclone's: read only as its mark (below)
                _ => continue,
            }
            any = true;
            if matches!(key, "atime" | "btime" | "mtime") && value.contains('T') {
                rfc3339 = true;
            }
        }
        if let Some(mode) = mode {
            m.mode = parse_mode(mode, rfc3339);
        }
        if let Some(attrs) = s3cmd {
            // atime:1600000000/ctime:…/gid:0/gname:root/md5:…/mode:33188/mtime:…/uid:0
            for field in attrs.split('/') {
                let Some((k, v)) = field.split_once(':') else {
                    continue;
                };
                match k {
                    "mode" if m.mode.is_none() => m.mode = parse_mode(v, false),
                    "uid" if m.uid.is_none() => m.uid = v.parse().ok(),
                    "gid" if m.gid.is_none() => m.gid = v.parse().ok(),
                    "mtime" if m.mtime.is_none() => m.mtime = stamp(v),
                    "atime" if m.atime.is_none() => m.atime = stamp(v),
                    _ => {}
                }
            }
        }
        (any && m != Meta::default()).then_some(m)
    }

    /// The type bits it gives (0: none).
    pub(crate) fn kind(&self) -> u32 {
        self.mode.map_or(0, |m| m & S_IFMT)
    }

    /// The permission bits to show for a directory (`dir`) or a file, if it gives any.
    pub(crate) fn perm(&self, dir: bool) -> Option<u16> {
        let keep = if dir { 0o1777 } else { 0o777 };
        self.mode.map(|m| (m & keep) as u16)
    }
}

/// A mode as its convention writes it (see the module docs); `None` when it is not one.
fn parse_mode(v: &str, rclone: bool) -> Option<u32> {
    // No type bits, or those of a file type.
    let mode = |m: u32| {
        (m <= 0o177_777
            && matches!(
                m & S_IFMT,
                0 | 0o010_000 | 0o020_000 | 0o040_000 | 0o060_000 | 0o100_000 | S_IFLNK | 0o140_000
            ))
        .then_some(m)
    };
    let octal = || u32::from_str_radix(v, 8).ok().and_then(mode);
    if (v.len() > 1 && v.starts_with('0')) || rclone {
        octal()
    } else {
        v.parse::<u32>().ok().and_then(mode).or_else(octal)
    }
}

/// A time as seconds since the epoch with an optional fraction (`981173106.123456789`) or
/// an RFC 3339 time.
fn stamp(v: &str) -> Option<Timestamp> {
    if v.contains('T') {
        let t = v.parse::<jiff::Timestamp>().ok()?;
        return Some(Timestamp {
            sec: t.as_second(),
            nsec: t.subsec_nanosecond().try_into().ok()?,
        });
    }
    let (sec, frac) = v.split_once('.').unwrap_or((v, ""));
    let sec: i64 = sec.parse().ok()?;
    if frac.len() > 9 && !frac[9..].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = &frac[..frac.len().min(9)];
    let nsec = if digits.is_empty() {
        0
    } else {
        if !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse::<u32>().ok()? * 10u32.pow(9 - digits.len() as u32)
    };
    if sec < 0 && nsec > 0 {
        return None; // "-1.5": not written by any of the tools
    }
    Some(Timestamp { sec, nsec })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A directory's type bits.
    const S_IFDIR: u32 = 0o040_000;

    fn meta(h: &[(&str, &str)]) -> Option<Meta> {
        Meta::from_headers(h.iter().copied())
    }

    fn t(sec: i64, nsec: u32) -> Option<Timestamp> {
        Some(Timestamp { sec, nsec })
    }

    /// The headers rclone 1.60 (`copy -M --links`) wrote for a file chmod 600, owned by
    /// 1234:2345, mtime 2001-02-03 04:05:06.123456789, and for a symlink.
    #[test]
    fn rclone() {
        let m = meta(&[
            ("x-amz-meta-atime", "2001-02-03T04:05:06.123456789Z"),
            ("x-amz-meta-btime", "2026-11-25T14:55:52.025332384Z"),
            ("x-amz-meta-gid", "2345"),
            ("x-amz-meta-mode", "100600"),
            ("x-amz-meta-mtime", "981173106.123456789"),
            ("x-amz-meta-uid", "1234"),
            ("content-type", "text/plain"),
        ])
        .unwrap();
        assert_eq!(m.mode, Some(0o100_600));
        assert_eq!(m.perm(false), Some(0o600));
        assert_eq!((m.uid, m.gid), (Some(1234), Some(2345)));
        assert_eq!(m.mtime, t(981_173_106, 123_456_789));
        assert_eq!(m.atime, t(981_173_106, 123_456_789));
        let link = meta(&[
            ("x-amz-meta-atime", "2026-11-25T14:55:52.033332384Z"),
            ("x-amz-meta-mode", "120777"),
            ("x-amz-meta-mtime", "1795618552.032802863"),
        ])
        .unwrap();
        assert_eq!(link.kind(), S_IFLNK);
        // A directory's mode, five digits, is octal too.
        let dir = meta(&[("x-amz-meta-mode", "40755")]).unwrap();
        assert_eq!(dir.kind(), S_IFDIR);
        assert_eq!(dir.perm(true), Some(0o755));
        // rclone's documented form with a leading zero.
        assert_eq!(
            meta(&[("x-amz-meta-mode", "0100664")]).unwrap().mode,
            Some(0o100_664)
        );
    }

    /// The headers s3fs 1.90 wrote (cp -a of the same file, a symlink, mkdir, chmod 700,
    /// chmod 4755).
    #[test]
    fn s3fs() {
        let m = meta(&[
            ("x-amz-meta-atime", "1795618552.141332381"),
            ("x-amz-meta-ctime", "1795618561"),
            ("x-amz-meta-gid", "2345"),
            ("x-amz-meta-mode", "33152"),
            ("x-amz-meta-mtime", "981173106.123456789"),
            ("x-amz-meta-uid", "1234"),
        ])
        .unwrap();
        assert_eq!(m.mode, Some(0o100_600));
        assert_eq!(m.mtime, t(981_173_106, 123_456_789));
        assert_eq!(
            meta(&[("x-amz-meta-mode", "41471")]).unwrap().kind(),
            S_IFLNK
        );
        let root = meta(&[("x-amz-meta-mode", "493")]).unwrap();
        assert_eq!((root.kind(), root.perm(true)), (0, Some(0o755)));
        let sub = meta(&[("x-amz-meta-mode", "16832")]).unwrap();
        assert_eq!((sub.kind(), sub.perm(true)), (S_IFDIR, Some(0o700)));
        // Setuid is never taken.
        let suid = meta(&[("x-amz-meta-mode", "35309")]).unwrap();
        assert_eq!(suid.mode, Some(0o104_755));
        assert_eq!(suid.perm(false), Some(0o755));
        assert_eq!(
            meta(&[("x-amz-meta-mtime", "1795618561")]).unwrap().mtime,
            t(1_795_618_561, 0)
        );
    }

    #[test]
    fn s3cmd_attrs_fill_what_direct_keys_leave() {
        let m = meta(&[(
            "x-amz-meta-s3cmd-attrs",
            "atime:1600000000/ctime:1600000001/gid:7/gname:lp/md5:abc/mode:33188/mtime:1600000002/uid:8/uname:x",
        )])
        .unwrap();
        assert_eq!(m.mode, Some(0o100_644));
        assert_eq!((m.uid, m.gid), (Some(8), Some(7)));
        assert_eq!(m.mtime, t(1_600_000_002, 0));
        let both = meta(&[
            ("x-amz-meta-uid", "1"),
            ("x-amz-meta-s3cmd-attrs", "uid:8/gid:7"),
        ])
        .unwrap();
        assert_eq!((both.uid, both.gid), (Some(1), Some(7)));
    }

    #[test]
    fn nothing_known_or_nothing_readable_is_none() {
        assert_eq!(meta(&[]), None);
        assert_eq!(meta(&[("x-amz-meta-color", "blue"), ("etag", "x")]), None);
        assert_eq!(
            meta(&[("x-amz-meta-mtime", "soon"), ("x-amz-meta-mode", "rwx")]),
            None
        );
        // One readable key is enough; the others stay None.
        let m = meta(&[("x-amz-meta-uid", "5"), ("x-amz-meta-mode", "999999999")]).unwrap();
        assert_eq!((m.uid, m.mode), (Some(5), None));
    }

    #[test]
    fn times() {
        assert_eq!(stamp("1.5"), t(1, 500_000_000));
        assert_eq!(stamp("1.0000000001"), t(1, 0));
        assert_eq!(stamp("-5"), t(-5, 0));
        assert_eq!(stamp("1.x"), None);
        assert_eq!(stamp(""), None);
        assert_eq!(stamp("1970-01-01T00:00:01.25Z"), t(1, 250_000_000));
    }
}
