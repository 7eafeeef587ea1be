//! The RAM snapshot format (`src/ram_snapshot.rs`) under seeded random items: a part reads back
//! exactly what was written; a flipped byte loses the chunk it hit and nothing else; a part
//! cut anywhere yields the chunks before the cut; no damage ever yields an item that was not
//! written, byte for byte. Seeds printed; `HEADROOM_SEED=N` replays one.

mod common;

use common::Rng;
use headroom::ram_snapshot::{self, ChunkEncoder, RamItem};

fn random_items(rng: &mut Rng, count: usize) -> Vec<RamItem> {
    (0..count)
        .map(|i| {
            let key_len = rng.between(1, 250) as usize;
            let mut key: Vec<u8> = (0..key_len).map(|_| rng.below(256) as u8).collect();
            key.extend_from_slice(format!("#{i}").as_bytes()); // unique
            key.truncate(250);
            let value_len = match rng.below(10) {
                0 => 0,
                1..=6 => rng.below(100) as usize,
                7 | 8 => rng.below(8192) as usize,
                _ => rng.below(256 << 10) as usize,
            };
            RamItem {
                key,
                flags: rng.next_u64() as u32,
                expiry: rng.next_u64() as u32,
                cas: rng.next_u64(),
                value: (0..value_len).map(|_| rng.below(256) as u8).collect(),
            }
        })
        .collect()
}

/// The part for `items`, and where each chunk starts in it.
fn encode(items: &[RamItem]) -> (Vec<u8>, Vec<usize>) {
    let mut part = ram_snapshot::header();
    let mut starts = Vec::new();
    let mut encoder = ChunkEncoder::default();
    for item in items {
        if let Some(chunk) =
            encoder.push(&item.key, item.flags, item.expiry, item.cas, &[&item.value])
        {
            starts.push(part.len());
            part.extend_from_slice(&chunk);
        }
    }
    if let Some(chunk) = encoder.finish() {
        starts.push(part.len());
        part.extend_from_slice(&chunk);
    }
    (part, starts)
}

/// Every decoded item is one that was written, whole; returns how many there are.
fn all_genuine(decoded: &[RamItem], written: &[RamItem]) -> usize {
    let by_key: std::collections::HashMap<&[u8], &RamItem> =
        written.iter().map(|i| (i.key.as_slice(), i)).collect();
    for item in decoded {
        assert_eq!(
            by_key.get(item.key.as_slice()).copied(),
            Some(item),
            "an item that was not written"
        );
    }
    decoded.len()
}

#[test]
fn parts_read_back_whole_and_damage_loses_only_its_chunk() {
    for seed in common::seeds("ram_snapshot", 12) {
        let mut rng = Rng::new(seed);
        let count = rng.between(1, 3000) as usize;
        let items = random_items(&mut rng, count);
        let (part, starts) = encode(&items);
        let whole = ram_snapshot::decode(&part).unwrap();
        assert_eq!(whole.items, items, "seed {seed}");
        assert_eq!(whole.chunks_read, starts.len() as u64, "seed {seed}");
        assert_eq!(whole.damaged_stretches, 0, "seed {seed}");

        // A flipped byte inside one chunk: that chunk goes, every other chunk stays.
        let hit = rng.between(starts[0] as u64, part.len() as u64 - 1) as usize;
        let chunk = starts.iter().rposition(|&s| s <= hit).unwrap();
        let mut flipped = part.clone();
        flipped[hit] ^= 1 << rng.below(8);
        let damaged = ram_snapshot::decode(&flipped).unwrap();
        all_genuine(&damaged.items, &items);
        assert_eq!(
            damaged.chunks_read,
            starts.len() as u64 - 1,
            "seed {seed}, byte {hit}"
        );
        assert_eq!(damaged.damaged_stretches, 1, "seed {seed}");
        let chunk_end = starts.get(chunk + 1).copied().unwrap_or(part.len());
        assert_eq!(damaged.damaged_bytes, (chunk_end - starts[chunk]) as u64);

        // Cut anywhere: the chunks wholly before the cut come back.
        let cut = rng.between(12, part.len() as u64) as usize;
        let truncated = ram_snapshot::decode(&part[..cut]).unwrap();
        let whole_before = starts
            .iter()
            .enumerate()
            .filter(|&(i, _)| starts.get(i + 1).copied().unwrap_or(part.len()) <= cut)
            .count();
        assert_eq!(
            truncated.chunks_read, whole_before as u64,
            "seed {seed}, cut {cut}"
        );
        let genuine = all_genuine(&truncated.items, &items);
        assert!(genuine <= items.len());
        assert_eq!(
            truncated.items[..],
            items[..truncated.items.len()],
            "seed {seed}: a truncated part yields a prefix"
        );
    }
}

#[test]
fn what_is_not_a_part_is_refused_whole() {
    assert_eq!(
        ram_snapshot::decode(b"HRSNAP\0\0\x01\0\0\0"),
        Err(ram_snapshot::PartError::NotAPart)
    );
    let mut newer = ram_snapshot::header();
    newer[8] = 9;
    assert_eq!(
        ram_snapshot::decode(&newer),
        Err(ram_snapshot::PartError::Version(9))
    );
    let empty = ram_snapshot::decode(&ram_snapshot::header()).unwrap();
    assert_eq!((empty.items.len(), empty.chunks_read), (0, 0));
}
