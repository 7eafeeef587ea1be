//! Random command sequences through the real server, checked reply by reply against a small
//! in-process model of memcached's semantics (the arena is sized so nothing is evicted).

mod common;

use std::collections::HashMap;

use common::server::{arith_extras, frame, set_extras, Client, Response, Server};
use common::{for_each_seed, Rng};

#[derive(Clone, Debug)]
struct Item {
    value: Vec<u8>,
    flags: u32,
    cas: u64,
}

#[derive(Default)]
struct Model {
    items: HashMap<Vec<u8>, Item>,
}

const OK: u16 = 0;
const NOT_FOUND: u16 = 1;
const EXISTS: u16 = 2;
const NOT_STORED: u16 = 5;
const NON_NUMERIC: u16 = 6;

/// memcached's reading of a counter: leading digits, then the end or a space (a counter
/// shortened in place is padded with spaces, and an APPEND may follow them).
fn counter(value: &[u8]) -> Option<u64> {
    let digits = value.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 20 || value.get(digits).is_some_and(|&b| b != b' ') {
        return None;
    }
    std::str::from_utf8(&value[..digits]).ok()?.parse().ok()
}

/// Picks a CAS to send: none, the right one, or a wrong one.
fn pick_cas(rng: &mut Rng, model: &Model, key: &[u8]) -> u64 {
    match rng.below(4) {
        0 => model.items.get(key).map_or(12345, |i| i.cas),
        1 => 0xdead_0000 + rng.below(100),
        _ => 0,
    }
}

