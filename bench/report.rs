//! `loadgen report`: medians over rounds, ratios, the markdown table and latest.json.
//!
//! Input: one JSON object per line, as written by `bench/compare.sh`:
//! `{"round", "target", "metric", "cpu_s", "result": <a loadgen JSON line>}` (idle lines
//! also carry `rss_before_kib` / `rss_after_kib`).
use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::{json, Value};

/// Arguments of `loadgen report`.
#[derive(Args)]
pub struct ReportArgs {
    /// results.jsonl written by compare.sh.
    #[arg(long)]
    input: PathBuf,
    /// Where to write the summary JSON.
    #[arg(long)]
    json_out: PathBuf,
    #[arg(long, default_value = "none")]
    haproxy_version: String,
    #[arg(long, default_value = "none")]
    nginx_version: String,
    #[arg(long, default_value_t = 0)]
    rounds: u32,
    #[arg(long, default_value_t = 0.0)]
    seconds: f64,
    /// crossbar's /metrics scraped at the end (error counters are summarised).
    #[arg(long)]
    metrics: Option<PathBuf>,
}

/// `baseline` is another crossbar binary (compare.sh `--baseline`: before a change);
/// `nginx` is nginx's stream module.
const TARGETS: [&str; 5] = ["direct", "crossbar", "baseline", "haproxy", "nginx"];

/// All lines of one (target, metric).
#[derive(Default)]
struct Runs(Vec<Value>);

impl Runs {
    /// Median over rounds of `result.<field>`.
    fn median(&self, field: &str) -> Option<f64> {
        let mut v: Vec<f64> = self
            .0
            .iter()
            .filter_map(|l| l["result"][field].as_f64())
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        Some(if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        })
    }

    /// Sum over rounds of `result.<field>`.
    fn sum(&self, field: &str) -> f64 {
        self.0
            .iter()
            .filter_map(|l| l["result"][field].as_f64())
            .sum()
    }

    /// Proxy CPU seconds over all rounds (None for direct).
    fn cpu(&self) -> Option<f64> {
        let v: Vec<f64> = self.0.iter().filter_map(|l| l["cpu_s"].as_f64()).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    }

    fn errors(&self) -> u64 {
        self.0
            .iter()
            .map(|l| {
                l["result"]["errors"].as_u64().unwrap_or(0)
                    + u64::from(l["result"]["kind"] == "failed")
            })
            .sum()
    }
}

/// One row of the table: a figure per target, and whether bigger is better.
struct Row {
    label: String,
    key: String,
    values: BTreeMap<&'static str, f64>,
}

