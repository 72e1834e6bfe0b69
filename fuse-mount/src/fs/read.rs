//! The read path of one open handle.
//!
//! Each read asks the handle's [`ferry_client::Prefetcher`] whether the reader is
//! sequential:
//! - Sequential (or every chunk the read needs is already held): whole chunks through the
//!   shared [`ferry_client::ChunkStore`]. The read's own chunks are started first, then the
//!   read-ahead window the prefetcher asks for (stopping when the chunk budget is spent),
//!   all in flight before the read waits for its first chunk.
//! - Random: exactly the bytes asked for ([`ferry_client::ChunkStore::read_range`]: the
//!   local copy if it has them, else the network). Except from an S3 store into a local
//!   copy (`--cache-dir`): there a random read takes the whole chunks it touches through
//!   the chunk store, like a sequential one without read-ahead, and they go to the local
//!   copy. A ranged GET costs the store a whole block read and checked (Garage's blocks are
//!   1 MiB) and a request (which S3 bills) whatever its length, so a 16 KiB GET costs
//!   nearly what a 1 MiB one does, and later reads of the same chunk are then served from
//!   memory or the local copy. From ferryd a read costs the server its own bytes, and
//!   random reads stay exact (a chunk would cost the link 64 times a 16 KiB read).
//!
//! Invariants: a read is short only at the end of the file as of the version seen at open;
//! a chunk is marked consumed (it leaves the chunk store) only once the page cache holds all
//! its bytes: read whole by anyone, or every byte of it by a sequential reader whose reads
//! cut across chunks (a reader in 10 KiB records, as `tar` reads, has the kernel's readahead
//! ask for pieces that straddle chunks, and out of order: a chunk's tail may come before its
//! head).
//!
//! A file that changed on the server since the handle opened it
//! ([`ClientError::Changed`]): bytes of another inode (replaced by a rename) fail the read
//! with ESTALE; with `strict`, any change fails it with EIO; otherwise the bytes the file
//! holds now at that offset are returned when the server sent all the read asked for (an
//! append, a rewrite in place), and a read that reaches past where the file now ends fails
//! with EIO (a short read there would let the kernel serve zeros up to the size it holds).

use std::time::Instant;

use bytes::Bytes;
use ferry_client::{ClientError, FileKey};
use tracing::warn;

use super::handles::Handle;
use super::{lock, Fs};
use crate::error::Error;

impl Fs {
    /// Reads up to `size` bytes at `offset` through handle `fh`. Short only at end of file
    /// (as of the version seen at open).
    ///
    /// # Errors
    /// EBADF for an unknown handle; EIO on transport failures or corruption.
    pub async fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Bytes, Error> {
        let h = self
            .handles
            .get(fh)
            .ok_or_else(|| Error::errno(libc::EBADF, "unknown file handle"))?;
        let file_size = h.key.version.size;
        if offset >= file_size || size == 0 {
            return Ok(Bytes::new());
        }
        let end = (offset + u64::from(size)).min(file_size);
        let plan = lock(&h.prefetcher).on_read(offset, end - offset, file_size);
        let cs = self.store.chunk_size();
        let first = offset / cs;
        let last = (end - 1) / cs;
        if first == 0 && h.page_cache && self.store.read_lately(&h.key) {
            // The kernel asks for the start of a file read to its end within the minute:
            // it no longer holds its pages (dropped, or evicted under memory pressure),
            // nor, likely, those of the files read about then. A walk over them again (a
            // second copy, a `diff -r` of the first) has them fetched ahead again rather
            // than read one request each.
            self.pages_dropped();
        }
        let cached = (first..=last).all(|i| self.store.held(&h.key, i));
        let exact = !plan.sequential && !cached && !self.random_reads_whole_chunks();
        {
            let mut st = lock(&h.stats);
            st.reads += 1;
            st.bytes += end - offset;
            st.sequential += u64::from(plan.sequential);
            st.direct += u64::from(exact);
            st.unaligned += u64::from(!offset.is_multiple_of(cs));
        }
        if exact {
            return match self.read_direct(&h.key, offset, end).await {
                Err(ClientError::Changed(c)) => {
                    self.changed(&h, c.version, c.data, (end - offset) as usize)
                }
                r => Ok(r?),
            };
        }
        // Own chunks first, then the window ahead, all in flight before waiting.
        for i in first..=last {
            self.store.start(&h.key, i);
        }
        if !plan.ahead.is_empty() {
            let from = plan.ahead.start.div_ceil(cs).max(last + 1);
            let to = (plan.ahead.end - 1) / cs;
            if from <= to {
                self.store.prefetch_range(&h.key, last, from, to);
            }
        }
        let mut parts = Vec::with_capacity((last - first + 1) as usize);
        for i in first..=last {
            let waiting = !self.store.contains(&h.key, i);
            let t0 = Instant::now();
            let start = i * cs;
            let lo = (offset.max(start) - start) as usize;
            let chunk = match self.store.get(&h.key, i).await {
                Err(ClientError::Changed(c)) => {
                    let want = (end.min(start + cs) - start) as usize;
                    self.changed(&h, c.version, c.data, want)?
                }
                r => r?,
            };
            if waiting {
                let mut st = lock(&h.stats);
                st.waited += 1;
                st.wait += t0.elapsed();
            }
            let hi = ((end.min(start + cs) - start) as usize).min(chunk.len());
            if lo >= hi {
                break;
            }
            parts.push(chunk.slice(lo..hi));
            // Read whole, by anyone, or all its parts by a sequential reader: the page
            // cache has its bytes now.
            let whole = lo == 0 && hi == chunk.len();
            if whole || (plan.sequential && h.read_part(i, hi - lo, chunk.len())) {
                self.store.consumed(&h.key, i);
            }
        }
        Ok(ferry_client::chunks::concat(parts))
    }

    /// Whether random reads take the whole chunks they touch (see the module docs): from an
    /// S3 store, with a local copy to keep them.
    fn random_reads_whole_chunks(&self) -> bool {
        self.client.s3().is_some() && self.store.backing().is_some()
    }

    /// A random read: exactly the bytes asked for (see
    /// [`ferry_client::ChunkStore::read_range`]).
    async fn read_direct(
        &self,
        key: &FileKey,
        offset: u64,
        end: u64,
    ) -> Result<Bytes, ClientError> {
        self.store.read_range(key, offset, end).await
    }

    /// What a read of handle `h` gets when the server answered from `version`, another
    /// version than the handle's, with `data` where the read needs `want` bytes (see the
    /// module docs): the bytes, or the error.
    fn changed(
        &self,
        h: &Handle,
        version: ferry_proto::Version,
        data: Bytes,
        want: usize,
    ) -> Result<Bytes, Error> {
        let opened = h.key.version;
        let path = String::from_utf8_lossy(&h.key.path);
        let (errno, why) = if !version.same_file(&opened) {
            (libc::ESTALE, "was replaced (renamed over or recreated)")
        } else if self.cfg.strict {
            (
                libc::EIO,
                "changed (strict: a handle reads one version only)",
            )
        } else if data.len() < want {
            (libc::EIO, "shrank below where it is being read")
        } else {
            if !h.changed.swap(true, std::sync::atomic::Ordering::Relaxed) {
                warn!("/{path} changed on the server while open: reads go on with its new bytes");
            }
            return Ok(data);
        };
        if !h.changed.swap(true, std::sync::atomic::Ordering::Relaxed) {
            warn!(
                "/{path} {why} on the server while open: its reads fail (was {} bytes, now {})",
                opened.size, version.size
            );
        }
        Err(Error::errno(errno, why))
    }
}
