//! Request bodies and response readers for the data APIs, below the
//! producer and consumer: one place that knows how a produce request is laid
//! out, used by the bench harness and the broker's tests too.

use bytes::Bytes;
use strand_net::message::{read_body, TailBuilder};
use strand_net::Frame;
use strand_wire::flatbuffers::{FlatBufferBuilder, Follow, ForwardsUOffset, Vector};
use strand_wire::*;

use crate::error::ClientError;

/// A Produce request of one record-batch run (`records`: one or more whole
/// batches) for one partition: the body and the tail to send with it. The
/// broker appends a run's batches one by one, so the response's base and
/// last offsets are consecutive only for a single batch.
pub fn produce(queue: &str, partition: u32, acks: i8, records: Bytes) -> (Vec<u8>, TailBuilder) {
    produce_with_timeout(queue, partition, acks, 30_000, records)
}

/// [`produce`] with the broker's time limit for the request.
pub fn produce_with_timeout(
    queue: &str,
    partition: u32,
    acks: i8,
    timeout_ms: u32,
    records: Bytes,
) -> (Vec<u8>, TailBuilder) {
    produce_many(&[(queue, vec![(partition, records)])], acks, timeout_ms)
}

/// A Produce request for several partitions, of one queue or several:
/// each queue with its partitions and each partition's record-batch run
/// (the tail holds the runs in this order). The broker stores the
/// partitions in parallel and answers each on its own
/// ([`produced_each`]).
pub fn produce_many(queues: &[(&str, Vec<(u32, Bytes)>)], acks: i8, timeout_ms: u32) -> (Vec<u8>, TailBuilder) {
    let mut fbb = FlatBufferBuilder::new();
    let mut tail = TailBuilder::default();
    let mut entries = Vec::with_capacity(queues.len());
    for (queue, parts) in queues {
        let parts: Vec<_> = parts
            .iter()
            .map(|(partition, records)| {
                let (records_offset, records_len) = tail.push(records.clone());
                ProducePartition::create(
                    &mut fbb,
                    &ProducePartitionArgs {
                        partition: *partition,
                        records_offset,
                        records_len,
                    },
                )
            })
            .collect();
        let parts = fbb.create_vector(&parts);
        let name = fbb.create_string(queue);
        entries.push(ProduceQueue::create(
            &mut fbb,
            &ProduceQueueArgs {
                name: Some(name),
                partitions: Some(parts),
            },
        ));
    }
    let queues = fbb.create_vector(&entries);
    let root = ProduceRequest::create(
        &mut fbb,
        &ProduceRequestArgs {
            acks,
            timeout_ms,
            queues: Some(queues),
        },
    );
    fbb.finish_minimal(root);
    (fbb.finished_data().to_vec(), tail)
}

/// Calls `each(queue, partition, result)` for every partition a Produce
/// response answers: its (base offset, last offset), or its error. An
/// error of the whole response (or an unreadable one) is returned instead.
pub fn produced_each(
    frame: &Frame,
    mut each: impl FnMut(&str, u32, Result<(u64, u64), ClientError>),
) -> Result<(), ClientError> {
    let resp = read_body::<ProduceResponse>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
    ClientError::check(resp.error())?;
    for q in resp.queues().iter().flatten() {
        let name = q.name().unwrap_or_default();
        for p in q.partitions().iter().flatten() {
            let result = ClientError::check(p.error()).map(|()| (p.base_offset(), p.last_offset()));
            each(name, p.partition(), result);
        }
    }
    Ok(())
}

/// The (base offset, last offset) of the first partition in a Produce
/// response, or its error.
pub fn produced(frame: &Frame) -> Result<(u64, u64), ClientError> {
    let mut first = None;
    produced_each(frame, |_, _, result| {
        first.get_or_insert(result);
    })?;
    first.unwrap_or_else(|| Err(ClientError::Protocol("produce response without a partition".into())))
}

