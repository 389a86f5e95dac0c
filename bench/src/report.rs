//! Printing results: a fixed-width table for people, one JSON line for
//! scripts, and medians over repeated runs.

use hdrhistogram::Histogram;

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Latency {
    /// Percentiles of a histogram recorded in nanoseconds.
    pub fn from_nanos(h: &Histogram<u64>) -> Latency {
        let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Latency {
            p50_us: us(0.50),
            p99_us: us(0.99),
            p999_us: us(0.999),
            max_us: h.max() as f64 / 1000.0,
        }
    }
}

impl Latency {
    /// Table rows: p50 under `title`, then p99, p99.9 and max.
    pub fn rows<'a>(&self, title: &'a str) -> [(&'a str, f64, &'a str); 4] {
        [
            (title, self.p50_us, "us"),
            ("  p99", self.p99_us, "us"),
            ("  p99.9", self.p999_us, "us"),
            ("  max", self.max_us, "us"),
        ]
    }

    /// JSON fields `<prefix>p50_us`, `<prefix>p99_us`, `<prefix>p999_us`,
    /// `<prefix>max_us`, rounded to two decimals.
    pub fn json(&self, prefix: &str) -> serde_json::Map<String, serde_json::Value> {
        [
            ("p50_us", self.p50_us),
            ("p99_us", self.p99_us),
            ("p999_us", self.p999_us),
            ("max_us", self.max_us),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), round2(v).into()))
        .collect()
    }
}

/// Makes the calling thread's sleeps end within microseconds of when they
/// are due: Linux lets a sleep overshoot by the thread's timer slack (50 µs
/// by default; measured here: a 150 µs sleep ended 63 µs late at p50 and
/// 552 µs at p99, against 11 and 33 µs with a 1 ns slack). An open-loop
/// load thread that paces itself by sleeping would otherwise count its own
/// lateness as the system's latency.
pub fn precise_sleeps() {
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's timer slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0u64, 0u64, 0u64) };
}

/// Waits for `due`: sleeps to it when it is more than 20 µs away, else
/// returns at once. So a send leaves within microseconds of its due time —
/// a sleep's overshoot late (a few µs after [`precise_sleeps`]) or at most
/// 20 µs early — and at high rates (due times microseconds apart) the
/// thread neither sleeps nor spins per record (spinning took a core of
/// two from the broker). Call [`precise_sleeps`] on the thread first.
pub fn wait_until(due: std::time::Instant) {
    const EARLY: std::time::Duration = std::time::Duration::from_micros(20);
    let now = std::time::Instant::now();
    if due > now + EARLY {
        std::thread::sleep(due - now);
    }
}

/// MiB per second for `bytes` moved in `secs`.
pub fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / secs.max(1e-9)
}

/// The median of some numbers (the lower middle for an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get((v.len().max(1) - 1) / 2).copied().unwrap_or(0.0)
}

/// Prints `rows` of (label, value, unit) as an aligned table.
pub fn table(title: &str, rows: &[(&str, f64, &str)]) {
    println!("{title}");
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    for (label, value, unit) in rows {
        println!("  {label:<width$}  {value:>12.2} {unit}");
    }
}

/// Rounds to two decimals for the JSON line.
pub fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

/// CPU time the whole machine has spent so far, every process and the
/// kernel together (user, nice, system, irq and softirq time from
/// `/proc/stat`; idle, I/O wait and the time a hypervisor stole are not
/// counted), in seconds; 0 where `/proc/stat` cannot be read. The bench
/// shares the machine with the broker it drives, so a scenario's CPU cost
/// is the difference of two readings: what producing or consuming a GiB
/// costs the host, client included, in the same units on any machine
/// (10 ms ticks: meaningful over runs of a second or more).
pub fn machine_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    // "cpu  user nice system idle iowait irq softirq steal guest guest_nice"
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .map(|l| l.split_whitespace().filter_map(|f| f.parse().ok()).collect())
        .unwrap_or_default();
    let busy: u64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| ticks.get(i)).sum();
    // SAFETY: sysconf only reads a system setting.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    busy as f64 / per_s as f64
}

/// CPU seconds (user + system) process `pid` has used so far, from
/// `/proc/PID/stat` (clock ticks: meaningful over a second or more);
/// `None` if it cannot be read (no such process).
pub fn process_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces, in parentheses):
    // state is field 3, utime 14 and stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf only reads a system setting.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    Some((utime + stime) as f64 / per_s as f64)
}

/// CPU seconds per GiB of `bytes` (0 when nothing moved).
pub fn cpu_s_per_gib(cpu_s: f64, bytes: u64) -> f64 {
    if bytes == 0 {
        return 0.0;
    }
    cpu_s / (bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_cpu_time_grows_with_work() {
        let me = std::process::id();
        let before = process_cpu_s(me).expect("this process's stat");
        let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0u64;
        while std::time::Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let after = process_cpu_s(me).unwrap();
        assert!(after - before >= 0.1, "{before} → {after}");
        assert_eq!(process_cpu_s(u32::MAX), None);
    }

    #[test]
    fn machine_cpu_time_counts_a_busy_thread() {
        let before = machine_cpu_s();
        assert!(before > 0.0, "/proc/stat gave no CPU time");
        // 300 ms of spinning: at least 0.2 s more CPU time (10 ms ticks;
        // other processes only add to it).
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let spent = machine_cpu_s() - before;
        assert!(spent >= 0.2, "{spent} CPU s for 0.3 s of spinning");
        assert_eq!(cpu_s_per_gib(2.0, 1 << 31), 1.0);
        assert_eq!(cpu_s_per_gib(2.0, 0), 0.0);
    }
}
