//! Placement: which store target gets each replica of a large object. Pure, synchronous
//! decisions over owned state (the placement master runs them; benches replay them offline).
//!
//! Candidates for a replica are ordered: the request's preferred targets first (in the given
//! order), then by locality tier: tier 0 this host and the requested node, tier 1 this host and
//! unknown locality, tier 2 this host and another node, tier 3 another host. Within a tier the
//! policy ranks; best fit breaks ties between equally good targets by the lowest id (no draw
//! from the RNG), the other policies from the seeded RNG. Replicas go to distinct targets on
//! distinct hosts; excluded targets are never used; no target is tried twice in one request. A
//! strict request never leaves tier 0. The same seed and the same requests give the same
//! placements (RFCs in `../shared/seeds/`; the design as built in `docs/placement.md`).
//!
//! Cost: a request never walks every target. Per locality group the active targets sit in
//! ordered indexes (`index.rs`) kept current on every allocate, free, claim, mount, unmount and
//! status change: classes of equal largest free region (and, under `free_ratio_first`, of equal
//! free ratio) ordered by key, a class of many targets kept as a bitset. A tier is answered in
//! O(log K) for the K distinct keys of its groups, plus the entries the request itself rules out
//! on the way: its excluded and already tried targets, and in tier 3 the targets of the hosts
//! that hold one of its replicas already (a local group on a used host is skipped whole);
//! `free_ratio_first` also passes over better-ranked targets too fragmented for the object. A
//! failure reports free bytes and the largest hole from running totals and the indexes' top
//! keys (O(G) for G groups); a mount checks uuid and range in O(log S). The use order of live
//! extents (LRU eviction) is O(1) per allocate, free and touch (`uses.rs`). `place_exhaustive`
//! is the reference the indexes are tested against: the same decisions by scanning every
//! target.

mod index;
mod reference;
mod stats;
mod uses;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use foldhash::fast::RandomState as FastHash;

pub use crate::segment::target::{HostId, TargetKind, TargetSpec};
use crate::segment::{Extent, ExtentAllocator};
use crate::topology::NodeId;

use index::{rotation, GroupIndex, Multiset};
pub use stats::PlacementStats;
use uses::Uses;

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
    /// Uniformly random among the targets that can hold the object (seeded).
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
                write!(
                    f,
                    "a target with id {uuid:032x} is already mounted (a copy of a segment file \
                     carries its id: mount one of the two, or remove the copy)"
                )
            }
            MountError::Overlap { with } => {
                write!(f, "the range overlaps target {with} on the same host")
            }
            MountError::Empty => write!(f, "a target needs at least one granule"),
        }
    }
}

impl std::error::Error for MountError {}

/// Which ordered index a target sits in. The order (by node, unknown first) is tier 2's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Group {
    /// This host, by node (`None`: unknown locality).
    Local(Option<NodeId>),
    /// Another host.
    Remote,
}

/// Draws from the RNG a `random` placement may take before it lists the tier's fitting
/// targets instead (when few of them fit).
const RANDOM_SAMPLES_MAX: u32 = 16;

/// A mounted target. What an allocation on it reads comes first, in two whole cache lines (the
/// allocator's holes inline while there are few), and the spec (read by none) last: the first
/// placement on a target that has not been used for a while finds these lines cold, and each
/// line it touches is a miss.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub struct Target {
    pub status: TargetStatus,
    /// The spec's host and node, where a placement reads them.
    host: HostId,
    locality: Option<NodeId>,
    /// Its place in its group's `members` while active.
    slot: u32,
    /// What the indexes and totals hold for it: its largest free region, free bytes and free
    /// ratio (`f64` bits) as of its last change.
    indexed_largest: u64,
    indexed_free: u64,
    indexed_ratio: u64,
    pub objects: u64,
    pub alloc: ExtentAllocator,
    pub spec: TargetSpec,
}

/// What a placement checks of a target before it touches the target itself, by id (unmounted:
/// inactive). Dense and small (16 bytes a target), so looking over candidates stays in cache.
#[derive(Clone, Copy, Debug, Default)]
struct Hot {
    active: bool,
    host: HostId,
    largest: u64,
}

