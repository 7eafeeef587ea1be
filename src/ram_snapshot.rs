//! The file format of the RAM items a graceful stop writes for the next start (warm restart of
//! values held in RAM; the large values in segments have `snapshot.rs`).
//!
//! A part is a header and a run of chunks, each about [`CHUNK_BYTES_TARGET`] of whole items
//! with its own CRC32C, so a damaged or truncated part loses the chunks it damaged and no more,
//! and never yields a wrong byte: a chunk whose checksum fails is dropped whole, and reading
//! resumes at the next chunk's magic that checks.
//!
//! ```text
//! part:  magic "HRRAM\0\0\0" | version u32 | chunk*
//! chunk: magic "HRCK" | sequence u32 | item count u32 | body length u32 | body
//!        | CRC32C of sequence, count, length and body u32
//! item:  key length u8 | flags u32 | expiry u32 (Unix seconds, 0 never) | cas u64
//!        | value length u32 | key | value
//! ```
//! All integers little-endian.

use std::fmt;

pub const MAGIC: &[u8; 8] = b"HRRAM\0\0\0";
/// The version this build writes (and reads).
pub const VERSION: u32 = 1;
const CHUNK_MAGIC: &[u8; 4] = b"HRCK";
/// A chunk is sealed once its body reaches this many bytes (an item is never split, so a
/// chunk holds at least one item and can be longer by one item).
pub const CHUNK_BYTES_TARGET: usize = 1 << 20;
/// Magic, sequence, count, length.
const CHUNK_HEADER_BYTES: usize = 16;
/// Key length, flags, expiry, cas, value length.
const ITEM_HEADER_BYTES: usize = 1 + 4 + 4 + 8 + 4;

/// One item as a part holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RamItem {
    pub key: Vec<u8>,
    pub flags: u32,
    /// Absolute Unix seconds, 0 never.
    pub expiry: u32,
    pub cas: u64,
    pub value: Vec<u8>,
}

/// The part's header: what a part starts with.
pub fn header() -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&VERSION.to_le_bytes());
    out
}

/// Builds chunks from items pushed one at a time.
#[derive(Debug, Default)]
pub struct ChunkEncoder {
    body: Vec<u8>,
    count: u32,
    sequence: u32,
}

impl ChunkEncoder {
    /// Adds an item whose value is the concatenation of `value` (a fixed slot's value may
    /// wrap: two parts); returns a sealed chunk when the body reached its target. Keys are at
    /// most 250 bytes and RAM values far below 4 GiB, so every length fits its field.
    pub fn push(
        &mut self,
        key: &[u8],
        flags: u32,
        expiry: u32,
        cas: u64,
        value: &[&[u8]],
    ) -> Option<Vec<u8>> {
        let key_len = u8::try_from(key.len()).expect("keys are at most 250 bytes");
        let value_len = value.iter().map(|part| part.len()).sum::<usize>();
        let value_len = u32::try_from(value_len).expect("RAM values are below 4 GiB");
        self.body.push(key_len);
        self.body.extend_from_slice(&flags.to_le_bytes());
        self.body.extend_from_slice(&expiry.to_le_bytes());
        self.body.extend_from_slice(&cas.to_le_bytes());
        self.body.extend_from_slice(&value_len.to_le_bytes());
        self.body.extend_from_slice(key);
        value
            .iter()
            .for_each(|part| self.body.extend_from_slice(part));
        self.count += 1;
        (self.body.len() >= CHUNK_BYTES_TARGET).then(|| self.seal())
    }

    /// The last chunk, if any item is left in it.
    pub fn finish(mut self) -> Option<Vec<u8>> {
        (self.count > 0).then(|| self.seal())
    }

    fn seal(&mut self) -> Vec<u8> {
        let body = std::mem::take(&mut self.body);
        let mut chunk = Vec::with_capacity(CHUNK_HEADER_BYTES + body.len() + 4);
        chunk.extend_from_slice(CHUNK_MAGIC);
        chunk.extend_from_slice(&self.sequence.to_le_bytes());
        chunk.extend_from_slice(&self.count.to_le_bytes());
        chunk.extend_from_slice(&(body.len() as u32).to_le_bytes());
        chunk.extend_from_slice(&body);
        let crc = crc32c::crc32c(&chunk[CHUNK_MAGIC.len()..]);
        chunk.extend_from_slice(&crc.to_le_bytes());
        self.sequence += 1;
        self.count = 0;
        self.body = Vec::with_capacity(body.capacity());
        chunk
    }
}

