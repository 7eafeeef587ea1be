//! The server's own latency histograms (`headroom_request_duration_seconds`, served on
//! `--metrics-listen`), read before and after a load so `headroom-bench load` can print them
//! beside what its clients measured: the difference is the network, the kernel and the client.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::Serialize;

const FAMILY: &str = "headroom_request_duration_seconds";

/// One command's histogram as scraped: finite bucket bounds (seconds) with their cumulative
/// counts, then the `+Inf` count, and the sum of latencies (seconds).
#[derive(Clone, Debug, Default)]
pub struct Histogram {
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_seconds: f64,
}

/// The histograms by `command` label.
pub type Histograms = HashMap<String, Histogram>;

/// What the server's histogram says about one command over the load.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerLatency {
    pub command: String,
    pub count: u64,
    pub mean_us: f64,
    /// Quantiles interpolated linearly inside their bucket, as Prometheus's
    /// `histogram_quantile` does (the buckets are 1-2-5 steps, so a figure is only as good as
    /// its bucket: between 5 and 10 µs, say).
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
}

/// Fetches `/metrics` from `addr` and reads the request-duration histograms out of it.
pub fn scrape(addr: SocketAddr) -> Result<Histograms, String> {
    let fail = |e: std::io::Error| format!("metrics at {addr}: {e}");
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(fail)?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(fail)?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: headroom\r\nConnection: close\r\n\r\n")
        .map_err(fail)?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(fail)?;
    let (head, body) = reply
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("metrics at {addr}: no HTTP reply"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "metrics at {addr}: {}",
            head.lines().next().unwrap_or("")
        ));
    }
    Ok(parse(body))
}

/// Reads the request-duration histograms from Prometheus text: lines such as
/// `headroom_request_duration_seconds_bucket{command="get",le="1e-05"} 146566`.
pub fn parse(text: &str) -> Histograms {
    let mut out = Histograms::new();
    for line in text.lines().filter(|l| l.starts_with(FAMILY)) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        let label = |key: &str| {
            labels
                .trim_end_matches('}')
                .split(',')
                .find_map(|kv| kv.strip_prefix(key)?.strip_prefix("=\"")?.strip_suffix('"'))
        };
        let Some(command) = label("command") else {
            continue;
        };
        let h = out.entry(command.to_string()).or_default();
        match &name[FAMILY.len()..] {
            "_bucket" => match label("le") {
                Some("+Inf") => h.count = value as u64,
                Some(le) => {
                    if let Ok(bound) = le.parse::<f64>() {
                        h.buckets.push((bound, value as u64));
                    }
                }
                None => {}
            },
            "_sum" => h.sum_seconds = value,
            _ => {}
        }
    }
    for h in out.values_mut() {
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// What `after` added to `before`, for each command that served requests in between.
pub fn between(before: &Histograms, after: &Histograms, commands: &[&str]) -> Vec<ServerLatency> {
    let empty = Histogram::default();
    commands
        .iter()
        .filter_map(|&command| {
            let a = after.get(command)?;
            let b = before.get(command).unwrap_or(&empty);
            let count = a.count.saturating_sub(b.count);
            if count == 0 {
                return None;
            }
            let buckets: Vec<(f64, u64)> = a
                .buckets
                .iter()
                .map(|&(bound, n)| {
                    let was = b.buckets.iter().find(|x| x.0 == bound).map_or(0, |x| x.1);
                    (bound, n.saturating_sub(was))
                })
                .collect();
            let quantile = |q: f64| quantile_us(&buckets, count, q);
            Some(ServerLatency {
                command: command.to_string(),
                count,
                mean_us: (a.sum_seconds - b.sum_seconds) / count as f64 * 1e6,
                p50_us: quantile(0.5),
                p90_us: quantile(0.9),
                p99_us: quantile(0.99),
            })
        })
        .collect()
}

/// The `q` quantile of cumulative `buckets` over `count` observations, in µs, interpolated
/// inside its bucket; past the last finite bound, that bound.
fn quantile_us(buckets: &[(f64, u64)], count: u64, q: f64) -> f64 {
    let rank = q * count as f64;
    let mut lower = (0.0, 0u64);
    for &(bound, cumulative) in buckets {
        if cumulative as f64 >= rank {
            let inside = (cumulative - lower.1) as f64;
            let share = if inside > 0.0 {
                (rank - lower.1 as f64) / inside
            } else {
                1.0
            };
            return (lower.0 + (bound - lower.0) * share) * 1e6;
        }
        lower = (bound, cumulative);
    }
    lower.0 * 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE headroom_request_duration_seconds histogram\n\
headroom_request_duration_seconds_bucket{command=\"get\",le=\"1e-06\"} 0\n\
headroom_request_duration_seconds_bucket{command=\"get\",le=\"2e-06\"} 10\n\
headroom_request_duration_seconds_bucket{command=\"get\",le=\"5e-06\"} 90\n\
headroom_request_duration_seconds_bucket{command=\"get\",le=\"+Inf\"} 100\n\
headroom_request_duration_seconds_sum{command=\"get\"} 0.0003\n\
headroom_request_duration_seconds_count{command=\"get\"} 100\n\
headroom_other_total 5\n";

    #[test]
    fn reads_buckets_and_interpolates_like_histogram_quantile() {
        let h = parse(TEXT);
        let get = &h["get"];
        assert_eq!(get.count, 100);
        assert_eq!(get.buckets, vec![(1e-6, 0), (2e-6, 10), (5e-6, 90)]);
        let s = &between(&Histograms::new(), &h, &["get", "set"])[..];
        assert_eq!(s.len(), 1, "no SET served, no SET row");
        assert_eq!(s[0].count, 100);
        assert!((s[0].mean_us - 3.0).abs() < 1e-9);
        // rank 50 lies 40 of the 80 observations into (2, 5] µs: 3.5 µs.
        assert!((s[0].p50_us - 3.5).abs() < 1e-9, "{}", s[0].p50_us);
        // rank 99 is past the last finite bucket: its bound.
        assert!((s[0].p99_us - 5.0).abs() < 1e-9);
    }

    #[test]
    fn a_second_scrape_counts_only_what_came_in_between() {
        let before = parse(TEXT);
        let after = parse(
            &TEXT
                .replace("} 90\n", "} 190\n")
                .replace("} 100\n", "} 200\n"),
        );
        let s = between(&before, &after, &["get"]);
        assert_eq!(s[0].count, 100);
        // All 100 new ones are in (2, 5] µs.
        assert!(s[0].p50_us > 2.0 && s[0].p50_us <= 5.0);
    }
}
