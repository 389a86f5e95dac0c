//! What each request asks of the ACLs: the (operation, resource) pairs a
//! user's request needs allowed (`controller::acls`), read from its body
//! before the handler runs. `crate::auth` decides who is checked at all
//! (users with `--auth scram`; not superusers, not brokers).
//!
//! | API | needs |
//! |---|---|
//! | Metadata | nothing more; the answer shows only queues it may describe (one named and not: `NotAuthorized`) |
//! | ListGroups | nothing more; the answer shows only groups it may describe |
//! | DescribeBroker | nothing more (any user) |
//! | CreateQueue | create on the queue (or the cluster) |
//! | DeleteQueue, AlterQueue, DescribeQueue | delete, alter, describe on the queue |
//! | Produce | produce on each queue |
//! | Fetch | consume on each queue |
//! | ListOffsets | describe on each queue |
//! | JoinGroup, CommitOffsets | consume on the group and on each queue |
//! | Settle | consume on the group and on each queue it settles |
//! | Receive | consume on the group; on each queue of the records it hands out (checked on the answer) |
//! | Heartbeat, LeaveGroup | consume on the group |
//! | FetchOffsets | consume on the group; the answer shows only queues it may describe |
//! | ResetGroup | consume on the group and the queue |
//! | DescribeGroup | describe on the group; the answer shows only queues it may describe |
//! | DeleteGroup | delete on the group |
//! | node, user and ACL APIs | admin on the cluster |
//!
//! A member is the user's that joined it: another user (with consume on
//! the group) acting as it — Heartbeat, LeaveGroup, CommitOffsets, Receive,
//! Settle — is refused by the coordinator (`groups::Group::check_owner`).
//!
//! The broker's own queues (`__groups`) are no user's, and dead-letter
//! queues are created only by the broker. The names are borrowed from the
//! request body: checking allocates no copy of them.

use strand_wire::*;

use super::request;
use crate::controller::acls::{allows, AclEntry, Operation, Resource};
use crate::shard::messages::WireError;

/// Refuses `user`'s request to `api` unless `acls` allow all it needs; the
/// refusal names the first operation and resource missing and how to
/// grant it. The broker's own queues (`__groups`) are no user's, whatever
/// an entry says, and no user creates a dead-letter queue (`<queue>.dlq`:
/// the broker does, with the settings it chooses).
pub fn check(acls: &[AclEntry], user: &str, api: Api, body: &[u8]) -> Result<(), WireError> {
    for (operation, resource) in needs(api, body)? {
        allowed(acls, user, api, operation, resource)?;
    }
    Ok(())
}

/// Refuses a Receive answer that hands out records of a queue `user` may
/// not consume (another member of the group subscribed to it): the records
/// stay locked to the member until their lock runs out, then go to
/// another.
pub fn check_received<'a>(
    acls: &[AclEntry],
    user: &str,
    queues: impl Iterator<Item = &'a str>,
) -> Result<(), WireError> {
    for (operation, resource) in each(Operation::Consume, queues.map(Some)) {
        allowed(acls, user, Api::Receive, operation, resource)?;
    }
    Ok(())
}

/// Whether `user` may describe group `group` (ListGroups shows it).
pub fn may_describe_group(acls: &[AclEntry], user: &str, group: &str) -> bool {
    allows(acls, user, Operation::Describe, &Resource::Group(group))
}

/// Whether `user` may describe `queue` (what a group's answers show of
/// it: FetchOffsets, DescribeGroup).
pub fn may_describe(acls: &[AclEntry], user: &str, queue: &str) -> bool {
    !crate::groups::is_internal(queue) && allows(acls, user, Operation::Describe, &Resource::Queue(queue))
}

/// Refuses one (operation, resource) of `user`'s request to `api` unless
/// `acls` allow it.
fn allowed(
    acls: &[AclEntry],
    user: &str,
    api: Api,
    operation: Operation,
    resource: Resource<'_>,
) -> Result<(), WireError> {
    if let Resource::Queue(q) = resource {
        let refusal = if crate::groups::is_internal(q) {
            Some("the broker's own queues are no user's")
        } else if operation == Operation::Create && q.ends_with(".dlq") {
            Some("dead-letter queues are created by the broker")
        } else {
            None
        };
        if let Some(why) = refusal {
            return Err(WireError::new(
                ErrorCode::NotAuthorized,
                format!("user {user:?} may not {} on {resource}: {why}", operation.name()),
            ));
        }
    }
    let allowed = allows(acls, user, operation, &resource)
        // A queue may be created under a cluster-wide create.
        || (operation == Operation::Create && allows(acls, user, operation, &Resource::Cluster));
    if !allowed {
        let grant = match resource {
            Resource::Queue(q) => format!("--queue {q}"),
            Resource::Group(g) => format!("--group {g}"),
            Resource::Cluster => "--cluster".into(),
        };
        return Err(WireError::new(
            ErrorCode::NotAuthorized,
            format!(
                "user {user:?} may not {} on {resource} ({}; a superuser can allow it: strand acl add --user \
                 {user} --operation {} {grant})",
                operation.name(),
                api.name(),
                operation.name()
            ),
        ));
    }
    Ok(())
}