/// Why a part was not read at all.
#[derive(Debug, PartialEq, Eq)]
pub enum PartError {
    NotAPart,
    Version(u32),
}

impl fmt::Display for PartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartError::NotAPart => write!(f, "not a RAM snapshot part (no magic)"),
            PartError::Version(v) => write!(
                f,
                "a RAM snapshot part of version {v}; this build reads up to {VERSION}"
            ),
        }
    }
}

/// What reading a part found: the items of every chunk that checked, and what was dropped.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    pub items: Vec<RamItem>,
    pub chunks_read: u64,
    /// Stretches of bytes skipped because they held no chunk that checks (damage, or a
    /// truncated last chunk).
    pub damaged_stretches: u64,
    pub damaged_bytes: u64,
}

/// Reads a whole part.
pub fn decode(part: &[u8]) -> Result<Decoded, PartError> {
    if part.len() < MAGIC.len() + 4 || &part[..MAGIC.len()] != MAGIC {
        return Err(PartError::NotAPart);
    }
    let version = u32::from_le_bytes(part[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(PartError::Version(version));
    }
    let mut decoded = Decoded::default();
    let mut at = 12;
    let mut damaged_from: Option<usize> = None;
    while at < part.len() {
        match chunk_at(part, at) {
            Some((items, next)) => {
                if let Some(from) = damaged_from.take() {
                    decoded.damaged_stretches += 1;
                    decoded.damaged_bytes += (at - from) as u64;
                }
                decoded.items.extend(items);
                decoded.chunks_read += 1;
                at = next;
            }
            None => {
                damaged_from.get_or_insert(at);
                // Resynchronise at the next chunk magic.
                at = memchr::memmem::find(&part[at + 1..], CHUNK_MAGIC)
                    .map_or(part.len(), |i| at + 1 + i);
            }
        }
    }
    if let Some(from) = damaged_from {
        decoded.damaged_stretches += 1;
        decoded.damaged_bytes += (part.len() - from) as u64;
    }
    Ok(decoded)
}

/// The items of the chunk that starts at `at`, and where the next one starts; `None` when no
/// whole chunk that checks starts there.
fn chunk_at(part: &[u8], at: usize) -> Option<(Vec<RamItem>, usize)> {
    let header = part.get(at..at + CHUNK_HEADER_BYTES)?;
    if &header[..4] != CHUNK_MAGIC {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4 bytes"));
    let (count, body_len) = (word(8), word(12) as usize);
    let end = at.checked_add(CHUNK_HEADER_BYTES + body_len)?;
    let crc_bytes = part.get(end..end + 4)?;
    let crc = u32::from_le_bytes(crc_bytes.try_into().expect("4 bytes"));
    if crc32c::crc32c(&part[at + 4..end]) != crc {
        return None;
    }
    let items = parse_items(&part[at + CHUNK_HEADER_BYTES..end], count)?;
    Some((items, end + 4))
}

/// A chunk's body: exactly `count` items filling it. The checksum held, so a body that does
/// not parse was written wrong; it is dropped all the same.
fn parse_items(mut body: &[u8], count: u32) -> Option<Vec<RamItem>> {
    let mut items = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let header = body.get(..ITEM_HEADER_BYTES)?;
        let key_len = header[0] as usize;
        let u32_at = |i: usize| u32::from_le_bytes(header[i..i + 4].try_into().expect("4"));
        let flags = u32_at(1);
        let expiry = u32_at(5);
        let cas = u64::from_le_bytes(header[9..17].try_into().expect("8 bytes"));
        let value_len = u32_at(17) as usize;
        let rest = &body[ITEM_HEADER_BYTES..];
        let key = rest.get(..key_len)?.to_vec();
        let value = rest.get(key_len..key_len + value_len)?.to_vec();
        items.push(RamItem {
            key,
            flags,
            expiry,
            cas,
            value,
        });
        body = &rest[key_len + value_len..];
    }
    body.is_empty().then_some(items)
}
