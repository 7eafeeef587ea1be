//! Reading the topology from sysfs (and interface addresses from the kernel).

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use super::{
    parse_cpu_list, platform_huge_page_bytes, BlockDevice, Nic, Node, NodeId, Topology,
    TopologyError, TopologySource, LOCAL_DISTANCE,
};

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|text| text.trim().to_string())
}

fn sysfs_error(path: &Path, reason: impl Into<String>) -> TopologyError {
    TopologyError::Sysfs {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// `/sys/kernel/mm/hugepages/hugepages-2048kB` style directory name for a page size.
fn huge_page_dir_name(page_bytes: u64) -> String {
    format!("hugepages-{}kB", page_bytes / 1024)
}

/// The platform's huge page size when the kernel offers it, else the smallest size offered,
/// else the platform size (a kernel without hugetlb: every mapping will fall back).
fn huge_page_bytes(root: &Path) -> u64 {
    let platform = platform_huge_page_bytes();
    let dir = root.join("kernel/mm/hugepages");
    let Ok(entries) = fs::read_dir(&dir) else {
        return platform;
    };
    let mut offered: Vec<u64> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let kib: u64 = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            Some(kib * 1024)
        })
        .collect();
    offered.sort_unstable();
    if offered.contains(&platform) {
        platform
    } else {
        offered.first().copied().unwrap_or(platform)
    }
}

/// Memory a node can give a new mapping, from its meminfo: free pages plus the page cache
/// and slab the kernel can reclaim (clean file pages, `SReclaimable`). Counting only
/// `MemFree` would refuse a budget on any machine whose idle memory sits in the page cache.
/// Falls back to `MemFree` alone when the other lines are missing.
fn node_mem_free_bytes(meminfo: &str) -> Option<u64> {
    let field = |name: &str| -> Option<u64> {
        meminfo.lines().find_map(|line| {
            let rest = line.split_once(name)?.1.trim();
            let kib: u64 = rest.strip_suffix("kB")?.trim().parse().ok()?;
            Some(kib * 1024)
        })
    };
    let free = field("MemFree:")?;
    let reclaimable = field("Active(file):").unwrap_or(0)
        + field("Inactive(file):").unwrap_or(0)
        + field("SReclaimable:").unwrap_or(0);
    let unreclaimable_now = field("Dirty:").unwrap_or(0) + field("Writeback:").unwrap_or(0);
    Some(free + reclaimable.saturating_sub(unreclaimable_now))
}

/// A device's NUMA node: the first `numa_node` file found walking up from the device
/// directory (virtio and NVMe namespaces keep it on a parent). `-1` means unknown.
fn device_node(device_dir: &Path) -> Option<NodeId> {
    let mut dir = fs::canonicalize(device_dir).ok()?;
    for _ in 0..4 {
        if let Some(text) = read_trimmed(&dir.join("numa_node")) {
            return text
                .parse::<i64>()
                .ok()
                .filter(|&n| n >= 0)
                .map(|n| n as NodeId);
        }
        if !dir.pop() {
            break;
        }
    }
    None
}

fn interface_addrs() -> Vec<(String, IpAddr)> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    addrs
        .filter_map(|ifaddr| {
            let storage = ifaddr.address?;
            let ip = if let Some(v4) = storage.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else {
                IpAddr::V6(storage.as_sockaddr_in6()?.ip())
            };
            Some((ifaddr.interface_name, ip))
        })
        .collect()
}

fn read_nics(root: &Path) -> Vec<Nic> {
    let addrs = if root == Path::new("/sys") {
        interface_addrs()
    } else {
        Vec::new()
    };
    let Ok(entries) = fs::read_dir(root.join("class/net")) else {
        return Vec::new();
    };
    let mut nics: Vec<Nic> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let node = device_node(&entry.path().join("device"));
            let addrs = addrs
                .iter()
                .filter(|(iface, _)| *iface == name)
                .map(|(_, ip)| *ip)
                .collect();
            Some(Nic { name, node, addrs })
        })
        .collect();
    nics.sort_by(|a, b| a.name.cmp(&b.name));
    nics
}

fn read_block_devices(root: &Path) -> Vec<BlockDevice> {
    let Ok(entries) = fs::read_dir(root.join("block")) else {
        return Vec::new();
    };
    let mut devices: Vec<BlockDevice> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name().into_string().ok()?;
            let path = entry.path();
            Some(BlockDevice {
                node: device_node(&path.join("device")),
                logical_block_bytes: read_trimmed(&path.join("queue/logical_block_size"))
                    .and_then(|text| text.parse().ok()),
                name,
            })
        })
        .collect();
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    devices
}

