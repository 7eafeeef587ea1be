//! Turning `--segment` specifications into mounted store targets: one per file, one per node
//! of a memory segment (no allocation ever crosses a NUMA boundary).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::topology::Topology;

use super::spec::{FileLocality, SegmentSpec};
use super::storage::{FileStorage, MemStorage, MountOrigin};
use super::target::{HostId, TargetKind, TargetSpec};

/// Counts memory mounts, so each one gets its own identity.
static MEM_MOUNTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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

/// A stable identity: the same segment on the same path mounts with the same uuid.
fn uuid_of(parts: impl Hash) -> u128 {
    let mut high = std::collections::hash_map::DefaultHasher::new();
    ("headroom-target", &parts).hash(&mut high);
    let mut low = std::collections::hash_map::DefaultHasher::new();
    (&parts, "headroom-target").hash(&mut low);
    (u128::from(high.finish()) << 64) | u128::from(low.finish())
}

/// Mounts every segment: files are created and sized when missing and must take O_DIRECT;
/// memory is mapped per node and bound there.
pub fn mount_all(
    specs: &[SegmentSpec],
    topology: &Topology,
    host: HostId,
    origin: &MountOrigin,
) -> Result<Vec<MountedTarget>, MountFailure> {
    let mut targets = Vec::new();
    for spec in specs {
        let fail = |reason: String| MountFailure {
            segment: spec.to_string(),
            reason,
        };
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
                let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                targets.push(MountedTarget {
                    spec: TargetSpec {
                        // A file's identity is its path: remounting it with another size or
                        // locality is caught by the master, not silently a new target.
                        uuid: uuid_of(("file", &canonical)),
                        name: path.display().to_string(),
                        host,
                        kind: TargetKind::File,
                        base: 0,
                        size: *size,
                        locality: node,
                        granule: TARGET_GRANULE_BYTES,
                    },
                    storage: TargetStorage::File(Arc::new(storage)),
                });
            }
            SegmentSpec::Mem { size, nodes } => {
                let per_node = size / nodes.len() as u64;
                for (i, &node) in nodes.iter().enumerate() {
                    let storage = MemStorage::map(per_node, Some(node))
                        .map_err(|e| fail(format!("node {node}: {e}")))?;
                    targets.push(MountedTarget {
                        spec: TargetSpec {
                            // Memory does not survive an unmount: every mount is a new target.
                            uuid: uuid_of((
                                "mem",
                                MEM_MOUNTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                                std::process::id(),
                                node,
                                per_node,
                            )),
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
