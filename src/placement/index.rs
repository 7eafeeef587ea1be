//! The ordered indexes the placer keeps current on every allocate, free, claim, mount, unmount
//! and status change, so that no request walks every target: per locality group its active
//! targets in classes of equal key (largest free region; free ratio under `free_ratio_first`)
//! ordered by key, and as a dense list for uniform sampling under `random`. Multisets keep the
//! granules of every mounted target (a request's rounding) and the largest holes of draining
//! ones (with the groups' top keys, a failure's largest hole).
//!
//! Why classes and not one B-tree of (key, id): many targets tie (empty targets are all one
//! size), and a tie is broken inside its class: by the lowest id under best fit (the first set
//! bit from the start: one or two words that every such placement reads, so they stay warm),
//! by a seeded rotation of the id order under the comparators (a random member). In a B-tree of
//! 10,000 entries a random member is a walk down five cold nodes, twice (the lookup, then the
//! removal when the target's key changes): about 1.6 µs of cache misses here against 0.15 µs
//! for one word of a bitset. So a class of many members is a bitset over ids, one of few a
//! sorted vector, and the keys themselves (few distinct ones when many targets tie) stay in a
//! small B-tree.

use std::collections::BTreeMap;

use super::TargetId;

/// A multiset of keys (each key's count), for a maximum over many targets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Multiset(BTreeMap<u64, u32>);

impl Multiset {
    pub(super) fn insert(&mut self, key: u64) {
        *self.0.entry(key).or_default() += 1;
    }

    pub(super) fn remove(&mut self, key: u64) {
        let count = self.0.get_mut(&key).expect("the multiset holds the key");
        *count -= 1;
        if *count == 0 {
            self.0.remove(&key);
        }
    }

    pub(super) fn replace(&mut self, old: u64, new: u64) {
        if old != new {
            self.remove(old);
            self.insert(new);
        }
    }

    pub(super) fn max(&self) -> Option<u64> {
        self.0.last_key_value().map(|(&key, _)| key)
    }
}

/// One locality group's active targets (draining ones are taken out, so they cost nothing to
/// skip).
#[derive(Clone, Debug, Default)]
pub(super) struct GroupIndex {
    /// By largest free region: best fit, largest hole first, eviction candidates.
    pub(super) by_hole: Classes,
    /// By free ratio (`f64` bits: non-negative floats order as their bits); kept only under
    /// `free_ratio_first`.
    pub(super) by_ratio: Classes,
    /// Dense, in no order: uniform sampling under `random` (a target knows its slot).
    pub(super) members: Vec<TargetId>,
}

/// Where `id` comes in the seeded rotation of the id order that breaks ties: ids from the pivot
/// up, then from 0 up to the pivot.
pub(super) fn rotation(id: TargetId, pivot: TargetId) -> (bool, u32) {
    (id < pivot, id.0)
}

/// A class of more members than this becomes a bitset...
const FEW_MAX: usize = 64;
/// ... and a bitset of fewer than this a sorted vector again. A bitset spans the ids up to its
/// largest member, so at most S / `MANY_MIN` of them take at most S / 8 bytes each.
const MANY_MIN: usize = 32;

/// Targets ordered by (key, id), kept as classes of equal key.
#[derive(Clone, Debug, Default)]
pub(super) struct Classes {
    by_key: BTreeMap<u64, Members>,
    len: usize,
}

impl Classes {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn insert(&mut self, key: u64, id: TargetId) -> bool {
        let fresh = self.by_key.entry(key).or_default().insert(id);
        self.len += usize::from(fresh);
        fresh
    }

    pub(super) fn remove(&mut self, key: u64, id: TargetId) -> bool {
        let Some(members) = self.by_key.get_mut(&key) else {
            return false;
        };
        let was = members.remove(id);
        if members.is_empty() {
            self.by_key.remove(&key);
        }
        self.len -= usize::from(was);
        was
    }

    pub(super) fn contains(&self, key: u64, id: TargetId) -> bool {
        self.by_key.get(&key).is_some_and(|m| m.contains(id))
    }

    pub(super) fn max_key(&self) -> Option<u64> {
        self.by_key.last_key_value().map(|(&key, _)| key)
    }

    /// From the smallest class at or above `from` up: the first class with a member `ok`
    /// accepts, and its lowest such member. O(log K) for K distinct keys, plus the members `ok`
    /// turns down on the way.
    pub(super) fn lowest_from(
        &self,
        from: u64,
        mut ok: impl FnMut(TargetId) -> bool,
    ) -> Option<(u64, TargetId)> {
        self.by_key
            .range(from..)
            .find_map(|(&key, m)| Some((key, m.iter().find(|&id| ok(id))?)))
    }

