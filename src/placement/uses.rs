//! Live extents in order of last use, per target, for LRU eviction plans (`--segment-eviction
//! lru`): every allocation records one, every free forgets one, every read of an object touches
//! one. So this is on the path of every placement, and is built to cost O(1) there without
//! allocating: the extents sit in one slab (a free list reuses its slots), each target's in a
//! doubly linked list through it, oldest first, and a hash map finds an extent's slot by
//! (target, offset). (It replaced two ordered maps, by (target, tick) and by (target, offset),
//! whose inserts and node splits and merges were most of a placement's cost, and most of its
//! tail when the process's heap was large: a new node came from cold memory.) The slab and the
//! map start with room for `RESERVED` extents, already written, and grow by doubling past that;
//! a doubling moves (and writes) every entry once, in the operation that crosses the line.

use std::collections::HashMap;

use foldhash::fast::RandomState as FastHash;

use super::TargetId;
use crate::segment::Extent;

/// No slot.
const NIL: u32 = u32::MAX;

/// Live extents there is room for from the start: the default 1 GiB segment holds 4,096
/// objects of the smallest large value (the default 256 KiB `--ram-head`). The room is written
/// once when the placer is made (about 300 KiB), so no placement takes a page fault for it.
const RESERVED: usize = 4096;

/// A slab slot: a live extent and its neighbours in its target's use order (or, free, the next
/// free slot in `next`).
#[derive(Clone, Copy, Debug)]
struct Node {
    extent: Extent,
    prev: u32,
    next: u32,
}

/// One target's use order: its least and most recently used extents.
#[derive(Clone, Copy, Debug)]
struct Ends {
    oldest: u32,
    newest: u32,
}

const EMPTY: Ends = Ends {
    oldest: NIL,
    newest: NIL,
};

#[derive(Clone, Debug)]
pub(super) struct Uses {
    nodes: Vec<Node>,
    /// The first free slot (the rest chained through `next`).
    free: u32,
    slot_of: HashMap<(TargetId, u64), u32, FastHash>,
    /// By target id.
    ends: Vec<Ends>,
}

impl Default for Uses {
    fn default() -> Uses {
        let mut uses = Uses {
            nodes: Vec::new(),
            free: NIL,
            slot_of: HashMap::with_capacity_and_hasher(RESERVED, FastHash::default()),
            ends: Vec::new(),
        };
        uses.grow_slab(RESERVED);
        // Write the map's whole table now, not page by page under later placements (a table
        // this size is fresh memory from the kernel): fill it, then empty it (emptying keeps
        // the table).
        for offset in 0..RESERVED as u64 {
            uses.slot_of.insert((TargetId(u32::MAX), offset), NIL);
        }
        uses.slot_of.clear();
        uses
    }
}

impl Uses {
    fn ends_mut(&mut self, id: TargetId) -> &mut Ends {
        let i = id.0 as usize;
        if i >= self.ends.len() {
            self.ends.resize(i + 1, EMPTY);
        }
        &mut self.ends[i]
    }

    /// Puts slot `at` at the back (most recent) of `id`'s order.
    fn push_newest(&mut self, id: TargetId, at: u32) {
        let ends = self.ends_mut(id);
        let last = ends.newest;
        ends.newest = at;
        if last == NIL {
            ends.oldest = at;
        }
        let node = &mut self.nodes[at as usize];
        node.prev = last;
        node.next = NIL;
        if last != NIL {
            self.nodes[last as usize].next = at;
        }
    }

    /// Takes slot `at` out of `id`'s order.
    fn unlink(&mut self, id: TargetId, at: u32) {
        let Node { prev, next, .. } = self.nodes[at as usize];
        match prev {
            NIL => self.ends[id.0 as usize].oldest = next,
            _ => self.nodes[prev as usize].next = next,
        }
        match next {
            NIL => self.ends[id.0 as usize].newest = prev,
            _ => self.nodes[next as usize].prev = prev,
        }
    }

