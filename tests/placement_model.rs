//! Property tests of placement against an exhaustive oracle on synthetic topologies (2 hosts x
//! 2 nodes plus unknown-locality targets, and 10,000 targets): preferred first, tier order,
//! excluded never used, distinct targets and hosts per replica, strict never leaves its node,
//! best fit always the tightest fit, errors only when nothing fits, same seed same placements.

mod common;

use std::collections::HashSet;

use common::{for_each_seed, Rng};
use headroom::placement::{
    LocalityHint, Placed, PlacementError, PlacementRequest, Placer, Policy, TargetId, TargetKind,
    TargetSpec, TargetStatus,
};
use headroom::segment::Extent;

const GRANULE: u64 = 4096;
const LOCAL: u32 = 0;

fn spec(i: u32, host: u32, node: Option<u32>, granules: u64) -> TargetSpec {
    TargetSpec {
        uuid: u128::from(i) + 1,
        name: format!("seg{i}"),
        host,
        kind: TargetKind::Mem,
        base: 0,
        size: granules * GRANULE,
        locality: node,
        granule: GRANULE,
    }
}

fn tier(placer: &Placer, id: TargetId, hint: Option<u32>) -> usize {
    let t = placer.target(id).unwrap();
    match (t.spec.host == LOCAL, t.spec.locality) {
        (false, _) => 3,
        (true, None) => 1,
        (true, Some(n)) if Some(n) == hint => 0,
        (true, Some(_)) => 2,
    }
}

/// Snapshot of every target's (largest hole, free ratio, host, status) before a request.
fn snapshot(placer: &Placer) -> Vec<(TargetId, u64, f64, u32, bool)> {
    placer
        .targets()
        .map(|(id, t)| {
            let ratio = t.alloc.free_bytes() as f64 / t.alloc.capacity() as f64;
            (
                id,
                t.alloc.largest_free_region(),
                ratio,
                t.spec.host,
                t.status == TargetStatus::Active,
            )
        })
        .collect()
}

/// Checks one placement outcome against the rules, replica by replica.
fn check(
    placer: &Placer,
    before: &[(TargetId, u64, f64, u32, bool)],
    req: &PlacementRequest,
    outcome: &Result<Placed, PlacementError>,
    policy: Policy,
) {
    let rounded = req.size.next_multiple_of(GRANULE);
    let mut used_hosts: HashSet<u32> = HashSet::new();
    let mut used: HashSet<TargetId> = HashSet::new();
    let allowed_tiers: Vec<usize> = if req.hint.strict {
        vec![0]
    } else {
        vec![0, 1, 2, 3]
    };
    let available = |id: TargetId, used_hosts: &HashSet<u32>, used: &HashSet<TargetId>| {
        let &(_, _, _, host, active) = before.iter().find(|b| b.0 == id).unwrap();
        active && !req.excluded.contains(&id) && !used_hosts.contains(&host) && !used.contains(&id)
    };
    let largest = |id: TargetId| before.iter().find(|b| b.0 == id).unwrap().1;
    let ratio = |id: TargetId| before.iter().find(|b| b.0 == id).unwrap().2;
    let placed = match outcome {
        Ok(p) => p.replicas.clone(),
        Err(_) => Vec::new(),
    };
    for k in 0..=placed.len() {
        if k as u32 == req.replicas {
            break;
        }
        // What the rules say replica k must be.
        let preferred = req.preferred.iter().copied().find(|&id| {
            available(id, &used_hosts, &used)
                && largest(id) >= rounded
                && (!req.hint.strict || tier(placer, id, req.hint.node) == 0)
        });
        let mut expected_set: Vec<TargetId> = Vec::new();
        if let Some(id) = preferred {
            expected_set.push(id);
        } else {
            for &t in &allowed_tiers {
                let fitting: Vec<TargetId> = before
                    .iter()
                    .map(|b| b.0)
                    .filter(|&id| {
                        tier(placer, id, req.hint.node) == t
                            && available(id, &used_hosts, &used)
                            && largest(id) >= rounded
                    })
                    .collect();
                if fitting.is_empty() {
                    continue;
                }
                expected_set = match policy {
                    Policy::BestFit => {
                        let best = fitting.iter().map(|&id| largest(id)).min().unwrap();
                        fitting
                            .into_iter()
                            .filter(|&id| largest(id) == best)
                            .collect()
                    }
                    Policy::LargestHoleFirst => {
                        let best = fitting.iter().map(|&id| largest(id)).max().unwrap();
                        fitting
                            .into_iter()
                            .filter(|&id| largest(id) == best)
                            .collect()
                    }
                    Policy::FreeRatioFirst => {
                        let best = fitting.iter().map(|&id| ratio(id)).fold(f64::MIN, f64::max);
                        fitting
                            .into_iter()
                            .filter(|&id| ratio(id) == best)
                            .collect()
                    }
                    Policy::Random => fitting,
                };
                break;
            }
        }
        match placed.get(k) {
            Some(&(id, extent)) => {
                assert!(
                    expected_set.contains(&id),
                    "replica {k}: chose {id}, rules allow {expected_set:?} ({req:?})"
                );
                assert!(extent.len >= req.size && extent.len == rounded);
                used_hosts.insert(before.iter().find(|b| b.0 == id).unwrap().3);
                used.insert(id);
            }
            None => assert!(
                expected_set.is_empty(),
                "replica {k} was not placed though {expected_set:?} fit ({req:?})"
            ),
        }
    }
    if let Err(err) = outcome {
        match err {
            PlacementError::Strict { .. } => assert!(req.hint.strict),
            PlacementError::NoSpace { .. } => assert!(!req.hint.strict),
            PlacementError::Invalid(_) => unreachable!(),
        }
    }
}

