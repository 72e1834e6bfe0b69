//! Which names and paths may travel. Both sides check: the server never trusts the client,
//! and the client refuses to forward what the server would refuse.
//!
//! A *name* is one directory entry: non-empty, at most [`MAX_NAME_LEN`] bytes, no `/`, no
//! NUL, not `.` or `..`. A *path* is names joined by single `/`, relative to the export
//! root, shorter than [`MAX_PATH_LEN`] bytes; the empty path is the root itself.

/// Longest name accepted (Linux `NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;
/// Linux `PATH_MAX`, which counts the terminating NUL: paths must be shorter (at most
/// 4095 bytes).
pub const MAX_PATH_LEN: usize = 4096;

/// Why a name or path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Empty name, or an empty component (`a//b`, leading or trailing `/`).
    #[error("empty name or path component")]
    Empty,
    /// `.` or `..`.
    #[error("'.' and '..' are not allowed")]
    Dot,
    /// Contains `/` (in a name) or NUL.
    #[error("name contains '/' or NUL")]
    BadByte,
    /// Longer than the limits above.
    #[error("name or path too long")]
    TooLong,
}

/// Checks one directory entry name.
pub fn validate_name(name: &[u8]) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong);
    }
    if name == b"." || name == b".." {
        return Err(NameError::Dot);
    }
    if name.iter().any(|&b| b == b'/' || b == 0) {
        return Err(NameError::BadByte);
    }
    Ok(())
}

/// Checks a relative path (empty = export root).
pub fn validate_path(path: &[u8]) -> Result<(), NameError> {
    if path.is_empty() {
        return Ok(());
    }
    // PATH_MAX counts the terminating NUL: 4096 bytes is already too long for the kernel.
    if path.len() >= MAX_PATH_LEN {
        return Err(NameError::TooLong);
    }
    path.split(|&b| b == b'/').try_for_each(validate_name)
}

/// Joins a validated parent path and a validated name.
pub fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parent.len() + 1 + name.len());
    out.extend_from_slice(parent);
    if !parent.is_empty() {
        out.push(b'/');
    }
    out.extend_from_slice(name);
    out
}

/// Splits a path into its parent path and its last name (the parent of a top-level name
/// is the empty path, the export root): the inverse of [`join`].
pub fn split(path: &bytes::Bytes) -> (bytes::Bytes, bytes::Bytes) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (path.slice(..i), path.slice(i + 1..)),
        None => (bytes::Bytes::new(), path.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_undoes_join() {
        for (parent, name) in [("", "a"), ("a", "b"), ("a/b", "c d")] {
            let joined = bytes::Bytes::from(join(parent.as_bytes(), name.as_bytes()));
            let (p, n) = split(&joined);
            assert_eq!((&p[..], &n[..]), (parent.as_bytes(), name.as_bytes()));
        }
    }

    #[test]
    fn names() {
        assert!(validate_name(b"a").is_ok());
        assert!(validate_name(b"...").is_ok());
        assert!(validate_name(&[b'x'; 255]).is_ok());
        assert_eq!(validate_name(&[b'x'; 256]), Err(NameError::TooLong));
        assert_eq!(validate_name(b""), Err(NameError::Empty));
        assert_eq!(validate_name(b".."), Err(NameError::Dot));
        assert_eq!(validate_name(b"."), Err(NameError::Dot));
        assert_eq!(validate_name(b"a/b"), Err(NameError::BadByte));
        assert_eq!(validate_name(b"a\0b"), Err(NameError::BadByte));
    }

    #[test]
    fn paths() {
        assert!(validate_path(b"").is_ok());
        assert!(validate_path(b"a/b/c").is_ok());
        assert_eq!(validate_path(b"/etc/passwd"), Err(NameError::Empty));
        assert_eq!(validate_path(b"a/../../x"), Err(NameError::Dot));
        assert_eq!(validate_path(b"a//b"), Err(NameError::Empty));
        assert_eq!(validate_path(b"a/"), Err(NameError::Empty));
        assert_eq!(validate_path(&[b'a'; 4097]), Err(NameError::TooLong));
        // Valid names joined: 4095 bytes pass, 4096 (PATH_MAX with its NUL) do not.
        let path = |len: usize| {
            let mut p: Vec<u8> = std::iter::repeat_n(b"a/".as_slice(), len / 2 + 1)
                .flatten()
                .copied()
                .collect();
            p.truncate(len);
            if p.last() == Some(&b'/') {
                p.pop();
                p.push(b'b');
            }
            p
        };
        assert_eq!((path(4095).len(), path(4096).len()), (4095, 4096));
        assert_eq!(validate_path(&path(4095)), Ok(()));
        assert_eq!(validate_path(&path(4096)), Err(NameError::TooLong));
        assert_eq!(join(b"", b"a"), b"a");
        assert_eq!(join(b"a", b"b"), b"a/b");
    }
}
