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
    /// FLUSH with `--flush-all-command off`: refused, nothing flushed (memcached's `-F`).
    FlushRefused,
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
            // Counted refused too: memcached's text protocol does ("we log it on stats").
            ctx.counters.borrow_mut().cmd_flush += 1;
            if !ctx.shared.settings.commands.flush_all {
                return Some(ControlOutcome::FlushRefused);
            }
            flush_all(&ctx.shared, delay, now);
            ControlOutcome::Done
        }
        Command::Stats { group } => ControlOutcome::Stats(group_pairs(ctx, group).await),
        Command::Quit => ControlOutcome::Quit,
        _ => return None,
    })
}

/// The text command `shutdown` (`--shutdown-command on`): stops the server as SIGTERM does,
/// or as SIGUSR1 does when `graceful` (memcached's `shutdown graceful`; both stop gracefully
/// here). The signal goes to the process, whose signal thread is the one that takes it (every
/// other thread blocks it: `raise` would aim it at this thread). `Err`: the line to answer,
/// if the signal could not be sent.
pub fn shutdown(peer: &str, graceful: bool) -> Result<(), String> {
    use nix::sys::signal::{kill, Signal};
    let signal = if graceful {
        Signal::SIGUSR1
    } else {
        Signal::SIGTERM
    };
    tracing::info!(peer, %signal, "`shutdown` command: stopping as on {signal}");
    kill(nix::unistd::getpid(), signal).map_err(|err| {
        tracing::error!(peer, %signal, %err, "`shutdown` command: the signal was not sent");
        format!("SERVER_ERROR shutdown failed: {err}\r\n")
    })
}
