//! The entry points of the broker's fuzz targets (`broker/fuzz/`), also
//! run under proptest in `cargo test`. Both take bytes anyone who reaches
//! the port can send today (issue 42: internal calls are not yet
//! restricted to brokers), so they must never panic the broker:
//!
//! - [`replica_fetch_body`]: a `ReplicaFetch` body, through the handler's
//!   parse (`handlers::replica_fetch::parse`): what decodes asks for at
//!   most 30 s and, per partition, no more than its share of a frame.
//! - [`controller_payload`]: a controller RPC's JSON payload, read as each
//!   payload the controller member decodes (a proposed `Command`, a
//!   learner or heartbeat request, openraft's vote, append and snapshot
//!   requests) and as the raft log's records (`controller::store`); a
//!   payload that decodes to a `Command` is applied to a controller state
//!   machine holding three brokers and a replicated queue, whose table
//!   must keep its structure (`MetadataTable::check_structure`) and whose
//!   command encodes back to itself.

use std::time::Duration;

use crate::controller::{Command, MetadataStm};

/// A frame of this size bounds the shares in [`replica_fetch_body`].
const FRAME: u32 = 16 << 20;

pub fn replica_fetch_body(data: &[u8]) {
    let Ok((wants, max_wait)) = crate::handlers::replica_fetch::parse(data, FRAME) else {
        return;
    };
    assert!(max_wait <= Duration::from_secs(30));
    let share = crate::handlers::replica_fetch::share_of(FRAME, wants.len());
    for w in &wants {
        assert!(w.want.max_bytes <= share);
    }
}

pub fn controller_payload(data: &[u8]) {
    crate::controller::decode_payloads(data);
    if let Ok(command) = serde_json::from_slice::<Command>(data) {
        let encoded = serde_json::to_vec(&command).expect("commands always serialise");
        let again: Command =
            serde_json::from_slice(&encoded).unwrap_or_else(|e| panic!("{command:?} does not read back: {e}"));
        assert_eq!(again, command);
        let mut stm = seeded_stm();
        let index = stm.table().applied_index + 1;
        let _ = stm.apply(index, &command);
        if let Err(e) = stm.table().check_structure() {
            panic!("{command:?} broke the table: {e}");
        }
    }
}

/// A state machine with brokers 1–3 and a queue `q` of three partitions
/// on all three.
fn seeded_stm() -> MetadataStm {
    let mut stm = MetadataStm::new();
    let mut commands: Vec<Command> = (1..=3)
        .map(|id| Command::RegisterBroker {
            id,
            address: format!("10.0.0.{id}:9400"),
            shards: 2,
            incarnation: 1,
            directory: id,
        })
        .collect();
    commands.push(Command::CreateQueue {
        name: "q".into(),
        settings: crate::controller::QueueSettings {
            partitions: 3,
            replication_factor: 3,
            retention_ms: None,
            retention_bytes: None,
            fsync: crate::controller::FsyncSetting::Always,
            max_message_bytes: 1 << 20,
            max_delivery_attempts: crate::controller::DEFAULT_MAX_DELIVERY_ATTEMPTS,
            min_insync_replicas: 2,
            segment_bytes: 0,
        },
    });
    for c in &commands {
        let index = stm.table().applied_index + 1;
        let _ = stm.apply(index, c);
    }
    stm
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_seeded_state_holds_a_led_queue() {
        let stm = seeded_stm();
        let q = stm.table().queue("q").unwrap();
        assert_eq!(q.partitions.len(), 3);
        assert!(q.partitions.iter().all(|p| p.replicas.len() == 3 && p.leader != 0));
    }

    /// Valid commands of every shape the fuzzer starts from (and mutates).
    fn seeds() -> Vec<Vec<u8>> {
        let commands = [
            Command::AlterIsr {
                queue: "q".into(),
                partition: 0,
                leader: 1,
                leader_epoch: 0,
                partition_epoch: 0,
                isr: vec![1, 2, 3],
            },
            Command::ElectUnclean {
                queue: "q".into(),
                partition: Some(1),
                replica: Some(2),
            },
            Command::ReplicaDamaged {
                queue: "q".into(),
                partition: 2,
                broker: 3,
                partition_epoch: 0,
            },
            Command::DeleteQueue { name: "q".into() },
            Command::ReassignPartition {
                queue: "q".into(),
                partition: 0,
                replicas: vec![3, 2, 1],
            },
        ];
        commands.iter().map(|c| serde_json::to_vec(c).unwrap()).collect()
    }

    proptest! {
        #[test]
        fn arbitrary_replica_fetch_bodies_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            replica_fetch_body(&data);
        }

        #[test]
        fn arbitrary_controller_payloads_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
            controller_payload(&data);
        }

        #[test]
        fn mutated_commands_never_break_the_table(which in 0usize..5, at in any::<usize>(), byte in any::<u8>(), digit in 0u8..10) {
            let mut data = seeds()[which].clone();
            // Numbers changed keep the JSON valid more often than bytes do.
            let i = at % data.len();
            match data[i].is_ascii_digit() {
                true => data[i] = b'0' + digit,
                false => data[i] = byte,
            }
            controller_payload(&data);
        }
    }

    #[test]
    fn every_seed_decodes_and_applies() {
        for seed in seeds() {
            controller_payload(&seed);
        }
    }

    /// A `ReplicaFetch` body of `partitions` partitions of one queue, each
    /// asking for all it can, waiting as long as it can.
    fn greedy_fetch(partitions: u32) -> Vec<u8> {
        use strand_wire::flatbuffers::FlatBufferBuilder;
        use strand_wire::*;
        let mut fbb = FlatBufferBuilder::new();
        let entries: Vec<_> = (0..partitions)
            .map(|partition| {
                ReplicaFetchPartition::create(
                    &mut fbb,
                    &ReplicaFetchPartitionArgs {
                        partition,
                        max_bytes: u32::MAX,
                        ..ReplicaFetchPartitionArgs::default()
                    },
                )
            })
            .collect();
        let entries = fbb.create_vector(&entries);
        let name = fbb.create_string("q");
        let queue = ReplicaFetchQueue::create(
            &mut fbb,
            &ReplicaFetchQueueArgs {
                name: Some(name),
                partitions: Some(entries),
                id: 1,
            },
        );
        let queues = fbb.create_vector(&[queue]);
        let root = ReplicaFetchRequest::create(
            &mut fbb,
            &ReplicaFetchRequestArgs {
                replica_id: 2,
                max_wait_ms: u32::MAX,
                queues: Some(queues),
            },
        );
        fbb.finish_minimal(root);
        fbb.finished_data().to_vec()
    }

    /// A replica-fetch body the handler reads: two partitions asking for
    /// more than a frame, each cut to its share.
    #[test]
    fn a_greedy_replica_fetch_is_cut_to_shares() {
        let body = greedy_fetch(2);
        let (wants, wait) = crate::handlers::replica_fetch::parse(&body, FRAME).unwrap();
        assert_eq!(wants.len(), 2);
        assert_eq!(wait, Duration::from_secs(30));
        assert!(wants.iter().all(|w| w.want.max_bytes == (FRAME - (1 << 20)) / 2));
        replica_fetch_body(&body);
    }
}
