//! Messages inside frames: checking a frame's API and version, reading its
//! body as the flatbuffer table the API calls for (verified first, so a
//! hostile body cannot make the reader go out of bounds), slicing record
//! batches out of its tail, and assembling frames to send.

use bytes::{Bytes, BytesMut};
use strand_wire::flatbuffers::{self, Follow, Verifiable, VerifierOptions};
use strand_wire::{Api, ErrorCode};

use crate::frame::{encode_head, Frame, FrameHeader};

/// Why a well-framed message cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("unknown API {0}")]
    UnknownApi(u16),
    #[error("{api} version {version} is not supported (this build speaks {min} to {max})")]
    UnsupportedVersion {
        api: &'static str,
        version: u16,
        min: u16,
        max: u16,
    },
    #[error("malformed {table} body: {reason}")]
    BadBody { table: &'static str, reason: String },
    #[error("tail slice at {offset} of {len} bytes runs past the {tail_len}-byte tail")]
    TailOverrun { offset: u32, len: u32, tail_len: usize },
}

impl MessageError {
    /// The wire error code to answer with.
    pub fn code(&self) -> ErrorCode {
        match self {
            MessageError::UnknownApi(_) => ErrorCode::UnsupportedApi,
            MessageError::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            MessageError::BadBody { .. } | MessageError::TailOverrun { .. } => ErrorCode::InvalidRequest,
        }
    }
}

/// The API a frame names, if this build speaks it in the frame's version.
pub fn check_api(header: &FrameHeader) -> Result<Api, MessageError> {
    let api = Api::from_u16(header.api).ok_or(MessageError::UnknownApi(header.api))?;
    if !api.supports(header.version) {
        let (min, max) = api.versions();
        return Err(MessageError::UnsupportedVersion {
            api: api.name(),
            version: header.version,
            min,
            max,
        });
    }
    Ok(api)
}

/// Bounds for verifying bodies: generous for real messages (thousands of
/// partitions), small enough that a hostile body costs little to reject.
pub fn verifier_options() -> VerifierOptions {
    VerifierOptions {
        max_depth: 32,
        max_tables: 1 << 20,
        max_apparent_size: 1 << 28,
        ignore_missing_null_terminator: false,
    }
}

/// The frame's body read as table `T`, after verifying it.
pub fn body<'a, T>(frame: &'a Frame) -> Result<T::Inner, MessageError>
where
    T: Follow<'a> + Verifiable + 'a,
{
    read_body::<T>(&frame.body)
}

/// A flatbuffer body read as table `T`, after verifying it.
pub fn read_body<'a, T>(body: &'a [u8]) -> Result<T::Inner, MessageError>
where
    T: Follow<'a> + Verifiable + 'a,
{
    flatbuffers::root_with_opts::<T>(&verifier_options(), body).map_err(|e| MessageError::BadBody {
        table: short_type_name::<T>(),
        reason: e.to_string(),
    })
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    let no_generics = full.split('<').next().unwrap_or(full);
    no_generics.rsplit("::").next().unwrap_or(no_generics)
}

/// Bytes `[offset, offset + len)` of the frame's tail, sharing its buffer.
pub fn tail_slice(frame: &Frame, offset: u32, len: u32) -> Result<Bytes, MessageError> {
    let (start, end) = (offset as usize, offset as usize + len as usize);
    if end > frame.tail.len() {
        return Err(MessageError::TailOverrun {
            offset,
            len,
            tail_len: frame.tail.len(),
        });
    }
    Ok(frame.tail.slice(start..end))
}

