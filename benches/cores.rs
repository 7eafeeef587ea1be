//! Cores benchmark: what sharing partitions between cores costs a GET. Pipelined batches of
//! binary GETs run against the partitions as a connection runs them (look ahead, decode, lock
//! the key's partition, look up, copy the value out), three ways:
//!
//! - one core alone over the partitions;
//! - two cores at once over the same partitions (each pinned to its own CPU): every partition's
//!   lock word, store fields and touched records move between the cores' caches;
//! - two cores at once, each over partitions of its own (same key count each): the cost of two
//!   busy CPUs without the sharing (memory bandwidth, a host's sibling threads).
//!
//!   cargo bench --bench cores [-- --rounds N] [--set-every N]
//!
//! `--set-every 11` makes every 11th request a SET of the same size (memtier's
//! `--ratio=1:10`): a SET writes the partition's allocator state, index and records, which the
//! other core then reads.
//!
//! Prints the median ns per GET of each over rounds (the order rotating each round). CPU time
//! per request, not the server's: the kernel's TCP work is not in these figures.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use headroom::arena::batch::install_core_batch;
use headroom::bench::process::pin_current_thread;
use headroom::server::lookahead::{Lookahead, FRAMES};
use headroom::store::partition::Partitions;

mod common;
use common::gets::{filled_partitions, request_batches, run_batch};
use common::{arena, median};

const VALUE_BYTES: usize = 32;
const PARTITIONS: usize = 16;
const BATCHES_PER_CHUNK: usize = 4_000;

/// ns per request over every batch, run as a connection runs them.
fn run(partitions: &Partitions, batches: &[Vec<u8>]) -> f64 {
    let mut lookahead = Lookahead::default();
    let mut out = Vec::with_capacity(FRAMES * VALUE_BYTES);
    let started = Instant::now();
    for batch in batches {
        out.clear();
        run_batch(partitions, batch, Some(&mut lookahead), &mut out);
    }
    started.elapsed().as_nanos() as f64 / (batches.len() * FRAMES) as f64
}

/// What one core runs: the partitions it looks keys up in, and its batches of GET frames.
type CoreWork = (Arc<Partitions>, Arc<Vec<Vec<u8>>>);

/// Runs `per_core` on CPUs 0, 1, ... at once; the mean ns per request.
fn together(per_core: Vec<CoreWork>) -> f64 {
    let start = Arc::new(Barrier::new(per_core.len()));
    let threads: Vec<_> = per_core
        .into_iter()
        .enumerate()
        .map(|(cpu, (partitions, batches))| {
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                pin_current_thread(&[cpu]).expect("pin");
                install_core_batch();
                start.wait();
                run(&partitions, &batches)
            })
        })
        .collect();
    let ns: Vec<f64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    ns.iter().sum::<f64>() / ns.len() as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if common::listing_only(&args) {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        println!("cores: needs two CPUs (threads are pinned to CPUs 0 and 1); this host has one");
        return;
    }
    let rounds = common::arg(&args, "--rounds").unwrap_or(15);
    let keys: u64 = common::arg(&args, "--keys").unwrap_or(100_000);
    let set_every: u64 = common::arg(&args, "--set-every").unwrap_or(0);
    let arena = arena((keys * 2 * 160).next_power_of_two().max(512 << 20), 16);
    install_core_batch();
    let shared = Arc::new(filled_partitions(&arena, PARTITIONS, keys, VALUE_BYTES));
    let own = Arc::new(filled_partitions(&arena, PARTITIONS, keys, VALUE_BYTES));
    let work: Vec<Arc<Vec<Vec<u8>>>> = (0..2)
        .map(|core| {
            Arc::new(request_batches(
                keys,
                0x9e37_79b9 + core,
                BATCHES_PER_CHUNK,
                set_every,
                VALUE_BYTES,
            ))
        })
        .collect();
    let ways: [(&str, Vec<CoreWork>); 3] = [
        ("one core", vec![(shared.clone(), work[0].clone())]),
        (
            "two cores, shared partitions",
            vec![
                (shared.clone(), work[0].clone()),
                (shared.clone(), work[1].clone()),
            ],
        ),
        (
            "two cores, partitions of their own",
            vec![
                (shared.clone(), work[0].clone()),
                (own.clone(), work[1].clone()),
            ],
        ),
    ];
    let mut ns = vec![Vec::new(); ways.len()];
    for round in 0..rounds + 1 {
        for i in 0..ways.len() {
            let way = (i + round) % ways.len();
            let took = together(ways[way].1.clone());
            if round > 0 {
                ns[way].push(took);
            }
        }
    }
    let (requests, unit) = if set_every > 0 {
        (format!("requests (every {set_every}th a SET)"), "request")
    } else {
        ("GETs".to_string(), "GET")
    };
    println!(
        "Batches of {FRAMES} binary {requests} of {VALUE_BYTES} B values over {keys} random \
         keys, {PARTITIONS} partitions; median of {rounds} rounds of {BATCHES_PER_CHUNK} \
         batches a core"
    );
    // The host's speed drifts from round to round; a round's ways ran side by side, so the
    // cost of sharing is read from each round's difference, not from the medians'.
    let sharing: Vec<f64> = ns[1].iter().zip(&ns[2]).map(|(s, o)| s - o).collect();
    println!("| way | ns per {unit} |");
    println!("| --- | --- |");
    for ((name, _), ns) in ways.iter().zip(ns) {
        println!("| {name} | {:.1} |", median(ns));
    }
    println!(
        "sharing the partitions costs {:.1} ns per {unit} (the median of the rounds' differences)",
        median(sharing)
    );
}
