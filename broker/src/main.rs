//! The `strand` command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use strand_broker::config::{BrokerConfig, Overrides};

#[derive(Parser)]
#[command(name = "strand", version, about = "Strand: a partitioned, replicated message queue")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Manage queues on a running cluster.
    Queue {
        #[command(subcommand)]
        command: strand_broker::cli::queue::QueueCommand,
        /// Brokers to contact [default: $STRAND_BROKERS, else 127.0.0.1:9400].
        #[arg(long, global = true)]
        brokers: Option<String>,
        /// Output format: table (default) or json.
        #[arg(long, global = true, default_value = "table")]
        output: String,
    },
    /// Send stdin to a queue, one message per line.
    Produce {
        #[command(flatten)]
        args: strand_broker::cli::produce::ProduceArgs,
        /// Brokers to contact [default: $STRAND_BROKERS, else 127.0.0.1:9400].
        #[arg(long)]
        brokers: Option<String>,
    },
    /// Print a queue's messages as they arrive.
    Consume {
        #[command(flatten)]
        args: strand_broker::cli::consume::ConsumeArgs,
        /// Brokers to contact [default: $STRAND_BROKERS, else 127.0.0.1:9400].
        #[arg(long)]
        brokers: Option<String>,
    },
    /// Run a broker. Flags override the config file, which overrides defaults.
    Serve {
        /// TOML config file.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where queues, the controller's log and snapshots live [default: ./strand-data].
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Client port [default: 127.0.0.1:9400].
        #[arg(long)]
        listen: Option<SocketAddr>,
        /// Prometheus endpoint address [default: 127.0.0.1:9401] (served once the metrics land).
        #[arg(long)]
        metrics_listen: Option<SocketAddr>,
        /// Shards, one per core [default: every core].
        #[arg(long)]
        cores: Option<usize>,
        /// This node's id in the cluster [default: 1].
        #[arg(long)]
        node_id: Option<u64>,
        /// How long an idle shard polls before sleeping, µs [default: 50].
        #[arg(long)]
        spin_before_park_us: Option<u64>,
    },
}

fn main() -> ExitCode {
    strand_storage::tune_process_allocator();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn")),
        )
        .init();
    match cli.command {
        Command::Queue {
            command,
            brokers,
            output,
        } => {
            let json = match output.as_str() {
                "json" => true,
                "table" => false,
                other => {
                    eprintln!("strand: --output must be table or json, not {other:?}");
                    return ExitCode::from(2);
                }
            };
            let brokers = strand_broker::cli::brokers(brokers);
            finish(strand_broker::cli::queue::run(command, &brokers, json))
        }
        Command::Produce { args, brokers } => {
            let brokers = strand_broker::cli::brokers(brokers);
            let stdin = std::io::stdin();
            finish(strand_broker::cli::produce::run(args, &brokers, stdin.lock()))
        }
        Command::Consume { args, brokers } => {
            let brokers = strand_broker::cli::brokers(brokers);
            finish(strand_broker::cli::consume::run(args, &brokers))
        }
        Command::Serve {
            config,
            data_dir,
            listen,
            metrics_listen,
            cores,
            node_id,
            spin_before_park_us,
        } => {
            let flags = Overrides {
                data_dir,
                listen,
                metrics_listen,
                cores,
                node_id,
                spin_before_park_us,
            };
            let config = match BrokerConfig::load(config.as_deref(), &flags) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("strand: {e}");
                    return ExitCode::from(2);
                }
            };
            match strand_broker::server::run(config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("strand: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Exit 0, or print the one-line error and exit 1.
fn finish(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("strand: {e}");
            ExitCode::FAILURE
        }
    }
}
