//! The memcached binary protocol on a connection: each frame decoded from the connection's
//! buffer (`proto::decode_streaming`) runs on the spot (a keyed request as its
//! [`crate::command::Command`], through `Replies::run` and the executor, answered by a
//! [`BinaryReply`]), and its reply goes into the connection's replies.
//! Validation and connection handling follow memcached 1.6's `proto_bin.c`.

use std::rc::Rc;

use crate::command::{Command, Value};
use crate::proto::{
    decode_streaming, Decoded, FrameError, Request, ResponseWriter, Status, StoreMode,
};
use crate::store::{ArithOutcome, DeleteOutcome, StoreOutcome};

use super::conn::{log_peer_error, within_auth_budget, After, Conn};
use super::large_reply::LargeReply;
use crate::server::exec::control::{self, ControlOutcome};
use crate::server::exec::execute::{Counted, Found, Reply};
use crate::server::exec::large::{self, LargeSet};
use crate::server::shard::ctx::ShardCtx;
use crate::server::shard::latency::CommandKind;
use crate::server::shard::shared::unix_now;

/// The body of the refusal ADMIN gets on a data connection.
const ADMIN_REFUSAL: &str =
    "ADMIN is served only on the admin socket (--admin-socket PATH), not on data connections";

/// What a connection may do before SASL authentication, as memcached allows (its
/// `authenticated()`): anything else is answered `Auth failure.` and the connection closed.
fn allowed_before_auth(request: &Request) -> bool {
    matches!(
        request,
        Request::Run {
            command: Command::Version,
            ..
        } | Request::SaslListMechs
            | Request::SaslAuth { .. }
    )
}

fn count(ctx: &ShardCtx, error: FrameError) {
    let mut c = ctx.counters.borrow_mut();
    match error {
        FrameError::BadMagic => c.bad_magic += 1,
        FrameError::BodyTooShort => c.body_too_short += 1,
        FrameError::KeyTooLong => c.key_too_long += 1,
        FrameError::BadShape => c.invalid_frames += 1,
        FrameError::UnknownOpcode => c.unknown_opcodes += 1,
        FrameError::TooLarge => c.too_large_frames += 1,
    }
}

/// Answers a SASL command (updating whether the connection is authenticated): the status and
/// body of its reply.
fn sasl(ctx: &ShardCtx, authenticated: &mut bool, request: &Request) -> (Status, String) {
    use crate::server::shard::auth::{AuthOutcome, MECHANISMS};
    let Some(credentials) = &ctx.shared.credentials else {
        return (
            Status::UnknownCommand,
            Status::UnknownCommand.message().into(),
        );
    };
    let Request::SaslAuth {
        mechanism, data, ..
    } = request
    else {
        return (Status::Ok, MECHANISMS.to_string());
    };
    ctx.counters.borrow_mut().auth_cmds += 1;
    match credentials.authenticate(mechanism, data) {
        AuthOutcome::Authenticated { user } => {
            *authenticated = true;
            tracing::debug!(shard = ctx.id, %user, "SASL: authenticated");
            (Status::Ok, "Authenticated".into())
        }
        outcome => {
            *authenticated = false;
            ctx.counters.borrow_mut().auth_errors += 1;
            if let Some(held_back) = ctx.auth_log.allow(unix_now()) {
                let reason = match outcome {
                    AuthOutcome::UnknownMechanism => "an unknown mechanism".to_string(),
                    AuthOutcome::Refused { user } => format!("user '{user}' refused"),
                    AuthOutcome::Authenticated { .. } => unreachable!(),
                };
                tracing::warn!(
                        shard = ctx.id,
                        held_back,
                        "SASL authentication failed: {reason} (one line per second per shard at most; auth_errors counts every failure)"
                    );
            }
            (Status::AuthError, Status::AuthError.message().into())
        }
    }
}

