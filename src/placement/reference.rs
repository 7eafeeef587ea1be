//! The reference the indexes are tested against: every decision of `Placer` made by scanning
//! every target, each rule written as plainly as it can be (best fit: the least (largest free
//! region, id) that holds the object). Tests only (through `place_exhaustive` and
//! `eviction_plan_exhaustive`); O(S) per request by design.

use std::collections::HashSet;

use super::index::rotation;
use super::{
    splitmix, Extent, Group, PlacementRequest, Placer, Policy, Progress, TargetId, TargetStatus,
};

impl Placer {
    pub(super) fn granule_exhaustive(&self) -> u64 {
        self.targets()
            .map(|(_, t)| t.alloc.granule())
            .max()
            .unwrap_or(1)
    }

    pub(super) fn free_and_largest_hole_exhaustive(&self) -> (u64, u64) {
        self.targets().fold((0, 0), |(free, largest), (_, t)| {
            (
                free + t.alloc.free_bytes(),
                largest.max(t.alloc.largest_free_region()),
            )
        })
    }

    fn largest(&self, id: TargetId) -> u64 {
        self.target(id).expect("live").alloc.largest_free_region()
    }

    fn ratio(&self, id: TargetId) -> f64 {
        let t = self.target(id).expect("live");
        t.alloc.free_bytes() as f64 / t.alloc.capacity() as f64
    }

    /// This tier's choice for the next replica, by scanning every target.
    pub(super) fn choose_exhaustive(
        &mut self,
        groups: &[Group],
        req: &PlacementRequest,
        rounded: u64,
        p: &mut Progress,
    ) -> Option<TargetId> {
        // Open for the next replica, from the targets themselves (not the hot copies).
        let in_tier: Vec<(TargetId, Group)> = self
            .targets()
            .filter(|(id, t)| {
                t.status == TargetStatus::Active
                    && !req.excluded.contains(id)
                    && !p.used_hosts.contains(&t.spec.host)
                    && !p.tried.contains(id)
            })
            .map(|(id, t)| (id, self.group_of(&t.spec)))
            .filter(|(_, group)| groups.contains(group))
            .collect();
        let best_by =
            |pivot: TargetId, key: &dyn Fn(TargetId) -> f64, fits: &dyn Fn(TargetId) -> bool| {
                let fitting: Vec<TargetId> = in_tier
                    .iter()
                    .map(|&(id, _)| id)
                    .filter(|&id| fits(id))
                    .collect();
                let top = fitting
                    .iter()
                    .map(|&id| key(id))
                    .fold(None, |m: Option<f64>, k| Some(m.map_or(k, |m| m.max(k))))?;
                fitting
                    .into_iter()
                    .filter(|&id| key(id) == top)
                    .min_by_key(|&id| rotation(id, pivot))
            };
        match self.policy {
            Policy::BestFit => {
                // Over the whole tier: the smallest largest region that holds `rounded`, and
                // among the targets with that one the lowest id. No draw from the RNG.
                let best = in_tier
                    .iter()
                    .map(|&(id, _)| (self.largest(id), id))
                    .filter(|&(largest, _)| largest >= rounded)
                    .min();
                if let Some((_, id)) = best {
                    return Some(id);
                }
                // Nothing fits: every open target of the tier counts as tried (none can hold
                // `rounded` bytes for the rest of the request either).
                p.tried.extend(in_tier.iter().map(|&(id, _)| id));
                None
            }
            Policy::LargestHoleFirst => {
                let pivot = self.pivot();
                best_by(pivot, &|id| self.largest(id) as f64, &|id| {
                    self.largest(id) >= req.size
                })
            }
            Policy::FreeRatioFirst => {
                let pivot = self.pivot();
                best_by(pivot, &|id| self.ratio(id), &|id| {
                    self.largest(id) >= req.size
                })
            }
            Policy::Random => {
                let fitting: Vec<TargetId> = in_tier
                    .iter()
                    .map(|&(id, _)| id)
                    .filter(|&id| self.largest(id) >= req.size)
                    .collect();
                if fitting.is_empty() {
                    return None;
                }
                Some(fitting[(splitmix(&mut self.rng) % fitting.len() as u64) as usize])
            }
        }
    }

    /// `eviction_plan` by scanning every target: the candidates in the same order (preferred,
    /// then tier by tier, group by group, largest region first), each simulated. For tests only.
    #[doc(hidden)]
    pub fn eviction_plan_exhaustive(
        &self,
        req: &PlacementRequest,
        bound: usize,
    ) -> Option<(TargetId, Vec<Extent>)> {
        let rounded = req
            .size
            .checked_next_multiple_of(self.granule_exhaustive())?;
        let tiers: &[usize] = if req.hint.strict { &[0] } else { &[0, 1, 2, 3] };
        let mut candidates: Vec<TargetId> = req.preferred.clone();
        for &tier in tiers {
            for group in self.tier_groups(tier, req.hint.node) {
                let mut members: Vec<(u64, TargetId)> = self
                    .targets()
                    .filter(|(_, t)| self.group_of(&t.spec) == group)
                    .map(|(id, t)| (t.alloc.largest_free_region(), id))
                    .collect();
                members.sort_unstable_by(|a, b| b.cmp(a));
                candidates.extend(members.into_iter().map(|(_, id)| id));
            }
        }
        let mut seen = HashSet::new();
        candidates
            .into_iter()
            .filter(|&id| seen.insert(id))
            .find_map(|id| Some((id, self.plan_on(id, req, rounded, bound, false)?)))
    }
}
