//! Request frames: header, shape checks, typed requests.
//!
//! The 24-byte request header is `magic, opcode, key length (u16), extras length, data type,
//! vbucket (u16), total body length (u32), opaque (u32), CAS (u64)`, all big-endian, followed by
//! extras, key and value. Shape rules (extras and key lengths per opcode) are memcached's.

use crate::command::{Command, StoreMode, Value};

use super::{
    opcode as op, Status, HEADER_BYTES, KEY_MAX_BYTES, REQUEST_MAGIC, SASL_DATA_MAX_BYTES,
};

/// Where a SETX wants its value's replicas (the extension; plain SETs use the defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementHints {
    /// 0: the server's default (one).
    pub replicas: u8,
    /// `None`: the server's default (the serving node); `Some(None)`: no preference.
    pub node: Option<Option<u16>>,
    pub strict: bool,
    pub preferred: Vec<u32>,
    pub excluded: Vec<u32>,
}

/// Bytes of SETX extras before the target lists.
pub const SETX_EXTRAS_FIXED_BYTES: usize = 14;

fn parse_hints(extras: &[u8]) -> PlacementHints {
    let node = match u16::from_be_bytes([extras[9], extras[10]]) {
        0xffff => None,
        0xfffe => Some(None),
        n => Some(Some(n)),
    };
    let (n_pref, n_excl) = (extras[12] as usize, extras[13] as usize);
    let id = |i: usize| be32(&extras[SETX_EXTRAS_FIXED_BYTES + 4 * i..]);
    PlacementHints {
        replicas: extras[8],
        node,
        strict: extras[11] != 0,
        preferred: (0..n_pref).map(id).collect(),
        excluded: (n_pref..n_pref + n_excl).map(id).collect(),
    }
}

/// A decoded request. Byte slices borrow the caller's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// A command every protocol asks the same way, and how the binary protocol answers it:
    /// `quiet` (the Q opcodes) answers only a failure, and the GETQ family only a hit;
    /// `with_key` (GETK, GATK) puts the key in the reply. A store over the item size limit is
    /// [`Command::Refuse`], its value skipped by the caller (`Decoded::Request::skip_after`);
    /// one whose value is too large to buffer is a [`Command::Store`] with a
    /// [`Value::Streamed`], its value following the consumed bytes.
    Run {
        command: Command<'a>,
        quiet: bool,
        with_key: bool,
        /// From a SETX whose value is streamed: where its replicas should go.
        hints: Option<PlacementHints>,
    },
    /// Extension: an administrative command (mount, unmount), its text in the key.
    Admin { command: &'a [u8] },
    /// SASL: which mechanisms are offered.
    SaslListMechs,
    /// SASL AUTH (`step: false`) or STEP: the mechanism in the key, its data in the value.
    SaslAuth {
        mechanism: &'a [u8],
        data: &'a [u8],
        step: bool,
    },
}

impl<'a> Request<'a> {
    /// A command, answered loudly with no key.
    fn run(command: Command<'a>) -> Request<'a> {
        Request::Run {
            command,
            quiet: false,
            with_key: false,
            hints: None,
        }
    }

    /// The command this request asks (none for SASL and ADMIN, which the connection answers).
    pub fn command(&self) -> Option<Command<'a>> {
        match *self {
            Request::Run { command, .. } => Some(command),
            _ => None,
        }
    }

    /// The key that decides which partition runs the request, if any.
    pub fn key(&self) -> Option<&[u8]> {
        match self {
            Request::Run { command, .. } => command.key(),
            _ => None,
        }
    }
}

/// The store a storage opcode asks for (SETX is a SET with placement hints).
fn store_mode(opcode: u8) -> StoreMode {
    match opcode {
        op::SET | op::SETQ | op::SETX | op::SETXQ => StoreMode::Set,
        op::ADD | op::ADDQ => StoreMode::Add,
        op::APPEND | op::APPENDQ => StoreMode::Append,
        op::PREPEND | op::PREPENDQ => StoreMode::Prepend,
        _ => StoreMode::Replace,
    }
}

/// memcached 1.6.45's rule for the binary protocol (`proto_bin.c`): a SET or SETQ, with a CAS
/// or without, that cannot be stored for want of room drops the key's current item; ADD,
/// REPLACE, APPEND and PREPEND leave it.
fn drops_on_failure(mode: StoreMode) -> bool {
    mode == StoreMode::Set
}

