//! The meta commands of memcached 1.6.45's text protocol (`mg`, `ms`, `md`, `ma`, `me`, `mn`):
//! keys (base64 ones decoded inline), flag parsing exactly as `proto_text.c`'s
//! `_meta_flag_preparse` and the per-command checks around it, and the reply-line formatting.
//!
//! Like the rest of [`crate::proto`], nothing here knows what a store is. The line framing and
//! the dispatch live in [`super::text`]; this module turns a meta command's tokens into typed
//! flags or memcached's exact error line.
//!
//! # Flags, as memcached 1.6.45 parses them
//!
//! memcached runs one flag parser for every meta command, so a flag that parser knows is accepted
//! (and ignored) by a command that has no use for it (`mg key C5` answers like `mg key`), and a
//! flag it does not know is `CLIENT_ERROR invalid flag` (`mg key S5`), and a token that does not
//! start with a letter or digit makes the line malformed. Only a token's first byte names the
//! flag (`vfoo` is `v`). The TTL flags' numbers (`T`, `N`, `R`) are digits with an optional `-`
//! (1.6.45's `mcmc_tokto32`); the others are read as C's `strtoul`/`strtoull` read them. A
//! number that does not fit its field is refused, never truncated (`ms k 99999999999` is
//! `CLIENT_ERROR bad command line format`, `T4294967296` a bad token). Per command:
//!
//! | command | flags that do something | returned in the reply line, in request order |
//! | --- | --- | --- |
//! | `mg` | b c f h k l O q s t u v E(with N) N R T | s t c f l h O k, then Z X W |
//! | `ms` | b c C E F I k N(with MA, MP) O q T M(E A P R S), and the placement extension below | O k c |
//! | `md` | b C E I k O q T x F | O k |
//! | `ma` | b c C D E J k M(I + D -) N O q t T v | c t O k |
//!
//! Errors, in the order memcached 1.6.45 checks them: too few tokens `CLIENT_ERROR bad command
//! line format`; a key token over 250 bytes the same (`ms` reads its length first and then
//! swallows the data block; `ma` says `invalid or duplicate flag`); more than 20 tokens
//! `CLIENT_ERROR options flags are too long` (`ma`: `invalid or duplicate flag`); a token that
//! is no letter or digit `CLIENT_ERROR bad command line format`; a repeated flag `CLIENT_ERROR
//! duplicate flag`; an unknown flag `CLIENT_ERROR invalid flag`; a bad number `CLIENT_ERROR bad
//! token in command line format` (F: the default error, `J`/`D`: `invalid numeric
//! initial/delta value`), an undecodable base64 key `CLIENT_ERROR error decoding key` (the last
//! of these wins); `ma` answers every flag error with `CLIENT_ERROR invalid or duplicate flag`;
//! then an unknown mode (`M` reads one byte: `ms`, `ma`) and an `O` token over 32 bytes
//! `CLIENT_ERROR opaque token too long`.
//!
//! # Extension: placement hints on `ms` (Headroom's SETX in meta form)
//!
//! `ms` also takes these flags, none of which memcached 1.6.45's `ms` uses (memcached would
//! accept `R` as a number and ignore it, and answer `invalid flag` to the others):
//!
//! - `R<n>`: replicas, 1 to 255;
//! - `G<node>`: NUMA node hint, a node number (0 to 65533), or `G*` for no preference;
//! - `H`: strict: fail rather than leave the node;
//! - `U<id,id,...>`: preferred target ids;
//! - `X<id,id,...>`: excluded target ids (`U` and `X` together at most 60 ids, as SETX).
//!
//! They come back as a [`PlacementHints`] in [`MsFlags::hints`] (`None` when no extension flag was
//! given). A malformed one is `CLIENT_ERROR bad token in command line format`, more than 60 ids
//! `CLIENT_ERROR too many target ids`; like memcached's own `ms` flag errors, the data block is
//! then swallowed.

use std::fmt;
use std::ops::Deref;

use super::decode::PlacementHints;
use super::text::TextStore;
use super::KEY_MAX_BYTES;
use crate::command::StoreMode;
use crate::numbers::{digits_i32, digits_u32, safe_strtoul, safe_strtoull};

/// Bytes a base64 key can decode to: 250 encoded bytes hold at most 62 whole quads.
pub const KEY_DECODED_MAX_BYTES: usize = KEY_MAX_BYTES / 4 * 3;
/// A meta command with this many tokens or more (command, key, flags and memcached's terminal
/// token counted) is refused: at most 17 flags after the key (16 after an `ms` data length).
pub const META_TOKENS_MAX: usize = 20;
/// Longest `O` token, its `O` included.
pub const OPAQUE_TOKEN_MAX_BYTES: usize = 32;
/// Most target ids an `ms` may name in `U` and `X` together (as SETX).
pub const HINT_IDS_MAX: usize = 60;

