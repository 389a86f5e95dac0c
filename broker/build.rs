//! Build facts for `strand --version` and the `strand_build_info` metric
//! (`strand_broker::build_info`): the git commit the binary was built
//! from (`unknown` outside a git checkout) and the UTC date of the build
//! (`$SOURCE_DATE_EPOCH` when set, for reproducible builds).

use std::path::Path;
use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty() && c.chars().all(|ch| ch.is_ascii_hexdigit()))
        .unwrap_or_else(|| "unknown".to_string());
    // `date` of the system (GNU: `-d @SECONDS` for $SOURCE_DATE_EPOCH).
    let mut date = Command::new("date");
    date.args(["-u", "+%F"]);
    if let Some(epoch) = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .filter(|s| s.parse::<u64>().is_ok())
    {
        date.arg(format!("-d@{epoch}"));
    }
    let day = date
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|d| d.len() == 10)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=STRAND_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=STRAND_BUILD_DATE={day}");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    // Again when HEAD moves (a commit, a checkout), not at every build.
    for path in ["../.git/HEAD", "../.git/refs/heads", "../.git/packed-refs"] {
        if Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