/// The placer's state: targets, their allocators, the ordered indexes, the RNG.
#[derive(Clone, Debug)]
pub struct Placer {
    local_host: HostId,
    policy: Policy,
    rng: u64,
    targets: Vec<Option<Target>>,
    /// Per group, its active targets. A group, once created, stays (tier 2 is every node ever
    /// mounted here, as before).
    index: BTreeMap<Group, GroupIndex>,
    /// The largest free regions of draining targets (the active ones are the groups' keys): with
    /// the groups', the largest hole of any target.
    draining_holes: Multiset,
    /// Over every mounted target: granules and free bytes.
    granules: Multiset,
    free_bytes: u64,
    /// Mount checks: the uuids, and each space's ranges.
    uuids: HashMap<u128, TargetId>,
    spaces: HashMap<Space, Ranges>,
    /// Per target id, what choosing among candidates reads.
    hot: Vec<Hot>,
    /// Live extents in order of last use, per target (for LRU eviction plans).
    uses: Uses,
    scratch: Progress,
    pub stats: PlacementStats,
}

/// Where a target's range lives: host, kind and segment name (ranges of one space may not
/// overlap).
type Space = (HostId, TargetKind, String);

/// A space's ranges by base: (end, target).
type Ranges = BTreeMap<u64, (u64, TargetId)>;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A target's free ratio as the bits of the `f64` it is ranked by.
fn ratio_bits(alloc: &ExtentAllocator) -> u64 {
    (alloc.free_bytes() as f64 / alloc.capacity() as f64).to_bits()
}

/// How a request's candidates are found: through the indexes, or (the test reference) by
/// scanning every target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scan {
    Indexed,
    Exhaustive,
}

/// One request's progress: what rules a target out for its next replica. The placer keeps
/// one to reuse its buffers (a request allocates only the replicas it returns).
#[derive(Clone, Debug, Default)]
struct Progress {
    /// Hosts holding a replica already (at most one per replica).
    used_hosts: Vec<HostId>,
    tried: HashSet<TargetId, FastHash>,
    /// Best fit: tiers found to hold nothing that fits (for the rest of the request).
    swept: [bool; 4],
    /// The groups of the tier being tried.
    groups: Vec<Group>,
}

/// Tried targets a reused `Progress` may keep room for (the exhaustive reference tries whole
/// tiers).
const TRIED_KEPT_MAX: usize = 256;

impl Progress {
    fn clear(&mut self) {
        self.used_hosts.clear();
        if self.tried.capacity() > TRIED_KEPT_MAX {
            self.tried = HashSet::default();
        }
        self.tried.clear();
        self.swept = [false; 4];
        self.groups.clear();
    }
}