/// Meta error lines, exactly as memcached 1.6.45 writes them.
pub mod errors {
    pub const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
    pub const OPTIONS_TOO_LONG: &[u8] = b"CLIENT_ERROR options flags too long\r\n";
    /// `mg` words it differently.
    pub const MG_OPTIONS_TOO_LONG: &[u8] = b"CLIENT_ERROR options flags are too long\r\n";
    pub const DUPLICATE_FLAG: &[u8] = b"CLIENT_ERROR duplicate flag\r\n";
    pub const INVALID_FLAG: &[u8] = b"CLIENT_ERROR invalid flag\r\n";
    pub const BAD_TOKEN: &[u8] = b"CLIENT_ERROR bad token in command line format\r\n";
    pub const DECODING_KEY: &[u8] = b"CLIENT_ERROR error decoding key\r\n";
    pub const M_LENGTH: &[u8] = b"CLIENT_ERROR incorrect length for M token\r\n";
    pub const INVALID_INITIAL: &[u8] = b"CLIENT_ERROR invalid numeric initial value\r\n";
    pub const INVALID_DELTA: &[u8] = b"CLIENT_ERROR invalid numeric delta value\r\n";
    /// `md` and `ma` answer every flag error with this.
    pub const INVALID_OR_DUPLICATE: &[u8] = b"CLIENT_ERROR invalid or duplicate flag\r\n";
    pub const OPAQUE_TOO_LONG: &[u8] = b"CLIENT_ERROR opaque token too long\r\n";
    pub const MS_MODE: &[u8] = b"CLIENT_ERROR invalid mode for ms M token\r\n";
    pub const MA_MODE: &[u8] = b"CLIENT_ERROR invalid mode for ma M token\r\n";
    /// Extension: `U` and `X` named more than 60 target ids.
    pub const TOO_MANY_IDS: &[u8] = b"CLIENT_ERROR too many target ids\r\n";
}

/// A key as a command named it: the bytes of the line, or (a meta command's `b` flag) the bytes
/// its base64 decodes to, held inline (no allocation). Derefs to the key bytes.
#[derive(Clone, Copy)]
pub struct Key<'a> {
    repr: KeyRepr<'a>,
}

#[derive(Clone, Copy)]
enum KeyRepr<'a> {
    Text(&'a [u8]),
    Binary {
        len: u8,
        bytes: [u8; KEY_DECODED_MAX_BYTES],
    },
}

impl<'a> Key<'a> {
    /// A key as written on the line.
    pub fn text(bytes: &'a [u8]) -> Key<'a> {
        Key {
            repr: KeyRepr::Text(bytes),
        }
    }

    /// A binary key (one a client sent in base64); `None` when longer than a base64 key of 250
    /// bytes can decode to.
    pub fn binary(bytes: &[u8]) -> Option<Key<'static>> {
        if bytes.len() > KEY_DECODED_MAX_BYTES {
            return None;
        }
        let mut inline = [0u8; KEY_DECODED_MAX_BYTES];
        inline[..bytes.len()].copy_from_slice(bytes);
        Some(Key {
            repr: KeyRepr::Binary {
                len: bytes.len() as u8,
                bytes: inline,
            },
        })
    }

    /// Decodes a base64 key token as memcached's `base64_decode` does (characters outside the
    /// alphabet skipped, `=` padding ending the key); `None` where memcached fails.
    pub fn from_base64(token: &[u8]) -> Option<Key<'static>> {
        let mut inline = [0u8; KEY_DECODED_MAX_BYTES];
        let len = base64_decode(token, &mut inline)?;
        Some(Key {
            repr: KeyRepr::Binary {
                len: len as u8,
                bytes: inline,
            },
        })
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.repr {
            KeyRepr::Text(bytes) => bytes,
            KeyRepr::Binary { len, bytes } => &bytes[..*len as usize],
        }
    }

    /// The client sent this key in base64 (`b`): replies echo it in base64, followed by ` b`.
    pub fn is_binary(&self) -> bool {
        matches!(self.repr, KeyRepr::Binary { .. })
    }
}

impl Deref for Key<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialEq for Key<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.is_binary() == other.is_binary() && self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Key<'_> {}

impl fmt::Debug for Key<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_binary() { "binary" } else { "text" };
        write!(f, "Key::{kind}(\"{}\")", self.as_bytes().escape_ascii())
    }
}

fn base64_value(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        b'=' => Some(0),
        _ => None,
    }
}

