//! memcached 1.6.45's text protocol (the classic commands and the meta commands) as a pure
//! decoder: bytes in, a typed [`TextCommand`] (or memcached's exact answer to bad input) out,
//! borrowing the caller's buffer and allocating nothing on the common path. Like the binary
//! [`super::decode`], it knows nothing of stores; [`super::meta`] parses the meta commands'
//! flags. The reply helpers at the end only format.
//!
//! # Framing, as memcached frames it (`try_read_command_ascii`)
//!
//! - A connection whose first byte is `0x80` speaks binary ([`is_binary`]), else text.
//! - A command line ends at `\n`; one `\r` before it is dropped (not from a line that is only
//!   `\r`). A line of under 4 bytes, its newline included, is `CLIENT_ERROR bad command line
//!   format`; one that starts with a blank is `ERROR`. Tokens are split on spaces only (a tab
//!   belongs to its token; keys may hold any byte but space and `\n`, a NUL included).
//! - A line of more than 2048 bytes before its `\n` closes the connection without a reply,
//!   unless it starts (after at most 100 spaces) with `get ` or `gets `: those multigets may run
//!   to [`MULTIGET_LINE_MAX_BYTES`], beyond which memcached's answer to a failed buffer growth
//!   is given (`SERVER_ERROR out of memory reading request`, then close). memcached applies the
//!   2048 rule to what one read happened to bring in (so a longer line that arrives whole is
//!   served); this decoder applies it to the line itself, so its answer never depends on how
//!   the stream was cut.
//! - A storage command's data block is exactly the declared length plus two bytes, which must
//!   be `\r\n`; otherwise `CLIENT_ERROR bad data chunk` and those bytes are gone (memcached
//!   read them into the item), and decoding resumes right after them (`set k 0 0 1\r\nxyz\r\n`
//!   answers `CLIENT_ERROR bad data chunk`, then `CLIENT_ERROR bad command line format` for
//!   the short line left over).
//! - A value over the size limit is refused after its line (`SERVER_ERROR object too large for
//!   cache`) and its data block swallowed unread, as memcached does; a `set` (and an `ms` of any
//!   mode) also drops the key's old value ([`TextDecoded::TooLarge`]).
//! - A known command with too few tokens is `CLIENT_ERROR bad command line format`; tokens after
//!   its own are ignored. A storage line refused once its data length is read (bad flags,
//!   exptime, CAS unique or key) swallows its data block. An unknown command is `ERROR` and the
//!   connection stays, except that one whose last token starts with `HTTP/` closes it
//!   (memcached's answer to a stray HTTP request).
//!
//! # Numbers
//!
//! A data length is digits only (1.6.45's `mcmc_tokto32`). Other numeric tokens are read as
//! memcached reads them, with C's `strtol`/`strtoul`/`strtoull`:
//! leading blanks and a sign are accepted, anything after a blank (tab, `\r`, ...) is ignored,
//! and an exptime is signed (negative: expired at once). Nothing wraps: a number that does not
//! fit its field is refused with that field's error, never cut to its low bits or wrapped
//! around zero. memcached 1.6.45 refuses these for a data length (`set k 0 0 4294967298`, `ms k
//! 99999999999`: `CLIENT_ERROR bad command line format`, sent even under `noreply`, the data
//! block not swallowed), a `touch`/`gat`/`flush_all` exptime, `verbosity`, and the meta flags'
//! numbers, as Headroom does; it still truncates a classic storage command's flags and exptime
//! (`set k 4294967296 0 1` stores flags 0), which Headroom refuses (`CLIENT_ERROR bad command
//! line format`, the same line memcached gives a malformed one). An unsigned field refuses any
//! negative number but `-0` (1.6.18 read `-18446744073709551615` as 1).
//!
//! # `noreply`
//!
//! A classic command whose last token is `noreply` sends nothing, its errors included (memcached
//! looks at the last token before it parses the rest: `incr k x noreply` is silent). The
//! decoder applies that to the error replies it returns (an empty `reply`); for commands it
//! reports `noreply` and the caller stays silent. Meta errors are always answered.
//!
//! # Administrative commands
//!
//! `watch` (with its event kinds), `lru_crawler` (`crawl`, `metadump`, `mgdump`, `enable`,
//! `disable`; `tocrawl` and `sleep` refused in words), `refresh_certs` and `verbosity` are
//! parsed and served. Of the commands that move memory between slab classes, `slabs reassign`
//! gets memcached's answer with reassignment off (`CLIENT_ERROR slab reassignment disabled`)
//! and a well-formed `slabs automove` a `SERVER_ERROR` saying there are no slab classes; `lru`,
//! `extstore` and `cache_memlimit` are answered `ERROR`. `shutdown [graceful]` is decoded for
//! the server to serve or refuse.
//!
//! # Commands an operator can switch off
//!
//! memcached refuses `shutdown` without `-A`, `flush_all` with `-F`, the key dumps with `-X`
//! and `watch` with `-W`, each with its own line ([`Switchable::refusal`]), and checks the
//! switch before the command's form: with `-F`, `flush_all x` is refused as `flush_all` is,
//! not answered `CLIENT_ERROR invalid exptime argument`. So a line of one of these commands in
//! a form memcached refuses decodes to [`TextCommand::Malformed`], carrying both answers; the
//! decoder knows no settings, and the server picks.

use std::borrow::Cow;
use std::fmt;

use super::meta::{self, push_number, Key, MaFlags, MdFlags, MgFlags, MsFlags};
use super::{KEY_MAX_BYTES, REQUEST_MAGIC};
use crate::command::{
    store_exptime, Command, MetaGet, StoreMode, Value, ARITH_NO_CREATE, CAS_NEVER_ISSUED,
};
use crate::numbers::{safe_strtol, safe_strtoul, safe_strtoull};

/// A command line longer than this (before its `\n`) closes the connection, as memcached's
/// 2048-byte rule does; multigets excepted.
pub const LINE_MAX_BYTES: usize = 2048;
/// A `get`/`gets` line may have at most this many spaces before the command and still be a
/// multiget for the long-line rule.
pub const MULTIGET_LEADING_SPACES_MAX: usize = 100;
/// The longest multiget line buffered (memcached grows its buffer without bound).
pub const MULTIGET_LINE_MAX_BYTES: usize = 2 << 20;
/// The longest data block memcached's text protocol can declare (`INT_MAX - 2`).
pub const TEXT_VALUE_MAX_BYTES: usize = i32::MAX as usize - 2;

/// memcached's tokenizer keeps at most 23 tokens plus a terminal marker (`MAX_TOKENS` 24).
const MAX_TOKENS: usize = 24;

