//! A store target's identity: what it is, where, on which host and node.

use crate::topology::NodeId;

/// A failure domain: this machine, or a peer.
pub type HostId = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TargetKind {
    /// Anonymous memory bound to a node.
    Mem,
    /// A file or block device, read and written with O_DIRECT.
    File,
}

/// A target's identity, fixed for the life of a mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    pub uuid: u128,
    /// The segment's name (its placement group).
    pub name: String,
    pub host: HostId,
    pub kind: TargetKind,
    /// Where the target starts (an address or a file offset) and its size.
    pub base: u64,
    pub size: u64,
    /// `None`: the node is unknown.
    pub locality: Option<NodeId>,
    /// Allocation granule (the device block).
    pub granule: u64,
}