/// memcached's `base64_decode`: the alphabet's characters (and `=`) must come to a whole number
/// of quads; others are skipped; the first quad holding padding ends the output (one or two `=`
/// trim one or two bytes, more fail). Returns the decoded length, `None` for memcached's 0.
fn base64_decode(src: &[u8], out: &mut [u8; KEY_DECODED_MAX_BYTES]) -> Option<usize> {
    let count = src.iter().filter(|&&c| base64_value(c).is_some()).count();
    if count == 0 || count % 4 != 0 || count / 4 * 3 > out.len() {
        return None;
    }
    let (mut block, mut filled, mut pad, mut pos) = ([0u8; 4], 0, 0, 0);
    for &c in src {
        let Some(v) = base64_value(c) else { continue };
        if c == b'=' {
            pad += 1;
        }
        block[filled] = v;
        filled += 1;
        if filled == 4 {
            out[pos] = (block[0] << 2) | (block[1] >> 4);
            out[pos + 1] = (block[1] << 4) | (block[2] >> 2);
            out[pos + 2] = (block[2] << 6) | block[3];
            pos += 3;
            filled = 0;
            if pad > 0 {
                match pad {
                    1 => pos -= 1,
                    2 => pos -= 2,
                    _ => return None,
                }
                break;
            }
        }
    }
    (pos > 0).then_some(pos)
}

const BASE64_ALPHABET: &[u8; 64] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Appends `bytes` in standard base64 with `=` padding (as memcached echoes binary keys).
pub fn base64_encode(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len().div_ceil(3) * 4);
    let at = |i: u32| BASE64_ALPHABET[(i & 63) as usize];
    let mut chunks = bytes.chunks_exact(3);
    for c in &mut chunks {
        let n = u32::from(c[0]) << 16 | u32::from(c[1]) << 8 | u32::from(c[2]);
        out.extend_from_slice(&[at(n >> 18), at(n >> 12), at(n >> 6), at(n)]);
    }
    match *chunks.remainder() {
        [a] => {
            let n = u32::from(a) << 16;
            out.extend_from_slice(&[at(n >> 18), at(n >> 12), b'=', b'=']);
        }
        [a, b] => {
            let n = u32::from(a) << 16 | u32::from(b) << 8;
            out.extend_from_slice(&[at(n >> 18), at(n >> 12), at(n >> 6), b'=']);
        }
        _ => {}
    }
}

/// The flags of a meta command that ask for something in the reply line, in the order the
/// request gave them (memcached writes them in that order). Only the letters that command
/// returns are kept (see the module table).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct ReturnFlags {
    letters: [u8; META_TOKENS_MAX],
    len: u8,
}

impl ReturnFlags {
    /// From letters in order (tests and callers building replies by hand).
    pub fn from_letters(letters: &[u8]) -> ReturnFlags {
        let mut flags = ReturnFlags::default();
        for &letter in letters {
            flags.push(letter);
        }
        flags
    }

    fn push(&mut self, letter: u8) {
        if (self.len as usize) < self.letters.len() {
            self.letters[self.len as usize] = letter;
            self.len += 1;
        }
    }

    fn only(&self, allowed: &[u8]) -> ReturnFlags {
        let mut kept = ReturnFlags::default();
        for &letter in self.as_bytes() {
            if allowed.contains(&letter) {
                kept.push(letter);
            }
        }
        kept
    }

    /// The letters, in request order.
    pub fn as_bytes(&self) -> &[u8] {
        &self.letters[..self.len as usize]
    }

    pub fn contains(&self, letter: u8) -> bool {
        self.as_bytes().contains(&letter)
    }
}

impl fmt::Debug for ReturnFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReturnFlags(\"{}\")", self.as_bytes().escape_ascii())
    }
}

/// `mg` flags. `returns` holds s t c f l h O k in request order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MgFlags<'a> {
    /// `E`: the CAS of an item `N` creates.
    pub explicit_cas: Option<u64>,
    pub returns: ReturnFlags,
    /// `O`: the token after the `O`, copied back in the reply.
    pub opaque: Option<&'a [u8]>,
    /// `v`: return the value (`VA <size>` instead of `HD`).
    pub value: bool,
    /// `q`: suppress `EN` on a miss.
    pub quiet: bool,
    /// `u`: no LRU bump, no fetched/last-access update.
    pub no_bump: bool,
    /// `T`: new TTL on a hit, as memcached parses an exptime (negative: expired at once).
    pub ttl: Option<i32>,
    /// `N`: on a miss, create an empty item with this TTL and win the recache token.
    pub vivify: Option<i32>,
    /// `R`: win the recache token when the remaining TTL is below this.
    pub recache: Option<i32>,
    /// `C`: with `v`, the value is left out (`HD`) when the item's CAS is this.
    pub cas: Option<u64>,
}

