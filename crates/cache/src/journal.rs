//! The journal: an append-only file of checksummed records, `journal` in a destination's
//! state folder ([`crate::state::location`]).
//!
//! ```text
//! file    = magic "FERRYJ01" record*
//! record  = len u32 BE | xxh3-64 of body u64 BE | body (len bytes)
//! body    = 5 path16 version chunk_size u32          file is at this version; no chunks yet
//!         | 2 path16 first u64 count u32             chunks [first, first+count) are durable
//!         | 3 path16 blake3[32]                      whole file verified
//!         | 4 path16                                 file no longer tracked
//!         | 6 path16 stamp                           the local file as it was once verified
//!         | 1 path16 version1 chunk_size u32         (written by ferry before 0.2; read only)
//! path16  = len u16 BE | bytes
//! time    = sec i64 | nsec u32
//! version = ino u64 | size u64 | mtime time | ctime time   (the server's file; all BE)
//! version1= ino u64 | size u64 | mtime time                (ctime read as 0)
//! stamp   = ino u64 | size u64 | mtime time | ctime time   (the local file's)
//! ```
//!
//! A record of kind 1 (before the ctime was part of a version) replays as a version whose
//! ctime is 0, which no server file has: the mirror then compares hashes before it trusts
//! that copy again ([`ferry_proto::Version::differs_in_ctime_only`]), and fetches nothing
//! when they match.
//!
//! Replay stops at the first record that is incomplete or fails its checksum (a write
//! torn by a crash); the file is cut there so appends continue from a clean end. A record
//! is written only after the data it describes is durable, so everything replayed is true.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use ferry_proto::{Timestamp, Version};

const MAGIC: &[u8; 8] = b"FERRYJ01";
/// A record body larger than this is corrupt (paths are at most 64 KiB).
const MAX_BODY: usize = 70_000;

/// One journal record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// The local file now holds (parts of) this version; no chunk present yet.
    Version {
        /// Export-relative path.
        path: Bytes,
        /// The remote version.
        version: Version,
        /// Chunk size the chunk indexes refer to.
        chunk_size: u32,
    },
    /// Chunks `first..first + count` are on disk (durable).
    Chunks {
        /// Export-relative path.
        path: Bytes,
        /// First chunk index.
        first: u64,
        /// Number of chunks.
        count: u32,
    },
    /// The whole file matched the server's BLAKE3.
    Verified {
        /// Export-relative path.
        path: Bytes,
        /// The hash.
        blake3: [u8; 32],
    },
    /// The path is no longer tracked.
    Forget {
        /// Export-relative path.
        path: Bytes,
    },
    /// The local file, verified and its metadata set, had these identity and times: while
    /// they still match, it is the verified copy; once any differs (edited, touched,
    /// replaced locally), it must be verified again before it is trusted.
    Stamp {
        /// Export-relative path.
        path: Bytes,
        /// The local file's inode, size, mtime and ctime.
        stamp: Version,
    },
}

impl Record {
    /// The path the record is about.
    pub fn path(&self) -> &Bytes {
        match self {
            Record::Version { path, .. }
            | Record::Chunks { path, .. }
            | Record::Verified { path, .. }
            | Record::Forget { path }
            | Record::Stamp { path, .. } => path,
        }
    }

    /// Appends this record, framed, to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        let mut b = BytesMut::new();
        let put_path = |b: &mut BytesMut, p: &Bytes| {
            b.put_u16(p.len() as u16);
            b.put_slice(p);
        };
        match self {
            Record::Version {
                path,
                version,
                chunk_size,
            } => {
                b.put_u8(5);
                put_path(&mut b, path);
                version.encode(&mut b);
                b.put_u32(*chunk_size);
            }
            Record::Stamp { path, stamp } => {
                b.put_u8(6);
                put_path(&mut b, path);
                stamp.encode(&mut b);
            }
            Record::Chunks { path, first, count } => {
                b.put_u8(2);
                put_path(&mut b, path);
                b.put_u64(*first);
                b.put_u32(*count);
            }
            Record::Verified { path, blake3 } => {
                b.put_u8(3);
                put_path(&mut b, path);
                b.put_slice(blake3);
            }
            Record::Forget { path } => {
                b.put_u8(4);
                put_path(&mut b, path);
            }
        }
        out.put_u32(b.len() as u32);
        out.put_u64(xxhash_rust::xxh3::xxh3_64(&b));
        out.put_slice(&b);
    }

    fn decode(mut b: Bytes) -> Option<Record> {
        fn path(b: &mut Bytes) -> Option<Bytes> {
            if b.remaining() < 2 {
                return None;
            }
            let n = b.get_u16() as usize;
            (b.remaining() >= n).then(|| b.split_to(n))
        }
        if b.is_empty() {
            return None;
        }
        let rec = match b.get_u8() {
            1 => {
                let p = path(&mut b)?;
                if b.remaining() != 8 + 8 + 8 + 4 + 4 {
                    return None;
                }
                Record::Version {
                    path: p,
                    version: Version {
                        ino: b.get_u64(),
                        size: b.get_u64(),
                        mtime: Timestamp {
                            sec: b.get_i64(),
                            nsec: b.get_u32(),
                        },
                        ctime: Timestamp::default(),
                        btime: Timestamp::default(),
                    },
                    chunk_size: b.get_u32(),
                }
            }
            5 => {
                let p = path(&mut b)?;
                if b.remaining() != Version::LEN + 4 {
                    return None;
                }
                let version = Version::decode(&mut b).ok()?;
                Record::Version {
                    path: p,
                    version,
                    chunk_size: b.get_u32(),
                }
            }
            6 => {
                let p = path(&mut b)?;
                if b.remaining() != Version::LEN {
                    return None;
                }
                Record::Stamp {
                    path: p,
                    stamp: Version::decode(&mut b).ok()?,
                }
            }
            2 => {
                let p = path(&mut b)?;
                if b.remaining() != 12 {
                    return None;
                }
                Record::Chunks {
                    path: p,
                    first: b.get_u64(),
                    count: b.get_u32(),
                }
            }
            3 => {
                let p = path(&mut b)?;
                if b.remaining() != 32 {
                    return None;
                }
                let mut h = [0u8; 32];
                b.copy_to_slice(&mut h);
                Record::Verified { path: p, blake3: h }
            }
            4 => {
                let p = path(&mut b)?;
                if !b.is_empty() {
                    return None;
                }
                Record::Forget { path: p }
            }
            _ => return None,
        };
        Some(rec)
    }
}

