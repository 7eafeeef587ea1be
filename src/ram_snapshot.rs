//! The file format of the RAM items a graceful stop writes for the next start (warm restart of
//! values held in RAM; the large values in segments have `snapshot.rs`).
//!
//! A part is a header block, a run of chunks, an index and a trailer. Everything starts on an
//! [`ALIGN_BYTES`] boundary, so the bulk moves in big O_DIRECT reads and writes. A chunk holds
//! whole items of one partition (about [`CHUNK_BYTES_TARGET`] of them) with a CRC32C of its
//! header and one of its body: a damaged or truncated part loses the chunks it damaged and no
//! more, and never yields a wrong byte. The index says where each chunk is and which partition
//! it holds, so a shard reads only the chunks of the partitions it looks after; a part whose
//! index is lost (a truncated one) is read by walking the chunk headers instead.
//!
//! ```text
//! header block: magic "HRRAM\0\0\0" | version u32 | partitions u32 | key hash seed u64
//!               | CRC32C of the 24 bytes before u32 | zeros to ALIGN_BYTES
//! chunk:        magic "HRCK" | partition u32 | hot u32 (1: every item referenced, 0: none)
//!               | item count u32 | body length u32 | body CRC32C u32
//!               | CRC32C of the 24 bytes before u32 | body | zeros to ALIGN_BYTES
//! item:         key length u8 | flags u32 | expiry u32 (Unix seconds, 0 never) | cas u64
//!               | recency u8 (0x01 referenced, 0x02 fetched) | last access u32 (Unix seconds)
//!               | value length u32 | key | value
//! index:        per chunk: offset u64 | partition u32 | hot u32 | item count u32
//!               | body length u32
//!               | zeros to ALIGN_BYTES
//! trailer:      (the last ALIGN_BYTES) magic "HRRAMEND" | index offset u64 | chunks u32
//!               | CRC32C of the index entries u32 | CRC32C of the 24 bytes before u32 | zeros
//! ```
//! All integers little-endian.

use std::fmt;

pub use crate::store::Recency;

pub const MAGIC: &[u8; 8] = b"HRRAM\0\0\0";
/// The version this build writes (and reads).
pub const VERSION: u32 = 2;
/// Where every block of a part starts: a multiple of every O_DIRECT alignment in use.
pub const ALIGN_BYTES: usize = 4096;
const CHUNK_MAGIC: &[u8; 4] = b"HRCK";
const TRAILER_MAGIC: &[u8; 8] = b"HRRAMEND";
/// A chunk is sealed before an item would be added to a body of this many bytes or more, or of
/// another partition (an item is never split, so a chunk holds at least one item).
pub const CHUNK_BYTES_TARGET: usize = 1 << 20;
/// Magic, partition, hot, count, body length, body CRC, header CRC.
pub const CHUNK_HEADER_BYTES: usize = 28;
/// A longer body is damage, not data: no RAM item comes near it.
const CHUNK_BODY_MAX_BYTES: u32 = 1 << 31;
/// Key length, flags, expiry, cas, recency, last access, value length.
const ITEM_HEADER_BYTES: usize = 1 + 4 + 4 + 8 + 1 + 4 + 4;
/// Offset, partition, hot, count, body length.
const INDEX_ENTRY_BYTES: usize = 8 + 4 + 4 + 4 + 4;

fn recency_byte(recency: Recency) -> u8 {
    u8::from(recency.referenced) | (u8::from(recency.fetched) << 1)
}

fn recency_from(byte: u8, accessed: u32) -> Recency {
    Recency {
        referenced: byte & 1 != 0,
        fetched: byte & 2 != 0,
        accessed,
    }
}

/// One item as a part holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RamItem {
    pub key: Vec<u8>,
    pub flags: u32,
    /// Absolute Unix seconds, 0 never.
    pub expiry: u32,
    pub cas: u64,
    pub recency: Recency,
    pub value: Vec<u8>,
}

/// One item borrowed from a chunk's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemRef<'a> {
    pub key: &'a [u8],
    pub flags: u32,
    pub expiry: u32,
    pub cas: u64,
    pub recency: Recency,
    pub value: &'a [u8],
}

