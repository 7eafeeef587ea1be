//! The tasks a shard runs beside its connections: accepting connections (and handing them to
//! a less busy shard), adopting the ones handed to it, answering its mesh peers, the expiry
//! sweep and promotion of the partitions it looks after. `ShardCtx` (`shard.rs`) is what they
//! share; this module is above it and above the connections it starts.

use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use glommio::channels::channel_mesh::Receivers;
use glommio::net::{TcpListener, TcpStream};

use super::conn::Admitted;
use crate::config::ListenerTls;
use crate::server::shard::ctx::{promote, Message, ShardCtx, ShardReply, ShardRequest};
use crate::server::shard::endpoint::Endpoint;
use crate::server::shard::shared::unix_now;

/// Receives from every peer: runs requests, delivers replies.
pub fn spawn_receivers(ctx: &Rc<ShardCtx>, mut receivers: Receivers<Message>) {
    for (_peer, stream) in receivers.streams() {
        let ctx = Rc::clone(ctx);
        glommio::spawn_local(async move {
            while let Some(message) = stream.recv().await {
                match message {
                    Message::Request {
                        from,
                        token,
                        request: ShardRequest::Adopt(fd, endpoint, tls),
                    } => {
                        spawn_connection(
                            &ctx,
                            crate::server::shard::listen::adopt_stream(fd),
                            endpoint,
                            tls,
                        );
                        ctx.reply_to(from, token, ShardReply::Adopted)
                    }
                    Message::Request {
                        from,
                        token,
                        request: ShardRequest::StatQuery(query),
                    } => {
                        let answer =
                            ShardReply::StatAnswer(crate::server::exec::stats::answer(&ctx, query));
                        ctx.reply_to(from, token, answer)
                    }
                    Message::Request {
                        from,
                        token,
                        request,
                    } => ctx.reply_to(from, token, ctx.serve(request)),
                    Message::Reply { token, reply } => ctx.deliver(token, reply),
                }
            }
        })
        .detach();
    }
}

/// Sleeps `period`; `false` when the shard is told to stop meanwhile.
async fn tick_or_stop(ctx: &ShardCtx, period: Duration) -> bool {
    futures_lite::future::or(
        async {
            glommio::timer::sleep(period).await;
            true
        },
        async {
            ctx.stop.wait().await;
            false
        },
    )
    .await
}

/// What a listener serves.
#[derive(Clone, Debug)]
pub enum Listening {
    /// A `--listen` address, and its TLS.
    Tcp(ListenerTls),
    /// `--unix-socket`, at this path.
    Unix(std::path::PathBuf),
}