impl Placer {
    pub fn new(local_host: HostId, policy: Policy, seed: u64) -> Placer {
        Placer {
            local_host,
            policy,
            rng: seed,
            targets: Vec::new(),
            index: BTreeMap::new(),
            draining_holes: Multiset::default(),
            granules: Multiset::default(),
            free_bytes: 0,
            uuids: HashMap::new(),
            spaces: HashMap::new(),
            hot: Vec::new(),
            uses: Uses::default(),
            scratch: Progress::default(),
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

    /// The first target (lowest id) a new spec conflicts with: the same uuid, or an overlapping
    /// range of the same host, kind and name (ranges of one space never overlap, so the ones
    /// that overlap a new range are a run in base order).
    fn mount_conflict(&self, spec: &TargetSpec) -> Option<MountError> {
        let duplicate = self.uuids.get(&spec.uuid).copied();
        let end = spec.base.saturating_add(spec.size);
        let overlap = self
            .spaces
            .get(&(spec.host, spec.kind, spec.name.clone()))
            .and_then(|ranges| {
                ranges
                    .range(..end)
                    .rev()
                    .take_while(|(_, &(other_end, _))| other_end > spec.base)
                    .map(|(_, &(_, id))| id)
                    .min()
            });
        match (duplicate, overlap) {
            (Some(d), Some(o)) if o < d => Some(MountError::Overlap { with: o }),
            (Some(_), _) => Some(MountError::DuplicateUuid(spec.uuid)),
            (None, Some(o)) => Some(MountError::Overlap { with: o }),
            (None, None) => None,
        }
    }

    /// Mounts a target. Refused: a uuid already mounted, an empty range, or a range that
    /// overlaps another target of the same host, kind and name.
    pub fn mount(&mut self, spec: TargetSpec) -> Result<TargetId, MountError> {
        let usable = spec.size - spec.size % spec.granule;
        if usable == 0 {
            return Err(MountError::Empty);
        }
        if let Some(err) = self.mount_conflict(&spec) {
            return Err(err);
        }
        let id = TargetId(self.targets.len() as u32);
        let alloc = ExtentAllocator::new(usable, spec.granule);
        let largest = alloc.largest_free_region();
        self.granules.insert(spec.granule);
        self.free_bytes += alloc.free_bytes();
        self.uuids.insert(spec.uuid, id);
        self.spaces
            .entry((spec.host, spec.kind, spec.name.clone()))
            .or_default()
            .insert(spec.base, (spec.base.saturating_add(spec.size), id));
        self.stats
            .on_mount(&spec, usable, spec.host == self.local_host);
        self.hot.push(Hot {
            active: true,
            host: spec.host,
            largest,
        });
        self.targets.push(Some(Target {
            host: spec.host,
            locality: spec.locality,
            spec,
            status: TargetStatus::Active,
            indexed_largest: largest,
            indexed_free: alloc.free_bytes(),
            indexed_ratio: ratio_bits(&alloc),
            alloc,
            objects: 0,
            slot: 0,
        }));
        self.index_add(id);
        Ok(id)
    }

    pub fn target(&self, id: TargetId) -> Option<&Target> {
        self.targets.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// Free bytes over every target, and the largest hole in any one of them: what a failed
    /// placement is reported with (enough free bytes and no hole: fragmentation). From running
    /// totals and each group's top key: O(G) for G locality groups, never O(S).
    pub fn free_and_largest_hole(&self) -> (u64, u64) {
        let largest = self
            .index
            .values()
            .filter_map(|g| g.by_hole.max_key())
            .chain(self.draining_holes.max())
            .max();
        (self.free_bytes, largest.unwrap_or(0))
    }

    pub fn targets(&self) -> impl Iterator<Item = (TargetId, &Target)> {
        self.targets
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.as_ref().map(|t| (TargetId(i as u32), t)))
    }

    /// Stops new placements on a target (unmount, phase one), or resumes them; reads go on.
    /// A draining target leaves its group's indexes, so no request skips over it.
    pub fn set_status(&mut self, id: TargetId, status: TargetStatus) {
        let Some(Some(target)) = self.targets.get_mut(id.0 as usize) else {
            return;
        };
        if target.status == status {
            return;
        }
        self.hot[id.0 as usize].active = status == TargetStatus::Active;
        let largest = target.indexed_largest;
        match status {
            TargetStatus::Active => {
                target.status = status;
                self.draining_holes.remove(largest);
                self.index_add(id);
            }
            TargetStatus::Draining => {
                self.index_drop(id);
                self.draining_holes.insert(largest);
                self.targets[id.0 as usize]
                    .as_mut()
                    .expect("live target")
                    .status = status;
            }
        }
    }

    /// Forgets a target (unmount, phase two). Its objects must already be gone from the index.
    pub fn unmount(&mut self, id: TargetId) -> Option<Target> {
        if self.target(id)?.status == TargetStatus::Active {
            self.index_drop(id);
        }
        let target = self.targets[id.0 as usize].take().expect("live target");
        self.hot[id.0 as usize] = Hot::default();
        self.uses.drop_target(id);
        if target.status == TargetStatus::Draining {
            self.draining_holes.remove(target.indexed_largest);
        }
        self.granules.remove(target.spec.granule);
        self.free_bytes -= target.indexed_free;
        self.uuids.remove(&target.spec.uuid);
        let space = (target.spec.host, target.spec.kind, target.spec.name.clone());
        if let Some(ranges) = self.spaces.get_mut(&space) {
            ranges.remove(&target.spec.base);
            if ranges.is_empty() {
                self.spaces.remove(&space);
            }
        }
        self.stats.on_unmount(
            &target.spec,
            target.alloc.capacity(),
            target.spec.host == self.local_host,
        );
        Some(target)
    }

    /// Puts an active target into its group's indexes.
    fn index_add(&mut self, id: TargetId) {
        let frf = self.policy == Policy::FreeRatioFirst;
        let group_key = self.group_of(&self.targets[id.0 as usize].as_ref().expect("live").spec);
        let target = self.targets[id.0 as usize].as_mut().expect("live target");
        let group = self.index.entry(group_key).or_default();
        let fresh = group.by_hole.insert(target.indexed_largest, id);
        debug_assert!(fresh, "{id} indexed twice");
        if frf {
            group.by_ratio.insert(target.indexed_ratio, id);
        }
        target.slot = group.members.len() as u32;
        group.members.push(id);
    }

    /// Takes an active target out of its group's indexes.
    fn index_drop(&mut self, id: TargetId) {
        let group_key = self.group_of(&self.targets[id.0 as usize].as_ref().expect("live").spec);
        let target = self.targets[id.0 as usize].as_ref().expect("live target");
        let (largest, ratio, slot) = (
            target.indexed_largest,
            target.indexed_ratio,
            target.slot as usize,
        );
        let group = self.index.get_mut(&group_key).expect("indexed group");
        let was = group.by_hole.remove(largest, id);
        debug_assert!(was, "{id} was not indexed");
        group.by_ratio.remove(ratio, id);
        debug_assert_eq!(group.members[slot], id);
        group.members.swap_remove(slot);
        if let Some(&moved) = group.members.get(slot) {
            self.targets[moved.0 as usize]
                .as_mut()
                .expect("live target")
                .slot = slot as u32;
        }
    }

    /// Brings the indexes and totals up to date with a target's allocator after it changed.
    fn reindex(&mut self, id: TargetId) {
        let frf = self.policy == Policy::FreeRatioFirst;
        let Placer {
            targets,
            index,
            draining_holes,
            free_bytes,
            hot,
            local_host,
            ..
        } = self;
        let target = targets[id.0 as usize].as_mut().expect("live target");
        let largest = target.alloc.largest_free_region();
        let free = target.alloc.free_bytes();
        let ratio = ratio_bits(&target.alloc);
        *free_bytes = *free_bytes - target.indexed_free + free;
        target.indexed_free = free;
        let active = target.status == TargetStatus::Active;
        let group = if target.host == *local_host {
            Group::Local(target.locality)
        } else {
            Group::Remote
        };
        if largest != target.indexed_largest {
            hot[id.0 as usize].largest = largest;
            if active {
                let set = &mut index.get_mut(&group).expect("indexed group").by_hole;
                let was = set.remove(target.indexed_largest, id);
                debug_assert!(was, "{id} index key stale");
                set.insert(largest, id);
            } else {
                draining_holes.replace(target.indexed_largest, largest);
            }
            target.indexed_largest = largest;
        }
        if ratio != target.indexed_ratio {
            if active && frf {
                let set = &mut index.get_mut(&group).expect("indexed group").by_ratio;
                let was = set.remove(target.indexed_ratio, id);
                debug_assert!(was, "{id} ratio key stale");
                set.insert(ratio, id);
            }
            target.indexed_ratio = ratio;
        }
    }

    /// Frees a replica's extent.
    pub fn free(&mut self, id: TargetId, extent: Extent) {
        let target = self.targets[id.0 as usize]
            .as_mut()
            .expect("free on a mounted target");
        target.alloc.free(extent);
        target.objects -= 1;
        self.uses.forget(id, extent.offset);
        let (local, locality) = (target.host == self.local_host, target.locality);
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
        let (local, locality) = (target.host == self.local_host, target.locality);
        self.uses.record(id, extent);
        self.stats.on_allocate(extent.len, local, locality);
        self.reindex(id);
        true
    }

    fn usable(&self, id: TargetId, req: &PlacementRequest, used_hosts: &[HostId]) -> bool {
        self.hot.get(id.0 as usize).is_some_and(|h| {
            h.active && !req.excluded.contains(&id) && !used_hosts.contains(&h.host)
        })
    }

    /// Usable for this request's next replica and not tried yet.
    fn open(&self, id: TargetId, req: &PlacementRequest, p: &Progress) -> bool {
        !p.tried.contains(&id) && self.usable(id, req, &p.used_hosts)
    }

    /// Every target of the group is on a host that holds a replica already.
    fn closed(&self, group: Group, p: &Progress) -> bool {
        matches!(group, Group::Local(_)) && p.used_hosts.contains(&self.local_host)
    }

    /// Whether a target's largest region holds `size` bytes at its own granule (a region is
    /// whole granules, so that is `size <= region`): exactly when allocating succeeds.
    fn fits(&self, id: TargetId, size: u64) -> bool {
        self.hot[id.0 as usize].largest >= size
    }

    /// Groups of a tier for this request, into `out`.
    fn tier_groups_into(&self, tier: usize, node: Option<NodeId>, out: &mut Vec<Group>) {
        out.clear();
        match tier {
            0 => out.extend(node.map(|n| Group::Local(Some(n)))),
            1 => out.push(Group::Local(None)),
            2 => out.extend(
                self.index
                    .keys()
                    .copied()
                    .filter(|g| matches!(g, Group::Local(Some(n)) if Some(*n) != node)),
            ),
            _ => out.push(Group::Remote),
        }
    }

    fn tier_groups(&self, tier: usize, node: Option<NodeId>) -> Vec<Group> {
        let mut groups = Vec::new();
        self.tier_groups_into(tier, node, &mut groups);
        groups
    }

    /// The seeded start of the rotation that breaks ties under `largest_hole_first` and
    /// `free_ratio_first`, drawn once per tier tried (best fit takes the lowest id, no draw).
    fn pivot(&mut self) -> TargetId {
        TargetId(splitmix(&mut self.rng) as u32 % (self.targets.len().max(1) as u32))
    }

    /// This tier's choice for the next replica, through the indexes.
    fn choose(
        &mut self,
        tier: usize,
        groups: &[Group],
        req: &PlacementRequest,
        rounded: u64,
        p: &mut Progress,
    ) -> Option<TargetId> {
        match self.policy {
            Policy::BestFit => {
                if p.swept[tier] {
                    return None;
                }
                self.best_fit(groups, rounded, req, p).or_else(|| {
                    self.sweep(tier, groups, req, p);
                    None
                })
            }
            Policy::LargestHoleFirst | Policy::FreeRatioFirst => {
                let pivot = self.pivot();
                self.highest(groups, pivot, req, p)
            }
            Policy::Random => self.random(groups, req, p),
        }
    }

    /// Best fit within a tier: the smallest class of largest region that holds `rounded` bytes
    /// (skipping the targets this request rules out), and in it the lowest target id; per group
    /// from its index, then the least (size, id) over the groups. O(log K) per group plus the
    /// skipped entries. No draw from the RNG: ties go to the lowest id, so a run of objects
    /// keeps filling the same (warm) target until its largest hole changes class, and among
    /// thousands of empty targets the one taken is always the first, never a random cold one.
    fn best_fit(
        &self,
        groups: &[Group],
        rounded: u64,
        req: &PlacementRequest,
        p: &Progress,
    ) -> Option<TargetId> {
        let mut best: Option<(u64, TargetId)> = None;
        for &group in groups {
            if self.closed(group, p) {
                continue;
            }
            let Some(g) = self.index.get(&group) else {
                continue;
            };
            let found = g.by_hole.lowest_from(rounded, |id| self.open(id, req, p));
            best = match (best, found) {
                (Some(b), Some(f)) => Some(b.min(f)),
                (b, f) => b.or(f),
            };
        }
        best.map(|(_, id)| id)
    }

    /// Best fit found nothing in this tier: none of its open targets fits, and within a request
    /// targets only fill and fewer stay open, so the tier holds nothing for the rest of the
    /// request; it is remembered as swept instead of being listed. (The exhaustive reference
    /// marks every open target of the tier as tried instead: the same answers. The preferred
    /// targets, the only ones that could tell the two apart, were all tried before the tiers,
    /// or are off tier 0 under a strict request.)
    fn sweep(&self, tier: usize, groups: &[Group], req: &PlacementRequest, p: &mut Progress) {
        debug_assert!(req.preferred.iter().all(|&id| {
            !self.open(id, req, p)
                || self
                    .target(id)
                    .is_some_and(|t| !groups.contains(&self.group_of(&t.spec)))
        }));
        p.swept[tier] = true;
    }

    /// Largest hole first and free ratio first: the highest class (of largest region, or of
    /// free ratio) with an open target that fits, ties by the rotation over the whole tier.
    /// Largest hole first skips only what the request rules out; free ratio first also skips
    /// the better-ranked targets that cannot hold the object.
    fn highest(
        &self,
        groups: &[Group],
        pivot: TargetId,
        req: &PlacementRequest,
        p: &Progress,
    ) -> Option<TargetId> {
        let mut best: Option<(u64, TargetId)> = None;
        for &group in groups {
            if self.closed(group, p) {
                continue;
            }
            let Some(g) = self.index.get(&group) else {
                continue;
            };
            let found = match self.policy {
                Policy::LargestHoleFirst => g
                    .by_hole
                    .highest_down_to(req.size, pivot, |id| self.open(id, req, p)),
                _ => g.by_ratio.highest_down_to(0, pivot, |id| {
                    self.open(id, req, p) && self.fits(id, req.size)
                }),
            };
            if let Some((key, id)) = found {
                best = match best {
                    Some((k, b))
                        if k > key || (k == key && rotation(b, pivot) < rotation(id, pivot)) =>
                    {
                        best
                    }
                    _ => Some((key, id)),
                };
            }
        }
        best.map(|(_, id)| id)
    }

    /// Random: a target drawn uniformly from the tier's active ones until one is open and
    /// fits (so uniform among those), at most `RANDOM_SAMPLES_MAX` draws; then (few fit) a
    /// uniform pick among the fitting ones, listed from the index. When nothing fits, the
    /// largest holes say so without a draw.
    fn random(
        &mut self,
        groups: &[Group],
        req: &PlacementRequest,
        p: &Progress,
    ) -> Option<TargetId> {
        let open_groups = || {
            groups
                .iter()
                .filter(|&&g| !self.closed(g, p))
                .filter_map(|g| self.index.get(g))
        };
        let any_fits = open_groups().any(|g| g.by_hole.max_key().is_some_and(|k| k >= req.size));
        if !any_fits {
            return None;
        }
        let mut rng = self.rng;
        let total: usize = open_groups().map(|g| g.members.len()).sum();
        let mut pick = None;
        for _ in 0..RANDOM_SAMPLES_MAX {
            let mut at = (splitmix(&mut rng) % total as u64) as usize;
            let id = open_groups()
                .find_map(|g| match g.members.get(at) {
                    Some(&id) => Some(id),
                    None => {
                        at -= g.members.len();
                        None
                    }
                })
                .expect("a draw below the total lands in a group");
            if self.open(id, req, p) && self.fits(id, req.size) {
                pick = Some(id);
                break;
            }
        }
        if pick.is_none() {
            let fitting: Vec<TargetId> = open_groups()
                .flat_map(|g| g.by_hole.ids_from(req.size))
                .filter(|&id| self.open(id, req, p))
                .collect();
            if !fitting.is_empty() {
                pick = Some(fitting[(splitmix(&mut rng) % fitting.len() as u64) as usize]);
            }
        }
        self.rng = rng;
        pick
    }

    fn allocate_on(&mut self, id: TargetId, size: u64) -> Option<Extent> {
        let target = self.targets[id.0 as usize].as_mut().expect("live target");
        // Under `random` (and the seeded ties of the comparators) a placement may land on a cold
        // target. When its holes are in trees, reading an end of each first lets their cache
        // misses overlap, where the allocation would take them one after the other.
        std::hint::black_box((
            target.alloc.largest_free_region(),
            target.alloc.holes().next(),
        ));
        let extent = target.alloc.allocate(size).ok()?;
        target.objects += 1;
        let (local, locality) = (target.host == self.local_host, target.locality);
        self.uses.record(id, extent);
        self.stats.on_allocate(extent.len, local, locality);
        self.reindex(id);
        Some(extent)
    }

    /// Places every replica it can. Errors only when not even one replica fits (or, strict,
    /// none fits on the node).
    pub fn place(&mut self, req: &PlacementRequest) -> Result<Placed, PlacementError> {
        self.place_with(req, Scan::Indexed)
    }

    /// The reference `place` is tested against: the same decisions (and the same draws from
    /// the RNG, none under best fit; under `random`, the same outcome and tier) by scanning
    /// every target. For tests only.
    #[doc(hidden)]
    pub fn place_exhaustive(&mut self, req: &PlacementRequest) -> Result<Placed, PlacementError> {
        self.place_with(req, Scan::Exhaustive)
    }

    /// The RNG's state, so tests can check that two placers draw alike.
    #[doc(hidden)]
    pub fn rng_state(&self) -> u64 {
        self.rng
    }

    fn place_with(&mut self, req: &PlacementRequest, scan: Scan) -> Result<Placed, PlacementError> {
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
        let mut p = std::mem::take(&mut self.scratch);
        p.clear();
        let outcome = self.place_replicas(req, scan, &mut p);
        self.scratch = p;
        outcome
    }

    fn place_replicas(
        &mut self,
        req: &PlacementRequest,
        scan: Scan,
        p: &mut Progress,
    ) -> Result<Placed, PlacementError> {
        self.stats.requests += 1;
        if req.hint.node.is_none() {
            self.stats.requests_without_locality += 1;
        }
        let granule = match scan {
            Scan::Indexed => self.granules.max().unwrap_or(1),
            Scan::Exhaustive => self.granule_exhaustive(),
        };
        let rounded = req
            .size
            .checked_next_multiple_of(granule)
            .unwrap_or(u64::MAX);
        let mut placed: Vec<(TargetId, Extent)> = Vec::new();
        let tiers: &[usize] = if req.hint.strict { &[0] } else { &[0, 1, 2, 3] };
        for _ in 0..req.replicas {
            let mut chosen: Option<(TargetId, Extent, Option<usize>)> = None;
            // Preferred targets first, in order.
            for &id in &req.preferred {
                if !self.open(id, req, p) {
                    continue;
                }
                let target = self.target(id).expect("usable");
                let on_node = target.locality == req.hint.node;
                if req.hint.strict && !(on_node && target.host == self.local_host) {
                    continue;
                }
                p.tried.insert(id);
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
                let mut groups = std::mem::take(&mut p.groups);
                self.tier_groups_into(tier, req.hint.node, &mut groups);
                let pick = match scan {
                    _ if groups.is_empty() => None,
                    Scan::Indexed => self.choose(tier, &groups, req, rounded, p),
                    Scan::Exhaustive => self.choose_exhaustive(&groups, req, rounded, p),
                };
                p.groups = groups;
                if let Some(id) = pick {
                    p.tried.insert(id);
                    let extent = self.allocate_on(id, req.size);
                    debug_assert!(extent.is_some(), "{id} was chosen and cannot hold it");
                    chosen = extent.map(|extent| (id, extent, Some(tier)));
                }
            }
            match chosen {
                Some((id, extent, tier)) => {
                    p.used_hosts.push(self.target(id).expect("live").host);
                    self.stats.on_placed(tier, extent.len);
                    placed.push((id, extent));
                }
                None => break,
            }
        }
        if placed.is_empty() {
            let (free, largest_hole) = match scan {
                Scan::Indexed => self.free_and_largest_hole(),
                Scan::Exhaustive => self.free_and_largest_hole_exhaustive(),
            };
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
        self.uses.touch(id, offset);
    }

    /// For a request that found no hole: the least recently used extents of the first target
    /// (in the request's candidate order: preferred, then tier by tier, largest region first)
    /// whose freeing, oldest first, would leave a hole for it, at most `bound` of them. Pure:
    /// nothing is freed here. A failure path of `--segment-eviction lru` only: it may look at
    /// every candidate, but rules one out from its free bytes and its `bound` oldest extents
    /// before it simulates anything.
    pub fn eviction_plan(
        &self,
        req: &PlacementRequest,
        bound: usize,
    ) -> Option<(TargetId, Vec<Extent>)> {
        let rounded = req
            .size
            .checked_next_multiple_of(self.granules.max().unwrap_or(1))?;
        let tiers: &[usize] = if req.hint.strict { &[0] } else { &[0, 1, 2, 3] };
        let tiered = tiers
            .iter()
            .flat_map(|&tier| self.tier_groups(tier, req.hint.node))
            .filter_map(|group| self.index.get(&group))
            .flat_map(|g| g.by_hole.ids_descending());
        let mut seen = HashSet::new();
        for id in req.preferred.iter().copied().chain(tiered) {
            if !seen.insert(id) {
                continue;
            }
            if let Some(victims) = self.plan_on(id, req, rounded, bound, true) {
                return Some((id, victims));
            }
        }
        None
    }

    /// The oldest extents of one target whose freeing leaves a hole of `rounded` bytes, if
    /// the target is a candidate for the request and its `bound` oldest do.
    fn plan_on(
        &self,
        id: TargetId,
        req: &PlacementRequest,
        rounded: u64,
        bound: usize,
        prefilter: bool,
    ) -> Option<Vec<Extent>> {
        if !self.usable(id, req, &[]) {
            return None;
        }
        let target = self.target(id).expect("usable");
        if req.hint.strict && !(target.locality == req.hint.node && target.host == self.local_host)
        {
            return None;
        }
        if target.alloc.capacity() < rounded {
            return None;
        }
        if prefilter {
            // No hole can outgrow the free bytes the victims leave.
            let reclaimable: u64 = self.uses.oldest(id).take(bound).map(|e| e.len).sum();
            if reclaimable == 0 || target.alloc.free_bytes() + reclaimable < rounded {
                return None;
            }
        }
        let mut scratch = target.alloc.clone();
        let mut victims = Vec::new();
        for extent in self.uses.oldest(id).take(bound) {
            scratch.free(*extent);
            victims.push(*extent);
            if scratch.largest_free_region() >= rounded {
                return Some(victims);
            }
        }
        None
    }

    /// Checks every index and total against the targets: each active target sits exactly once
    /// in its group's indexes under its current keys, no draining or unmounted one does, and the
    /// multisets and sums over mounted targets equal the ones kept.
    pub fn check_invariants(&self) {
        let frf = self.policy == Policy::FreeRatioFirst;
        let (mut draining, mut granules, mut free) = (Multiset::default(), Multiset::default(), 0);
        let mut active: HashMap<Group, usize> = HashMap::new();
        let (mut spaced, mut objects) = (0, 0);
        for (id, t) in self.targets() {
            t.alloc.check_invariants();
            assert_eq!(
                self.uses.oldest(id).count() as u64,
                t.objects,
                "{id}: use order lost an extent"
            );
            objects += t.objects;
            assert_eq!(
                t.indexed_largest,
                t.alloc.largest_free_region(),
                "{id} index key stale"
            );
            assert_eq!(
                t.indexed_free,
                t.alloc.free_bytes(),
                "{id} free bytes stale"
            );
            assert_eq!(t.indexed_ratio, ratio_bits(&t.alloc), "{id} ratio stale");
            if t.status == TargetStatus::Draining {
                draining.insert(t.indexed_largest);
            }
            granules.insert(t.spec.granule);
            free += t.indexed_free;
            assert_eq!(self.uuids.get(&t.spec.uuid), Some(&id), "{id} uuid");
            let space = (t.spec.host, t.spec.kind, t.spec.name.clone());
            assert_eq!(
                self.spaces.get(&space).and_then(|r| r.get(&t.spec.base)),
                Some(&(t.spec.base.saturating_add(t.spec.size), id)),
                "{id} range"
            );
            spaced += 1;
            let group = self.group_of(&t.spec);
            assert_eq!(
                (t.host, t.locality),
                (t.spec.host, t.spec.locality),
                "{id} copies of its spec"
            );
            let hot = self.hot[id.0 as usize];
            assert_eq!(
                (hot.active, hot.host, hot.largest),
                (t.status == TargetStatus::Active, t.host, t.indexed_largest),
                "{id} hot copy"
            );
            let g = &self.index[&group];
            let listed = g.by_hole.contains(t.indexed_largest, id);
            let in_ratio = g.by_ratio.contains(t.indexed_ratio, id);
            let member = g.members.get(t.slot as usize) == Some(&id);
            match t.status {
                TargetStatus::Active => {
                    assert!(listed && member, "{id} active and not indexed");
                    assert_eq!(in_ratio, frf, "{id} ratio index");
                    *active.entry(group).or_default() += 1;
                }
                TargetStatus::Draining => {
                    assert!(!listed && !member && !in_ratio, "{id} draining and indexed")
                }
            }
        }
        for (group, g) in &self.index {
            let n = active.get(group).copied().unwrap_or(0);
            assert_eq!(g.by_hole.len(), n, "{group:?} holds other targets");
            assert_eq!(g.members.len(), n, "{group:?} members");
            assert_eq!(
                g.by_ratio.len(),
                if frf { n } else { 0 },
                "{group:?} ratios"
            );
        }
        assert_eq!(
            draining, self.draining_holes,
            "largest holes of draining targets"
        );
        assert_eq!(granules, self.granules, "granules");
        assert_eq!(free, self.free_bytes, "free bytes");
        assert_eq!(self.uuids.len(), spaced, "uuids of unmounted targets");
        let ranges: usize = self.spaces.values().map(BTreeMap::len).sum();
        assert_eq!(ranges, spaced, "ranges of unmounted targets");
        assert_eq!(self.hot.len(), self.targets.len(), "hot copies");
        assert!(
            self.hot
                .iter()
                .enumerate()
                .all(|(i, h)| !h.active || self.target(TargetId(i as u32)).is_some()),
            "an unmounted target is active"
        );
        assert_eq!(self.uses.len() as u64, objects, "uses of unmounted targets");
        self.uses.check_invariants();
    }
}