/// Error lines, exactly as memcached 1.6.45 writes them.
pub mod errors {
    pub const ERROR: &[u8] = b"ERROR\r\n";
    pub const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
    pub const BAD_DATA_CHUNK: &[u8] = b"CLIENT_ERROR bad data chunk\r\n";
    pub const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
    pub const INVALID_EXPTIME: &[u8] = b"CLIENT_ERROR invalid exptime argument\r\n";
    pub const INVALID_DELTA: &[u8] = b"CLIENT_ERROR invalid numeric delta argument\r\n";
    pub const STATS_DETAIL_USAGE: &[u8] = b"CLIENT_ERROR usage: stats detail on|off|dump\r\n";
    pub const BAD_COMMAND_LINE: &[u8] = b"CLIENT_ERROR bad command line\r\n";
    pub const ILLEGAL_SLAB_ID: &[u8] = b"CLIENT_ERROR Illegal slab id\r\n";
    pub const SHUTDOWN_DISABLED: &[u8] = b"SERVER_ERROR: shutdown not enabled\r\n";
    pub const SHUTDOWN_INVALID_MODE: &[u8] = b"CLIENT_ERROR invalid shutdown mode\r\n";
    pub const FLUSH_ALL_DISABLED: &[u8] = b"CLIENT_ERROR flush_all not allowed\r\n";
    pub const STATS_DETAIL_DISABLED: &[u8] = b"CLIENT_ERROR stats detail not allowed\r\n";
    pub const CACHEDUMP_DISABLED: &[u8] = b"CLIENT_ERROR stats cachedump not allowed\r\n";
    pub const METADUMP_DISABLED: &[u8] = b"ERROR metadump not allowed\r\n";
    pub const MGDUMP_DISABLED: &[u8] = b"ERROR key dump not allowed\r\n";
    pub const WATCH_DISABLED: &[u8] = b"CLIENT_ERROR watch commands not allowed\r\n";
    pub const WATCH_AFTER_PIPELINE: &[u8] =
        b"ERROR cannot pipeline other commands before watch\r\n";
    pub const WATCHER_TOO_MANY: &[u8] = b"WATCHER_TOO_MANY log watcher limit reached\r\n";
    pub const SLAB_REASSIGN_DISABLED: &[u8] = b"CLIENT_ERROR slab reassignment disabled\r\n";
    pub const NO_SLAB_CLASSES: &[u8] =
        b"SERVER_ERROR not supported: Headroom has no slab classes to move memory between\r\n";
    pub const MULTIGET_OUT_OF_MEMORY: &[u8] = b"SERVER_ERROR out of memory reading request\r\n";
    pub const BADCLASS: &[u8] = b"BADCLASS invalid class id\r\n";
    pub const CRAWLER_DISABLED: &[u8] = b"CLIENT_ERROR lru crawler disabled\r\n";
    pub const CRAWLER_RUNNING: &[u8] = b"ERROR failed to start lru crawler thread\r\n";
    pub const MGDUMP_AFTER_PIPELINE: &[u8] =
        b"ERROR cannot pipeline other commands before mgdump\r\n";
    pub const METADUMP_AFTER_PIPELINE: &[u8] =
        b"ERROR cannot pipeline other commands before metadump\r\n";
    pub const CRAWLER_PACE: &[u8] =
        b"SERVER_ERROR not supported: Headroom's expiry sweep sets its own pace\r\n";
    /// What the server answers when an INCR/DECR target is not a number (not a decoder error).
    pub const NON_NUMERIC: &[u8] =
        b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
}