    /// From the highest class down (never below `floor`): the first class with a member `ok`
    /// accepts, and that member in rotation order.
    pub(super) fn highest_down_to(
        &self,
        floor: u64,
        pivot: TargetId,
        mut ok: impl FnMut(TargetId) -> bool,
    ) -> Option<(u64, TargetId)> {
        self.by_key
            .range(floor..)
            .rev()
            .find_map(|(&key, m)| Some((key, m.first_in_rotation(pivot, &mut ok)?)))
    }

    /// Every member of the classes at or above `from`, in (key, id) order.
    pub(super) fn ids_from(&self, from: u64) -> impl Iterator<Item = TargetId> + '_ {
        self.by_key.range(from..).flat_map(|(_, m)| m.iter())
    }

    /// Every member in descending (key, id) order.
    pub(super) fn ids_descending(&self) -> impl Iterator<Item = TargetId> + '_ {
        self.by_key.values().rev().flat_map(|m| {
            let mut ids: Vec<TargetId> = m.iter().collect();
            ids.reverse();
            ids
        })
    }
}

/// The members of one class.
#[derive(Clone, Debug)]
enum Members {
    /// The common class of one target (each partly used target's largest hole differs), kept
    /// without an allocation.
    One(TargetId),
    /// Sorted, none or two to `FEW_MAX`.
    Few(Vec<TargetId>),
    Many(Bitset),
}

impl Default for Members {
    fn default() -> Members {
        Members::Few(Vec::new())
    }
}

impl Members {
    fn is_empty(&self) -> bool {
        match self {
            Members::One(_) => false,
            Members::Few(ids) => ids.is_empty(),
            Members::Many(bits) => bits.len == 0,
        }
    }

    fn contains(&self, id: TargetId) -> bool {
        match self {
            Members::One(one) => *one == id,
            Members::Few(ids) => ids.binary_search(&id).is_ok(),
            Members::Many(bits) => bits.contains(id.0),
        }
    }

    fn insert(&mut self, id: TargetId) -> bool {
        match self {
            Members::One(one) => {
                if *one == id {
                    return false;
                }
                let (a, b) = (id.min(*one), id.max(*one));
                *self = Members::Few(vec![a, b]);
                true
            }
            Members::Few(ids) if ids.is_empty() => {
                *self = Members::One(id);
                true
            }
            Members::Few(ids) => {
                let Err(at) = ids.binary_search(&id) else {
                    return false;
                };
                ids.insert(at, id);
                if ids.len() > FEW_MAX {
                    let mut bits = Bitset::default();
                    ids.iter().for_each(|id| bits.insert(id.0));
                    *self = Members::Many(bits);
                }
                true
            }
            Members::Many(bits) => {
                if bits.contains(id.0) {
                    return false;
                }
                bits.insert(id.0);
                true
            }
        }
    }

