//! A real Prometheus (Debian package `prometheus`) scraping a broker, and
//! the monitoring files under `ansible/` checked against what the broker
//! exports. `.ci/run` installs Prometheus and sets
//! `STRAND_REQUIRE_PROMETHEUS=1`, so there these tests fail if it is
//! missing; elsewhere they say so on stderr and pass without it.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use strand_wire::ErrorCode;

/// `name` on the PATH; `None` (with a note) where it may be missing.
fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var_os("STRAND_REQUIRE_PROMETHEUS").is_none(),
            "{name} is missing: apt-get install prometheus"
        );
        eprintln!("{name} is not installed: skipped (apt-get install prometheus to run it)");
    }
    found
}

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

#[test]
fn prometheus_scrapes_the_broker() {
    let Some(prometheus) = tool("prometheus") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"));
    assert_eq!(broker.client().create_queue("scraped", 2), ErrorCode::None);
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: strand\n    static_configs:\n      - targets: ['{}']\n",
            broker.metrics
        ),
    )
    .unwrap();
    let web = free_port();
    let _prometheus = Killed(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
            .arg(format!("--web.listen-address={web}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    // Bounded: Prometheus starts, scrapes, and reports the target up with
    // the broker's series.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "Prometheus never reported the broker up");
        let up = get(web, "/api/v1/query?query=up").unwrap_or_default();
        let parts = get(web, "/api/v1/query?query=strand_partition_log_end_offset").unwrap_or_default();
        let up_ok = serde_json::from_str::<serde_json::Value>(&up)
            .ok()
            .and_then(|v| v["data"]["result"][0]["value"][1].as_str().map(|s| s == "1"))
            .unwrap_or(false);
        let series = serde_json::from_str::<serde_json::Value>(&parts)
            .ok()
            .and_then(|v| v["data"]["result"].as_array().map(|a| a.len()))
            .unwrap_or(0);
        if up_ok && series >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn alert_rules_and_dashboard_use_what_the_broker_exports() {
    let rules = repo("ansible/roles/monitoring/files/strand-alerts.yml");
    let dashboard = repo("ansible/roles/monitoring/files/strand-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&dashboard).unwrap()).unwrap();
    let mut exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(exprs.len() >= 10);
    exprs.push(std::fs::read_to_string(&rules).unwrap());
    // Every strand_ metric they name is one the broker describes.
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(dir.path());
    let scrape = get(broker.metrics, "/metrics").unwrap();
    for text in &exprs {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let Some(name) = word.strip_prefix("strand_") else {
                continue;
            };
            let family = ["_bucket", "_total"]
                .iter()
                .fold(name.to_string(), |n, suffix| n.trim_end_matches(suffix).to_string());
            assert!(
                scrape.contains(&format!("# TYPE strand_{family} ")),
                "strand_{name} (in {text}) is not exported"
            );
        }
    }
    if let Some(promtool) = tool("promtool") {
        let out = Command::new(promtool)
            .args(["check", "rules"])
            .arg(&rules)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    }
}
