//! Look-ahead benchmark: ns per GET of pipelined batches of binary GETs, run against the
//! partitions as a connection runs them (decode, lock the key's partition, look up, copy the
//! value into the reply), with and without the look ahead (`server::lookahead`: the index lines
//! of the whole batch prefetched, then each request's records a few requests ahead).
//!
//!   cargo bench --bench lookahead [-- --rounds N]
//!
//! Both ways run in the same process over the same stores and batches, alternating every chunk
//! of batches (the order flipping each round), so a noisy host moves both alike. It prints the
//! median over rounds of each and their ratio, for an index that fits the last-level cache
//! (100,000 keys) and one that does not (2,000,000 keys). CPU time per request, not the
//! server's: the kernel's TCP work, which dominates a real request, is not in these figures.

use std::time::Instant;

use headroom::arena::batch::install_core_batch;
use headroom::server::lookahead::{Lookahead, FRAMES};

mod common;
use common::gets::{filled_partitions, get_batches, run_batch};
use common::{arena, median};

const VALUE_BYTES: usize = 32;
const PARTITIONS: usize = 32;
const BATCHES_PER_CHUNK: usize = 2_000;

fn measure(keys: u64, rounds: usize) {
    let arena = arena((keys * 160).next_power_of_two().max(256 << 20), 16);
    install_core_batch();
    let partitions = filled_partitions(&arena, PARTITIONS, keys, VALUE_BYTES);
    let batches = get_batches(keys, 0x9e37_79b9_7f4a_7c15, BATCHES_PER_CHUNK);
    let mut lookahead = Lookahead::default();
    let mut out = Vec::with_capacity(FRAMES * VALUE_BYTES);
    let mut chunk = |with: bool| -> f64 {
        let started = Instant::now();
        let mut copied = 0;
        for batch in &batches {
            out.clear();
            copied += run_batch(&partitions, batch, with.then_some(&mut lookahead), &mut out);
        }
        assert_eq!(
            copied,
            batches.len() * FRAMES * VALUE_BYTES,
            "every GET a hit"
        );
        started.elapsed().as_nanos() as f64 / (batches.len() * FRAMES) as f64
    };
    chunk(false);
    chunk(true);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            without.push(chunk(false));
            with.push(chunk(true));
        } else {
            with.push(chunk(true));
            without.push(chunk(false));
        }
    }
    let ratios: Vec<f64> = with.iter().zip(&without).map(|(w, o)| w / o).collect();
    println!(
        "| {keys} | {:.1} | {:.1} | {:.2} |",
        median(without),
        median(with),
        median(ratios)
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if common::listing_only(&args) {
        return; // `cargo test --benches` compiles and lists; the figures come from `cargo bench`
    }
    let rounds = common::arg(&args, "--rounds").unwrap_or(31);
    println!(
        "Batches of {FRAMES} binary GETs of {VALUE_BYTES} B values, random keys, {PARTITIONS} \
         partitions; median of {rounds} alternating rounds of {BATCHES_PER_CHUNK} batches"
    );
    println!("| keys | ns per GET, no look ahead | with it | with / without (median of pairs) |");
    println!("| --- | --- | --- | --- |");
    for keys in [100_000, 2_000_000] {
        measure(keys, rounds);
    }
}
