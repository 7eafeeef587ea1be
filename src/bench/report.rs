//! How results leave the bench: a table on the terminal, a JSON file that says where it came
//! from ([`Meta`]), SVGs of the latency distributions, of a comparison's throughput and CPU,
//! and of the placement replay over time.

use std::path::Path;

use serde::Serialize;

use super::load::LoadReport;
use super::meta::{Meta, ServerInfo, WithMeta};
use super::replay::{ReplayReport, Targets, GIB};
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
    /// A and B as they described themselves before the first round (into the JSON's meta).
    #[serde(skip)]
    pub servers: Vec<ServerInfo>,
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
    if !r.server_latency.is_empty() {
        println!(
            "\nThe server's own histograms over the run (arrival at its socket to the reply handed \
             to its kernel; quantiles interpolated in 1-2-5 buckets, as Prometheus's \
             histogram_quantile), and what the client saw beyond them (the network, both \
             kernels, the client):\n"
        );
        println!("| op | server count | server p50 µs | p90 µs | p99 µs | mean µs | client - server p50 µs | mean µs |");
        println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
        for s in &r.server_latency {
            let client = if s.command == "set" { &r.set } else { &r.get };
            println!(
                "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                s.command.to_uppercase(),
                s.count,
                s.p50_us,
                s.p90_us,
                s.p99_us,
                s.mean_us,
                client.p50_us as f64 - s.p50_us,
                client.mean_us - s.mean_us
            );
        }
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

fn write_file(path: &Path, text: String) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn write_json(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    write_file(path, text + "\n")
}

/// Writes `result` as JSON with `meta` first: `{"meta": {...}, ...result's fields}`.
pub fn write_result(path: &Path, meta: &Meta, result: &impl Serialize) -> Result<(), String> {
    write_json(path, &WithMeta { meta, result })
}

/// One line of a latency CDF: its name, histogram, colour and dash (`svg::COLORS`,
/// `svg::DASHES`).
pub struct CdfLine<'a> {
    pub name: String,
    pub latency: &'a Latency,
    pub color: usize,
    pub dash: usize,
}

/// Writes an SVG of latency CDFs, one line per histogram with data.
pub fn write_cdf_svg(path: &Path, title: &str, lines: &[CdfLine]) -> Result<(), String> {
    let series: Vec<svg::Series> = lines
        .iter()
        .filter(|l| l.latency.count() > 0)
        .map(|l| svg::Series::new(l.name.clone(), l.latency.cdf(), l.color).dashed(l.dash))
        .collect();
    write_file(path, svg::cdf(title, &series))
}

/// Writes a comparison's throughput and server CPU per request side by side: a bar per side
/// (the median over rounds) with a circle per round.
pub fn write_comparison_svg(path: &Path, title: &str, c: &Comparison) -> Result<(), String> {
    let sides = [(&c.a_rounds, 0usize), (&c.b_rounds, 1usize)];
    let bars = |value: &dyn Fn(&LoadReport) -> Option<f64>| -> Vec<svg::Bar> {
        sides
            .iter()
            .filter_map(|(rounds, color)| {
                let dots: Vec<f64> = rounds.iter().filter_map(value).collect();
                (!dots.is_empty()).then(|| svg::Bar {
                    value: super::stats::median(&dots),
                    dots,
                    color: *color,
                })
            })
            .collect()
    };
    let cpu_per_request = |r: &LoadReport| {
        r.server_cpu_per_second
            .map(|cpu| cpu * r.seconds / r.requests.max(1) as f64 * 1e6)
    };
    let cpu_bars = bars(&cpu_per_request);
    let panels = [
        svg::BarPanel {
            y_label: "throughput, requests/s".into(),
            bars: bars(&|r| Some(r.requests_per_second)),
            empty: "no rounds".into(),
        },
        svg::BarPanel {
            y_label: "server CPU µs per request (user + system)".into(),
            bars: cpu_bars,
            empty: "no CPU figure: the bench measures the CPU of servers it started only".into(),
        },
    ];
    let legend = [(format!("A: {}", c.a), 0), (format!("B: {}", c.b), 1)];
    write_file(path, svg::bar_panels(title, &panels, &legend))
}

/// Writes the placement replay over time: free space, the largest hole, and failures so far,
/// one line per policy, at each probe.
pub fn write_placement_svg(
    path: &Path,
    title: &str,
    targets: &Targets,
    reports: &[ReplayReport],
) -> Result<(), String> {
    let gib = |b: u64| b as f64 / GIB as f64;
    let series = |value: &dyn Fn(&super::replay::ProbePoint) -> f64| -> Vec<svg::Series> {
        reports
            .iter()
            .enumerate()
            .map(|(i, r)| {
                svg::Series::new(
                    r.policy.clone(),
                    r.timeline
                        .iter()
                        .map(|p| (p.puts_attempted as f64, value(p)))
                        .collect(),
                    i,
                )
            })
            .collect()
    };
    let capacity = gib(targets.bytes * u64::from(targets.count));
    let panels = [
        svg::Panel {
            y_label: "free space, GiB".into(),
            series: series(&|p| gib(p.free_bytes)),
            y_max: Some(capacity),
        },
        svg::Panel {
            y_label: "largest hole, GiB".into(),
            series: series(&|p| gib(p.largest_hole_bytes)),
            y_max: Some(gib(targets.bytes)),
        },
        svg::Panel {
            y_label: "failed puts so far".into(),
            series: series(&|p| p.failures as f64),
            y_max: Some(1.0),
        },
    ];
    let legend: Vec<(String, usize)> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                format!(
                    "{}: {} failures ({} fragmentation)",
                    r.policy,
                    r.failures.len(),
                    r.fragmentation_failures
                ),
                i,
            )
        })
        .collect();
    write_file(
        path,
        svg::line_panels(title, "puts attempted", &panels, &legend),
    )
}