/// `ms` flags beyond what [`TextStore`] carries (key, mode, client flags `F`, TTL `T`, CAS `C`,
/// data length, `q`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MsFlags<'a> {
    /// `E`: the CAS the stored item takes (`E0` is ignored, as memcached 1.6.45 does).
    pub explicit_cas: Option<u64>,
    /// O k c in request order.
    pub returns: ReturnFlags,
    pub opaque: Option<&'a [u8]>,
    /// `I`: with `C` in set or replace mode, a CAS older than the item's stores and marks the
    /// item stale.
    pub invalidate: bool,
    /// `N`: in append or prepend mode, a missing item is created with this TTL (1.6.20).
    pub vivify: Option<i32>,
    /// Extension: placement hints (`R G H U X`); `None` when none was given.
    pub hints: Option<PlacementHints>,
}

/// `md` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MdFlags<'a> {
    /// `E`: with `I` or `x`, the CAS the item keeps.
    pub explicit_cas: Option<u64>,
    /// `x`: empty the value (flags `F` and TTL `T` from this line) instead of deleting the
    /// item.
    pub empty: bool,
    pub client_flags: u32,
    /// O k in request order.
    pub returns: ReturnFlags,
    pub opaque: Option<&'a [u8]>,
    /// `q`: suppress `HD`.
    pub quiet: bool,
    /// `C`: delete only if the CAS matches (else `EX`).
    pub cas: Option<u64>,
    /// `I`: mark stale (new CAS) instead of deleting.
    pub invalidate: bool,
    /// `T`: with `I`, the stale item's new TTL.
    pub ttl: Option<i32>,
}

/// `ma` flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaFlags<'a> {
    /// `E`: the CAS the counter takes.
    pub explicit_cas: Option<u64>,
    /// c t O k in request order.
    pub returns: ReturnFlags,
    pub opaque: Option<&'a [u8]>,
    /// `q`: suppress `HD`.
    pub quiet: bool,
    /// `v`: return the new value (`VA <len>` and the number as a data block).
    pub value: bool,
    /// `M`: increment (`I`, `+`, the default) or decrement (`D`, `-`).
    pub incr: bool,
    /// `D`: the delta (default 1).
    pub delta: u64,
    /// `J`: the value created on a miss with `N` (default 0).
    pub initial: u64,
    /// `N`: on a miss, create the counter with this TTL.
    pub vivify: Option<i32>,
    /// `C`: apply only if the CAS matches (else `EX`).
    pub cas: Option<u64>,
    /// `T`: new TTL on success.
    pub ttl: Option<i32>,
}

impl Default for MaFlags<'_> {
    fn default() -> Self {
        MaFlags {
            explicit_cas: None,
            returns: ReturnFlags::default(),
            opaque: None,
            quiet: false,
            value: false,
            incr: true,
            delta: 1,
            initial: 0,
            vivify: None,
            cas: None,
            ttl: None,
        }
    }
}

/// Everything the shared flag parser reads (memcached's `struct _meta_flags`).
struct Preparsed<'a> {
    key: Key<'a>,
    returns: ReturnFlags,
    opaque: Option<&'a [u8]>,
    opaque_too_long: bool,
    value: bool,
    quiet: bool,
    no_bump: bool,
    invalidate: bool,
    ttl: Option<i32>,
    vivify: Option<i32>,
    recache: Option<i32>,
    client_flags: u32,
    cas: Option<u64>,
    /// `E`: the CAS the item takes (memcached 1.6.27).
    explicit_cas: Option<u64>,
    /// `x`: `md` empties the value and keeps the item (1.6.27).
    empty: bool,
    mode: Option<u8>,
    delta: u64,
    initial: u64,
    hints: Option<PlacementHints>,
}

