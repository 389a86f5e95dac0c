//! The `strand` command.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use strand_broker::config::{BrokerConfig, Overrides};

#[derive(Parser)]
#[command(
    name = "strand",
    version = strand_broker::build_info::LONG_VERSION,
    about = "Strand: a partitioned, replicated message queue"
)]
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
        #[command(flatten)]
        brokers: strand_broker::cli::Brokers,
        /// Output format: table (for people) or json (one document).
        #[arg(long, global = true, default_value = "table", value_name = "table|json")]
        output: String,
    },
    /// The cluster's controller leader and brokers.
    Cluster {
        #[command(subcommand)]
        command: strand_broker::cli::cluster::ClusterCommand,
        #[command(flatten)]
        brokers: strand_broker::cli::Brokers,
        /// Output format: table (for people) or json (one document).
        #[arg(long, global = true, default_value = "table", value_name = "table|json")]
        output: String,
    },
    /// What each user may do (ACLs, with --auth scram).
    Acl {
        #[command(subcommand)]
        command: strand_broker::cli::acl::AclCommand,
        /// (`--user` names the entry's user: the command logs in as
        /// $STRAND_USER with $STRAND_PASSWORD.)
        #[command(flatten)]
        brokers: strand_broker::cli::Reach,
        /// Output format: table (for people) or json (one document).
        #[arg(long, global = true, default_value = "table", value_name = "table|json")]
        output: String,
    },
    /// The cluster's users (SASL SCRAM logins, with --auth scram).
    User {
        #[command(subcommand)]
        command: strand_broker::cli::user::UserCommand,
        #[command(flatten)]
        brokers: strand_broker::cli::Brokers,
        /// Output format: table (for people) or json (one document).
        #[arg(long, global = true, default_value = "table", value_name = "table|json")]
        output: String,
    },
    /// The brokers, and maintenance: drain a node of its leaderships.
    Node {
        #[command(subcommand)]
        command: strand_broker::cli::node::NodeCommand,
        #[command(flatten)]
        brokers: strand_broker::cli::Brokers,
        /// Output format: table (for people) or json (one document).
        #[arg(long, global = true, default_value = "table", value_name = "table|json")]
        output: String,
    },
    /// Inspect, reset and delete consumer groups.
    Group {
        #[command(subcommand)]
        command: strand_broker::cli::group::GroupCommand,
        #[command(flatten)]
        brokers: strand_broker::cli::Brokers,
        /// Output format: table (for people) or json (one document).
        #[arg(long, global = true, default_value = "table", value_name = "table|json")]
        output: String,
    },
    /// List and replay a queue's dead-letter queue (QUEUE.dlq).
    Dlq {
        #[command(subcommand)]
        command: strand_broker::cli::dlq::DlqCommand,
        #[command(flatten)]
        brokers: strand_broker::cli::Brokers,
        /// Output format: table (for people) or json (one document).
        #[arg(long, global = true, default_value = "table", value_name = "table|json")]
        output: String,
    },
    /// Send stdin to a queue, one message per line.
    Produce {
        #[command(flatten)]
        args: strand_broker::cli::produce::ProduceArgs,
        #[command(flatten)]
        brokers: strand_broker::cli::Brokers,
    },
    /// Print a queue's messages as they arrive.
    Consume {
        #[command(flatten)]
        args: strand_broker::cli::consume::ConsumeArgs,
        #[command(flatten)]
        brokers: strand_broker::cli::Brokers,
    },
    /// A live view of per-queue rates, group lag and its trend, hot
    /// partitions and dead-letter growth, from the brokers' metrics.
    Top {
        #[command(flatten)]
        args: strand_broker::cli::top::TopArgs,
    },
    /// Check this host's settings for a broker (io_uring, limits, CPUs,
    /// disks, memory, network) and change what can be changed.
    Tune {
        #[command(subcommand)]
        command: strand_broker::cli::tune::TuneCommand,
        #[command(flatten)]
        args: strand_broker::cli::tune::TuneArgs,
        /// Output format: table (for people) or json (one document).
        #[arg(long, global = true, default_value = "table", value_name = "table|json")]
        output: String,
    },
    /// Run a broker. Flags override the config file, which overrides defaults.
    Serve {
        /// TOML config file (its keys: broker/src/config.rs).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Log lines as `human` text or `json` objects (one per line), on
        /// stderr; levels from RUST_LOG (info when unset).
        #[arg(long, default_value = "human", value_name = "human|json")]
        log_format: String,
        #[command(flatten)]
        flags: Overrides,
    },
}

