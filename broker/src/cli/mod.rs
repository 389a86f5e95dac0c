//! The `strand` subcommands that talk to a running cluster, through
//! `strand-client`. Every one takes `--brokers HOST:PORT[,…]` (else
//! `$STRAND_BROKERS`, else `127.0.0.1:9400`), exits 0 on success and
//! otherwise prints one line to stderr and exits non-zero. Output goes
//! through [`out!`]: a reader that stops early (`strand queue list | head
//! -1`) ends the command quietly with exit 0, as `consume` does.

/// `println!` for the client commands, where a closed stdout ends the
/// command quietly (exit 0) instead of panicking (exit 101).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*), true)
    };
}

/// `print!` likewise (no newline).
macro_rules! out_part {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*), false)
    };
}

pub mod acl;
pub mod cluster;
pub mod consume;
pub mod dlq;
pub mod group;
pub mod node;
pub mod parse;
pub mod produce;
pub mod queue;
pub mod top;
pub mod tune;
pub mod user;

/// Writes to stdout. A reader gone (EPIPE, as when piped into `head`)
/// ends the process at once with exit 0: what it wanted it has; any
/// other failure to write ends it with exit 1 and says why.
pub fn write_stdout(args: std::fmt::Arguments<'_>, newline: bool) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| if newline { out.write_all(b"\n") } else { Ok(()) })
        .and_then(|()| out.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("strand: writing to stdout: {e}");
            std::process::exit(1)
        }
    }
}

/// The `--brokers`, TLS and login flags every client command takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Brokers {
    #[command(flatten)]
    pub reach: Reach,
    /// Log in as this user (SASL SCRAM), with the password in
    /// $STRAND_PASSWORD [default: $STRAND_USER; neither: no login].
    #[arg(long = "user", global = true, value_name = "NAME")]
    pub user: Option<String>,
}

impl Brokers {
    /// [`Reach::list`], logging in as `--user` (else `$STRAND_USER`).
    pub fn list(self) -> String {
        self.reach.list(self.user.as_deref())
    }
}

/// Where the cluster is and how to reach it (`--brokers` and TLS): the
/// flags of [`Brokers`] but the login's, for commands whose `--user` means
/// something else (`strand acl`: they log in as `$STRAND_USER`).
#[derive(clap::Args, Debug, Clone)]
pub struct Reach {
    /// Brokers to contact [default: $STRAND_BROKERS, else 127.0.0.1:9400].
    #[arg(long = "brokers", global = true, value_name = "HOST:PORT[,HOST:PORT...]")]
    pub flag: Option<String>,
    /// PEM CA of the brokers' certificates: talk TLS [default:
    /// $STRAND_TLS_CA; neither: plaintext].
    #[arg(long = "tls-ca", global = true, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate, for brokers that require one (mTLS; with
    /// --tls-key).
    #[arg(long = "tls-cert", global = true, value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long = "tls-key", global = true, value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
}

impl Reach {
    /// Where to reach the cluster (`HOST:PORT[,HOST:PORT...]`): the flag,
    /// else `$STRAND_BROKERS`, else the local default. The client library
    /// parses it and uses the first broker that answers. Also turns TLS on
    /// for every connection the command makes when a CA is given, and the
    /// login as `user` (else `$STRAND_USER`) with `$STRAND_PASSWORD` (a bad
    /// file or a user without a password ends the command with a line
    /// naming it, exit status 2).
    pub fn list(self, user: Option<&str>) -> String {
        let files = strand_client::tls::TlsFiles {
            ca: self.tls_ca,
            cert: self.tls_cert,
            key: self.tls_key,
        };
        if let Err(e) = files.or_env().install() {
            eprintln!("strand: TLS: {e}");
            std::process::exit(2);
        }
        match strand_client::sasl::Credentials::from_env(user) {
            Ok(credentials) => strand_client::sasl::set_default(credentials),
            Err(e) => {
                eprintln!("strand: {e}");
                std::process::exit(2);
            }
        }
        self.flag
            .or_else(|| std::env::var("STRAND_BROKERS").ok())
            .unwrap_or_else(|| "127.0.0.1:9400".to_string())
    }
}
