//! Reply parts a connection sends itself, in their place among its other replies: large
//! values (streamed from their segment) and values lent zero-copy from the arena. Each holds
//! something in its partition (a lease, a pin) that ends when it is dropped, sent or not: the
//! end takes the partition's lock, from whichever core the connection is on.

use std::rc::Rc;

use crate::arena::SendPin;
use crate::lent::Lent;

use super::execute::{Deferred, LentGet};
use super::large::HeldLarge;
use super::shard::ShardCtx;

pub enum Held {
    Large(HeldLarge),
    Lent(HeldLent),
}

impl Held {
    pub fn new(ctx: &Rc<ShardCtx>, deferred: Deferred) -> Held {
        match deferred {
            Deferred::Large(get) => Held::Large(HeldLarge::new(ctx, get)),
            Deferred::Lent(get) => Held::Lent(HeldLent::new(ctx, get)),
        }
    }

    /// RAM this part holds until it is sent (it counts against the output cap).
    pub fn held_bytes(&self) -> usize {
        match self {
            Held::Large(large) => large.head_bytes(),
            Held::Lent(lent) => lent.len(),
        }
    }
}

/// A value pinned in its partition's arena for a zero-copy send.
pub struct HeldLent {
    pin: Option<SendPin>,
    owner: usize,
    ctx: Rc<ShardCtx>,
}

impl HeldLent {
    pub fn new(ctx: &Rc<ShardCtx>, get: LentGet) -> HeldLent {
        HeldLent {
            pin: Some(get.pin),
            owner: get.owner,
            ctx: Rc::clone(ctx),
        }
    }

    pub fn len(&self) -> usize {
        self.pin.as_ref().map_or(0, SendPin::len)
    }

    /// The pinned bytes, for a send; the pin ends when the kernel is done with them.
    pub fn into_lent(mut self) -> Lent {
        let pin = self.pin.take().expect("a held pin");
        let (ctx, owner) = (Rc::clone(&self.ctx), self.owner);
        pin.lend(move |pin| unpin(&ctx, owner, pin))
    }
}

impl Drop for HeldLent {
    fn drop(&mut self) {
        if let Some(pin) = self.pin.take() {
            unpin(&self.ctx, self.owner, pin);
        }
    }
}

/// Ends a send pin in the partition that made it.
pub(super) fn unpin(ctx: &Rc<ShardCtx>, owner: usize, pin: SendPin) {
    ctx.shared.partitions.lock(owner).unpin_sent(pin);
}