/// A key as memcached's logger and crawler print it: bytes outside `A-Z a-z 0-9 - . _ ~` as
/// `%XX`.
pub fn uri_encoded(key: &[u8]) -> String {
    let mut out = String::with_capacity(key.len());
    for &b in key {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The first byte of a connection decides its protocol, as memcached decides it: `0x80` is
/// binary, anything else text (and meta).
pub fn is_binary(first_byte: u8) -> bool {
    first_byte == REQUEST_MAGIC
}

/// The key of the text command at the start of `buf`, if its first word is a command whose
/// second word is its key (`get`, `set`, `mg`, ...) and that key is whole in `buf`. A look
/// ahead for prefetching, not a decoder: it checks nothing else (a meta key sent in base64
/// comes back encoded).
pub fn first_key(buf: &[u8]) -> Option<&[u8]> {
    const KEYED: [&[u8]; 16] = [
        b"get", b"gets", b"set", b"add", b"replace", b"append", b"prepend", b"cas", b"incr",
        b"decr", b"delete", b"touch", b"mg", b"ms", b"md", b"ma",
    ];
    let line = &buf[..buf.len().min(LINE_MAX_BYTES)];
    let command_end = memchr::memchr(b' ', line)?;
    if !KEYED.contains(&&line[..command_end]) {
        return None;
    }
    let rest = &line[command_end + 1..];
    let key_end = rest
        .iter()
        .position(|&b| matches!(b, b' ' | b'\r' | b'\n'))?;
    let key = &rest[..key_end];
    (1..=KEY_MAX_BYTES).contains(&key.len()).then_some(key)
}

/// How far [`command_keys`] searches for a line's end: a line not ended within this many bytes
/// stops the look ahead, so a long line that arrives in pieces is never searched again and
/// again by it (the decoder's own search resumes: [`LineScan`]).
pub const LOOKAHEAD_WINDOW_BYTES: usize = 16 << 10;

/// The length of the data block that follows a storage command's line (`set`, `add`,
/// `replace`, `append`, `prepend`, `cas`: the fifth word; `ms`: the third), if the line is
/// one and the length reads as a number. A look ahead's step, not a decoder's check.
fn data_block_bytes(line: &[u8]) -> Option<usize> {
    let mut words = line
        .split(|&b| matches!(b, b' ' | b'\r' | b'\n'))
        .filter(|w| !w.is_empty());
    let command = words.next()?;
    let length_word = match command {
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => words.nth(3)?,
        b"ms" => words.nth(1)?,
        _ => return None,
    };
    usize::try_from(crate::numbers::safe_strtoull(length_word)?).ok()
}

/// Calls `key` with the key of each whole text command at the start of `buf` (its first key
/// for a multiget; empty for a command without one), at most `most` commands, and returns the
/// offset after the last. A look ahead for prefetching, as [`crate::proto::frame_keys`] is for
/// binary frames: it stops at the first line not ended within [`LOOKAHEAD_WINDOW_BYTES`] or
/// data block not whole, and checks nothing but the lengths it steps over.
pub fn command_keys<'a>(buf: &'a [u8], most: usize, mut key: impl FnMut(&'a [u8])) -> usize {
    let mut at = 0;
    for _ in 0..most {
        let window = &buf[at..buf.len().min(at + LOOKAHEAD_WINDOW_BYTES)];
        let Some(newline) = memchr::memchr(b'\n', window) else {
            break;
        };
        let line = &window[..newline + 1];
        let mut end = at + line.len();
        if let Some(data) = data_block_bytes(line) {
            end = end.saturating_add(data).saturating_add(2);
            if end > buf.len() {
                break;
            }
        }
        key(first_key(line).unwrap_or_default());
        at = end;
    }
    at
}

/// The outcome of decoding the front of a buffer.
// Keys decoded from base64 live inline (no allocation), which makes the command variants large.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TextDecoded<'a> {
    /// Not a whole command yet: at least `needed` bytes must be buffered in total (the line, and
    /// for a storage command its data block and trailing `\r\n`).
    Incomplete { needed: usize },
    /// A command taking `consumed` bytes of the buffer.
    Command {
        command: TextCommand<'a>,
        consumed: usize,
    },
    /// A storage command (set/add/replace/append/prepend/cas, or `ms`) whose data block is
    /// longer than `stream_from` (and within the item size limit): only its line is consumed.
    /// The caller streams `store.value_len` bytes of value, then takes two more bytes, which
    /// must be `\r\n`; if not, the value is refused with [`TextStore::bad_chunk_reply`] (the two
    /// bytes are gone either way, as in memcached).
    LargeStore {
        store: TextStore<'a>,
        consumed: usize,
    },
    /// A storage command whose value is over the size limit: send `reply` (empty under
    /// `noreply`), drop the key's current value when `drop_existing` (memcached unlinks it so a
    /// stale copy never survives a failed overwrite: `set`, and `ms` in every mode), and discard
    /// `skip` bytes of the stream from the command's start (the line and the unread data block).
    TooLarge {
        key: Key<'a>,
        drop_existing: bool,
        reply: &'static [u8],
        skip: u64,
    },
    /// Bad input, answered as memcached answers it: send `reply` (possibly empty: `noreply`, or
    /// a close without a word), then discard `skip` bytes of the stream from the command's start
    /// (possibly more than is buffered), and close the connection if `close`.
    Error {
        reply: Cow<'static, [u8]>,
        skip: u64,
        close: bool,
    },
}

/// A decoded text or meta command. Byte slices borrow the caller's buffer.
// See TextDecoded: inline binary keys.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TextCommand<'a> {
    /// `get` (`cas: false`), `gets` (`cas: true`), `gat`/`gats` (with `touch`, the new
    /// exptime). Every key is 1 to 250 bytes; a `gat` may name none (answered `END`).
    Get {
        cas: bool,
        touch: Option<i32>,
        keys: Words<'a>,
    },
    /// set/add/replace/append/prepend/cas, or `ms`, with its whole value.
    Store {
        store: TextStore<'a>,
        value: &'a [u8],
    },
    /// A command every protocol asks the same way (`incr`, `decr`, `delete`, `touch`,
    /// `flush_all`, `version`, `verbosity`, `quit`, `mn`), and `noreply`: whether a classic
    /// command's answer is left out.
    Run { command: Command<'a>, noreply: bool },
    /// `refresh_certs`: reload the TLS certificate, key and CA (as SIGHUP does).
    RefreshCerts,
    /// `watch [kinds...]`: the connection becomes a log stream of the kinds named.
    Watch { kinds: Words<'a> },
    /// `stats [args...]`: the words after `stats` (empty for the general group; `detail` with a
    /// word other than on/off/dump was refused already). Unknown groups are the server's to
    /// answer (`ERROR`, as memcached).
    Stats { args: Words<'a> },
    /// `mg`.
    MetaGet { key: Key<'a>, flags: MgFlags<'a> },
    /// `md`.
    MetaDelete { key: Key<'a>, flags: MdFlags<'a> },
    /// `ma`.
    MetaArith { key: Key<'a>, flags: MaFlags<'a> },
    /// `me <key> [b]`.
    MetaDebug { key: Key<'a> },
    /// `lru_crawler crawl|metadump|enable|disable`.
    LruCrawler(Crawler),
    /// `shutdown` (`graceful: false`) or `shutdown graceful`: the server stops as SIGTERM
    /// (or SIGUSR1) would stop it, if it serves the command.
    Shutdown { graceful: bool },
    /// A line of a command the server may switch off, in a form memcached refuses with
    /// `reply`: sent if the server serves `command`, else `command`'s refusal; neither under
    /// `noreply`.
    Malformed {
        command: Switchable,
        reply: &'static [u8],
        noreply: bool,
    },
}

/// The commands an operator can switch off (`shutdown`: on), as memcached's `-A`, `-F`, `-X`
/// and `-W` do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switchable {
    Shutdown,
    FlushAll,
    /// `stats detail ...`: its prefix counters name keys.
    StatsDetail,
    /// `stats cachedump ...`.
    Cachedump,
    /// `lru_crawler metadump ...`.
    Metadump,
    /// `lru_crawler mgdump ...`.
    Mgdump,
    Watch,
}

impl Switchable {
    /// memcached 1.6.45's answer to the command while it is switched off.
    pub fn refusal(self) -> &'static [u8] {
        match self {
            Switchable::Shutdown => errors::SHUTDOWN_DISABLED,
            Switchable::FlushAll => errors::FLUSH_ALL_DISABLED,
            Switchable::StatsDetail => errors::STATS_DETAIL_DISABLED,
            Switchable::Cachedump => errors::CACHEDUMP_DISABLED,
            Switchable::Metadump => errors::METADUMP_DISABLED,
            Switchable::Mgdump => errors::MGDUMP_DISABLED,
            Switchable::Watch => errors::WATCH_DISABLED,
        }
    }
}

impl TextCommand<'_> {
    /// The command this asks: none for `get`, whose every key is one [`Command::Get`], for
    /// `stats`, whose group the session puts together from its words, and for what only the
    /// text protocol has (`watch`, `lru_crawler`, `refresh_certs`, authentication).
    pub fn command(&self) -> Option<Command<'_>> {
        Some(match self {
            TextCommand::Store { store, value } => store.command(Value::Whole(value)),
            TextCommand::Run { command, .. } => *command,
            TextCommand::MetaGet { key, flags } => Command::MetaGet {
                key,
                options: MetaGet {
                    touch: flags.ttl.map(store_exptime),
                    vivify: flags.vivify.map(store_exptime),
                    recache: flags.recache.map(store_exptime),
                    bump: !flags.no_bump,
                    lease: flags.value,
                    vivify_cas: flags.explicit_cas.unwrap_or(0),
                    unless_cas: flags.cas.filter(|_| flags.value),
                },
            },
            TextCommand::MetaDelete { key, flags } => Command::MetaDelete {
                key,
                // `C0` still compares (and fails), as memcached's md does.
                cas: match flags.cas {
                    Some(0) => CAS_NEVER_ISSUED,
                    cas => cas.unwrap_or(0),
                },
                invalidate: flags.invalidate,
                ttl: flags.ttl.map(store_exptime),
                empty: flags.empty.then(|| {
                    let expiry = flags.ttl.map_or(0, store_exptime);
                    (flags.client_flags, expiry)
                }),
                new_cas: flags.explicit_cas.unwrap_or(0),
            },
            TextCommand::MetaArith { key, flags } => Command::Arith {
                incr: flags.incr,
                key,
                delta: flags.delta,
                initial: flags.initial,
                // (store_exptime never gives ARITH_NO_CREATE: an i32 stays below it.)
                create: flags.vivify.map_or(ARITH_NO_CREATE, store_exptime),
                cas: flags.cas.unwrap_or(0),
                ttl: flags.ttl.map(store_exptime),
                report: true,
                new_cas: flags.explicit_cas.unwrap_or(0),
            },
            TextCommand::MetaDebug { key } => Command::Inspect { key },
            _ => return None,
        })
    }
}

/// An `lru_crawler` command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Crawler {
    /// `crawl <classes>`: reclaim the expired items of those classes now.
    Crawl(CrawlClasses),
    /// `metadump <classes>`: `OK`, one line per live item, then `END`.
    Metadump(CrawlClasses),
    /// `mgdump <classes>`: `OK`, an `mg <key>` line per live item, then `EN`.
    Mgdump(CrawlClasses),
    Enable,
    Disable,
}

/// The classes an `lru_crawler` command names, as memcached reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrawlClasses {
    /// `all` or `hash` (memcached walks its LRUs or its hash table; the items are the same).
    All,
    /// A comma-separated list of class ids, 1 to 63: bit N set for class N.
    Ids(u64),
    /// Anything else: `BADCLASS`, once the checks memcached makes first have passed.
    Invalid,
}

impl CrawlClasses {
    pub fn contains(self, class: u8) -> bool {
        match self {
            CrawlClasses::All => true,
            CrawlClasses::Ids(bits) => class < 64 && bits & (1 << class) != 0,
            CrawlClasses::Invalid => false,
        }
    }
}

/// A storage command, from the classic line or from `ms`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextStore<'a> {
    /// `cas`, and `ms` with `C` in set or replace mode, compare-and-swap: `mode` is then Set or
    /// Replace with `cas` given (memcached's NREAD_CAS). `ms` add ignores `C`; append and
    /// prepend honour it.
    pub mode: StoreMode,
    pub key: Key<'a>,
    /// Client flags (`F` for `ms`).
    pub flags: u32,
    /// As memcached parses it (`T` for `ms`; 0 when absent).
    pub exptime: i32,
    /// The `cas` command's unique, `ms`'s `C`.
    pub cas: Option<u64>,
    /// Bytes of value (the data block without its `\r\n`).
    pub value_len: usize,
    /// Classic: `noreply` (nothing is sent, errors included). `ms`: `q` (only `HD` is
    /// suppressed).
    pub noreply: bool,
    /// `Some` for `ms`: the reply flags and the rest.
    pub meta: Option<MsFlags<'a>>,
}

