//! `strand top`: a live view of a broker's metrics, refreshed every second —
//! how an operator spots a hot key, a falling-behind group or a growing
//! dead-letter queue.
//!
//! It scrapes `/metrics` of each `--metrics` endpoint, and from two
//! consecutive scrapes shows: per queue the produce and fetch rates
//! (records/s from the partitions' log ends, MiB/s from the byte counters)
//! and its dead-letter growth; per group the lag and its trend (records/s:
//! positive means it falls behind); hot partitions — a partition taking
//! more than twice its queue's mean rate (a hot key), or holding more than
//! twice its queue's mean bytes; per broker its data directory's free space
//! against its threshold (below it: produce refused, `StorageFull`) and
//! whether it is draining. On a terminal the screen is redrawn; piped,
//! each refresh is printed after the last. `--iterations N` stops after N
//! refreshes (for scripts).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use clap::Args;

#[derive(Args, Debug)]
pub struct TopArgs {
    /// Metrics endpoints, comma-separated (each broker's --metrics-listen).
    #[arg(
        long,
        default_value = "127.0.0.1:9401",
        value_delimiter = ',',
        value_name = "HOST:PORT[,...]"
    )]
    pub metrics: Vec<String>,
    /// Time between refreshes, in ms.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub interval_ms: u64,
    /// Stop after this many refreshes.
    #[arg(long)]
    pub iterations: Option<u64>,
}

/// A series: metric name and its labels.
type Series = (String, BTreeMap<String, String>);

/// Parses OpenMetrics / Prometheus text into (series → value).
pub fn parse(text: &str) -> BTreeMap<Series, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (name_labels, value) = match line.rfind(' ') {
            Some(i) => (&line[..i], &line[i + 1..]),
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = match name_labels.find('{') {
            Some(i) if name_labels.ends_with('}') => (&name_labels[..i], &name_labels[i + 1..name_labels.len() - 1]),
            _ => (name_labels, ""),
        };
        out.insert((name.to_string(), parse_labels(labels)), value);
    }
    out
}

fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some(eq) = rest.find("=\"") {
        let key = rest[..eq].trim_start_matches(',').trim().to_string();
        let mut value = String::new();
        let mut chars = rest[eq + 2..].char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(match n {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                '"' => {
                    end = eq + 2 + i + 1;
                    break;
                }
                other => value.push(other),
            }
        }
        labels.insert(key, value);
        rest = &rest[end.min(rest.len())..];
    }
    labels
}

fn scrape(addr: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: strand\r\n\r\n")
        .map_err(|e| format!("asking {addr}: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| format!("reading {addr}: {e}"))?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}: not an HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{addr}: {}", head.lines().next().unwrap_or_default()));
    }
    Ok(body.to_string())
}

/// Every endpoint's series (summed where the same series comes twice).
fn scrape_all(endpoints: &[String]) -> Result<BTreeMap<Series, f64>, String> {
    let mut all = BTreeMap::new();
    for e in endpoints {
        for (k, v) in parse(&scrape(e)?) {
            *all.entry(k).or_insert(0.0) += v;
        }
    }
    Ok(all)
}

/// Values of `name`, by one label.
fn by_label(s: &BTreeMap<Series, f64>, name: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for ((n, labels), v) in s {
        if n == name {
            if let Some(l) = labels.get(label) {
                *out.entry(l.clone()).or_insert(0.0) += v;
            }
        }
    }
    out
}

/// Values of `name` by (queue, partition).
fn by_partition(s: &BTreeMap<Series, f64>, name: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for ((n, labels), v) in s {
        if n == name {
            if let (Some(q), Some(p)) = (labels.get("queue"), labels.get("partition")) {
                out.insert((q.clone(), p.clone()), *v);
            }
        }
    }
    out
}

fn rate(now: f64, before: Option<f64>, secs: f64) -> f64 {
    ((now - before.unwrap_or(now)) / secs.max(1e-9)).max(0.0)
}

