//! Model-based test of the extent allocator: against a byte-map model, random allocate / free /
//! allocate-at sequences never overlap, always coalesce, keep free bytes exact, and honour the
//! `largest_free_region` contract at every step (that many bytes succeed, one granule more fails).

mod common;

use common::{for_each_seed, Rng};
use headroom::segment::{Extent, ExtentAllocator};

#[test]
fn extent_allocator_model() {
    for_each_seed("extent_model", 300, |seed| {
        let mut rng = Rng::new(seed);
        let granule = 4096u64 << rng.below(2);
        let granules = 1 + rng.below(512);
        let capacity = granules * granule;
        let mut alloc = ExtentAllocator::new(capacity, granule);
        // Model: which granules are used.
        let mut used = vec![false; granules as usize];
        let mut live: Vec<Extent> = Vec::new();
        for step in 0..400 {
            match rng.below(10) {
                0..=5 => {
                    let bytes = 1 + rng.below(capacity / 4 + 1);
                    let largest = alloc.largest_free_region();
                    match alloc.allocate(bytes) {
                        Ok(extent) => {
                            assert!(
                                extent.len >= bytes && extent.len - bytes < granule,
                                "step {step}: rounding"
                            );
                            assert_eq!(extent.offset % granule, 0);
                            for g in extent.offset / granule..extent.end() / granule {
                                assert!(!used[g as usize], "step {step}: overlap");
                                used[g as usize] = true;
                            }
                            live.push(extent);
                        }
                        Err(err) => {
                            assert!(
                                alloc.rounded(bytes).unwrap() > largest,
                                "step {step}: refused though a hole fits"
                            );
                            assert_eq!((err.largest_hole, err.free), (largest, alloc.free_bytes()));
                        }
                    }
                }
                6..=8 => {
                    if !live.is_empty() {
                        let extent = live.swap_remove(rng.below(live.len() as u64) as usize);
                        alloc.free(extent);
                        for g in extent.offset / granule..extent.end() / granule {
                            used[g as usize] = false;
                        }
                    }
                }
                _ => {
                    // allocate_at: a random granule-aligned range; succeeds iff it is all free.
                    let start = rng.below(granules);
                    let len = 1 + rng.below((granules - start).min(8));
                    let extent = Extent {
                        offset: start * granule,
                        len: len * granule,
                    };
                    let all_free = (start..start + len).all(|g| !used[g as usize]);
                    assert_eq!(
                        alloc.allocate_at(extent).is_ok(),
                        all_free,
                        "step {step}: allocate_at"
                    );
                    if all_free {
                        (start..start + len).for_each(|g| used[g as usize] = true);
                        live.push(extent);
                    }
                }
            }
            alloc.check_invariants();
            let free_granules = used.iter().filter(|u| !**u).count() as u64;
            assert_eq!(
                alloc.free_bytes(),
                free_granules * granule,
                "step {step}: free bytes"
            );
            // The largest run of free granules in the model is the allocator's largest region.
            let mut best = 0u64;
            let mut run = 0u64;
            for u in &used {
                run = if *u { 0 } else { run + 1 };
                best = best.max(run);
            }
            assert_eq!(
                alloc.largest_free_region(),
                best * granule,
                "step {step}: largest region"
            );
            // The contract, checked on a copy: that many bytes succeed, one granule more fails.
            let mut probe = alloc.clone();
            if best > 0 {
                assert!(
                    probe.allocate(best * granule).is_ok(),
                    "step {step}: largest region refused"
                );
            }
            let mut probe = alloc.clone();
            assert!(
                probe.allocate(best * granule + granule).is_err(),
                "step {step}: more than the largest fits"
            );
        }
        for extent in live {
            alloc.free(extent);
        }
        alloc.check_invariants();
        assert_eq!(
            alloc.largest_free_region(),
            capacity,
            "everything coalesces back into one hole"
        );
    });
}
