//! Placement: which store target gets each replica of a large object. Pure, synchronous
//! decisions over owned state (the placement master runs them; benches replay them offline).
//!
//! Candidates for a replica are ordered: the request's preferred targets first (in the given
//! order), then by locality tier: tier 0 this host and the requested node, tier 1 this host and
//! unknown locality, tier 2 this host and another node, tier 3 another host. Within a tier the
//! policy ranks. Replicas go to distinct targets on distinct hosts; excluded targets are never
//! used; no target is tried twice in one request. A strict request never leaves tier 0. The
//! same seed and the same requests give the same placements (RFCs in `../shared/seeds/`; the
//! design as built in `docs/placement.md`).

mod stats;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

pub use crate::segment::target::{HostId, TargetKind, TargetSpec};
use crate::segment::{Extent, ExtentAllocator};
use crate::topology::NodeId;

pub use stats::PlacementStats;

/// A target's number in the placer (dense, never reused).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TargetId(pub u32);

impl fmt::Display for TargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetStatus {
    Active,
    /// Unmount prepared: no new placements, reads still served.
    Draining,
}

/// How targets within one tier are ranked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// A seeded random order.
    Random,
    /// The target with the most free space (by ratio) first.
    FreeRatioFirst,
    /// The target whose largest free region is the smallest that still fits (the default).
    BestFit,
    /// The target with the largest free region first (a comparator for benchmarks).
    LargestHoleFirst,
}

impl Policy {
    pub fn parse(text: &str) -> Option<Policy> {
        match text {
            "random" => Some(Policy::Random),
            "free_ratio_first" => Some(Policy::FreeRatioFirst),
            "best_fit" => Some(Policy::BestFit),
            "largest_hole_first" => Some(Policy::LargestHoleFirst),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Random => "random",
            Policy::FreeRatioFirst => "free_ratio_first",
            Policy::BestFit => "best_fit",
            Policy::LargestHoleFirst => "largest_hole_first",
        }
    }
}

/// Where a request would like its replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalityHint {
    pub node: Option<NodeId>,
    /// Fail rather than leave the node (tier 0).
    pub strict: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementRequest {
    pub size: u64,
    pub replicas: u32,
    pub hint: LocalityHint,
    pub preferred: Vec<TargetId>,
    pub excluded: Vec<TargetId>,
}

impl PlacementRequest {
    pub fn new(size: u64) -> PlacementRequest {
        PlacementRequest {
            size,
            replicas: 1,
            hint: LocalityHint::default(),
            preferred: Vec::new(),
            excluded: Vec::new(),
        }
    }
}

/// The extents chosen, one per placed replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub replicas: Vec<(TargetId, Extent)>,
    /// Replicas asked for; fewer placed is a partial success.
    pub wanted: u32,
}

impl Placed {
    pub fn is_partial(&self) -> bool {
        (self.replicas.len() as u32) < self.wanted
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementError {
    /// A strict request found no room on its node.
    Strict { node: Option<NodeId>, size: u64 },
    /// No target could take even one replica.
    NoSpace {
        size: u64,
        free: u64,
        largest_hole: u64,
    },
    /// The request itself is unusable (zero size or replicas).
    Invalid(String),
}

impl fmt::Display for PlacementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementError::Strict { node, size } => write!(
                f,
                "no target on node {} has a {size}-byte hole and the request is strict",
                node.map_or("(none)".to_string(), |n| n.to_string())
            ),
            PlacementError::NoSpace {
                size,
                free,
                largest_hole,
            } => write!(
                f,
                "no target has a {size}-byte hole ({free} bytes free, largest hole {largest_hole})"
            ),
            PlacementError::Invalid(reason) => write!(f, "invalid placement request: {reason}"),
        }
    }
}

impl std::error::Error for PlacementError {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountError {
    DuplicateUuid(u128),
    Overlap { with: TargetId },
    Empty,
}

impl fmt::Display for MountError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MountError::DuplicateUuid(uuid) => {
                write!(f, "a target with uuid {uuid:032x} is already mounted")
            }
            MountError::Overlap { with } => {
                write!(f, "the range overlaps target {with} on the same host")
            }
            MountError::Empty => write!(f, "a target needs at least one granule"),
        }
    }
}

impl std::error::Error for MountError {}

/// Which ordered index a target sits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Group {
    /// This host, by node (`None`: unknown locality).
    Local(Option<NodeId>),
    /// Another host.
    Remote,
}

