//! Access control lists: which user may do which operation on which
//! resource. Allow rules only: a user may do what some entry allows and
//! nothing else (superusers, named in the brokers' `--superusers`, and the
//! brokers themselves bypass them: `crate::auth`). Kept in the
//! controller's table, so every broker decides alike once it applied the
//! change.
//!
//! An entry names a user, an [`Operation`] and a [`ResourcePattern`]: one
//! queue, every queue whose name starts with a prefix, one consumer group,
//! or the cluster. Any operation allowed on a resource also allows
//! `describe` on it (as Kafka's READ, WRITE, ... imply DESCRIBE).
//!
//! # Encoding
//! In the table's JSON and `AddAcl`/`RemoveAcl` entries: `{"user":
//! "alice", "operation": "produce", "resource": {"type": "queue",
//! "name": "orders"}}` (`"type"`: `queue`, `queue-prefix`, `group`, or
//! `cluster` without a name).
//!
//! Runs on: shard 0 (the state machine applies the changes); every shard
//! reads the list from its table copy for each request of a user.

use serde::{Deserialize, Serialize};

use super::error::ControllerError;

/// What an entry allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// Append records to a queue.
    Produce,
    /// Read a queue; join, commit in, receive from a consumer group.
    Consume,
    /// See a queue's or a group's state.
    Describe,
    /// Create a queue.
    Create,
    /// Change a queue's settings.
    Alter,
    /// Delete a queue or a group.
    Delete,
    /// On the cluster: nodes (drain, decommission, reassign, elect), users
    /// and ACLs.
    Admin,
}

impl Operation {
    pub const ALL: [Operation; 7] = [
        Operation::Produce,
        Operation::Consume,
        Operation::Describe,
        Operation::Create,
        Operation::Alter,
        Operation::Delete,
        Operation::Admin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Operation::Produce => "produce",
            Operation::Consume => "consume",
            Operation::Describe => "describe",
            Operation::Create => "create",
            Operation::Alter => "alter",
            Operation::Delete => "delete",
            Operation::Admin => "admin",
        }
    }

    pub fn from_name(name: &str) -> Option<Operation> {
        Operation::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// What an entry applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(tag = "type", content = "name", rename_all = "kebab-case")]
pub enum ResourcePattern {
    Queue(String),
    /// Every queue whose name starts with this.
    QueuePrefix(String),
    Group(String),
    Cluster,
}

impl ResourcePattern {
    /// `queue`, `queue-prefix`, `group` or `cluster` (the CLI's flag and
    /// the wire's `resource_type`).
    pub fn kind(&self) -> &'static str {
        match self {
            ResourcePattern::Queue(_) => "queue",
            ResourcePattern::QueuePrefix(_) => "queue-prefix",
            ResourcePattern::Group(_) => "group",
            ResourcePattern::Cluster => "cluster",
        }
    }

    /// The name or prefix (empty for the cluster).
    pub fn name(&self) -> &str {
        match self {
            ResourcePattern::Queue(n) | ResourcePattern::QueuePrefix(n) | ResourcePattern::Group(n) => n,
            ResourcePattern::Cluster => "",
        }
    }

    /// From a kind and a name, as [`ResourcePattern::kind`] and
    /// [`ResourcePattern::name`] give them.
    pub fn from_parts(kind: &str, name: &str) -> Result<ResourcePattern, ControllerError> {
        Ok(match kind {
            "queue" => ResourcePattern::Queue(name.to_string()),
            "queue-prefix" => ResourcePattern::QueuePrefix(name.to_string()),
            "group" => ResourcePattern::Group(name.to_string()),
            "cluster" => ResourcePattern::Cluster,
            other => {
                return Err(ControllerError::InvalidAcl(format!(
                    "resource type {other:?}: queue, queue-prefix, group or cluster"
                )))
            }
        })
    }

    fn matches(&self, resource: &Resource<'_>) -> bool {
        match (self, resource) {
            (ResourcePattern::Queue(p), Resource::Queue(q)) => p == q,
            (ResourcePattern::QueuePrefix(p), Resource::Queue(q)) => q.starts_with(p.as_str()),
            (ResourcePattern::Group(p), Resource::Group(g)) => p == g,
            (ResourcePattern::Cluster, Resource::Cluster) => true,
            _ => false,
        }
    }
}

/// A resource a request touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource<'a> {
    Queue(&'a str),
    Group(&'a str),
    Cluster,
}

impl std::fmt::Display for Resource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resource::Queue(q) => write!(f, "queue {q:?}"),
            Resource::Group(g) => write!(f, "group {g:?}"),
            Resource::Cluster => f.write_str("the cluster"),
        }
    }
}

/// One entry: `user` may do `operation` on `resource`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AclEntry {
    pub user: String,
    pub operation: Operation,
    pub resource: ResourcePattern,
}

