//! Synthetic topology files (`HEADROOM_TOPOLOGY`), described in `docs/topology.md`.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{
    parse_cpu_list, platform_huge_page_bytes, BlockDevice, Nic, Node, NodeId, Topology,
    TopologySource,
};
use crate::units::ByteSize;

#[derive(Debug)]
pub struct TopologyFileError {
    pub path: PathBuf,
    pub reason: String,
}

impl fmt::Display for TopologyFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "topology file {}: {}", self.path.display(), self.reason)
    }
}

impl std::error::Error for TopologyFileError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTopology {
    huge_page: Option<ByteSize>,
    huge_pages_free_total: Option<u64>,
    node: Vec<FileNode>,
    #[serde(default)]
    nic: Vec<FileNic>,
    #[serde(default)]
    block_device: Vec<FileBlockDevice>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNode {
    id: NodeId,
    cpus: String,
    distances: Vec<u32>,
    huge_pages_free: Option<u64>,
    mem_free: Option<ByteSize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNic {
    name: String,
    node: Option<NodeId>,
    #[serde(default)]
    addrs: Vec<IpAddr>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileBlockDevice {
    name: String,
    node: Option<NodeId>,
    logical_block: Option<ByteSize>,
}

pub(super) fn read(path: &Path) -> Result<Topology, TopologyFileError> {
    let fail = |reason: String| TopologyFileError {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|err| fail(err.to_string()))?;
    parse(&text, TopologySource::File(path.to_path_buf())).map_err(fail)
}

/// Parses the text of a topology file.
pub(super) fn parse(text: &str, source: TopologySource) -> Result<Topology, String> {
    let file: FileTopology = toml::from_str(text).map_err(|err| err.to_string())?;
    let mut nodes = Vec::with_capacity(file.node.len());
    let mut distances = Vec::with_capacity(file.node.len());
    for node in file.node {
        nodes.push(Node {
            id: node.id,
            cpus: parse_cpu_list(&node.cpus)?,
            huge_pages_free: Some(node.huge_pages_free.unwrap_or(0)),
            mem_free_bytes: node.mem_free.map(|size| size.0),
        });
        distances.push(node.distances);
    }
    let huge_pages_free_total = file
        .huge_pages_free_total
        .or_else(|| Some(nodes.iter().filter_map(|n| n.huge_pages_free).sum()));
    let nics = file
        .nic
        .into_iter()
        .map(|nic| Nic {
            name: nic.name,
            node: nic.node,
            addrs: nic.addrs,
        })
        .collect();
    let block_devices = file
        .block_device
        .into_iter()
        .map(|dev| BlockDevice {
            name: dev.name,
            node: dev.node,
            logical_block_bytes: dev.logical_block.map(|size| size.0),
        })
        .collect();
    Topology::new(
        nodes,
        distances,
        file.huge_page
            .map_or(platform_huge_page_bytes(), |size| size.0),
        huge_pages_free_total,
        nics,
        block_devices,
        source,
    )
    .map_err(|err| err.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let text = include_str!("../../config/topology-2node.toml");
        let topo = parse(text, TopologySource::Synthetic).unwrap();
        assert_eq!(topo.node_ids(), vec![0, 1]);
        assert_eq!(topo.distance(1, 0), Some(21));
        assert_eq!(
            topo.node_of_listen_addr("10.0.1.5".parse().unwrap())
                .map(|(_, n)| n),
            Some(1)
        );
        assert_eq!(topo.node_of_block_device("nvme0n1"), Some(1));
    }

    #[test]
    fn unknown_fields_and_bad_nodes_are_errors() {
        let bad_field = "[[node]]\nid = 0\ncpus = \"0\"\ndistances = [10]\nspeed = 3\n";
        assert!(parse(bad_field, TopologySource::Synthetic)
            .unwrap_err()
            .contains("speed"));
        let bad_nic =
            "[[node]]\nid = 0\ncpus = \"0\"\ndistances = [10]\n[[nic]]\nname = \"e\"\nnode = 4\n";
        assert!(parse(bad_nic, TopologySource::Synthetic).is_err());
    }
}