fn main() -> ExitCode {
    strand_storage::tune_process_allocator();
    let cli = Cli::parse();
    let json_logs = match &cli.command {
        Command::Serve { log_format, .. } => match log_format.as_str() {
            "json" => true,
            "human" => false,
            other => {
                eprintln!("strand: --log-format must be human or json, not {other:?}");
                return ExitCode::from(2);
            }
        },
        _ => false,
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"))
        // glommio's warning when io_uring refuses to register a shard's I/O
        // memory is five lines of debug output per shard; `serve` checks the
        // locked-memory limit itself and says it once, with what it costs.
        .add_directive("glommio::sys::uring=error".parse().expect("a valid directive"));
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: never in files, pipes or
        // journald, nor with NO_COLOR set (no-color.org).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .with_env_filter(filter);
    if json_logs {
        logs.json().init();
    } else {
        logs.init();
    }
    match cli.command {
        Command::Queue {
            command,
            brokers,
            output,
        } => match json_output(&output) {
            Ok(json) => finish(strand_broker::cli::queue::run(command, &brokers.list(), json)),
            Err(code) => code,
        },
        Command::Cluster {
            command,
            brokers,
            output,
        } => match json_output(&output) {
            Ok(json) => finish(strand_broker::cli::cluster::run(command, &brokers.list(), json)),
            Err(code) => code,
        },
        Command::Acl {
            command,
            brokers,
            output,
        } => match json_output(&output) {
            Ok(json) => finish(strand_broker::cli::acl::run(command, &brokers.list(None), json)),
            Err(code) => code,
        },
        Command::User {
            command,
            brokers,
            output,
        } => match json_output(&output) {
            Ok(json) => finish(strand_broker::cli::user::run(command, &brokers.list(), json)),
            Err(code) => code,
        },
        Command::Node {
            command,
            brokers,
            output,
        } => match json_output(&output) {
            Ok(json) => finish(strand_broker::cli::node::run(command, &brokers.list(), json)),
            Err(code) => code,
        },
        Command::Group {
            command,
            brokers,
            output,
        } => match json_output(&output) {
            Ok(json) => finish(strand_broker::cli::group::run(command, &brokers.list(), json)),
            Err(code) => code,
        },
        Command::Dlq {
            command,
            brokers,
            output,
        } => match json_output(&output) {
            Ok(json) => finish(strand_broker::cli::dlq::run(command, &brokers.list(), json)),
            Err(code) => code,
        },
        Command::Produce { args, brokers } => {
            let stdin = std::io::stdin();
            finish(strand_broker::cli::produce::run(args, &brokers.list(), stdin.lock()))
        }
        Command::Consume { args, brokers } => finish(strand_broker::cli::consume::run(args, &brokers.list())),
        Command::Top { args } => finish(strand_broker::cli::top::run(args)),
        Command::Tune { command, args, output } => match json_output(&output) {
            Ok(json) => match strand_broker::cli::tune::run(command, args, json) {
                strand_broker::cli::tune::TuneExit::Pass => ExitCode::SUCCESS,
                strand_broker::cli::tune::TuneExit::RequiredFailed => ExitCode::FAILURE,
                strand_broker::cli::tune::TuneExit::Usage(e) => {
                    eprintln!("strand: {e}");
                    ExitCode::from(2)
                }
            },
            Err(code) => code,
        },
        Command::Serve { config, flags, .. } => {
            let config = match BrokerConfig::load(config.as_deref(), &flags) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("strand: {e}");
                    return ExitCode::from(2);
                }
            };
            match strand_broker::server::run(config) {
                Ok(()) => ExitCode::SUCCESS,
                // Asked to stop: done, as after a stop once ready.
                Err(e @ strand_broker::server::ServeError::Interrupted) => {
                    eprintln!("strand: {e}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("strand: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Whether `--output` asks for JSON; exit code 2 for a bad value.
fn json_output(output: &str) -> Result<bool, ExitCode> {
    match output {
        "json" => Ok(true),
        "table" => Ok(false),
        other => {
            eprintln!("strand: --output must be table or json, not {other:?}");
            Err(ExitCode::from(2))
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