fn step(rng: &mut Rng, c: &mut Client, model: &mut Model, step: usize) {
    let key = format!("k{}", rng.below(24)).into_bytes();
    let value_len = if rng.chance(10) {
        rng.below(3000)
    } else {
        rng.below(64)
    } as usize;
    let value: Vec<u8> = if rng.chance(20) {
        rng.below(1000).to_string().into_bytes()
    } else {
        (0..value_len).map(|_| b'a' + rng.below(26) as u8).collect()
    };
    let flags = rng.below(1 << 32) as u32;
    let ctx = |r: &Response| {
        format!(
            "step {step} key {} reply {r:?}",
            String::from_utf8_lossy(&key)
        )
    };
    match rng.below(9) {
        // SET / ADD / REPLACE, with or without CAS.
        0..=2 => {
            let opcode = [0x01u8, 0x02, 0x03][rng.below(3) as usize];
            let cas = pick_cas(rng, model, &key);
            let r = c.call(&frame(
                opcode,
                &set_extras(flags, 0),
                &key,
                &value,
                cas,
                step as u32,
            ));
            let existing = model.items.get(&key);
            let expected = match (cas, existing) {
                (0, Some(_)) if opcode == 0x02 => EXISTS,
                (0, None) if opcode == 0x03 => NOT_FOUND,
                (0, _) => OK,
                (_, None) => NOT_FOUND,
                (cas, Some(item)) if item.cas != cas => EXISTS,
                _ => OK,
            };
            assert_eq!(r.status, expected, "{}", ctx(&r));
            if r.status == OK {
                model.items.insert(
                    key.clone(),
                    Item {
                        value,
                        flags,
                        cas: r.cas,
                    },
                );
            }
        }
        // APPEND / PREPEND.
        3 => {
            let append = rng.chance(50);
            let cas = pick_cas(rng, model, &key);
            let r = c.call(&frame(
                if append { 0x0e } else { 0x0f },
                &[],
                &key,
                &value,
                cas,
                step as u32,
            ));
            let expected = match model.items.get(&key) {
                None => NOT_STORED,
                Some(item) if cas != 0 && item.cas != cas => EXISTS,
                Some(_) => OK,
            };
            assert_eq!(r.status, expected, "{}", ctx(&r));
            if r.status == OK {
                let item = model.items.get_mut(&key).unwrap();
                item.value = if append {
                    [&item.value[..], &value[..]].concat()
                } else {
                    [&value[..], &item.value[..]].concat()
                };
                item.cas = r.cas;
            }
        }
        // GET / GETK.
        4 | 5 => {
            let with_key = rng.chance(50);
            let r = c.call(&frame(
                if with_key { 0x0c } else { 0x00 },
                &[],
                &key,
                &[],
                0,
                step as u32,
            ));
            match model.items.get(&key) {
                Some(item) => {
                    assert_eq!(
                        (r.status, &r.value, r.flags(), r.cas),
                        (OK, &item.value, item.flags, item.cas),
                        "{}",
                        ctx(&r)
                    );
                    assert_eq!(r.key, if with_key { key.clone() } else { Vec::new() });
                }
                None => assert_eq!(r.status, NOT_FOUND, "{}", ctx(&r)),
            }
        }
        // DELETE.
        6 => {
            let cas = pick_cas(rng, model, &key);
            let r = c.call(&frame(0x04, &[], &key, &[], cas, step as u32));
            let expected = match model.items.get(&key) {
                None => NOT_FOUND,
                Some(item) if cas != 0 && item.cas != cas => EXISTS,
                Some(_) => OK,
            };
            assert_eq!(r.status, expected, "{}", ctx(&r));
            if r.status == OK {
                model.items.remove(&key);
            }
        }
        // INCR / DECR.
        7 => {
            let incr = rng.chance(50);
            let delta = if rng.chance(10) {
                u64::MAX - rng.below(10)
            } else {
                rng.below(100)
            };
            let initial = rng.below(1000);
            let create = rng.chance(50);
            let expiry = if create { 0 } else { 0xffff_ffff };
            let cas = pick_cas(rng, model, &key);
            let r = c.call(&frame(
                if incr { 0x05 } else { 0x06 },
                &arith_extras(delta, initial, expiry),
                &key,
                &[],
                cas,
                step as u32,
            ));
            match model.items.get(&key).cloned() {
                None if !create => assert_eq!(r.status, NOT_FOUND, "{}", ctx(&r)),
                None => {
                    assert_eq!((r.status, r.counter()), (OK, initial), "{}", ctx(&r));
                    model.items.insert(
                        key.clone(),
                        Item {
                            value: initial.to_string().into_bytes(),
                            flags: 0,
                            cas: r.cas,
                        },
                    );
                }
                Some(item) if cas != 0 && item.cas != cas => {
                    assert_eq!(r.status, EXISTS, "{}", ctx(&r))
                }
                Some(item) => match counter(&item.value) {
                    None => assert_eq!(r.status, NON_NUMERIC, "{}", ctx(&r)),
                    Some(current) => {
                        let next = if incr {
                            current.wrapping_add(delta)
                        } else {
                            current.saturating_sub(delta)
                        };
                        assert_eq!((r.status, r.counter()), (OK, next), "{}", ctx(&r));
                        // memcached rewrites a shorter number in place, padded with spaces.
                        let mut value = next.to_string().into_bytes();
                        if value.len() < item.value.len() {
                            value.resize(item.value.len(), b' ');
                        }
                        model.items.insert(
                            key.clone(),
                            Item {
                                value,
                                flags: item.flags,
                                cas: r.cas,
                            },
                        );
                    }
                },
            }
        }
        // TOUCH / GAT.
        _ => {
            let gat = rng.chance(50);
            let r = c.call(&frame(
                if gat { 0x1d } else { 0x1c },
                &0u32.to_be_bytes(),
                &key,
                &[],
                0,
                step as u32,
            ));
            match model.items.get(&key) {
                Some(item) => {
                    assert_eq!(
                        (r.status, r.flags(), r.cas),
                        (OK, item.flags, item.cas),
                        "{}",
                        ctx(&r)
                    );
                    assert_eq!(r.value, if gat { item.value.clone() } else { Vec::new() });
                }
                None => assert_eq!(r.status, NOT_FOUND, "{}", ctx(&r)),
            }
        }
    }
}

#[test]
fn server_matches_the_memcached_model() {
    let server = Server::start(&["--threads", "2", "--memory", "64M"]);
    let mut c = server.client();
    let seeds: u64 = std::env::var("HEADROOM_MODEL_SEEDS").map_or(20, |s| s.parse().unwrap());
    for_each_seed("server_model", seeds, |seed| {
        let mut rng = Rng::new(seed);
        let mut model = Model::default();
        assert_eq!(
            c.call(&frame(0x08, &[], &[], &[], 0, 0)).status,
            OK,
            "flush between seeds"
        );
        for i in 0..1500 {
            step(&mut rng, &mut c, &mut model, i);
        }
    });
    assert_eq!(
        c.stat("", "evictions"),
        0,
        "the model assumes nothing is evicted"
    );
}