fn random_request(rng: &mut Rng, targets: u32, max_granules: u64) -> PlacementRequest {
    let mut req = PlacementRequest::new(1 + rng.below(max_granules * GRANULE));
    req.replicas = 1 + rng.below(3) as u32;
    let node = if rng.chance(80) {
        Some(rng.below(3) as u32)
    } else {
        None
    };
    req.hint = LocalityHint {
        node,
        strict: node.is_some() && rng.chance(15),
    };
    for _ in 0..rng.below(3) {
        req.preferred
            .push(TargetId(rng.below(u64::from(targets)) as u32));
    }
    for _ in 0..rng.below(3) {
        req.excluded
            .push(TargetId(rng.below(u64::from(targets)) as u32));
    }
    req
}

fn build(rng: &mut Rng, policy: Policy, seed: u64, targets: u32) -> Placer {
    let mut placer = Placer::new(LOCAL, policy, seed);
    for i in 0..targets {
        let host = if rng.chance(70) {
            LOCAL
        } else {
            1 + rng.below(2) as u32
        };
        let node = if rng.chance(15) {
            None
        } else {
            Some(rng.below(2) as u32)
        };
        placer
            .mount(spec(i, host, node, 8 + rng.below(120)))
            .unwrap();
    }
    placer
}

fn run(
    seed: u64,
    policy: Policy,
    targets: u32,
    steps: usize,
) -> Vec<Result<Placed, PlacementError>> {
    let mut rng = Rng::new(seed);
    let mut placer = build(&mut rng, policy, seed, targets);
    let mut live: Vec<(TargetId, Extent)> = Vec::new();
    let mut outcomes = Vec::new();
    for _ in 0..steps {
        if rng.chance(35) && !live.is_empty() {
            let (id, extent) = live.swap_remove(rng.below(live.len() as u64) as usize);
            placer.free(id, extent);
        } else if rng.chance(3) {
            let id = TargetId(rng.below(u64::from(targets)) as u32);
            let status = if rng.chance(50) {
                TargetStatus::Draining
            } else {
                TargetStatus::Active
            };
            placer.set_status(id, status);
        } else {
            let req = random_request(&mut rng, targets, 40);
            let before = snapshot(&placer);
            let outcome = placer.place(&req);
            check(&placer, &before, &req, &outcome, policy);
            if let Ok(p) = &outcome {
                let ids: HashSet<TargetId> = p.replicas.iter().map(|r| r.0).collect();
                assert_eq!(ids.len(), p.replicas.len(), "two replicas on one target");
                live.extend(p.replicas.iter().copied());
            }
            outcomes.push(outcome);
        }
        placer.check_invariants();
    }
    outcomes
}

#[test]
fn placement_follows_the_rules_for_every_policy() {
    for policy in [
        Policy::BestFit,
        Policy::Random,
        Policy::FreeRatioFirst,
        Policy::LargestHoleFirst,
    ] {
        for_each_seed(&format!("placement_model/{}", policy.name()), 40, |seed| {
            run(seed, policy, 12, 300);
        });
    }
}

#[test]
fn the_same_seed_gives_the_same_placements() {
    for policy in [Policy::BestFit, Policy::Random, Policy::FreeRatioFirst] {
        for_each_seed(
            &format!("placement_determinism/{}", policy.name()),
            10,
            |seed| {
                assert_eq!(run(seed, policy, 12, 200), run(seed, policy, 12, 200));
            },
        );
    }
}

#[test]
fn best_fit_stays_correct_with_ten_thousand_targets() {
    for_each_seed("placement_10k", 1, |seed| {
        run(seed, Policy::BestFit, 10_000, 150);
    });
}

