//! The RFC's placement metrics.

use std::collections::BTreeMap;

use crate::topology::NodeId;

use super::TargetSpec;

/// Capacity and allocated bytes of one (host, node) pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capacity {
    pub capacity_bytes: u64,
    pub allocated_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementStats {
    pub requests: u64,
    pub requests_without_locality: u64,
    /// Replicas placed in tier 0 (this host, requested node).
    pub exact_node: u64,
    pub exact_node_bytes: u64,
    /// Replicas placed on this host's unknown-locality targets (tier 1).
    pub unknown_locality: u64,
    /// Replicas placed on this host, another node (tier 2).
    pub cross_node_fallbacks: u64,
    /// Replicas placed on another host (tier 3).
    pub other_host_fallbacks: u64,
    /// Replicas placed on a preferred target.
    pub preferred: u64,
    /// Requests that got fewer replicas than asked.
    pub partial: u64,
    pub strict_failures: u64,
    pub failures: u64,
    /// Free bytes and largest hole at the last failure.
    pub last_failure_free: u64,
    pub last_failure_largest_hole: u64,
    pub targets_unknown_locality: u64,
    /// By (local host?, node): capacity and allocated bytes.
    pub by_node: BTreeMap<(bool, Option<NodeId>), Capacity>,
}

impl PlacementStats {
    pub(super) fn on_mount(&mut self, spec: &TargetSpec, usable: u64, local: bool) {
        self.by_node
            .entry((local, spec.locality))
            .or_default()
            .capacity_bytes += usable;
        if spec.locality.is_none() {
            self.targets_unknown_locality += 1;
        }
    }

    pub(super) fn on_unmount(&mut self, spec: &TargetSpec, usable: u64, local: bool) {
        let entry = self.by_node.entry((local, spec.locality)).or_default();
        entry.capacity_bytes -= usable;
        if spec.locality.is_none() {
            self.targets_unknown_locality -= 1;
        }
    }

    pub(super) fn on_allocate(&mut self, bytes: u64, local: bool, node: Option<NodeId>) {
        self.by_node
            .entry((local, node))
            .or_default()
            .allocated_bytes += bytes;
    }

    pub(super) fn on_free(&mut self, bytes: u64, local: bool, node: Option<NodeId>) {
        self.by_node
            .entry((local, node))
            .or_default()
            .allocated_bytes -= bytes;
    }

    pub(super) fn on_placed(&mut self, tier: Option<usize>, bytes: u64) {
        match tier {
            None => self.preferred += 1,
            Some(0) => {
                self.exact_node += 1;
                self.exact_node_bytes += bytes;
            }
            Some(1) => self.unknown_locality += 1,
            Some(2) => self.cross_node_fallbacks += 1,
            Some(_) => self.other_host_fallbacks += 1,
        }
    }

    pub(super) fn on_failure(&mut self, strict: bool, free: u64, largest_hole: u64) {
        if strict {
            self.strict_failures += 1;
        }
        self.failures += 1;
        self.last_failure_free = free;
        self.last_failure_largest_hole = largest_hole;
    }
}
