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
