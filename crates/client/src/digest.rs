//! Whole-file digests a source can vouch for, so a local copy is checked against the
//! source's own account of the file: ferryd's BLAKE3 (or its sparse form), or what an S3
//! store keeps of an object — a full-object checksum (SHA-256, CRC64NVME, CRC32C, CRC32)
//! or the MD5 that a single-part upload's ETag is.
//!
//! [`Digester`] computes any of the streamable kinds over bytes as they come; the sparse
//! BLAKE3 needs the file itself (`ferry_util::sparse::hash_sparse`) and is computed there.

use md5::Digest as _;

/// Which digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestKind {
    /// BLAKE3-256 of all the bytes (ferryd).
    Blake3,
    /// ferryd's sparse hash (PROTOCOL.md §7.14).
    Blake3Sparse,
    /// MD5 (an S3 single-part ETag).
    Md5,
    /// SHA-256 (`x-amz-checksum-sha256`).
    Sha256,
    /// CRC-64/NVME (`x-amz-checksum-crc64nvme`), big-endian.
    Crc64Nvme,
    /// CRC-32C (`x-amz-checksum-crc32c`), big-endian.
    Crc32c,
    /// CRC-32 (`x-amz-checksum-crc32`), big-endian.
    Crc32,
}

/// A digest's kind and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    /// Which.
    pub kind: DigestKind,
    /// Its bytes (a CRC as big-endian bytes of its width).
    pub value: Vec<u8>,
}

impl Digest {
    /// The digest of `kind` of `data` ([`DigestKind::Blake3Sparse`]: of `data` as a file
    /// without holes, which is the plain BLAKE3's input form; see [`Digester::new`]).
    pub fn of(kind: DigestKind, data: &[u8]) -> Digest {
        let mut d = Digester::new(kind);
        d.update(data);
        d.finish()
    }

    /// A ferryd BLAKE3.
    pub fn blake3(value: [u8; 32], sparse: bool) -> Digest {
        Digest {
            kind: if sparse {
                DigestKind::Blake3Sparse
            } else {
                DigestKind::Blake3
            },
            value: value.to_vec(),
        }
    }
}

/// A source's digest of a whole file, with the version it is of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteDigest {
    /// The file's version the digest belongs to.
    pub version: ferry_proto::Version,
    /// `None`: the source has none to check a copy against (an S3 object uploaded in
    /// parts without a full-object checksum); the copy's BLAKE3 is recorded as it is.
    pub digest: Option<Digest>,
}

impl RemoteDigest {
    /// Whether a local copy with BLAKE3 `blake3` (of the same form: sparse when this is
    /// sparse) and `other` (its digest of this one's kind, when not a BLAKE3) is this file, as
    /// far as the source can tell: `true` when it has no digest (a copy just fetched, each
    /// piece checked against the version, is then taken as it is).
    pub fn matches(&self, blake3: &[u8; 32], other: Option<&Digest>) -> bool {
        match &self.digest {
            None => true,
            Some(d) if matches!(d.kind, DigestKind::Blake3 | DigestKind::Blake3Sparse) => {
                d.value == blake3
            }
            Some(d) => other == Some(d),
        }
    }

    /// As [`RemoteDigest::matches`], but only a digest can confirm: `false` when the source has
    /// none (a local file of unknown origin is then never taken for the source's).
    pub fn confirms(&self, blake3: &[u8; 32], other: Option<&Digest>) -> bool {
        self.digest.is_some() && self.matches(blake3, other)
    }

    /// The kind a local copy must be hashed with besides BLAKE3, if any.
    pub fn other_kind(&self) -> Option<DigestKind> {
        self.digest
            .as_ref()
            .map(|d| d.kind)
            .filter(|k| !matches!(k, DigestKind::Blake3 | DigestKind::Blake3Sparse))
    }
}

enum State {
    Blake3(Box<blake3::Hasher>),
    Md5(md5::Md5),
    Sha256(sha2::Sha256),
    Crc(crc_fast::Digest, usize),
}

/// A digest computed over bytes as they come.
pub struct Digester {
    kind: DigestKind,
    state: State,
}

