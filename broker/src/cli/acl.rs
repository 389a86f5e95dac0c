//! `strand acl add | remove | list`: what each user may do (`--auth
//! scram`; superusers and brokers need no entries).
//!
//! `strand acl add --user NAME --operation OP (--queue NAME |
//! --queue-prefix P | --group NAME | --cluster)`: OP is produce, consume,
//! describe, create, alter, delete or admin (admin: on the cluster — nodes,
//! users, ACLs). Every other operation on a resource also allows describe
//! on it. Applied on every broker once it applied the change (well within
//! a second). `acl remove` takes the same flags.
//!
//! `--user` names the entry's user: these commands log in as `$STRAND_USER`
//! with `$STRAND_PASSWORD`.
//!
//! `acl list [--user NAME] --output json`, a contract: a list of `{"user":
//! "alice", "operation": "produce", "resource_type": "queue",
//! "resource_name": "orders"}` (`resource_name` null for the cluster).

use clap::{Args, Subcommand};
use strand_client::{block_on, AclSpec, Admin};

#[derive(Subcommand, Debug)]
pub enum AclCommand {
    /// Allow a user an operation on a resource.
    Add(AclArgs),
    /// Take an entry away (exactly as it was added).
    Remove(AclArgs),
    /// Every entry, or one user's.
    List {
        /// Only this user's entries.
        #[arg(long, value_name = "NAME")]
        user: Option<String>,
    },
}

/// One entry's flags.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("resource").required(true).args(["queue", "queue_prefix", "group", "cluster"])))]
pub struct AclArgs {
    /// The user the entry is for.
    #[arg(long, value_name = "NAME")]
    pub user: String,
    /// produce, consume, describe, create, alter, delete or admin.
    #[arg(long, value_name = "OP")]
    pub operation: String,
    /// One queue.
    #[arg(long, value_name = "NAME")]
    pub queue: Option<String>,
    /// Every queue whose name starts with P.
    #[arg(long, value_name = "P")]
    pub queue_prefix: Option<String>,
    /// One consumer group.
    #[arg(long, value_name = "NAME")]
    pub group: Option<String>,
    /// The cluster (admin: nodes, users, ACLs; create: any queue).
    #[arg(long)]
    pub cluster: bool,
}

impl AclArgs {
    fn spec(self) -> AclSpec {
        let (resource_type, resource_name) = match (self.queue, self.queue_prefix, self.group) {
            (Some(q), _, _) => ("queue", q),
            (_, Some(p), _) => ("queue-prefix", p),
            (_, _, Some(g)) => ("group", g),
            _ => ("cluster", String::new()),
        };
        AclSpec {
            user: self.user,
            operation: self.operation,
            resource_type: resource_type.into(),
            resource_name,
        }
    }
}

/// Runs an ACL command; `json` selects machine output.
pub fn run(command: AclCommand, brokers: &str, json: bool) -> Result<(), String> {
    let admin = Admin::connect(brokers).map_err(|e| e.to_string())?;
    match command {
        AclCommand::Add(args) => {
            block_on(admin.alter_acl(&args.spec(), false)).map_err(|e| e.to_string())?;
            Ok(())
        }
        AclCommand::Remove(args) => {
            block_on(admin.alter_acl(&args.spec(), true)).map_err(|e| e.to_string())?;
            Ok(())
        }
        AclCommand::List { user } => {
            let acls = block_on(admin.list_acls(user.as_deref())).map_err(|e| e.to_string())?;
            if json {
                let list: Vec<_> = acls
                    .iter()
                    .map(|a| {
                        let name = (a.resource_type != "cluster").then_some(&a.resource_name);
                        serde_json::json!({
                            "user": a.user,
                            "operation": a.operation,
                            "resource_type": a.resource_type,
                            "resource_name": name,
                        })
                    })
                    .collect();
                out!("{}", serde_json::Value::Array(list));
                return Ok(());
            }
            out!("{:<24} {:<10} {:<13} NAME", "USER", "OPERATION", "RESOURCE");
            for a in acls {
                out!(
                    "{:<24} {:<10} {:<13} {}",
                    a.user,
                    a.operation,
                    a.resource_type,
                    a.resource_name
                );
            }
            Ok(())
        }
    }
}
