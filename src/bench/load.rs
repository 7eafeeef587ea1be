//! `headroom-bench load`: closed-loop load against any memcached-binary-protocol server.
//! Each thread drives its connections in turn: a pipeline of requests written at once, then
//! their replies read in order; a request's latency runs from the start of its pipeline's
//! write to its reply. Values are a pattern of their key, so a GET that returns wrong bytes is counted.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::client::{Conn, ValueCheck, STATUS_NOT_FOUND, STATUS_OK};
use super::process::pin_current_thread;
use super::server_latency::{self, ServerLatency};
use super::stats::{Latency, Summary};
use super::workload::{key_name, KeyDist, KeySampler, Op, Ratio, ValueSize, Workload};

#[derive(Clone, Debug)]
pub struct LoadConfig {
    pub threads: usize,
    /// Connections per thread.
    pub connections: usize,
    /// Requests written at once on a connection before its replies are read.
    pub pipeline: usize,
    pub ratio: Ratio,
    pub keys: u64,
    pub key_dist: KeyDist,
    pub value_size: ValueSize,
    /// SET every key once before the run.
    pub prefill: bool,
    pub warmup: Duration,
    /// Stop after this long (measured, after the warm-up) ...
    pub duration: Option<Duration>,
    /// ... or after this many measured requests, whichever comes first.
    pub operations: Option<u64>,
    pub ttl_seconds: u32,
    pub seed: u64,
    pub key_prefix: String,
    /// Pin the load threads to these CPUs.
    pub client_cpus: Option<Vec<usize>>,
    /// Check the bytes of every GET hit.
    pub verify: bool,
    /// A line on stderr every second.
    pub progress: bool,
    pub io_timeout: Duration,
    /// Read the server's own latency histograms from this metrics endpoint before and after
    /// the measured run.
    pub server_metrics: Option<SocketAddr>,
}

