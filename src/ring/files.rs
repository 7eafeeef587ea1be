//! Which socket sits in which slot of a ring's registered-file table, so an operation on a
//! connection names its slot (`IOSQE_FIXED_FILE`) and the kernel skips the descriptor lookup
//! and the reference count it takes and drops for every operation on a plain descriptor.
//!
//! Only bookkeeping lives here; [`super::Ring`] makes the `io_uring_register` calls this
//! table asks for. The rule that makes it safe: a slot is emptied and handed to another
//! socket only once no operation that names it is in flight or queued. An operation queued
//! for a closed connection and submitted after its slot went to a new one would otherwise
//! reach the new connection's socket.

use std::os::fd::RawFd;

/// No slot, in [`FileTable`]'s by-descriptor index.
const NO_SLOT: u32 = u32::MAX;

/// The state of every slot of one ring's table.
#[derive(Debug)]
pub struct FileTable {
    /// The slot of each registered descriptor, indexed by descriptor (they are small and dense,
    /// and this is looked up for every operation).
    by_fd: Vec<u32>,
    registered: usize,
    /// Operations in flight (or queued) that name each slot.
    ops: Vec<u32>,
    /// Slots whose descriptor was unregistered while operations on it were in flight: emptied
    /// when the last one completes.
    retiring: Vec<bool>,
    /// Empty slots, ready for a descriptor.
    free: Vec<u32>,
}

impl FileTable {
    /// A table of `slots` empty slots.
    pub fn new(slots: u32) -> FileTable {
        FileTable {
            by_fd: Vec::new(),
            registered: 0,
            ops: vec![0; slots as usize],
            retiring: vec![false; slots as usize],
            // Popped from the end: slot 0 first.
            free: (0..slots).rev().collect(),
        }
    }

    /// The slot `fd` is registered in.
    pub fn slot(&self, fd: RawFd) -> Option<u32> {
        let slot = *self.by_fd.get(usize::try_from(fd).ok()?)?;
        (slot != NO_SLOT).then_some(slot)
    }

    fn set_slot(&mut self, fd: RawFd, slot: u32) -> u32 {
        let at = usize::try_from(fd).expect("a descriptor");
        if self.by_fd.len() <= at {
            self.by_fd.resize(at + 1, NO_SLOT);
        }
        std::mem::replace(&mut self.by_fd[at], slot)
    }

    /// Gives `fd` an empty slot, for the caller to fill; `None` when every slot is taken.
    pub fn assign(&mut self, fd: RawFd) -> Option<u32> {
        assert!(self.slot(fd).is_none(), "descriptor {fd} registered twice");
        let slot = self.free.pop()?;
        debug_assert!(self.ops[slot as usize] == 0 && !self.retiring[slot as usize]);
        self.set_slot(fd, slot);
        self.registered += 1;
        Some(slot)
    }

    /// Takes back a slot [`FileTable::assign`] gave but the caller could not fill.
    pub fn unassign(&mut self, fd: RawFd) {
        let slot = self.set_slot(fd, NO_SLOT);
        assert_ne!(slot, NO_SLOT, "an assigned descriptor");
        self.registered -= 1;
        assert_eq!(
            self.ops[slot as usize], 0,
            "an unfilled slot had operations"
        );
        self.free.push(slot);
    }

    /// Unregisters `fd`: returns its slot if it is to be emptied now (then
    /// [`FileTable::emptied`]), or parks it until its last operation completes.
    pub fn unregister(&mut self, fd: RawFd) -> Option<u32> {
        self.slot(fd)?;
        let slot = self.set_slot(fd, NO_SLOT);
        self.registered -= 1;
        if self.ops[slot as usize] == 0 {
            Some(slot)
        } else {
            self.retiring[slot as usize] = true;
            None
        }
    }

    /// An operation naming `slot` was queued.
    pub fn op_started(&mut self, slot: u32) {
        assert!(
            !self.retiring[slot as usize],
            "an operation on an unregistered slot"
        );
        self.ops[slot as usize] += 1;
    }

    /// An operation naming `slot` completed for the last time. Returns the slot if it is now
    /// to be emptied (its descriptor was unregistered meanwhile).
    pub fn op_finished(&mut self, slot: u32) -> Option<u32> {
        let ops = &mut self.ops[slot as usize];
        *ops = ops
            .checked_sub(1)
            .expect("an operation counted at its start");
        (*ops == 0 && std::mem::take(&mut self.retiring[slot as usize])).then_some(slot)
    }

    /// `slot` has been emptied in the kernel: it may go to another descriptor.
    pub fn emptied(&mut self, slot: u32) {
        assert!(
            self.ops[slot as usize] == 0 && !self.retiring[slot as usize],
            "slot {slot} emptied while in use"
        );
        debug_assert!(!self.free.contains(&slot) && !self.by_fd.contains(&slot));
        self.free.push(slot);
    }

