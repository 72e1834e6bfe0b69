//! Read-ahead policy for one reader (one open file handle).
//!
//! Sequential readers get a window that starts at `initial_window` and grows to twice the
//! bytes read sequentially so far, up to `max_window`: after 1 MiB it is 2 MiB, after
//! 32 MiB it is 64 MiB. Random readers get no window at all, and the caller fetches only
//! the bytes they ask for.
//!
//! The kernel delivers readahead requests concurrently and out of order (a mount with 8 MiB
//! of kernel readahead and several FUSE threads sees a request arrive more than 8 MiB
//! behind the furthest one), so "sequential" tolerates jumps of up to `backward_slack` back
//! and `forward_slack` ahead of where the furthest read ended, and one stray read further
//! away does not end a run: only a second one in a row does (then it was a seek). A read that opens a file at offset 0 counts as
//! sequential at once; elsewhere three sequential reads in a row are needed, so a random
//! reader that happens to land near its last read does not trigger read-ahead (which
//! would fetch whole chunks where it asked for a few KiB).

use std::ops::Range;

/// Tunables.
#[derive(Debug, Clone, Copy)]
pub struct PrefetchConfig {
    /// First window (bytes).
    pub initial_window: u64,
    /// Largest window (bytes).
    pub max_window: u64,
    /// Tolerated backward jump (bytes).
    pub backward_slack: u64,
    /// Tolerated forward jump (bytes).
    pub forward_slack: u64,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        PrefetchConfig {
            initial_window: 1 << 20,
            max_window: 64 << 20,
            backward_slack: 16 << 20,
            forward_slack: 8 << 20,
        }
    }
}

/// What to do for one read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The reader is sequential: fetch whole chunks and cache them.
    pub sequential: bool,
    /// Bytes to have requested beyond this read (empty for random readers).
    pub ahead: Range<u64>,
}

/// Per-reader state.
#[derive(Debug, Clone)]
pub struct Prefetcher {
    cfg: PrefetchConfig,
    /// Where the previous read ended; `None` before the first read.
    next: Option<u64>,
    /// Sequential reads in a row.
    streak: u32,
    /// Bytes read sequentially in the current run.
    run_bytes: u64,
    /// The current run began at offset 0 (a whole-file reader): sequential from the start.
    from_zero: bool,
    /// Where the previous read ended, if it was a stray (far from an established run).
    stray: Option<u64>,
}

impl Prefetcher {
    /// A reader that has not read yet.
    pub fn new(cfg: PrefetchConfig) -> Self {
        Prefetcher {
            cfg,
            next: None,
            streak: 0,
            run_bytes: 0,
            from_zero: false,
            stray: None,
        }
    }

    fn established(&self) -> bool {
        self.streak >= 3 || (self.from_zero && self.streak >= 1)
    }

    /// Current window in bytes (0 when random).
    pub fn window(&self) -> u64 {
        if self.streak == 0 {
            return 0;
        }
        (2 * self.run_bytes)
            .max(self.cfg.initial_window)
            .min(self.cfg.max_window)
    }

