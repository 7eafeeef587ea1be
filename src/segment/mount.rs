//! Turning `--segment` specifications into mounted store targets: one per file, one per node
//! of a memory segment (no allocation ever crosses a NUMA boundary).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::topology::{NodeId, Topology};
use crate::units::ByteSize;

use super::label::random_id;
use super::spec::{FileLocality, SegmentSpec};
use super::storage::{FileStorage, MemStorage, MountOrigin};
use super::target::{HostId, TargetKind, TargetSpec};

/// Granule of every target: the device block.
pub const TARGET_GRANULE_BYTES: u64 = 4096;

/// The bytes behind one target.
#[derive(Clone, Debug)]
pub enum TargetStorage {
    Mem(Arc<MemStorage>),
    File(Arc<FileStorage>),
}

/// A target ready for the placement master and for the shards' I/O.
#[derive(Clone, Debug)]
pub struct MountedTarget {
    pub spec: TargetSpec,
    pub storage: TargetStorage,
}

#[derive(Debug)]
pub struct MountFailure {
    pub segment: String,
    pub reason: String,
}

impl fmt::Display for MountFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot mount segment {}: {}", self.segment, self.reason)
    }
}

impl std::error::Error for MountFailure {}

/// The identity version 1 snapshots gave a file segment: a hash of its canonical path through
/// `DefaultHasher`, whose algorithm Rust leaves unspecified. Only to read such a snapshot
/// (`server::warm`): segments carry their own ids now (`label.rs`), and a snapshot written by
/// a build with another hasher may name segments this cannot match (said, never guessed).
pub fn legacy_path_uuid(path: &std::path::Path) -> u128 {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let parts = ("file", &canonical);
    let mut high = std::collections::hash_map::DefaultHasher::new();
    ("headroom-target", &parts).hash(&mut high);
    let mut low = std::collections::hash_map::DefaultHasher::new();
    (&parts, "headroom-target").hash(&mut low);
    (u128::from(high.finish()) << 64) | u128::from(low.finish())
}

/// Memory per node that something else already holds: the arena's pages and the memory
/// segments mounted before. A memory segment can have only what is left.
pub type NodeBytes = std::collections::BTreeMap<NodeId, u64>;

/// What a node's memory can back for a memory segment: its MemTotal less its huge page pool
/// (ordinary pages cannot use the pool), from sysfs; the machine's (`/proc/meminfo`) when the
/// node has no sysfs entry. `None` when neither says.
fn node_backable_bytes(node: NodeId, huge_page_bytes: u64) -> Option<u64> {
    let field = |text: &str, name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.split_whitespace().last()? == name)
                .then(|| value.split_whitespace().next()?.parse::<u64>().ok())
                .flatten()
        })
    };
    let text = std::fs::read_to_string(format!("/sys/devices/system/node/node{node}/meminfo"))
        .or_else(|_| std::fs::read_to_string("/proc/meminfo"))
        .ok()?;
    let total = field(&text, "MemTotal")? * 1024;
    let pool = field(&text, "HugePages_Total").unwrap_or(0) * huge_page_bytes;
    Some(total.saturating_sub(pool))
}

/// `bytes` for a sentence: GiB with one decimal from 1 GiB up (MemTotal is no round figure).
fn rounded(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        ByteSize(bytes).to_string()
    }
}

/// Refuses a memory segment of `per_node` bytes on `node` that the node could never back, with
/// the figures.
fn check_backable(
    per_node: u64,
    node: NodeId,
    held: u64,
    huge_page_bytes: u64,
) -> Result<(), String> {
    let Some(backable) = node_backable_bytes(node, huge_page_bytes) else {
        return Ok(());
    };
    if per_node > backable.saturating_sub(held) {
        return Err(format!(
            "node {node} cannot back {} of memory: it has {} outside its huge page pool, and the arena and other memory segments already hold {} of it",
            ByteSize(per_node),
            rounded(backable),
            rounded(held)
        ));
    }
    Ok(())
}

/// Mounts every segment: files are created and sized when missing and must take O_DIRECT;
/// memory is mapped per node and bound there, and refused when the node could never back it
/// beside what `held` says is taken.
pub fn mount_all(
    specs: &[SegmentSpec],
    topology: &Topology,
    host: HostId,
    origin: &MountOrigin,
    held: &NodeBytes,
) -> Result<Vec<MountedTarget>, MountFailure> {
    let mut targets = Vec::new();
    let mut held = held.clone();
    for spec in specs {
        let fail = |reason: String| MountFailure {
            segment: spec.to_string(),
            reason,
        };
        if let Err(reason) = spec.check_size() {
            return Err(fail(reason));
        }
        match spec {
            SegmentSpec::File {
                path,
                size,
                locality,
            } => {
                let storage =
                    FileStorage::prepare(path, *size, origin).map_err(|e| fail(e.to_string()))?;
                if storage.dio_align > TARGET_GRANULE_BYTES {
                    return Err(fail(format!(
                        "the device wants {}-byte O_DIRECT alignment; at most 4096 is supported",
                        storage.dio_align
                    )));
                }
                let node = match locality {
                    FileLocality::Unknown => None,
                    FileLocality::Node(node) => Some(*node),
                    FileLocality::Auto => storage.device_node(topology),
                };
                targets.push(MountedTarget {
                    spec: TargetSpec {
                        // A file's identity is the id in its label, wherever it lies: a
                        // remount with another size or locality is caught by the master.
                        uuid: storage.id,
                        name: path.display().to_string(),
                        host,
                        kind: TargetKind::File,
                        base: 0,
                        size: storage.size,
                        locality: node,
                        granule: TARGET_GRANULE_BYTES,
                    },
                    storage: TargetStorage::File(Arc::new(storage)),
                });
            }
            SegmentSpec::Mem { size, nodes } => {
                let per_node = size / nodes.len() as u64;
                for &node in nodes {
                    let taken = held.get(&node).copied().unwrap_or(0);
                    check_backable(per_node, node, taken, topology.huge_page_bytes())
                        .map_err(fail)?;
                    *held.entry(node).or_insert(0) += per_node;
                }
                for (i, &node) in nodes.iter().enumerate() {
                    let storage = MemStorage::map(per_node, Some(node))
                        .map_err(|e| fail(format!("node {node}: {e}")))?;
                    targets.push(MountedTarget {
                        spec: TargetSpec {
                            // Memory does not survive an unmount: every mount is a new target.
                            uuid: random_id().map_err(|e| fail(format!("no id: {e}")))?,
                            name: spec.to_string(),
                            host,
                            kind: TargetKind::Mem,
                            base: i as u64 * per_node,
                            size: per_node,
                            locality: Some(node),
                            granule: TARGET_GRANULE_BYTES,
                        },
                        storage: TargetStorage::Mem(Arc::new(storage)),
                    });
                }
            }
        }
    }
    Ok(targets)
}