impl TextStore<'_> {
    /// The CAS this store compares with, as the store takes it (0: none).
    pub fn compare_cas(&self) -> u64 {
        match (self.mode, self.cas) {
            // memcached's add ignores a CAS (only `ms` can give one: "add-with-cas works the
            // same as add").
            (StoreMode::Add, _) => 0,
            // A `cas` (or `ms C0`) with unique 0 still compares, and fails.
            (StoreMode::Set | StoreMode::Replace, Some(0)) => CAS_NEVER_ISSUED,
            (_, cas) => cas.unwrap_or(0),
        }
    }

    /// The store as every protocol asks it, with its value whole or streamed.
    pub fn command<'s>(&'s self, value: Value<'s>) -> Command<'s> {
        Command::Store {
            mode: self.mode,
            key: &self.key,
            value,
            flags: self.flags,
            expiry: store_exptime(self.exptime),
            cas: self.compare_cas(),
            invalidate: self.meta.as_ref().is_some_and(|ms| ms.invalidate),
            explicit_cas: self.explicit_cas(),
            vivify: self.vivify_expiry(),
            drop_on_failure: self.drops_on_failure(),
        }
    }

    /// memcached 1.6.45's rule (`proto_parser.c`): a `set` (not a `cas`), or an `ms` in any
    /// mode, that cannot be stored for want of room drops the key's current item.
    pub fn drops_on_failure(&self) -> bool {
        self.meta.is_some() || (self.mode == StoreMode::Set && self.cas.is_none())
    }

    /// `ms ... E<cas>`: the CAS the stored item takes (0: one is drawn).
    pub fn explicit_cas(&self) -> u64 {
        self.meta
            .as_ref()
            .and_then(|ms| ms.explicit_cas)
            .unwrap_or(0)
    }

    /// `ms ... MA|MP N<ttl>`: the expiry of the item an append onto a missing key creates.
    pub fn vivify_expiry(&self) -> Option<u32> {
        self.meta
            .as_ref()
            .and_then(|ms| ms.vivify)
            .map(store_exptime)
    }

    /// What to send when the two bytes after the value are not `\r\n`: memcached's `CLIENT_ERROR
    /// bad data chunk`, silenced by a classic `noreply` (never for `ms`).
    pub fn bad_chunk_reply(&self) -> &'static [u8] {
        if self.noreply && self.meta.is_none() {
            b""
        } else {
            errors::BAD_DATA_CHUNK
        }
    }
}

/// Space-separated words of a line (a multiget's keys, `stats` arguments): iterate with
/// [`Words::iter`]; no allocation. Equal when the words are.
#[derive(Clone, Copy, Default)]
pub struct Words<'a> {
    text: &'a [u8],
}

impl<'a> Words<'a> {
    pub fn new(text: &'a [u8]) -> Words<'a> {
        Words { text }
    }

    pub fn iter(&self) -> WordIter<'a> {
        WordIter { rest: self.text }
    }

    /// The words' text, without the spaces around them (the spaces between kept).
    pub fn as_bytes(&self) -> &'a [u8] {
        let start = self.text.iter().position(|&b| b != b' ');
        let end = self.text.iter().rposition(|&b| b != b' ');
        match (start, end) {
            (Some(s), Some(e)) => &self.text[s..=e],
            _ => b"",
        }
    }

    pub fn count(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }
}

impl<'a> IntoIterator for Words<'a> {
    type Item = &'a [u8];
    type IntoIter = WordIter<'a>;
    fn into_iter(self) -> WordIter<'a> {
        self.iter()
    }
}

impl PartialEq for Words<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Words<'_> {}

impl fmt::Debug for Words<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(|w| w.escape_ascii().to_string()))
            .finish()
    }
}

/// The words of a [`Words`].
#[derive(Clone, Debug)]
pub struct WordIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for WordIter<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = &self.rest[start..];
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        self.rest = &rest[end..];
        Some(&rest[..end])
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------------

/// A line split as memcached's `tokenize_command` splits it: at most 23 tokens.
struct Tokens<'a> {
    toks: [&'a [u8]; MAX_TOKENS - 1],
    n: usize,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a [u8]) -> Tokens<'a> {
        let mut toks: [&'a [u8]; MAX_TOKENS - 1] = [b""; MAX_TOKENS - 1];
        let mut n = 0;
        for word in Words::new(text).iter().take(MAX_TOKENS - 1) {
            toks[n] = word;
            n += 1;
        }
        Tokens { toks, n }
    }

    fn all(&self) -> &[&'a [u8]] {
        &self.toks[..self.n]
    }

    /// memcached's `ntokens`: the tokens plus its terminal marker.
    fn ntokens(&self) -> usize {
        self.n + 1
    }

    /// The last token memcached saw (`tokens[ntokens - 2]`).
    fn last(&self) -> &'a [u8] {
        self.toks[self.n - 1]
    }

    /// memcached's `set_noreply_maybe`.
    fn noreply(&self) -> bool {
        self.last() == b"noreply"
    }
}

fn error(reply: &'static [u8], skip: usize) -> TextDecoded<'static> {
    TextDecoded::Error {
        reply: Cow::Borrowed(reply),
        skip: skip as u64,
        close: false,
    }
}

fn close(reply: &'static [u8]) -> TextDecoded<'static> {
    TextDecoded::Error {
        reply: Cow::Borrowed(reply),
        skip: 0,
        close: true,
    }
}

/// An error `out_string` would send, silenced by `noreply`.
fn error_unless(noreply: bool, reply: &'static [u8], skip: usize) -> TextDecoded<'static> {
    error(if noreply { b"" } else { reply }, skip)
}

fn command(command: TextCommand<'_>, consumed: usize) -> TextDecoded<'_> {
    TextDecoded::Command { command, consumed }
}

/// A switchable command's line in a form memcached refuses with `reply`.
fn malformed(
    switchable: Switchable,
    reply: &'static [u8],
    noreply: bool,
    line_len: usize,
) -> TextDecoded<'static> {
    let malformed = TextCommand::Malformed {
        command: switchable,
        reply,
        noreply,
    };
    command(malformed, line_len)
}

/// Whether a line memcached found no newline in is a multiget it keeps buffering.
fn is_multiget(line: &[u8]) -> bool {
    let spaces = line.iter().take_while(|&&b| b == b' ').count();
    let rest = &line[spaces..];
    spaces <= MULTIGET_LEADING_SPACES_MAX
        && (rest.starts_with(b"get ") || rest.starts_with(b"gets "))
}

/// Where the search for the end of the line at a buffer's front stopped, so that a line
/// arriving in many reads is searched once, not once per read: a caller that decodes the same
/// unfinished line again (the buffer's front unchanged, more bytes behind) passes the same
/// `LineScan` back, and the search resumes where it stopped. A caller that consumes bytes
/// moves the buffer's front and must say so ([`LineScan::consumed`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineScan {
    /// Bytes at the buffer's front known to hold no `\n`.
    pub newline_free: usize,
    /// Bytes examined by line-end searches so far (a count for STAT `line_scan_bytes`).
    pub bytes_examined: u64,
}

impl LineScan {
    /// The buffer's front moved `bytes` forward (bytes consumed or skipped).
    pub fn consumed(&mut self, bytes: usize) {
        self.newline_free = self.newline_free.saturating_sub(bytes);
    }

    /// Searches `buf[..end]` for `\n`, from where the last search stopped.
    fn find(&mut self, buf: &[u8], end: usize) -> Option<usize> {
        let from = self.newline_free.min(end);
        let found = memchr::memchr(b'\n', &buf[from..end]).map(|i| from + i);
        let stop = found.map_or(end, |at| at + 1);
        self.bytes_examined += (stop - from) as u64;
        self.newline_free = self.newline_free.max(found.unwrap_or(end));
        found
    }
}

/// Decodes the first command of `buf`. Values longer than `max_value_bytes` are never buffered
/// ([`TextDecoded::TooLarge`]); values longer than `stream_from` come back as
/// [`TextDecoded::LargeStore`] once their line is in, for the caller to stream.
pub fn decode_text(buf: &[u8], max_value_bytes: usize, stream_from: usize) -> TextDecoded<'_> {
    decode_text_resuming(buf, &mut LineScan::default(), max_value_bytes, stream_from)
}

/// [`decode_text`], resuming the search for the line's end where `scan` says the last search
/// over the same buffer front stopped. Each byte of a line is examined once however many reads
/// bring it (the answer is the same as [`decode_text`]'s on the whole buffer).
pub fn decode_text_resuming<'a>(
    buf: &'a [u8],
    scan: &mut LineScan,
    max_value_bytes: usize,
    stream_from: usize,
) -> TextDecoded<'a> {
    let mut newline = scan.find(buf, buf.len().min(LINE_MAX_BYTES + 1));
    if newline.is_none() && buf.len() > LINE_MAX_BYTES {
        if !is_multiget(&buf[..=LINE_MAX_BYTES]) {
            return close(b"");
        }
        newline = scan.find(buf, buf.len().min(MULTIGET_LINE_MAX_BYTES));
        if newline.is_none() && buf.len() >= MULTIGET_LINE_MAX_BYTES {
            return close(errors::MULTIGET_OUT_OF_MEMORY);
        }
    }
    let Some(newline) = newline else {
        return TextDecoded::Incomplete {
            needed: buf.len() + 1,
        };
    };
    let line_len = newline + 1;
    let mut text = &buf[..newline];
    if text.len() > 1 && text.ends_with(b"\r") {
        text = &text[..text.len() - 1];
    }
    // (memcached 1.6.40 and later read a NUL as any other byte: it may be part of a key.)
    decode_line(buf, text, line_len, max_value_bytes, stream_from)
}

