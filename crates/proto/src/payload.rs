//! Read payloads. Each read response states how its data is encoded (raw or an lz4 block),
//! the decoded length, and the xxh3-64 checksum of the decoded bytes, so the receiver
//! detects corruption the TCP checksum missed and never returns wrong bytes.

use bytes::Bytes;

/// How a read payload's bytes are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// The bytes as read.
    Raw,
    /// One lz4 block (lz4_flex `block` format, no frame, no size prefix).
    Lz4,
}

impl Encoding {
    pub(crate) fn to_u8(self) -> u8 {
        match self {
            Encoding::Raw => 0,
            Encoding::Lz4 => 1,
        }
    }
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Encoding::Raw),
            1 => Some(Encoding::Lz4),
            _ => None,
        }
    }
}

/// A payload that failed to decode or verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// lz4 data was malformed or did not decode to the stated length.
    #[error("lz4 payload does not decode to {expected} bytes")]
    Lz4 {
        /// Decoded length stated by the sender.
        expected: u32,
    },
    /// A raw payload's length differs from the stated decoded length.
    #[error("raw payload is {actual} bytes, {expected} stated")]
    Length {
        /// Stated.
        expected: u32,
        /// Received.
        actual: usize,
    },
    /// The checksum of the decoded bytes does not match.
    #[error("checksum mismatch: got {actual:016x}, expected {expected:016x}")]
    Checksum {
        /// Stated by the sender.
        expected: u64,
        /// Computed here.
        actual: u64,
    },
}

/// The checksum carried with every read: xxh3-64 of the decoded bytes.
pub fn checksum(data: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(data)
}

/// Compression is kept only when it saves at least 1/16 of the bytes; otherwise the
/// receiver's decode time is not worth it.
pub fn worth_compressing(raw_len: usize, compressed_len: usize) -> bool {
    compressed_len + raw_len / 16 <= raw_len
}

thread_local! {
    /// Compression scratch space, one per thread: incompressible chunks then cost no
    /// allocation at all, and compressible ones only an allocation of their compressed size.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Size of each sample [`looks_compressible`] compresses.
const SAMPLE: usize = 8 << 10;

/// A cheap guess whether `raw` is worth compressing: three samples (start, middle, end)
/// are compressed, about 1/40 of the work for a 1 MiB chunk. Incompressible data (random,
/// already compressed or encrypted files) then costs almost nothing; data that is only
/// partly compressible is still compressed whole, and [`worth_compressing`] decides.
pub fn looks_compressible(raw: &[u8]) -> bool {
    if raw.len() < 4 * SAMPLE {
        return true;
    }
    let mut scratch = vec![0u8; lz4_flex::block::get_maximum_output_size(SAMPLE)];
    let mid = raw.len() / 2 - SAMPLE / 2;
    [0, mid, raw.len() - SAMPLE].iter().any(|&at| {
        lz4_flex::block::compress_into(&raw[at..at + SAMPLE], &mut scratch)
            .is_ok_and(|n| worth_compressing(SAMPLE, n))
    })
}

/// Encodes `raw` for the wire: lz4 when `allow_lz4` and it shrinks meaningfully, else raw.
/// Returns the encoding and the bytes to send.
pub fn encode(raw: Bytes, allow_lz4: bool) -> (Encoding, Bytes) {
    if !allow_lz4 || raw.len() < 512 || !looks_compressible(&raw) {
        return (Encoding::Raw, raw);
    }
    SCRATCH.with(|scratch| {
        let mut out = scratch.borrow_mut();
        let need = lz4_flex::block::get_maximum_output_size(raw.len());
        if out.len() < need {
            out.resize(need, 0);
        }
        match lz4_flex::block::compress_into(&raw, &mut out[..need]) {
            Ok(n) if worth_compressing(raw.len(), n) => {
                (Encoding::Lz4, Bytes::copy_from_slice(&out[..n]))
            }
            _ => (Encoding::Raw, raw),
        }
    })
}

/// Decodes and verifies a payload. Raw payloads are returned without copying.
pub fn decode(
    encoding: Encoding,
    decoded_len: u32,
    expected_checksum: u64,
    data: Bytes,
) -> Result<Bytes, PayloadError> {
    let out = match encoding {
        Encoding::Raw => {
            if data.len() != decoded_len as usize {
                return Err(PayloadError::Length {
                    expected: decoded_len,
                    actual: data.len(),
                });
            }
            data
        }
        Encoding::Lz4 => {
            // Into fresh capacity (no zeroing first); the checked decoder never writes
            // past `decoded_len`.
            match lz4_flex::block::decompress(&data, decoded_len as usize) {
                Ok(out) if out.len() == decoded_len as usize => Bytes::from(out),
                _ => {
                    return Err(PayloadError::Lz4 {
                        expected: decoded_len,
                    })
                }
            }
        }
    };
    let actual = checksum(&out);
    if actual != expected_checksum {
        return Err(PayloadError::Checksum {
            expected: expected_checksum,
            actual,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressible_goes_lz4_and_back() {
        let raw = Bytes::from(vec![7u8; 100_000]);
        let (enc, wire) = encode(raw.clone(), true);
        assert_eq!(enc, Encoding::Lz4);
        assert!(wire.len() < 1000);
        let back = decode(enc, raw.len() as u32, checksum(&raw), wire).unwrap();
        assert_eq!(back, raw);
    }

    #[test]
    fn incompressible_stays_raw() {
        let mut x = 0x1234_5678_u64;
        let raw: Vec<u8> = (0..65536)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let (enc, _) = encode(Bytes::from(raw), true);
        assert_eq!(enc, Encoding::Raw);
    }

    #[test]
    fn corruption_is_caught() {
        let raw = Bytes::from(vec![1u8; 4096]);
        let sum = checksum(&raw);
        let mut bad = raw.to_vec();
        bad[100] ^= 1;
        assert!(matches!(
            decode(Encoding::Raw, 4096, sum, Bytes::from(bad)),
            Err(PayloadError::Checksum { .. })
        ));
        assert!(matches!(
            decode(Encoding::Lz4, 4096, sum, Bytes::from_static(b"\xff\xff")),
            Err(PayloadError::Lz4 { .. })
        ));
    }
}
