//! The RAM snapshot format (`src/ram_snapshot.rs`) under seeded random items: a part reads back
//! exactly what was written, its chunks never mixing partitions; a flipped bit in a chunk loses
//! that chunk (its items counted) and nothing else; a flipped bit in the index loses nothing
//! (the chunk headers are walked); a part cut anywhere yields the chunks before the cut; no
//! damage ever yields an item that was not written, byte for byte. Seeds printed;
//! `HEADROOM_SEED=N` replays one.

mod common;

use common::Rng;
use headroom::ram_snapshot::{self, Layout, RamItem};

const LAYOUT: Layout = Layout {
    partitions: 64,
    seed: 0x5eed,
};

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
                recency: ram_snapshot::Recency {
                    referenced: rng.below(2) == 1,
                    fetched: rng.below(2) == 1,
                    accessed: rng.next_u64() as u32,
                },
                value: (0..value_len).map(|_| rng.below(256) as u8).collect(),
            }
        })
        .collect()
}

/// The part for `items` (in partitions of runs of 1 to 400 items), and where each chunk
/// starts and where the chunks end (the index begins).
fn encode(rng: &mut Rng, items: &[RamItem]) -> (Vec<u8>, Vec<usize>, usize) {
    let mut partition = 0u32;
    let mut left = 0;
    let tagged: Vec<(u32, &RamItem)> = items
        .iter()
        .map(|item| {
            if left == 0 {
                partition += 1 + rng.below(3) as u32;
                left = rng.between(1, 400);
            }
            left -= 1;
            (partition, item)
        })
        .collect();
    let part = ram_snapshot::encode_in_memory(LAYOUT, tagged.iter().copied());
    let plan = ram_snapshot::plan(part.len() as u64, |at, len| {
        let from = (at as usize).min(part.len());
        Ok::<_, ()>(part[from..(from + len).min(part.len())].to_vec())
    })
    .unwrap()
    .unwrap();
    assert!(plan.indexed);
    // A chunk never mixes partitions, and the index lists them in order.
    let mut at = 0;
    for chunk in &plan.chunks {
        let items = ram_snapshot::chunk_items(chunk, &part[chunk.offset as usize..]).unwrap();
        for (i, item) in items.iter().enumerate() {
            assert_eq!(tagged[at + i].0, chunk.partition);
            assert_eq!(item.key, tagged[at + i].1.key.as_slice());
        }
        at += items.len();
    }
    let starts: Vec<usize> = plan.chunks.iter().map(|c| c.offset as usize).collect();
    let chunks_end = plan
        .chunks
        .last()
        .map_or(ram_snapshot::ALIGN_BYTES, |c| c.end_aligned() as usize);
    (part, starts, chunks_end)
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
        let (part, starts, chunks_end) = encode(&mut rng, &items);
        assert_eq!(part.len() % ram_snapshot::ALIGN_BYTES, 0, "whole blocks");
        let whole = ram_snapshot::decode(&part).unwrap();
        assert_eq!(whole.items, items, "seed {seed}");
        assert_eq!(whole.chunks_read, starts.len() as u64, "seed {seed}");
        assert_eq!((whole.chunks_dropped, whole.damaged_stretches), (0, 0));
        assert!(whole.plan_indexed);

        // A flipped bit inside one chunk: that chunk goes (its items counted), every other
        // chunk stays.
        let hit = rng.between(starts[0] as u64, chunks_end as u64 - 1) as usize;
        let chunk = starts.iter().rposition(|&s| s <= hit).unwrap();
        let mut flipped = part.clone();
        flipped[hit] ^= 1 << rng.below(8);
        let damaged = ram_snapshot::decode(&flipped).unwrap();
        let kept = all_genuine(&damaged.items, &items);
        let lost = damaged.items_dropped as usize;
        // Padding after a body carries no data: a flip there costs nothing.
        if lost > 0 {
            assert_eq!(
                damaged.chunks_read,
                starts.len() as u64 - 1,
                "seed {seed}, byte {hit}"
            );
            assert_eq!(damaged.chunks_dropped, 1, "seed {seed}");
            assert_eq!(
                kept + lost,
                items.len(),
                "seed {seed}: every item read or counted"
            );
        } else {
            assert_eq!(
                damaged.items, items,
                "seed {seed}, byte {hit} in chunk {chunk}'s padding"
            );
        }

        // A flipped bit in the index or trailer: the chunk headers are walked and every chunk
        // comes back.
        let hit = rng.between(chunks_end as u64, part.len() as u64 - 1) as usize;
        let mut flipped = part.clone();
        flipped[hit] ^= 1 << rng.below(8);
        let walked = ram_snapshot::decode(&flipped).unwrap();
        assert_eq!(walked.items, items, "seed {seed}, index byte {hit}");

        // Cut anywhere: the chunks wholly before the cut come back, in order.
        let cut = rng.between(20, part.len() as u64) as usize;
        let truncated = ram_snapshot::decode(&part[..cut]).unwrap();
        let whole_before = starts
            .iter()
            .enumerate()
            .filter(|&(i, &s)| {
                let end = starts.get(i + 1).copied().unwrap_or(chunks_end);
                // A chunk's body may end before the padding that the cut removed.
                end <= cut || (s < cut && body_end(&part, s) <= cut)
            })
            .count();
        if cut < part.len() {
            assert!(
                !truncated.plan_indexed,
                "seed {seed}: a cut part has no index"
            );
        }
        assert_eq!(
            truncated.chunks_read, whole_before as u64,
            "seed {seed}, cut {cut}"
        );
        all_genuine(&truncated.items, &items);
        assert_eq!(
            truncated.items[..],
            items[..truncated.items.len()],
            "seed {seed}: a truncated part yields a prefix"
        );
    }
}

/// Where the body of the chunk at `start` ends.
fn body_end(part: &[u8], start: usize) -> usize {
    let body_len = u32::from_le_bytes(part[start + 16..start + 20].try_into().unwrap());
    start + ram_snapshot::CHUNK_HEADER_BYTES + body_len as usize
}

#[test]
fn what_is_not_a_part_is_refused_whole() {
    assert_eq!(
        ram_snapshot::decode(b"HRSNAP\0\0\x01\0\0\0"),
        Err(ram_snapshot::PartError::NotAPart)
    );
    let mut older = ram_snapshot::header_block(LAYOUT);
    older[8] = 1;
    assert_eq!(
        ram_snapshot::decode(&older),
        Err(ram_snapshot::PartError::Version(1))
    );
    let mut flipped = ram_snapshot::header_block(LAYOUT);
    flipped[17] ^= 1;
    assert_eq!(
        ram_snapshot::decode(&flipped),
        Err(ram_snapshot::PartError::NotAPart),
        "a header whose checksum fails"
    );
    let empty = ram_snapshot::decode(&ram_snapshot::encode_in_memory(LAYOUT, [])).unwrap();
    assert_eq!((empty.items.len(), empty.chunks_read), (0, 0));
    assert!(empty.plan_indexed);
}
