//! `strand tune`: reads how a host is set up for a Strand broker, says what
//! to change and why, and changes what it can.
//!
//! Every tuner is a pure reading of the machine through a [`Root`] (`/` on
//! a host, a directory with a fake `/proc`, `/sys` and `/etc` in tests,
//! `--root DIR`). It returns one [`Finding`]: the current value, the
//! recommended one, whether it passes, whether the broker needs it
//! (`required`), and the [`Fix`] that would make it pass. Nothing in a
//! tuner writes: [`apply`] is the one place that changes the host (it runs
//! the failing findings' [`Action`]s, then reads everything again), and
//! [`script`] prints the same actions as shell commands instead.
//!
//! Runs in: the `strand tune` process, once. Nothing here runs inside the
//! broker; the broker binary only supplies the [`Inputs`] from its config.
//!
//! The tuner names, and the JSON that [`report::json`] writes from the
//! findings (`{"tuners": [{"name", "current", "recommended", "pass",
//! "required", "why"}]}`), are a contract: the Ansible `tune` role and
//! operators' scripts read them.

pub mod report;
pub mod root;
mod tuners;

use std::path::PathBuf;

pub use root::Root;

/// What the tuners need to know of the broker this host will run.
pub struct Inputs {
    /// The broker's data directory, absolute (it need not exist yet: the
    /// disk tuners then look at the nearest directory above it that does).
    pub data_dir: PathBuf,
    /// Shards the broker will run (one pinned thread each).
    pub shards: usize,
    /// Memory all shards together register with io_uring at start
    /// (`shards × io_memory_bytes`).
    pub pinned_io_bytes: u64,
    /// The locked-memory limit below which no shard starts.
    pub memlock_min_bytes: u64,
    /// The free space below which the broker refuses produce, given the
    /// file system's size (the broker's own rule, `min_free_bytes`).
    pub free_threshold: Box<dyn Fn(u64) -> u64>,
    /// The systemd unit that starts the broker: its `LimitMEMLOCK=` and
    /// `LimitNOFILE=` are what the broker gets, when it exists.
    pub unit_file: PathBuf,
}

/// Whether to create an io_uring instance to see that the kernel allows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Create one now (only meaningful when the root is `/`).
    Live,
    /// Do not: the root is not this machine.
    Skipped,
    /// The outcome is given (tests).
    Given(Result<(), String>),
}

impl Probe {
    /// [`Probe::Live`] on the real root, else [`Probe::Skipped`].
    pub fn for_root(root: &Root) -> Probe {
        if root.is_live() {
            Probe::Live
        } else {
            Probe::Skipped
        }
    }
}

/// One tuner's reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Stable name (part of the JSON contract).
    pub name: &'static str,
    /// One line: why it matters to a broker.
    pub why: &'static str,
    pub current: String,
    pub recommended: String,
    pub pass: bool,
    /// A required finding that fails makes `check` exit non-zero: the
    /// broker does not start, or does not keep what it acknowledged.
    pub required: bool,
    /// What would make it pass (only meaningful when it fails).
    pub fix: Fix,
}

/// How a failing finding is fixed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fix {
    /// Nothing to do (it passes), or nothing anyone can do from here.
    None,
    /// Writes `strand tune apply` makes.
    Actions(Vec<Action>),
    /// What an operator must change; `apply` says it could not.
    Manual(String),
}

/// One change to the host, through the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write `value` into the file at `path` (a sysctl, a sysfs knob).
    Write { path: String, value: String },
    /// Create a directory and its parents.
    CreateDir { path: String },
}

/// Every tuner's finding, in report order.
pub fn check(root: &Root, inputs: &Inputs, probe: &Probe) -> Vec<Finding> {
    tuners::all(root, inputs, probe)
}

/// What `apply` did about one finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// It passed already.
    Unchanged,
    /// Its actions ran.
    Changed,
    /// An action failed, with why.
    Failed(String),
    /// It needs an operator (the fix's words).
    CouldNot(String),
}

/// Runs the fixes of every failing finding, then reads the host again.
/// Returns the findings after, each with what was done about it.
pub fn apply(root: &Root, inputs: &Inputs, probe: &Probe) -> Vec<(Finding, Outcome)> {
    let before = check(root, inputs, probe);
    let outcomes: Vec<(&'static str, Outcome)> = before
        .iter()
        .map(|f| {
            let outcome = match (&f.fix, f.pass) {
                (_, true) => Outcome::Unchanged,
                (Fix::None, false) => Outcome::CouldNot("nothing strand tune can change".into()),
                (Fix::Manual(what), false) => Outcome::CouldNot(what.clone()),
                (Fix::Actions(actions), false) => match actions.iter().try_for_each(|a| run(root, a)) {
                    Ok(()) => Outcome::Changed,
                    Err(e) => Outcome::Failed(e),
                },
            };
            (f.name, outcome)
        })
        .collect();
    let after = check(root, inputs, probe);
    after
        .into_iter()
        .map(|f| {
            let outcome = outcomes
                .iter()
                .find(|(name, _)| *name == f.name)
                .map_or(Outcome::Unchanged, |(_, o)| o.clone());
            (f, outcome)
        })
        .collect()
}

fn run(root: &Root, action: &Action) -> Result<(), String> {
    match action {
        Action::Write { path, value } => root.write(path, value).map_err(|e| format!("writing {path}: {e}")),
        Action::CreateDir { path } => root.create_dir(path).map_err(|e| format!("creating {path}: {e}")),
    }
}

/// The fixes of the failing findings as a shell script (paths under the
/// root), and what it cannot do as comments.
pub fn script(root: &Root, findings: &[Finding]) -> String {
    let mut out = String::from("#!/bin/sh\n# strand tune script: the changes `strand tune apply` would make\nset -e\n");
    for f in findings.iter().filter(|f| !f.pass) {
        out.push_str(&format!(
            "\n# {}: {} (recommended: {})\n",
            f.name, f.current, f.recommended
        ));
        match &f.fix {
            Fix::None => out.push_str("# nothing strand tune can change\n"),
            Fix::Manual(what) => out.push_str(&format!("# by hand: {what}\n")),
            Fix::Actions(actions) => {
                for a in actions {
                    match a {
                        Action::Write { path, value } => out.push_str(&format!(
                            "echo {} > {}\n",
                            shell_quote(value),
                            shell_quote(&root.display(path))
                        )),
                        Action::CreateDir { path } => {
                            out.push_str(&format!("mkdir -p {}\n", shell_quote(&root.display(path))))
                        }
                    }
                }
            }
        }
    }
    out
}

/// `'it'\''s'`: one shell word whatever it holds.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-:,%".contains(&b)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Whether a required finding fails (`check` exits non-zero).
pub fn required_failed(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.required && !f.pass)
}

#[cfg(test)]
mod tests;
