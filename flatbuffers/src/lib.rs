//! `strand-wire`: the messages of Strand's wire protocol.
//!
//! - `schema/strand.fbs` is the source of truth: one request and one response
//!   table per API, the error codes, queue settings.
//! - `src/generated/` is what flatc 25.12.19 makes of it (`flatbuffers/regen`;
//!   CI fails if it is stale). Never edit it by hand.
//! - [`batch`]: the record batch — the bytes a producer builds, the broker
//!   stores and a consumer reads (layout byte by byte in its doc), with
//!   [`varint`] and the [`Offset`] / [`LeaderEpoch`] newtypes.
//! - [`groups`]: builders for the consumer-group messages' partition lists.
//! - [`Api`] numbers the APIs and says which versions this build speaks;
//!   [`validate_queue_name`] is the one rule for queue names, shared by the
//!   broker and the client; [`partition_for_key`] (over [`fnv1a64`]) is the
//!   one key → partition rule.
//!
//! The frame that carries a message (length, API, version, correlation id,
//! body length, body, raw tail) is `strand-net`'s business.

mod api;
pub mod batch;
pub mod groups;
mod hash;
mod names;
mod offset;
pub mod varint;

#[allow(
    clippy::all,
    clippy::unwrap_used,
    unsafe_op_in_unsafe_fn,
    unused_imports,
    non_camel_case_types,
    deprecated,
    mismatched_lifetime_syntaxes
)]
#[rustfmt::skip]
mod generated;

pub use api::Api;
pub use generated::strand::wire::*;
pub use hash::{fnv1a64, partition_for_key, shard_for_partition, shard_for_port};
pub use names::{validate_queue_name, QUEUE_NAME_MAX};
pub use offset::{LeaderEpoch, Offset};

/// Re-exported so users build and read messages with the same version.
pub use flatbuffers;
