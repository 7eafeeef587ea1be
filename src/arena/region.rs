//! Regions: one independently mapped range per (reservation, node), with the backing it got.
//!
//! Each region first tries the node's own hugetlb pool and checks that every page is resident
//! on the intended node; if the pool is short, the page order is unavailable or the check
//! fails, it maps the same bytes from ordinary pages, binds them strictly to the node,
//! populates and locks them. Geometry and capacity never change on fallback (ADR-0008).

use std::fmt;
use std::io;
use std::time::{Duration, Instant};

use crate::topology::{NodeId, Topology};
use crate::units::ByteSize;

use super::plan::RegionPlan;
use crate::sys::{self, Mapping};

/// What a region's bytes are made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Explicit hugetlb pages, every one verified on the region's node.
    HugeTlb { page_bytes: u64 },
    /// Ordinary pages, bound to the node (when there is one), populated, locked and verified.
    /// `reason` says why the hugetlb attempt did not stand.
    Fallback { reason: String },
    /// Ordinary memory, neither bound nor locked: only for tests and benchmarks that exercise
    /// the allocators without committing real resources.
    Unlocked,
}

impl Backing {
    pub fn name(&self) -> &'static str {
        match self {
            Backing::HugeTlb { .. } => "hugetlb",
            Backing::Fallback { .. } => "fallback",
            Backing::Unlocked => "unlocked",
        }
    }
}

impl fmt::Display for Backing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Backing::HugeTlb { page_bytes } => write!(f, "hugetlb {} pages", ByteSize(*page_bytes)),
            Backing::Fallback { reason } => write!(f, "normal pages, bound and locked ({reason})"),
            Backing::Unlocked => f.write_str("unlocked ordinary memory (test fixture)"),
        }
    }
}

/// Why a region could not be mapped at all (the fallback failed too).
#[derive(Debug)]
pub enum MapError {
    /// RLIMIT_MEMLOCK is below what the plan locks and CAP_IPC_LOCK is missing.
    MemLockLimit { needed_bytes: u64, limit_bytes: u64 },
    /// The node (or, unbound, the machine) has less free memory than its regions need.
    NodeMemory {
        node: Option<NodeId>,
        needed_bytes: u64,
        free_bytes: u64,
    },
    /// A system call of the fallback path failed.
    Syscall {
        region: String,
        step: &'static str,
        err: io::Error,
    },
    /// Pages of a bound, locked region were found off its node.
    Placement {
        region: String,
        node: NodeId,
        misplaced_pages: usize,
        example: i32,
    },
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::MemLockLimit {
                needed_bytes,
                limit_bytes,
            } => write!(
                f,
                "the arena locks {} ({needed_bytes} bytes) but RLIMIT_MEMLOCK allows {} and the \
                 process lacks CAP_IPC_LOCK; raise the limit (`ulimit -l unlimited`, or \
                 LimitMEMLOCK=infinity in a systemd unit) or grant the capability \
                 (`setcap cap_ipc_lock+ep headroom`)",
                ByteSize(*needed_bytes),
                ByteSize(*limit_bytes)
            ),
            MapError::NodeMemory {
                node,
                needed_bytes,
                free_bytes,
            } => write!(
                f,
                "{} has {} free (counting reclaimable page cache) but its regions need {}; \
                 lower --memory and the other budgets or free memory there",
                node.map_or("the machine".to_string(), |n| format!("node {n}")),
                ByteSize(*free_bytes),
                ByteSize(*needed_bytes)
            ),
            MapError::Syscall { region, step, err } => {
                write!(f, "mapping region {region} failed at {step}: {err}")
            }
            MapError::Placement {
                region,
                node,
                misplaced_pages,
                example,
            } => write!(
                f,
                "region {region} is bound to node {node} but {misplaced_pages} of its pages are \
                 elsewhere (e.g. status {example})"
            ),
        }
    }
}

impl std::error::Error for MapError {}

/// A mapped region.
#[derive(Debug)]
pub struct Region {
    pub plan: RegionPlan,
    pub backing: Backing,
    pub map_duration: Duration,
    mapping: Mapping,
}

