//! Framing: `u32 length | u8 kind | u32 request id | body`, big-endian, where `length`
//! counts everything after itself (so it is at least 5).
//!
//! [`Frame::check`] looks at buffered bytes and answers "complete frame of n bytes", "need
//! at least n more bytes" or "invalid" without allocating: a header announcing more than the
//! negotiated maximum is an error before a single byte of body is buffered.
//! [`Frame::parse`] then splits a complete frame off the buffer.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Bytes of header before the body: length (4), kind (1), request id (4).
pub const FRAME_HEADER_LEN: usize = 9;

/// One decoded frame; the body is a zero-copy slice of the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Message kind (see [`crate::message`]).
    pub kind: u8,
    /// Request id chosen by the client; responses echo it. 0 during the handshake.
    pub request_id: u32,
    /// The message body.
    pub body: Bytes,
}

/// A frame that can never become valid by reading more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The length field is smaller than the fixed header.
    #[error("frame length {0} is shorter than the frame header")]
    TooShort(u32),
    /// The length field is larger than the negotiated maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Announced length.
        len: u32,
        /// Negotiated maximum.
        max: u32,
    },
}

/// What [`Frame::check`] found at the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameCheck {
    /// A complete frame of this many bytes (length field included) is buffered.
    Complete(usize),
    /// Not yet: at least `needed` more bytes must be read. Once the length field is
    /// buffered, `needed` is exact, so `buffered + needed` is the whole frame's size;
    /// before that it only completes the length field.
    Incomplete {
        /// Bytes still missing.
        needed: usize,
    },
}

impl Frame {
    /// Checks the front of `buf` against the frame limit `max_len` (largest length field
    /// accepted).
    ///
    /// # Errors
    /// The length field is invalid: reading more can never make this a frame.
    pub fn check(buf: &[u8], max_len: u32) -> Result<FrameCheck, FrameError> {
        if buf.len() < 4 {
            return Ok(FrameCheck::Incomplete {
                needed: 4 - buf.len(),
            });
        }
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if len < (FRAME_HEADER_LEN - 4) as u32 {
            return Err(FrameError::TooShort(len));
        }
        if len > max_len {
            return Err(FrameError::TooLarge { len, max: max_len });
        }
        let total = 4 + len as usize;
        Ok(match total.checked_sub(buf.len()) {
            Some(needed) if needed > 0 => FrameCheck::Incomplete { needed },
            _ => FrameCheck::Complete(total),
        })
    }

    /// Splits one complete frame off the front of `buf`, if there is one.
    ///
    /// # Errors
    /// As [`Frame::check`].
    pub fn parse(buf: &mut BytesMut, max_len: u32) -> Result<Option<Frame>, FrameError> {
        let FrameCheck::Complete(total) = Frame::check(buf, max_len)? else {
            return Ok(None);
        };
        let mut bytes = buf.split_to(total).freeze();
        bytes.advance(4);
        let kind = bytes.get_u8();
        let request_id = bytes.get_u32();
        Ok(Some(Frame {
            kind,
            request_id,
            body: bytes,
        }))
    }

    /// Writes a frame header for a body of `body_len` bytes.
    pub fn put_header(dst: &mut impl BufMut, kind: u8, request_id: u32, body_len: usize) {
        dst.put_u32((body_len + FRAME_HEADER_LEN - 4) as u32);
        dst.put_u8(kind);
        dst.put_u32(request_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_then_complete() {
        let mut b = BytesMut::new();
        Frame::put_header(&mut b, 7, 42, 3);
        b.put_slice(b"ab");
        assert_eq!(
            Frame::check(&b, 1024),
            Ok(FrameCheck::Incomplete { needed: 1 })
        );
        assert_eq!(Frame::parse(&mut b, 1024), Ok(None));
        b.put_slice(b"c");
        let f = Frame::parse(&mut b, 1024).unwrap().unwrap();
        assert_eq!((f.kind, f.request_id, &f.body[..]), (7, 42, &b"abc"[..]));
        assert!(b.is_empty());
    }

    #[test]
    fn needed_completes_the_length_field_then_the_frame() {
        assert_eq!(
            Frame::check(&[0, 0], 1024),
            Ok(FrameCheck::Incomplete { needed: 2 })
        );
        assert_eq!(
            Frame::check(&[0, 0, 0, 5, 1], 1024),
            Ok(FrameCheck::Incomplete { needed: 4 })
        );
        assert_eq!(
            Frame::check(&[0, 0, 0, 5, 1, 0, 0, 0, 0, 9], 1024),
            Ok(FrameCheck::Complete(9))
        );
    }

    #[test]
    fn huge_length_is_an_error_not_an_allocation() {
        let mut b = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 1][..]);
        assert_eq!(
            Frame::parse(&mut b, 1 << 20),
            Err(FrameError::TooLarge {
                len: u32::MAX,
                max: 1 << 20
            })
        );
        let mut b = BytesMut::from(&[0, 0, 0, 1, 1][..]);
        assert_eq!(Frame::parse(&mut b, 1 << 20), Err(FrameError::TooShort(1)));
    }
}
