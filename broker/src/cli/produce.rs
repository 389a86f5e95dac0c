//! `strand produce QUEUE`: one message per stdin line.
//!
//! Lines are read as bytes (not necessarily UTF-8); the trailing `\n` (and a
//! `\r` before it) is not part of the message. With `--key-separator SEP`,
//! the bytes before the first SEP are the key and the rest the value; a line
//! without SEP has no key. The command exits once every line is
//! acknowledged, printing `produced N` to stderr; if any line failed it says
//! how many and why (the first failure) and exits non-zero.

use std::collections::VecDeque;
use std::io::BufRead;
use std::time::Duration;

use clap::Args;
use strand_client::{block_on, ClientError, Delivery, Producer, ProducerConfig};

use super::parse;

#[derive(Args, Debug)]
pub struct ProduceArgs {
    /// The queue to send to.
    pub queue: String,
    /// When a message counts as sent: 0 (no answer), 1 (the leader stored
    /// it) or all (every in-sync replica has it).
    #[arg(long, default_value = "all", value_name = "0|1|all")]
    pub acks: String,
    /// Text before the first SEP on a line is the message's key (messages
    /// with one key keep their order); lines without it have no key.
    #[arg(long, value_name = "SEP")]
    pub key_separator: Option<String>,
    /// A batch is sent once it holds this much (e.g. 256KiB, 1MiB).
    #[arg(long, default_value = "256KiB", value_name = "SIZE")]
    pub batch_bytes: String,
    /// The longest a message waits for its batch to fill, in ms.
    #[arg(long, default_value_t = 0, value_name = "MS")]
    pub linger_ms: u64,
}

/// Splits a line into (key, value) at the first `sep`.
pub fn split_key<'a>(line: &'a [u8], sep: Option<&[u8]>) -> (Option<&'a [u8]>, &'a [u8]) {
    let Some(sep) = sep.filter(|s| !s.is_empty()) else {
        return (None, line);
    };
    match line.windows(sep.len()).position(|w| w == sep) {
        Some(at) => (Some(&line[..at]), &line[at + sep.len()..]),
        None => (None, line),
    }
}

/// Counts outcomes, remembering the first failure.
#[derive(Default)]
struct Tally {
    produced: u64,
    failed: u64,
    first_error: Option<String>,
}

impl Tally {
    fn record(&mut self, line: u64, result: Result<(), ClientError>) {
        match result {
            Ok(()) => self.produced += 1,
            Err(e) => {
                self.failed += 1;
                self.first_error.get_or_insert_with(|| format!("line {line}: {e}"));
            }
        }
    }
}

pub fn run(args: ProduceArgs, brokers: &str, input: impl BufRead) -> Result<(), String> {
    let batch_bytes = parse::bytes(&args.batch_bytes)?
        .ok_or("--batch-bytes must be a size")?
        .min(u64::from(u32::MAX)) as usize;
    let config = ProducerConfig {
        acks: args.acks.parse()?,
        batch_bytes,
        linger: Duration::from_millis(args.linger_ms),
        ..ProducerConfig::default()
    };
    let producer = Producer::new(brokers, config).map_err(|e| e.to_string())?;
    let sep = args.key_separator.as_deref().map(str::as_bytes);
    let mut tally = Tally::default();
    // Deliveries in line order; finished ones are counted as we go so a long
    // input does not keep them all.
    let mut waiting: VecDeque<(u64, Delivery)> = VecDeque::new();
    let mut input = input;
    let mut line = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        let n = input
            .read_until(b'\n', &mut line)
            .map_err(|e| format!("reading stdin: {e}"))?;
        if n == 0 {
            break;
        }
        number += 1;
        if line.last() == Some(&b'\n') {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
        }
        let (key, value) = split_key(&line, sep);
        match block_on(producer.enqueue(&args.queue, key, value, &[])) {
            Ok(d) => waiting.push_back((number, d)),
            // The queue is not there (or the cluster is not): no line can go.
            Err(e) if matches!(e.code(), Some(strand_wire::ErrorCode::UnknownQueue)) || e.is_io() => {
                return Err(e.to_string());
            }
            Err(e) => tally.record(number, Err(e)),
        }
        while let Some((n, d)) = waiting.front_mut() {
            let n = *n;
            match block_on(futures_lite::future::poll_once(d)) {
                Some(r) => {
                    waiting.pop_front();
                    tally.record(n, r.map(|_| ()));
                }
                None => break,
            }
        }
    }
    for (n, d) in waiting {
        tally.record(n, block_on(d).map(|_| ()));
    }
    eprintln!("produced {}", tally.produced);
    match tally.first_error {
        None => Ok(()),
        Some(first) => Err(format!("{} of {number} lines failed; first: {first}", tally.failed)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_at_the_first_separator() {
        assert_eq!(split_key(b"k:v:w", Some(b":")), (Some(&b"k"[..]), &b"v:w"[..]));
        assert_eq!(split_key(b"no-sep", Some(b":")), (None, &b"no-sep"[..]));
        assert_eq!(split_key(b":v", Some(b":")), (Some(&b""[..]), &b"v"[..]));
        assert_eq!(split_key(b"a::b", Some(b"::")), (Some(&b"a"[..]), &b"b"[..]));
        assert_eq!(split_key(b"a:b", None), (None, &b"a:b"[..]));
    }

    #[test]
    fn acks_parse() {
        use strand_client::Acks;
        assert_eq!("all".parse::<Acks>(), Ok(Acks::All));
        assert_eq!("-1".parse::<Acks>(), Ok(Acks::All));
        assert_eq!("1".parse::<Acks>(), Ok(Acks::Leader));
        assert_eq!("0".parse::<Acks>(), Ok(Acks::None));
        assert!("2".parse::<Acks>().is_err());
        assert!("interval".parse::<strand_client::FsyncSpec>().is_ok());
        assert!("sometimes".parse::<strand_client::FsyncSpec>().is_err());
    }
}
