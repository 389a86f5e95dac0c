//! What this binary is: its version, the git commit it was built from and
//! the day it was built (set by `broker/build.rs`). `strand --version`
//! prints [`LONG_VERSION`]; the metrics endpoint serves
//! `strand_build_info{version,commit} 1`.

/// The package version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit it was built from, 12 hex digits (`unknown` when built
/// outside a git checkout).
pub const COMMIT: &str = env!("STRAND_GIT_COMMIT");
/// The UTC day it was built, `YYYY-MM-DD`.
pub const BUILD_DATE: &str = env!("STRAND_BUILD_DATE");
/// `0.1.0 (commit 0123456789ab, built 2026-12-05)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("STRAND_GIT_COMMIT"),
    ", built ",
    env!("STRAND_BUILD_DATE"),
    ")"
);
