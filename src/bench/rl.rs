//! `headroom-bench rl`: the RL lifetime pattern as live traffic. N ranks (threads) write each
//! step's keys with SETX, read them back, and delete the step written two steps before; the
//! ranks move from step to step together. A failed SET is classified from the server's own
//! STAT `segments`: capacity (free bytes below the request) or fragmentation (enough free
//! bytes, no hole large enough).

use std::net::SocketAddr;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::client::{setx_extras, Conn, DELETE, SETX, STATUS_NOT_FOUND, STATUS_OK};
use super::load::Patterns;
use super::replay::{rl_events, RlPattern};
use super::stats::{Latency, Summary};
use super::trace::EventKind;

#[derive(Clone, Debug, Serialize)]
pub struct RlFailure {
    pub step: u32,
    pub key: String,
    pub size_bytes: u64,
    pub status: u16,
    pub free_bytes: u64,
    pub largest_hole_bytes: u64,
    /// "capacity", "fragmentation", or "other" (a status that is not out of memory).
    pub class: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RlReport {
    pub steps: u32,
    pub ranks: u32,
    pub puts: u64,
    pub put_bytes: u64,
    pub reads: u64,
    pub deletes: u64,
    pub failures: Vec<RlFailure>,
    /// Reads whose bytes or length were wrong, and reads of keys that should have been there.
    pub wrong_reads: u64,
    pub missing_reads: u64,
    pub seconds: f64,
    pub put: Summary,
    pub get: Summary,
    #[serde(skip)]
    pub put_latency: Latency,
    #[serde(skip)]
    pub get_latency: Latency,
}

fn key_seed(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Free bytes and the largest hole over the server's targets (STAT `segments`).
fn space(conn: &mut Conn) -> (u64, u64) {
    let Ok(stats) = conn.stats("segments") else {
        return (0, 0);
    };
    let (mut capacity, mut used, mut largest) = (0u64, 0u64, 0u64);
    for (name, value) in stats {
        let v: u64 = value.parse().unwrap_or(0);
        if name.ends_with("_capacity") {
            capacity += v;
        } else if name.ends_with("_used") {
            used += v;
        } else if name.ends_with("_largest_free") {
            largest = largest.max(v);
        }
    }
    (capacity.saturating_sub(used), largest)
}

/// Runs the pattern against `addr` with one thread per rank.
pub fn run(addr: SocketAddr, pattern: &RlPattern, ttl_seconds: u32) -> Result<RlReport, String> {
    let events = rl_events(pattern);
    // Each rank's puts per step, and the keys removed at the start of each step.
    let steps = pattern.steps as usize;
    let ranks = pattern.ranks.max(1) as usize;
    let mut puts: Vec<Vec<Vec<(String, u64)>>> = vec![vec![Vec::new(); ranks]; steps];
    let mut removes: Vec<Vec<Vec<String>>> = vec![vec![Vec::new(); ranks]; steps];
    let step_of = |key: &str| -> usize { key[1..key.find('/').unwrap()].parse().unwrap() };
    let rank_of = |key: &str| -> usize {
        key.split('/')
            .nth(1)
            .and_then(|r| r.strip_prefix('r'))
            .and_then(|r| r.parse().ok())
            .unwrap_or(0)
    };
    for e in &events {
        match e.kind {
            EventKind::Put => {
                puts[step_of(&e.key)][rank_of(&e.key)].push((e.key.clone(), e.size_bytes))
            }
            EventKind::Remove => {
                let step = step_of(&e.key) + pattern.lifetime_steps as usize;
                removes[step][rank_of(&e.key)].push(e.key.clone());
            }
        }
    }
    let max_bytes = events.iter().map(|e| e.size_bytes).max().unwrap_or(0);
    let patterns = Arc::new(Patterns::new(max_bytes));
    let barrier = Arc::new(Barrier::new(ranks));
    let report = Arc::new(Mutex::new(RlReport {
        steps: pattern.steps,
        ranks: ranks as u32,
        ..RlReport::default()
    }));
    let (puts, removes) = (Arc::new(puts), Arc::new(removes));
    let started = Instant::now();
    let handles: Vec<_> = (0..ranks)
        .map(|rank| {
            let (patterns, barrier, report, puts, removes) = (
                Arc::clone(&patterns),
                Arc::clone(&barrier),
                Arc::clone(&report),
                Arc::clone(&puts),
                Arc::clone(&removes),
            );
            std::thread::spawn(move || -> Result<(), String> {
                let mut conn = Conn::connect(addr, Duration::from_secs(120))
                    .map_err(|e| format!("rank {rank}: connecting to {addr}: {e}"))?;
                let mut mine = RlReport::default();
                let io = |e: std::io::Error| format!("rank {rank}: {e}");
                for step in 0..steps {
                    barrier.wait();
                    for key in &removes[step][rank] {
                        conn.queue(DELETE, &[], key.as_bytes(), &[]).map_err(io)?;
                        conn.flush().map_err(io)?;
                        let reply = conn.read_reply(None).map_err(io)?;
                        mine.deletes += u64::from(reply.status == STATUS_OK);
                    }
                    let mut stored = Vec::new();
                    for (key, size) in &puts[step][rank] {
                        let value = patterns.value(key_seed(key), *size);
                        let t = Instant::now();
                        conn.queue(SETX, &setx_extras(ttl_seconds, 1), key.as_bytes(), value)
                            .map_err(io)?;
                        conn.flush().map_err(io)?;
                        let reply = conn.read_reply(None).map_err(io)?;
                        mine.put_latency.record_us(t.elapsed().as_micros() as u64);
                        if reply.status == STATUS_OK {
                            mine.puts += 1;
                            mine.put_bytes += size;
                            stored.push((key.clone(), *size));
                        } else {
                            let (free, largest) = space(&mut conn);
                            let class = if reply.status != super::client::STATUS_OUT_OF_MEMORY {
                                "other"
                            } else if free >= *size {
                                "fragmentation"
                            } else {
                                "capacity"
                            };
                            mine.failures.push(RlFailure {
                                step: step as u32,
                                key: key.clone(),
                                size_bytes: *size,
                                status: reply.status,
                                free_bytes: free,
                                largest_hole_bytes: largest,
                                class: class.into(),
                            });
                        }
                    }
                    for (key, size) in &stored {
                        let seed = key_seed(key);
                        let t = Instant::now();
                        conn.queue_get(key.as_bytes()).map_err(io)?;
                        conn.flush().map_err(io)?;
                        let mut check =
                            |at: usize, piece: &[u8]| Patterns::matches(seed, at, piece);
                        let reply = conn.read_reply(Some(&mut check)).map_err(io)?;
                        mine.get_latency.record_us(t.elapsed().as_micros() as u64);
                        mine.reads += 1;
                        if reply.status == STATUS_NOT_FOUND {
                            mine.missing_reads += 1;
                        } else if reply.status != STATUS_OK
                            || reply.value_len != *size
                            || !reply.value_ok
                        {
                            mine.wrong_reads += 1;
                        }
                    }
                }
                let mut all = report.lock().unwrap();
                all.puts += mine.puts;
                all.put_bytes += mine.put_bytes;
                all.reads += mine.reads;
                all.deletes += mine.deletes;
                all.failures.extend(mine.failures);
                all.wrong_reads += mine.wrong_reads;
                all.missing_reads += mine.missing_reads;
                all.put_latency.add(&mine.put_latency);
                all.get_latency.add(&mine.get_latency);
                Ok(())
            })
        })
        .collect();
    let mut first_error = None;
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(_) => {
                first_error.get_or_insert("a rank panicked".to_string());
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let mut report = Arc::try_unwrap(report)
        .map_err(|_| "ranks still running")?
        .into_inner()
        .unwrap();
    report.seconds = started.elapsed().as_secs_f64();
    report.failures.sort_by_key(|f| (f.step, f.key.clone()));
    report.put = report.put_latency.summary();
    report.get = report.get_latency.summary();
    Ok(report)
}