impl Region {
    pub fn base_addr(&self) -> usize {
        self.mapping.base().as_ptr() as usize
    }

    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// The node of every page of the region, at the backing's page size.
    pub fn page_nodes(&self) -> io::Result<Vec<i32>> {
        self.mapping.page_nodes(self.page_bytes())
    }

    pub fn page_bytes(&self) -> usize {
        match self.backing {
            Backing::HugeTlb { page_bytes } => page_bytes as usize,
            _ => sys::base_page_bytes(),
        }
    }
}

/// How regions get their memory.
pub trait RegionMapper {
    fn map(&self, plan: &RegionPlan, huge_page_bytes: u64) -> Result<Region, MapError>;
}

/// The production mapper: node-local hugetlb first, then bound, locked ordinary pages.
pub struct NumaMapper<'a> {
    topology: &'a Topology,
    /// Ordinary-page bytes already mapped per node (`None`: unbound), so the free-memory
    /// check counts every region on a node, not each one alone.
    claimed: std::cell::RefCell<std::collections::HashMap<Option<NodeId>, u64>>,
}

impl<'a> NumaMapper<'a> {
    pub fn new(topology: &'a Topology) -> NumaMapper<'a> {
        NumaMapper {
            topology,
            claimed: Default::default(),
        }
    }
}

/// MemAvailable of the whole machine, from /proc/meminfo.
fn machine_mem_available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Ordinary unlocked memory without any binding: for tests and benchmarks of the allocator
/// logic, never for serving.
pub struct UnlockedMapper;

impl RegionMapper for UnlockedMapper {
    fn map(&self, plan: &RegionPlan, huge_page_bytes: u64) -> Result<Region, MapError> {
        let started = Instant::now();
        let mapping = Mapping::anonymous(plan.bytes as usize, huge_page_bytes as usize, None)
            .map_err(|err| syscall_error(plan, "mmap", err))?;
        Ok(Region {
            plan: plan.clone(),
            backing: Backing::Unlocked,
            map_duration: started.elapsed(),
            mapping,
        })
    }
}

fn describe(plan: &RegionPlan) -> String {
    match plan.node {
        Some(node) => format!("{}#{} (node {node})", plan.reservation, plan.rank),
        None => format!("{}#{} (unbound)", plan.reservation, plan.rank),
    }
}

fn syscall_error(plan: &RegionPlan, step: &'static str, err: io::Error) -> MapError {
    MapError::Syscall {
        region: describe(plan),
        step,
        err,
    }
}

/// Counts pages whose status is not the wanted node (or, unbound, not resident at all).
fn misplaced(statuses: &[i32], node: Option<NodeId>) -> (usize, i32) {
    let wrong = |status: &i32| match node {
        Some(node) => *status != node as i32,
        None => *status < 0,
    };
    let count = statuses.iter().filter(|s| wrong(s)).count();
    let example = statuses.iter().copied().find(|s| wrong(s)).unwrap_or(0);
    (count, example)
}

impl NumaMapper<'_> {
    /// The hugetlb attempt; `Err` carries the reason it did not stand.
    fn try_hugetlb(&self, plan: &RegionPlan, page_bytes: u64) -> Result<Mapping, String> {
        if let Some(free) = plan
            .huge_pages_free
            .filter(|&free| free < plan.huge_pages_needed)
        {
            let pool = plan
                .node
                .map_or("machine".to_string(), |n| format!("node {n}"));
            return Err(format!(
                "{pool} hugetlb pool had {free} free {} pages, {} needed",
                ByteSize(page_bytes),
                plan.huge_pages_needed
            ));
        }
        let mapping =
            Mapping::anonymous(plan.bytes as usize, page_bytes as usize, Some(page_bytes))
                .map_err(|err| format!("hugetlb mmap: {err}"))?;
        if let Some(node) = plan.node {
            mapping
                .bind_to_node(node)
                .map_err(|err| format!("hugetlb mbind: {err}"))?;
        }
        mapping
            .populate()
            .map_err(|err| format!("hugetlb populate (pool short on the node?): {err}"))?;
        mapping
            .lock()
            .map_err(|err| format!("hugetlb mlock: {err}"))?;
        let statuses = mapping
            .page_nodes(page_bytes as usize)
            .map_err(|err| format!("hugetlb placement check: {err}"))?;
        let (wrong, example) = misplaced(&statuses, plan.node);
        if wrong > 0 {
            return Err(format!(
                "hugetlb placement check: {wrong} of {} pages off the node (status {example})",
                statuses.len()
            ));
        }
        Ok(mapping)
    }

