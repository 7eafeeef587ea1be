//! The machine's NUMA layout: online nodes, their CPUs, the distance matrix, each node's free
//! huge pages, and which node each network interface and block device hangs off.
//!
//! Read from sysfs on a real machine ([`Topology::from_sysfs`]), or described by hand so every
//! placement rule can be exercised on a one-node machine: [`Topology::synthetic`] in tests, and
//! for the binary a TOML file named by the `HEADROOM_TOPOLOGY` environment variable (format in
//! `docs/topology.md`).

mod file;
mod sysfs;

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub use file::TopologyFileError;

/// A NUMA node number as the kernel names it.
pub type NodeId = u32;

/// Environment variable naming a synthetic topology file for the binary.
pub const TOPOLOGY_ENV: &str = "HEADROOM_TOPOLOGY";

/// The distance the kernel reports from a node to itself.
pub const LOCAL_DISTANCE: u32 = 10;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub id: NodeId,
    pub cpus: Vec<usize>,
    /// Free pages of the default huge page size in this node's own hugetlb pool, when known.
    pub huge_pages_free: Option<u64>,
    /// Memory this node can give a new mapping, when known: free pages plus reclaimable page
    /// cache and slab.
    pub mem_free_bytes: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nic {
    pub name: String,
    /// `None` when the kernel does not know (virtual interfaces, loopback, one-node machines).
    pub node: Option<NodeId>,
    pub addrs: Vec<IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDevice {
    pub name: String,
    pub node: Option<NodeId>,
    pub logical_block_bytes: Option<u64>,
}

/// Where a topology came from, for logs and the memory plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologySource {
    Sysfs(PathBuf),
    File(PathBuf),
    Synthetic,
}

impl fmt::Display for TopologySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologySource::Sysfs(root) => write!(f, "sysfs ({})", root.display()),
            TopologySource::File(path) => write!(f, "file {} (synthetic)", path.display()),
            TopologySource::Synthetic => f.write_str("synthetic"),
        }
    }
}

/// The NUMA layout one process sees. Nodes are kept in ascending id order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<Node>,
    /// `distances[i][j]`: distance from `nodes[i]` to `nodes[j]`.
    distances: Vec<Vec<u32>>,
    huge_page_bytes: u64,
    /// Free pages of the default huge page size in the whole-machine pool, when known.
    huge_pages_free_total: Option<u64>,
    nics: Vec<Nic>,
    block_devices: Vec<BlockDevice>,
    source: TopologySource,
}

#[derive(Debug)]
pub enum TopologyError {
    /// sysfs could not be read in a way that leaves no sane default.
    Sysfs {
        path: PathBuf,
        reason: String,
    },
    File(TopologyFileError),
    Invalid(String),
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologyError::Sysfs { path, reason } => {
                write!(
                    f,
                    "cannot read the NUMA topology from {}: {reason}",
                    path.display()
                )
            }
            TopologyError::File(err) => write!(f, "{err}"),
            TopologyError::Invalid(reason) => write!(f, "invalid topology: {reason}"),
        }
    }
}

impl std::error::Error for TopologyError {}

/// The huge page size this architecture's allocator is built around (ADR-0008).
pub const fn platform_huge_page_bytes() -> u64 {
    if cfg!(target_arch = "aarch64") || cfg!(target_arch = "loongarch64") {
        32 << 20
    } else {
        2 << 20
    }
}

impl Topology {
    /// The topology of this machine: `HEADROOM_TOPOLOGY` when set, else sysfs.
    pub fn load() -> Result<Topology, TopologyError> {
        match std::env::var_os(TOPOLOGY_ENV) {
            Some(path) if !path.is_empty() => Topology::from_file(Path::new(&path)),
            _ => Topology::from_sysfs(Path::new("/sys")),
        }
    }

    /// Reads the topology under a sysfs root (normally `/sys`).
    pub fn from_sysfs(root: &Path) -> Result<Topology, TopologyError> {
        sysfs::read(root)
    }

    /// Reads a synthetic topology file (see `docs/topology.md`).
    pub fn from_file(path: &Path) -> Result<Topology, TopologyError> {
        file::read(path).map_err(TopologyError::File)
    }

