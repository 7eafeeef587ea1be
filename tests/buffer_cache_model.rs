//! The shard's buffer cache (`buffer_cache.rs`) against a model, seeded (the seed is
//! printed): connections take buffers, grow some, write into them and give them back in any
//! order. Every buffer handed out is of the cache's kind (a read buffer of its length, a reply
//! buffer empty with its first capacity at least); the free list never passes its bound, holds
//! only buffers it may hand out, and its counts are the model's; no buffer is handed out twice
//! while held.

mod common;

use std::collections::HashSet;

use common::{for_each_seed, Rng};
use headroom::buffer_cache::{BufferCache, BufferKind};

const BYTES: usize = 512;
const KEEP_MAX: usize = 6;
const CAPACITY_MAX: usize = 2048;

fn run(seed: u64, kind: BufferKind) {
    let mut rng = Rng::new(seed);
    let cache = BufferCache::new(kind, CAPACITY_MAX, KEEP_MAX);
    let mut held: Vec<Vec<u8>> = Vec::new();
    // The model: the capacities of the free buffers.
    let mut free: Vec<usize> = Vec::new();
    for step in 0..2_000 {
        if held.is_empty() || rng.chance(55) {
            let buf = cache.take();
            match kind {
                BufferKind::Read { bytes } => assert_eq!(buf.len(), bytes, "step {step}"),
                BufferKind::Reply { bytes } => {
                    assert!(buf.is_empty() && buf.capacity() >= bytes, "step {step}")
                }
            }
            if let Some(at) = free.iter().position(|&c| c == buf.capacity()) {
                free.remove(at);
            } else {
                assert!(free.is_empty(), "step {step}: allocated while one was free");
            }
            let mut buf = buf;
            match rng.below(4) {
                // A long line or a big reply grows it, sometimes past what is kept.
                0 => buf.resize(
                    buf.len() + rng.between(1, 3 * CAPACITY_MAX as u64) as usize,
                    7,
                ),
                1 => buf.extend_from_slice(b"VALUE k 0 1\r\nx\r\nEND\r\n"),
                _ => {}
            }
            held.push(buf);
        } else {
            let at = rng.below(held.len() as u64) as usize;
            let buf = held.swap_remove(at);
            let fits = buf.capacity() <= CAPACITY_MAX
                && match kind {
                    BufferKind::Read { bytes } => buf.len() == bytes,
                    BufferKind::Reply { bytes } => buf.capacity() >= bytes,
                };
            if fits && free.len() < KEEP_MAX {
                free.push(buf.capacity());
            }
            cache.give(buf);
        }
        let counts = cache.counts();
        assert_eq!(counts.free, free.len(), "step {step}");
        assert_eq!(counts.free_bytes, free.iter().sum::<usize>(), "step {step}");
        assert!(counts.free <= KEEP_MAX, "step {step}: past the bound");
        let distinct: HashSet<*const u8> = held
            .iter()
            .filter(|b| b.capacity() > 0)
            .map(|b| b.as_ptr())
            .collect();
        assert_eq!(
            distinct.len(),
            held.len(),
            "step {step}: a buffer held twice"
        );
    }
}

#[test]
fn read_buffers_match_the_model() {
    for_each_seed("buffer_cache_read", 8, |seed| {
        run(seed, BufferKind::Read { bytes: BYTES })
    });
}

#[test]
fn reply_buffers_match_the_model() {
    for_each_seed("buffer_cache_reply", 8, |seed| {
        run(seed, BufferKind::Reply { bytes: BYTES })
    });
}
