//! The entry points of the fuzz targets (`net/fuzz/`), also run under
//! proptest in CI. [`sasl_exchange`]: arbitrary SCRAM messages to both
//! sides of an exchange; nothing may panic and nothing unproven may log in.
//! [`frame_decode`]: a stream of arbitrary bytes is cut into frames
//! and every frame's body is read as every request table (and the
//! controller's response, which travels between brokers; and the whole
//! input as a `__groups` record value). Nothing may
//! panic, and what decodes must be self-consistent.

use bytes::BytesMut;
use strand_wire::*;

use crate::frame::{decode, FrameLimits, HEADER_LEN};
use crate::message::{body, check_api, tail_slice};

pub fn frame_decode(data: &[u8]) {
    let mut buf = BytesMut::from(data);
    let limits = FrameLimits {
        max_frame_bytes: 1 << 16,
    };
    while let Ok(Some(frame)) = decode(&mut buf, limits) {
        assert!(HEADER_LEN + frame.body.len() + frame.tail.len() <= 1 << 16);
        let _ = check_api(&frame.header);
        if let Ok(req) = body::<ProduceRequest>(&frame) {
            for q in req.queues().iter().flatten() {
                for p in q.partitions().iter().flatten() {
                    if let Ok(slice) = tail_slice(&frame, p.records_offset(), p.records_len()) {
                        assert_eq!(slice.len(), p.records_len() as usize);
                    }
                }
            }
        }
        let _ = body::<FetchRequest>(&frame).map(|r| r.queues().map(|q| q.len()));
        let _ = body::<MetadataRequest>(&frame).map(|r| r.queues().map(|q| q.iter().count()));
        let _ = body::<CreateQueueRequest>(&frame).map(|r| r.config().map(|c| c.retention_ms()));
        let _ = body::<AlterQueueRequest>(&frame).map(|r| r.partitions());
        let _ = body::<ListOffsetsRequest>(&frame).map(|r| r.queues().map(|q| q.len()));
        let _ = body::<ApiVersionsRequest>(&frame).map(|r| r.client_name().map(str::len));
        let _ = body::<JoinGroupRequest>(&frame).map(|r| r.queues().map(|q| q.iter().count()));
        let _ = body::<HeartbeatRequest>(&frame).map(|r| count_partitions(r.owned()));
        let _ = body::<CommitOffsetsRequest>(&frame).map(|r| {
            r.queues()
                .map(|q| q.iter().map(|q| q.partitions().map_or(0, |p| p.len())).sum::<usize>())
        });
        let _ = body::<FetchOffsetsRequest>(&frame).map(|r| count_partitions(r.queues()));
        let _ = body::<ResetGroupRequest>(&frame).map(|r| r.partitions().map(|p| p.len()));
        let _ = body::<DescribeGroupRequest>(&frame).map(|r| r.group().map(str::len));
        let _ = body::<ReceiveRequest>(&frame).map(|r| (r.max_records(), r.lock_ms()));
        let _ = body::<ControllerRequest>(&frame).map(|r| (r.op(), r.from(), r.payload().map(|p| p.len())));
        let _ = body::<ControllerResponse>(&frame).map(|r| (r.leader(), r.payload().map(|p| p.len())));
        let _ = body::<SettleRequest>(&frame).map(|r| {
            r.records()
                .map(|rs| rs.iter().map(|x| x.reason().map_or(0, str::len)).sum::<usize>())
        });
    }
    // The records of `__groups` (a GroupRecord per record value).
    let _ = flatbuffers::root::<GroupRecord>(data).map(|r| (r.kind(), r.queue().map(str::len)));
}

fn count_partitions(list: Option<flatbuffers::Vector<'_, flatbuffers::ForwardsUOffset<QueuePartitions<'_>>>>) -> usize {
    list.iter()
        .flatten()
        .map(|q| q.partitions().map_or(0, |p| p.len()) + q.queue().map_or(0, str::len))
        .sum()
}

/// Both sides of a SCRAM exchange fed arbitrary messages: `data`'s first
/// byte picks the mechanism, the rest is cut at `0xff` bytes into a
/// client-first and a client-final for the server, and a server-first and
/// a server-final for a client. Only the known user with the right proof
/// may log in (never, here: the proof would have to be guessed).
pub fn sasl_exchange(data: &[u8]) {
    use crate::scram::{ClientExchange, Credential, Mechanism, ServerExchange, MIN_ITERATIONS};
    use std::sync::OnceLock;
    static CREDENTIALS: OnceLock<[Credential; 2]> = OnceLock::new();
    let credentials = CREDENTIALS.get_or_init(|| {
        Mechanism::ALL.map(|m| Credential::derive(m, b"pencil", b"salt", MIN_ITERATIONS).expect("valid"))
    });
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let mechanism = Mechanism::ALL[usize::from(pick & 1)];
    let mut pieces = rest.split(|b| *b == 0xff);
    let (a, b, c, d) = (pieces.next(), pieces.next(), pieces.next(), pieces.next());
    let lookup = |user: &str| (user == "user").then(|| credentials[usize::from(pick & 1)].clone());
    if let Ok((server, _first)) = ServerExchange::start(mechanism, a.unwrap_or_default(), lookup, b"decoy") {
        assert!(
            server.finish(b.unwrap_or_default()).is_err(),
            "a made-up proof logged in"
        );
    }
    // A client with few iterations' worth of work: only servers that ask
    // for at least MIN_ITERATIONS get past the first step.
    let (mut client, _first) = ClientExchange::with_nonce(mechanism, "user", b"pencil", "n".into());
    if client.final_message(c.unwrap_or_default()).is_ok() {
        assert!(
            client.verify(d.unwrap_or_default()).is_err(),
            "a made-up signature passed"
        );
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_streams(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            super::frame_decode(&data);
        }

        #[test]
        fn plausible_frames(api in 0u16..20, body in proptest::collection::vec(any::<u8>(), 0..256), tail in 0usize..64) {
            let mut data = Vec::new();
            data.extend_from_slice(&((12 + body.len() + tail) as u32).to_le_bytes());
            data.extend_from_slice(&api.to_le_bytes());
            data.extend_from_slice(&0u16.to_le_bytes());
            data.extend_from_slice(&1u32.to_le_bytes());
            data.extend_from_slice(&(body.len() as u32).to_le_bytes());
            data.extend_from_slice(&body);
            data.resize(data.len() + tail, 7);
            super::frame_decode(&data);
        }
    }

    // Each case derives a key (4,096 PBKDF2 rounds): fewer cases.
    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn arbitrary_sasl_messages(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            super::sasl_exchange(&data);
        }

        #[test]
        fn plausible_sasl_messages(user in "[a-z=,]{0,6}", nonce in "[!-~]{0,8}", proof in "[A-Za-z0-9+/=]{0,48}") {
            let mut data = vec![0];
            data.extend_from_slice(format!("n,,n={user},r={nonce}").as_bytes());
            data.push(0xff);
            data.extend_from_slice(format!("c=biws,r={nonce},p={proof}").as_bytes());
            data.push(0xff);
            data.extend_from_slice(format!("r=n{nonce},s=c2FsdA==,i=4096").as_bytes());
            super::sasl_exchange(&data);
        }
    }
}
