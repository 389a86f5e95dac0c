//! Metadata, DescribeQueue and AlterQueue against the real binary.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use strand_net::message::{body, TailBuilder};
use strand_wire::flatbuffers::FlatBufferBuilder;
use strand_wire::*;

fn alter(c: &mut Client, name: &str, partitions: Option<u32>, retention_ms: Option<i64>) -> ErrorCode {
    let mut fbb = FlatBufferBuilder::new();
    let n = fbb.create_string(name);
    let root = AlterQueueRequest::create(
        &mut fbb,
        &AlterQueueRequestArgs {
            name: Some(n),
            partitions,
            retention_ms,
            ..Default::default()
        },
    );
    fbb.finish_minimal(root);
    let f = c.call(Api::AlterQueue, &fbb, TailBuilder::default());
    error_code(body::<AlterQueueResponse>(&f).unwrap().error())
}

/// (partition count, retention_ms) from Metadata.
fn metadata(c: &mut Client, name: &str) -> Result<(usize, Option<i64>, Vec<u32>), ErrorCode> {
    let mut fbb = FlatBufferBuilder::new();
    let n = fbb.create_string(name);
    let names = fbb.create_vector(&[n]);
    let root = MetadataRequest::create(&mut fbb, &MetadataRequestArgs { queues: Some(names) });
    fbb.finish_minimal(root);
    let f = c.call(Api::Metadata, &fbb, TailBuilder::default());
    let resp = body::<MetadataResponse>(&f).unwrap();
    assert_eq!(resp.brokers().unwrap().len(), 1);
    let q = resp.queues().unwrap().get(0);
    if let Some(e) = q.error() {
        return Err(e.code());
    }
    let leaders = q.partitions().unwrap().iter().map(|p| p.leader()).collect();
    Ok((
        q.partitions().unwrap().len(),
        q.config().unwrap().retention_ms(),
        leaders,
    ))
}

#[test]
fn alter_describe_and_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let mut c = broker.client();
    assert_eq!(c.create_queue("grow", 2), ErrorCode::None);
    let (n, retention, leaders) = metadata(&mut c, "grow").unwrap();
    assert_eq!((n, retention), (2, Some(7 * 24 * 3600 * 1000)));
    assert!(leaders.iter().all(|l| *l == 1));
    assert_eq!(metadata(&mut c, "missing").unwrap_err(), ErrorCode::UnknownQueue);

    c.produce("grow", 1, batch("x", 4, TS), 1).unwrap();
    // Partitions grow without moving data; shrinking is refused.
    assert_eq!(alter(&mut c, "grow", Some(5), Some(-1)), ErrorCode::None);
    assert_eq!(metadata(&mut c, "grow").unwrap().0, 5);
    assert_eq!(metadata(&mut c, "grow").unwrap().1, Some(-1), "-1: kept forever");
    assert_eq!(alter(&mut c, "grow", Some(3), None), ErrorCode::InvalidConfig);
    assert_eq!(alter(&mut c, "grow", None, Some(0)), ErrorCode::InvalidConfig);
    assert_eq!(alter(&mut c, "nope", Some(3), None), ErrorCode::UnknownQueue);
    assert_eq!(
        c.produce("grow", 4, batch("new", 1, TS), 1).unwrap(),
        (0, 0),
        "the new partition takes data"
    );
    assert_eq!(c.fetch_all("grow", 1, 0).len(), 4, "existing data stayed");

    let mut fbb = FlatBufferBuilder::new();
    let n = fbb.create_string("grow");
    let root = DescribeQueueRequest::create(
        &mut fbb,
        &DescribeQueueRequestArgs {
            name: Some(n),
            only_led_here: false,
        },
    );
    fbb.finish_minimal(root);
    let f = c.call(Api::DescribeQueue, &fbb, TailBuilder::default());
    let resp = body::<DescribeQueueResponse>(&f).unwrap();
    assert!(resp.error().is_none());
    let parts = resp.partitions().unwrap();
    assert_eq!(parts.len(), 5);
    let p1 = parts.get(1);
    assert_eq!((p1.log_start(), p1.log_end(), p1.high_watermark()), (0, 4, 4));
    assert!(p1.stored_bytes() > 0);
    assert_eq!(parts.get(0).log_end(), 0);

    // ApiVersions lists every API; an unknown API gets a typed error.
    let mut fbb = FlatBufferBuilder::new();
    let root = ApiVersionsRequest::create(&mut fbb, &ApiVersionsRequestArgs { client_name: None });
    fbb.finish_minimal(root);
    let f = c.call(Api::ApiVersions, &fbb, TailBuilder::default());
    assert_eq!(
        body::<ApiVersionsResponse>(&f).unwrap().apis().unwrap().len(),
        Api::ALL.len()
    );
}

#[test]
fn lowering_the_message_limit_keeps_stored_batches() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let mut c = broker.client();
    assert_eq!(c.create_queue("limits", 1), ErrorCode::None);
    let big = {
        let mut b = strand_storage::batch::BatchBuilder::new();
        b.push(None, Some(&vec![3u8; 200_000]), &[], TS);
        b.build().freeze()
    };
    c.produce("limits", 0, big, 1).unwrap();
    let mut fbb = FlatBufferBuilder::new();
    let n = fbb.create_string("limits");
    let root = AlterQueueRequest::create(
        &mut fbb,
        &AlterQueueRequestArgs {
            name: Some(n),
            max_message_bytes: Some(1000),
            ..Default::default()
        },
    );
    fbb.finish_minimal(root);
    let f = c.call(Api::AlterQueue, &fbb, TailBuilder::default());
    assert_eq!(
        error_code(body::<AlterQueueResponse>(&f).unwrap().error()),
        ErrorCode::None
    );
    // The stored 200 KB batch is still served (reopened under the new limit)…
    let records = c.fetch_all("limits", 0, 0);
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].1.len(), 200_000);
    // …while new batches over the limit are refused.
    let err = c.produce("limits", 0, batch(&"x".repeat(2000), 1, TS), 1).unwrap_err();
    assert_eq!(err.0, ErrorCode::MessageTooLarge);
    // And after a restart too.
    drop(c);
    assert_eq!(broker.terminate().code(), Some(0));
    let broker = Broker::start(dir.path());
    assert_eq!(broker.client().fetch_all("limits", 0, 0).len(), 1);
}

#[test]
fn a_message_limit_over_the_frame_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let admin = strand_client::Admin::connect(&broker.addr.to_string()).unwrap();
    let spec = strand_client::QueueSpec {
        max_message_bytes: Some(32 << 20),
        ..Default::default()
    };
    let err = strand_client::block_on(admin.create_queue("huge", &spec)).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidConfig), "{err}");
    assert!(err.to_string().contains("max_frame_bytes"), "{err}");
    strand_client::block_on(admin.create_queue("huge", &strand_client::QueueSpec::default())).unwrap();
    let err = strand_client::block_on(admin.alter_queue("huge", &spec)).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidConfig), "{err}");
}
