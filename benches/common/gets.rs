//! Pipelined binary GETs (and, on request, SETs among them) run against partitions as a
//! connection runs them: the keys, the frames, the filled partitions and the request loop the
//! `lookahead` and `cores` benches share.

use headroom::arena::Arena;
use headroom::command::{Command, Value};
use headroom::proto::{decode_streaming, opcode, Decoded, Request, StoreMode};
use headroom::server::lookahead::{Framing, Lookahead, FRAMES};
use headroom::store::partition::Partitions;
use headroom::store::{KeyHasher, Lookup, StoreConfig, StoreOutcome};
use std::sync::Arc;

/// A small deterministic generator (xorshift64*), so every run asks for the same keys.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

pub fn key(i: u64) -> Vec<u8> {
    format!("memtier-{i}").into_bytes()
}

/// A binary GET frame for `key`.
pub fn get_frame(out: &mut Vec<u8>, key: &[u8]) {
    headroom::proto::write_request(out, opcode::GET, (&[], key, &[]), 0, 0);
}

/// A binary SET frame for `key` (flags 0, no expiry).
pub fn set_frame(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    headroom::proto::write_request(out, opcode::SET, (&[0; 8], key, value), 0, 0);
}

/// `count` partitions over `arena` holding keys `0..keys`, each a `value_bytes` value.
pub fn filled_partitions(
    arena: &Arc<Arena>,
    count: usize,
    keys: u64,
    value_bytes: usize,
) -> Partitions {
    let partitions = Partitions::new(arena, KeyHasher::with_seed(1), count, |index| StoreConfig {
        max_item_bytes: 1 << 20,
        partition: index,
        partitions: count,
        promotion_half_life_seconds: 10,
        evictions: true,
    });
    let value = vec![7u8; value_bytes];
    for i in 0..keys {
        let key = key(i);
        let (_, mut store) = partitions.lock_key(&key);
        store.store(StoreMode::Set, &key, &value, 0, 0, 0, 1);
    }
    partitions
}

/// `count` batches of `FRAMES` GET frames for random keys of `0..keys`, from `seed`.
pub fn get_batches(keys: u64, seed: u64, count: usize) -> Vec<Vec<u8>> {
    request_batches(keys, seed, count, 0, 0)
}

/// As [`get_batches`], with every `set_every`-th request a SET of a `value_bytes` value
/// instead (none when 0): memtier's `--ratio=1:10` is `set_every` 11.
pub fn request_batches(
    keys: u64,
    seed: u64,
    count: usize,
    set_every: u64,
    value_bytes: usize,
) -> Vec<Vec<u8>> {
    let mut rng = Rng(seed);
    let value = vec![9u8; value_bytes];
    let mut made = 0u64;
    (0..count)
        .map(|_| {
            let mut frames = Vec::new();
            for _ in 0..FRAMES {
                let key = key(rng.below(keys));
                made += 1;
                if set_every > 0 && made % set_every == 0 {
                    set_frame(&mut frames, &key, &value);
                } else {
                    get_frame(&mut frames, &key);
                }
            }
            frames
        })
        .collect()
}

/// Runs every request of `batch` as a connection does (the look ahead first, when given):
/// every GET must hit, every SET be stored. Returns the value bytes copied into `out`.
pub fn run_batch(
    partitions: &Partitions,
    batch: &[u8],
    mut lookahead: Option<&mut Lookahead>,
    out: &mut Vec<u8>,
) -> usize {
    if let Some(l) = lookahead.as_deref_mut() {
        l.reset();
    }
    let mut at = 0;
    while at < batch.len() {
        if let Some(l) = lookahead.as_deref_mut() {
            l.before_frame(partitions, Framing::Binary, batch, at);
        }
        let Decoded::Request {
            request, consumed, ..
        } = decode_streaming(&batch[at..], 1 << 20, 256 << 10)
        else {
            panic!("a whole frame");
        };
        match request {
            Request::Run {
                command: Command::Get { key, .. },
                ..
            } => {
                let (_, mut store) = partitions.lock_key(key);
                let Lookup::Small(hit) = store.lookup(key, None, 1, true) else {
                    panic!("every GET a hit");
                };
                out.extend_from_slice(&hit.value.contiguous());
            }
            Request::Run {
                command:
                    Command::Store {
                        key,
                        value: Value::Whole(value),
                        ..
                    },
                ..
            } => {
                let (_, mut store) = partitions.lock_key(key);
                let outcome = store.store(StoreMode::Set, key, value, 0, 0, 0, 1);
                assert!(
                    matches!(outcome, StoreOutcome::Stored { .. }),
                    "every SET stored: {outcome:?}"
                );
            }
            _ => panic!("a GET or a SET frame"),
        }
        at += consumed;
    }
    out.len()
}