#[test]
fn strict_never_leaves_the_node_and_unknown_locality_never_fails_what_fits() {
    let mut placer = Placer::new(LOCAL, Policy::BestFit, 1);
    let on_node1 = placer.mount(spec(0, LOCAL, Some(1), 4)).unwrap();
    let unknown = placer.mount(spec(1, LOCAL, None, 100)).unwrap();
    let mut req = PlacementRequest::new(8 * GRANULE);
    req.hint = LocalityHint {
        node: Some(1),
        strict: true,
    };
    assert!(matches!(
        placer.place(&req),
        Err(PlacementError::Strict { node: Some(1), .. })
    ));
    req.hint.strict = false;
    let placed = placer.place(&req).unwrap();
    assert_eq!(
        placed.replicas[0].0, unknown,
        "falls back to unknown locality, never fails"
    );
    req.size = GRANULE;
    req.hint.strict = true;
    assert_eq!(placer.place(&req).unwrap().replicas[0].0, on_node1);
    assert_eq!(placer.stats.strict_failures, 1);
    // Strict needs a node to be strict about.
    let mut vague = PlacementRequest::new(GRANULE);
    vague.hint = LocalityHint {
        node: None,
        strict: true,
    };
    assert!(matches!(
        placer.place(&vague),
        Err(PlacementError::Invalid(_))
    ));
    // A request without any hint still places.
    let mut no_hint = PlacementRequest::new(GRANULE);
    no_hint.hint = LocalityHint::default();
    assert!(placer.place(&no_hint).is_ok());
}

#[test]
fn mounts_refuse_duplicates_and_overlaps() {
    let mut placer = Placer::new(LOCAL, Policy::BestFit, 1);
    placer.mount(spec(0, LOCAL, Some(0), 10)).unwrap();
    assert!(
        placer.mount(spec(0, LOCAL, Some(0), 10)).is_err(),
        "duplicate uuid"
    );
    let mut overlapping = spec(1, LOCAL, Some(0), 10);
    overlapping.name = "seg0".into();
    overlapping.base = 5 * GRANULE;
    assert!(
        placer.mount(overlapping).is_err(),
        "overlapping range of the same segment"
    );
    let mut elsewhere = spec(2, LOCAL, Some(0), 10);
    elsewhere.name = "seg0".into();
    elsewhere.base = 10 * GRANULE;
    assert!(placer.mount(elsewhere).is_ok(), "adjacent is fine");
}

#[test]
fn eviction_plans_free_the_least_recently_used_until_the_request_fits() {
    for_each_seed("placement_eviction", 60, |seed| {
        let mut rng = Rng::new(seed);
        let mut placer = Placer::new(LOCAL, Policy::BestFit, seed);
        for i in 0..4 {
            placer.mount(spec(i, LOCAL, Some(i % 2), 64)).unwrap();
        }
        // Use order per target, oldest first, as the model sees it.
        let mut order: Vec<Vec<Extent>> = vec![Vec::new(); 4];
        for step in 0..300 {
            if rng.chance(70) {
                let mut req = PlacementRequest::new(1 + rng.below(12 * GRANULE));
                req.hint.node = Some(rng.below(2) as u32);
                if let Ok(p) = placer.place(&req) {
                    let (id, e) = p.replicas[0];
                    order[id.0 as usize].push(e);
                    continue;
                }
                let bound = 1 + rng.below(8) as usize;
                match placer.eviction_plan(&req, bound) {
                    Some((id, victims)) => {
                        let lru = &order[id.0 as usize];
                        assert!(victims.len() <= bound, "step {step}: over the bound");
                        assert_eq!(
                            victims[..],
                            lru[..victims.len()],
                            "step {step}: not the least recently used"
                        );
                        for v in &victims {
                            placer.free(id, *v);
                        }
                        order[id.0 as usize].drain(..victims.len());
                        let placed = placer.place(&req).unwrap_or_else(|e| {
                            panic!("step {step}: still no room after the plan: {e}")
                        });
                        let (pid, pe) = placed.replicas[0];
                        order[pid.0 as usize].push(pe);
                    }
                    None => {
                        // No target could make room by freeing its `bound` oldest extents.
                        for (id, t) in placer.targets() {
                            let mut scratch = t.alloc.clone();
                            for e in order[id.0 as usize].iter().take(bound) {
                                scratch.free(*e);
                            }
                            assert!(
                                scratch.largest_free_region() < req.size.next_multiple_of(GRANULE),
                                "step {step}: {id} could have made room"
                            );
                        }
                    }
                }
            } else if rng.chance(50) {
                // A read moves an object to the back of its target's use order.
                let id = rng.below(4) as usize;
                if !order[id].is_empty() {
                    let at = rng.below(order[id].len() as u64) as usize;
                    let e = order[id].remove(at);
                    placer.touch(TargetId(id as u32), e.offset);
                    order[id].push(e);
                }
            } else {
                let id = rng.below(4) as usize;
                if !order[id].is_empty() {
                    let at = rng.below(order[id].len() as u64) as usize;
                    let e = order[id].remove(at);
                    placer.free(TargetId(id as u32), e);
                }
            }
            placer.check_invariants();
        }
    });
}
