//! `strand tune check|apply|script`: the host tuners of `strand-tune`
//! (tuning/), told about the broker this host will run by the same config
//! file and flags `strand serve` takes: its data directory, its shards and
//! their I/O memory, its free-space threshold.
//!
//! Exit status: 0 when every required tuner passes (after `apply`: passes
//! now), 1 when one fails, 2 for bad arguments or an unreadable config.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::config::{BrokerConfig, Overrides};
use crate::server::host::{self, Host};
use strand_tune::{report, Inputs, Probe, Root};

#[derive(Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TuneCommand {
    /// Print each tuner's current and recommended value; exit 1 when a
    /// required one fails.
    Check,
    /// Change what can be changed, then print the host as it is now and
    /// what could not be changed.
    Apply,
    /// Print the changes `apply` would make, as a shell script.
    Script,
}

#[derive(Args, Debug)]
pub struct TuneArgs {
    /// Read and write the host under this directory (tests: a fake
    /// /proc, /sys and /etc tree).
    #[arg(long, global = true, default_value = "/", value_name = "DIR")]
    pub root: PathBuf,
    /// The broker's TOML config file, as `strand serve --config`.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The broker's data directory [default: the config's, else ./strand-data].
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// The broker's shards [default: the config's, else what `serve` would run].
    #[arg(long, global = true, value_name = "N")]
    pub cores: Option<usize>,
    /// The systemd unit that starts the broker (its LimitMEMLOCK= and
    /// LimitNOFILE= are read when it exists).
    #[arg(
        long,
        global = true,
        default_value = "/etc/systemd/system/strand.service",
        value_name = "FILE"
    )]
    pub unit: PathBuf,
}

/// What the command ended with.
pub enum TuneExit {
    /// Every required tuner passes.
    Pass,
    /// A required tuner fails.
    RequiredFailed,
    /// Bad arguments or config (exit 2), with why.
    Usage(String),
}

pub fn run(command: TuneCommand, args: TuneArgs, json: bool) -> TuneExit {
    if !args.root.is_dir() {
        return TuneExit::Usage(format!("--root {}: not a directory", args.root.display()));
    }
    let flags = Overrides {
        data_dir: args.data_dir,
        cores: args.cores,
        ..Overrides::default()
    };
    let config = match BrokerConfig::load(args.config.as_deref(), &flags) {
        Ok(c) => c,
        Err(e) => return TuneExit::Usage(e.to_string()),
    };
    let data_dir = match std::path::absolute(&config.data_dir) {
        Ok(d) => d,
        Err(e) => return TuneExit::Usage(format!("data directory {}: {e}", config.data_dir.display())),
    };
    let shards = config
        .cores
        .unwrap_or_else(|| host::default_shards(&config, &Host::read()));
    let min_free_bytes = config.min_free_bytes;
    let inputs = Inputs {
        data_dir,
        shards,
        pinned_io_bytes: (shards as u64).saturating_mul(config.io_memory_bytes as u64),
        memlock_min_bytes: host::MEMLOCK_MIN,
        free_threshold: Box::new(move |total| crate::shard::disk::threshold(min_free_bytes, total)),
        unit_file: args.unit,
    };
    let root = Root::new(&args.root);
    let probe = Probe::for_root(&root);
    let findings = match command {
        TuneCommand::Check | TuneCommand::Script => {
            let findings = strand_tune::check(&root, &inputs, &probe);
            if command == TuneCommand::Script {
                out_part!("{}", strand_tune::script(&root, &findings));
            } else if json {
                out!("{}", report::json(&findings, None));
            } else {
                out_part!("{}", report::table(&findings, None));
            }
            findings
        }
        TuneCommand::Apply => {
            let (findings, outcomes): (Vec<_>, Vec<_>) = strand_tune::apply(&root, &inputs, &probe).into_iter().unzip();
            if json {
                out!("{}", report::json(&findings, Some(&outcomes)));
            } else {
                out_part!("{}", report::table(&findings, Some(&outcomes)));
            }
            findings
        }
    };
    if strand_tune::required_failed(&findings) {
        TuneExit::RequiredFailed
    } else {
        TuneExit::Pass
    }
}
