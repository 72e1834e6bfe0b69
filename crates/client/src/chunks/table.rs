//! The chunk store's bookkeeping: which chunks are held, how many bytes they count, and
//! in which order completed ones leave.
//!
//! Every operation is O(1) (hash lookups and a linked LRU list) except
//! [`Table::invalidate`], which is O(chunks of that file) through a per-file index.
//!
//! Invariants:
//! - `used` is the sum of `len` over every entry, present or in flight.
//! - Only entries marked complete ([`Table::completed`]) are in the LRU list, so eviction
//!   never drops a chunk in flight (its waiters would fetch it a second time).
//! - `by_file[id]` holds exactly the indexes of the entries of file `id`.

use std::collections::{HashMap, HashSet};

use ferry_proto::Version;
use lru::LruCache;

/// A chunk: file id and chunk index.
pub(crate) type ChunkId = (u64, u64);

struct Entry<S> {
    version: Version,
    value: S,
    len: usize,
}

/// Entries with their accounting; `S` is what the store keeps per chunk (its slot).
pub(crate) struct Table<S> {
    entries: HashMap<ChunkId, Entry<S>>,
    /// Completed entries, least recently used first out.
    lru: LruCache<ChunkId, ()>,
    by_file: HashMap<u64, HashSet<u64>>,
    used: usize,
}

impl<S> Table<S> {
    pub(crate) fn new() -> Table<S> {
        Table {
            entries: HashMap::new(),
            lru: LruCache::unbounded(),
            by_file: HashMap::new(),
            used: 0,
        }
    }

    /// Bytes accounted (present or in flight).
    pub(crate) fn used(&self) -> usize {
        self.used
    }

    /// The entry of `id` when it is of `version`; counts as a use (recency).
    pub(crate) fn touch(&mut self, id: ChunkId, version: &Version) -> Option<&S> {
        let e = self.entries.get(&id).filter(|e| e.version == *version)?;
        self.lru.promote(&id);
        Some(&e.value)
    }

    /// The entry of `id` with its version, without counting a use.
    pub(crate) fn peek(&self, id: ChunkId) -> Option<(&Version, &S)> {
        self.entries.get(&id).map(|e| (&e.version, &e.value))
    }

    /// Adds an entry in flight for `id` (replacing any other), counting `len` bytes.
    pub(crate) fn insert(&mut self, id: ChunkId, version: Version, value: S, len: usize) {
        self.remove(id);
        self.entries.insert(
            id,
            Entry {
                version,
                value,
                len,
            },
        );
        self.by_file.entry(id.0).or_default().insert(id.1);
        self.used += len;
    }

    /// Removes the entry of `id`, if any, and returns it.
    pub(crate) fn remove(&mut self, id: ChunkId) -> Option<S> {
        let e = self.entries.remove(&id)?;
        self.used -= e.len;
        self.lru.pop(&id);
        if let Some(set) = self.by_file.get_mut(&id.0) {
            set.remove(&id.1);
            if set.is_empty() {
                self.by_file.remove(&id.0);
            }
        }
        Some(e.value)
    }

    /// Removes the entry of `id` when `pred` holds for its version and value.
    pub(crate) fn remove_if(&mut self, id: ChunkId, pred: impl FnOnce(&Version, &S) -> bool) {
        if self
            .entries
            .get(&id)
            .is_some_and(|e| pred(&e.version, &e.value))
        {
            self.remove(id);
        }
    }

    /// The entry of `id`, when `pred` holds for its value, is complete: it may be evicted
    /// from now on. It enters as the most recently used (its waiters are reading it now).
    pub(crate) fn completed(&mut self, id: ChunkId, pred: impl FnOnce(&S) -> bool) {
        let here = self.entries.get(&id).is_some_and(|e| pred(&e.value));
        if here && !self.lru.contains(&id) {
            self.lru.put(id, ());
        }
    }

    /// Evicts completed entries, least recently used first, until at most `budget` bytes
    /// are accounted or only entries in flight are left. Returns how many left.
    pub(crate) fn evict_to(&mut self, budget: usize) -> u64 {
        let mut evicted = 0;
        while self.used > budget {
            let Some((id, ())) = self.lru.pop_lru() else {
                break;
            };
            self.remove(id);
            evicted += 1;
        }
        evicted
    }

