//! The commands that name no key, run once for every protocol: the codec decodes NOOP, VERSION,
//! VERBOSITY, FLUSH, STAT and QUIT into their [`Command`], this runs it against the server, and
//! the codec writes what it did in its protocol's words.

use crate::command::Command;
use crate::server::shard::ctx::ShardCtx;
use crate::server::shard::shared::flush_all;

use super::stats::group_pairs;

/// What a command that names no key did.
#[derive(Debug)]
pub enum ControlOutcome<'c> {
    /// NOOP, VERBOSITY, FLUSH: done.
    Done,
    /// VERSION: the version the server gives.
    Version(&'c str),
    /// STAT: the group's figures, or `None` for a group there is none of.
    Stats(Option<Vec<(String, String)>>),
    /// QUIT: the connection closes after the replies before it.
    Quit,
}

/// Runs `command`, which names no key, at `now` (Unix seconds). `None` for a keyed command:
/// those run against their partition (`replies.rs`).
pub async fn run<'c>(
    ctx: &'c ShardCtx,
    command: &Command<'_>,
    now: u32,
) -> Option<ControlOutcome<'c>> {
    Some(match *command {
        Command::Noop | Command::Verbosity => ControlOutcome::Done,
        Command::Version => ControlOutcome::Version(&ctx.shared.version),
        Command::Flush { delay } => {
            ctx.counters.borrow_mut().cmd_flush += 1;
            flush_all(&ctx.shared, delay, now);
            ControlOutcome::Done
        }
        Command::Stats { group } => ControlOutcome::Stats(group_pairs(ctx, group).await),
        Command::Quit => ControlOutcome::Quit,
        _ => return None,
    })
}