/// Runs every whole binary frame buffered on `conn`, up to the output cap, and says what the
/// connection does next. `now`: the time the requests run at, in Unix seconds.
pub(crate) async fn process(conn: &mut Conn, ctx: &Rc<ShardCtx>, now: u32) -> After {
    let max_item = ctx.shared.settings.max_item_bytes as usize;
    // Values above ram_head live in segments: they are streamed, never buffered whole.
    let stream_from = ctx.shared.settings.arena.ram_head_bytes as usize;
    let lend_from = ctx.io.lend_from();
    loop {
        if let Some(after) = conn.before_next(&ctx.shared.partitions) {
            return after;
        }
        let frame = &conn.buf[conn.consumed..conn.filled];
        let (request, opcode, opaque, consumed) =
            match decode_streaming(frame, max_item, stream_from) {
                Decoded::Incomplete { needed } => {
                    conn.make_room(needed);
                    return After::Read;
                }
                Decoded::Close { error } => {
                    count(ctx, error);
                    log_peer_error(ctx, conn.peer(), &format!("binary frame: {error:?}"), true);
                    return After::Close;
                }
                Decoded::Reject {
                    opcode,
                    opaque,
                    status,
                    skip,
                    close,
                    error,
                } => {
                    count(ctx, error);
                    let what = format!("binary frame: {error:?} (opcode {opcode:#04x})");
                    log_peer_error(ctx, conn.peer(), &what, close);
                    if !conn.authenticated {
                        // Before authentication nothing else is answered (memcached).
                        ResponseWriter::new(&mut conn.replies.out).error(
                            opcode,
                            opaque,
                            Status::AuthError,
                        );
                        return After::Close;
                    }
                    ResponseWriter::new(&mut conn.replies.out).error(opcode, opaque, status);
                    conn.skip_stream(skip);
                    if close {
                        return After::Close;
                    }
                    continue;
                }
                Decoded::Request {
                    request,
                    opcode,
                    opaque,
                    consumed,
                    skip_after,
                } => {
                    conn.skip = skip_after;
                    (request, opcode, opaque, consumed)
                }
            };
        ctx.counters.borrow_mut().commands += 1;
        conn.batch.add(CommandKind::of_opcode(opcode));
        if !conn.authenticated && !allowed_before_auth(&request) {
            // Refused without running, and the connection closed, as memcached does.
            ResponseWriter::new(&mut conn.replies.out).error(opcode, opaque, Status::AuthError);
            conn.consume(consumed);
            return After::Close;
        }
        if let Some(command) = request.command().filter(|c| c.key().is_none()) {
            let quiet = matches!(request, Request::Run { quiet: true, .. });
            // Boxed: a connection's task is as big as its biggest wait.
            let outcome = Box::pin(control::run(ctx, &command, now)).await;
            let out = &mut conn.replies.out;
            let ended = write_control(out, outcome, (opcode, opaque, quiet));
            conn.consume(consumed);
            if ended {
                return After::Quit;
            }
            continue;
        }
        let mut w = ResponseWriter::new(&mut conn.replies.out);
        match &request {
            Request::Admin { .. } => w.reply(
                opcode,
                opaque,
                Status::NotSupported,
                0,
                &[],
                &[],
                ADMIN_REFUSAL.as_bytes(),
            ),
            Request::SaslListMechs | Request::SaslAuth { .. } => {
                let gated =
                    ctx.shared.credentials.is_some() && matches!(request, Request::SaslAuth { .. });
                let (status, body) = if gated {
                    let authenticated = &mut conn.authenticated;
                    let attempt = || sasl(ctx, authenticated, &request);
                    let accepted = |done: &(Status, String)| done.0 == Status::Ok;
                    let answer = within_auth_budget(
                        ctx,
                        (&conn.info.endpoint.peer, conn.fd),
                        attempt,
                        accepted,
                    );
                    match answer.await {
                        Some(answer) => answer,
                        None => return After::Close,
                    }
                } else {
                    sasl(ctx, &mut conn.authenticated, &request)
                };
                ResponseWriter::new(&mut conn.replies.out).reply(
                    opcode,
                    opaque,
                    status,
                    0,
                    &[],
                    &[],
                    body.as_bytes(),
                );
                if status == Status::AuthError {
                    conn.consume(consumed);
                    if conn.authentication_failed(ctx).await {
                        return After::Close;
                    }
                    continue;
                }
            }
            Request::Run {
                command:
                    store @ Command::Store {
                        mode, key, value, ..
                    },
                quiet,
                hints,
                ..
            } if matches!(value, Value::Streamed(_))
                || (matches!(mode, StoreMode::Append | StoreMode::Prepend)
                    && large::concat_needs_segment(ctx, key, value.len() as usize, now)) =>
            {
                // A value too large to buffer streams in; an APPEND or PREPEND whose sum
                // outgrows RAM (or whose value is in a segment already) is built in a
                // segment, its bytes read from the buffer. Either way the executor reads the
                // value as the body that follows the request.
                let set = LargeSet::of(store, hints.clone()).expect("a store");
                let reply = LargeReply::Binary {
                    opcode,
                    opaque,
                    quiet: *quiet,
                };
                let buffered = match value {
                    Value::Whole(bytes) => bytes.len(),
                    Value::Streamed(_) => 0,
                };
                conn.consume(consumed - buffered);
                return After::LargeSet(set, reply);
            }
            keyed => {
                let command = keyed.command().expect("keyed requests are commands");
                let mut reply = BinaryReply::of(keyed, opcode, opaque);
                let how = (now, conn.fd);
                conn.replies.run(ctx, &command, how, lend_from, &mut reply);
            }
        }
        conn.consume(consumed);
    }
}