/// One refresh's text, from the previous and the current scrape.
pub fn render(prev: &BTreeMap<Series, f64>, cur: &BTreeMap<Series, f64>, secs: f64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let mut out = String::new();
    let ends = by_partition(cur, "strand_partition_log_end_offset");
    let ends_before = by_partition(prev, "strand_partition_log_end_offset");
    let stored = by_partition(cur, "strand_partition_stored_bytes");
    let mut queue_rate: BTreeMap<String, f64> = BTreeMap::new();
    let mut partition_rate: BTreeMap<(String, String), f64> = BTreeMap::new();
    for (k, v) in &ends {
        let r = rate(*v, ends_before.get(k).copied(), secs);
        *queue_rate.entry(k.0.clone()).or_insert(0.0) += r;
        partition_rate.insert(k.clone(), r);
    }
    let produce = by_label(cur, "strand_produce_bytes_total", "queue");
    let produce_before = by_label(prev, "strand_produce_bytes_total", "queue");
    let fetch = by_label(cur, "strand_fetch_bytes_total", "queue");
    let fetch_before = by_label(prev, "strand_fetch_bytes_total", "queue");
    let dlq = by_label(cur, "strand_dlq_records_total", "queue");
    let dlq_before = by_label(prev, "strand_dlq_records_total", "queue");
    out.push_str(&format!(
        "{:<24} {:>12} {:>10} {:>10} {:>9} {:>8}\n",
        "QUEUE", "RECORDS/S", "IN MiB/s", "OUT MiB/s", "DLQ +/S", "DLQ"
    ));
    for (q, r) in &queue_rate {
        if q.starts_with("__") {
            continue;
        }
        out.push_str(&format!(
            "{:<24} {:>12.0} {:>10.2} {:>10.2} {:>9.1} {:>8.0}\n",
            q,
            r,
            rate(
                produce.get(q).copied().unwrap_or(0.0),
                produce_before.get(q).copied(),
                secs
            ) / MIB,
            rate(fetch.get(q).copied().unwrap_or(0.0), fetch_before.get(q).copied(), secs) / MIB,
            rate(dlq.get(q).copied().unwrap_or(0.0), dlq_before.get(q).copied(), secs),
            dlq.get(q).copied().unwrap_or(0.0),
        ));
    }
    // Groups: lag and trend.
    let lag_of = |s: &BTreeMap<Series, f64>| {
        let mut m: BTreeMap<String, f64> = BTreeMap::new();
        for ((n, labels), v) in s {
            if n == "strand_group_lag" {
                if let Some(g) = labels.get("group") {
                    *m.entry(g.clone()).or_insert(0.0) += v;
                }
            }
        }
        m
    };
    let (lag, lag_before) = (lag_of(cur), lag_of(prev));
    out.push_str(&format!("\n{:<24} {:>12} {:>14}\n", "GROUP", "LAG", "TREND REC/S"));
    for (g, l) in &lag {
        let trend = (l - lag_before.get(g).copied().unwrap_or(*l)) / secs.max(1e-9);
        let flag = if trend > 0.0 { "  falling behind" } else { "" };
        out.push_str(&format!("{g:<24} {l:>12.0} {trend:>+14.0}{flag}\n"));
    }
    // Hot partitions: far above their queue's mean rate or size.
    let mut hot = Vec::new();
    let mut per_queue: BTreeMap<&str, Vec<(&str, f64, f64)>> = BTreeMap::new();
    for ((q, p), r) in &partition_rate {
        let bytes = stored.get(&(q.clone(), p.clone())).copied().unwrap_or(0.0);
        per_queue.entry(q).or_default().push((p, *r, bytes));
    }
    for (q, parts) in per_queue {
        if parts.len() < 2 || q.starts_with("__") {
            continue;
        }
        let n = parts.len() as f64;
        let mean_rate = parts.iter().map(|p| p.1).sum::<f64>() / n;
        let mean_bytes = parts.iter().map(|p| p.2).sum::<f64>() / n;
        for (p, r, bytes) in parts {
            if mean_rate > 0.0 && r > 2.0 * mean_rate && r >= 10.0 {
                hot.push(format!(
                    "{q}/{p}: {r:.0} records/s, {:.1}× the queue's mean (a hot key?)",
                    r / mean_rate
                ));
            } else if mean_bytes > 0.0 && bytes > 2.0 * mean_bytes && bytes >= (1 << 20) as f64 {
                hot.push(format!(
                    "{q}/{p}: {:.1} MiB stored, {:.1}× the queue's mean",
                    bytes / MIB,
                    bytes / mean_bytes
                ));
            }
        }
    }
    out.push_str("\nHOT PARTITIONS\n");
    if hot.is_empty() {
        out.push_str("(none)\n");
    }
    for h in hot {
        out.push_str(&h);
        out.push('\n');
    }
    brokers(cur, &mut out);
    out
}

/// Per broker: free space against its threshold, and maintenance.
fn brokers(cur: &BTreeMap<Series, f64>, out: &mut String) {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    let free = by_label(cur, "strand_disk_free_bytes", "broker");
    let threshold = by_label(cur, "strand_disk_free_threshold_bytes", "broker");
    let draining = by_label(cur, "strand_broker_draining", "broker");
    let leaving = by_label(cur, "strand_broker_decommissioning", "broker");
    let moving_off = by_label(cur, "strand_broker_replicas_moving_off", "broker");
    let mut ids: Vec<&String> = free.keys().chain(draining.keys()).collect();
    ids.sort_by_key(|id| (id.len(), *id));
    ids.dedup();
    out.push_str(&format!(
        "\n{:<8} {:>12} {:>12}  {}\n",
        "BROKER", "DISK FREE", "THRESHOLD", "STATE"
    ));
    for id in ids {
        let gib = |v: Option<&f64>| v.map_or("-".to_string(), |v| format!("{:.2} GiB", v / GIB));
        let full = matches!((free.get(id), threshold.get(id)), (Some(f), Some(t)) if f < t);
        let on = |m: &BTreeMap<String, f64>| m.get(id).is_some_and(|v| *v > 0.0);
        let moving = moving_off.get(id).copied().unwrap_or(0.0);
        let state = match (full, on(&leaving), on(&draining)) {
            (true, _, _) => "PRODUCE REFUSED: disk below its threshold".to_string(),
            (false, true, _) if moving > 0.0 => format!("decommissioning: {moving} replicas left to move"),
            (false, true, _) => "decommissioned: holds nothing".to_string(),
            (false, false, true) => "draining".to_string(),
            (false, false, false) => "ok".to_string(),
        };
        out.push_str(&format!(
            "{id:<8} {:>12} {:>12}  {state}\n",
            gib(free.get(id)),
            gib(threshold.get(id))
        ));
    }
}