fn decode_line<'a>(
    buf: &'a [u8],
    text: &'a [u8],
    line_len: usize,
    max_value_bytes: usize,
    stream_from: usize,
) -> TextDecoded<'a> {
    // The commonest command needs no token array: `get`/`gets` then the keys, as the general
    // path below reads them (a line with leading spaces takes that path).
    for (prefix, cas) in [(&b"get "[..], false), (&b"gets "[..], true)] {
        if let Some(rest) = text.strip_prefix(prefix) {
            return get_keys(Words::new(rest), line_len, cas, None);
        }
    }
    // memcached 1.6.45 refuses a line of under 4 bytes, its newline included, as malformed,
    // and one that starts with a blank as unknown.
    if line_len < 4 {
        return error(errors::BAD_FORMAT, line_len);
    }
    if text.first() == Some(&b' ') {
        return error(errors::ERROR, line_len);
    }
    let tokens = Tokens::new(text);
    let nt = tokens.ntokens();
    if nt < 2 || tokens.toks[0].len() < 2 {
        return error(errors::ERROR, line_len);
    }
    let name = tokens.toks[0];
    // An unknown command: ERROR, or a silent close for what looks like HTTP.
    let unknown = || {
        if tokens.last().starts_with(b"HTTP/") {
            close(b"")
        } else {
            error(errors::ERROR, line_len)
        }
    };
    // A storage line needs its 5 tokens (a `cas` without its unique is refused once its
    // length is read, its data block swallowed); more are ignored (`noreply` counts only as
    // the last).
    let storage = |mode, cas| {
        if nt < 6 {
            return error(errors::BAD_FORMAT, line_len);
        }
        update(
            buf,
            &tokens,
            line_len,
            mode,
            cas,
            max_value_bytes,
            stream_from,
        )
    };
    // Names for which memcached does something Headroom does not serve.
    let unsupported = |name: &[u8]| matches!(name, b"cache_memlimit" | b"lru" | b"extstore");
    match name[0] {
        b'm' if name.len() == 2 => {
            meta_command(buf, &tokens, line_len, max_value_bytes, stream_from)
        }
        b'g' => match name {
            b"get" | b"gets" | b"gat" | b"gats" if nt < 3 => error(errors::BAD_FORMAT, line_len),
            b"get" => get(text, &tokens, line_len, false, false),
            b"gets" => get(text, &tokens, line_len, true, false),
            b"gat" => get(text, &tokens, line_len, false, true),
            b"gats" => get(text, &tokens, line_len, true, true),
            _ => unknown(),
        },
        b's' => match name {
            b"set" => storage(StoreMode::Set, false),
            b"stats" => stats(text, &tokens, line_len),
            b"slabs" => slabs(&tokens, line_len),
            b"shutdown" => shutdown(&tokens, line_len),
            _ => unknown(),
        },
        b'a' => match name {
            b"add" => storage(StoreMode::Add, false),
            b"append" => storage(StoreMode::Append, false),
            _ => unknown(),
        },
        b'c' => match name {
            b"cas" => storage(StoreMode::Set, true),
            _ => unknown(),
        },
        b'i' => match name {
            b"incr" => arith(&tokens, line_len, true),
            _ => unknown(),
        },
        b'd' => match name {
            b"delete" => delete(&tokens, line_len),
            b"decr" => arith(&tokens, line_len, false),
            _ => unknown(),
        },
        b't' => match name {
            b"touch" => touch(&tokens, line_len),
            _ => unknown(),
        },
        _ => match name {
            b"replace" => storage(StoreMode::Replace, false),
            b"prepend" => storage(StoreMode::Prepend, false),
            b"flush_all" => flush_all(&tokens, line_len),
            b"version" => run(Command::Version, false, line_len),
            b"refresh_certs" => command(TextCommand::RefreshCerts, line_len),
            b"quit" => run(Command::Quit, false, line_len),
            // memcached reads the kinds from its (at most 23) tokens.
            b"watch" => {
                let kinds = Words::new(after_words(text, 1));
                if kinds.count() > MAX_TOKENS - 2 {
                    return malformed(Switchable::Watch, errors::ERROR, false, line_len);
                }
                command(TextCommand::Watch { kinds }, line_len)
            }
            b"verbosity" => verbosity(&tokens, line_len),
            b"lru_crawler" => lru_crawler(&tokens, line_len),
            _ if unsupported(name) => error(errors::ERROR, line_len),
            _ => unknown(),
        },
    }
}

/// The text after the first `skip` words of a line.
fn after_words(text: &[u8], skip: usize) -> &[u8] {
    let mut rest = text;
    for _ in 0..skip {
        let start = rest.iter().position(|&b| b != b' ').unwrap_or(rest.len());
        rest = &rest[start..];
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        rest = &rest[end..];
    }
    rest
}

fn get<'a>(
    text: &'a [u8],
    tokens: &Tokens<'a>,
    line_len: usize,
    cas: bool,
    touch: bool,
) -> TextDecoded<'a> {
    let touch = if touch {
        match safe_strtol(tokens.toks[1]) {
            Some(exptime) => Some(exptime),
            None => return error(errors::INVALID_EXPTIME, line_len),
        }
    } else {
        None
    };
    let keys = Words::new(after_words(text, if touch.is_some() { 2 } else { 1 }));
    get_keys(keys, line_len, cas, touch)
}