/// Writes what a command that names no key did (`None`: it was not one), as memcached's
/// `proto_bin.c` answers it: NOOP, VERSION, VERBOSITY, FLUSH and QUIT with a success (the
/// version in VERSION's body; nothing for FLUSHQ and QUITQ), a refused FLUSH with "auth
/// error", STAT with one packet per figure and an empty terminator, or "not found" for an
/// unknown group. Returns whether the connection closes (QUIT).
fn write_control(
    out: &mut Vec<u8>,
    outcome: Option<ControlOutcome<'_>>,
    (opcode, opaque, quiet): (u8, u32, bool),
) -> bool {
    let quit = matches!(outcome, Some(ControlOutcome::Quit));
    let mut w = ResponseWriter::new(out);
    match outcome {
        Some(ControlOutcome::Done) | Some(ControlOutcome::Quit) if quiet => {}
        Some(ControlOutcome::Done) | Some(ControlOutcome::Quit) => {
            w.reply(opcode, opaque, Status::Ok, 0, &[], &[], &[])
        }
        Some(ControlOutcome::Version(version)) => {
            w.reply(opcode, opaque, Status::Ok, 0, &[], &[], version.as_bytes())
        }
        Some(ControlOutcome::Stats(Some(pairs))) => {
            for (name, value) in pairs {
                let (name, value) = (name.as_bytes(), value.as_bytes());
                w.reply(opcode, opaque, Status::Ok, 0, &[], name, value);
            }
            w.reply(opcode, opaque, Status::Ok, 0, &[], &[], &[]);
        }
        Some(ControlOutcome::Stats(None)) => w.error(opcode, opaque, Status::NotFound),
        // memcached's `-F` answers FLUSH and FLUSHQ so (an error, so FLUSHQ's too).
        Some(ControlOutcome::FlushRefused) => w.error(opcode, opaque, Status::AuthError),
        None => unreachable!("only commands that name no key come here"),
    }
    quit
}

/// How a binary request is answered, as memcached's `proto_bin.c` answers it: quiet requests
/// reply only on errors (and the GETQ family only on hits); GETK and GATK carry the key.
struct BinaryReply<'k> {
    opcode: u8,
    opaque: u32,
    quiet: bool,
    with_key: bool,
    key: &'k [u8],
}

