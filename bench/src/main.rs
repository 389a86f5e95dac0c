//! `strand-bench`: Strand's benchmark harness. Each scenario is a
//! subcommand that prints a human table and, as its last stdout line, one
//! JSON object with the figures scripts compare.
//!
//! Scenarios:
//! - `baseline`: this host's limits (disk, fdatasync, loopback) — see
//!   [`baseline`].
//! - `produce`, `consume`, `e2e`: load against running brokers through
//!   strand-client, every knob exposed (see [`load`]).
//! - `suite`: a broker of its own, the baseline and the standard scenarios,
//!   a markdown report (see [`suite`]).
//! - `storage`: the storage engine against the raw disk, in one process
//!   (see [`storage`]).
//! - `raw-produce`: a running broker over the raw protocol, beside the raw
//!   disk (see [`raw_produce`]).
//! - `client`: the producer's small-message latency and batched
//!   throughput against the raw protocol (see [`client`]).

mod baseline;
mod client;
mod load;
mod raw_produce;
mod report;
mod storage;
mod suite;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "strand-bench", about = "Strand benchmark harness")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
    /// PEM CA of the brokers' certificates: the scenarios that go through
    /// strand-client (produce, consume, e2e, client) talk TLS [default:
    /// $STRAND_TLS_CA].
    #[arg(long = "tls-ca", global = true, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate (mTLS; with --tls-key).
    #[arg(long = "tls-cert", global = true, value_name = "FILE")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long = "tls-key", global = true, value_name = "FILE")]
    tls_key: Option<std::path::PathBuf>,
    /// Log in as this user (SASL SCRAM), the password in $STRAND_PASSWORD
    /// [default: $STRAND_USER].
    #[arg(long = "user", global = true, value_name = "NAME")]
    user: Option<String>,
}

#[derive(Subcommand)]
enum Scenario {
    /// This host's limits: O_DIRECT write/read, fdatasync latency, loopback TCP.
    Baseline(baseline::Args),
    /// Produce load (closed loop, or open loop with --rate) through strand-client.
    Produce(load::Args),
    /// Consume a queue from its earliest record.
    Consume(load::Args),
    /// Produce → consume latency at a fixed --rate.
    E2e(load::Args),
    /// Start a broker, measure the baseline and the standard scenarios, report.
    Suite(suite::Args),
    /// Raw O_DIRECT writes and reads vs the partition log (append with
    /// fsync=always, small-batch commit latency, read-back).
    Storage(storage::Args),
    /// Produce throughput and request latency against a running broker over
    /// the raw protocol, beside the raw O_DIRECT write limit measured in the
    /// same run.
    RawProduce(raw_produce::Args),
    /// What an application gets through strand-client's producer: small
    /// message latency at a fixed rate (open loop) and batched throughput
    /// beside the raw-protocol figure.
    Client(client::Args),
}

fn main() {
    strand_storage::tune_process_allocator();
    let cli = Cli::parse();
    let files = strand_client::tls::TlsFiles {
        ca: cli.tls_ca.clone(),
        cert: cli.tls_cert.clone(),
        key: cli.tls_key.clone(),
    };
    if let Err(e) = files.or_env().install() {
        eprintln!("strand-bench: TLS: {e}");
        std::process::exit(2);
    }
    match strand_client::sasl::Credentials::from_env(cli.user.as_deref()) {
        Ok(credentials) => strand_client::sasl::set_default(credentials),
        Err(e) => {
            eprintln!("strand-bench: {e}");
            std::process::exit(2);
        }
    }
    let result = match cli.scenario {
        Scenario::Storage(args) => storage::run(args),
        Scenario::Baseline(args) => baseline::run(args),
        Scenario::Produce(args) => load::run("produce", args),
        Scenario::Consume(args) => load::run("consume", args),
        Scenario::E2e(args) => load::run("e2e", args),
        Scenario::Suite(args) => suite::run(args),
        Scenario::RawProduce(args) => raw_produce::run(args),
        Scenario::Client(args) => client::run(args),
    };
    if let Err(e) = result {
        eprintln!("strand-bench: {e}");
        std::process::exit(1);
    }
}