impl std::fmt::Debug for Digester {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Digester")
            .field("kind", &self.kind)
            .finish()
    }
}

impl Digester {
    /// A digester of `kind`. [`DigestKind::Blake3Sparse`] streams as the plain BLAKE3
    /// (callers hash sparse files with `hash_sparse` instead).
    pub fn new(kind: DigestKind) -> Digester {
        use crc_fast::CrcAlgorithm as A;
        let state = match kind {
            DigestKind::Blake3 | DigestKind::Blake3Sparse => {
                State::Blake3(Box::new(blake3::Hasher::new()))
            }
            DigestKind::Md5 => State::Md5(md5::Md5::new()),
            DigestKind::Sha256 => State::Sha256(sha2::Sha256::new()),
            DigestKind::Crc64Nvme => State::Crc(crc_fast::Digest::new(A::Crc64Nvme), 8),
            DigestKind::Crc32c => State::Crc(crc_fast::Digest::new(A::Crc32Iscsi), 4),
            DigestKind::Crc32 => State::Crc(crc_fast::Digest::new(A::Crc32IsoHdlc), 4),
        };
        Digester { kind, state }
    }

    /// Adds bytes.
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.state {
            State::Blake3(h) => {
                h.update(data);
            }
            State::Md5(h) => h.update(data),
            State::Sha256(h) => h.update(data),
            State::Crc(h, _) => h.update(data),
        }
    }

    /// The digest of everything added.
    pub fn finish(self) -> Digest {
        let value = match self.state {
            State::Blake3(h) => h.finalize().as_bytes().to_vec(),
            State::Md5(h) => h.finalize().to_vec(),
            State::Sha256(h) => h.finalize().to_vec(),
            State::Crc(h, width) => h.finalize().to_be_bytes()[8 - width..].to_vec(),
        };
        Digest {
            kind: self.kind,
            value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: &Digest) -> String {
        d.value.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The check values of each algorithm's catalogue entry ("123456789").
    #[test]
    fn known_values() {
        let v = b"123456789";
        assert_eq!(hex(&Digest::of(DigestKind::Crc32, v)), "cbf43926");
        assert_eq!(hex(&Digest::of(DigestKind::Crc32c, v)), "e3069283");
        assert_eq!(
            hex(&Digest::of(DigestKind::Crc64Nvme, v)),
            "ae8b14860a799888"
        );
        assert_eq!(
            hex(&Digest::of(DigestKind::Md5, v)),
            "25f9e794323b453885f5181f1b624d0b"
        );
        assert_eq!(
            hex(&Digest::of(DigestKind::Sha256, v)),
            "15e2b0d3c33891ebb0f1ef609ec419420c20e320ce94c65fbc8c3312448eb225"
        );
        assert_eq!(
            Digest::of(DigestKind::Blake3, v).value,
            blake3::hash(v).as_bytes().to_vec()
        );
        // What a source's digest says of a copy.
        let blake = *blake3::hash(v).as_bytes();
        let crc = Digest::of(DigestKind::Crc32c, v);
        let version = ferry_proto::Version::default();
        let none = RemoteDigest {
            version,
            digest: None,
        };
        assert!(none.matches(&blake, None) && !none.confirms(&blake, None));
        let b3 = RemoteDigest {
            version,
            digest: Some(Digest::blake3(blake, false)),
        };
        assert!(b3.confirms(&blake, None) && !b3.matches(&[0; 32], None));
        assert_eq!(b3.other_kind(), None);
        let c = RemoteDigest {
            version,
            digest: Some(crc.clone()),
        };
        assert_eq!(c.other_kind(), Some(DigestKind::Crc32c));
        assert!(c.confirms(&[0; 32], Some(&crc)));
        assert!(!c.matches(&blake, Some(&Digest::of(DigestKind::Crc32c, b"other"))));
        assert!(!c.matches(&blake, None));
        // In pieces, the same.
        let mut d = Digester::new(DigestKind::Crc64Nvme);
        d.update(b"1234");
        d.update(b"56789");
        assert_eq!(d.finish(), Digest::of(DigestKind::Crc64Nvme, v));
    }
}
