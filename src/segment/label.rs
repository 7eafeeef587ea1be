//! The label Headroom writes into every file segment it formats: the segment's identity (a
//! random id, as a filesystem keeps its UUID), so that a warm restart finds its values wherever
//! the file now lies, and a mount at runtime can tell its own files from anyone else's (a
//! foreign file is refused and never written).
//!
//! The label is one device block: past the segment's extents (at byte `size`) in a file, so
//! extents keep their offsets from 0; in the last block of the bytes given (`size - 4096`) on a
//! block device, so nothing is written outside them. It holds a text header, the segment's
//! size, its id, when and by which pid it was written, and a CRC32C of everything before the
//! checksum line. Version 1 labels (builds before segment ids) carry no id: the mount gives
//! them one and writes the label again as version 2.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

/// Bytes the label takes (one device block).
pub const LABEL_BYTES: u64 = 4096;

const MAGIC_V1: &str = "headroom segment label v1\n";
const MAGIC: &str = "headroom segment label v2\n";

/// What a file's label says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// The segment's size in bytes (extents live in `[0, size)`).
    pub size: u64,
    /// The segment's identity, drawn when it was formatted; `None` in a version 1 label.
    pub id: Option<u128>,
    pub created_unix_seconds: u64,
    pub pid: u32,
}

/// A random segment id, never 0, from the kernel's generator.
pub fn random_id() -> io::Result<u128> {
    let mut urandom = File::open("/dev/urandom")?;
    loop {
        let mut bytes = [0u8; 16];
        urandom.read_exact(&mut bytes)?;
        let id = u128::from_le_bytes(bytes);
        if id != 0 {
            return Ok(id);
        }
    }
}

impl Label {
    /// A new segment's label, with a fresh id.
    pub fn new(size: u64) -> io::Result<Label> {
        Ok(Label {
            size,
            id: Some(random_id()?),
            created_unix_seconds: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            pid: std::process::id(),
        })
    }

    /// The label's block: text, zero-padded to [`LABEL_BYTES`]. A label without an id is
    /// written as version 1 (only tests write one: the mount gives every segment an id).
    pub fn encode(&self) -> Vec<u8> {
        let body = match self.id {
            Some(id) => format!(
                "{MAGIC}size {}\nid {id:032x}\ncreated {}\npid {}\n",
                self.size, self.created_unix_seconds, self.pid
            ),
            None => format!(
                "{MAGIC_V1}size {}\ncreated {}\npid {}\n",
                self.size, self.created_unix_seconds, self.pid
            ),
        };
        let mut block =
            format!("{body}crc32c {:08x}\n", crc32c::crc32c(body.as_bytes())).into_bytes();
        block.resize(LABEL_BYTES as usize, 0);
        block
    }

    /// Reads a label block of either version; `None` for anything that is not an intact label.
    pub fn decode(block: &[u8]) -> Option<Label> {
        let text = std::str::from_utf8(&block[..block.iter().position(|&b| b == 0)?]).ok()?;
        let (body, with_id) = match text.strip_prefix(MAGIC) {
            Some(body) => (body, true),
            None => (text.strip_prefix(MAGIC_V1)?, false),
        };
        let crc_at = text.rfind("crc32c ")?;
        let crc = u32::from_str_radix(text[crc_at + 7..].trim_end(), 16).ok()?;
        if crc32c::crc32c(&text.as_bytes()[..crc_at]) != crc {
            return None;
        }
        let mut label = Label {
            size: 0,
            id: None,
            created_unix_seconds: 0,
            pid: 0,
        };
        let magic_len = text.len() - body.len();
        for line in body[..crc_at - magic_len].lines() {
            let (name, value) = line.split_once(' ')?;
            match name {
                "size" => label.size = value.parse().ok()?,
                "id" if with_id => label.id = Some(u128::from_str_radix(value, 16).ok()?),
                "created" => label.created_unix_seconds = value.parse().ok()?,
                "pid" => label.pid = value.parse().ok()?,
                _ => return None,
            }
        }
        let id_ok = label.id.is_some_and(|id| id != 0) == with_id;
        (label.size > 0 && id_ok).then_some(label)
    }

    /// The label of a segment of `size` bytes in `file`, read at `at` (`None` when the file is
    /// shorter or the block is not a label of that size).
    pub fn read(file: &File, size: u64, at: u64) -> io::Result<Option<Label>> {
        if file.metadata()?.len() < at + LABEL_BYTES && !is_block_device(file)? {
            return Ok(None);
        }
        let mut block = vec![0u8; LABEL_BYTES as usize];
        file.read_exact_at(&mut block, at)?;
        Ok(Label::decode(&block).filter(|label| label.size == size))
    }

    /// Whether some label sits where a segment file of another size would have put it (a file
    /// of ours mounted with a different size): that label.
    pub fn find_any(file: &File) -> io::Result<Option<Label>> {
        let len = file.metadata()?.len();
        // Written last, so a labelled file of ours ends with it (or with its sparse tail).
        if len < LABEL_BYTES {
            return Ok(None);
        }
        let at = (len - LABEL_BYTES) / LABEL_BYTES * LABEL_BYTES;
        let mut block = vec![0u8; LABEL_BYTES as usize];
        file.read_exact_at(&mut block, at)?;
        Ok(Label::decode(&block).filter(|label| label.size == at))
    }

    /// Writes the label at `at` and makes it durable.
    pub fn write(&self, file: &File, at: u64) -> io::Result<()> {
        file.write_all_at(&self.encode(), at)?;
        file.sync_all()
    }
}

fn is_block_device(file: &File) -> io::Result<bool> {
    use std::os::unix::fs::FileTypeExt;
    Ok(file.metadata()?.file_type().is_block_device())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_round_trips_and_damage_is_refused() {
        let label = Label {
            size: 1 << 30,
            id: Some(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
            created_unix_seconds: 1_800_000_000,
            pid: 4242,
        };
        let block = label.encode();
        assert_eq!(block.len(), LABEL_BYTES as usize);
        assert_eq!(Label::decode(&block), Some(label));
        for at in [0, 30, 40, 60, 80] {
            let mut bad = block.clone();
            bad[at] ^= 1;
            assert_eq!(Label::decode(&bad), None, "a flipped byte at {at}");
        }
        assert_eq!(Label::decode(&[0u8; 4096]), None);
        assert_eq!(Label::decode(&[b'x'; 4096]), None, "no terminator");
    }

    /// A version 1 label (written before segments had ids) still reads, with no id.
    #[test]
    fn a_version_1_label_reads_without_an_id() {
        let body = "headroom segment label v1\nsize 1048576\ncreated 1800000000\npid 7\n";
        let mut block =
            format!("{body}crc32c {:08x}\n", crc32c::crc32c(body.as_bytes())).into_bytes();
        block.resize(LABEL_BYTES as usize, 0);
        let label = Label::decode(&block).expect("a version 1 label");
        assert_eq!((label.size, label.id, label.pid), (1 << 20, None, 7));
        assert_eq!(label.encode(), block, "written back as it was");
    }

    #[test]
    fn new_labels_draw_distinct_ids() {
        let (a, b) = (Label::new(4096).unwrap(), Label::new(4096).unwrap());
        assert!(a.id.is_some() && b.id.is_some() && a.id != b.id);
        assert_eq!(Label::decode(&a.encode()), Some(a));
    }
}