/// Accepts connections until the stop event fires. `listener` is a TCP or a unix socket's
/// listener (glommio's TCP listener type only accepts: it works on either).
pub async fn accept_loop(ctx: Rc<ShardCtx>, listener: TcpListener, listening: Listening) {
    loop {
        let accepted = futures_lite::future::or(async { Some(listener.accept().await) }, async {
            ctx.stop.wait().await;
            None
        })
        .await;
        let stream = match accepted {
            None => break,
            Some(Ok(stream)) => stream,
            Some(Err(err)) => {
                // Out of descriptors (EMFILE) fails every accept until one closes: said once a
                // second per shard at most.
                if let Some(held_back) = ctx.refusal_log.allow(unix_now()) {
                    tracing::warn!(
                        shard = ctx.id,
                        %err,
                        held_back,
                        "accept failed (one line per second per shard at most)"
                    );
                }
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let shared = &ctx.shared;
        let open = shared.curr_connections.fetch_add(1, Ordering::AcqRel) + 1;
        if open > shared.settings.max_connections {
            shared.curr_connections.fetch_sub(1, Ordering::AcqRel);
            shared.rejected_connections.fetch_add(1, Ordering::Relaxed);
            if let Some(held_back) = ctx
                .refusal_log
                .allow(crate::server::shard::shared::unix_now())
            {
                let peer = match &listening {
                    Listening::Tcp(_) => stream.peer_addr().map_or("?".into(), |a| a.to_string()),
                    Listening::Unix(path) => format!("a client of {}", path.display()),
                };
                tracing::warn!(
                    shard = ctx.id,
                    %peer,
                    max_connections = shared.settings.max_connections,
                    held_back,
                    "connection refused: --max-connections reached (one line per second per shard at most; STAT rejected_connections counts every refusal)"
                );
            }
            // memcached's refusal line is plaintext: a TLS client gets the close alone.
            match &listening {
                Listening::Tcp(ListenerTls::On(_)) => drop(stream),
                _ => crate::server::shard::listen::refuse_over_limit(stream),
            }
            continue;
        }
        shared.total_connections.fetch_add(1, Ordering::Relaxed);
        let (endpoint, tls) = match &listening {
            Listening::Tcp(tls) => (Endpoint::tcp(&stream), *tls),
            Listening::Unix(path) => (Endpoint::unix(path), ListenerTls::Off),
        };
        match fewer_connections_than_mine(&shared.connections_by_shard, ctx.id) {
            Some(to) => hand_off(&ctx, stream, endpoint, tls, to),
            None => {
                shared.connections_by_shard[ctx.id].fetch_add(1, Ordering::AcqRel);
                spawn_connection(&ctx, stream, endpoint, tls);
            }
        }
    }
}

/// The shard a new connection should go to instead of `mine`: the one serving the fewest, if
/// it serves fewer than `mine` does. The kernel's SO_REUSEPORT hash spreads connections at
/// random, so with a few clients one shard could serve three and another one (memcached's
/// dispatcher hands them round-robin); this keeps the counts within one of each other. A
/// hand-off is one control-plane message per connection, never per request.
fn fewer_connections_than_mine(by_shard: &[AtomicUsize], mine: usize) -> Option<usize> {
    let count = |shard: usize| by_shard[shard].load(Ordering::Acquire);
    let fewest = (0..by_shard.len()).min_by_key(|&shard| count(shard))?;
    (count(fewest) < count(mine)).then_some(fewest)
}

/// Gives an accepted connection to shard `to` over the mesh. If `to` has stopped (shutdown),
/// the message and the descriptor in it are dropped, which closes the connection.
fn hand_off(
    ctx: &Rc<ShardCtx>,
    stream: TcpStream,
    endpoint: Endpoint,
    tls: ListenerTls,
    to: usize,
) {
    let by_shard = &ctx.shared.connections_by_shard;
    let fd = crate::server::shard::listen::detach_stream(stream);
    // Counted on `to` at once, so the next accept (here or on another shard) sees it.
    by_shard[to].fetch_add(1, Ordering::AcqRel);
    let ctx = Rc::clone(ctx);
    glommio::spawn_local(async move {
        if let ShardReply::Adopted = ctx.call(to, ShardRequest::Adopt(fd, endpoint, tls)).await {
            return;
        }
        let shared = &ctx.shared;
        shared.connections_by_shard[to].fetch_sub(1, Ordering::AcqRel);
        shared.curr_connections.fetch_sub(1, Ordering::AcqRel);
    })
    .detach();
}

/// Serves an admitted connection on this shard; counted in `connections_by_shard` already.
/// A connection to a TLS address is served through its TLS session (`tls.rs`). The task is
/// the connection's future itself, not a block around it: a wrapper would keep another copy
/// of the socket and the endpoint for the connection's life.
fn spawn_connection(ctx: &Rc<ShardCtx>, stream: TcpStream, endpoint: Endpoint, tls: ListenerTls) {
    let admitted = Admitted::new(ctx);
    let ctx = Rc::clone(ctx);
    match (&ctx.shared.tls, tls) {
        (Some(config), ListenerTls::On(policy)) => {
            let config = std::sync::Arc::clone(config);
            let serve = super::tls::serve(ctx, config, policy, stream, endpoint, admitted);
            glommio::spawn_local(serve).detach()
        }
        _ => glommio::spawn_local(super::serve::serve(ctx, stream, endpoint, None, admitted))
            .detach(),
    };
}

/// Bounded background sweep of expired items in this shard's partitions, once a second
/// (skipped while text `lru_crawler disable` has it off).
pub async fn sweep_loop(ctx: Rc<ShardCtx>) {
    const SWEEP_ITEMS_PER_TICK: usize = 10_000;
    let partitions = &ctx.shared.partitions;
    let mine: Vec<usize> = partitions.owned_by(ctx.id, ctx.shards).collect();
    if mine.is_empty() {
        return;
    }
    let budget = (SWEEP_ITEMS_PER_TICK / mine.len()).max(1);
    while tick_or_stop(&ctx, Duration::from_secs(1)).await {
        if !ctx.shared.crawler_enabled.load(Ordering::Relaxed) {
            continue;
        }
        let now = unix_now();
        for &index in &mine {
            let mut store = partitions.lock(index);
            store.sweep_expired(budget, now);
            // Expired large items give their extents back now, not at the next request.
            let frees = store.take_pending_frees();
            drop(store);
            ctx.free_extents(frees);
        }
    }
}

/// The promotion pass over this shard's partitions every `--promotion-interval` (never with
/// 0, or with one fixed-head region, where the arena has nothing to exchange).
pub async fn promotion_loop(ctx: Rc<ShardCtx>) {
    let interval = ctx.shared.settings.promotion_interval_ms;
    let partitions = &ctx.shared.partitions;
    if interval == 0 || partitions.is_empty() || !partitions.lock(0).arena().can_promote() {
        return;
    }
    let mine: Vec<usize> = partitions.owned_by(ctx.id, ctx.shards).collect();
    while tick_or_stop(&ctx, Duration::from_millis(interval)).await {
        for &index in &mine {
            promote(&ctx.shared, index);
        }
    }
}