/// Parses a journal image: the records up to the first damaged one, and the byte length
/// of that valid prefix (header included). `None` if the magic is wrong.
pub fn parse(image: &[u8]) -> Option<(Vec<Record>, usize)> {
    if image.len() < MAGIC.len() || &image[..MAGIC.len()] != MAGIC {
        return None;
    }
    let mut at = MAGIC.len();
    let mut out = Vec::new();
    while image.len() - at >= 12 {
        let len = u32::from_be_bytes(image[at..at + 4].try_into().ok()?) as usize;
        let sum = u64::from_be_bytes(image[at + 4..at + 12].try_into().ok()?);
        if len > MAX_BODY || image.len() - at - 12 < len {
            break;
        }
        let body = &image[at + 12..at + 12 + len];
        if xxhash_rust::xxh3::xxh3_64(body) != sum {
            break;
        }
        let Some(rec) = Record::decode(Bytes::copy_from_slice(body)) else {
            break;
        };
        out.push(rec);
        at += 12 + len;
    }
    Some((out, at))
}

/// An open journal file, positioned at its end.
#[derive(Debug)]
pub struct Journal {
    file: File,
    len: u64,
    pending: BytesMut,
}

/// Whether `path` is a ferry journal (begins with its magic).
pub fn is_journal(path: &Path) -> bool {
    let mut head = [0u8; 8];
    File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok()
        && &head == MAGIC
}