#[derive(Debug)]
pub struct Target {
    pub spec: TargetSpec,
    pub status: TargetStatus,
    pub alloc: ExtentAllocator,
    pub objects: u64,
    /// Live extents by last use (a logical clock), oldest first, and each extent's tick.
    by_use: BTreeMap<u64, Extent>,
    tick_of: HashMap<u64, u64>,
    /// The key under which it sits in its group's index.
    indexed_largest: u64,
}

/// The placer's state: targets, their allocators, the ordered indexes, the RNG.
#[derive(Debug)]
pub struct Placer {
    local_host: HostId,
    policy: Policy,
    rng: u64,
    targets: Vec<Option<Target>>,
    /// Per group, targets ordered by (largest free region, id).
    index: HashMap<Group, BTreeSet<(u64, TargetId)>>,
    /// The logical clock of extent use (for LRU eviction plans).
    clock: u64,
    pub stats: PlacementStats,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Placer {
    pub fn new(local_host: HostId, policy: Policy, seed: u64) -> Placer {
        Placer {
            local_host,
            policy,
            rng: seed,
            targets: Vec::new(),
            index: HashMap::new(),
            clock: 0,
            stats: PlacementStats::default(),
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn local_host(&self) -> HostId {
        self.local_host
    }

    fn group_of(&self, spec: &TargetSpec) -> Group {
        if spec.host == self.local_host {
            Group::Local(spec.locality)
        } else {
            Group::Remote
        }
    }

    /// Mounts a target. Refused: a uuid already mounted, an empty range, or a range that
    /// overlaps another target of the same host, kind and name.
    pub fn mount(&mut self, spec: TargetSpec) -> Result<TargetId, MountError> {
        let usable = spec.size - spec.size % spec.granule;
        if usable == 0 {
            return Err(MountError::Empty);
        }
        for (i, target) in self.targets.iter().enumerate() {
            let Some(t) = target else { continue };
            if t.spec.uuid == spec.uuid {
                return Err(MountError::DuplicateUuid(spec.uuid));
            }
            let same_space =
                t.spec.host == spec.host && t.spec.kind == spec.kind && t.spec.name == spec.name;
            let overlaps =
                spec.base < t.spec.base + t.spec.size && t.spec.base < spec.base + spec.size;
            if same_space && overlaps {
                return Err(MountError::Overlap {
                    with: TargetId(i as u32),
                });
            }
        }
        let id = TargetId(self.targets.len() as u32);
        let group = self.group_of(&spec);
        let alloc = ExtentAllocator::new(usable, spec.granule);
        let largest = alloc.largest_free_region();
        self.index.entry(group).or_default().insert((largest, id));
        self.stats
            .on_mount(&spec, usable, spec.host == self.local_host);
        self.targets.push(Some(Target {
            spec,
            status: TargetStatus::Active,
            alloc,
            objects: 0,
            by_use: BTreeMap::new(),
            tick_of: HashMap::new(),
            indexed_largest: largest,
        }));
        Ok(id)
    }

    pub fn target(&self, id: TargetId) -> Option<&Target> {
        self.targets.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// Free bytes over every target, and the largest hole in any one of them: what a failed
    /// placement is reported with (enough free bytes and no hole: fragmentation).
    pub fn free_and_largest_hole(&self) -> (u64, u64) {
        self.targets().fold((0, 0), |(free, largest), (_, t)| {
            (
                free + t.alloc.free_bytes(),
                largest.max(t.alloc.largest_free_region()),
            )
        })
    }

    pub fn targets(&self) -> impl Iterator<Item = (TargetId, &Target)> {
        self.targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.as_ref().map(|t| (TargetId(i as u32), t)))
    }

    /// Stops new placements on a target (unmount, phase one); reads go on.
    pub fn set_status(&mut self, id: TargetId, status: TargetStatus) {
        if let Some(Some(target)) = self.targets.get_mut(id.0 as usize) {
            target.status = status;
        }
    }

    /// Forgets a target (unmount, phase two). Its objects must already be gone from the index.
    pub fn unmount(&mut self, id: TargetId) -> Option<Target> {
        let target = self.targets.get_mut(id.0 as usize)?.take()?;
        let group = self.group_of(&target.spec);
        if let Some(set) = self.index.get_mut(&group) {
            set.remove(&(target.indexed_largest, id));
        }
        self.stats.on_unmount(
            &target.spec,
            target.alloc.capacity(),
            target.spec.host == self.local_host,
        );
        Some(target)
    }

    fn reindex(&mut self, id: TargetId) {
        let (group, old, new) = {
            let t = self.targets[id.0 as usize].as_ref().expect("live target");
            (
                self.group_of(&t.spec),
                t.indexed_largest,
                t.alloc.largest_free_region(),
            )
        };
        if old != new {
            let set = self.index.get_mut(&group).expect("indexed group");
            set.remove(&(old, id));
            set.insert((new, id));
            self.targets[id.0 as usize]
                .as_mut()
                .expect("live target")
                .indexed_largest = new;
        }
    }

    /// Frees a replica's extent.
    pub fn free(&mut self, id: TargetId, extent: Extent) {
        let target = self.targets[id.0 as usize]
            .as_mut()
            .expect("free on a mounted target");
        target.alloc.free(extent);
        target.objects -= 1;
        if let Some(tick) = target.tick_of.remove(&extent.offset) {
            target.by_use.remove(&tick);
        }
        let local = target.spec.host == self.local_host;
        let locality = target.spec.locality;
        self.stats.on_free(extent.len, local, locality);
        self.reindex(id);
    }

    /// Takes a specific extent on a target (restoring a snapshot).
    pub fn claim(&mut self, id: TargetId, extent: Extent) -> bool {
        let Some(Some(target)) = self.targets.get_mut(id.0 as usize) else {
            return false;
        };
        if target.alloc.allocate_at(extent).is_err() {
            return false;
        }
        target.objects += 1;
        self.clock += 1;
        target.by_use.insert(self.clock, extent);
        target.tick_of.insert(extent.offset, self.clock);
        let (local, locality) = (target.spec.host == self.local_host, target.spec.locality);
        self.stats.on_allocate(extent.len, local, locality);
        self.reindex(id);
        true
    }

    fn usable(&self, id: TargetId, req: &PlacementRequest, used_hosts: &HashSet<HostId>) -> bool {
        self.target(id).is_some_and(|t| {
            t.status == TargetStatus::Active
                && !req.excluded.contains(&id)
                && !used_hosts.contains(&t.spec.host)
        })
    }

    /// Groups of a tier for this request.
    fn tier_groups(&self, tier: usize, node: Option<NodeId>) -> Vec<Group> {
        match tier {
            0 => node
                .map(|n| vec![Group::Local(Some(n))])
                .unwrap_or_default(),
            1 => vec![Group::Local(None)],
            2 => {
                let mut groups: Vec<Group> = self
                    .index
                    .keys()
                    .copied()
                    .filter(|g| matches!(g, Group::Local(Some(n)) if Some(*n) != node))
                    .collect();
                groups.sort_by_key(|g| match g {
                    Group::Local(n) => *n,
                    Group::Remote => None,
                });
                groups
            }
            _ => vec![Group::Remote],
        }
    }

    /// Best fit within a tier: the target whose largest region is the smallest that holds
    /// `rounded` bytes, found through the ordered index; ties broken by a seeded rotation.
    fn best_fit_in(
        &mut self,
        groups: &[Group],
        rounded: u64,
        usable: impl Fn(&Self, TargetId) -> bool,
    ) -> Option<TargetId> {
        let mut best: Option<(u64, TargetId)> = None;
        let pivot = TargetId(splitmix(&mut self.rng) as u32 % (self.targets.len().max(1) as u32));
        for group in groups {
            let Some(set) = self.index.get(group) else {
                continue;
            };
            // The smallest fitting size class in this group (skipping unusable targets).
            let Some(&(size, _)) = set
                .range((rounded, TargetId(0))..)
                .find(|(_, id)| usable(self, *id))
            else {
                continue;
            };
            // Among equals, start at the pivot and wrap: a seeded rotation of the id order.
            let pick = set
                .range((size, pivot)..=(size, TargetId(u32::MAX)))
                .chain(set.range((size, TargetId(0))..(size, pivot)))
                .map(|&(_, id)| id)
                .find(|id| usable(self, *id))
                .expect("a usable target of this size exists");
            best = match best {
                Some((s, _)) if s <= size => best,
                _ => Some((size, pick)),
            };
        }
        best.map(|(_, id)| id)
    }

    /// Every usable target of a tier in the policy's order (used by the policies that rank by
    /// something other than the largest region, and for the fallback of best fit).
    fn ranked(
        &mut self,
        groups: &[Group],
        req: &PlacementRequest,
        used_hosts: &HashSet<HostId>,
        tried: &HashSet<TargetId>,
    ) -> Vec<TargetId> {
        let mut ids: Vec<TargetId> = groups
            .iter()
            .filter_map(|g| self.index.get(g))
            .flat_map(|set| set.iter().map(|&(_, id)| id))
            .filter(|id| !tried.contains(id) && self.usable(*id, req, used_hosts))
            .collect();
        ids.sort_unstable();
        // Seeded rotation, then a stable sort by the policy's key.
        if !ids.is_empty() {
            let shift = (splitmix(&mut self.rng) % ids.len() as u64) as usize;
            ids.rotate_left(shift);
        }
        match self.policy {
            Policy::Random => {
                for i in (1..ids.len()).rev() {
                    let j = (splitmix(&mut self.rng) % (i as u64 + 1)) as usize;
                    ids.swap(i, j);
                }
            }
            Policy::FreeRatioFirst => ids.sort_by(|a, b| {
                let ratio = |id: &TargetId| {
                    let t = self.target(*id).expect("live");
                    t.alloc.free_bytes() as f64 / t.alloc.capacity() as f64
                };
                ratio(b)
                    .partial_cmp(&ratio(a))
                    .unwrap_or(std::cmp::Ordering::Equal)
            }),
            Policy::LargestHoleFirst => ids.sort_by_key(|id| {
                std::cmp::Reverse(self.target(*id).expect("live").alloc.largest_free_region())
            }),
            // Fallback order for best fit: the targets that do not fit, most room first.
            Policy::BestFit => ids.sort_by_key(|id| {
                std::cmp::Reverse(self.target(*id).expect("live").alloc.largest_free_region())
            }),
        }
        ids
    }

    fn allocate_on(&mut self, id: TargetId, size: u64) -> Option<Extent> {
        let target = self.targets[id.0 as usize].as_mut().expect("live target");
        let extent = target.alloc.allocate(size).ok()?;
        target.objects += 1;
        self.clock += 1;
        target.by_use.insert(self.clock, extent);
        target.tick_of.insert(extent.offset, self.clock);
        let (local, locality) = (target.spec.host == self.local_host, target.spec.locality);
        self.stats.on_allocate(extent.len, local, locality);
        self.reindex(id);
        Some(extent)
    }

    /// Places every replica it can. Errors only when not even one replica fits (or, strict,
    /// none fits on the node).
    pub fn place(&mut self, req: &PlacementRequest) -> Result<Placed, PlacementError> {
        if req.size == 0 || req.replicas == 0 {
            return Err(PlacementError::Invalid(
                "size and replicas must be at least 1".into(),
            ));
        }
        if req.hint.strict && req.hint.node.is_none() {
            return Err(PlacementError::Invalid(
                "a strict request must name its node".into(),
            ));
        }
        self.stats.requests += 1;
        if req.hint.node.is_none() {
            self.stats.requests_without_locality += 1;
        }
        let granule = self
            .targets()
            .map(|(_, t)| t.alloc.granule())
            .max()
            .unwrap_or(1);
        let rounded = req
            .size
            .checked_next_multiple_of(granule)
            .unwrap_or(u64::MAX);
        let mut placed: Vec<(TargetId, Extent)> = Vec::new();
        let mut used_hosts: HashSet<HostId> = HashSet::new();
        let mut tried: HashSet<TargetId> = HashSet::new();
        let tiers: &[usize] = if req.hint.strict { &[0] } else { &[0, 1, 2, 3] };
        for _ in 0..req.replicas {
            let mut chosen: Option<(TargetId, Extent, Option<usize>)> = None;
            // Preferred targets first, in order.
            for &id in &req.preferred {
                if tried.contains(&id) || !self.usable(id, req, &used_hosts) {
                    continue;
                }
                let on_node = self.target(id).expect("usable").spec.locality == req.hint.node;
                if req.hint.strict
                    && !(on_node && self.target(id).expect("usable").spec.host == self.local_host)
                {
                    continue;
                }
                tried.insert(id);
                if let Some(extent) = self.allocate_on(id, req.size) {
                    chosen = Some((id, extent, None));
                    break;
                }
            }
            // Then tier by tier.
            for &tier in tiers {
                if chosen.is_some() {
                    break;
                }
                let groups = self.tier_groups(tier, req.hint.node);
                if groups.is_empty() {
                    continue;
                }
                if self.policy == Policy::BestFit {
                    let fit = self.best_fit_in(&groups, rounded, |p, id| {
                        !tried.contains(&id) && p.usable(id, req, &used_hosts)
                    });
                    if let Some(id) = fit {
                        tried.insert(id);
                        if let Some(extent) = self.allocate_on(id, req.size) {
                            chosen = Some((id, extent, Some(tier)));
                            break;
                        }
                    }
                }
                for id in self.ranked(&groups, req, &used_hosts, &tried) {
                    tried.insert(id);
                    if self.policy == Policy::BestFit
                        && self.target(id).expect("live").alloc.largest_free_region() < rounded
                    {
                        // Cannot fit without making room; nothing makes room here.
                        continue;
                    }
                    if let Some(extent) = self.allocate_on(id, req.size) {
                        chosen = Some((id, extent, Some(tier)));
                        break;
                    }
                }
            }
            match chosen {
                Some((id, extent, tier)) => {
                    used_hosts.insert(self.target(id).expect("live").spec.host);
                    self.stats.on_placed(tier, extent.len);
                    placed.push((id, extent));
                }
                None => break,
            }
        }
        if placed.is_empty() {
            let free = self.targets().map(|(_, t)| t.alloc.free_bytes()).sum();
            let largest_hole = self
                .targets()
                .map(|(_, t)| t.alloc.largest_free_region())
                .max()
                .unwrap_or(0);
            self.stats.on_failure(req.hint.strict, free, largest_hole);
            return Err(if req.hint.strict {
                PlacementError::Strict {
                    node: req.hint.node,
                    size: req.size,
                }
            } else {
                PlacementError::NoSpace {
                    size: req.size,
                    free,
                    largest_hole,
                }
            });
        }
        if (placed.len() as u32) < req.replicas {
            self.stats.partial += 1;
        }
        Ok(Placed {
            replicas: placed,
            wanted: req.replicas,
        })
    }

    /// Notes that an extent was just used (a read of its object), for LRU eviction plans.
    pub fn touch(&mut self, id: TargetId, offset: u64) {
        let Some(Some(target)) = self.targets.get_mut(id.0 as usize) else {
            return;
        };
        if let Some(tick) = target.tick_of.get_mut(&offset) {
            let extent = target.by_use.remove(tick).expect("ticks agree");
            self.clock += 1;
            *tick = self.clock;
            target.by_use.insert(self.clock, extent);
        }
    }

    /// For a request that found no hole: the least recently used extents of the first target
    /// (in the request's candidate order) whose freeing, oldest first, would leave a hole for
    /// it, at most `bound` of them. Pure: nothing is freed here.
    pub fn eviction_plan(
        &self,
        req: &PlacementRequest,
        bound: usize,
    ) -> Option<(TargetId, Vec<Extent>)> {
        let granule = self
            .targets()
            .map(|(_, t)| t.alloc.granule())
            .max()
            .unwrap_or(1);
        let rounded = req.size.checked_next_multiple_of(granule)?;
        let tiers: &[usize] = if req.hint.strict { &[0] } else { &[0, 1, 2, 3] };
        let no_hosts = HashSet::new();
        let mut candidates: Vec<TargetId> = req.preferred.clone();
        for &tier in tiers {
            for group in self.tier_groups(tier, req.hint.node) {
                if let Some(set) = self.index.get(&group) {
                    candidates.extend(set.iter().rev().map(|&(_, id)| id));
                }
            }
        }
        let mut seen = HashSet::new();
        for id in candidates {
            if !seen.insert(id) || !self.usable(id, req, &no_hosts) {
                continue;
            }
            let target = self.target(id).expect("usable");
            if req.hint.strict
                && !(target.spec.locality == req.hint.node && target.spec.host == self.local_host)
            {
                continue;
            }
            if target.alloc.capacity() < rounded {
                continue;
            }
            let mut scratch = target.alloc.clone();
            let mut victims = Vec::new();
            for extent in target.by_use.values().take(bound) {
                scratch.free(*extent);
                victims.push(*extent);
                if scratch.largest_free_region() >= rounded {
                    return Some((id, victims));
                }
            }
        }
        None
    }

    /// Checks that every target sits in its group's index under its current largest region.
    pub fn check_invariants(&self) {
        let mut indexed = 0;
        for (id, t) in self.targets() {
            t.alloc.check_invariants();
            assert_eq!(
                t.by_use.len() as u64,
                t.objects,
                "{id}: use order lost an extent"
            );
            assert_eq!(t.tick_of.len(), t.by_use.len());
            assert!(t
                .tick_of
                .iter()
                .all(|(off, tick)| t.by_use.get(tick).is_some_and(|e| e.offset == *off)));
            assert_eq!(
                t.indexed_largest,
                t.alloc.largest_free_region(),
                "{id} index key stale"
            );
            assert!(self.index[&self.group_of(&t.spec)].contains(&(t.indexed_largest, id)));
            indexed += 1;
        }
        let total: usize = self.index.values().map(BTreeSet::len).sum();
        assert_eq!(total, indexed, "the index holds unmounted targets");
    }
}