impl ItemRef<'_> {
    pub fn to_owned(self) -> RamItem {
        RamItem {
            key: self.key.to_vec(),
            flags: self.flags,
            expiry: self.expiry,
            cas: self.cas,
            recency: self.recency,
            value: self.value.to_vec(),
        }
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn pad_to_block(out: &mut Vec<u8>) {
    out.resize(out.len().next_multiple_of(ALIGN_BYTES), 0);
}

/// How the server that wrote a part spread keys: with the same layout a chunk's partition is
/// each of its keys' partition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    pub partitions: u32,
    pub seed: u64,
}

/// The part's header block, for a server whose keys are spread as `layout` says.
pub fn header_block(layout: Layout) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&layout.partitions.to_le_bytes());
    out.extend_from_slice(&layout.seed.to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&out).to_le_bytes());
    pad_to_block(&mut out);
    out
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
            PartError::NotAPart => write!(f, "not a RAM snapshot part (no header that checks)"),
            PartError::Version(v) => write!(
                f,
                "a RAM snapshot part of version {v}; this build reads {VERSION}"
            ),
        }
    }
}

impl std::error::Error for PartError {}

/// The header block's bytes that matter.
pub const HEADER_BYTES: usize = 28;

/// The layout of the server that wrote the part whose first bytes are `block`.
pub fn parse_header_block(block: &[u8]) -> Result<Layout, PartError> {
    if block.len() < HEADER_BYTES || &block[..MAGIC.len()] != MAGIC {
        return Err(PartError::NotAPart);
    }
    if u32_at(block, 8) != VERSION {
        return Err(PartError::Version(u32_at(block, 8)));
    }
    if crc32c::crc32c(&block[..24]) != u32_at(block, 24) {
        return Err(PartError::NotAPart);
    }
    Ok(Layout {
        partitions: u32_at(block, 12),
        seed: u64_at(block, 16),
    })
}

/// A chunk as the index (or its header) describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkRef {
    /// Where the chunk starts in the part (a multiple of [`ALIGN_BYTES`]).
    pub offset: u64,
    /// The partition of the server that wrote it.
    pub partition: u32,
    /// Its items were referenced (CLOCK) when written: a start restores them after the cold
    /// ones, so when not everything fits the store evicts the coldest first.
    pub hot: bool,
    pub count: u32,
    pub body_len: u32,
}

impl ChunkRef {
    /// The chunk's bytes from its header to the end of its body.
    pub fn len(&self) -> u64 {
        CHUNK_HEADER_BYTES as u64 + u64::from(self.body_len)
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Where the next block after this chunk starts.
    pub fn end_aligned(&self) -> u64 {
        (self.offset + self.len()).next_multiple_of(ALIGN_BYTES as u64)
    }
}

/// A sealed chunk, padded to whole blocks, and what the index says of it (its offset is set
/// by whoever places it).
#[derive(Debug)]
pub struct SealedChunk {
    pub bytes: Vec<u8>,
    pub partition: u32,
    pub hot: bool,
    pub count: u32,
    pub body_len: u32,
}

/// Builds chunks from items pushed one at a time.
#[derive(Debug, Default)]
pub struct ChunkEncoder {
    body: Vec<u8>,
    count: u32,
    partition: u32,
    hot: bool,
}

impl ChunkEncoder {
    /// Adds an item of `partition` whose value is the concatenation of `value` (a fixed slot's
    /// value may wrap: two parts); returns the chunk this item did not fit in, sealed (a chunk
    /// holds one partition, and items all referenced or none). Keys are at most 250 bytes and
    /// RAM values far below 4 GiB, so every length fits its field.
    pub fn push(
        &mut self,
        partition: u32,
        key: &[u8],
        (flags, expiry, cas, recency): (u32, u32, u64, Recency),
        value: &[&[u8]],
    ) -> Option<SealedChunk> {
        let hot = recency.referenced;
        let sealed = (self.count > 0
            && (self.partition != partition
                || self.hot != hot
                || self.body.len() >= CHUNK_BYTES_TARGET))
            .then(|| self.seal());
        self.partition = partition;
        self.hot = hot;
        let key_len = u8::try_from(key.len()).expect("keys are at most 250 bytes");
        let value_len = value.iter().map(|part| part.len()).sum::<usize>();
        let value_len = u32::try_from(value_len).expect("RAM values are below 4 GiB");
        self.body.push(key_len);
        self.body.extend_from_slice(&flags.to_le_bytes());
        self.body.extend_from_slice(&expiry.to_le_bytes());
        self.body.extend_from_slice(&cas.to_le_bytes());
        self.body.push(recency_byte(recency));
        self.body.extend_from_slice(&recency.accessed.to_le_bytes());
        self.body.extend_from_slice(&value_len.to_le_bytes());
        self.body.extend_from_slice(key);
        value
            .iter()
            .for_each(|part| self.body.extend_from_slice(part));
        self.count += 1;
        sealed
    }