/// A retrieval of `keys`: CLIENT_ERROR with none, or with one over 250 bytes (memcached
/// 1.6.45).
fn get_keys(keys: Words<'_>, line_len: usize, cas: bool, touch: Option<i32>) -> TextDecoded<'_> {
    let mut any = false;
    for key in keys.iter() {
        if key.len() > KEY_MAX_BYTES {
            return error(errors::BAD_FORMAT, line_len);
        }
        any = true;
    }
    if !any {
        return error(errors::BAD_FORMAT, line_len);
    }
    command(TextCommand::Get { cas, touch, keys }, line_len)
}

/// A data block's length as memcached 1.6.45 reads it (`mcmc_tokto32`): digits only, from 0
/// to 2^31 - 3.
pub(crate) fn value_length(token: &[u8]) -> Option<usize> {
    crate::numbers::digits_u32(token)
        .map(|len| len as usize)
        .filter(|&len| len <= TEXT_VALUE_MAX_BYTES)
}

/// memcached's `process_update_command`.
fn update<'a>(
    buf: &'a [u8],
    tokens: &Tokens<'a>,
    line_len: usize,
    mode: StoreMode,
    with_cas: bool,
    max_value_bytes: usize,
    stream_from: usize,
) -> TextDecoded<'a> {
    let noreply = tokens.noreply();
    let t = &tokens.toks;
    // memcached 1.6.45 reads the data length first, before it looks for `noreply`: a length
    // that is not a number from 0 to 2^31 - 3 is answered even under `noreply`.
    let len = match value_length(t[4]) {
        Some(len) => len,
        None => return error(errors::BAD_FORMAT, line_len),
    };
    // From here on a refused line takes its data block with it (1.6.45 swallows it).
    let swallow = line_len + len + 2;
    if t[1].len() > KEY_MAX_BYTES {
        return error_unless(noreply, errors::BAD_FORMAT, swallow);
    }
    let (Some(flags), Some(exptime)) = (safe_strtoul(t[2]), safe_strtol(t[3])) else {
        return error_unless(noreply, errors::BAD_FORMAT, swallow);
    };
    let cas = if with_cas {
        match safe_strtoull(t[5]) {
            Some(cas) => Some(cas),
            None => return error_unless(noreply, errors::BAD_FORMAT, swallow),
        }
    } else {
        None
    };
    let store = TextStore {
        mode,
        key: Key::text(t[1]),
        flags,
        exptime,
        cas,
        value_len: len,
        noreply,
        meta: None,
    };
    finish_store(buf, line_len, store, max_value_bytes, stream_from)
}

/// A command every protocol asks the same way, decoded from a line of `line_len` bytes.
fn run(command: Command<'_>, noreply: bool, line_len: usize) -> TextDecoded<'_> {
    self::command(TextCommand::Run { command, noreply }, line_len)
}

/// A storage line that passed its checks: too large, streamed, waiting, or whole.
fn finish_store<'a>(
    buf: &'a [u8],
    line_len: usize,
    store: TextStore<'a>,
    max_value_bytes: usize,
    stream_from: usize,
) -> TextDecoded<'a> {
    let total = line_len + store.value_len + 2;
    if store.value_len > max_value_bytes {
        let classic = store.meta.is_none();
        return TextDecoded::TooLarge {
            key: store.key,
            drop_existing: store.drops_on_failure(),
            reply: if classic && store.noreply {
                b""
            } else {
                errors::TOO_LARGE
            },
            skip: total as u64,
        };
    }
    if store.value_len > stream_from {
        return TextDecoded::LargeStore {
            store,
            consumed: line_len,
        };
    }
    if buf.len() < total {
        return TextDecoded::Incomplete { needed: total };
    }
    if &buf[total - 2..total] != b"\r\n" {
        return error(store.bad_chunk_reply(), total);
    }
    let value = &buf[line_len..total - 2];
    command(TextCommand::Store { store, value }, total)
}

fn arith<'a>(tokens: &Tokens<'a>, line_len: usize, incr: bool) -> TextDecoded<'a> {
    if tokens.ntokens() < 4 {
        return error(errors::BAD_FORMAT, line_len);
    }
    let noreply = tokens.noreply();
    let key = tokens.toks[1];
    if key.len() > KEY_MAX_BYTES {
        return error_unless(noreply, errors::BAD_FORMAT, line_len);
    }
    let Some(delta) = safe_strtoull(tokens.toks[2]) else {
        return error_unless(noreply, errors::INVALID_DELTA, line_len);
    };
    let arith = Command::Arith {
        incr,
        key,
        delta,
        initial: 0,
        create: ARITH_NO_CREATE,
        cas: 0,
        ttl: None,
        report: false,
        new_cas: 0,
    };
    run(arith, noreply, line_len)
}

/// `delete <key> [anything ...] [noreply]`: 1.6.45 ignores the tokens after the key (the old
/// hold time) and reads `noreply` as the last.
fn delete<'a>(tokens: &Tokens<'a>, line_len: usize) -> TextDecoded<'a> {
    let nt = tokens.ntokens();
    if nt < 3 {
        return error(errors::BAD_FORMAT, line_len);
    }
    let noreply = nt > 3 && tokens.noreply();
    let key = tokens.toks[1];
    if key.len() > KEY_MAX_BYTES {
        return error_unless(noreply, errors::BAD_FORMAT, line_len);
    }
    run(Command::Delete { key, cas: 0 }, noreply, line_len)
}

fn touch<'a>(tokens: &Tokens<'a>, line_len: usize) -> TextDecoded<'a> {
    if tokens.ntokens() < 4 {
        return error(errors::BAD_FORMAT, line_len);
    }
    let noreply = tokens.noreply();
    let key = tokens.toks[1];
    if key.len() > KEY_MAX_BYTES {
        return error_unless(noreply, errors::BAD_FORMAT, line_len);
    }
    let Some(exptime) = safe_strtol(tokens.toks[2]) else {
        return error_unless(noreply, errors::INVALID_EXPTIME, line_len);
    };
    let touch = Command::Get {
        key,
        touch: Some(store_exptime(exptime)),
        value: false,
    };
    run(touch, noreply, line_len)
}

fn flush_all<'a>(tokens: &Tokens<'a>, line_len: usize) -> TextDecoded<'a> {
    let nt = tokens.ntokens();
    let noreply = tokens.noreply();
    let mut delay = 0;
    if nt != if noreply { 3 } else { 2 } {
        match safe_strtol(tokens.toks[1]) {
            Some(d) => delay = d,
            None => {
                let reply = errors::INVALID_EXPTIME;
                return malformed(Switchable::FlushAll, reply, noreply, line_len);
            }
        }
    }
    // memcached's delay: 0 or negative is now.
    let flush = Command::Flush {
        delay: delay.max(0) as u32,
    };
    run(flush, noreply, line_len)
}

/// `shutdown [graceful]`, as memcached 1.6.45 reads it: alone, or with `graceful` as its one
/// argument (memcached compares only the argument's own length, so any prefix of `graceful`
/// is `graceful`); anything else is an invalid mode, silenced by a last `noreply`.
fn shutdown<'a>(tokens: &Tokens<'a>, line_len: usize) -> TextDecoded<'a> {
    match tokens.all() {
        [_] => command(TextCommand::Shutdown { graceful: false }, line_len),
        [_, mode] if b"graceful".starts_with(mode) => {
            command(TextCommand::Shutdown { graceful: true }, line_len)
        }
        _ => {
            let reply = errors::SHUTDOWN_INVALID_MODE;
            malformed(Switchable::Shutdown, reply, tokens.noreply(), line_len)
        }
    }
}

