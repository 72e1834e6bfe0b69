//! Listing a file's extended attribute names (ferryd's DirXattrs, the mirror's copy): most
//! files have none or a few short names, so they are listed into a buffer on the stack, and
//! into the largest list the kernel allows only when that does not hold them (not 64 KiB
//! zeroed per file: in a mirror of a source tree that was a seventh of ferryd's CPU).

use rustix::io::{Errno, Result};

/// Bytes of names listed on the stack first.
pub const SMALL: usize = 512;

/// The largest name list the kernel gives (`XATTR_LIST_MAX`).
const LARGEST: usize = 64 << 10;

/// The NUL-separated names `list` (an `flistxattr` or `llistxattr` of one file into the
/// buffer it is given) writes: into `small` when they fit, else into `large`, grown to the
/// kernel's largest list.
///
/// # Errors
/// What `list` returns (`ERANGE` only when the names grew past the largest list meanwhile).
pub fn names<'a>(
    small: &'a mut [u8; SMALL],
    large: &'a mut Vec<u8>,
    list: impl Fn(&mut [u8]) -> Result<usize>,
) -> Result<&'a [u8]> {
    match list(&mut small[..]) {
        Ok(n) => Ok(&small[..n]),
        Err(Errno::RANGE) => {
            large.resize(LARGEST, 0);
            let n = list(&mut large[..])?;
            Ok(&large[..n])
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_past_the_stack_buffer_are_listed_whole() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("f")).unwrap();
        let (mut small, mut large) = ([0u8; SMALL], Vec::new());
        match names(&mut small, &mut large, |b| rustix::fs::flistxattr(&f, b)) {
            Ok(n) => assert!(n.is_empty(), "a new file has no attributes"),
            Err(Errno::NOTSUP) => return, // a file system without them
            Err(e) => panic!("{e}"),
        }
        let name = |i: usize| format!("user.an-attribute-with-a-long-name-{i:04}");
        for i in 0..40 {
            match rustix::fs::fsetxattr(&f, name(i).as_str(), b"v", rustix::fs::XattrFlags::empty())
            {
                Ok(()) => {}
                Err(Errno::NOTSUP | Errno::PERM) => return, // no user attributes here
                Err(e) => panic!("{e}"),
            }
        }
        let (mut small, mut large) = ([0u8; SMALL], Vec::new());
        let got = names(&mut small, &mut large, |b| rustix::fs::flistxattr(&f, b)).unwrap();
        let got: Vec<Vec<u8>> = got
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        assert_eq!(got.len(), 40);
        assert!(!large.is_empty(), "40 names of 40 bytes pass {SMALL} bytes");
        for i in 0..40 {
            assert!(got.contains(&name(i).into_bytes()), "{i}");
        }
    }
}
