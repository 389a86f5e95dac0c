//! The `strand` subcommands that talk to a running cluster, through
//! `strand-client`. Every one takes `--brokers HOST:PORT[,…]` (else
//! `$STRAND_BROKERS`, else `127.0.0.1:9400`), exits 0 on success and
//! otherwise prints one line to stderr and exits non-zero.

pub mod consume;
pub mod dlq;
pub mod group;
pub mod parse;
pub mod produce;
pub mod queue;
pub mod top;

/// The `--brokers` flag every client command takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Brokers {
    /// Brokers to contact [default: $STRAND_BROKERS, else 127.0.0.1:9400].
    #[arg(long = "brokers", global = true, value_name = "HOST:PORT[,HOST:PORT...]")]
    pub flag: Option<String>,
}

impl Brokers {
    /// Where to reach the cluster (`HOST:PORT[,HOST:PORT...]`): the flag,
    /// else `$STRAND_BROKERS`, else the local default. The client library
    /// parses it and uses the first broker that answers.
    pub fn list(self) -> String {
        self.flag
            .or_else(|| std::env::var("STRAND_BROKERS").ok())
            .unwrap_or_else(|| "127.0.0.1:9400".to_string())
    }
}