    fn remove(&mut self, id: TargetId) -> bool {
        match self {
            Members::One(one) => {
                if *one != id {
                    return false;
                }
                *self = Members::Few(Vec::new());
                true
            }
            Members::Few(ids) => match ids.binary_search(&id) {
                Ok(at) => {
                    ids.remove(at);
                    if let [last] = ids[..] {
                        *self = Members::One(last);
                    }
                    true
                }
                Err(_) => false,
            },
            Members::Many(bits) => {
                if !bits.contains(id.0) {
                    return false;
                }
                bits.remove(id.0);
                if bits.len < MANY_MIN {
                    let ids = self.iter().collect();
                    *self = Members::Few(ids);
                }
                true
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = TargetId> + '_ {
        let (few, many) = match self {
            Members::One(one) => (Some(std::slice::from_ref(one).iter().copied()), None),
            Members::Few(ids) => (Some(ids.iter().copied()), None),
            Members::Many(bits) => (None, Some(bits.iter_from(0).map(TargetId))),
        };
        few.into_iter().flatten().chain(many.into_iter().flatten())
    }

    /// The first member `ok` accepts in rotation order (from `pivot` up, then from 0).
    fn first_in_rotation(
        &self,
        pivot: TargetId,
        ok: &mut impl FnMut(TargetId) -> bool,
    ) -> Option<TargetId> {
        match self {
            Members::One(one) => Some(*one).filter(|&id| ok(id)),
            Members::Few(ids) => {
                let at = ids.partition_point(|&id| id < pivot);
                ids[at..]
                    .iter()
                    .chain(&ids[..at])
                    .copied()
                    .find(|&id| ok(id))
            }
            Members::Many(bits) => bits
                .iter_from(pivot.0)
                .chain(bits.iter_from(0).take_while(|&id| id < pivot.0))
                .map(TargetId)
                .find(|&id| ok(id)),
        }
    }
}

/// A set of ids as bits, with a summary bit per word that is not zero: membership in one word,
/// the next member after any id in one word more (the summary is S / 4096 words).
#[derive(Clone, Debug, Default)]
struct Bitset {
    words: Vec<u64>,
    summary: Vec<u64>,
    len: usize,
}

impl Bitset {
    fn contains(&self, id: u32) -> bool {
        let (w, b) = (id as usize / 64, id % 64);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    fn insert(&mut self, id: u32) {
        let (w, b) = (id as usize / 64, id % 64);
        if w >= self.words.len() {
            self.words.resize(w + 1, 0);
            self.summary.resize(w / 64 + 1, 0);
        }
        debug_assert_eq!(self.words[w] & (1 << b), 0);
        self.words[w] |= 1 << b;
        self.summary[w / 64] |= 1 << (w % 64);
        self.len += 1;
    }

    fn remove(&mut self, id: u32) {
        let (w, b) = (id as usize / 64, id % 64);
        debug_assert_ne!(self.words[w] & (1 << b), 0);
        self.words[w] &= !(1 << b);
        if self.words[w] == 0 {
            self.summary[w / 64] &= !(1 << (w % 64));
        }
        self.len -= 1;
    }

    /// The smallest member at or above `from`.
    fn next_from(&self, from: u32) -> Option<u32> {
        let w = from as usize / 64;
        let word = self.words.get(w)? & (u64::MAX << (from % 64));
        if word != 0 {
            return Some((w * 64) as u32 + word.trailing_zeros());
        }
        // The next word that is not zero, through the summary.
        let next = w + 1;
        let mut s = next / 64;
        let mut mask = u64::MAX.checked_shl((next % 64) as u32).unwrap_or(0);
        while s < self.summary.len() {
            let bits = self.summary[s] & mask;
            if bits != 0 {
                let w = s * 64 + bits.trailing_zeros() as usize;
                return Some((w * 64) as u32 + self.words[w].trailing_zeros());
            }
            s += 1;
            mask = u64::MAX;
        }
        None
    }

    fn iter_from(&self, from: u32) -> impl Iterator<Item = u32> + '_ {
        let mut at = Some(from);
        std::iter::from_fn(move || {
            let id = self.next_from(at?)?;
            at = id.checked_add(1);
            Some(id)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Classes against a plain ordered set of (key, id), across the few/many threshold.
    #[test]
    fn classes_agree_with_an_ordered_set() {
        let mut state = 7u64;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n
        };
        let mut classes = Classes::default();
        let mut model: BTreeSet<(u64, TargetId)> = BTreeSet::new();
        for step in 0..40_000 {
            let key = next(4);
            let id = TargetId(next(if step % 5000 < 2500 { 300 } else { 5000 }) as u32);
            if next(100) < 55 {
                assert_eq!(classes.insert(key, id), model.insert((key, id)));
            } else {
                assert_eq!(classes.remove(key, id), model.remove(&(key, id)));
            }
            assert_eq!(classes.len(), model.len());
            if step % 97 == 0 {
                let ids: Vec<TargetId> = model.iter().map(|&(_, id)| id).collect();
                assert_eq!(classes.ids_from(0).collect::<Vec<_>>(), ids);
                let desc: Vec<TargetId> = model.iter().rev().map(|&(_, id)| id).collect();
                assert_eq!(classes.ids_descending().collect::<Vec<_>>(), desc);
            }
            let (from, pivot) = (next(5), TargetId(next(5200) as u32));
            let skip = next(7);
            let ok = |id: TargetId| id.0 % 7 != skip as u32;
            let expected_lowest = model
                .range((from, TargetId(0))..)
                .find(|&&(_, id)| ok(id))
                .copied();
            assert_eq!(
                classes.lowest_from(from, ok),
                expected_lowest,
                "step {step}"
            );
            let expected_high = model
                .iter()
                .rev()
                .filter(|&&(key, _)| key >= from)
                .find(|&&(_, id)| ok(id))
                .map(|&(key, _)| {
                    let pick = model
                        .range((key, TargetId(0))..=(key, TargetId(u32::MAX)))
                        .map(|&(_, id)| id)
                        .filter(|&id| ok(id))
                        .min_by_key(|&id| rotation(id, pivot))
                        .unwrap();
                    (key, pick)
                });
            assert_eq!(classes.highest_down_to(from, pivot, ok), expected_high);
            assert_eq!(classes.max_key(), model.last().map(|&(key, _)| key));
        }
    }
}