impl Journal {
    /// Opens (or creates) the journal at `path`: returns it and the records replayed. A
    /// damaged tail is cut off.
    ///
    /// # Errors
    /// I/O errors; a file that is not a ferry journal.
    pub fn open(path: &Path) -> std::io::Result<(Journal, Vec<Record>)> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let mut image = Vec::new();
        file.read_to_end(&mut image)?;
        if image.is_empty() {
            file.write_all(MAGIC)?;
            file.sync_data()?;
            image.extend_from_slice(MAGIC);
        }
        let Some((records, valid)) = parse(&image) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{} is not a ferry journal: move it away (the copy is kept; the next run re-verifies it)",
                    path.display()
                ),
            ));
        };
        if valid < image.len() {
            tracing::warn!(
                "{}: {} damaged bytes at the end (an interrupted write) cut off",
                path.display(),
                image.len() - valid
            );
            file.set_len(valid as u64)?;
            file.sync_data()?;
        }
        use std::io::Seek;
        file.seek(std::io::SeekFrom::Start(valid as u64))?;
        Ok((
            Journal {
                file,
                len: valid as u64,
                pending: BytesMut::new(),
            },
            records,
        ))
    }

    /// Queues a record; it is written by the next [`Journal::commit`].
    pub fn push(&mut self, rec: &Record) {
        rec.encode(&mut self.pending);
    }

    /// Whether records are queued.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Writes the queued records and makes them durable.
    ///
    /// # Errors
    /// I/O errors (then the records stay queued).
    pub fn commit(&mut self) -> std::io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.file.write_all(&self.pending) {
            // A partial write leaves a torn record that replay cuts off; start the next
            // attempt from the last good end.
            let _ = self.file.set_len(self.len);
            use std::io::Seek;
            let _ = self.file.seek(std::io::SeekFrom::Start(self.len));
            return Err(e);
        }
        // Written: the records are in the file whatever the sync says (writing them again
        // would duplicate them; cutting them later could cut durable ones).
        self.len += self.pending.len() as u64;
        self.pending.clear();
        self.file.sync_data()
    }

    /// Bytes in the journal file.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the journal holds no record.
    pub fn is_empty(&self) -> bool {
        self.len <= MAGIC.len() as u64
    }

    /// Replaces the journal at `path` by one holding exactly `records` (written to a
    /// temporary file, made durable, renamed over, directory synced) and returns it open.
    ///
    /// # Errors
    /// I/O errors; the old journal is then untouched.
    pub fn rewrite(path: &Path, records: &[Record]) -> std::io::Result<Journal> {
        let tmp = path.with_extension("tmp");
        let mut image = BytesMut::with_capacity(MAGIC.len() + records.len() * 48);
        image.put_slice(MAGIC);
        for r in records {
            r.encode(&mut image);
        }
        {
            let mut f = File::create(&tmp)?;
            f.write_all(&image)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        let (j, _) = Journal::open(path)?;
        Ok(j)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record> {
        vec![
            Record::Version {
                path: Bytes::from_static(b"a/b"),
                version: Version {
                    ino: 7,
                    size: 3 << 20,
                    mtime: Timestamp { sec: -5, nsec: 9 },
                    ctime: Timestamp { sec: 6, nsec: 10 },
                    btime: Timestamp::default(),
                },
                chunk_size: 1 << 20,
            },
            Record::Chunks {
                path: Bytes::from_static(b"a/b"),
                first: 1,
                count: 2,
            },
            Record::Verified {
                path: Bytes::from_static(b"a/b"),
                blake3: [3; 32],
            },
            Record::Stamp {
                path: Bytes::from_static(b"a/b"),
                stamp: Version {
                    ino: 9,
                    size: 3 << 20,
                    mtime: Timestamp { sec: 1, nsec: 2 },
                    ctime: Timestamp { sec: 3, nsec: 4 },
                    btime: Timestamp::default(),
                },
            },
            Record::Forget {
                path: Bytes::from_static(b""),
            },
        ]
    }

    #[test]
    fn records_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("journal");
        let (mut j, r) = Journal::open(&p).unwrap();
        assert!(r.is_empty());
        for rec in sample() {
            j.push(&rec);
        }
        j.commit().unwrap();
        drop(j);
        let (_, r) = Journal::open(&p).unwrap();
        assert_eq!(r, sample());
    }

    #[test]
    fn a_torn_tail_is_cut_and_appending_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("journal");
        let (mut j, _) = Journal::open(&p).unwrap();
        for rec in sample() {
            j.push(&rec);
        }
        j.commit().unwrap();
        drop(j);
        let full = std::fs::metadata(&p).unwrap().len();
        // Every cut inside the last record loses exactly that record.
        let n = sample().len() - 1;
        let last = {
            let mut b = BytesMut::new();
            sample()[n].encode(&mut b);
            b.len() as u64
        };
        for cut in 1..last {
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(full - cut).unwrap();
            drop(f);
            let (mut j, r) = Journal::open(&p).unwrap();
            assert_eq!(r, sample()[..n]);
            j.push(&sample()[n]);
            j.commit().unwrap();
        }
        let (_, r) = Journal::open(&p).unwrap();
        assert_eq!(r, sample());
    }

    #[test]
    fn a_flipped_byte_ends_the_replay_there() {
        let mut image = BytesMut::new();
        image.put_slice(MAGIC);
        for rec in sample() {
            rec.encode(&mut image);
        }
        let clean = parse(&image).unwrap().0;
        assert_eq!(clean, sample());
        let mut first_len = BytesMut::new();
        sample()[0].encode(&mut first_len);
        let mut bad = image.to_vec();
        bad[MAGIC.len() + first_len.len() + 14] ^= 0x40;
        let (r, valid) = parse(&bad).unwrap();
        assert_eq!(r, sample()[..1]);
        assert_eq!(valid, MAGIC.len() + first_len.len());
    }

    #[test]
    fn a_version_record_of_an_older_ferry_replays_with_ctime_zero() {
        let mut body = BytesMut::new();
        body.put_u8(1);
        body.put_u16(1);
        body.put_slice(b"f");
        body.put_u64(7);
        body.put_u64(5);
        body.put_i64(100);
        body.put_u32(9);
        body.put_u32(1 << 20);
        let mut image = BytesMut::new();
        image.put_slice(MAGIC);
        image.put_u32(body.len() as u32);
        image.put_u64(xxhash_rust::xxh3::xxh3_64(&body));
        image.put_slice(&body);
        let (r, _) = parse(&image).unwrap();
        assert_eq!(
            r,
            vec![Record::Version {
                path: Bytes::from_static(b"f"),
                version: Version {
                    ino: 7,
                    size: 5,
                    mtime: Timestamp { sec: 100, nsec: 9 },
                    ctime: Timestamp::default(),
                    btime: Timestamp::default(),
                },
                chunk_size: 1 << 20,
            }]
        );
    }

    #[test]
    fn not_a_journal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("journal");
        std::fs::write(&p, b"hello world, not a journal").unwrap();
        let err = Journal::open(&p).err().unwrap();
        assert!(err.to_string().contains("not a ferry journal"));
    }
}
