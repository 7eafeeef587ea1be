//! The RL scenario of the best-fit RFC at a reduced size: 8 ranks write GRPO-style steps (5
//! stages of 12 to 16 keys each, sizes spread over orders of magnitude, plus one whole object
//! per step), and every step is removed two steps later. Sizes are the RFC's divided by 64:
//! 16 targets of 64 MiB, small objects of 4 KiB to 5 MiB, one 16 to 40 MiB object per step. Random placement fails from
//! fragmentation with plenty of space free; best fit, on the same sequence, does not fail
//! until the store is really near full.

mod common;

use common::Rng;
use headroom::placement::{PlacementRequest, Placer, Policy, TargetId, TargetKind, TargetSpec};
use headroom::segment::Extent;

const MIB: u64 = 1 << 20;
const TARGETS: u64 = 16;
const TARGET_BYTES: u64 = 64 * MIB;

struct Outcome {
    failures: Vec<(u64, u64, u64)>, // (size, free, largest hole) at each failure
}

fn log_uniform(rng: &mut Rng, low: u64, high: u64) -> u64 {
    let (l, h) = ((low as f64).ln(), (high as f64).ln());
    let unit = rng.below(1 << 30) as f64 / (1u64 << 30) as f64;
    (l + (h - l) * unit).exp() as u64
}

/// The step sequence: per step, every object's size (the last one the whole large object).
fn steps(seed: u64, count: usize) -> Vec<Vec<u64>> {
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|_| {
            let mut sizes = Vec::new();
            for _rank in 0..8 {
                for _stage in 0..5 {
                    for _ in 0..(12 + rng.below(5)) {
                        sizes.push(log_uniform(&mut rng, 4 << 10, 5 * MIB));
                    }
                }
            }
            sizes.push(16 * MIB + rng.below(24 * MIB));
            sizes
        })
        .collect()
}

fn replay(policy: Policy, sequence: &[Vec<u64>]) -> Outcome {
    let mut placer = Placer::new(0, policy, 42);
    for i in 0..TARGETS {
        placer
            .mount(TargetSpec {
                uuid: u128::from(i) + 1,
                name: format!("seg{i}"),
                host: 0,
                kind: TargetKind::Mem,
                base: 0,
                size: TARGET_BYTES,
                locality: Some(0),
                granule: 4096,
            })
            .unwrap();
    }
    let mut live: Vec<Vec<(TargetId, Extent)>> = Vec::new();
    let mut failures = Vec::new();
    for sizes in sequence {
        if live.len() == 2 {
            for (id, extent) in live.remove(0) {
                placer.free(id, extent);
            }
        }
        let mut step = Vec::new();
        for &size in sizes {
            let mut req = PlacementRequest::new(size);
            req.hint.node = Some(0);
            match placer.place(&req) {
                Ok(placed) => step.extend(placed.replicas),
                Err(_) => {
                    let (free, largest) = placer.free_and_largest_hole();
                    failures.push((size, free, largest));
                }
            }
        }
        live.push(step);
    }
    Outcome { failures }
}

#[test]
fn best_fit_keeps_large_holes_where_random_fragments() {
    let sequence = steps(7, 60);
    let random = replay(Policy::Random, &sequence);
    let best_fit = replay(Policy::BestFit, &sequence);
    let capacity = TARGETS * TARGET_BYTES;
    println!(
        "random failures: {:?}",
        random
            .failures
            .iter()
            .map(|f| (f.0 / MIB, f.1 / MIB, f.2 / MIB))
            .collect::<Vec<_>>()
    );
    println!(
        "best_fit failures: {:?}",
        best_fit
            .failures
            .iter()
            .map(|f| (f.0 / MIB, f.1 / MIB, f.2 / MIB))
            .collect::<Vec<_>>()
    );
    assert!(
        random
            .failures
            .iter()
            .any(|&(size, free, _)| free > 4 * size),
        "random should fail from fragmentation with far more than the object free"
    );
    for &(size, free, _) in &best_fit.failures {
        assert!(
            free < capacity / 10,
            "best fit failed a {size}-byte object with {free} bytes free: not near full"
        );
    }
    assert!(best_fit.failures.len() < random.failures.len());
}
