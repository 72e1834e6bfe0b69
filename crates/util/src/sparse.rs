//! Writing sparse files: holes punched, all-zero blocks left unallocated.

use std::fs::File;

/// Block size of sparse writes: all-zero blocks of it stay holes.
pub const SPARSE_BLOCK: usize = 4096;

/// Makes `offset..offset + len` of `file` a hole (reads give zeros, nothing allocated).
/// A file system without hole punching gets zeros written instead.
///
/// # Errors
/// The punch or the write failed.
pub fn punch_hole(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: fallocate on a valid descriptor with no pointers involved.
    let r = unsafe {
        libc::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(file),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        crate::direct::write_all_at(file, &vec![0u8; len as usize], offset)
    } else {
        Err(e)
    }
}

/// Writes `data` at `offset` of a sparse file: the range is made a hole first, then only
/// the runs of blocks that are not all zero are written, so zeros take no space (as
/// `cp --sparse=always` does), and what the range held before is gone either way.
///
/// # Errors
/// The punch or a write failed.
pub fn write_sparse(file: &File, data: &[u8], offset: u64) -> std::io::Result<()> {
    let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
    let block = |i: usize| &data[i..(i + SPARSE_BLOCK).min(data.len())];
    if !has_zero_block(data) {
        // Dense: one write, nothing to punch.
        return crate::direct::write_all_at(file, data, offset);
    }
    punch_hole(file, offset, data.len() as u64)?;
    let mut at = 0;
    while at < data.len() {
        if zero(block(at)) {
            at += SPARSE_BLOCK;
            continue;
        }
        let start = at;
        while at < data.len() && !zero(block(at)) {
            at += SPARSE_BLOCK;
        }
        let end = at.min(data.len());
        crate::direct::write_all_at(file, &data[start..end], offset + start as u64)?;
    }
    Ok(())
}

/// Whether some whole block of `data` is all zeros (a block that is not all zeros is
/// usually told by its first bytes, so this is quick for dense data).
fn has_zero_block(data: &[u8]) -> bool {
    data.chunks(SPARSE_BLOCK).any(|b| b.iter().all(|&x| x == 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &tempfile::TempDir, len: u64) -> File {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("s"))
            .unwrap();
        f.set_len(len).unwrap();
        f
    }

    #[test]
    fn sparse_writes_leave_zero_blocks_unallocated() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let f = file(&dir, 1 << 20);
        let mut data = vec![0u8; 1 << 20];
        data[5000] = 1;
        data[(1 << 20) - 1] = 2;
        write_sparse(&f, &data, 0).unwrap();
        assert_eq!(std::fs::read(dir.path().join("s")).unwrap(), data);
        // Two blocks of data, the rest holes (allowing the file system some slack).
        assert!(f.metadata().unwrap().blocks() * 512 <= 64 << 10);
    }

    #[test]
    fn zeros_written_over_data_read_back_as_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(&dir, 3 * SPARSE_BLOCK as u64);
        crate::direct::write_all_at(&f, &[7u8; 3 * SPARSE_BLOCK], 0).unwrap();
        let mut data = vec![9u8; 3 * SPARSE_BLOCK];
        data[SPARSE_BLOCK..2 * SPARSE_BLOCK].fill(0);
        write_sparse(&f, &data, 0).unwrap();
        assert_eq!(std::fs::read(dir.path().join("s")).unwrap(), data);
        write_sparse(&f, &[0u8; 3 * SPARSE_BLOCK], 0).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("s")).unwrap(),
            vec![0u8; 3 * SPARSE_BLOCK]
        );
    }
}

/// Block size of the sparse hash ([`hash_sparse`]).
pub const HASH_BLOCK: u64 = 4096;

/// The runs of a [`hash_sparse`] as they are fed to the hasher.
struct Runs {
    hasher: blake3::Hasher,
    /// The current run: data (true) or zeros, and its length in bytes.
    data: bool,
    len: u64,
}

impl Runs {
    fn end_run(&mut self) {
        if self.len > 0 {
            self.hasher.update(&[u8::from(self.data)]);
            self.hasher.update(&self.len.to_be_bytes());
        }
        self.len = 0;
    }

    fn zeros(&mut self, n: u64) {
        if self.data {
            self.end_run();
            self.data = false;
        }
        self.len += n;
    }

    fn bytes(&mut self, b: &[u8]) {
        if !self.data {
            self.end_run();
            self.data = true;
        }
        self.hasher.update(b);
        self.len += b.len() as u64;
    }
}