impl<'k> BinaryReply<'k> {
    fn of(request: &'k Request<'k>, opcode: u8, opaque: u32) -> BinaryReply<'k> {
        let (quiet, with_key) = match *request {
            Request::Run {
                quiet, with_key, ..
            } => (quiet, with_key),
            _ => (false, false),
        };
        BinaryReply {
            opcode,
            opaque,
            quiet,
            with_key,
            key: request.key().unwrap_or_default(),
        }
    }

    fn writer<'o>(&self, out: &'o mut Vec<u8>) -> ResponseWriter<'o> {
        ResponseWriter::new(out)
    }

    fn error(&self, out: &mut Vec<u8>, status: Status) {
        self.writer(out).error(self.opcode, self.opaque, status);
    }

    /// A success: nothing when quiet.
    fn ok(&self, out: &mut Vec<u8>, cas: u64, extras: &[u8], value: &[u8]) {
        if !self.quiet {
            let (opcode, opaque) = (self.opcode, self.opaque);
            self.writer(out)
                .reply(opcode, opaque, Status::Ok, cas, extras, &[], value);
        }
    }
}

impl Reply for BinaryReply<'_> {
    const VALUE_END: &'static [u8] = b"";

    fn found(&mut self, out: &mut Vec<u8>, found: &Found) {
        let key: &[u8] = if self.with_key { self.key } else { &[] };
        let value_len = if found.value { found.len as u32 } else { 0 };
        let mut w = self.writer(out);
        let (opcode, opaque) = (self.opcode, self.opaque);
        w.header(
            opcode,
            opaque,
            Status::Ok,
            found.cas,
            4,
            key.len() as u16,
            value_len,
        );
        w.body(&found.flags.to_be_bytes());
        w.body(key);
    }

    fn missed(&mut self, out: &mut Vec<u8>) {
        // GETK/GATK misses carry the key and no message; the others memcached's text.
        if self.quiet {
        } else if self.with_key {
            let (opcode, opaque, key) = (self.opcode, self.opaque, self.key);
            self.writer(out)
                .reply(opcode, opaque, Status::NotFound, 0, &[], key, &[]);
        } else {
            self.error(out, Status::NotFound);
        }
    }

    fn stored(&mut self, out: &mut Vec<u8>, outcome: StoreOutcome) {
        match outcome {
            StoreOutcome::Stored { cas, .. } => {
                // A SETX reply counts the replicas placed: none, for a value kept in RAM.
                let extras: &[u8] = if self.opcode == crate::proto::opcode::SETX {
                    &[0]
                } else {
                    &[]
                };
                self.ok(out, cas, extras, &[]);
            }
            StoreOutcome::Exists => self.error(out, Status::Exists),
            StoreOutcome::NotFound => self.error(out, Status::NotFound),
            StoreOutcome::NotStored => self.error(out, Status::NotStored),
            StoreOutcome::TooLarge => self.error(out, Status::TooLarge),
            StoreOutcome::OutOfMemory => self.error(out, Status::OutOfMemory),
        }
    }

    fn deleted(&mut self, out: &mut Vec<u8>, outcome: DeleteOutcome) {
        match outcome {
            DeleteOutcome::Deleted => self.ok(out, 0, &[], &[]),
            DeleteOutcome::NotFound => self.error(out, Status::NotFound),
            DeleteOutcome::Exists => self.error(out, Status::Exists),
        }
    }

    fn counted(&mut self, out: &mut Vec<u8>, outcome: ArithOutcome, _: Counted) {
        match outcome {
            ArithOutcome::Value { value, cas } => self.ok(out, cas, &[], &value.to_be_bytes()),
            ArithOutcome::NotFound => self.error(out, Status::NotFound),
            ArithOutcome::Exists => self.error(out, Status::Exists),
            ArithOutcome::NonNumeric => self.error(out, Status::NonNumeric),
            ArithOutcome::OutOfMemory => self.error(out, Status::OutOfMemory),
        }
    }

    fn refused(&mut self, out: &mut Vec<u8>) {
        self.error(out, Status::TooLarge);
    }
}