    /// Adds `more` free slots, written now (a doubling writes its new half at once).
    fn grow_slab(&mut self, more: usize) {
        let start = self.nodes.len();
        self.nodes.reserve_exact(more);
        let free = self.free;
        self.nodes.extend((start..start + more).map(|i| Node {
            extent: Extent { offset: 0, len: 0 },
            prev: NIL,
            next: if i + 1 == start + more {
                free
            } else {
                (i + 1) as u32
            },
        }));
        self.free = start as u32;
    }

    fn release(&mut self, at: u32) {
        self.nodes[at as usize].next = self.free;
        self.free = at;
    }

    /// A new live extent, the most recently used of its target.
    pub(super) fn record(&mut self, id: TargetId, extent: Extent) {
        let node = Node {
            extent,
            prev: NIL,
            next: NIL,
        };
        if self.free == NIL {
            self.grow_slab(self.nodes.len().max(RESERVED));
        }
        let at = self.free;
        self.free = self.nodes[at as usize].next;
        self.nodes[at as usize] = node;
        let old = self.slot_of.insert((id, extent.offset), at);
        debug_assert!(
            old.is_none(),
            "{id}: extent at {} recorded twice",
            extent.offset
        );
        self.push_newest(id, at);
    }

    /// An extent freed (nothing if it is not live).
    pub(super) fn forget(&mut self, id: TargetId, offset: u64) {
        if let Some(at) = self.slot_of.remove(&(id, offset)) {
            self.unlink(id, at);
            self.release(at);
        }
    }

    /// Moves an extent to the back of its target's use order (nothing if it is not live).
    pub(super) fn touch(&mut self, id: TargetId, offset: u64) {
        let Some(&at) = self.slot_of.get(&(id, offset)) else {
            return;
        };
        if self.ends[id.0 as usize].newest != at {
            self.unlink(id, at);
            self.push_newest(id, at);
        }
    }

    /// A target's live extents, least recently used first.
    pub(super) fn oldest(&self, id: TargetId) -> impl Iterator<Item = &Extent> + '_ {
        let mut at = self.ends.get(id.0 as usize).map_or(NIL, |e| e.oldest);
        std::iter::from_fn(move || {
            let node = self.nodes.get(at as usize)?;
            at = node.next;
            Some(&node.extent)
        })
    }

    /// Forgets every extent of a target.
    pub(super) fn drop_target(&mut self, id: TargetId) {
        let offsets: Vec<u64> = self.oldest(id).map(|e| e.offset).collect();
        for offset in offsets {
            self.forget(id, offset);
        }
    }

    /// Live extents over every target.
    pub(super) fn len(&self) -> usize {
        self.slot_of.len()
    }

    /// Checks the lists against the map and the free list: every target's order is linked both
    /// ways and holds exactly the map's extents of that target, and every slot is either in one
    /// order or free.
    pub(super) fn check_invariants(&self) {
        let mut listed = 0;
        for (i, ends) in self.ends.iter().enumerate() {
            let id = TargetId(i as u32);
            let (mut prev, mut at) = (NIL, ends.oldest);
            while at != NIL {
                let node = &self.nodes[at as usize];
                assert_eq!(node.prev, prev, "{id}: use order linked one way only");
                assert_eq!(
                    self.slot_of.get(&(id, node.extent.offset)),
                    Some(&at),
                    "{id}: a listed extent the map does not know"
                );
                listed += 1;
                (prev, at) = (at, node.next);
            }
            assert_eq!(ends.newest, prev, "{id}: newest end");
        }
        assert_eq!(
            listed,
            self.slot_of.len(),
            "extents in the map and in no order"
        );
        let mut free = 0;
        let mut at = self.free;
        while at != NIL {
            free += 1;
            at = self.nodes[at as usize].next;
        }
        assert_eq!(
            listed + free,
            self.nodes.len(),
            "slots neither live nor free"
        );
    }
}
