//! Two writers of one local file: the mirror, which writes every chunk a file lacks and
//! then sets the file's metadata and stamps it, and the mount's readers, whose fetched
//! chunks are stored as they come ([`crate::LocalCopy`]). A reader decides to store a
//! chunk from the recorded state, which trails the writes by up to a syncer commit; so a
//! reader could write a chunk the mirror wrote a moment before, after the mirror set the
//! file's times: the copy's mtime would then be the time of that write, not the source's,
//! and its stamp stale (the file never opened with passthrough until verified again).
//!
//! A seal closes that window: before setting a file's metadata the mirror seals the file's
//! generation, which waits for readers' writes to it in flight and makes later ones skip;
//! the syncer lifts the seal once it has recorded everything the mirror wrote, after which
//! the state itself shows every chunk held.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};

use bytes::Bytes;

/// The seals and readers' writes in flight, per local file generation. Ordered, so a
/// file's generations are found without a walk over every file: seals are lifted only at the
/// syncer's next commit, so a mirror of small files holds thousands at once, and a walk of
/// them for each file it starts grew with the square of the tree.
#[derive(Debug, Default)]
pub(crate) struct Seals {
    files: Mutex<BTreeMap<(Bytes, u64), Entry>>,
    drained: Condvar,
}

#[derive(Debug, Default)]
struct Entry {
    writers: usize,
    sealed: bool,
}

/// A reader's write to a local file in flight ([`Seals::write`]); ends when dropped.
#[derive(Debug)]
pub(crate) struct WriteGuard<'a> {
    seals: &'a Seals,
    key: (Bytes, u64),
}

impl Seals {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<(Bytes, u64), Entry>> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reader's write to `rel` of `generation` begins: `None` while it is sealed.
    pub(crate) fn write(&self, rel: &Bytes, generation: u64) -> Option<WriteGuard<'_>> {
        let key = (rel.clone(), generation);
        let mut files = self.lock();
        let e = files.entry(key.clone()).or_default();
        if e.sealed {
            return None;
        }
        e.writers += 1;
        Some(WriteGuard { seals: self, key })
    }

    /// Seals `rel` of `generation`: waits for readers' writes to it in flight, and later
    /// ones skip until [`Seals::lift`]. Blocks (readers' writes are single `pwrite`s).
    pub(crate) fn seal(&self, rel: &Bytes, generation: u64) {
        let key = (rel.clone(), generation);
        let mut files = self.lock();
        files.entry(key.clone()).or_default().sealed = true;
        while files.get(&key).is_some_and(|e| e.writers > 0) {
            files = self.drained.wait(files).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Lifts the seal of `rel` of `generation`.
    pub(crate) fn lift(&self, rel: &Bytes, generation: u64) {
        let key = (rel.clone(), generation);
        let mut files = self.lock();
        if let Some(e) = files.get_mut(&key) {
            e.sealed = false;
            if e.writers == 0 {
                files.remove(&key);
            }
        }
    }

    /// Lifts every seal of `rel` but `generation`'s (a file started over: the seals of its
    /// old inodes guard nothing any more).
    pub(crate) fn lift_others(&self, rel: &Bytes, generation: u64) {
        let mut files = self.lock();
        let others: Vec<(Bytes, u64)> = files
            .range((rel.clone(), 0)..=(rel.clone(), u64::MAX))
            .filter(|((_, g), _)| *g != generation)
            .map(|(k, _)| k.clone())
            .collect();
        for key in others {
            if let Some(e) = files.get_mut(&key) {
                e.sealed = false;
                if e.writers == 0 {
                    files.remove(&key);
                }
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.lock().len()
    }
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        let mut files = self.seals.lock();
        if let Some(e) = files.get_mut(&self.key) {
            e.writers -= 1;
            if e.writers == 0 {
                if e.sealed {
                    self.seals.drained.notify_all();
                } else {
                    files.remove(&self.key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_sealed_file_refuses_writers_until_lifted_and_leaves_nothing_behind() {
        let s = Seals::default();
        let rel = Bytes::from_static(b"a/b");
        drop(s.write(&rel, 1).expect("not sealed"));
        assert_eq!(s.tracked(), 0);
        s.seal(&rel, 1);
        assert!(s.write(&rel, 1).is_none(), "sealed");
        assert!(s.write(&rel, 2).is_some(), "another generation is not");
        s.lift(&rel, 1);
        assert!(s.write(&rel, 1).is_some());
        assert_eq!(s.tracked(), 0);
        s.seal(&rel, 3);
        s.lift_others(&rel, 4);
        assert_eq!(s.tracked(), 0);
    }

    #[test]
    fn lifting_a_files_other_generations_leaves_its_own_and_other_files_seals() {
        let s = Seals::default();
        let (rel, longer, shorter) = (
            Bytes::from_static(b"a/b"),
            Bytes::from_static(b"a/bc"),
            Bytes::from_static(b"a/"),
        );
        for g in [1, 2, 3] {
            s.seal(&rel, g);
        }
        s.seal(&longer, 1);
        s.seal(&shorter, 1);
        let w = s.write(&rel, 4).expect("not sealed");
        s.lift_others(&rel, 2);
        assert!(
            s.write(&rel, 1).is_some() && s.write(&rel, 3).is_some(),
            "lifted"
        );
        assert!(
            s.write(&rel, 2).is_none(),
            "its own generation stays sealed"
        );
        assert!(s.write(&longer, 1).is_none() && s.write(&shorter, 1).is_none());
        // 2 of rel, the other two files, and 4 of rel (a write in flight).
        assert_eq!(s.tracked(), 4);
        drop(w);
        assert_eq!(s.tracked(), 3);
    }

    #[test]
    fn a_seal_waits_for_the_writes_in_flight() {
        let s = Arc::new(Seals::default());
        let rel = Bytes::from_static(b"f");
        let w = s.write(&rel, 7).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = {
            let (s, rel) = (s.clone(), rel.clone());
            std::thread::spawn(move || {
                s.seal(&rel, 7);
                tx.send(()).unwrap();
            })
        };
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "sealed with a write in flight"
        );
        drop(w);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the seal ends once the write does");
        t.join().unwrap();
        assert!(s.write(&rel, 7).is_none());
    }
}