    fn map_fallback(&self, plan: &RegionPlan, page_bytes: u64) -> Result<Mapping, MapError> {
        let free = match plan.node {
            Some(node) => self.topology.node(node).and_then(|n| n.mem_free_bytes),
            None => machine_mem_available_bytes(),
        };
        let claimed = self.claimed.borrow().get(&plan.node).copied().unwrap_or(0);
        if let Some(free_bytes) = free.filter(|&free| free.saturating_sub(claimed) < plan.bytes) {
            return Err(MapError::NodeMemory {
                node: plan.node,
                needed_bytes: claimed + plan.bytes,
                free_bytes,
            });
        }
        *self.claimed.borrow_mut().entry(plan.node).or_default() += plan.bytes;
        let mapping = Mapping::anonymous(plan.bytes as usize, page_bytes as usize, None)
            .map_err(|err| syscall_error(plan, "mmap", err))?;
        if let Some(node) = plan.node {
            mapping
                .bind_to_node(node)
                .map_err(|err| syscall_error(plan, "mbind", err))?;
        }
        mapping
            .populate()
            .map_err(|err| syscall_error(plan, "populate", err))?;
        mapping
            .lock()
            .map_err(|err| syscall_error(plan, "mlock", err))?;
        let statuses = mapping
            .page_nodes(sys::base_page_bytes())
            .map_err(|err| syscall_error(plan, "move_pages", err))?;
        let (misplaced_pages, example) = misplaced(&statuses, plan.node);
        if misplaced_pages > 0 {
            return Err(MapError::Placement {
                region: describe(plan),
                node: plan.node.unwrap_or(0),
                misplaced_pages,
                example,
            });
        }
        Ok(mapping)
    }
}

impl RegionMapper for NumaMapper<'_> {
    fn map(&self, plan: &RegionPlan, huge_page_bytes: u64) -> Result<Region, MapError> {
        let started = Instant::now();
        let (mapping, backing) = match self.try_hugetlb(plan, huge_page_bytes) {
            Ok(mapping) => (
                mapping,
                Backing::HugeTlb {
                    page_bytes: huge_page_bytes,
                },
            ),
            Err(reason) => {
                let mapping = self.map_fallback(plan, huge_page_bytes)?;
                (mapping, Backing::Fallback { reason })
            }
        };
        Ok(Region {
            plan: plan.clone(),
            backing,
            map_duration: started.elapsed(),
            mapping,
        })
    }
}

/// Fails fast when the plan cannot be locked: RLIMIT_MEMLOCK too low and no CAP_IPC_LOCK.
/// A limit that is too low is first lifted where the process may (to its hard limit, or with
/// CAP_SYS_RESOURCE to unlimited): a unit that grants CAP_SYS_RESOURCE but not CAP_IPC_LOCK,
/// as Debian's memcached unit does, then serves without a LimitMEMLOCK= of its own.
pub fn check_memlock(needed_bytes: u64) -> Result<(), MapError> {
    if sys::has_cap_ipc_lock() {
        return Ok(());
    }
    if sys::memlock_limit_bytes().is_some_and(|limit| limit < needed_bytes) {
        sys::lift_memlock_limit();
    }
    match sys::memlock_limit_bytes() {
        Some(limit_bytes) if limit_bytes < needed_bytes => Err(MapError::MemLockLimit {
            needed_bytes,
            limit_bytes,
        }),
        _ => Ok(()),
    }
}
