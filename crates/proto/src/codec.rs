//! Primitive field encoding shared by all messages: big-endian integers and
//! `u16`-length-prefixed byte strings. Decoding never panics and never allocates more
//! than the bytes actually present.

use bytes::{Buf, BufMut, Bytes};

/// Why a frame body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The body ended before a field was complete.
    #[error("message truncated while reading {0}")]
    Truncated(&'static str),
    /// A field held a value this version does not define.
    #[error("invalid value for {field}: {value}")]
    InvalidValue {
        /// Which field.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// Bytes were left after the last field of a message that has no trailing data.
    #[error("{0} trailing bytes after message")]
    TrailingBytes(usize),
    /// The frame kind byte names no message this version knows.
    #[error("unknown message kind 0x{0:02x}")]
    UnknownKind(u8),
}

pub(crate) fn need(buf: &Bytes, n: usize, what: &'static str) -> Result<(), DecodeError> {
    if buf.remaining() < n {
        Err(DecodeError::Truncated(what))
    } else {
        Ok(())
    }
}

pub(crate) fn get_u8(buf: &mut Bytes, what: &'static str) -> Result<u8, DecodeError> {
    need(buf, 1, what)?;
    Ok(buf.get_u8())
}

pub(crate) fn get_u16(buf: &mut Bytes, what: &'static str) -> Result<u16, DecodeError> {
    need(buf, 2, what)?;
    Ok(buf.get_u16())
}

pub(crate) fn get_u32(buf: &mut Bytes, what: &'static str) -> Result<u32, DecodeError> {
    need(buf, 4, what)?;
    Ok(buf.get_u32())
}

pub(crate) fn get_u64(buf: &mut Bytes, what: &'static str) -> Result<u64, DecodeError> {
    need(buf, 8, what)?;
    Ok(buf.get_u64())
}

pub(crate) fn get_i64(buf: &mut Bytes, what: &'static str) -> Result<i64, DecodeError> {
    need(buf, 8, what)?;
    Ok(buf.get_i64())
}

pub(crate) fn get_array<const N: usize>(
    buf: &mut Bytes,
    what: &'static str,
) -> Result<[u8; N], DecodeError> {
    need(buf, N, what)?;
    let mut out = [0u8; N];
    buf.copy_to_slice(&mut out);
    Ok(out)
}

/// A `u16` length then that many bytes (zero-copy slice of the frame).
pub(crate) fn get_bytes16(buf: &mut Bytes, what: &'static str) -> Result<Bytes, DecodeError> {
    let len = get_u16(buf, what)? as usize;
    need(buf, len, what)?;
    Ok(buf.split_to(len))
}

pub(crate) fn get_string16(buf: &mut Bytes, what: &'static str) -> Result<String, DecodeError> {
    let raw = get_bytes16(buf, what)?;
    // Diagnostic strings only: invalid UTF-8 is replaced rather than rejected.
    Ok(String::from_utf8_lossy(&raw).into_owned())
}

/// Writes a `u16` length and the bytes, truncating at `u16::MAX` (callers validate lengths
/// of anything semantically meaningful before encoding).
pub(crate) fn put_bytes16(dst: &mut impl BufMut, bytes: &[u8]) {
    let len = bytes.len().min(u16::MAX as usize);
    dst.put_u16(len as u16);
    dst.put_slice(&bytes[..len]);
}

pub(crate) fn expect_end(buf: &Bytes) -> Result<(), DecodeError> {
    if buf.has_remaining() {
        Err(DecodeError::TrailingBytes(buf.remaining()))
    } else {
        Ok(())
    }
}
