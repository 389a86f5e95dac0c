//! Hostile input: hundreds of random, truncated and oversize frames on many
//! connections must not disturb the broker; a normal produce and fetch
//! afterwards still work.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use strand_wire::ErrorCode;

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn garbage_frames_close_only_their_connections() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let mut good = broker.client();
    assert_eq!(good.create_queue("ok", 2), ErrorCode::None);
    good.produce("ok", 0, batch("before", 2, TS), 1).unwrap();

    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let addr = broker.addr;
            std::thread::spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                for i in 0..50 {
                    let Ok(mut s) = TcpStream::connect(addr) else { continue };
                    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
                    let kind = xorshift(&mut rng) % 5;
                    let mut frame = Vec::new();
                    match kind {
                        // Random bytes.
                        0 => (0..(xorshift(&mut rng) % 300)).for_each(|_| frame.push(xorshift(&mut rng) as u8)),
                        // A length far over the frame limit.
                        1 => frame.extend_from_slice(&u32::MAX.to_le_bytes()),
                        // A plausible header with a random body and API.
                        2 | 3 => {
                            let body: Vec<u8> = (0..(xorshift(&mut rng) % 200))
                                .map(|_| xorshift(&mut rng) as u8)
                                .collect();
                            frame.extend_from_slice(&((12 + body.len()) as u32).to_le_bytes());
                            frame.extend_from_slice(
                                &((xorshift(&mut rng) % (strand_wire::Api::ALL.len() as u64 + 1)) as u16).to_le_bytes(),
                            );
                            frame.extend_from_slice(&((xorshift(&mut rng) % 2) as u16).to_le_bytes());
                            frame.extend_from_slice(&(i as u32).to_le_bytes());
                            frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
                            frame.extend_from_slice(&body);
                        }
                        // A truncated frame, then hang up.
                        _ => {
                            frame.extend_from_slice(&1000u32.to_le_bytes());
                            frame.extend_from_slice(&[1, 0, 0, 0, 9, 9]);
                        }
                    }
                    let _ = s.write_all(&frame);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // An oversize frame is answered with a typed error, then closed.
    let mut s = TcpStream::connect(broker.addr).unwrap();
    let mut frame = Vec::new();
    frame.extend_from_slice(&(64u32 << 20).to_le_bytes());
    frame.extend_from_slice(&(strand_wire::Api::Produce as u16).to_le_bytes());
    frame.extend_from_slice(&0u16.to_le_bytes());
    frame.extend_from_slice(&4242u32.to_le_bytes());
    s.write_all(&frame).unwrap();
    let mut reply = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut reply).unwrap();
    let mut buf = bytes::BytesMut::from(&reply[..]);
    let f = strand_net::frame::decode(&mut buf, Default::default())
        .unwrap()
        .unwrap();
    assert_eq!(f.header.correlation_id, 4242);
    let e = strand_net::message::body::<strand_wire::ProduceResponse>(&f)
        .unwrap()
        .error()
        .unwrap();
    assert_eq!(e.code(), ErrorCode::FrameTooLarge);

    // The broker still serves everyone else, and lost nothing.
    good.produce("ok", 0, batch("after", 2, TS), 1).unwrap();
    let records = good.fetch_all("ok", 0, 0);
    let values: Vec<String> = records
        .iter()
        .map(|(_, v)| String::from_utf8(v.clone()).unwrap())
        .collect();
    assert_eq!(values, ["before-0", "before-1", "after-0", "after-1"]);
    let mut fresh = broker.client();
    assert_eq!(fresh.produce("ok", 1, batch("new", 1, TS), 1).unwrap(), (0, 0));
    assert_eq!(broker.terminate().code(), Some(0));
}

/// A shard waits for the rest of a large frame with the socket's receive
/// low-water mark raised to bytes the frame still owes (so it wakes about
/// twice per MiB, not per 64 KiB segment). A frame that trickles in, with
/// pauses mid-way and just before its last bytes, and a small request right
/// behind it, must all be answered: a mark above what is still coming would
/// leave the connection waiting for good.
#[test]
fn a_large_frame_that_trickles_in_is_served_with_the_request_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let mut client = broker.client();
    assert_eq!(client.create_queue("slow", 1), ErrorCode::None);
    client.stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();

    let mut b = strand_storage::batch::BatchBuilder::new();
    for i in 0..900u32 {
        let value = format!("{i:04}").repeat(250); // 1,000 bytes
        b.push(None, Some(value.as_bytes()), &[], TS);
    }
    let mut frame_of = |batch: bytes::Bytes| {
        let (body, tail) = strand_client::requests::produce("slow", 0, 1, batch);
        client.frame(strand_wire::Api::Produce, &body, tail)
    };
    let (large_id, large) = frame_of(b.build().freeze());
    let (small_id, small) = frame_of(batch("behind", 1, TS));
    assert!(large.len() > 900_000);
    // Pieces: a header and a little, a stretch, nearly all, the last bytes
    // with the next request in the same write.
    let cuts = [100, 70_000, 400_000, large.len() - 10];
    let mut from = 0;
    for cut in cuts {
        client.stream.write_all(&large[from..cut]).unwrap();
        client.stream.flush().unwrap();
        std::thread::sleep(Duration::from_millis(150));
        from = cut;
    }
    let mut rest = large[from..].to_vec();
    rest.extend_from_slice(&small);
    client.stream.write_all(&rest).unwrap();

    // (correlation id, first and last offset stored)
    for (id, offsets) in [(large_id, (0, 899)), (small_id, (900, 900))] {
        let f = client.recv();
        assert_eq!(f.header.correlation_id, id);
        assert_eq!(strand_client::requests::produced(&f).unwrap(), offsets);
    }
    let records = client.fetch_all("slow", 0, 0);
    assert_eq!(records.len(), 901);
    assert_eq!(records[899].1, "0899".repeat(250).into_bytes());
    assert_eq!(records[900].1, b"behind-0");
}