impl Default for LoadConfig {
    fn default() -> LoadConfig {
        LoadConfig {
            threads: 2,
            connections: 4,
            pipeline: 1,
            ratio: Ratio { sets: 1, gets: 10 },
            keys: 100_000,
            key_dist: KeyDist::Uniform,
            value_size: ValueSize::Fixed(32),
            prefill: true,
            warmup: Duration::from_secs(1),
            duration: Some(Duration::from_secs(10)),
            operations: None,
            ttl_seconds: 0,
            seed: 1,
            key_prefix: "hb:".into(),
            client_cpus: None,
            verify: true,
            progress: false,
            io_timeout: Duration::from_secs(30),
            server_metrics: None,
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadReport {
    pub seconds: f64,
    pub requests: u64,
    pub requests_per_second: f64,
    pub get: Summary,
    pub set: Summary,
    pub get_hits: u64,
    pub get_misses: u64,
    pub sets_stored: u64,
    /// Replies with any other status, by status.
    pub error_replies: Vec<(u16, u64)>,
    /// GET hits whose bytes were not the key's pattern, or of a size never written.
    pub wrong_values: u64,
    /// Connections that failed (and stopped) mid-run, with the first error.
    pub connection_errors: u64,
    pub first_error: Option<String>,
    pub value_bytes_received: u64,
    pub value_bytes_sent: u64,
    /// Server CPU seconds per second of the run, when the bench started the server.
    pub server_cpu_per_second: Option<f64>,
    /// Headroom only (`ab`): the share of fixed-head bytes read from local blocks during the
    /// run, and the promotion exchanges it made (STAT `arena`, before and after).
    pub head_reads_local_share: Option<f64>,
    pub promotion_exchanges: Option<u64>,
    /// The server's histograms over the run (`server_metrics`): GET and SET.
    pub server_latency: Vec<ServerLatency>,
    #[serde(skip)]
    pub get_latency: Latency,
    #[serde(skip)]
    pub set_latency: Latency,
}

impl LoadReport {
    pub fn errors(&self) -> u64 {
        self.error_replies.iter().map(|e| e.1).sum::<u64>()
            + self.wrong_values
            + self.connection_errors
    }

    fn merge(&mut self, other: &LoadReport) {
        self.requests += other.requests;
        self.get_hits += other.get_hits;
        self.get_misses += other.get_misses;
        self.sets_stored += other.sets_stored;
        for &(status, n) in &other.error_replies {
            match self.error_replies.iter_mut().find(|e| e.0 == status) {
                Some(e) => e.1 += n,
                None => self.error_replies.push((status, n)),
            }
        }
        self.wrong_values += other.wrong_values;
        self.connection_errors += other.connection_errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error.clone();
        }
        self.value_bytes_received += other.value_bytes_received;
        self.value_bytes_sent += other.value_bytes_sent;
        self.get_latency.add(&other.get_latency);
        self.set_latency.add(&other.set_latency);
    }
}

/// The bytes of every value: `pattern[start..start + len]` for a key whose pattern starts at
/// `start` (so no value is ever generated, only sliced).
pub struct Patterns {
    bytes: Vec<u8>,
}

impl Patterns {
    pub fn new(max_value_bytes: u64) -> Patterns {
        Patterns {
            bytes: (0..max_value_bytes as usize + 256)
                .map(|i| i as u8)
                .collect(),
        }
    }

    pub fn start(key: u64) -> usize {
        (key.wrapping_mul(31) % 256) as usize
    }

    pub fn value(&self, key: u64, len: u64) -> &[u8] {
        let start = Patterns::start(key);
        &self.bytes[start..start + len as usize]
    }

    /// Whether `piece`, found at `offset` of key's value, is the key's pattern.
    pub fn matches(key: u64, offset: usize, piece: &[u8]) -> bool {
        let start = Patterns::start(key) + offset;
        piece
            .iter()
            .enumerate()
            .all(|(j, &b)| b == (start + j) as u8)
    }
}

const PHASE_WARMUP: u8 = 0;
const PHASE_MEASURE: u8 = 1;
const PHASE_STOP: u8 = 2;

/// Runs the load against `addr`; `server_cpu` samples the server's CPU seconds (when known)
/// at the start and end of the measured window.
pub fn run(
    cfg: &LoadConfig,
    addr: SocketAddr,
    server_cpu: &dyn Fn() -> Option<f64>,
) -> Result<LoadReport, String> {
    check(cfg)?;
    let patterns = Arc::new(Patterns::new(cfg.value_size.max()));
    if cfg.prefill {
        prefill(cfg, addr, &patterns)?;
    }
    let phase = Arc::new(AtomicU8::new(PHASE_WARMUP));
    let measured = Arc::new(AtomicU64::new(0));
    let total = Arc::new(AtomicU64::new(0));
    let results = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for t in 0..cfg.threads {
        let (cfg, patterns, phase, measured, total, results) = (
            cfg.clone(),
            Arc::clone(&patterns),
            Arc::clone(&phase),
            Arc::clone(&measured),
            Arc::clone(&total),
            Arc::clone(&results),
        );
        handles.push(std::thread::spawn(move || {
            let report = drive(&cfg, t, addr, &patterns, &phase, &measured, &total);
            results.lock().unwrap().push(report);
        }));
    }
    let progress = cfg.progress.then(|| {
        let (phase, total) = (Arc::clone(&phase), Arc::clone(&total));
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut last = 0;
            while phase.load(Ordering::Relaxed) != PHASE_STOP {
                std::thread::sleep(Duration::from_secs(1));
                let now = total.load(Ordering::Relaxed);
                let stage = if phase.load(Ordering::Relaxed) == PHASE_WARMUP {
                    "warm-up"
                } else {
                    "measuring"
                };
                eprintln!(
                    "  {:>5.0} s  {stage:9}  {:>12} requests  {:>10} /s",
                    started.elapsed().as_secs_f64(),
                    now,
                    now - last
                );
                last = now;
            }
        })
    });
    std::thread::sleep(cfg.warmup);
    let histograms_before = cfg.server_metrics.and_then(scrape_or_say);
    let cpu_before = server_cpu();
    let started = Instant::now();
    phase.store(PHASE_MEASURE, Ordering::SeqCst);
    loop {
        std::thread::sleep(Duration::from_millis(5));
        let done_by_time = cfg.duration.is_some_and(|d| started.elapsed() >= d);
        let done_by_count = cfg
            .operations
            .is_some_and(|n| measured.load(Ordering::Relaxed) >= n);
        let all_gone = handles.iter().all(|h| h.is_finished());
        if done_by_time || done_by_count || all_gone {
            break;
        }
    }
    phase.store(PHASE_STOP, Ordering::SeqCst);
    let seconds = started.elapsed().as_secs_f64();
    let cpu_after = server_cpu();
    for h in handles {
        h.join().map_err(|_| "a load thread panicked".to_string())?;
    }
    if let Some(p) = progress {
        let _ = p.join();
    }
    // After every connection's last reply: the server has recorded all it will.
    let histograms_after = cfg.server_metrics.and_then(scrape_or_say);
    let mut report = LoadReport::default();
    for r in results.lock().unwrap().iter() {
        report.merge(r);
    }
    report.seconds = seconds;
    report.requests_per_second = report.requests as f64 / seconds;
    report.get = report.get_latency.summary();
    report.set = report.set_latency.summary();
    report.error_replies.sort();
    if let (Some(before), Some(after)) = (&histograms_before, &histograms_after) {
        report.server_latency = server_latency::between(before, after, &["get", "set"]);
    }
    report.server_cpu_per_second = match (cpu_before, cpu_after) {
        (Some(a), Some(b)) => Some((b - a) / seconds),
        _ => None,
    };
    Ok(report)
}