/// The pairs `api`'s request in `body` needs allowed.
fn needs(api: Api, body: &[u8]) -> Result<Vec<(Operation, Resource<'_>)>, WireError> {
    use Operation::*;
    fn queue(n: Option<&str>) -> Resource<'_> {
        Resource::Queue(n.unwrap_or_default())
    }
    fn group(n: Option<&str>) -> Resource<'_> {
        Resource::Group(n.unwrap_or_default())
    }
    Ok(match api {
        Api::ApiVersions
        | Api::SaslHandshake
        | Api::SaslAuthenticate
        | Api::Metadata
        | Api::ListGroups
        | Api::DescribeBroker => Vec::new(),
        // Brokers only (`crate::auth` refuses users before this).
        Api::Controller | Api::ReplicaFetch => vec![(Admin, Resource::Cluster)],
        Api::DrainBroker
        | Api::DecommissionBroker
        | Api::ReassignPartition
        | Api::ElectLeaders
        | Api::PutUser
        | Api::DeleteUser
        | Api::ListUsers
        | Api::AlterAcls
        | Api::ListAcls => vec![(Admin, Resource::Cluster)],
        Api::CreateQueue => vec![(Create, queue(request::<CreateQueueRequest>(body)?.name()))],
        Api::DeleteQueue => vec![(Delete, queue(request::<DeleteQueueRequest>(body)?.name()))],
        Api::AlterQueue => vec![(Alter, queue(request::<AlterQueueRequest>(body)?.name()))],
        Api::DescribeQueue => vec![(Describe, queue(request::<DescribeQueueRequest>(body)?.name()))],
        Api::Produce => each(
            Produce,
            request::<ProduceRequest>(body)?
                .queues()
                .iter()
                .flatten()
                .map(|q| q.name()),
        ),
        Api::Fetch => each(
            Consume,
            request::<FetchRequest>(body)?
                .queues()
                .iter()
                .flatten()
                .map(|q| q.name()),
        ),
        Api::ListOffsets => each(
            Describe,
            request::<ListOffsetsRequest>(body)?
                .queues()
                .iter()
                .flatten()
                .map(|q| q.name()),
        ),
        Api::JoinGroup => {
            let r = request::<JoinGroupRequest>(body)?;
            let mut out = vec![(Consume, group(r.group()))];
            out.extend(each(Consume, r.queues().iter().flatten().map(Some)));
            out
        }
        Api::CommitOffsets => {
            let r = request::<CommitOffsetsRequest>(body)?;
            let mut out = vec![(Consume, group(r.group()))];
            out.extend(each(Consume, r.queues().iter().flatten().map(|q| q.queue())));
            out
        }
        Api::Heartbeat => vec![(Consume, group(request::<HeartbeatRequest>(body)?.group()))],
        Api::LeaveGroup => vec![(Consume, group(request::<LeaveGroupRequest>(body)?.group()))],
        Api::FetchOffsets => vec![(Consume, group(request::<FetchOffsetsRequest>(body)?.group()))],
        Api::Receive => vec![(Consume, group(request::<ReceiveRequest>(body)?.group()))],
        Api::Settle => {
            let r = request::<SettleRequest>(body)?;
            let mut out = vec![(Consume, group(r.group()))];
            out.extend(each(Consume, r.records().iter().flatten().map(|s| s.queue())));
            out
        }
        Api::ResetGroup => {
            let r = request::<ResetGroupRequest>(body)?;
            vec![(Consume, group(r.group())), (Consume, queue(r.queue()))]
        }
        Api::DescribeGroup => vec![(Describe, group(request::<DescribeGroupRequest>(body)?.group()))],
        Api::DeleteGroup => vec![(Delete, group(request::<DeleteGroupRequest>(body)?.group()))],
    })
}

/// `operation` on each named queue, once each (a request may name one
/// queue per partition: up to `PARTITIONS_PER_REQUEST_MAX`).
fn each<'a>(operation: Operation, names: impl Iterator<Item = Option<&'a str>>) -> Vec<(Operation, Resource<'a>)> {
    let distinct: std::collections::BTreeSet<&str> = names.map(Option::unwrap_or_default).collect();
    distinct
        .into_iter()
        .map(|name| (operation, Resource::Queue(name)))
        .collect()
}