/// memcached's `_meta_flag_preparse` over `flags` (the tokens after the key, or after an `ms`
/// data length). A duplicate or unknown flag fails at once; other errors are noted and parsing
/// goes on, the last error text winning (`default_error` when a failing flag sets none, as `F`).
/// `placement`: `ms`, which reads the extension flags.
fn preparse<'a>(
    key_token: &'a [u8],
    flags: &[&'a [u8]],
    default_error: &'static [u8],
    placement: bool,
) -> Result<Preparsed<'a>, &'static [u8]> {
    let mut of = Preparsed {
        key: Key::text(key_token),
        returns: ReturnFlags::default(),
        opaque: None,
        opaque_too_long: false,
        value: false,
        quiet: false,
        no_bump: false,
        invalidate: false,
        ttl: None,
        vivify: None,
        recache: None,
        client_flags: 0,
        cas: None,
        explicit_cas: None,
        empty: false,
        mode: None,
        delta: 1,
        initial: 0,
        hints: None,
    };
    let mut seen = [false; 127];
    let mut error: Option<&'static [u8]> = None;
    let mut has_error = false;
    let mut fail = |error: &mut Option<&'static [u8]>, text: Option<&'static [u8]>| {
        has_error = true;
        if text.is_some() {
            *error = text;
        }
    };
    for &token in flags {
        let flag = token[0];
        // memcached's tokenizer takes a flag for a letter or digit only.
        if !flag.is_ascii_alphanumeric() {
            return Err(errors::BAD_FORMAT);
        }
        if seen[flag as usize] {
            return Err(errors::DUPLICATE_FLAG);
        }
        seen[flag as usize] = true;
        let arg = &token[1..];
        match flag {
            b'b' => match Key::from_base64(key_token) {
                Some(key) => of.key = key,
                None => fail(&mut error, Some(errors::DECODING_KEY)),
            },
            b'N' | b'T' => match digits_i32(arg) {
                Some(v) if flag == b'N' => of.vivify = Some(v),
                Some(v) => of.ttl = Some(v),
                None => fail(&mut error, Some(errors::BAD_TOKEN)),
            },
            b'R' if placement => match digits_u32(arg).filter(|n| (1..=255).contains(n)) {
                Some(n) => hints(&mut of.hints).replicas = n as u8,
                None => fail(&mut error, Some(errors::BAD_TOKEN)),
            },
            b'R' => match digits_i32(arg) {
                Some(v) => of.recache = Some(v),
                None => fail(&mut error, Some(errors::BAD_TOKEN)),
            },
            b'O' => {
                of.opaque = Some(arg);
                of.opaque_too_long = token.len() > OPAQUE_TOKEN_MAX_BYTES;
                of.returns.push(flag);
            }
            b'P' | b'L' => {}
            b'k' | b's' | b't' | b'c' | b'f' | b'l' | b'h' => of.returns.push(flag),
            b'v' => of.value = true,
            b'u' => of.no_bump = true,
            b'q' => of.quiet = true,
            b'F' => match safe_strtoul(arg) {
                Some(v) => of.client_flags = v,
                None => fail(&mut error, None),
            },
            b'C' => match safe_strtoull(arg) {
                Some(v) => of.cas = Some(v),
                None => fail(&mut error, Some(errors::BAD_TOKEN)),
            },
            // memcached 1.6.40 and later read the mode's one byte and ignore the rest; `M`
            // alone is an unknown mode.
            b'M' => of.mode = Some(token.get(1).copied().unwrap_or(0)),
            b'J' => match safe_strtoull(arg) {
                Some(v) => of.initial = v,
                None => fail(&mut error, Some(errors::INVALID_INITIAL)),
            },
            b'D' => match safe_strtoull(arg) {
                Some(v) => of.delta = v,
                None => fail(&mut error, Some(errors::INVALID_DELTA)),
            },
            b'I' => of.invalidate = true,
            b'E' => match safe_strtoull(arg) {
                Some(v) => of.explicit_cas = Some(v),
                None => fail(&mut error, Some(errors::BAD_TOKEN)),
            },
            b'x' => of.empty = true,
            b'G' if placement => match arg {
                b"*" => hints(&mut of.hints).node = Some(None),
                _ => match digits_u32(arg).filter(|&n| n < 0xfffe) {
                    Some(n) => hints(&mut of.hints).node = Some(Some(n as u16)),
                    None => fail(&mut error, Some(errors::BAD_TOKEN)),
                },
            },
            b'H' if placement => hints(&mut of.hints).strict = true,
            b'U' | b'X' if placement => {
                let hints = hints(&mut of.hints);
                let list = if flag == b'U' {
                    &mut hints.preferred
                } else {
                    &mut hints.excluded
                };
                if !parse_ids(arg, list) {
                    fail(&mut error, Some(errors::BAD_TOKEN));
                } else if hints.preferred.len() + hints.excluded.len() > HINT_IDS_MAX {
                    fail(&mut error, Some(errors::TOO_MANY_IDS));
                }
            }
            _ => return Err(errors::INVALID_FLAG),
        }
    }
    if has_error {
        return Err(error.unwrap_or(default_error));
    }
    Ok(of)
}

fn hints(slot: &mut Option<PlacementHints>) -> &mut PlacementHints {
    slot.get_or_insert_with(PlacementHints::default)
}

/// `id,id,...` into `list`; false when malformed. Stops early past the id limit (the caller
/// then reports too many).
fn parse_ids(text: &[u8], list: &mut Vec<u32>) -> bool {
    if text.is_empty() {
        return false;
    }
    for id in text.split(|&b| b == b',') {
        match digits_u32(id) {
            Some(id) if list.len() <= HINT_IDS_MAX => list.push(id),
            Some(_) => return true,
            None => return false,
        }
    }
    true
}