fn verbosity<'a>(tokens: &Tokens<'a>, line_len: usize) -> TextDecoded<'a> {
    if tokens.ntokens() < 3 {
        return error(errors::BAD_FORMAT, line_len);
    }
    let noreply = tokens.noreply();
    match safe_strtoul(tokens.toks[1]) {
        // The level is the log's (`--log-level`): checked as memcached checks it, then left.
        Some(_) => run(Command::Verbosity, noreply, line_len),
        None => error_unless(noreply, errors::BAD_FORMAT, line_len),
    }
}

/// memcached's `slabs reassign|automove`, parsed as memcached parses them. Headroom has no slab
/// classes to move pages between (free blocks go back to one pool that serves every item
/// class), so a well-formed command is refused with the reason, never silently accepted.
fn slabs<'a>(tokens: &Tokens<'a>, line_len: usize) -> TextDecoded<'a> {
    let t = tokens.all();
    let nt = tokens.ntokens();
    if nt == 5 && t[1] == b"reassign" {
        // memcached refuses before it parses when reassignment is off.
        return error(errors::SLAB_REASSIGN_DISABLED, line_len);
    }
    if nt < 4 || t[1] != b"automove" {
        return error(errors::ERROR, line_len);
    }
    let noreply = tokens.noreply();
    if t[2] == b"ratio" {
        let ratio = std::str::from_utf8(t.get(3).copied().unwrap_or_default())
            .ok()
            .and_then(|r| r.parse::<f64>().ok());
        if nt < 5 || ratio.is_none() {
            return error_unless(noreply, errors::ERROR, line_len);
        }
    } else {
        match safe_strtoul(t[2]) {
            None => return error_unless(noreply, errors::BAD_FORMAT, line_len),
            Some(0..=2) => {}
            Some(_) => return error_unless(noreply, errors::ERROR, line_len),
        }
    }
    error_unless(noreply, errors::NO_SLAB_CLASSES, line_len)
}

/// `lru_crawler ...`, with memcached's answers to malformed input. `tocrawl` and `sleep` tune
/// memcached's crawler thread; Headroom's expiry sweep has no such knobs, so a well-formed one
/// is refused in words rather than acknowledged and ignored.
fn lru_crawler<'a>(tokens: &Tokens<'a>, line_len: usize) -> TextDecoded<'a> {
    let t = tokens.all();
    match (tokens.ntokens(), t.get(1).copied().unwrap_or_default()) {
        (4, b"crawl" | b"metadump" | b"mgdump") => {
            let classes = crawl_classes(t[2]);
            let crawler = match t[1] {
                b"crawl" => Crawler::Crawl(classes),
                b"metadump" => Crawler::Metadump(classes),
                _ => Crawler::Mgdump(classes),
            };
            command(TextCommand::LruCrawler(crawler), line_len)
        }
        (4, b"tocrawl" | b"sleep") => match safe_strtoul(t[2]) {
            None => error(errors::BAD_FORMAT, line_len),
            Some(_) => error(errors::CRAWLER_PACE, line_len),
        },
        (3, b"enable") => command(TextCommand::LruCrawler(Crawler::Enable), line_len),
        (3, b"disable") => command(TextCommand::LruCrawler(Crawler::Disable), line_len),
        _ => error(errors::ERROR, line_len),
    }
}

/// `all`, `hash`, or class ids `1,2,...` below 64.
fn crawl_classes(word: &[u8]) -> CrawlClasses {
    if word == b"all" || word == b"hash" {
        return CrawlClasses::All;
    }
    let mut bits = 0u64;
    for id in word.split(|&b| b == b',').filter(|id| !id.is_empty()) {
        match safe_strtoul(id) {
            Some(class @ 1..=63) => bits |= 1 << class,
            _ => return CrawlClasses::Invalid,
        }
    }
    CrawlClasses::Ids(bits)
}

fn stats<'a>(text: &'a [u8], tokens: &Tokens<'a>, line_len: usize) -> TextDecoded<'a> {
    let t = tokens.all();
    let bad = |switchable, reply| malformed(switchable, reply, false, line_len);
    if t.get(1) == Some(&&b"detail"[..])
        && !matches!(t.get(2).copied(), Some(b"on" | b"off" | b"dump"))
    {
        return bad(Switchable::StatsDetail, errors::STATS_DETAIL_USAGE);
    }
    if t.get(1) == Some(&&b"cachedump"[..]) {
        if tokens.ntokens() < 5 {
            return bad(Switchable::Cachedump, errors::BAD_COMMAND_LINE);
        }
        match (safe_strtoul(t[2]), safe_strtoul(t[3])) {
            (Some(class), Some(_)) if class < CACHEDUMP_CLASSES => {}
            (Some(_), Some(_)) => return bad(Switchable::Cachedump, errors::ILLEGAL_SLAB_ID),
            _ => return bad(Switchable::Cachedump, errors::BAD_FORMAT),
        }
    }
    let args = Words::new(after_words(text, 1));
    command(TextCommand::Stats { args }, line_len)
}

/// memcached refuses a `stats cachedump` class id from this on (its slab class limit).
const CACHEDUMP_CLASSES: u32 = 64;

/// The switchable command a well-formed `stats` line asks, by its group's first word: `detail`
/// or `cachedump` (which list keys); `None` for the other groups.
pub fn stats_switchable(args: &Words<'_>) -> Option<Switchable> {
    match args.iter().next()? {
        b"detail" => Some(Switchable::StatsDetail),
        b"cachedump" => Some(Switchable::Cachedump),
        _ => None,
    }
}

/// The class and limit of a `stats cachedump <class> <limit>` the decoder let through (it
/// refused the malformed ones); `None` for any other `stats` line.
pub fn cachedump_args(args: &Words<'_>) -> Option<(u32, u32)> {
    let mut words = args.iter();
    if words.next()? != b"cachedump" {
        return None;
    }
    let class = safe_strtoul(words.next()?)?;
    let limit = safe_strtoul(words.next()?)?;
    Some((class, limit))
}

fn meta_command<'a>(
    buf: &'a [u8],
    tokens: &Tokens<'a>,
    line_len: usize,
    max_value_bytes: usize,
    stream_from: usize,
) -> TextDecoded<'a> {
    let which = tokens.toks[0][1];
    if matches!(which, b'g' | b's' | b'd' | b'a') && tokens.ntokens() < 3 {
        return error(errors::BAD_FORMAT, line_len);
    }
    let t = tokens.all();
    match which {
        b'g' => match meta::parse_mg(t) {
            Ok((key, flags)) => command(TextCommand::MetaGet { key, flags }, line_len),
            Err(reply) => error(reply, line_len),
        },
        b's' => match meta::parse_ms(t) {
            Ok(store) => finish_store(buf, line_len, store, max_value_bytes, stream_from),
            Err(refused) => error(refused.reply, line_len + refused.swallow.unwrap_or(0)),
        },
        b'd' => match meta::parse_md(t) {
            Ok((key, flags)) => command(TextCommand::MetaDelete { key, flags }, line_len),
            Err(reply) => error(reply, line_len),
        },
        b'a' => match meta::parse_ma(t) {
            Ok((key, flags)) => command(TextCommand::MetaArith { key, flags }, line_len),
            Err(reply) => error(reply, line_len),
        },
        b'n' => run(Command::Noop, false, line_len),
        b'e' => match meta::parse_me(t) {
            Ok(key) => command(TextCommand::MetaDebug { key }, line_len),
            Err(reply) => error(reply, line_len),
        },
        _ => error(errors::ERROR, line_len),
    }
}

// ---------------------------------------------------------------------------------------------
// Replies (formatting only)
// ---------------------------------------------------------------------------------------------

