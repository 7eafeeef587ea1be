//! The replies a connection's pass composes, and the one way a command reaches its key's
//! partition. Every protocol runs a keyed command the same way ([`Replies::run`]): lock the
//! key's partition, run the command through the executor (the protocol's reply is appended,
//! and a value may come back to send in place), let go of the lock, free the extents the store
//! let go of, and keep the value in its place among the replies.

use std::rc::Rc;

use crate::command::Command;

use super::deferred::Held;
use super::execute::{self, Deferred, Reply, Run};
use crate::server::shard::ctx::ShardCtx;

/// Replies gathered before they are written, so a pipeline of large GETs stays bounded.
pub(crate) const OUTPUT_CAP_BYTES: usize = 1 << 20;

/// The replies of one pass, in request order: their bytes, and the values the connection sends
/// itself (lent from the arena, or streamed from a segment) at their offsets in those bytes.
#[derive(Default)]
pub(crate) struct Replies {
    pub(crate) out: Vec<u8>,
    /// Values sent in place, each at its offset in `out` (each lease or pin ends when it is
    /// dropped).
    pub(crate) held: Vec<(usize, Held)>,
    /// Bytes `held` keeps in RAM until sent (they count against the output cap).
    pub(crate) held_bytes: usize,
}

impl Replies {
    /// Whether the pass should stop and write before running more requests.
    pub(crate) fn full(&self) -> bool {
        self.out.len() + self.held_bytes > OUTPUT_CAP_BYTES
    }

    /// Whether no reply is waiting (a `watch` or a metadump must come first in its pass).
    pub(crate) fn is_empty(&self) -> bool {
        self.out.is_empty() && self.held.is_empty()
    }

    /// Keeps a value the connection sends itself in its place among the replies (`out`'s
    /// end); a lent value is followed by `lent_suffix` (the text protocols' `\r\n` after a data
    /// block).
    fn hold(&mut self, ctx: &Rc<ShardCtx>, part: Option<Deferred>, lent_suffix: &[u8]) {
        let Some(part) = part else {
            return;
        };
        let lent = matches!(part, Deferred::Lent(_));
        let part = Held::new(ctx, part);
        self.held_bytes += part.held_bytes();
        self.held.push((self.out.len(), part));
        if lent {
            self.out.extend_from_slice(lent_suffix);
        }
    }

    /// Runs a keyed command: locks its key's partition, runs it through the executor with
    /// `reply` writing its answer, lets go of the lock, frees the extents the store let go
    /// of, and keeps a value sent in place in its order among the replies. A found value is
    /// lent rather than copied from `lend_from` bytes (none once one output cap of bytes is
    /// held).
    pub(crate) fn run<R: Reply>(
        &mut self,
        ctx: &Rc<ShardCtx>,
        command: &Command<'_>,
        (now, fd): (u32, i32),
        lend_from: Option<usize>,
        reply: &mut R,
    ) {
        let lend_from = lend_from.filter(|_| self.held_bytes <= OUTPUT_CAP_BYTES);
        let key = command
            .key()
            .expect("commands that name no key run in exec::control");
        let (owner, mut store) = ctx.shared.partitions.lock_key(key);
        let how = Run {
            owner,
            now,
            lend_from,
            watchers: &ctx.shared.watchers,
            fd,
        };
        let part = execute::run(&mut store, command, how, &mut self.out, reply);
        // (A lookup that finds a large item expired frees its extents, too.)
        let frees = store.take_pending_frees();
        drop(store);
        ctx.free_extents(frees);
        self.hold(ctx, part, R::VALUE_END);
    }
}