/// `mg`: `tokens` are the line's tokens (at most memcached's 23), the command first.
pub(super) fn parse_mg<'a>(tokens: &[&'a [u8]]) -> Result<(Key<'a>, MgFlags<'a>), &'static [u8]> {
    let ntokens = tokens.len() + 1;
    if tokens[1].len() > KEY_MAX_BYTES {
        return Err(errors::BAD_FORMAT);
    }
    if ntokens > META_TOKENS_MAX + 1 {
        return Err(errors::MG_OPTIONS_TOO_LONG);
    }
    let of = preparse(tokens[1], &tokens[2..], errors::BAD_FORMAT, false)?;
    if of.opaque_too_long {
        return Err(errors::OPAQUE_TOO_LONG);
    }
    Ok((
        of.key,
        MgFlags {
            explicit_cas: of.explicit_cas,
            returns: of.returns.only(b"stcflhOk"),
            opaque: of.opaque,
            value: of.value,
            quiet: of.quiet,
            no_bump: of.no_bump,
            ttl: of.ttl,
            vivify: of.vivify,
            recache: of.recache,
            cas: of.cas,
        },
    ))
}

/// Why an `ms` line was refused: the reply, and whether the data block is swallowed.
pub(super) struct MsError {
    pub reply: &'static [u8],
    /// `Some(n)`: memcached swallows `n` bytes after the line (the data block and its `\r\n`).
    pub swallow: Option<usize>,
}

/// `ms`: checks in memcached's order; the data block is swallowed only once its length is known.
pub(super) fn parse_ms<'a>(tokens: &[&'a [u8]]) -> Result<TextStore<'a>, MsError> {
    let refuse = |reply| MsError {
        reply,
        swallow: None,
    };
    let ntokens = tokens.len() + 1;
    if ntokens == 3 {
        return Err(refuse(errors::BAD_FORMAT));
    }
    let value_len = match super::text::value_length(tokens[2]) {
        Some(len) => len,
        None => return Err(refuse(errors::BAD_FORMAT)),
    };
    let swallow = |reply| MsError {
        reply,
        swallow: Some(value_len + 2),
    };
    // (1.6.45 reads the length before it checks the flags' count and the key.)
    if ntokens > META_TOKENS_MAX + 1 {
        return Err(swallow(errors::MG_OPTIONS_TOO_LONG));
    }
    if tokens[1].len() > KEY_MAX_BYTES {
        return Err(swallow(errors::BAD_FORMAT));
    }
    let of = preparse(tokens[1], &tokens[3..], errors::BAD_FORMAT, true).map_err(swallow)?;
    let mode = match of.mode {
        None | Some(b'S') => StoreMode::Set,
        Some(b'E') => StoreMode::Add,
        Some(b'A') => StoreMode::Append,
        Some(b'P') => StoreMode::Prepend,
        Some(b'R') => StoreMode::Replace,
        Some(_) => return Err(swallow(errors::MS_MODE)),
    };
    if of.opaque_too_long {
        return Err(swallow(errors::OPAQUE_TOO_LONG));
    }
    Ok(TextStore {
        mode,
        key: of.key,
        flags: of.client_flags,
        exptime: of.ttl.unwrap_or(0),
        cas: of.cas,
        value_len,
        noreply: of.quiet,
        meta: Some(MsFlags {
            explicit_cas: of.explicit_cas.filter(|&cas| cas != 0),
            vivify: of
                .vivify
                .filter(|_| matches!(mode, StoreMode::Append | StoreMode::Prepend)),
            returns: of.returns.only(b"Okcs"),
            opaque: of.opaque,
            invalidate: of.invalidate,
            hints: of.hints,
        }),
    })
}

/// `md`.
pub(super) fn parse_md<'a>(tokens: &[&'a [u8]]) -> Result<(Key<'a>, MdFlags<'a>), &'static [u8]> {
    let ntokens = tokens.len() + 1;
    if tokens[1].len() > KEY_MAX_BYTES {
        return Err(errors::BAD_FORMAT);
    }
    if ntokens > META_TOKENS_MAX + 1 {
        return Err(errors::MG_OPTIONS_TOO_LONG);
    }
    // (1.6.40 and later name md's flag errors, as mg's.)
    let of = preparse(tokens[1], &tokens[2..], errors::BAD_FORMAT, false)?;
    if of.opaque_too_long {
        return Err(errors::OPAQUE_TOO_LONG);
    }
    Ok((
        of.key,
        MdFlags {
            explicit_cas: of.explicit_cas,
            empty: of.empty,
            client_flags: of.client_flags,
            returns: of.returns.only(b"Ok"),
            opaque: of.opaque,
            quiet: of.quiet,
            cas: of.cas,
            invalidate: of.invalidate,
            ttl: of.ttl,
        },
    ))
}

