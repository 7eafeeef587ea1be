//! `--segment` specifications: `file:PATH,size=64G[,numa=N|auto]` and
//! `mem:size=8G,numa=0[+1...]`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::topology::NodeId;
use crate::units::ByteSize;

/// Where a file segment's node comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileLocality {
    /// Not given: unknown.
    Unknown,
    Node(NodeId),
    /// Read from sysfs: the node of the block device holding the file.
    Auto,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SegmentSpec {
    File {
        path: PathBuf,
        size: u64,
        locality: FileLocality,
    },
    /// Anonymous memory; with several nodes, one target per node, `size` split evenly.
    Mem { size: u64, nodes: Vec<NodeId> },
}

/// Segment sizes are whole device blocks (per node, for memory).
pub const SEGMENT_GRANULE_BYTES: u64 = 4096;
/// The largest segment: 1 EiB, so a file's size and label stay far inside the kernel's file
/// offsets (63 bits) and no sum of sizes can wrap.
pub const SEGMENT_MAX_BYTES: u64 = 1 << 60;

impl SegmentSpec {
    pub fn size(&self) -> u64 {
        match self {
            SegmentSpec::File { size, .. } | SegmentSpec::Mem { size, .. } => *size,
        }
    }

    /// Whether the size is a nonzero whole multiple of 4 KiB (of 4 KiB per node, for memory)
    /// of at most 1 EiB; checked before anything is created.
    pub fn check_size(&self) -> Result<(), String> {
        let parts = match self {
            SegmentSpec::Mem { nodes, .. } => nodes.len().max(1) as u64,
            SegmentSpec::File { .. } => 1,
        };
        let size = self.size();
        if size == 0 || size % (SEGMENT_GRANULE_BYTES * parts) != 0 || size > SEGMENT_MAX_BYTES {
            return Err(format!(
                "size {size} bytes is not a nonzero whole multiple of 4 KiB (and, for memory, of 4 KiB per node) of at most 1 EiB"
            ));
        }
        Ok(())
    }
}

impl fmt::Display for SegmentSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SegmentSpec::File {
                path,
                size,
                locality,
            } => {
                write!(f, "file:{},size={}", path.display(), ByteSize(*size))?;
                match locality {
                    FileLocality::Unknown => Ok(()),
                    FileLocality::Node(n) => write!(f, ",numa={n}"),
                    FileLocality::Auto => write!(f, ",numa=auto"),
                }
            }
            SegmentSpec::Mem { size, nodes } => {
                let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
                write!(f, "mem:size={},numa={}", ByteSize(*size), nodes.join("+"))
            }
        }
    }
}

impl FromStr for SegmentSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            format!("'{text}': {why} (expected file:PATH,size=SIZE[,numa=N|auto] or mem:size=SIZE,numa=N[+N...])")
        };
        let (kind, rest) = text.split_once(':').ok_or_else(|| bad("no kind"))?;
        let mut parts = rest.split(',');
        match kind {
            "file" => {
                let path = parts
                    .next()
                    .filter(|p| !p.is_empty())
                    .ok_or_else(|| bad("no path"))?;
                let (mut size, mut locality) = (None, FileLocality::Unknown);
                for part in parts {
                    match part.split_once('=') {
                        Some(("size", v)) => {
                            size = Some(v.parse::<ByteSize>().map_err(|e| bad(&e.0))?.0)
                        }
                        Some(("numa", "auto")) => locality = FileLocality::Auto,
                        Some(("numa", v)) => {
                            locality = FileLocality::Node(
                                v.parse()
                                    .map_err(|_| bad("numa is a node number or auto"))?,
                            )
                        }
                        _ => return Err(bad(&format!("unknown option '{part}'"))),
                    }
                }
                let size = size.ok_or_else(|| bad("size= is required"))?;
                Ok(SegmentSpec::File {
                    path: PathBuf::from(path),
                    size,
                    locality,
                })
            }
            "mem" => {
                let (mut size, mut nodes) = (None, None);
                for part in parts {
                    match part.split_once('=') {
                        Some(("size", v)) => {
                            size = Some(v.parse::<ByteSize>().map_err(|e| bad(&e.0))?.0)
                        }
                        Some(("numa", v)) => {
                            let list: Result<Vec<NodeId>, _> =
                                v.split('+').map(str::parse).collect();
                            nodes = Some(list.map_err(|_| bad("numa is N or N+M+..."))?);
                        }
                        _ => return Err(bad(&format!("unknown option '{part}'"))),
                    }
                }
                let size = size.ok_or_else(|| bad("size= is required"))?;
                let mut nodes =
                    nodes.ok_or_else(|| bad("numa= is required for memory segments"))?;
                nodes.sort_unstable();
                nodes.dedup();
                Ok(SegmentSpec::Mem { size, nodes })
            }
            _ => Err(bad(&format!("unknown kind '{kind}'"))),
        }
    }
}

impl<'de> serde::Deserialize<'de> for SegmentSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_kinds_and_round_trips() {
        let cases = [
            "file:/data/seg0,size=64 GiB",
            "file:./data/a,size=1 GiB,numa=1",
            "file:/dev/nvme0n1,size=2 GiB,numa=auto",
            "mem:size=8 GiB,numa=0",
            "mem:size=8 GiB,numa=0+1",
        ];
        for text in cases {
            let spec: SegmentSpec = text.parse().unwrap();
            assert_eq!(spec.to_string(), text);
        }
        assert_eq!(
            "mem:size=2G,numa=1+0+1".parse::<SegmentSpec>().unwrap(),
            SegmentSpec::Mem {
                size: 2 << 30,
                nodes: vec![0, 1]
            }
        );
    }

    #[test]
    fn rejects_what_is_not_a_segment() {
        for text in [
            "",
            "disk:/x,size=1G",
            "file:,size=1G",
            "file:/x",
            "file:/x,size=1G,color=red",
            "mem:size=1G",
            "mem:numa=0",
            "mem:size=1G,numa=a",
        ] {
            assert!(text.parse::<SegmentSpec>().is_err(), "{text}");
        }
    }
}
