//! Snapshots of the large values in file segments, for warm restarts.
//!
//! At a clean shutdown every shard writes the large items it holds on file segments (their
//! keys, flags, expiry, sizes, value checksums and extents) with the identity of those
//! segments; at start-up the objects whose segment is mounted again with the same identity, whose
//! metadata checksum holds and whose data still has its CRC32C are served again, at exactly the
//! extents they had. Anything else is reported and skipped: never wrong bytes.
//!
//! The format is versioned, and every target and object is a length-prefixed record, so a later
//! version can append optional fields that this decoder skips. Version 2 names each segment by
//! the id in its label (`segment::label`), so a segment found at another path is still itself;
//! version 1, the same bytes, named it by a hash of its path ([`TargetIds::PathHash`]), which
//! this build still reads. `tests/data/snapshot-v1.bin` and `snapshot-v2.bin` are the fixtures
//! (`tests/snapshot.rs`).
//!
//! ```text
//! magic "HRSNAP\0\0" | version u32 | target count u32 | targets | object count u64 | objects
//!   | CRC32C of everything before it u32
//! target: body length u32 | uuid u128 | kind u8 | base u64 | size u64 | node i64 (-1 unknown)
//!         | name length u16 | name
//! object: body length u32 | key length u8 | key | flags u32 | expiry u32 | value length u64
//!         | value CRC32C u32 | replica count u8 | (target uuid u128, offset u64, length u64)*
//!         | CRC32C of the body u32
//! ```
//! All integers little-endian.

use std::fmt;

use crate::segment::Extent;

pub const MAGIC: &[u8; 8] = b"HRSNAP\0\0";
/// The version this build writes (and every version up to it, it reads).
pub const VERSION: u32 = 2;

/// What a target's `uuid` is: how a snapshot names the segments its objects lie in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TargetIds {
    /// Version 1: a hash of the segment file's path (`segment::mount::legacy_path_uuid`).
    PathHash,
    /// Version 2: the id in the segment's label, wherever the file lies.
    #[default]
    SegmentId,
}

