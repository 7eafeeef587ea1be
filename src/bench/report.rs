//! How results leave the bench: a table on the terminal, a JSON file, an SVG of the latency
//! distributions.

use std::path::Path;

use serde::Serialize;

use super::load::LoadReport;
use super::stats::Latency;
use super::svg;

/// One figure of a side-by-side run: the median over rounds of each side, and B / A.
#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub name: String,
    pub a: f64,
    pub b: f64,
    pub ratio_b_over_a: f64,
}

/// A side-by-side run (A/B or versus a peer).
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub rounds: usize,
    pub figures: Vec<Figure>,
    pub notes: Vec<String>,
    pub a_rounds: Vec<LoadReport>,
    pub b_rounds: Vec<LoadReport>,
}

/// The figures a comparison reports, from one run.
pub fn figures_of(r: &LoadReport) -> Vec<(&'static str, f64)> {
    let mut out = vec![
        ("requests/s", r.requests_per_second),
        ("GET p50 µs", r.get.p50_us as f64),
        ("GET p90 µs", r.get.p90_us as f64),
        ("GET p99 µs", r.get.p99_us as f64),
        ("GET p99.9 µs", r.get.p999_us as f64),
        ("GET max µs", r.get.max_us as f64),
        ("SET p50 µs", r.set.p50_us as f64),
        ("SET p99 µs", r.set.p99_us as f64),
        ("SET max µs", r.set.max_us as f64),
        ("GET hit ratio", hit_ratio(r)),
        ("errors", r.errors() as f64),
    ];
    if let Some(share) = r.head_reads_local_share {
        out.push(("head bytes read from local blocks", share));
    }
    if let Some(n) = r.promotion_exchanges {
        out.push(("promotion exchanges", n as f64));
    }
    if let Some(cpu) = r.server_cpu_per_second {
        out.push(("server CPU s per s", cpu));
        out.push((
            "server CPU µs per request",
            cpu * r.seconds / r.requests.max(1) as f64 * 1e6,
        ));
    }
    out
}

fn hit_ratio(r: &LoadReport) -> f64 {
    let gets = r.get_hits + r.get_misses;
    if gets == 0 {
        0.0
    } else {
        r.get_hits as f64 / gets as f64
    }
}

pub fn print_load(title: &str, r: &LoadReport) {
    println!("\n{title}\n");
    println!(
        "{:.0} requests/s over {:.1} s ({} requests; {} GET hits, {} misses, {} SETs stored)",
        r.requests_per_second, r.seconds, r.requests, r.get_hits, r.get_misses, r.sets_stored
    );
    println!("\n| op | count | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | mean µs |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (name, s) in [("GET", &r.get), ("SET", &r.set)] {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {:.1} |",
            s.count, s.p50_us, s.p90_us, s.p99_us, s.p999_us, s.max_us, s.mean_us
        );
    }
    println!(
        "\nerrors: {} (error replies {:?}, wrong values {}, failed connections {}){}",
        r.errors(),
        r.error_replies,
        r.wrong_values,
        r.connection_errors,
        r.first_error
            .as_ref()
            .map(|e| format!("; first: {e}"))
            .unwrap_or_default()
    );
    if let Some(cpu) = r.server_cpu_per_second {
        println!("server CPU: {cpu:.2} s per s");
    }
}

pub fn print_comparison(c: &Comparison) {
    println!(
        "\n{} vs {}: medians of {} interleaved rounds (A B A B ...)\n",
        c.a, c.b, c.rounds
    );
    println!("| figure | A: {} | B: {} | B / A |", c.a, c.b);
    println!("| --- | --- | --- | --- |");
    for f in &c.figures {
        let fmt = |v: f64| {
            if v.abs() >= 100.0 || v == v.trunc() {
                format!("{v:.0}")
            } else {
                format!("{v:.3}")
            }
        };
        println!(
            "| {} | {} | {} | {:.3} |",
            f.name,
            fmt(f.a),
            fmt(f.b),
            f.ratio_b_over_a
        );
    }
    for note in &c.notes {
        println!("\nnote: {note}");
    }
}

pub fn write_json(path: &Path, value: &impl Serialize) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes an SVG of latency CDFs, one line per (name, histogram) with data.
pub fn write_cdf_svg(path: &Path, title: &str, lines: &[(String, &Latency)]) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let series: Vec<svg::Series> = lines
        .iter()
        .filter(|(_, l)| l.count() > 0)
        .map(|(name, l)| svg::Series {
            name: name.clone(),
            points: l.cdf(),
        })
        .collect();
    std::fs::write(path, svg::cdf(title, &series)).map_err(|e| format!("{}: {e}", path.display()))
}