pub const END: &[u8] = b"END\r\n";
pub const STORED: &[u8] = b"STORED\r\n";
pub const NOT_STORED: &[u8] = b"NOT_STORED\r\n";
pub const EXISTS: &[u8] = b"EXISTS\r\n";
pub const NOT_FOUND: &[u8] = b"NOT_FOUND\r\n";
pub const DELETED: &[u8] = b"DELETED\r\n";
pub const TOUCHED: &[u8] = b"TOUCHED\r\n";
/// `flush_all`, `verbosity`, `stats detail on|off`.
pub const OK: &[u8] = b"OK\r\n";
/// `stats reset`.
pub const RESET: &[u8] = b"RESET\r\n";

/// A one-line status reply of the classic commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextStatus {
    Stored,
    NotStored,
    Exists,
    NotFound,
    Deleted,
    Touched,
    Ok,
    Reset,
    End,
}

impl TextStatus {
    pub fn line(self) -> &'static [u8] {
        match self {
            TextStatus::Stored => STORED,
            TextStatus::NotStored => NOT_STORED,
            TextStatus::Exists => EXISTS,
            TextStatus::NotFound => NOT_FOUND,
            TextStatus::Deleted => DELETED,
            TextStatus::Touched => TOUCHED,
            TextStatus::Ok => OK,
            TextStatus::Reset => RESET,
            TextStatus::End => END,
        }
    }
}

/// Appends a status line (`STORED\r\n`, ...).
pub fn status(out: &mut Vec<u8>, status: TextStatus) {
    out.extend_from_slice(status.line());
}

/// Appends `VALUE <key> <flags> <bytes>[ <cas>]\r\n`; the caller appends the value and `\r\n`
/// (then `END\r\n` after the last key).
pub fn value_header(out: &mut Vec<u8>, key: &[u8], flags: u32, bytes: usize, cas: Option<u64>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    push_number(out, u64::from(flags));
    out.push(b' ');
    push_number(out, bytes as u64);
    if let Some(cas) = cas {
        out.push(b' ');
        push_number(out, cas);
    }
    out.extend_from_slice(b"\r\n");
}

/// Appends `END\r\n`.
pub fn end(out: &mut Vec<u8>) {
    out.extend_from_slice(END);
}

/// Appends an INCR/DECR result: the new value and `\r\n`.
pub fn counter(out: &mut Vec<u8>, value: u64) {
    push_number(out, value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `VERSION <version>\r\n`.
pub fn version(out: &mut Vec<u8>, version: &str) {
    out.extend_from_slice(b"VERSION ");
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `STAT <name> <value>\r\n` (then `END\r\n` after the last).
pub fn stat(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name);
    out.push(b' ');
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// [`stat`] with a number.
pub fn stat_u64(out: &mut Vec<u8>, name: &[u8], value: u64) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name);
    out.push(b' ');
    push_number(out, value);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_ahead(buf: &[u8], most: usize) -> (Vec<&[u8]>, usize) {
        let mut keys = Vec::new();
        let end = command_keys(buf, most, |key| keys.push(key));
        (keys, end)
    }

    #[test]
    fn the_look_ahead_steps_over_data_blocks_and_stops_at_a_partial_command() {
        let buf =
            b"get a\r\nset b 0 0 5\r\nx\nyz\n\r\nms c 2 T0\r\nhi\r\nmn\r\ncas d 0 0 1 7\r\nv\r\n";
        let (keys, end) = keys_ahead(buf, 16);
        assert_eq!(keys, [&b"a"[..], b"b", b"c", b"", b"d"]);
        assert_eq!(end, buf.len());
        // At most `most`, ending after the last one taken.
        let (keys, end) = keys_ahead(buf, 2);
        assert_eq!(keys, [&b"a"[..], b"b"]);
        assert_eq!(&buf[end..end + 2], b"ms");
        // A data block not whole, a line not ended: the look stops before them.
        let (keys, end) = keys_ahead(b"get a\r\nset b 0 0 5\r\nxy", 16);
        assert_eq!((keys, end), (vec![&b"a"[..]], 7));
        let (keys, end) = keys_ahead(b"get a\r\nget b", 16);
        assert_eq!((keys, end), (vec![&b"a"[..]], 7));
        // A line longer than the window is never searched to its end.
        let long = [b"get ".as_slice(), &[b'k'; LOOKAHEAD_WINDOW_BYTES], b"\r\n"].concat();
        assert_eq!(keys_ahead(&long, 16), (vec![], 0));
        // A length that is no number takes no data block (the decoder answers the error).
        let (keys, _) = keys_ahead(b"set e 0 0 x\r\nget f\r\n", 16);
        assert_eq!(keys, [&b"e"[..], b"f"]);
    }

    #[test]
    fn numbers_parse_as_memcached_parses_them_and_never_wrap() {
        assert_eq!(safe_strtol(b"4294967298"), None);
        assert_eq!(safe_strtol(b"2147483647"), Some(i32::MAX));
        assert_eq!(safe_strtol(b"2147483648"), None);
        assert_eq!(safe_strtol(b"-2147483648"), Some(i32::MIN));
        assert_eq!(safe_strtol(b"-2147483649"), None);
        assert_eq!(safe_strtol(b"-1"), Some(-1));
        assert_eq!(safe_strtol(b"9223372036854775807"), None);
        assert_eq!(safe_strtol(b"-9223372036854775809"), None);
        assert_eq!(safe_strtol(b"5\tjunk"), Some(5));
        assert_eq!(safe_strtol(b"\x0b1"), Some(1));
        assert_eq!(safe_strtol(b"5x"), None);
        assert_eq!(safe_strtol(b"+"), None);
        assert_eq!(safe_strtol(b""), None);
        assert_eq!(safe_strtoul(b"4294967295"), Some(u32::MAX));
        assert_eq!(safe_strtoul(b"4294967296"), None);
        assert_eq!(safe_strtoul(b"-1"), None);
        assert_eq!(safe_strtoul(b"-0"), Some(0));
        assert_eq!(safe_strtoul(b"-18446744073709551615"), None);
        assert_eq!(safe_strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(safe_strtoull(b"-18446744073709551615"), None);
        assert_eq!(safe_strtoull(b"-9223372036854775809"), None);
        assert_eq!(safe_strtoull(b"18446744073709551616"), None);
        // (memcached looks for the sign only before the number's end.)
        assert_eq!(safe_strtoull(b"18446744073709551615\t-"), Some(u64::MAX));
        assert_eq!(safe_strtoull(b"0x1"), None);
    }

    #[test]
    fn a_pipeline_decodes_in_order() {
        let stream = b"set a 0 0 1\r\nx\r\nget a b\r\nmn\r\n";
        let mut at = 0;
        let mut seen = Vec::new();
        while at < stream.len() {
            match decode_text(&stream[at..], 1024, usize::MAX) {
                TextDecoded::Command { command, consumed } => {
                    seen.push(format!("{command:?}"));
                    at += consumed;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(seen.len(), 3);
        assert!(seen[1].contains("Get"));
    }

    #[test]
    fn replies_format() {
        let mut out = Vec::new();
        value_header(&mut out, b"k", 5, 3, Some(9));
        value_header(&mut out, b"k", 0, 0, None);
        counter(&mut out, 42);
        version(&mut out, "1.6.18");
        stat_u64(&mut out, b"pid", 7);
        status(&mut out, TextStatus::Touched);
        assert_eq!(
            out,
            b"VALUE k 5 3 9\r\nVALUE k 0 0\r\n42\r\nVERSION 1.6.18\r\nSTAT pid 7\r\nTOUCHED\r\n"
        );
    }
}