pub(super) fn read(root: &Path) -> Result<Topology, TopologyError> {
    let huge_page_bytes = huge_page_bytes(root);
    let huge_dir = huge_page_dir_name(huge_page_bytes);
    let node_root = root.join("devices/system/node");
    let online_path = node_root.join("online");
    let (nodes, distances) = match read_trimmed(&online_path) {
        Some(online) => {
            let ids =
                parse_cpu_list(&online).map_err(|reason| sysfs_error(&online_path, reason))?;
            let mut nodes = Vec::with_capacity(ids.len());
            let mut distances = Vec::with_capacity(ids.len());
            for &id in &ids {
                let dir = node_root.join(format!("node{id}"));
                let cpus_path = dir.join("cpulist");
                let cpus = parse_cpu_list(&read_trimmed(&cpus_path).unwrap_or_default())
                    .map_err(|reason| sysfs_error(&cpus_path, reason))?;
                let distance_path = dir.join("distance");
                let row: Vec<u32> = read_trimmed(&distance_path)
                    .ok_or_else(|| sysfs_error(&distance_path, "missing"))?
                    .split_whitespace()
                    .map(|word| {
                        word.parse()
                            .map_err(|_| sysfs_error(&distance_path, "not numbers"))
                    })
                    .collect::<Result<_, _>>()?;
                // The row covers every possible node up to the highest online one: keep the
                // columns of online nodes only.
                let row: Vec<u32> = ids
                    .iter()
                    .map(|&to| row.get(to).copied())
                    .collect::<Option<_>>()
                    .ok_or_else(|| sysfs_error(&distance_path, "shorter than the node list"))?;
                distances.push(row);
                nodes.push(Node {
                    id: id as NodeId,
                    cpus,
                    huge_pages_free: read_trimmed(
                        &dir.join("hugepages").join(&huge_dir).join("free_hugepages"),
                    )
                    .and_then(|text| text.parse().ok()),
                    mem_free_bytes: fs::read_to_string(dir.join("meminfo"))
                        .ok()
                        .and_then(|text| node_mem_free_bytes(&text)),
                });
            }
            (nodes, distances)
        }
        None => {
            // A kernel built without NUMA: one node 0 holding every online CPU.
            let cpu_path = root.join("devices/system/cpu/online");
            let cpus = parse_cpu_list(&read_trimmed(&cpu_path).unwrap_or_default())
                .map_err(|reason| sysfs_error(&cpu_path, reason))?;
            let node = Node {
                id: 0,
                cpus,
                huge_pages_free: None,
                mem_free_bytes: None,
            };
            (vec![node], vec![vec![LOCAL_DISTANCE]])
        }
    };
    let huge_pages_free_total = read_trimmed(
        &root
            .join("kernel/mm/hugepages")
            .join(&huge_dir)
            .join("free_hugepages"),
    )
    .and_then(|text| text.parse().ok());
    Topology::new(
        nodes,
        distances,
        huge_page_bytes,
        huge_pages_free_total,
        read_nics(root),
        read_block_devices(root),
        TopologySource::Sysfs(PathBuf::from(root)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn reads_a_two_node_sysfs_tree() {
        let root = std::env::temp_dir().join(format!("headroom-sysfs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        write(&root, "devices/system/node/online", "0-1\n");
        write(&root, "devices/system/node/node0/cpulist", "0-1\n");
        write(&root, "devices/system/node/node1/cpulist", "2-3\n");
        write(&root, "devices/system/node/node0/distance", "10 21\n");
        write(&root, "devices/system/node/node1/distance", "21 10\n");
        write(
            &root,
            "devices/system/node/node1/hugepages/hugepages-2048kB/free_hugepages",
            "8\n",
        );
        write(
            &root,
            "devices/system/node/node0/meminfo",
            "Node 0 MemTotal:  1000 kB\nNode 0 MemFree:   512 kB\n",
        );
        write(
            &root,
            "kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
            "8\n",
        );
        write(
            &root,
            "kernel/mm/hugepages/hugepages-1048576kB/free_hugepages",
            "0\n",
        );
        write(&root, "pci0/numa_node", "1\n");
        write(&root, "pci0/nvme/queue_marker", "");
        fs::create_dir_all(root.join("block/nvme0n1/queue")).unwrap();
        write(&root, "block/nvme0n1/queue/logical_block_size", "512\n");
        std::os::unix::fs::symlink(root.join("pci0/nvme"), root.join("block/nvme0n1/device"))
            .unwrap();

        let topo = Topology::from_sysfs(&root).unwrap();
        assert_eq!(topo.node_ids(), vec![0, 1]);
        assert_eq!(topo.node(1).unwrap().cpus, vec![2, 3]);
        assert_eq!(topo.distance(0, 1), Some(21));
        assert_eq!(topo.huge_page_bytes(), 2 << 20);
        assert_eq!(topo.node(1).unwrap().huge_pages_free, Some(8));
        assert_eq!(topo.node(0).unwrap().huge_pages_free, None);
        assert_eq!(topo.node(0).unwrap().mem_free_bytes, Some(512 * 1024));
        assert_eq!(
            node_mem_free_bytes(
                "Node 0 MemFree: 100 kB\nNode 0 Active(file): 40 kB\nNode 0 Inactive(file): 60 kB\n\
                 Node 0 Dirty: 30 kB\nNode 0 Writeback: 10 kB\nNode 0 SReclaimable: 20 kB\n"
            ),
            Some((100 + 40 + 60 + 20 - 30 - 10) * 1024),
            "free plus clean page cache and reclaimable slab"
        );
        assert_eq!(topo.huge_pages_free_total(), Some(8));
        assert_eq!(topo.node_of_block_device("nvme0n1"), Some(1));
        assert_eq!(topo.block_devices()[0].logical_block_bytes, Some(512));
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn this_machine_reads() {
        let topo = Topology::from_sysfs(Path::new("/sys")).unwrap();
        assert!(topo.online_count() >= 1);
        assert!(!topo.all_cpus().is_empty());
    }
}