impl AclEntry {
    /// Refuses an entry that could never apply: a bad user name, an empty
    /// name, `admin` on anything but the cluster, `produce` on a group,
    /// queue operations on a group or the cluster (but `create`).
    pub fn check(&self) -> Result<(), ControllerError> {
        super::users::check_name(&self.user).map_err(|e| ControllerError::InvalidAcl(e.to_string()))?;
        let name = self.resource.name();
        if !matches!(self.resource, ResourcePattern::Cluster)
            && (name.is_empty() || name.len() > strand_wire::QUEUE_NAME_MAX)
        {
            return Err(ControllerError::InvalidAcl(format!(
                "a {} name of 1 to {} bytes",
                self.resource.kind(),
                strand_wire::QUEUE_NAME_MAX
            )));
        }
        use Operation::*;
        let fits = match &self.resource {
            ResourcePattern::Queue(_) | ResourcePattern::QueuePrefix(_) => self.operation != Admin,
            ResourcePattern::Group(_) => matches!(self.operation, Consume | Describe | Delete),
            ResourcePattern::Cluster => matches!(self.operation, Admin | Create | Describe),
        };
        if !fits {
            return Err(ControllerError::InvalidAcl(format!(
                "{} does not apply to a {} (queues: produce, consume, describe, create, alter, delete; groups: \
                 consume, describe, delete; the cluster: admin, create, describe)",
                self.operation.name(),
                self.resource.kind()
            )));
        }
        Ok(())
    }
}

/// Whether `acls` let `user` do `operation` on `resource`: an entry for it,
/// or (for `describe`) any entry on the resource.
pub fn allows(acls: &[AclEntry], user: &str, operation: Operation, resource: &Resource<'_>) -> bool {
    acls.iter().any(|a| {
        a.user == user && a.resource.matches(resource) && (a.operation == operation || operation == Operation::Describe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(user: &str, operation: Operation, resource: ResourcePattern) -> AclEntry {
        AclEntry {
            user: user.into(),
            operation,
            resource,
        }
    }

    #[test]
    fn entries_allow_what_they_name_and_describe_with_it() {
        let acls = vec![
            entry("alice", Operation::Produce, ResourcePattern::Queue("orders".into())),
            entry(
                "alice",
                Operation::Consume,
                ResourcePattern::QueuePrefix("logs.".into()),
            ),
            entry("bob", Operation::Consume, ResourcePattern::Group("billing".into())),
            entry("ops", Operation::Admin, ResourcePattern::Cluster),
        ];
        let q = Resource::Queue;
        assert!(allows(&acls, "alice", Operation::Produce, &q("orders")));
        assert!(allows(&acls, "alice", Operation::Describe, &q("orders")));
        assert!(!allows(&acls, "alice", Operation::Consume, &q("orders")));
        assert!(!allows(&acls, "alice", Operation::Produce, &q("orders2")));
        assert!(!allows(&acls, "bob", Operation::Produce, &q("orders")));
        assert!(allows(&acls, "alice", Operation::Consume, &q("logs.web")));
        assert!(!allows(&acls, "alice", Operation::Consume, &q("logs")));
        assert!(allows(&acls, "bob", Operation::Consume, &Resource::Group("billing")));
        assert!(!allows(&acls, "bob", Operation::Consume, &q("billing")));
        assert!(!allows(&acls, "bob", Operation::Delete, &Resource::Group("billing")));
        assert!(allows(&acls, "ops", Operation::Admin, &Resource::Cluster));
        assert!(!allows(&acls, "alice", Operation::Admin, &Resource::Cluster));
    }

    #[test]
    fn entries_that_cannot_apply_are_refused() {
        let bad = [
            entry("", Operation::Produce, ResourcePattern::Queue("q".into())),
            entry("a", Operation::Produce, ResourcePattern::Queue(String::new())),
            entry("a", Operation::Admin, ResourcePattern::Queue("q".into())),
            entry("a", Operation::Produce, ResourcePattern::Group("g".into())),
            entry("a", Operation::Produce, ResourcePattern::Cluster),
        ];
        for e in bad {
            assert!(matches!(e.check(), Err(ControllerError::InvalidAcl(_))), "{e:?}");
        }
        entry("a", Operation::Create, ResourcePattern::Cluster).check().unwrap();
        entry("a", Operation::Create, ResourcePattern::QueuePrefix("t.".into()))
            .check()
            .unwrap();
        assert_eq!(
            ResourcePattern::from_parts("queue-prefix", "t.").unwrap(),
            ResourcePattern::QueuePrefix("t.".into())
        );
        assert!(ResourcePattern::from_parts("topic", "t").is_err());
        let json = serde_json::to_string(&entry("a", Operation::Consume, ResourcePattern::Cluster)).unwrap();
        assert_eq!(
            json,
            r#"{"user":"a","operation":"consume","resource":{"type":"cluster"}}"#
        );
    }
}
