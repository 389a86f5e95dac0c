//! The `strand` subcommands that talk to a running cluster, through
//! `strand-client`. Every one takes `--brokers HOST:PORT[,…]` (else
//! `$STRAND_BROKERS`, else `127.0.0.1:9400`), exits 0 on success and
//! otherwise prints one line to stderr and exits non-zero.

pub mod consume;
pub mod parse;
pub mod produce;
pub mod queue;

/// Where to reach the cluster: the flag, else `$STRAND_BROKERS`, else the
/// local default. The first reachable broker is used.
pub fn brokers(flag: Option<String>) -> Vec<String> {
    let list = flag
        .or_else(|| std::env::var("STRAND_BROKERS").ok())
        .unwrap_or_else(|| "127.0.0.1:9400".to_string());
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// An admin client on the first broker that accepts a connection.
pub fn admin(brokers: &[String]) -> Result<strand_client::Admin, String> {
    let mut last = "no broker given".to_string();
    for b in brokers {
        match strand_client::Admin::connect(b) {
            Ok(a) => return Ok(a),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}
