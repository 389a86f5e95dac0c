//! Builders for the partition lists of the consumer-group messages, shared
//! by the broker and the client (`[QueuePartitions]`, `[QueueOffsets]`).

use flatbuffers::{FlatBufferBuilder, ForwardsUOffset, Vector, WIPOffset};

use crate::{
    PartitionOffset, PartitionOffsetArgs, QueueOffsets, QueueOffsetsArgs, QueuePartitions, QueuePartitionsArgs,
};

/// Consecutive items of one queue, grouped (the input is sorted by queue).
fn by_queue<'a, T>(items: impl IntoIterator<Item = (&'a str, T)>) -> Vec<(&'a str, Vec<T>)> {
    let mut out: Vec<(&str, Vec<T>)> = Vec::new();
    for (q, item) in items {
        match out.last_mut() {
            Some((last, list)) if *last == q => list.push(item),
            _ => out.push((q, vec![item])),
        }
    }
    out
}

/// `[QueuePartitions]` from (queue, partition) pairs sorted by queue.
pub fn queue_partitions<'b, 'a>(
    fbb: &mut FlatBufferBuilder<'b>,
    tps: impl IntoIterator<Item = (&'a str, u32)>,
) -> WIPOffset<Vector<'b, ForwardsUOffset<QueuePartitions<'b>>>> {
    let items: Vec<_> = by_queue(tps)
        .into_iter()
        .map(|(q, ps)| {
            let queue = fbb.create_string(q);
            let partitions = fbb.create_vector(&ps);
            QueuePartitions::create(
                fbb,
                &QueuePartitionsArgs {
                    queue: Some(queue),
                    partitions: Some(partitions),
                },
            )
        })
        .collect();
    fbb.create_vector(&items)
}

/// `[QueueOffsets]` from (queue, (partition, offset)) sorted by queue; an
/// offset of -1 means "none committed".
pub fn queue_offsets<'b, 'a>(
    fbb: &mut FlatBufferBuilder<'b>,
    offsets: impl IntoIterator<Item = (&'a str, (u32, i64))>,
) -> WIPOffset<Vector<'b, ForwardsUOffset<QueueOffsets<'b>>>> {
    let items: Vec<_> = by_queue(offsets)
        .into_iter()
        .map(|(q, ps)| {
            let queue = fbb.create_string(q);
            let parts: Vec<_> = ps
                .into_iter()
                .map(|(partition, offset)| PartitionOffset::create(fbb, &PartitionOffsetArgs { partition, offset }))
                .collect();
            let partitions = fbb.create_vector(&parts);
            QueueOffsets::create(
                fbb,
                &QueueOffsetsArgs {
                    queue: Some(queue),
                    partitions: Some(partitions),
                },
            )
        })
        .collect();
    fbb.create_vector(&items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_round_trip() {
        let mut fbb = FlatBufferBuilder::new();
        let v = queue_partitions(&mut fbb, [("a", 0), ("a", 2), ("b", 1)]);
        fbb.finish_minimal(v);
        let back = flatbuffers::root::<Vector<ForwardsUOffset<QueuePartitions>>>(fbb.finished_data()).unwrap();
        let got: Vec<(String, Vec<u32>)> = back
            .iter()
            .map(|q| (q.queue().unwrap().to_string(), q.partitions().unwrap().iter().collect()))
            .collect();
        assert_eq!(got, vec![("a".into(), vec![0, 2]), ("b".into(), vec![1])]);

        let mut fbb = FlatBufferBuilder::new();
        let v = queue_offsets(&mut fbb, [("q", (3, 7)), ("q", (4, -1))]);
        fbb.finish_minimal(v);
        let back = flatbuffers::root::<Vector<ForwardsUOffset<QueueOffsets>>>(fbb.finished_data()).unwrap();
        let q = back.get(0);
        assert_eq!(q.queue(), Some("q"));
        let ps: Vec<(u32, i64)> = q
            .partitions()
            .unwrap()
            .iter()
            .map(|p| (p.partition(), p.offset()))
            .collect();
        assert_eq!(ps, vec![(3, 7), (4, -1)]);
    }
}
