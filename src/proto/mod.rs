//! memcached's protocols: the binary protocol here, the text protocol in [`text`] and the meta
//! commands' flags in [`meta`]; requests in, replies out.
//!
//! This module knows nothing of stores: [`decode`] turns bytes into a typed [`Request`] (or says
//! what memcached would do with a bad frame), and [`ResponseWriter`] composes replies into a
//! buffer; [`text::decode_text`] does the same for a text line. Validation follows memcached 1.6's `proto_bin.c`, so existing clients see the same
//! statuses and the same connection handling. The wire format is written up in
//! `docs/protocol.md`.

mod decode;
mod encode;
pub mod meta;
pub mod text;

pub use decode::{
    decode, decode_streaming, frame_keys, Decoded, FrameError, PlacementHints, Request,
};
pub use encode::{request_header, write_request, ResponseWriter, HEADER_BYTES};
pub use meta::{Key, MaFlags, MdFlags, MetaCode, MetaValues, MgFlags, MsFlags, ReturnFlags};
pub use text::{
    command_keys, decode_text, decode_text_resuming, first_key, is_binary, LineScan, TextCommand,
    TextDecoded, TextStore, Words,
};

/// Request magic byte.
pub const REQUEST_MAGIC: u8 = 0x80;
/// Response magic byte.
pub const RESPONSE_MAGIC: u8 = 0x81;
/// Longest key memcached accepts.
pub const KEY_MAX_BYTES: usize = 250;
/// Longest SASL AUTH/STEP data accepted (PLAIN carries two names and a password).
pub const SASL_DATA_MAX_BYTES: usize = 1024;
pub use crate::command::{StoreMode, Value, ARITH_NO_CREATE};

/// The memcached release whose protocols Headroom speaks: what VERSION and `STAT version`
/// answer, since clients parse them as memcached's (the npm `memcached` package takes the
/// last x.y.z; a client gates features on it). Headroom's own version is
/// `STAT headroom_version`.
pub const MEMCACHED_VERSION: &str = "1.6.45";

/// Opcodes, as on the wire.
pub mod opcode {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const VERBOSITY: u8 = 0x1b;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const SASL_LIST_MECHS: u8 = 0x20;
    pub const SASL_AUTH: u8 = 0x21;
    pub const SASL_STEP: u8 = 0x22;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
    /// Extension: SET with placement hints (`docs/protocol.md`).
    pub const SETX: u8 = 0x40;
    pub const SETXQ: u8 = 0x41;
    /// Extension: an administrative command in the key (`docs/protocol.md`).
    pub const ADMIN: u8 = 0x42;
}

/// Response statuses, as memcached returns them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    Ok = 0x0000,
    NotFound = 0x0001,
    Exists = 0x0002,
    TooLarge = 0x0003,
    InvalidArguments = 0x0004,
    NotStored = 0x0005,
    NonNumeric = 0x0006,
    /// SASL: authentication failed, or is required first.
    AuthError = 0x0020,
    UnknownCommand = 0x0081,
    OutOfMemory = 0x0082,
    /// A command this endpoint does not serve (ADMIN on a data connection).
    NotSupported = 0x0083,
    /// Extension: a strict SETX found no room on its node.
    StrictPlacement = 0x0084,
}

impl Status {
    /// The text memcached puts in the body of an error response.
    pub fn message(self) -> &'static str {
        match self {
            Status::Ok => "",
            Status::NotFound => "Not found",
            Status::Exists => "Data exists for key.",
            Status::TooLarge => "Too large.",
            Status::InvalidArguments => "Invalid arguments",
            Status::NotStored => "Not stored.",
            Status::NonNumeric => "Non-numeric server-side value for incr or decr",
            Status::AuthError => "Auth failure.",
            Status::UnknownCommand => "Unknown command",
            Status::OutOfMemory => "Out of memory",
            Status::NotSupported => "Not supported",
            Status::StrictPlacement => "No room on the requested node.",
        }
    }

    pub fn from_code(code: u16) -> Option<Status> {
        [
            Status::Ok,
            Status::NotFound,
            Status::Exists,
            Status::TooLarge,
            Status::InvalidArguments,
            Status::NotStored,
            Status::NonNumeric,
            Status::UnknownCommand,
            Status::OutOfMemory,
            Status::StrictPlacement,
        ]
        .into_iter()
        .find(|s| *s as u16 == code)
    }
}
