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

/// Keeps freed large buffers in the heap for reuse instead of returning them
/// to the kernel: reads hand out a fresh ~1 MiB buffer per fetch, and
/// faulting in new zeroed pages for each cost a quarter of the CPU time in
/// profiles. The broker's process does the same.
fn tune_allocator() {
    // SAFETY: mallopt only changes glibc malloc tunables; called before any
    // thread is started.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

fn main() {
    tune_allocator();
    let cli = Cli::parse();
    let result = match cli.scenario {
        Scenario::Storage(args) => storage::run(args),
    };
    if let Err(e) = result {
        eprintln!("strand-bench: {e}");
        std::process::exit(1);
    }
}