    /// Descriptors registered now.
    pub fn registered(&self) -> usize {
        self.registered
    }

    /// Checks that every slot is in exactly one state: free, a descriptor's, retiring, or
    /// (between [`FileTable::unregister`] or [`FileTable::op_finished`] and
    /// [`FileTable::emptied`]) on its way to being emptied, which the caller passes as
    /// `emptying`.
    #[cfg(test)]
    fn check(&self, emptying: &[u32], ctx: &str) {
        let mut owners = vec![0u32; self.ops.len()];
        let held = self.by_fd.iter().filter(|&&slot| slot != NO_SLOT);
        assert_eq!(
            held.clone().count(),
            self.registered,
            "{ctx}: registered count"
        );
        for &slot in self.free.iter().chain(held).chain(emptying) {
            owners[slot as usize] += 1;
        }
        for (slot, retiring) in self.retiring.iter().enumerate() {
            owners[slot] += u32::from(*retiring);
            if *retiring {
                assert!(
                    self.ops[slot] > 0,
                    "slot {slot} retiring with nothing in flight"
                );
            }
        }
        for &slot in &self.free {
            assert_eq!(
                self.ops[slot as usize], 0,
                "free slot {slot} has operations"
            );
        }
        for (slot, owners) in owners.iter().enumerate() {
            assert_eq!(*owners, 1, "{ctx}: slot {slot} is in {owners} states");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::rng::Rng;

    /// A model of connections coming and going with operations in flight, against the table:
    /// no slot is ever emptied or reused while an operation names it, and none is lost.
    #[test]
    fn slots_are_reused_only_when_nothing_names_them() {
        for seed in 0..200u64 {
            run(seed);
        }
    }

    fn run(seed: u64) {
        let mut rng = Rng::new(seed);
        const SLOTS: u32 = 8;
        let mut table = FileTable::new(SLOTS);
        // Model: live connections (fd -> slot, if registered), and operations in flight, each
        // naming the slot its connection had when it was queued.
        let mut live: Vec<(RawFd, Option<u32>)> = Vec::new();
        let mut in_flight: Vec<u32> = Vec::new();
        let mut next_fd: RawFd = 10;
        for step in 0..2_000 {
            let ctx = format!("seed {seed} step {step}");
            match rng.below(5) {
                0 if live.len() < 12 => {
                    // Descriptor numbers are reused once closed, as the kernel does.
                    let fd = if rng.chance(50) {
                        (10..next_fd)
                            .find(|fd| !live.iter().any(|(l, _)| l == fd))
                            .unwrap_or(next_fd)
                    } else {
                        next_fd
                    };
                    next_fd = next_fd.max(fd + 1);
                    let slot = table.assign(fd);
                    if slot.is_none() {
                        assert!(table.free.is_empty(), "{ctx}: refused with a slot free");
                    }
                    if let Some(slot) = slot {
                        assert!(!in_flight.contains(&slot), "{ctx}: slot {slot} reused");
                        if rng.chance(10) {
                            table.unassign(fd);
                            live.push((fd, None));
                            continue;
                        }
                    }
                    live.push((fd, slot));
                }
                1 if !live.is_empty() => {
                    let (fd, slot) = live[rng.below(live.len() as u64) as usize];
                    assert_eq!(table.slot(fd), slot, "{ctx}");
                    if let Some(slot) = slot {
                        table.op_started(slot);
                        in_flight.push(slot);
                    }
                }
                2 if !in_flight.is_empty() => {
                    let slot = in_flight.swap_remove(rng.below(in_flight.len() as u64) as usize);
                    if let Some(slot) = table.op_finished(slot) {
                        assert!(!in_flight.contains(&slot), "{ctx}: emptied in use");
                        table.check(&[slot], &ctx);
                        table.emptied(slot);
                    }
                }
                3 if !live.is_empty() => {
                    let (fd, slot) = live.swap_remove(rng.below(live.len() as u64) as usize);
                    let now = table.unregister(fd);
                    assert_eq!(table.slot(fd), None, "{ctx}");
                    match (slot, now) {
                        (Some(slot), Some(emptied)) => {
                            assert_eq!(slot, emptied, "{ctx}");
                            assert!(!in_flight.contains(&slot), "{ctx}: emptied in use");
                            table.check(&[slot], &ctx);
                            table.emptied(slot);
                        }
                        (Some(slot), None) => {
                            assert!(in_flight.contains(&slot), "{ctx}: parked with nothing");
                        }
                        (None, now) => assert_eq!(now, None, "{ctx}"),
                    }
                }
                _ => {}
            }
            table.check(&[], &ctx);
        }
    }
}