/// The store a binary storage `opcode` asks for, its value whole or streamed (APPEND and
/// PREPEND pass flags and expiry 0: the item keeps its own).
fn store_command<'a>(
    opcode: u8,
    key: &'a [u8],
    value: Value<'a>,
    cas: u64,
    (flags, expiry): (u32, u32),
) -> Command<'a> {
    let mode = store_mode(opcode);
    Command::Store {
        mode,
        key,
        value,
        flags,
        expiry,
        cas,
        invalidate: false,
        explicit_cas: 0,
        vivify: None,
        drop_on_failure: drops_on_failure(mode),
    }
}

/// Why a frame was rejected (counted in STAT).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameError {
    /// The first byte is not the request magic: the connection is closed without a reply.
    BadMagic,
    /// Key plus extras exceed the body length: "unknown command", then close.
    BodyTooShort,
    /// A key over 250 bytes: "invalid arguments", then close.
    KeyTooLong,
    /// Extras, key or body length wrong for the opcode: "invalid arguments", then close.
    BadShape,
    /// An opcode this server does not know: "unknown command", body skipped, connection kept.
    UnknownOpcode,
    /// A value over `--max-item-size`: "too large", value skipped, connection kept.
    TooLarge,
}

/// The outcome of decoding the front of a buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// Not a whole frame yet: at least `needed` bytes in total must be buffered.
    Incomplete { needed: usize },
    /// A request taking `consumed` bytes of the buffer; then `skip_after` more bytes of the
    /// stream (possibly not received yet) belong to this frame and must be discarded.
    Request {
        request: Request<'a>,
        opcode: u8,
        opaque: u32,
        consumed: usize,
        skip_after: u64,
    },
    /// A frame answered with an error `status`: discard `skip` bytes of the stream from the
    /// frame's start; close the connection after replying if `close`.
    Reject {
        opcode: u8,
        opaque: u32,
        status: Status,
        skip: u64,
        close: bool,
        error: FrameError,
    },
    /// Close the connection without replying.
    Close { error: FrameError },
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

/// A frame header's key, extras and body lengths.
fn lengths(header: &[u8]) -> (usize, usize, usize) {
    (
        be16(&header[2..]) as usize,
        header[4] as usize,
        be32(&header[8..]) as usize,
    )
}

/// Calls `key` with the key of each whole request frame at the start of `buf` (empty for a
/// frame without one), at most `most` frames, and returns the offset after the last. A look
/// ahead for prefetching, not a decoder: it stops at the first partial or malformed frame and
/// checks nothing but the lengths it needs.
pub fn frame_keys<'a>(buf: &'a [u8], most: usize, mut key: impl FnMut(&'a [u8])) -> usize {
    let mut at = 0;
    for _ in 0..most {
        let Some(header) = buf.get(at..at + HEADER_BYTES) else {
            break;
        };
        if header[0] != REQUEST_MAGIC {
            break;
        }
        let (key_len, extras_len, body_len) = lengths(header);
        let key_at = at + HEADER_BYTES + extras_len;
        let end = at + HEADER_BYTES + body_len;
        match buf.get(key_at..key_at + key_len) {
            Some(k) if key_at + key_len <= end && end <= buf.len() => {
                key(k);
                at = end;
            }
            _ => break,
        }
    }
    at
}

/// Decodes the first frame of `buf`. Values longer than `max_value_bytes` are never buffered:
/// they come back as a [`Command::Refuse`] or a [`Decoded::Reject`] with the bytes to skip.
pub fn decode(buf: &[u8], max_value_bytes: usize) -> Decoded<'_> {
    decode_streaming(buf, max_value_bytes, usize::MAX)
}