    /// The last chunk, if any item is left in it.
    pub fn finish(mut self) -> Option<SealedChunk> {
        (self.count > 0).then(|| self.seal())
    }

    fn seal(&mut self) -> SealedChunk {
        let body_len = u32::try_from(self.body.len()).expect("a chunk body fits 32 bits");
        assert!(
            body_len < CHUNK_BODY_MAX_BYTES,
            "a chunk body past its bound"
        );
        let mut bytes = Vec::with_capacity(
            (CHUNK_HEADER_BYTES + self.body.len()).next_multiple_of(ALIGN_BYTES),
        );
        bytes.extend_from_slice(CHUNK_MAGIC);
        bytes.extend_from_slice(&self.partition.to_le_bytes());
        bytes.extend_from_slice(&u32::from(self.hot).to_le_bytes());
        bytes.extend_from_slice(&self.count.to_le_bytes());
        bytes.extend_from_slice(&body_len.to_le_bytes());
        bytes.extend_from_slice(&crc32c::crc32c(&self.body).to_le_bytes());
        bytes.extend_from_slice(&crc32c::crc32c(&bytes).to_le_bytes());
        bytes.extend_from_slice(&self.body);
        pad_to_block(&mut bytes);
        self.body.clear();
        let sealed = SealedChunk {
            bytes,
            partition: self.partition,
            hot: self.hot,
            count: self.count,
            body_len,
        };
        self.count = 0;
        sealed
    }
}

/// The header of the chunk starting at `offset`, whose first bytes are `bytes`, if it checks.
pub fn parse_chunk_header(offset: u64, bytes: &[u8]) -> Option<ChunkRef> {
    let header = bytes.get(..CHUNK_HEADER_BYTES)?;
    if &header[..4] != CHUNK_MAGIC || crc32c::crc32c(&header[..24]) != u32_at(header, 24) {
        return None;
    }
    let body_len = u32_at(header, 16);
    (body_len < CHUNK_BODY_MAX_BYTES && u32_at(header, 8) <= 1).then_some(ChunkRef {
        offset,
        partition: u32_at(header, 4),
        hot: u32_at(header, 8) == 1,
        count: u32_at(header, 12),
        body_len,
    })
}

/// The items of a chunk (`bytes` from its header to the end of its body, at least), or `None`
/// when its header or body does not check: then it is dropped whole.
pub fn chunk_items<'a>(chunk: &ChunkRef, bytes: &'a [u8]) -> Option<Vec<ItemRef<'a>>> {
    let header = parse_chunk_header(chunk.offset, bytes)?;
    if header != *chunk {
        return None;
    }
    let body = bytes.get(CHUNK_HEADER_BYTES..chunk.len() as usize)?;
    if crc32c::crc32c(body) != u32_at(bytes, 20) {
        return None;
    }
    parse_items(body, chunk.count)
}

/// A chunk's body: exactly `count` items filling it. The checksum held, so a body that does
/// not parse was written wrong; it is dropped all the same.
fn parse_items(mut body: &[u8], count: u32) -> Option<Vec<ItemRef<'_>>> {
    let mut items = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let header = body.get(..ITEM_HEADER_BYTES)?;
        let key_len = header[0] as usize;
        let value_len = u32_at(header, 22) as usize;
        let rest = &body[ITEM_HEADER_BYTES..];
        items.push(ItemRef {
            key: rest.get(..key_len)?,
            flags: u32_at(header, 1),
            expiry: u32_at(header, 5),
            cas: u64_at(header, 9),
            recency: recency_from(header[17], u32_at(header, 18)),
            value: rest.get(key_len..key_len + value_len)?,
        });
        body = &rest[key_len + value_len..];
    }
    body.is_empty().then_some(items)
}

