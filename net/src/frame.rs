//! Frames: how one message is delimited on the stream.
//!
//! # Layout (integers little-endian)
//!
//! ```text
//! offset size field
//!      0    4 frame_len       bytes after this field: 12 + body_len + tail length
//!      4    2 api             the API (strand_wire::Api), the same in request and response
//!      6    2 version         the API version the request is written in; the response echoes it
//!      8    4 correlation_id  chosen by the client, echoed by the response
//!     12    4 body_len        bytes of the flatbuffer body
//!     16    … body            flatbuffer: the API's request or response table
//!      …    … tail            raw bytes (record batches) that the body refers
//!                             to by (offset, length) from the tail's start
//! ```
//!
//! DESIGN.md's frame has no `body_len`; without it the reader cannot tell
//! where a flatbuffer ends and the tail starts, so it is here, right before
//! the body.
//!
//! A frame longer than [`FrameLimits::max_frame_bytes`], shorter than its
//! fixed fields, or whose body runs past its end is malformed: the decoder
//! returns a [`FrameError`] and the connection must be closed (the stream
//! can no longer be trusted to be in step).

use bytes::{Buf, Bytes, BytesMut};

/// Bytes before the body: the length field plus the fixed fields.
pub const HEADER_LEN: usize = 16;
/// `frame_len` of a frame with an empty body and no tail.
const FIXED_AFTER_LEN: u32 = 12;

/// The fixed fields of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub api: u16,
    pub version: u16,
    pub correlation_id: u32,
}

/// Limits a decoder enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// Largest frame accepted, the length field included.
    pub max_frame_bytes: u32,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            max_frame_bytes: 16 << 20,
        }
    }
}

/// A decoded frame. `body` and `tail` share the received buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub header: FrameHeader,
    pub body: Bytes,
    pub tail: Bytes,
}

/// Why a stream's next frame is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes is over the limit of {max}")]
    TooLarge { len: u64, max: u32 },
    #[error("frame length {0} is shorter than the {FIXED_AFTER_LEN} bytes of fixed fields")]
    TooShort(u32),
    #[error("body of {body_len} bytes runs past the frame's {frame_len} bytes")]
    BodyOverrun { body_len: u32, frame_len: u32 },
}

/// Takes the next whole frame off the front of `buf`, if one is there.
/// Returns `Ok(None)` when more bytes are needed (a reader may use
/// [`needed`] to size its next read), and an error when the frame is
/// malformed. The frame's bytes are split off `buf` without copying.
pub fn decode(buf: &mut BytesMut, limits: FrameLimits) -> Result<Option<Frame>, FrameError> {
    Ok(decode_mut(buf, limits)?.map(|f| Frame {
        header: f.header,
        body: f.body,
        tail: f.tail.freeze(),
    }))
}

/// A decoded frame whose tail stays mutable and uniquely owned, so the
/// record batches in it can be split off and stamped in place by the
/// broker without a copy.
#[derive(Debug)]
pub struct FrameMut {
    pub header: FrameHeader,
    pub body: Bytes,
    pub tail: BytesMut,
}

/// [`decode`], keeping the tail as `BytesMut`.
pub fn decode_mut(buf: &mut BytesMut, limits: FrameLimits) -> Result<Option<FrameMut>, FrameError> {
    let Some(total) = check(buf, limits)? else {
        return Ok(None);
    };
    if buf.len() < total {
        return Ok(None);
    }
    let mut frame = buf.split_to(total);
    let header = peek_header(&frame).expect("check() saw the fixed fields");
    frame.advance(12);
    let body_len = frame.get_u32_le() as usize;
    let body = frame.split_to(body_len).freeze();
    Ok(Some(FrameMut {
        header,
        body,
        tail: frame,
    }))
}

/// Bytes the next frame needs in all (length field included), once its
/// fixed fields are in `buf`; checks them.
fn check(buf: &[u8], limits: FrameLimits) -> Result<Option<usize>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let frame_len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let total = u64::from(frame_len) + 4;
    if total > u64::from(limits.max_frame_bytes) {
        return Err(FrameError::TooLarge {
            len: total,
            max: limits.max_frame_bytes,
        });
    }
    if frame_len < FIXED_AFTER_LEN {
        return Err(FrameError::TooShort(frame_len));
    }
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let body_len = u32::from_le_bytes([buf[12], buf[13], buf[14], buf[15]]);
    if u64::from(body_len) > u64::from(frame_len - FIXED_AFTER_LEN) {
        return Err(FrameError::BodyOverrun { body_len, frame_len });
    }
    Ok(Some(total as usize))
}