    /// Records a read of `len` bytes at `offset` in a file of `size` bytes, and plans it.
    pub fn on_read(&mut self, offset: u64, len: u64, size: u64) -> Plan {
        let near_to = |mark: u64| {
            offset + self.cfg.backward_slack >= mark && offset <= mark + self.cfg.forward_slack
        };
        let near = match self.next {
            // A whole-file reader's first requests can arrive out of order too (the kernel
            // sends its first readahead window at once): a first read within the forward
            // slack of offset 0 counts as the start of the file.
            None => offset < self.cfg.forward_slack,
            Some(next) => near_to(next),
        };
        let end = offset + len;
        if !near && self.established() && self.stray.is_none() {
            // A late readahead request from far behind, or the first read after a seek:
            // planned on its own, and the run goes on unless the next read is far too.
            self.stray = Some(end);
            return Plan {
                sequential: false,
                ahead: end..end,
            };
        }
        let stray = self.stray.take();
        if near {
            if self.streak == 0 {
                self.from_zero = self.next.is_none() || offset == 0;
            }
            self.streak = self.streak.saturating_add(1);
            self.run_bytes += len;
            self.next = Some(self.next.map_or(end, |n| n.max(end)));
        } else {
            // A new run starts here; if it continues the stray read before it, that read
            // was its first.
            self.streak = if stray.is_some_and(near_to) { 2 } else { 1 };
            self.run_bytes = len;
            self.from_zero = offset == 0;
            self.next = Some(end);
        }
        let sequential = self.established();
        let ahead = if sequential {
            let from = self.next.unwrap_or(end).min(size);
            from..(from + self.window()).min(size)
        } else {
            end..end
        };
        Plan { sequential, ahead }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn sequential_window_doubles_to_max() {
        let mut p = Prefetcher::new(PrefetchConfig::default());
        let size = 1 << 40;
        let mut windows = vec![];
        for i in 0..100 {
            let plan = p.on_read(i * MIB, MIB, size);
            assert!(plan.sequential);
            windows.push(plan.ahead.end - plan.ahead.start);
        }
        assert_eq!(windows[0], 2 * MIB);
        assert_eq!(windows[3], 8 * MIB);
        assert_eq!(*windows.last().unwrap(), 64 * MIB);
        assert!(windows.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn random_reader_gets_nothing_extra() {
        let mut p = Prefetcher::new(PrefetchConfig::default());
        let size = 1 << 30;
        let mut x: u64 = 12345;
        for _ in 0..1000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (x >> 20) % (size - 16384);
            let plan = p.on_read(off, 16384, size);
            if !plan.sequential {
                assert!(plan.ahead.is_empty());
            }
        }
        // Random offsets over 1 GiB: read-ahead must be the rare exception.
        let mut seq = 0;
        for _ in 0..1000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let off = (x >> 20) % (size - 16384);
            if p.on_read(off, 16384, size).sequential {
                seq += 1;
            }
        }
        assert!(seq < 10, "{seq} random reads treated as sequential");
    }

    #[test]
    fn out_of_order_readahead_stays_sequential() {
        let mut p = Prefetcher::new(PrefetchConfig::default());
        let size = 1 << 30;
        for off in [0, 2, 1, 3, 5, 4, 6] {
            assert!(p.on_read(off * MIB, MIB, size).sequential, "offset {off}");
        }
    }

    #[test]
    fn late_arrival_far_behind_keeps_the_run() {
        let mut p = Prefetcher::new(PrefetchConfig::default());
        let size = 1 << 30;
        for off in 0..40 {
            assert!(p.on_read(off * MIB, MIB, size).sequential);
        }
        // 30 MiB behind: not sequential itself, but the run survives it.
        assert!(!p.on_read(10 * MIB, MIB, size).sequential);
        let plan = p.on_read(40 * MIB, MIB, size);
        assert!(plan.sequential);
        assert_eq!(plan.ahead.end - plan.ahead.start, 64 * MIB);
    }

    #[test]
    fn two_far_reads_in_a_row_end_the_run() {
        let mut p = Prefetcher::new(PrefetchConfig::default());
        let size = 1 << 30;
        for off in 0..8 {
            p.on_read(off * MIB, MIB, size);
        }
        assert!(!p.on_read(500 * MIB, MIB, size).sequential);
        assert!(!p.on_read(501 * MIB, MIB, size).sequential);
        // A new run, counted from the first far read: sequential at its third read.
        assert!(p.on_read(502 * MIB, MIB, size).sequential);
    }

    #[test]
    fn a_first_read_just_after_the_start_is_a_whole_file_reader() {
        // The kernel sent the second MiB before the first.
        let mut p = Prefetcher::new(PrefetchConfig::default());
        let size = 1 << 30;
        assert!(p.on_read(MIB, MIB, size).sequential);
        assert!(p.on_read(0, MIB, size).sequential);
        let mut q = Prefetcher::new(PrefetchConfig::default());
        assert!(!q.on_read(20 * MIB, 4096, size).sequential);
    }

    #[test]
    fn window_stops_at_eof() {
        let mut p = Prefetcher::new(PrefetchConfig::default());
        let plan = p.on_read(0, MIB, 3 * MIB / 2);
        assert_eq!(plan.ahead, MIB..3 * MIB / 2);
    }
}