/// The index and trailer that end a part whose chunks are `chunks` and whose index starts at
/// `index_offset` (where the last chunk ends).
pub fn index_blocks(chunks: &[ChunkRef], index_offset: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunks.len() * INDEX_ENTRY_BYTES + 2 * ALIGN_BYTES);
    for chunk in chunks {
        out.extend_from_slice(&chunk.offset.to_le_bytes());
        out.extend_from_slice(&chunk.partition.to_le_bytes());
        out.extend_from_slice(&u32::from(chunk.hot).to_le_bytes());
        out.extend_from_slice(&chunk.count.to_le_bytes());
        out.extend_from_slice(&chunk.body_len.to_le_bytes());
    }
    let entries_crc = crc32c::crc32c(&out);
    pad_to_block(&mut out);
    let trailer_at = out.len();
    out.extend_from_slice(TRAILER_MAGIC);
    out.extend_from_slice(&index_offset.to_le_bytes());
    out.extend_from_slice(&(chunks.len() as u32).to_le_bytes());
    out.extend_from_slice(&entries_crc.to_le_bytes());
    let trailer_crc = crc32c::crc32c(&out[trailer_at..]);
    out.extend_from_slice(&trailer_crc.to_le_bytes());
    pad_to_block(&mut out);
    out
}

/// Where the index starts, how many chunks it lists and its entries' CRC, read from a part's
/// last block (`None`: no trailer that checks, as in a truncated part).
pub fn parse_trailer(block: &[u8]) -> Option<(u64, u32, u32)> {
    if block.len() < 28 || &block[..8] != TRAILER_MAGIC {
        return None;
    }
    (crc32c::crc32c(&block[..24]) == u32_at(block, 24))
        .then(|| (u64_at(block, 8), u32_at(block, 16), u32_at(block, 20)))
}

/// The chunks an index lists, if its entries check and each lies in `index_offset` bytes in
/// order.
fn parse_index(entries: &[u8], count: u32, crc: u32, index_offset: u64) -> Option<Vec<ChunkRef>> {
    let entries = entries.get(..count as usize * INDEX_ENTRY_BYTES)?;
    if crc32c::crc32c(entries) != crc {
        return None;
    }
    let mut at = ALIGN_BYTES as u64;
    let mut chunks = Vec::with_capacity(count as usize);
    for entry in entries.chunks_exact(INDEX_ENTRY_BYTES) {
        let chunk = ChunkRef {
            offset: u64_at(entry, 0),
            partition: u32_at(entry, 8),
            hot: u32_at(entry, 12) == 1,
            count: u32_at(entry, 16),
            body_len: u32_at(entry, 20),
        };
        if u32_at(entry, 12) > 1
            || chunk.offset < at
            || chunk.offset % ALIGN_BYTES as u64 != 0
            || chunk.end_aligned() > index_offset
        {
            return None;
        }
        at = chunk.end_aligned();
        chunks.push(chunk);
    }
    Some(chunks)
}

/// What a part holds, as its index (or a walk of its headers) says: what the reader then reads.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// How the server that wrote it spread keys.
    pub layout: Layout,
    pub chunks: Vec<ChunkRef>,
    /// False when the index was lost and the chunk headers were walked instead.
    pub indexed: bool,
    /// Stretches of blocks that held no chunk header that checks, and their bytes (damage, or
    /// a truncated last chunk; found only while walking).
    pub damaged_stretches: u64,
    pub damaged_bytes: u64,
}

