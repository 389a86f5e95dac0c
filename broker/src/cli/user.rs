//! `strand user create NAME | delete NAME | list`: the cluster's SASL users
//! (`--auth scram`).
//!
//! `user create NAME` reads the password from standard input (its first
//! line; typed, or piped from a secret store), never from a flag, derives
//! the salted SCRAM-SHA-256 and SCRAM-SHA-512 keys here and sends only
//! those; run again, it changes the password. With authentication on,
//! only superusers and users allowed `admin` on the cluster (`strand acl`)
//! may manage users; deleting a user removes its ACLs.
//!
//! `user list --output json`, a contract: a list of `{"name": "alice",
//! "mechanisms": ["SCRAM-SHA-512", "SCRAM-SHA-256"], "superuser": false}`.

use std::io::BufRead;

use clap::Subcommand;
use strand_client::{block_on, Admin};

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Create user NAME, or change its password (read from standard input).
    Create { name: String },
    /// Delete user NAME (its open connections' next requests are refused).
    Delete { name: String },
    /// Every user, its mechanisms, and whether it is a superuser.
    List,
}

/// Runs a user command; `json` selects machine output.
pub fn run(command: UserCommand, brokers: &str, json: bool) -> Result<(), String> {
    match command {
        UserCommand::Create { name } => {
            let mut password = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut password)
                .map_err(|e| format!("reading the password from standard input: {e}"))?;
            let password = password.trim_end_matches(['\n', '\r']);
            if password.is_empty() {
                return Err("no password on standard input (its first line is the password)".into());
            }
            let admin = Admin::connect(brokers).map_err(|e| e.to_string())?;
            block_on(admin.put_user(&name, password)).map_err(|e| e.to_string())?;
            if !json {
                out!("user {name:?} saved");
            }
            Ok(())
        }
        UserCommand::Delete { name } => {
            let admin = Admin::connect(brokers).map_err(|e| e.to_string())?;
            block_on(admin.delete_user(&name)).map_err(|e| e.to_string())?;
            if !json {
                out!("user {name:?} deleted");
            }
            Ok(())
        }
        UserCommand::List => {
            let admin = Admin::connect(brokers).map_err(|e| e.to_string())?;
            let users = block_on(admin.list_users()).map_err(|e| e.to_string())?;
            if json {
                let list: Vec<_> = users
                    .iter()
                    .map(|u| {
                        serde_json::json!({
                            "name": u.name,
                            "mechanisms": u.mechanisms,
                            "superuser": u.superuser,
                        })
                    })
                    .collect();
                out!("{}", serde_json::Value::Array(list));
                return Ok(());
            }
            out!("{:<32} {:<10} MECHANISMS", "NAME", "SUPERUSER");
            for u in users {
                let superuser = if u.superuser { "yes" } else { "no" };
                out!("{:<32} {:<10} {}", u.name, superuser, u.mechanisms.join(","));
            }
            Ok(())
        }
    }
}