/// [`decode`], except that store values longer than `stream_from_bytes` (and within
/// `max_value_bytes`) come back as a [`Command::Store`] with a [`Value::Streamed`] once the
/// header, extras and key are buffered: the caller streams the value itself.
pub fn decode_streaming(
    buf: &[u8],
    max_value_bytes: usize,
    stream_from_bytes: usize,
) -> Decoded<'_> {
    if buf.is_empty() {
        return Decoded::Incomplete {
            needed: HEADER_BYTES,
        };
    }
    if buf[0] != REQUEST_MAGIC {
        return Decoded::Close {
            error: FrameError::BadMagic,
        };
    }
    if buf.len() < HEADER_BYTES {
        return Decoded::Incomplete {
            needed: HEADER_BYTES,
        };
    }
    let opcode = buf[1];
    let (key_len, extras_len, body_len) = lengths(buf);
    let opaque = be32(&buf[12..]);
    let cas = be64(&buf[16..]);
    let frame_len = HEADER_BYTES as u64 + body_len as u64;
    let reject = |status, skip, close, error| Decoded::Reject {
        opcode,
        opaque,
        status,
        skip,
        close,
        error,
    };

    if key_len + extras_len > body_len {
        return reject(Status::UnknownCommand, 0, true, FrameError::BodyTooShort);
    }
    if key_len > KEY_MAX_BYTES {
        return reject(Status::InvalidArguments, 0, true, FrameError::KeyTooLong);
    }
    let value_len = body_len - key_len - extras_len;
    let bad_shape = reject(Status::InvalidArguments, 0, true, FrameError::BadShape);
    // SETX's extras say how long they are: wait for their fixed part before judging its shape.
    if matches!(opcode, op::SETX | op::SETXQ)
        && extras_len >= SETX_EXTRAS_FIXED_BYTES
        && buf.len() < HEADER_BYTES + SETX_EXTRAS_FIXED_BYTES
    {
        return Decoded::Incomplete {
            needed: HEADER_BYTES + SETX_EXTRAS_FIXED_BYTES,
        };
    }
    let shape_ok = match opcode {
        op::VERSION | op::NOOP | op::QUIT | op::QUITQ => {
            extras_len == 0 && key_len == 0 && body_len == 0
        }
        op::FLUSH | op::FLUSHQ => {
            key_len == 0 && body_len == extras_len && (extras_len == 0 || extras_len == 4)
        }
        op::SET | op::SETQ | op::ADD | op::ADDQ | op::REPLACE | op::REPLACEQ => {
            extras_len == 8 && key_len != 0
        }
        op::SETX | op::SETXQ => {
            key_len != 0
                && extras_len >= SETX_EXTRAS_FIXED_BYTES
                && buf.len() >= HEADER_BYTES + SETX_EXTRAS_FIXED_BYTES
                && extras_len
                    == SETX_EXTRAS_FIXED_BYTES
                        + 4 * (buf[HEADER_BYTES + 12] as usize + buf[HEADER_BYTES + 13] as usize)
        }
        op::GET | op::GETQ | op::GETK | op::GETKQ => {
            extras_len == 0 && key_len > 0 && value_len == 0
        }
        op::DELETE | op::DELETEQ => extras_len == 0 && key_len > 0 && value_len == 0,
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            extras_len == 20 && key_len > 0 && value_len == 0
        }
        op::APPEND | op::APPENDQ | op::PREPEND | op::PREPENDQ => extras_len == 0 && key_len > 0,
        op::STAT => extras_len == 0,
        op::ADMIN => extras_len == 0 && key_len > 0 && value_len == 0,
        op::SASL_LIST_MECHS => extras_len == 0 && key_len == 0 && body_len == 0,
        op::SASL_AUTH | op::SASL_STEP => {
            extras_len == 0 && key_len > 0 && value_len <= SASL_DATA_MAX_BYTES
        }
        op::VERBOSITY => extras_len == 4 && key_len == 0 && body_len == 4,
        op::TOUCH | op::GAT | op::GATQ | op::GATK | op::GATKQ => {
            extras_len == 4 && key_len != 0 && value_len == 0
        }
        _ => {
            return reject(
                Status::UnknownCommand,
                frame_len,
                false,
                FrameError::UnknownOpcode,
            )
        }
    };
    if !shape_ok {
        return bad_shape;
    }
    let carries_value = matches!(
        opcode,
        op::SET
            | op::SETQ
            | op::SETX
            | op::SETXQ
            | op::ADD
            | op::ADDQ
            | op::REPLACE
            | op::REPLACEQ
            | op::APPEND
            | op::APPENDQ
            | op::PREPEND
            | op::PREPENDQ
    );
    // A STAT body beyond its key is ignored; never buffer more of it than a key's worth.
    let sasl_data = matches!(opcode, op::SASL_AUTH | op::SASL_STEP);
    if !carries_value && !sasl_data && value_len > KEY_MAX_BYTES {
        return reject(Status::InvalidArguments, 0, true, FrameError::BadShape);
    }
    let concat = matches!(
        opcode,
        op::APPEND | op::APPENDQ | op::PREPEND | op::PREPENDQ
    );
    if carries_value && value_len > stream_from_bytes && value_len <= max_value_bytes {
        let head = HEADER_BYTES + extras_len + key_len;
        if buf.len() < head {
            return Decoded::Incomplete { needed: head };
        }
        let extras = &buf[HEADER_BYTES..HEADER_BYTES + extras_len];
        // APPEND and PREPEND carry no extras: the item keeps its flags and expiry.
        let (flags, expiry) = if concat {
            (0, 0)
        } else {
            (be32(extras), be32(&extras[4..]))
        };
        let key = &buf[HEADER_BYTES + extras_len..head];
        let value = Value::Streamed(value_len as u64);
        let store = store_command(opcode, key, value, cas, (flags, expiry));
        return Decoded::Request {
            request: Request::Run {
                command: store,
                quiet: matches!(
                    opcode,
                    op::SETQ | op::ADDQ | op::REPLACEQ | op::SETXQ | op::APPENDQ | op::PREPENDQ
                ),
                with_key: false,
                hints: matches!(opcode, op::SETX | op::SETXQ).then(|| parse_hints(extras)),
            },
            opcode,
            opaque,
            consumed: head,
            skip_after: 0,
        };
    }
    if carries_value && value_len > max_value_bytes {
        let head = HEADER_BYTES + extras_len + key_len;
        if matches!(
            opcode,
            op::APPEND | op::APPENDQ | op::PREPEND | op::PREPENDQ
        ) {
            return reject(Status::TooLarge, frame_len, false, FrameError::TooLarge);
        }
        if buf.len() < head {
            return Decoded::Incomplete { needed: head };
        }
        let key = &buf[HEADER_BYTES + extras_len..head];
        return Decoded::Request {
            request: Request::run(Command::Refuse {
                key,
                drop_existing: drops_on_failure(store_mode(opcode)),
            }),
            opcode,
            opaque,
            consumed: head,
            skip_after: value_len as u64,
        };
    }
    let total = HEADER_BYTES + body_len;
    if buf.len() < total {
        return Decoded::Incomplete { needed: total };
    }
    let extras = &buf[HEADER_BYTES..HEADER_BYTES + extras_len];
    let key = &buf[HEADER_BYTES + extras_len..HEADER_BYTES + extras_len + key_len];
    let value = &buf[HEADER_BYTES + extras_len + key_len..total];
    let quiet = matches!(
        opcode,
        op::GETQ
            | op::GETKQ
            | op::SETQ
            | op::ADDQ
            | op::REPLACEQ
            | op::DELETEQ
            | op::INCREMENTQ
            | op::DECREMENTQ
            | op::QUITQ
            | op::FLUSHQ
            | op::APPENDQ
            | op::PREPENDQ
            | op::GATQ
            | op::GATKQ
            | op::SETXQ
    );
    let run = |command, with_key: bool| Request::Run {
        command,
        quiet,
        with_key,
        hints: None,
    };
    let store =
        |flags, expiry| store_command(opcode, key, Value::Whole(value), cas, (flags, expiry));
    let request = match opcode {
        op::GET | op::GETQ | op::GETK | op::GETKQ => run(
            Command::Get {
                key,
                touch: None,
                value: true,
            },
            matches!(opcode, op::GETK | op::GETKQ),
        ),
        op::TOUCH | op::GAT | op::GATQ | op::GATK | op::GATKQ => run(
            Command::Get {
                key,
                touch: Some(be32(extras)),
                value: opcode != op::TOUCH,
            },
            matches!(opcode, op::GATK | op::GATKQ),
        ),
        // A SETX value small enough for RAM has no replicas to place: a plain SET.
        op::SET
        | op::SETQ
        | op::ADD
        | op::ADDQ
        | op::REPLACE
        | op::REPLACEQ
        | op::SETX
        | op::SETXQ => run(store(be32(extras), be32(&extras[4..])), false),
        // APPEND and PREPEND carry no extras: the item keeps its flags and expiry.
        op::APPEND | op::APPENDQ | op::PREPEND | op::PREPENDQ => run(store(0, 0), false),
        op::DELETE | op::DELETEQ => run(Command::Delete { key, cas }, false),
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => run(
            Command::Arith {
                incr: matches!(opcode, op::INCREMENT | op::INCREMENTQ),
                key,
                delta: be64(extras),
                initial: be64(&extras[8..]),
                create: be32(&extras[16..]),
                cas,
                ttl: None,
                report: false,
                new_cas: 0,
            },
            false,
        ),
        op::QUIT | op::QUITQ => run(Command::Quit, false),
        op::FLUSH | op::FLUSHQ => run(
            Command::Flush {
                delay: if extras_len == 4 { be32(extras) } else { 0 },
            },
            false,
        ),
        op::NOOP => Request::run(Command::Noop),
        op::VERSION => Request::run(Command::Version),
        op::STAT => Request::run(Command::Stats { group: key }),
        // The level is the log's, set by --log-level: accepted and answered.
        op::VERBOSITY => Request::run(Command::Verbosity),
        op::ADMIN => Request::Admin { command: key },
        op::SASL_LIST_MECHS => Request::SaslListMechs,
        op::SASL_AUTH | op::SASL_STEP => Request::SaslAuth {
            mechanism: key,
            data: value,
            step: opcode == op::SASL_STEP,
        },
        _ => unreachable!("unknown opcodes were rejected above"),
    };
    Decoded::Request {
        request,
        opcode,
        opaque,
        consumed: total,
        skip_after: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
        let mut out = Vec::new();
        crate::proto::write_request(&mut out, opcode, (extras, key, value), 0xdead_beef, cas);
        out
    }

    #[test]
    fn decodes_a_set() {
        let mut extras = 7u32.to_be_bytes().to_vec();
        extras.extend_from_slice(&60u32.to_be_bytes());
        let bytes = frame(op::SETQ, &extras, b"k", b"value", 9);
        match decode(&bytes, 1024) {
            Decoded::Request {
                request,
                consumed,
                opaque,
                ..
            } => {
                assert_eq!(consumed, bytes.len());
                assert_eq!(opaque, 0xdead_beef);
                assert_eq!(
                    request,
                    Request::Run {
                        command: Command::Store {
                            mode: StoreMode::Set,
                            key: b"k",
                            value: Value::Whole(b"value"),
                            flags: 7,
                            expiry: 60,
                            cas: 9,
                            invalidate: false,
                            explicit_cas: 0,
                            vivify: None,
                            drop_on_failure: true,
                        },
                        quiet: true,
                        with_key: false,
                        hints: None,
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        for cut in 0..bytes.len() {
            assert!(
                matches!(decode(&bytes[..cut], 1024), Decoded::Incomplete { .. }),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn rejects_what_memcached_rejects() {
        assert_eq!(
            decode(&[0x81; 30], 10),
            Decoded::Close {
                error: FrameError::BadMagic
            }
        );
        let get_with_extras = frame(op::GET, &[1, 2, 3, 4], b"k", b"", 0);
        assert!(matches!(
            decode(&get_with_extras, 10),
            Decoded::Reject {
                status: Status::InvalidArguments,
                close: true,
                ..
            }
        ));
        let long_key = frame(op::GET, &[], &[b'k'; 251], b"", 0);
        assert!(matches!(
            decode(&long_key, 10),
            Decoded::Reject {
                error: FrameError::KeyTooLong,
                close: true,
                ..
            }
        ));
        let unknown = frame(0x7f, &[], b"", b"abc", 0);
        assert!(matches!(
            decode(&unknown, 10),
            Decoded::Reject {
                status: Status::UnknownCommand,
                close: false,
                skip: 27,
                ..
            }
        ));
        let mut short = frame(op::GET, &[], b"key", b"", 0);
        short[8..12].copy_from_slice(&1u32.to_be_bytes());
        assert!(matches!(
            decode(&short, 10),
            Decoded::Reject {
                error: FrameError::BodyTooShort,
                close: true,
                ..
            }
        ));
    }

    #[test]
    fn oversized_values_are_skipped_not_buffered() {
        let mut extras = 0u32.to_be_bytes().to_vec();
        extras.extend_from_slice(&0u32.to_be_bytes());
        let bytes = frame(op::SET, &extras, b"big", &[0u8; 100], 0);
        match decode(&bytes[..40], 50) {
            Decoded::Request {
                request:
                    Request::Run {
                        command: Command::Refuse { key, drop_existing },
                        ..
                    },
                consumed,
                skip_after,
                ..
            } => {
                assert_eq!(
                    (key, drop_existing, consumed, skip_after),
                    (&b"big"[..], true, 35, 100)
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