pub fn run(args: TopArgs) -> Result<(), String> {
    let interval = Duration::from_millis(args.interval_ms.max(100));
    let tty = std::io::stdout().is_terminal();
    let mut prev = scrape_all(&args.metrics)?;
    let mut at = Instant::now();
    let mut n = 0;
    while args.iterations.is_none_or(|max| n < max) {
        std::thread::sleep(interval);
        let cur = scrape_all(&args.metrics)?;
        let now = Instant::now();
        let text = render(&prev, &cur, now.duration_since(at).as_secs_f64());
        let mut out = std::io::stdout().lock();
        let header = format!("strand top — {} — every {:?}\n\n", args.metrics.join(", "), interval);
        let written = if tty {
            write!(out, "\x1b[2J\x1b[H{header}{text}")
        } else {
            writeln!(out, "{header}{text}")
        };
        if written.and_then(|()| out.flush()).is_err() {
            return Ok(()); // stdout closed
        }
        (prev, at) = (cur, now);
        n += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_series_and_escaped_labels() {
        let s = parse("# TYPE x counter\nstrand_x_total{queue=\"a\\\"b\",partition=\"0\"} 12\nplain 3.5\n# EOF\n");
        let labels: BTreeMap<String, String> = [("queue", "a\"b"), ("partition", "0")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(s.get(&("strand_x_total".to_string(), labels)), Some(&12.0));
        assert_eq!(s.get(&("plain".to_string(), BTreeMap::new())), Some(&3.5));
    }

    #[test]
    fn flags_hot_partitions_and_falling_behind_groups() {
        let snap = |ends: [f64; 4], lag: f64| {
            let mut text = String::new();
            for (p, e) in ends.iter().enumerate() {
                text.push_str(&format!(
                    "strand_partition_log_end_offset{{queue=\"q\",partition=\"{p}\"}} {e}\n"
                ));
            }
            text.push_str(&format!(
                "strand_group_lag{{group=\"g\",queue=\"q\",partition=\"0\"}} {lag}\n"
            ));
            parse(&text)
        };
        let text = render(&snap([0.0; 4], 10.0), &snap([1000.0, 10.0, 10.0, 10.0], 50.0), 1.0);
        assert!(text.contains("q/0: 1000 records/s"), "{text}");
        assert!(!text.contains("q/1:"), "{text}");
        assert!(text.contains("falling behind"), "{text}");
        let calm = render(&snap([0.0; 4], 10.0), &snap([10.0; 4], 5.0), 1.0);
        assert!(calm.contains("(none)") && !calm.contains("falling behind"), "{calm}");
    }

    #[test]
    fn shows_each_broker_s_disk_and_maintenance() {
        let cur = parse(
            "strand_disk_free_bytes{broker=\"1\"} 536870912\nstrand_disk_free_threshold_bytes{broker=\"1\"} 1073741824\n\
             strand_disk_free_bytes{broker=\"2\"} 10737418240\nstrand_disk_free_threshold_bytes{broker=\"2\"} 1073741824\n\
             strand_broker_draining{broker=\"1\"} 0\nstrand_broker_draining{broker=\"2\"} 1\n\
             strand_broker_draining{broker=\"3\"} 0\nstrand_broker_draining{broker=\"4\"} 0\n\
             strand_broker_decommissioning{broker=\"4\"} 1\nstrand_broker_replicas_moving_off{broker=\"4\"} 7\n",
        );
        let text = render(&BTreeMap::new(), &cur, 1.0);
        let line = |id: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("{id} ")))
                .unwrap_or_default()
                .to_string()
        };
        assert!(
            line("1").contains("0.50 GiB") && line("1").contains("PRODUCE REFUSED"),
            "{text}"
        );
        assert!(
            line("2").contains("10.00 GiB") && line("2").ends_with("draining"),
            "{text}"
        );
        assert!(line("3").contains('-') && line("3").ends_with("ok"), "{text}");
        assert!(
            line("4").ends_with("decommissioning: 7 replicas left to move"),
            "{text}"
        );
    }
}