    /// A synthetic topology for tests: `cpus_per_node[i]` CPUs on node `i`, numbered
    /// consecutively, and the given distance matrix (validated like a file's).
    pub fn synthetic(
        cpus_per_node: &[usize],
        distances: Vec<Vec<u32>>,
        huge_page_bytes: u64,
    ) -> Result<Topology, TopologyError> {
        let mut next_cpu = 0;
        let nodes = cpus_per_node
            .iter()
            .enumerate()
            .map(|(id, &count)| {
                let cpus = (next_cpu..next_cpu + count).collect();
                next_cpu += count;
                Node {
                    id: id as NodeId,
                    cpus,
                    huge_pages_free: Some(0),
                    mem_free_bytes: None,
                }
            })
            .collect();
        Topology::new(
            nodes,
            distances,
            huge_page_bytes,
            Some(0),
            Vec::new(),
            Vec::new(),
            TopologySource::Synthetic,
        )
    }

    /// Builds and validates a topology from its parts.
    pub fn new(
        mut nodes: Vec<Node>,
        distances: Vec<Vec<u32>>,
        huge_page_bytes: u64,
        huge_pages_free_total: Option<u64>,
        nics: Vec<Nic>,
        block_devices: Vec<BlockDevice>,
        source: TopologySource,
    ) -> Result<Topology, TopologyError> {
        if nodes.is_empty() {
            return Err(TopologyError::Invalid("no online NUMA node".into()));
        }
        // Keep rows and columns of the matrix in step with the sorted node order.
        let mut order: Vec<usize> = (0..nodes.len()).collect();
        order.sort_by_key(|&i| nodes[i].id);
        if distances.len() != nodes.len() || distances.iter().any(|row| row.len() != nodes.len()) {
            return Err(TopologyError::Invalid(format!(
                "the distance matrix must be {n}x{n} for {n} nodes",
                n = nodes.len()
            )));
        }
        let distances: Vec<Vec<u32>> = order
            .iter()
            .map(|&i| order.iter().map(|&j| distances[i][j]).collect())
            .collect();
        nodes.sort_by_key(|node| node.id);
        if nodes.windows(2).any(|pair| pair[0].id == pair[1].id) {
            return Err(TopologyError::Invalid("a node id appears twice".into()));
        }
        for (i, row) in distances.iter().enumerate() {
            if row[i] != LOCAL_DISTANCE {
                return Err(TopologyError::Invalid(format!(
                    "node {} must be at distance {LOCAL_DISTANCE} from itself, not {}",
                    nodes[i].id, row[i]
                )));
            }
            if let Some(j) = (0..row.len()).find(|&j| j != i && row[j] <= LOCAL_DISTANCE) {
                return Err(TopologyError::Invalid(format!(
                    "node {} must be farther than {LOCAL_DISTANCE} from node {}",
                    nodes[j].id, nodes[i].id
                )));
            }
        }
        if !huge_page_bytes.is_power_of_two() || huge_page_bytes < 4096 {
            return Err(TopologyError::Invalid(format!(
                "huge page size {huge_page_bytes} is not a power of two of at least 4096"
            )));
        }
        let known = |node: Option<NodeId>| node.is_none_or(|id| nodes.iter().any(|n| n.id == id));
        if let Some(nic) = nics.iter().find(|nic| !known(nic.node)) {
            return Err(TopologyError::Invalid(format!(
                "interface {} is on node {:?}, which is not online",
                nic.name, nic.node
            )));
        }
        if let Some(dev) = block_devices.iter().find(|dev| !known(dev.node)) {
            return Err(TopologyError::Invalid(format!(
                "block device {} is on node {:?}, which is not online",
                dev.name, dev.node
            )));
        }
        Ok(Topology {
            nodes,
            distances,
            huge_page_bytes,
            huge_pages_free_total,
            nics,
            block_devices,
            source,
        })
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.iter().map(|node| node.id).collect()
    }

    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.iter().find(|node| node.id == id)
    }

    pub fn is_online(&self, id: NodeId) -> bool {
        self.node(id).is_some()
    }

    pub fn online_count(&self) -> usize {
        self.nodes.len()
    }

    /// All CPUs of all online nodes, ascending.
    pub fn all_cpus(&self) -> Vec<usize> {
        let mut cpus: Vec<usize> = self.nodes.iter().flat_map(|n| n.cpus.clone()).collect();
        cpus.sort_unstable();
        cpus
    }

    pub fn huge_page_bytes(&self) -> u64 {
        self.huge_page_bytes
    }

    pub fn huge_pages_free_total(&self) -> Option<u64> {
        self.huge_pages_free_total
    }

    pub fn nics(&self) -> &[Nic] {
        &self.nics
    }

    pub fn block_devices(&self) -> &[BlockDevice] {
        &self.block_devices
    }

    pub fn source(&self) -> &TopologySource {
        &self.source
    }

    fn index_of(&self, id: NodeId) -> Option<usize> {
        self.nodes.iter().position(|node| node.id == id)
    }

    /// The kernel's distance from `from` to `to`; `None` when either is not online.
    pub fn distance(&self, from: NodeId, to: NodeId) -> Option<u32> {
        Some(self.distances[self.index_of(from)?][self.index_of(to)?])
    }

    /// Every online node ordered by distance from `from` (itself first); ties by node id.
    pub fn nodes_by_distance(&self, from: NodeId) -> Vec<NodeId> {
        let mut ids = self.node_ids();
        ids.sort_by_key(|&id| (self.distance(from, id).unwrap_or(u32::MAX), id));
        ids
    }

    /// The online node with the greatest distance from `from`; ties go to the lowest node id,
    /// so the choice is the same on every start. `None` on a one-node machine.
    pub fn farthest_from(&self, from: NodeId) -> Option<NodeId> {
        let from_index = self.index_of(from)?;
        self.nodes
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != from_index)
            .max_by_key(|&(i, node)| (self.distances[from_index][i], std::cmp::Reverse(node.id)))
            .map(|(_, node)| node.id)
    }

    /// The node of the interface that holds `addr`, if an interface holds it and its node is
    /// known. Wildcard and loopback addresses have no single interface: `None`.
    pub fn node_of_listen_addr(&self, addr: IpAddr) -> Option<(&Nic, NodeId)> {
        if addr.is_unspecified() || addr.is_loopback() {
            return None;
        }
        self.nics
            .iter()
            .find(|nic| nic.addrs.contains(&addr))
            .and_then(|nic| nic.node.map(|node| (nic, node)))
    }

    pub fn node_of_block_device(&self, name: &str) -> Option<NodeId> {
        self.block_devices
            .iter()
            .find(|dev| dev.name == name)
            .and_then(|dev| dev.node)
    }
}