/// `ma`.
pub(super) fn parse_ma<'a>(tokens: &[&'a [u8]]) -> Result<(Key<'a>, MaFlags<'a>), &'static [u8]> {
    let ntokens = tokens.len() + 1;
    if tokens[1].len() > KEY_MAX_BYTES {
        return Err(errors::INVALID_OR_DUPLICATE);
    }
    if ntokens > META_TOKENS_MAX + 1 {
        return Err(errors::INVALID_OR_DUPLICATE);
    }
    let of = preparse(tokens[1], &tokens[2..], errors::BAD_FORMAT, false)
        .map_err(|_| errors::INVALID_OR_DUPLICATE)?;
    let incr = match of.mode {
        None | Some(b'I' | b'+') => true,
        Some(b'D' | b'-') => false,
        Some(_) => return Err(errors::MA_MODE),
    };
    if of.opaque_too_long {
        return Err(errors::OPAQUE_TOO_LONG);
    }
    Ok((
        of.key,
        MaFlags {
            explicit_cas: of.explicit_cas,
            returns: of.returns.only(b"ctOk"),
            opaque: of.opaque,
            quiet: of.quiet,
            value: of.value,
            incr,
            delta: of.delta,
            initial: of.initial,
            vivify: of.vivify,
            cas: of.cas,
            ttl: of.ttl,
        },
    ))
}

/// `me <key> [b]`: only a third token of exactly `b` decodes the key.
pub(super) fn parse_me<'a>(tokens: &[&'a [u8]]) -> Result<Key<'a>, &'static [u8]> {
    let ntokens = tokens.len() + 1;
    if ntokens < 3 || tokens[1].len() > KEY_MAX_BYTES {
        return Err(errors::BAD_FORMAT);
    }
    // (memcached 1.6.45's `me` takes the key as written, a `b` flag or not.)
    Ok(Key::text(tokens[1]))
}

// ---------------------------------------------------------------------------------------------
// Replies
// ---------------------------------------------------------------------------------------------

/// `MN\r\n`, the answer to `mn`.
pub const MN: &[u8] = b"MN\r\n";
/// `EN\r\n`: a meta miss with nothing to return.
pub const EN: &[u8] = b"EN\r\n";

/// A meta reply line's status code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaCode {
    /// `VA <size>`: a value of `size` bytes follows the line (then `\r\n`).
    Va(usize),
    /// `HD`: success, no value.
    Hd,
    /// `EN`: miss (mg).
    En,
    /// `NF`: not found.
    Nf,
    /// `NS`: not stored.
    Ns,
    /// `EX`: exists (CAS mismatch).
    Ex,
}

/// What a meta reply line can return; a requested flag is written only when its value is
/// `Some` here (a miss fills in only `opaque` and `key`, as memcached writes them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetaValues<'v> {
    /// `c<cas>`.
    pub cas: Option<u64>,
    /// `f<client flags>`.
    pub flags: Option<u32>,
    /// `h<0|1>`: fetched before this request.
    pub hit: Option<bool>,
    /// `k<key>`, with ` b` after it (and the key in base64) when `binary`.
    pub key: Option<(&'v [u8], bool)>,
    /// `l<seconds since last access>`.
    pub last_access: Option<u64>,
    /// `O<opaque>`.
    pub opaque: Option<&'v [u8]>,
    /// `s<size>`.
    pub size: Option<usize>,
    /// `t<seconds left>`, `-1` for no expiry.
    pub ttl: Option<i64>,
    /// `Z`: another client already won the recache token (written first of the three).
    pub already_won: bool,
    /// `X`: the item is stale.
    pub stale: bool,
    /// `W`: this client won the recache token (written last).
    pub won: bool,
}