impl TargetIds {
    fn version(self) -> u32 {
        match self {
            TargetIds::PathHash => 1,
            TargetIds::SegmentId => 2,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotTarget {
    pub uuid: u128,
    /// 0 memory, 1 file.
    pub kind: u8,
    pub base: u64,
    pub size: u64,
    pub node: Option<u32>,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotObject {
    pub key: Vec<u8>,
    pub flags: u32,
    /// Absolute Unix seconds, 0 never.
    pub expiry: u32,
    pub value_len: u64,
    pub checksum: u32,
    /// (target uuid, extent) per replica.
    pub replicas: Vec<(u128, Extent)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// How `targets` name their segments (which also says the version written).
    pub ids: TargetIds,
    pub targets: Vec<SnapshotTarget>,
    pub objects: Vec<SnapshotObject>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotError {
    NotASnapshot,
    /// Written by a newer, incompatible build.
    Version(u32),
    Truncated,
    /// The whole-file checksum does not hold.
    Corrupt,
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::NotASnapshot => f.write_str("not a snapshot (bad magic)"),
            SnapshotError::Version(v) => write!(
                f,
                "snapshot version {v} is newer than this build reads ({VERSION})"
            ),
            SnapshotError::Truncated => f.write_str("the snapshot is truncated"),
            SnapshotError::Corrupt => {
                f.write_str("the snapshot's checksum does not hold (corrupt)")
            }
        }
    }
}

impl std::error::Error for SnapshotError {}

fn put_record(out: &mut Vec<u8>, body: &[u8]) {
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
}

pub fn encode(snapshot: &Snapshot) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&snapshot.ids.version().to_le_bytes());
    out.extend_from_slice(&(snapshot.targets.len() as u32).to_le_bytes());
    for t in &snapshot.targets {
        let mut body = Vec::new();
        body.extend_from_slice(&t.uuid.to_le_bytes());
        body.push(t.kind);
        body.extend_from_slice(&t.base.to_le_bytes());
        body.extend_from_slice(&t.size.to_le_bytes());
        body.extend_from_slice(&t.node.map_or(-1i64, i64::from).to_le_bytes());
        body.extend_from_slice(&(t.name.len() as u16).to_le_bytes());
        body.extend_from_slice(t.name.as_bytes());
        put_record(&mut out, &body);
    }
    out.extend_from_slice(&(snapshot.objects.len() as u64).to_le_bytes());
    for o in &snapshot.objects {
        let mut body = Vec::new();
        body.push(o.key.len() as u8);
        body.extend_from_slice(&o.key);
        body.extend_from_slice(&o.flags.to_le_bytes());
        body.extend_from_slice(&o.expiry.to_le_bytes());
        body.extend_from_slice(&o.value_len.to_le_bytes());
        body.extend_from_slice(&o.checksum.to_le_bytes());
        body.push(o.replicas.len() as u8);
        for (uuid, extent) in &o.replicas {
            body.extend_from_slice(&uuid.to_le_bytes());
            body.extend_from_slice(&extent.offset.to_le_bytes());
            body.extend_from_slice(&extent.len.to_le_bytes());
        }
        let crc = crc32c::crc32c(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        put_record(&mut out, &body);
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A cursor that fails with `Truncated` instead of panicking.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(SnapshotError::Truncated)?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn u128(&mut self) -> Result<u128, SnapshotError> {
        Ok(u128::from_le_bytes(self.take(16)?.try_into().expect("16")))
    }
}

/// Decodes a snapshot. Objects whose own checksum fails are left out and counted.
pub fn decode(bytes: &[u8]) -> Result<(Snapshot, u64), SnapshotError> {
    if bytes.len() < MAGIC.len() + 4 || &bytes[..8] != MAGIC {
        return Err(SnapshotError::NotASnapshot);
    }
    if bytes.len() < 8 + 4 + 4 {
        return Err(SnapshotError::Truncated);
    }
    let (body, trailer) = bytes.split_at(bytes.len() - 4);
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4"));
    if version > VERSION {
        return Err(SnapshotError::Version(version));
    }
    if version == 0 {
        return Err(SnapshotError::NotASnapshot);
    }
    if crc32c::crc32c(body) != u32::from_le_bytes(trailer.try_into().expect("4")) {
        return Err(SnapshotError::Corrupt);
    }
    let mut r = Reader {
        bytes: body,
        at: 12,
    };
    let mut snapshot = Snapshot {
        ids: match version {
            1 => TargetIds::PathHash,
            _ => TargetIds::SegmentId,
        },
        ..Snapshot::default()
    };
    for _ in 0..r.u32()? {
        let len = r.u32()? as usize;
        let mut t = Reader {
            bytes: r.take(len)?,
            at: 0,
        };
        let uuid = t.u128()?;
        let kind = t.u8()?;
        let base = t.u64()?;
        let size = t.u64()?;
        let node = i64::from_le_bytes(t.take(8)?.try_into().expect("8"));
        let name_len = t.u16()? as usize;
        let name = String::from_utf8_lossy(t.take(name_len)?).into_owned();
        snapshot.targets.push(SnapshotTarget {
            uuid,
            kind,
            base,
            size,
            node: u32::try_from(node).ok(),
            name,
        });
    }
    let mut skipped = 0;
    for _ in 0..r.u64()? {
        let len = r.u32()? as usize;
        let record = r.take(len)?;
        if record.len() < 4 {
            skipped += 1;
            continue;
        }
        let (body, crc) = record.split_at(record.len() - 4);
        if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4")) {
            skipped += 1;
            continue;
        }
        let mut o = Reader { bytes: body, at: 0 };
        let parsed = (|| {
            let key_len = o.u8()? as usize;
            let key = o.take(key_len)?.to_vec();
            let flags = o.u32()?;
            let expiry = o.u32()?;
            let value_len = o.u64()?;
            let checksum = o.u32()?;
            let replicas = (0..o.u8()?)
                .map(|_| {
                    Ok((
                        o.u128()?,
                        Extent {
                            offset: o.u64()?,
                            len: o.u64()?,
                        },
                    ))
                })
                .collect::<Result<Vec<_>, SnapshotError>>()?;
            Ok::<_, SnapshotError>(SnapshotObject {
                key,
                flags,
                expiry,
                value_len,
                checksum,
                replicas,
            })
        })();
        match parsed {
            Ok(object) => snapshot.objects.push(object),
            Err(_) => skipped += 1,
        }
    }
    Ok((snapshot, skipped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        Snapshot {
            ids: TargetIds::SegmentId,
            targets: vec![SnapshotTarget {
                uuid: 7,
                kind: 1,
                base: 0,
                size: 1 << 30,
                node: Some(1),
                name: "/data/seg".into(),
            }],
            objects: vec![SnapshotObject {
                key: b"k".to_vec(),
                flags: 3,
                expiry: 0,
                value_len: 5 << 20,
                checksum: 99,
                replicas: vec![(
                    7,
                    Extent {
                        offset: 4096,
                        len: 5 << 20,
                    },
                )],
            }],
        }
    }

    #[test]
    fn round_trips_and_detects_damage() {
        let bytes = encode(&sample());
        assert_eq!(decode(&bytes), Ok((sample(), 0)));
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            assert_ne!(
                decode(&damaged).map(|(s, _)| s),
                Ok(sample()),
                "flip at {at}"
            );
        }
    }
}
