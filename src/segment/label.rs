//! The label Headroom writes into every file segment it creates, so that a mount at runtime
//! can tell its own files from anyone else's: a foreign file is refused and never written.
//!
//! The label is one device block just past the segment's extents (at byte `size`), so extents
//! keep their offsets from 0: a text header, the segment's size, when and by which pid it was
//! written, and a CRC32C of everything before the checksum line. Blocks past it are unused.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Bytes the label takes past the segment's extents (one device block).
pub const LABEL_BYTES: u64 = 4096;

const MAGIC: &str = "headroom segment label v1\n";

/// What a file's label says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// The segment's size in bytes (extents live in `[0, size)`).
    pub size: u64,
    pub created_unix_seconds: u64,
    pub pid: u32,
}

impl Label {
    pub fn new(size: u64) -> Label {
        Label {
            size,
            created_unix_seconds: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            pid: std::process::id(),
        }
    }

    /// The label's block: text, zero-padded to [`LABEL_BYTES`].
    pub fn encode(&self) -> Vec<u8> {
        let body = format!(
            "{MAGIC}size {}\ncreated {}\npid {}\n",
            self.size, self.created_unix_seconds, self.pid
        );
        let mut block =
            format!("{body}crc32c {:08x}\n", crc32c::crc32c(body.as_bytes())).into_bytes();
        block.resize(LABEL_BYTES as usize, 0);
        block
    }

    /// Reads a label block; `None` for anything that is not an intact label.
    pub fn decode(block: &[u8]) -> Option<Label> {
        let text = std::str::from_utf8(&block[..block.iter().position(|&b| b == 0)?]).ok()?;
        let body = text.strip_prefix(MAGIC)?;
        let crc_at = text.rfind("crc32c ")?;
        let crc = u32::from_str_radix(text[crc_at + 7..].trim_end(), 16).ok()?;
        if crc32c::crc32c(&text.as_bytes()[..crc_at]) != crc {
            return None;
        }
        let mut label = Label {
            size: 0,
            created_unix_seconds: 0,
            pid: 0,
        };
        for line in body[..crc_at - MAGIC.len()].lines() {
            let (name, value) = line.split_once(' ')?;
            match name {
                "size" => label.size = value.parse().ok()?,
                "created" => label.created_unix_seconds = value.parse().ok()?,
                "pid" => label.pid = value.parse().ok()?,
                _ => return None,
            }
        }
        (label.size > 0).then_some(label)
    }

    /// The label of the segment file `file` if its size is `size` (read where that size puts
    /// it; `None` when the file is shorter or the block is not a label).
    pub fn read(file: &File, size: u64) -> io::Result<Option<Label>> {
        if file.metadata()?.len() < size + LABEL_BYTES {
            return Ok(None);
        }
        let mut block = vec![0u8; LABEL_BYTES as usize];
        file.read_exact_at(&mut block, size)?;
        Ok(Label::decode(&block).filter(|label| label.size == size))
    }

    /// Whether some label sits anywhere a segment of another size would have put it (a file of
    /// ours mounted with a different size): the size it was created with.
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

    /// Writes the label at its place and makes it durable.
    pub fn write(&self, file: &File) -> io::Result<()> {
        file.write_all_at(&self.encode(), self.size)?;
        file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_round_trips_and_damage_is_refused() {
        let label = Label {
            size: 1 << 30,
            created_unix_seconds: 1_800_000_000,
            pid: 4242,
        };
        let block = label.encode();
        assert_eq!(block.len(), LABEL_BYTES as usize);
        assert_eq!(Label::decode(&block), Some(label));
        for at in [0, 30, 40, 60] {
            let mut bad = block.clone();
            bad[at] ^= 1;
            assert_eq!(Label::decode(&bad), None, "a flipped byte at {at}");
        }
        assert_eq!(Label::decode(&[0u8; 4096]), None);
        assert_eq!(Label::decode(&[b'x'; 4096]), None, "no terminator");
    }
}