/// The server's histograms, or `None` with the reason on stderr (the load goes on).
fn scrape_or_say(addr: SocketAddr) -> Option<server_latency::Histograms> {
    server_latency::scrape(addr)
        .inspect_err(|e| eprintln!("server latency not read: {e}"))
        .ok()
}

fn check(cfg: &LoadConfig) -> Result<(), String> {
    if cfg.threads == 0 || cfg.connections == 0 || cfg.pipeline == 0 {
        return Err("threads, connections and pipeline must each be at least 1".into());
    }
    if cfg.keys == 0 {
        return Err("at least one key".into());
    }
    if cfg.duration.is_none() && cfg.operations.is_none() {
        return Err("give a duration or an operation count".into());
    }
    if cfg.value_size.max() > u64::from(u32::MAX) - 1024 {
        return Err("values must be under 4 GiB".into());
    }
    Ok(())
}

/// SETs every key once, the keys split over the threads, 32 in flight per thread.
fn prefill(cfg: &LoadConfig, addr: SocketAddr, patterns: &Arc<Patterns>) -> Result<(), String> {
    let handles: Vec<_> = (0..cfg.threads)
        .map(|t| {
            let (cfg, patterns) = (cfg.clone(), Arc::clone(patterns));
            std::thread::spawn(move || -> Result<(), String> {
                let mut conn = Conn::connect(addr, cfg.io_timeout)
                    .map_err(|e| format!("prefill: connecting to {addr}: {e}"))?;
                let mut rng = super::rng::Rng::new(cfg.seed ^ 0x5eed ^ t as u64);
                let keys: Vec<u64> = (t as u64..cfg.keys).step_by(cfg.threads).collect();
                for batch in keys.chunks(32) {
                    for &key in batch {
                        let len = cfg.value_size.next(&mut rng);
                        conn.queue_set(
                            key_name(&cfg.key_prefix, key).as_bytes(),
                            patterns.value(key, len),
                            cfg.ttl_seconds,
                        )
                        .map_err(|e| format!("prefill: {e}"))?;
                    }
                    conn.flush().map_err(|e| format!("prefill: {e}"))?;
                    for &key in batch {
                        let reply = conn.read_reply(None).map_err(|e| format!("prefill: {e}"))?;
                        if reply.status != STATUS_OK {
                            return Err(format!(
                                "prefill: SET of key {key} answered status {:#06x}",
                                reply.status
                            ));
                        }
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join()
            .map_err(|_| "a prefill thread panicked".to_string())??;
    }
    Ok(())
}

/// One load thread.
fn drive(
    cfg: &LoadConfig,
    thread: usize,
    addr: SocketAddr,
    patterns: &Patterns,
    phase: &AtomicU8,
    measured: &AtomicU64,
    total: &AtomicU64,
) -> LoadReport {
    let mut report = LoadReport::default();
    let fail = |report: &mut LoadReport, err: String| {
        report.connection_errors += 1;
        report.first_error.get_or_insert(err);
    };
    if let Some(cpus) = &cfg.client_cpus {
        if let Err(err) = pin_current_thread(cpus) {
            fail(&mut report, err);
            return report;
        }
    }
    let mut conns = Vec::new();
    for _ in 0..cfg.connections {
        match Conn::connect(addr, cfg.io_timeout) {
            Ok(c) => conns.push(c),
            Err(e) => fail(&mut report, format!("connecting to {addr}: {e}")),
        }
    }
    let seed = cfg
        .seed
        .wrapping_mul(0x9E37_79B9)
        .wrapping_add(thread as u64);
    let mut workload = Workload::new(
        seed,
        KeySampler::new(cfg.keys, &cfg.key_dist),
        cfg.value_size.clone(),
        cfg.ratio,
    );
    let mut ops = Vec::with_capacity(cfg.pipeline);
    let mut alive: Vec<bool> = vec![true; conns.len()];
    while phase.load(Ordering::Relaxed) != PHASE_STOP && alive.iter().any(|&a| a) {
        for (c, conn) in conns.iter_mut().enumerate() {
            if !alive[c] {
                continue;
            }
            let recording = phase.load(Ordering::Relaxed) == PHASE_MEASURE;
            ops.clear();
            // A request's latency starts before its bytes are written: a large value's write
            // blocks until the server has read most of it.
            let sent_at = Instant::now();
            let mut queued = Ok(());
            for _ in 0..cfg.pipeline {
                let op = workload.next_op();
                queued = queued.and_then(|()| match op {
                    Op::Get { key } => conn.queue_get(key_name(&cfg.key_prefix, key).as_bytes()),
                    Op::Set { key, value_bytes } => conn.queue_set(
                        key_name(&cfg.key_prefix, key).as_bytes(),
                        patterns.value(key, value_bytes),
                        cfg.ttl_seconds,
                    ),
                });
                ops.push(op);
            }
            if let Err(e) = queued.and_then(|()| conn.flush()) {
                fail(&mut report, format!("sending: {e}"));
                alive[c] = false;
                continue;
            }
            for &op in &ops {
                let key = match op {
                    Op::Get { key } | Op::Set { key, .. } => key,
                };
                let mut check = |offset: usize, piece: &[u8]| Patterns::matches(key, offset, piece);
                let verify: Option<ValueCheck> = match (op, cfg.verify) {
                    (Op::Get { .. }, true) => Some(&mut check),
                    _ => None,
                };
                let reply = match conn.read_reply(verify) {
                    Ok(r) => r,
                    Err(e) => {
                        fail(&mut report, format!("reading a reply: {e}"));
                        alive[c] = false;
                        break;
                    }
                };
                let us = sent_at.elapsed().as_micros() as u64;
                total.fetch_add(1, Ordering::Relaxed);
                if !recording {
                    continue;
                }
                measured.fetch_add(1, Ordering::Relaxed);
                report.requests += 1;
                match (op, reply.status) {
                    (Op::Get { .. }, STATUS_OK) => {
                        report.get_latency.record_us(us);
                        report.get_hits += 1;
                        report.value_bytes_received += reply.value_len;
                        if !reply.value_ok {
                            report.wrong_values += 1;
                        }
                    }
                    (Op::Get { .. }, STATUS_NOT_FOUND) => {
                        report.get_latency.record_us(us);
                        report.get_misses += 1;
                    }
                    (Op::Set { value_bytes, .. }, STATUS_OK) => {
                        report.set_latency.record_us(us);
                        report.sets_stored += 1;
                        report.value_bytes_sent += value_bytes;
                    }
                    (_, status) => match report.error_replies.iter_mut().find(|e| e.0 == status) {
                        Some(e) => e.1 += 1,
                        None => report.error_replies.push((status, 1)),
                    },
                }
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_per_key_and_checkable_in_pieces() {
        let p = Patterns::new(1000);
        let v = p.value(7, 600);
        assert_eq!(v.len(), 600);
        assert!(Patterns::matches(7, 0, &v[..100]));
        assert!(Patterns::matches(7, 100, &v[100..]));
        assert!(!Patterns::matches(8, 0, v));
        let mut bad = v.to_vec();
        bad[599] ^= 1;
        assert!(!Patterns::matches(7, 0, &bad));
    }

    #[test]
    fn bad_configurations_are_refused() {
        let mut cfg = LoadConfig {
            threads: 0,
            ..LoadConfig::default()
        };
        assert!(check(&cfg).is_err());
        cfg.threads = 1;
        cfg.duration = None;
        assert!(check(&cfg).is_err());
        cfg.operations = Some(10);
        assert!(check(&cfg).is_ok());
    }
}