/// Appends one meta reply line: the code (`VA <size>` / `HD` / `EN` / `NF` / `NS` / `EX`), then
/// each flag of `returns` in request order whose value `values` holds, then `Z`, `X`, `W` as
/// memcached orders them, then `\r\n`. For `VA` the caller appends the data block and `\r\n`.
pub fn meta_line(out: &mut Vec<u8>, code: MetaCode, returns: &ReturnFlags, values: &MetaValues) {
    match code {
        MetaCode::Va(size) => {
            out.extend_from_slice(b"VA ");
            push_number(out, size as u64);
        }
        MetaCode::Hd => out.extend_from_slice(b"HD"),
        MetaCode::En => out.extend_from_slice(b"EN"),
        MetaCode::Nf => out.extend_from_slice(b"NF"),
        MetaCode::Ns => out.extend_from_slice(b"NS"),
        MetaCode::Ex => out.extend_from_slice(b"EX"),
    }
    for &letter in returns.as_bytes() {
        let start = out.len();
        out.push(b' ');
        out.push(letter);
        match letter {
            b'c' if values.cas.is_some() => push_number(out, values.cas.unwrap_or(0)),
            b'f' if values.flags.is_some() => {
                push_number(out, u64::from(values.flags.unwrap_or(0)));
            }
            b'h' if values.hit.is_some() => {
                out.push(if values.hit == Some(true) { b'1' } else { b'0' })
            }
            b'l' if values.last_access.is_some() => {
                push_number(out, values.last_access.unwrap_or(0));
            }
            b's' if values.size.is_some() => push_number(out, values.size.unwrap_or(0) as u64),
            b't' if values.ttl.is_some() => match values.ttl.unwrap_or(-1) {
                n if n < 0 => out.extend_from_slice(b"-1"),
                n => push_number(out, n as u64),
            },
            b'O' if values.opaque.is_some() => {
                out.extend_from_slice(values.opaque.unwrap_or_default());
            }
            b'k' if values.key.is_some() => {
                let (key, binary) = values.key.unwrap_or_default();
                if binary {
                    base64_encode(out, key);
                    out.extend_from_slice(b" b");
                } else {
                    out.extend_from_slice(key);
                }
            }
            _ => out.truncate(start),
        }
    }
    for (set, letter) in [
        (values.already_won, b'Z'),
        (values.stale, b'X'),
        (values.won, b'W'),
    ] {
        if set {
            out.extend_from_slice(&[b' ', letter]);
        }
    }
    out.extend_from_slice(b"\r\n");
}

/// The `me` reply: `ME <key> exp=<e> la=<la> cas=<cas> fetch=<yes|no> cls=<class>
/// size=<bytes>\r\n` (the key in base64 when it is binary; `exp` -1 for no expiry).
#[allow(clippy::too_many_arguments)]
pub fn meta_debug(
    out: &mut Vec<u8>,
    key: &[u8],
    binary: bool,
    exp: i64,
    last_access: u64,
    cas: u64,
    fetched: bool,
    class: u32,
    size: u64,
) {
    out.extend_from_slice(b"ME ");
    if binary {
        base64_encode(out, key);
    } else {
        out.extend_from_slice(key);
    }
    out.extend_from_slice(b" exp=");
    if exp < 0 {
        out.push(b'-');
    }
    push_number(out, exp.unsigned_abs());
    out.extend_from_slice(b" la=");
    push_number(out, last_access);
    out.extend_from_slice(b" cas=");
    push_number(out, cas);
    out.extend_from_slice(if fetched {
        b" fetch=yes cls="
    } else {
        b" fetch=no cls="
    });
    push_number(out, u64::from(class));
    out.extend_from_slice(b" size=");
    push_number(out, size);
    out.extend_from_slice(b"\r\n");
}

/// Appends `n` in decimal, without allocating.
pub(super) fn push_number(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_follows_memcached_quirks() {
        for len in 0..=KEY_DECODED_MAX_BYTES {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let mut encoded = Vec::new();
            base64_encode(&mut encoded, &bytes);
            if len == 0 {
                assert_eq!(Key::from_base64(&encoded), None);
                continue;
            }
            assert!(encoded.len() <= KEY_MAX_BYTES);
            let key = Key::from_base64(&encoded).expect("decodes");
            assert_eq!(key.as_bytes(), &bytes[..]);
            assert!(key.is_binary());
        }
        // Checked against memcached 1.6.18 (`mg <token> b k` echoes the key re-encoded).
        let decoded = |t: &[u8]| Key::from_base64(t).map(|k| k.as_bytes().to_vec());
        assert_eq!(decoded(b"YQ"), None);
        assert_eq!(decoded(b"YQ==="), None);
        assert_eq!(decoded(b"!!!!"), None);
        assert_eq!(decoded(b"Y!Q=="), Some(b"a".to_vec()));
        assert_eq!(decoded(b"Y=Q="), Some(b"`".to_vec()));
        assert_eq!(decoded(b"YWJj"), Some(b"abc".to_vec()));
    }

    #[test]
    fn reply_lines_follow_request_order() {
        let mut out = Vec::new();
        let values = MetaValues {
            cas: Some(22),
            key: Some((b"x", true)),
            opaque: Some(b"5"),
            ..MetaValues::default()
        };
        meta_line(
            &mut out,
            MetaCode::Hd,
            &ReturnFlags::from_letters(b"ckO"),
            &values,
        );
        assert_eq!(out, b"HD c22 keA== b O5\r\n");
        out.clear();
        let values = MetaValues {
            flags: Some(7),
            ttl: Some(-1),
            size: Some(1),
            cas: Some(23),
            stale: true,
            won: true,
            already_won: true,
            ..MetaValues::default()
        };
        meta_line(
            &mut out,
            MetaCode::Va(1),
            &ReturnFlags::from_letters(b"ftsc"),
            &values,
        );
        assert_eq!(out, b"VA 1 f7 t-1 s1 c23 Z X W\r\n");
    }
}