    /// Drops every entry of file `file`.
    pub(crate) fn invalidate(&mut self, file: u64) {
        let Some(indexes) = self.by_file.remove(&file) else {
            return;
        };
        for i in indexes {
            if let Some(e) = self.entries.remove(&(file, i)) {
                self.used -= e.len;
                self.lru.pop(&(file, i));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_proto::Timestamp;

    fn v(n: u64) -> Version {
        Version {
            ino: n,
            size: 10,
            mtime: Timestamp { sec: 1, nsec: 0 },
            ctime: Timestamp { sec: 1, nsec: 0 },
            btime: Timestamp::default(),
        }
    }

    /// Completed entries `0..n` of file 1, 10 bytes each, inserted in order.
    fn filled(n: u64) -> Table<u64> {
        let mut t = Table::new();
        for i in 0..n {
            t.insert((1, i), v(1), i, 10);
            t.completed((1, i), |_| true);
        }
        t
    }

    #[test]
    fn eviction_takes_the_least_recently_used_first() {
        let mut t = filled(4);
        assert!(t.touch((1, 0), &v(1)).is_some());
        // Another version is not a hit and does not count as a use.
        assert!(t.touch((1, 1), &v(2)).is_none());
        assert_eq!(t.evict_to(20), 2);
        assert!(t.peek((1, 0)).is_some(), "recently used stays");
        assert!(t.peek((1, 1)).is_none());
        assert!(t.peek((1, 2)).is_none());
        assert!(t.peek((1, 3)).is_some());
        assert_eq!(t.used(), 20);
    }

    #[test]
    fn completed_chunks_never_exceed_the_budget_after_eviction() {
        let mut t = Table::new();
        for i in 0..100u64 {
            t.insert((i % 7, i), v(1), i, 1 + (i as usize % 13));
            t.completed((i % 7, i), |_| true);
            t.evict_to(50);
            assert!(t.used() <= 50, "at {i}: {}", t.used());
        }
    }

    #[test]
    fn chunks_in_flight_are_never_evicted() {
        let mut t = filled(2);
        t.insert((2, 0), v(1), 100, 10);
        t.insert((2, 1), v(1), 101, 10);
        assert_eq!(t.evict_to(0), 2);
        assert_eq!(t.used(), 20, "only the two in flight are left");
        assert!(t.peek((2, 0)).is_some() && t.peek((2, 1)).is_some());
        // Once complete they may leave.
        t.completed((2, 1), |s| *s == 101);
        t.completed((2, 0), |s| *s == 999); // not this entry's value: stays in flight
        assert_eq!(t.evict_to(0), 1);
        assert!(t.peek((2, 0)).is_some());
        assert!(t.peek((2, 1)).is_none());
    }

    #[test]
    fn replacing_and_removing_keep_the_accounting() {
        let mut t = filled(3);
        t.insert((1, 1), v(2), 50, 4);
        assert_eq!(t.used(), 24);
        assert_eq!(t.peek((1, 1)).map(|(ver, s)| (*ver, *s)), Some((v(2), 50)));
        // The replacement is in flight: eviction skips it.
        t.evict_to(0);
        assert_eq!(t.used(), 4);
        t.remove_if((1, 1), |ver, _| *ver == v(1));
        assert_eq!(t.used(), 4, "another version: kept");
        t.remove_if((1, 1), |ver, _| *ver == v(2));
        assert_eq!(t.used(), 0);
        assert!(t.remove((1, 1)).is_none());
    }

    #[test]
    fn invalidate_drops_one_file_only() {
        let mut t = filled(3);
        t.insert((2, 0), v(1), 7, 10);
        t.insert((2, 5), v(1), 8, 10);
        t.completed((2, 5), |_| true);
        t.invalidate(2);
        assert_eq!(t.used(), 30);
        assert!(t.peek((2, 0)).is_none() && t.peek((2, 5)).is_none());
        assert!(!t.by_file.contains_key(&2));
        // Nothing of file 2 is left in the LRU list either.
        assert_eq!(t.evict_to(0), 3);
        assert_eq!(t.used(), 0);
        t.invalidate(9); // unknown file: nothing to do
    }
}