/// Splits `(offset, length)` pieces off a frame's mutable tail, each
/// uniquely owned (no copy). Pieces must come in tail order and must not
/// overlap; gaps are skipped.
pub fn split_tail(mut tail: BytesMut, pieces: &[(u32, u32)]) -> Result<Vec<BytesMut>, MessageError> {
    let total = tail.len();
    let mut at = 0usize;
    let mut out = Vec::with_capacity(pieces.len());
    for &(offset, len) in pieces {
        let (start, end) = (offset as usize, offset as usize + len as usize);
        if start < at || end > total {
            return Err(MessageError::TailOverrun {
                offset,
                len,
                tail_len: total,
            });
        }
        let _gap = tail.split_to(start - at);
        out.push(tail.split_to(len as usize));
        at = end;
    }
    Ok(out)
}

/// Gathers the pieces of a frame's tail and tells where each one lands.
#[derive(Debug, Default, Clone)]
pub struct TailBuilder {
    pieces: Vec<Bytes>,
    len: usize,
}

impl TailBuilder {
    /// Adds a piece; returns its (offset, length) in the tail.
    pub fn push(&mut self, piece: Bytes) -> (u32, u32) {
        let at = (self.len as u32, piece.len() as u32);
        self.len += piece.len();
        self.pieces.push(piece);
        at
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn into_pieces(self) -> Vec<Bytes> {
        self.pieces
    }
}

/// A frame ready to send: the head (length, fixed fields, body) and the
/// tail pieces, for one vectored write — record batches are never copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutFrame {
    pub head: Bytes,
    pub tail: Vec<Bytes>,
}

