//! `strand-bench`: Strand's benchmark harness. Each scenario is a
//! subcommand that prints a human table and, as its last stdout line, one
//! JSON object with the figures scripts compare.
//!
//! Scenarios:
//! - `storage`: the storage engine against the raw disk, in one process
//!   (see [`storage`]).
//! - `produce`: a running broker over the raw protocol, beside the raw disk
//!   (see [`produce`]).

mod client;
mod produce;
mod report;
mod storage;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "strand-bench", about = "Strand benchmark harness")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Raw O_DIRECT writes and reads vs the partition log (append with
    /// fsync=always, small-batch commit latency, read-back).
    Storage(storage::Args),
    /// Produce throughput and request latency against a running broker,
    /// beside the raw O_DIRECT write limit measured in the same run.
    Produce(produce::Args),
    /// What an application gets through strand-client's producer: small
    /// message latency at a fixed rate (open loop) and batched throughput
    /// beside the raw-protocol figure.
    Client(client::Args),
}

fn main() {
    strand_storage::tune_process_allocator();
    let cli = Cli::parse();
    let result = match cli.scenario {
        Scenario::Storage(args) => storage::run(args),
        Scenario::Produce(args) => produce::run(args),
        Scenario::Client(args) => client::run(args),
    };
    if let Err(e) = result {
        eprintln!("strand-bench: {e}");
        std::process::exit(1);
    }
}