/// Run the report.
pub fn run(a: ReportArgs) -> Result<()> {
    let text = std::fs::read_to_string(&a.input)
        .with_context(|| format!("reading {}", a.input.display()))?;
    let mut by: BTreeMap<(String, String), Runs> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value = serde_json::from_str(line).with_context(|| format!("bad line {line}"))?;
        let key = (
            v["target"].as_str().unwrap_or("").to_string(),
            v["metric"].as_str().unwrap_or("").to_string(),
        );
        by.entry(key).or_default().0.push(v);
    }
    let get = |t: &str, m: &str| by.get(&(t.to_string(), m.to_string()));
    let mut rows: Vec<Row> = Vec::new();
    let mut row = |label: &str, key: &str, f: &dyn Fn(&str) -> Option<f64>| {
        let values = TARGETS
            .iter()
            .filter_map(|t| f(t).map(|v| (*t, v)))
            .collect();
        rows.push(Row {
            label: label.to_string(),
            key: key.to_string(),
            values,
        });
    };
    let med = |m: &'static str, field: &'static str| {
        move |t: &str| get(t, m).and_then(|r| r.median(field))
    };
    row(
        "Throughput, 1 stream (Gbit/s)",
        "tput1_gbit_s",
        &med("tput1", "gbit_s"),
    );
    row(
        "Throughput, 8 streams (Gbit/s)",
        "tput8_gbit_s",
        &med("tput8", "gbit_s"),
    );
    row(
        "64 B ping-pong p50 (µs)",
        "pingpong_p50_us",
        &med("latency", "p50_us"),
    );
    row(
        "64 B ping-pong p99 (µs)",
        "pingpong_p99_us",
        &med("latency", "p99_us"),
    );
    let direct_p50 = get("direct", "latency").and_then(|r| r.median("p50_us"));
    row(
        "Added latency p50 over direct (µs)",
        "added_latency_p50_us",
        &|t| {
            (t != "direct")
                .then(|| Some(get(t, "latency")?.median("p50_us")? - direct_p50?))
                .flatten()
        },
    );
    row(
        "New TLS 1.3 conn/s, full",
        "full_conn_s",
        &med("conn_full", "conn_per_s"),
    );
    row(
        "  full: connect+handshake p50 (ms)",
        "full_p50_ms",
        &med("conn_full", "p50_ms"),
    );
    row(
        "  full: p99 (ms)",
        "full_p99_ms",
        &med("conn_full", "p99_ms"),
    );
    row(
        "New TLS 1.3 conn/s, resumed",
        "resumed_conn_s",
        &med("res_t13", "conn_per_s"),
    );
    row(
        "  resumed: p50 (ms)",
        "resumed_p50_ms",
        &med("res_t13", "p50_ms"),
    );
    row(
        "  resumed: p99 (ms)",
        "resumed_p99_ms",
        &med("res_t13", "p99_ms"),
    );
    for (m, name) in [
        ("res_t12sid", "TLS 1.2 session ID"),
        ("res_t12tk", "TLS 1.2 ticket"),
        ("res_t13", "TLS 1.3"),
    ] {
        row(
            &format!("Resumed, {name} (%)"),
            &format!("{m}_resumed_pct"),
            &|t| get(t, m)?.median("resumed_ratio").map(|x| x * 100.0),
        );
        row(
            &format!("Same backend, {name} (%)"),
            &format!("{m}_same_backend_pct"),
            &|t| get(t, m)?.median("same_backend_ratio").map(|x| x * 100.0),
        );
    }
    row("Proxy CPU s per GB relayed", "cpu_s_per_gb", &|t| {
        let (a, b) = (get(t, "tput1")?, get(t, "tput8")?);
        let gb = (a.sum("bytes") + b.sum("bytes")) / 1e9;
        Some((a.cpu()? + b.cpu()?) / gb)
    });
    row(
        "Proxy CPU s per 1,000 full conns",
        "cpu_s_per_kconn_full",
        &|t| {
            let r = get(t, "conn_full")?;
            Some(r.cpu()? / r.sum("conns") * 1000.0)
        },
    );
    row(
        "Proxy CPU s per 1,000 resumed conns",
        "cpu_s_per_kconn_resumed",
        &|t| {
            let r = get(t, "res_t13")?;
            Some(r.cpu()? / r.sum("conns") * 1000.0)
        },
    );
    row(
        "Proxy RSS per idle conn (KiB)",
        "rss_kib_per_idle_conn",
        &|t| {
            let l = get(t, "idle")?.0.first()?;
            let held = l["result"]["held"].as_f64().filter(|h| *h > 0.0)?;
            Some((l["rss_after_kib"].as_f64()? - l["rss_before_kib"].as_f64()?) / held)
        },
    );
    row("Idle connections held", "idle_held", &|t| {
        get(t, "idle")?.0.first()?["result"]["held"].as_f64()
    });
    row("Client-side errors (all runs)", "errors", &|t| {
        let n: u64 = by
            .iter()
            .filter(|((tt, _), _)| tt == t)
            .map(|(_, r)| r.errors())
            .sum();
        by.keys().any(|(tt, _)| tt == t).then_some(n as f64)
    });

    print_table(&rows, &a);
    let mut summary = serde_json::Map::new();
    for r in &rows {
        summary.insert(r.key.clone(), json!(r.values));
    }
    let out = json!({
        "rounds": a.rounds, "seconds_per_run": a.seconds,
        "haproxy_version": a.haproxy_version,
        "nginx_version": a.nginx_version,
        "host": host_facts(),
        "figures": summary,
        "crossbar_error_metrics": a.metrics.as_ref().map(|p| error_metrics(p)),
        "runs": by.values().flat_map(|r| r.0.clone()).collect::<Vec<_>>(),
    });
    std::fs::write(&a.json_out, serde_json::to_string_pretty(&out)? + "\n")
        .with_context(|| format!("writing {}", a.json_out.display()))?;
    eprintln!("wrote {}", a.json_out.display());
    Ok(())
}

fn fmt(v: Option<f64>) -> String {
    match v {
        None => "–".into(),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.2}"),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => format!("{:.2}x", a / b),
        _ => "–".into(),
    }
}

fn print_table(rows: &[Row], a: &ReportArgs) {
    println!(
        "\n{} round(s) of {} s per figure; medians over rounds; HAProxy {}; nginx {}\n",
        a.rounds, a.seconds, a.haproxy_version, a.nginx_version
    );
    println!(
        "| figure | direct | crossbar | baseline | HAProxy | nginx | crossbar/HAProxy \
         | crossbar/nginx | crossbar/direct | crossbar/baseline |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let v = |t: &str| r.values.get(t).copied();
        let (d, c, b, h, n) = (
            v("direct"),
            v("crossbar"),
            v("baseline"),
            v("haproxy"),
            v("nginx"),
        );
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.label,
            fmt(d),
            fmt(c),
            fmt(b),
            fmt(h),
            fmt(n),
            ratio(c, h),
            ratio(c, n),
            ratio(c, d),
            ratio(c, b)
        );
    }
}

fn host_facts() -> Value {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!({"cpus": cpus, "kernel": kernel.trim(), "loadavg_at_end": load.trim()})
}

/// Non-zero crossbar error counters from a /metrics scrape.
fn error_metrics(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.contains("error") || l.contains("reset") || l.contains("timeout"))
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    json!(lines)
}