/// The sparse hash of the first `size` bytes of `file`: BLAKE3 of the file's contents in
/// a form that does not depend on where it has holes, read without touching its holes.
///
/// The contents are cut into blocks of [`HASH_BLOCK`] bytes (the last may be shorter);
/// consecutive all-zero blocks form zero runs, the others data runs. The hash is BLAKE3
/// of, for each run in order, a data run's bytes followed by `0x01 | length u64 BE`, or a
/// zero run's `0x00 | length u64 BE`; then `0x02 | size u64 BE`. (Read from its end, this
/// encoding gives back the runs: two contents have the same encoding only if equal.)
/// Blocks wholly inside a hole (`SEEK_DATA`/`SEEK_HOLE`) are zeros without being read;
/// every other block is read and tested. So an 8 GiB file holding 6 MiB of data is hashed
/// by reading about 6 MiB, the same on both ends whatever their holes.
///
/// # Errors
/// A seek or read failed, or the file is shorter than `size`.
pub fn hash_sparse(file: &File, size: u64) -> std::io::Result<[u8; 32]> {
    use std::os::fd::AsRawFd;
    let seek = |pos: u64, whence: i32| -> std::io::Result<u64> {
        // SAFETY: lseek on a valid descriptor.
        let r = unsafe { libc::lseek(file.as_raw_fd(), pos as libc::off_t, whence) };
        if r >= 0 {
            return Ok(r as u64);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            // Past the last data: the rest is a hole.
            Some(libc::ENXIO) => Ok(size),
            // No SEEK_DATA here: all data.
            Some(libc::EINVAL) if whence == libc::SEEK_DATA => Ok(pos),
            Some(libc::EINVAL) => Ok(size),
            _ => Err(e),
        }
    };
    let floor = |x: u64| x - x % HASH_BLOCK;
    let ceil = |x: u64| x.div_ceil(HASH_BLOCK) * HASH_BLOCK;
    let mut runs = Runs {
        hasher: blake3::Hasher::new(),
        data: false,
        len: 0,
    };
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut pos = 0u64;
    while pos < size {
        let data = floor(seek(pos, libc::SEEK_DATA)?.min(size)).max(pos);
        if data > pos {
            runs.zeros(data - pos);
            pos = data;
        }
        if pos >= size {
            break;
        }
        let hole = ceil(seek(pos, libc::SEEK_HOLE)?.max(pos + 1)).min(size);
        while pos < hole {
            buf.clear();
            let want = ((hole - pos) as usize).min(buf.capacity());
            buf.resize(want, 0);
            let n = std::os::unix::fs::FileExt::read_at(file, &mut buf, pos)?;
            // A regular file reads short only at its end.
            if n == 0 || (n < want && pos + n as u64 != size) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the file is shorter than its size",
                ));
            }
            // Whole blocks only, but for the file's last one.
            let n = if pos + n as u64 == size {
                n
            } else {
                n - n % HASH_BLOCK as usize
            };
            if n == 0 {
                continue;
            }
            for block in buf[..n].chunks(HASH_BLOCK as usize) {
                if block.iter().all(|&b| b == 0) {
                    runs.zeros(block.len() as u64);
                } else {
                    runs.bytes(block);
                }
            }
            pos += n as u64;
        }
    }
    runs.end_run();
    runs.hasher.update(&[2]);
    runs.hasher.update(&size.to_be_bytes());
    Ok(*runs.hasher.finalize().as_bytes())
}

#[cfg(test)]
mod hash_tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn make(dir: &tempfile::TempDir, name: &str, size: u64, islands: &[(u64, &[u8])]) -> File {
        let p = dir.path().join(name);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        f.set_len(size).unwrap();
        for (at, b) in islands {
            f.write_all_at(b, *at).unwrap();
        }
        f
    }

    #[test]
    fn the_sparse_hash_depends_on_the_bytes_not_on_the_holes() {
        let dir = tempfile::tempdir().unwrap();
        let size = (8 << 20) + 123;
        let islands: &[(u64, &[u8])] =
            &[(5000, b"abc"), ((3 << 20) - 2, b"xyzw"), (size - 1, b"!")];
        let sparse = make(&dir, "a", size, islands);
        // The same bytes, all allocated (zeros written).
        let dense = make(&dir, "b", size, &[]);
        dense.write_all_at(&vec![0u8; size as usize], 0).unwrap();
        for (at, b) in islands {
            dense.write_all_at(b, *at).unwrap();
        }
        let h = hash_sparse(&sparse, size).unwrap();
        assert_eq!(h, hash_sparse(&dense, size).unwrap());
        // Any byte different, or another size: another hash.
        let other = make(
            &dir,
            "c",
            size,
            &[(5000, b"abd"), ((3 << 20) - 2, b"xyzw"), (size - 1, b"!")],
        );
        assert_ne!(h, hash_sparse(&other, size).unwrap());
        let moved = make(
            &dir,
            "d",
            size,
            &[(5001, b"abc"), ((3 << 20) - 2, b"xyzw"), (size - 1, b"!")],
        );
        assert_ne!(h, hash_sparse(&moved, size).unwrap());
        let longer = make(&dir, "e", size + 1, islands);
        assert_ne!(h, hash_sparse(&longer, size + 1).unwrap());
        // A file of zeros only, and an empty one.
        let z = make(&dir, "z", 1 << 20, &[]);
        assert_ne!(
            hash_sparse(&z, 1 << 20).unwrap(),
            hash_sparse(&z, 0).unwrap()
        );
    }

    /// The worked example of PROTOCOL.md §7.14.
    #[test]
    fn the_protocols_example_is_what_is_computed() {
        let dir = tempfile::tempdir().unwrap();
        let f = make(&dir, "x", 10_000, &[(5000, b"A")]);
        let mut block = vec![0u8; 4096];
        block[5000 - 4096] = b'A';
        let mut h = blake3::Hasher::new();
        h.update(&[0]);
        h.update(&4096u64.to_be_bytes());
        h.update(&block);
        h.update(&[1]);
        h.update(&4096u64.to_be_bytes());
        h.update(&[0]);
        h.update(&1808u64.to_be_bytes());
        h.update(&[2]);
        h.update(&10_000u64.to_be_bytes());
        assert_eq!(hash_sparse(&f, 10_000).unwrap(), *h.finalize().as_bytes());
    }

    #[test]
    fn a_short_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let f = make(&dir, "s", 100, &[(0, b"x")]);
        assert!(hash_sparse(&f, 5000).is_err());
    }
}