/// The fixed fields of the frame at the start of `buf`, if they arrived,
/// whether or not the frame is valid (to answer a malformed frame with an
/// error that names its correlation id).
pub fn peek_header(buf: &[u8]) -> Option<FrameHeader> {
    (buf.len() >= 12).then(|| FrameHeader {
        api: u16::from_le_bytes([buf[4], buf[5]]),
        version: u16::from_le_bytes([buf[6], buf[7]]),
        correlation_id: u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]),
    })
}

/// How many bytes `buf` must hold before [`decode`] can return the next
/// frame (at least the length field); errors as [`decode`] does.
pub fn needed(buf: &[u8], limits: FrameLimits) -> Result<usize, FrameError> {
    Ok(check(buf, limits)?.unwrap_or(if buf.len() < 4 { 4 } else { HEADER_LEN }))
}

/// Writes a frame's length field, fixed fields and body to `out`; the
/// caller sends `tail_len` bytes of tail right after (from its own buffers,
/// so record batches are never copied into the frame). Panics if the frame
/// would be over 4 GiB (callers bound messages far below).
pub fn encode_head(out: &mut BytesMut, header: FrameHeader, body: &[u8], tail_len: usize) {
    let frame_len = u64::from(FIXED_AFTER_LEN) + body.len() as u64 + tail_len as u64;
    let frame_len = u32::try_from(frame_len).expect("frames are < 4 GiB");
    out.reserve(HEADER_LEN + body.len());
    out.extend_from_slice(&frame_len.to_le_bytes());
    out.extend_from_slice(&header.api.to_le_bytes());
    out.extend_from_slice(&header.version.to_le_bytes());
    out.extend_from_slice(&header.correlation_id.to_le_bytes());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame_bytes(header: FrameHeader, body: &[u8], tail: &[u8]) -> BytesMut {
        let mut out = BytesMut::new();
        encode_head(&mut out, header, body, tail.len());
        out.extend_from_slice(tail);
        out
    }

    proptest! {
        #[test]
        fn frames_round_trip_through_any_chunking(
            frames in proptest::collection::vec(
                (any::<u16>(), any::<u16>(), any::<u32>(),
                 proptest::collection::vec(any::<u8>(), 0..300),
                 proptest::collection::vec(any::<u8>(), 0..300)),
                1..6),
            chunk in 1usize..64,
        ) {
            let mut stream = BytesMut::new();
            for (api, version, correlation_id, body, tail) in &frames {
                let h = FrameHeader { api: *api, version: *version, correlation_id: *correlation_id };
                stream.extend_from_slice(&frame_bytes(h, body, tail));
            }
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some(f) = decode(&mut buf, FrameLimits::default()).unwrap() {
                    got.push(f);
                }
                prop_assert!(needed(&buf, FrameLimits::default()).unwrap() > buf.len() || buf.is_empty());
            }
            prop_assert!(buf.is_empty());
            prop_assert_eq!(got.len(), frames.len());
            for (f, (api, version, correlation_id, body, tail)) in got.iter().zip(&frames) {
                prop_assert_eq!(f.header, FrameHeader { api: *api, version: *version, correlation_id: *correlation_id });
                prop_assert_eq!(&f.body[..], &body[..]);
                prop_assert_eq!(&f.tail[..], &tail[..]);
            }
        }

        #[test]
        fn arbitrary_streams_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut buf = BytesMut::from(&data[..]);
            let limits = FrameLimits { max_frame_bytes: 128 };
            while let Ok(Some(f)) = decode(&mut buf, limits) {
                prop_assert!(f.body.len() + f.tail.len() + HEADER_LEN <= 128);
            }
        }
    }

    #[test]
    fn malformed_frames_are_typed_errors() {
        let limits = FrameLimits { max_frame_bytes: 1024 };
        let mut too_large = BytesMut::from(&2000u32.to_le_bytes()[..]);
        assert_eq!(
            decode(&mut too_large, limits),
            Err(FrameError::TooLarge { len: 2004, max: 1024 })
        );
        let mut too_short = BytesMut::from(&5u32.to_le_bytes()[..]);
        assert_eq!(decode(&mut too_short, limits), Err(FrameError::TooShort(5)));
        let h = FrameHeader {
            api: 1,
            version: 0,
            correlation_id: 9,
        };
        let mut overrun = frame_bytes(h, b"body", b"");
        overrun[12..16].copy_from_slice(&100u32.to_le_bytes());
        assert!(matches!(
            decode(&mut overrun, limits),
            Err(FrameError::BodyOverrun { .. })
        ));
        // A partial frame is not an error: more bytes are needed.
        let whole = frame_bytes(h, b"body", b"tail");
        let mut partial = BytesMut::from(&whole[..whole.len() - 1]);
        assert_eq!(decode(&mut partial, limits), Ok(None));
        assert_eq!(needed(&partial, limits), Ok(whole.len()));
    }
}