impl OutFrame {
    /// Appends its bytes on the wire to `out` (to send several frames in
    /// one write).
    pub fn copy_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.head);
        for piece in &self.tail {
            out.extend_from_slice(piece);
        }
    }

    /// Frames a finished flatbuffer `body` with a tail.
    pub fn new(header: FrameHeader, body: &[u8], tail: TailBuilder) -> OutFrame {
        let mut head = BytesMut::new();
        encode_head(&mut head, header, body, tail.len());
        OutFrame {
            head: head.freeze(),
            tail: tail.into_pieces(),
        }
    }

    /// A request of `api` with `correlation_id` (every API is at version 0).
    pub fn request(api: Api, correlation_id: u32, body: &[u8], tail: TailBuilder) -> OutFrame {
        let header = FrameHeader {
            api: api as u16,
            version: 0,
            correlation_id,
        };
        OutFrame::new(header, body, tail)
    }

    /// Bytes on the wire.
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.iter().map(Bytes::len).sum::<usize>()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole frame in one buffer (a copy; for tests and small frames).
    pub fn to_bytes(&self) -> Bytes {
        let mut out = Vec::with_capacity(self.len());
        self.copy_into(&mut out);
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode, FrameLimits};
    use strand_wire::flatbuffers::FlatBufferBuilder;
    use strand_wire::*;

    fn produce_frame(batches: &[&'static [u8]]) -> OutFrame {
        let mut fbb = FlatBufferBuilder::new();
        let mut tail = TailBuilder::default();
        let parts: Vec<_> = batches
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let (records_offset, records_len) = tail.push(Bytes::from_static(b));
                ProducePartition::create(
                    &mut fbb,
                    &ProducePartitionArgs {
                        partition: i as u32,
                        records_offset,
                        records_len,
                    },
                )
            })
            .collect();
        let parts = fbb.create_vector(&parts);
        let name = fbb.create_string("orders");
        let queue = ProduceQueue::create(
            &mut fbb,
            &ProduceQueueArgs {
                name: Some(name),
                partitions: Some(parts),
            },
        );
        let queues = fbb.create_vector(&[queue]);
        let req = ProduceRequest::create(
            &mut fbb,
            &ProduceRequestArgs {
                acks: 1,
                timeout_ms: 1000,
                queues: Some(queues),
            },
        );
        fbb.finish_minimal(req);
        let header = FrameHeader {
            api: Api::Produce as u16,
            version: 0,
            correlation_id: 77,
        };
        OutFrame::new(header, fbb.finished_data(), tail)
    }

    #[test]
    fn produce_round_trip_slices_batches_out_of_the_tail() {
        let out = produce_frame(&[b"first batch", b"second"]);
        let mut buf = BytesMut::from(&out.to_bytes()[..]);
        let frame = decode(&mut buf, FrameLimits::default()).unwrap().unwrap();
        assert_eq!(check_api(&frame.header), Ok(Api::Produce));
        let req = body::<ProduceRequest>(&frame).unwrap();
        assert_eq!((req.acks(), req.timeout_ms()), (1, 1000));
        let queue = req.queues().unwrap().get(0);
        assert_eq!(queue.name(), Some("orders"));
        let parts = queue.partitions().unwrap();
        let got: Vec<Bytes> = parts
            .iter()
            .map(|p| tail_slice(&frame, p.records_offset(), p.records_len()).unwrap())
            .collect();
        assert_eq!(
            got,
            vec![Bytes::from_static(b"first batch"), Bytes::from_static(b"second")]
        );
        // The slices share the frame's buffer: no copy.
        let tail_range = frame.tail.as_ptr() as usize..frame.tail.as_ptr() as usize + frame.tail.len();
        assert!(tail_range.contains(&(got[1].as_ptr() as usize)));
        assert!(matches!(
            tail_slice(&frame, 5, 100),
            Err(MessageError::TailOverrun { .. })
        ));
    }

    #[test]
    fn tails_split_in_order_without_copies() {
        let tail = BytesMut::from(&b"aaabbbbcc"[..]);
        let base = tail.as_ptr() as usize;
        let parts = split_tail(tail.clone(), &[(0, 3), (3, 4), (7, 2)]).unwrap();
        assert_eq!(
            parts.iter().map(|p| &p[..]).collect::<Vec<_>>(),
            vec![&b"aaa"[..], b"bbbb", b"cc"]
        );
        let parts = split_tail(tail.clone(), &[(3, 4)]).unwrap();
        assert_eq!(&parts[0][..], b"bbbb");
        let _ = base;
        assert!(split_tail(tail.clone(), &[(3, 4), (0, 3)]).is_err(), "out of order");
        assert!(split_tail(tail.clone(), &[(0, 4), (3, 2)]).is_err(), "overlapping");
        assert!(split_tail(tail, &[(8, 2)]).is_err(), "past the end");
    }

    #[test]
    fn bad_bodies_versions_and_apis_are_typed_errors() {
        let out = produce_frame(&[b"x"]);
        let mut buf = BytesMut::from(&out.to_bytes()[..]);
        let mut frame = decode(&mut buf, FrameLimits::default()).unwrap().unwrap();
        frame.body = Bytes::from_static(&[0xff; 24]);
        let err = body::<ProduceRequest>(&frame).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidRequest);
        assert!(err.to_string().contains("ProduceRequest"), "{err}");

        let v9 = FrameHeader {
            api: Api::Fetch as u16,
            version: 9,
            correlation_id: 1,
        };
        assert_eq!(check_api(&v9).unwrap_err().code(), ErrorCode::UnsupportedVersion);
        let unknown = FrameHeader {
            api: 999,
            version: 0,
            correlation_id: 1,
        };
        assert_eq!(check_api(&unknown).unwrap_err().code(), ErrorCode::UnsupportedApi);
    }

    #[test]
    fn every_truncation_of_a_body_is_rejected_or_consistent() {
        let out = produce_frame(&[b"abc", b"defg"]);
        let mut buf = BytesMut::from(&out.to_bytes()[..]);
        let frame = decode(&mut buf, FrameLimits::default()).unwrap().unwrap();
        for cut in 0..frame.body.len() {
            let mut short = frame.clone();
            short.body = frame.body.slice(..cut);
            // Must not panic; a truncated body is almost always rejected.
            if let Ok(req) = body::<ProduceRequest>(&short) {
                let _ = req.queues().map(|q| q.len());
            }
        }
    }
}
