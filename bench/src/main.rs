//! `strand-bench`: Strand's benchmark harness. Each scenario is a
//! subcommand that prints a human table and, as its last stdout line, one
//! JSON object with the figures scripts compare.
//!
//! Scenarios:
//! - `storage`: the storage engine against the raw disk, in one process
//!   (see [`storage`]).

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
}

fn main() {
    strand_storage::tune_process_allocator();
    let cli = Cli::parse();
    let result = match cli.scenario {
        Scenario::Storage(args) => storage::run(args),
    };
    if let Err(e) = result {
        eprintln!("strand-bench: {e}");
        std::process::exit(1);
    }
}
