//! Reply parts a connection sends itself, in their place among its other replies: large
//! values (streamed from their segment) and values lent zero-copy from the arena. Each holds
//! something in its partition (a lease, a pin) that ends when it is dropped, sent or not: the
//! end takes the partition's lock, from whichever core the connection is on.

use std::rc::Rc;

use crate::arena::SendPin;
use crate::lent::Lent;

use super::execute::{Deferred, LargeGet, LentGet};
use crate::server::shard::ctx::ShardCtx;

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

    /// The pinned bytes' length (a pin is never empty: `is_empty` would always say no).
    #[allow(clippy::len_without_is_empty)]
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
pub(crate) fn unpin(ctx: &Rc<ShardCtx>, owner: usize, pin: SendPin) {
    ctx.shared.partitions.lock(owner).unpin_sent(pin);
}

/// Ends a large GET's lease in its partition; extents freed meanwhile go to the master.
pub fn release(ctx: &Rc<ShardCtx>, get: &LargeGet) {
    let Some(lease) = get.hit.lease else {
        return;
    };
    let frees = {
        let mut store = ctx.shared.partitions.lock(get.owner);
        store.release_lease(lease);
        store.take_pending_frees()
    };
    ctx.free_extents(frees);
}

/// A large GET waiting to be streamed: its lease ends when this is dropped, whether the value
/// was sent or the connection died first.
pub struct HeldLarge {
    pub(crate) get: LargeGet,
    ctx: Rc<ShardCtx>,
}

impl HeldLarge {
    pub fn new(ctx: &Rc<ShardCtx>, get: LargeGet) -> HeldLarge {
        HeldLarge {
            get,
            ctx: Rc::clone(ctx),
        }
    }

    /// Head bytes held in memory for it (copied, or pinned in the owner's arena).
    pub fn head_bytes(&self) -> usize {
        self.get.head_len()
    }
}

impl Drop for HeldLarge {
    fn drop(&mut self) {
        if let Some(pin) = self.get.head_pin.take() {
            unpin(&self.ctx, self.get.owner, pin);
        }
        release(&self.ctx, &self.get);
    }
}
