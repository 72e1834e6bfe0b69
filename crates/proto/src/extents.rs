//! Questions about a file's data map ([`crate::DataMap`]: sorted, non-overlapping data
//! extents `(offset, length)`; everything else up to the file's size is a hole), answered
//! without I/O: whether a range holds data, and where `lseek(SEEK_DATA)` and
//! `lseek(SEEK_HOLE)` land.

/// How many bytes a file must leave unallocated to count as sparse ([`looks_sparse`]).
pub const SPARSE_SLACK: u64 = 1 << 20;

/// Whether a file of `size` bytes that allocates `allocated` bytes is worth treating as
/// sparse (its data map asked for, its holes skipped when hashed): at least
/// [`SPARSE_SLACK`] of it is not allocated.
pub fn looks_sparse(allocated: u64, size: u64) -> bool {
    allocated.saturating_add(SPARSE_SLACK) <= size
}

/// Whether any of `extents` overlaps `offset..offset + len`.
pub fn holds_data(extents: &[(u64, u64)], offset: u64, len: u64) -> bool {
    // The first extent ending after `offset`.
    let i = extents.partition_point(|&(o, l)| o.saturating_add(l) <= offset);
    extents
        .get(i)
        .is_some_and(|&(o, _)| o < offset.saturating_add(len))
}

/// `lseek(fd, offset, SEEK_DATA)` on a file of `size` bytes: the first offset at or after
/// `offset` that is data; `None` (ENXIO) when there is none or `offset` is not before the
/// end.
pub fn seek_data(extents: &[(u64, u64)], size: u64, offset: u64) -> Option<u64> {
    if offset >= size {
        return None;
    }
    let i = extents.partition_point(|&(o, l)| o.saturating_add(l) <= offset);
    let &(o, _) = extents.get(i)?;
    let at = o.max(offset);
    (at < size).then_some(at)
}

/// `lseek(fd, offset, SEEK_HOLE)` on a file of `size` bytes: the first offset at or after
/// `offset` in a hole, counting the end of the file as one; `None` (ENXIO) when `offset`
/// is not before the end.
pub fn seek_hole(extents: &[(u64, u64)], size: u64, offset: u64) -> Option<u64> {
    if offset >= size {
        return None;
    }
    let mut at = offset;
    let mut i = extents.partition_point(|&(o, l)| o.saturating_add(l) <= at);
    // Through extents that touch one another.
    while let Some(&(o, l)) = extents.get(i) {
        if o > at {
            break;
        }
        at = o.saturating_add(l);
        i += 1;
    }
    Some(at.min(size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn holds_data_finds_overlaps_only() {
        let ex = [(0, 10), (100, 50), (1000, 1)];
        assert!(holds_data(&ex, 0, 1));
        assert!(holds_data(&ex, 5, 100));
        assert!(!holds_data(&ex, 10, 90));
        assert!(holds_data(&ex, 149, 1));
        assert!(!holds_data(&ex, 150, 850));
        assert!(holds_data(&ex, 999, 5));
        assert!(!holds_data(&ex, 1001, 1 << 30));
        assert!(!holds_data(&[], 0, 1 << 30));
    }

    #[test]
    fn seeks_land_where_a_file_system_would() {
        let ex = [(4096, 4096), (8192, 100), (65536, 4096)];
        let size = 1 << 20;
        assert_eq!(seek_data(&ex, size, 0), Some(4096));
        assert_eq!(seek_data(&ex, size, 5000), Some(5000));
        assert_eq!(seek_data(&ex, size, 8292), Some(65536));
        assert_eq!(seek_data(&ex, size, 69632), None);
        assert_eq!(seek_hole(&ex, size, 0), Some(0));
        assert_eq!(seek_hole(&ex, size, 4096), Some(8292));
        assert_eq!(seek_hole(&ex, size, 65536), Some(69632));
        assert_eq!(seek_hole(&ex, size, size - 1), Some(size - 1));
        assert_eq!(seek_hole(&ex, size, size), None);
        assert_eq!(seek_data(&ex, size, size), None);
        // No map entries: all hole; data to the end: the end is the only hole.
        assert_eq!(seek_data(&[], 10, 0), None);
        assert_eq!(seek_hole(&[(0, 10)], 10, 3), Some(10));
    }

    proptest! {
        /// Against a byte-by-byte model of the file.
        #[test]
        fn seeks_match_a_byte_model(
            marks in proptest::collection::vec(any::<bool>(), 1..64),
            at in 0usize..70,
        ) {
            let size = marks.len() as u64;
            let mut ex: Vec<(u64, u64)> = Vec::new();
            for (i, &d) in marks.iter().enumerate() {
                if d {
                    ex.push((i as u64, 1)); // touching extents, as a map may give them
                }
            }
            let off = at as u64;
            let data = (at..marks.len()).find(|&i| marks[i]).map(|i| i as u64);
            let hole = (at < marks.len())
                .then(|| (at..marks.len()).find(|&i| !marks[i]).unwrap_or(marks.len()) as u64);
            prop_assert_eq!(seek_data(&ex, size, off), if off < size { data } else { None });
            prop_assert_eq!(seek_hole(&ex, size, off), hole);
            for len in 1..4u64 {
                let model = (at..(at + len as usize).min(marks.len())).any(|i| marks[i]);
                prop_assert_eq!(holds_data(&ex, off, len), model);
            }
        }
    }
}