/// The most CPUs a list may name (Linux's own limit is 8192; this is a sanity bound).
const MAX_CPUS: usize = 1 << 16;

/// Parses a kernel CPU list such as `0-3,8,10-11`.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|part| !part.is_empty()) {
        let bad = || format!("'{text}' is not a CPU list");
        match part.split_once('-') {
            Some((first, last)) => {
                let first: usize = first.trim().parse().map_err(|_| bad())?;
                let last: usize = last.trim().parse().map_err(|_| bad())?;
                if last < first || last >= MAX_CPUS {
                    return Err(bad());
                }
                cpus.extend(first..=last);
            }
            None => {
                let cpu: usize = part.trim().parse().map_err(|_| bad())?;
                if cpu >= MAX_CPUS {
                    return Err(bad());
                }
                cpus.push(cpu);
            }
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn four_nodes() -> Topology {
        Topology::synthetic(
            &[2, 2, 2, 2],
            vec![
                vec![10, 16, 21, 32],
                vec![16, 10, 32, 21],
                vec![21, 32, 10, 16],
                vec![32, 21, 16, 10],
            ],
            2 << 20,
        )
        .unwrap()
    }

    #[test]
    fn orders_nodes_by_distance_and_finds_the_farthest() {
        let topo = four_nodes();
        assert_eq!(topo.nodes_by_distance(0), vec![0, 1, 2, 3]);
        assert_eq!(topo.nodes_by_distance(3), vec![3, 2, 1, 0]);
        assert_eq!(topo.farthest_from(0), Some(3));
        assert_eq!(topo.farthest_from(1), Some(2));
        assert_eq!(topo.node(2).unwrap().cpus, vec![4, 5]);
    }

    #[test]
    fn farthest_ties_go_to_the_lowest_id() {
        let topo = Topology::synthetic(
            &[1, 1, 1],
            vec![vec![10, 20, 20], vec![20, 10, 20], vec![20, 20, 10]],
            2 << 20,
        )
        .unwrap();
        assert_eq!(topo.farthest_from(0), Some(1));
        assert_eq!(topo.farthest_from(1), Some(0));
    }

    #[test]
    fn one_node_has_no_farthest() {
        let topo = Topology::synthetic(&[4], vec![vec![10]], 2 << 20).unwrap();
        assert_eq!(topo.farthest_from(0), None);
        assert_eq!(topo.farthest_from(7), None);
    }

    #[test]
    fn rejects_inconsistent_matrices() {
        assert!(Topology::synthetic(&[1, 1], vec![vec![10, 20]], 2 << 20).is_err());
        assert!(Topology::synthetic(&[1, 1], vec![vec![10, 20], vec![20, 11]], 2 << 20).is_err());
        assert!(Topology::synthetic(&[1, 1], vec![vec![10, 10], vec![20, 10]], 2 << 20).is_err());
        assert!(Topology::synthetic(&[1], vec![vec![10]], 3000).is_err());
    }

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<usize>::new());
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("a").is_err());
    }
}