/// Plans the reading of a part of `len` bytes, reading its small pieces (header, trailer,
/// index or chunk headers) through `read(offset, len)`, which may return fewer bytes at the
/// end of the part.
pub fn plan<E>(
    len: u64,
    mut read: impl FnMut(u64, usize) -> Result<Vec<u8>, E>,
) -> Result<Result<Plan, PartError>, E> {
    let block = ALIGN_BYTES as u64;
    let layout = match parse_header_block(&read(0, HEADER_BYTES)?) {
        Ok(layout) => layout,
        Err(err) => return Ok(Err(err)),
    };
    let mut plan = Plan {
        layout,
        ..Plan::default()
    };
    if len >= 2 * block && len % block == 0 {
        if let Some((index_offset, count, crc)) = parse_trailer(&read(len - block, 28)?) {
            if index_offset >= block && index_offset <= len - block {
                let entries = read(index_offset, count as usize * INDEX_ENTRY_BYTES)?;
                if let Some(chunks) = parse_index(&entries, count, crc, index_offset) {
                    plan.chunks = chunks;
                    plan.indexed = true;
                    return Ok(Ok(plan));
                }
            }
        }
    }
    // No index that checks: walk the chunk headers, block by block past damage.
    let mut at = block;
    let mut damaged_from = None;
    while at < len {
        // The index and trailer, when there, are walked over as blocks without a header.
        let found = parse_chunk_header(at, &read(at, CHUNK_HEADER_BYTES)?)
            .filter(|chunk| chunk.offset + chunk.len() <= len);
        match found {
            Some(chunk) => {
                if let Some(from) = damaged_from.take() {
                    plan.damaged_stretches += 1;
                    plan.damaged_bytes += at - from;
                }
                plan.chunks.push(chunk);
                at = chunk.end_aligned();
            }
            None => {
                damaged_from.get_or_insert(at);
                at += block;
            }
        }
    }
    if let Some(from) = damaged_from {
        plan.damaged_stretches += 1;
        plan.damaged_bytes += len - from;
    }
    Ok(Ok(plan))
}

/// What reading a whole part in memory found (the server streams instead; the two share
/// [`plan`] and [`chunk_items`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    pub items: Vec<RamItem>,
    pub chunks_read: u64,
    /// Chunks listed (or found) whose bytes did not check, and the items they held.
    pub chunks_dropped: u64,
    pub items_dropped: u64,
    pub plan_indexed: bool,
    pub damaged_stretches: u64,
    pub damaged_bytes: u64,
}

/// Reads a whole part held in memory.
pub fn decode(part: &[u8]) -> Result<Decoded, PartError> {
    let slice = |at: u64, len: usize| -> Result<Vec<u8>, ()> {
        let from = (at as usize).min(part.len());
        Ok(part[from..(from + len).min(part.len())].to_vec())
    };
    let plan = plan(part.len() as u64, slice).expect("reading memory cannot fail")?;
    let mut decoded = Decoded {
        plan_indexed: plan.indexed,
        damaged_stretches: plan.damaged_stretches,
        damaged_bytes: plan.damaged_bytes,
        ..Decoded::default()
    };
    for chunk in &plan.chunks {
        let bytes = part.get(chunk.offset as usize..).unwrap_or_default();
        match chunk_items(chunk, bytes) {
            Some(items) => {
                decoded
                    .items
                    .extend(items.into_iter().map(ItemRef::to_owned));
                decoded.chunks_read += 1;
            }
            None => {
                decoded.chunks_dropped += 1;
                decoded.items_dropped += u64::from(chunk.count);
            }
        }
    }
    Ok(decoded)
}

/// Builds a whole part in memory (tests, and the shape the server streams).
pub fn encode_in_memory<'a>(
    layout: Layout,
    items: impl IntoIterator<Item = (u32, &'a RamItem)>,
) -> Vec<u8> {
    let mut part = header_block(layout);
    let mut chunks = Vec::new();
    let mut place = |part: &mut Vec<u8>, sealed: SealedChunk| {
        chunks.push(ChunkRef {
            offset: part.len() as u64,
            partition: sealed.partition,
            hot: sealed.hot,
            count: sealed.count,
            body_len: sealed.body_len,
        });
        part.extend_from_slice(&sealed.bytes);
    };
    let mut encoder = ChunkEncoder::default();
    for (partition, item) in items {
        let meta = (item.flags, item.expiry, item.cas, item.recency);
        if let Some(sealed) = encoder.push(partition, &item.key, meta, &[&item.value]) {
            place(&mut part, sealed);
        }
    }
    if let Some(sealed) = encoder.finish() {
        place(&mut part, sealed);
    }
    let index_offset = part.len() as u64;
    part.extend_from_slice(&index_blocks(&chunks, index_offset));
    part
}