/// The first partition entry of the first queue entry of a response.
fn first_partition<'a, Q: Follow<'a> + 'a, P: Follow<'a> + 'a>(
    queues: Option<Vector<'a, ForwardsUOffset<Q>>>,
    partitions: impl FnOnce(Q::Inner) -> Option<Vector<'a, ForwardsUOffset<P>>>,
    api: &str,
) -> Result<P::Inner, ClientError> {
    queues
        .and_then(|q| q.iter().next())
        .and_then(partitions)
        .and_then(|p| p.iter().next())
        .ok_or_else(|| ClientError::Protocol(format!("{api} response without a partition")))
}

/// A ListOffsets request for one partition: `spec`, and for
/// [`OffsetSpec::Timestamp`] the time (ms since the Unix epoch).
pub fn list_offset(queue: &str, partition: u32, spec: OffsetSpec, timestamp_ms: i64) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let part = ListOffsetsPartition::create(
        &mut fbb,
        &ListOffsetsPartitionArgs {
            partition,
            spec,
            timestamp_ms,
        },
    );
    let parts = fbb.create_vector(&[part]);
    let name = fbb.create_string(queue);
    let q = ListOffsetsQueue::create(
        &mut fbb,
        &ListOffsetsQueueArgs {
            name: Some(name),
            partitions: Some(parts),
        },
    );
    let queues = fbb.create_vector(&[q]);
    let root = ListOffsetsRequest::create(&mut fbb, &ListOffsetsRequestArgs { queues: Some(queues) });
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

/// The offset of the first partition in a ListOffsets response and
/// whether it was found (for a timestamp newer than every record: the log
/// end, not found), or its error.
pub fn listed(frame: &Frame) -> Result<(u64, bool), ClientError> {
    let resp = read_body::<ListOffsetsResponse>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
    ClientError::check(resp.error())?;
    let part = first_partition(resp.queues(), |q| q.partitions(), "list offsets")?;
    ClientError::check(part.error())?;
    Ok((part.offset(), part.found()))
}

/// A Fetch request for one partition from `offset`, at most `max_bytes`,
/// answered at once (no long poll).
pub fn fetch(queue: &str, partition: u32, offset: u64, max_bytes: u32) -> Vec<u8> {
    let config = crate::ConsumerConfig {
        max_wait: std::time::Duration::ZERO,
        min_bytes: 0,
        partition_max_bytes: max_bytes,
        ..crate::ConsumerConfig::default()
    };
    fetch_parts(queue, &[(partition, offset)], &config, false)
}

/// A Fetch request of `queue`'s `parts` (partition, offset) with
/// `config`'s wait and byte limits, plain or `chained`.
pub fn fetch_parts(queue: &str, parts: &[(u32, u64)], config: &crate::ConsumerConfig, chained: bool) -> Vec<u8> {
    let queue: std::sync::Arc<str> = std::sync::Arc::from(queue);
    let wants: Vec<_> = parts.iter().map(|&(p, offset)| ((queue.clone(), p), offset)).collect();
    crate::consumer::fetch_request(config, &wants, chained)
}

/// The record batches of `queue`'s first partition in a Fetch response
/// (whole batches, their CRCs unchecked), or its error.
pub fn fetched(frame: &Frame, queue: &str) -> Result<Vec<Bytes>, ClientError> {
    let resp = read_body::<FetchResponse>(&frame.body).map_err(|e| ClientError::Protocol(e.to_string()))?;
    ClientError::check(resp.error())?;
    let part = first_partition(resp.queues(), |q| q.partitions(), "fetch")?;
    ClientError::check(part.error())?;
    let mut run = crate::consumer::tail_run(frame, part.records_offset(), part.records_len(), "fetch")?;
    let mut batches = Vec::new();
    while !run.is_empty() {
        let len = crate::consumer::whole_batch_len(queue, part.partition(), &run)?;
        batches.push(run.split_to(len));
    }
    Ok(batches)
}
