//! The text and meta protocols' replies, as memcached 1.6 writes them: [`TextReply`] for a
//! keyed command the executor runs, [`StoreReply`] for storage commands (also for a value
//! streamed to a segment, `large.rs`).

use crate::command::Command;
use crate::proto::meta::{self, MetaCode, MetaValues};
use crate::proto::text::{self, errors, TextCommand, TextStore};
use crate::proto::{Key, MaFlags, MdFlags, MgFlags, StoreMode};
use crate::store::{ArithOutcome, DeleteOutcome, StoreOutcome};

use crate::server::exec::execute::{Counted, Found, Reply};

pub use crate::command::store_exptime;

/// What memcached's classic storage commands answer for an outcome: an ADD of a live key and
/// a REPLACE of a missing one are `NOT_STORED` (binary says "exists" and "not found"); only a
/// CAS names the missing key.
pub(crate) fn classic_store_reply(
    outcome: StoreOutcome,
    mode: StoreMode,
    cas: bool,
) -> &'static [u8] {
    match outcome {
        StoreOutcome::Stored { .. } => text::STORED,
        StoreOutcome::Exists if mode == StoreMode::Add => text::NOT_STORED,
        StoreOutcome::Exists => text::EXISTS,
        StoreOutcome::NotFound if cas => text::NOT_FOUND,
        StoreOutcome::NotFound | StoreOutcome::NotStored => text::NOT_STORED,
        StoreOutcome::TooLarge => errors::TOO_LARGE,
        StoreOutcome::OutOfMemory => b"SERVER_ERROR out of memory storing object\r\n",
    }
}

/// The same outcome as a meta status code (`None`: an error line instead).
pub(crate) fn meta_store_code(
    outcome: StoreOutcome,
    mode: StoreMode,
    cas: bool,
) -> Option<MetaCode> {
    Some(match classic_store_reply(outcome, mode, cas) {
        text::STORED => MetaCode::Hd,
        text::NOT_STORED => MetaCode::Ns,
        text::EXISTS => MetaCode::Ex,
        text::NOT_FOUND => MetaCode::Nf,
        _ => return None,
    })
}

/// How a storage command (classic or `ms`) wants its outcome answered.
#[derive(Clone, Copy, Debug)]
pub struct StoreReply<'a> {
    mode: StoreMode,
    key: &'a [u8],
    binary_key: bool,
    cas_given: bool,
    /// Classic `noreply` (nothing at all is sent) or `ms`'s `q` (only `HD` is held back).
    noreply: bool,
    /// The request's value bytes (`ms ... s` reports them when nothing was stored).
    value_len: u64,
    /// `ms`: its reply flags (O k c s) and opaque.
    meta: Option<(crate::proto::ReturnFlags, Option<&'a [u8]>)>,
}

impl<'a> StoreReply<'a> {
    pub fn of(store: &'a TextStore) -> StoreReply<'a> {
        StoreReply {
            mode: store.mode,
            key: &store.key,
            binary_key: store.key.is_binary(),
            cas_given: store.cas.is_some(),
            noreply: store.noreply,
            value_len: store.value_len as u64,
            meta: store.meta.as_ref().map(|ms| (ms.returns, ms.opaque)),
        }
    }

    /// Appends the reply for `outcome`, or for a data block that did not end in `\r\n`
    /// (`None`), or nothing where `noreply` / `q` silences it.
    pub fn write(&self, out: &mut Vec<u8>, outcome: Option<StoreOutcome>) {
        let Some(outcome) = outcome else {
            if !self.noreply || self.meta.is_some() {
                out.extend_from_slice(errors::BAD_DATA_CHUNK);
            }
            return;
        };
        let Some((returns, opaque)) = &self.meta else {
            if !self.noreply {
                out.extend_from_slice(classic_store_reply(outcome, self.mode, self.cas_given));
            }
            return;
        };
        let Some(code) = meta_store_code(outcome, self.mode, self.cas_given) else {
            out.extend_from_slice(classic_store_reply(outcome, self.mode, self.cas_given));
            return;
        };
        if code == MetaCode::Hd && self.noreply {
            return;
        }
        // `s`: the item's length now (an append's sum), or, as memcached reports it, the
        // request's value when nothing was stored.
        let (new_cas, size) = match outcome {
            StoreOutcome::Stored { cas, len } => (cas, len),
            _ => (0, self.value_len),
        };
        let values = MetaValues {
            cas: Some(new_cas),
            size: Some(size as usize),
            key: Some((self.key, self.binary_key)),
            opaque: *opaque,
            ..MetaValues::default()
        };
        meta::meta_line(out, code, returns, &values);
    }

    /// An error line that is not a store outcome (placement, a segment write): errors are
    /// silenced only by a classic `noreply`, as memcached's are.
    pub fn error(&self, out: &mut Vec<u8>, line: &[u8]) {
        if !self.noreply || self.meta.is_some() {
            out.extend_from_slice(line);
        }
    }
}

/// [`StoreReply`] owning its parts, for a value streamed after its line was consumed.
#[derive(Clone, Debug)]
pub struct OwnedStoreReply {
    mode: StoreMode,
    key: Vec<u8>,
    binary_key: bool,
    cas_given: bool,
    noreply: bool,
    value_len: u64,
    meta: Option<(crate::proto::ReturnFlags, Option<Vec<u8>>)>,
}

impl OwnedStoreReply {
    pub fn of(store: &TextStore) -> OwnedStoreReply {
        let r = StoreReply::of(store);
        OwnedStoreReply {
            mode: r.mode,
            key: r.key.to_vec(),
            binary_key: r.binary_key,
            cas_given: r.cas_given,
            noreply: r.noreply,
            value_len: r.value_len,
            meta: r
                .meta
                .map(|(returns, opaque)| (returns, opaque.map(<[u8]>::to_vec))),
        }
    }

    pub fn borrow(&self) -> StoreReply<'_> {
        StoreReply {
            mode: self.mode,
            key: &self.key,
            binary_key: self.binary_key,
            cas_given: self.cas_given,
            noreply: self.noreply,
            value_len: self.value_len,
            meta: self
                .meta
                .as_ref()
                .map(|(returns, opaque)| (*returns, opaque.as_deref())),
        }
    }
}

/// How a keyed text or meta command is answered.
pub(crate) enum TextReply<'a> {
    /// One key of `get`/`gets`/`gat`/`gats`: its `VALUE` line (with the CAS for `gets`), and
    /// nothing on a miss.
    Value {
        key: &'a [u8],
        with_cas: bool,
    },
    Touch {
        noreply: bool,
    },
    Store(StoreReply<'a>),
    Delete {
        noreply: bool,
    },
    Arith {
        noreply: bool,
    },
    MetaGet {
        key: &'a Key<'a>,
        flags: &'a MgFlags<'a>,
    },
    MetaDelete {
        key: &'a Key<'a>,
        flags: &'a MdFlags<'a>,
    },
    MetaArith {
        key: &'a Key<'a>,
        flags: &'a MaFlags<'a>,
    },
    MetaDebug {
        key: &'a Key<'a>,
    },
    /// A store refused as too large: this line (empty: nothing).
    Refused(&'static [u8]),
}

impl<'a> TextReply<'a> {
    /// The reply for a keyed command (`None`: `get`, one [`TextReply::Value`] per key, or a
    /// command that names no key).
    pub(crate) fn of(command: &'a TextCommand<'a>) -> Option<TextReply<'a>> {
        Some(match command {
            TextCommand::Store { store, .. } => TextReply::Store(StoreReply::of(store)),
            TextCommand::Run { command, noreply } => {
                let noreply = *noreply;
                match command {
                    Command::Arith { .. } => TextReply::Arith { noreply },
                    Command::Delete { .. } => TextReply::Delete { noreply },
                    Command::Get { .. } => TextReply::Touch { noreply },
                    _ => return None,
                }
            }
            TextCommand::MetaGet { key, flags } => TextReply::MetaGet { key, flags },
            TextCommand::MetaDelete { key, flags } => TextReply::MetaDelete { key, flags },
            TextCommand::MetaArith { key, flags } => TextReply::MetaArith { key, flags },
            TextCommand::MetaDebug { key } => TextReply::MetaDebug { key },
            _ => return None,
        })
    }
}

/// A TTL as meta replies show it: seconds left, -1 for never.
fn ttl_left(expiry: u32, now: u32) -> i64 {
    match expiry {
        0 => -1,
        at => i64::from(at) - i64::from(now),
    }
}

impl Reply for TextReply<'_> {
    const VALUE_END: &'static [u8] = b"\r\n";

    fn found(&mut self, out: &mut Vec<u8>, found: &Found) {
        match self {
            TextReply::Value { key, with_cas } => {
                let cas = with_cas.then_some(found.cas);
                text::value_header(out, key, found.flags, found.len, cas);
            }
            TextReply::Touch { noreply } => {
                if !*noreply {
                    out.extend_from_slice(text::TOUCHED);
                }
            }
            TextReply::MetaGet { key, flags } => {
                let state = found.state.unwrap_or_default();
                let now = found.now;
                let values = MetaValues {
                    cas: Some(found.cas),
                    flags: Some(found.flags),
                    hit: Some(state.fetched),
                    key: Some((&key[..], key.is_binary())),
                    last_access: Some(u64::from(now.saturating_sub(state.accessed))),
                    opaque: flags.opaque,
                    size: Some(found.len),
                    ttl: Some(ttl_left(state.expiry, now)),
                    already_won: state.token_sent,
                    stale: state.stale,
                    won: state.won,
                };
                // `found.value`, not `flags.value`: `C` may have withheld the value.
                let code = if found.value {
                    MetaCode::Va(found.len)
                } else {
                    MetaCode::Hd
                };
                meta::meta_line(out, code, &flags.returns, &values);
            }
            TextReply::MetaDebug { key } => {
                let state = found.state.unwrap_or_default();
                let now = found.now;
                meta::meta_debug(
                    out,
                    key,
                    key.is_binary(),
                    ttl_left(state.expiry, now),
                    u64::from(now.saturating_sub(state.accessed)),
                    found.cas,
                    state.fetched,
                    0,
                    found.len as u64,
                );
            }
            _ => debug_assert!(false, "a lookup answered for a command that does none"),
        }
    }

    fn missed(&mut self, out: &mut Vec<u8>) {
        match self {
            TextReply::Touch { noreply: false } => out.extend_from_slice(text::NOT_FOUND),
            TextReply::MetaGet { key, flags } if !flags.quiet => {
                let values = MetaValues {
                    key: Some((&key[..], key.is_binary())),
                    opaque: flags.opaque,
                    ..MetaValues::default()
                };
                meta::meta_line(out, MetaCode::En, &flags.returns, &values);
            }
            TextReply::MetaDebug { .. } => out.extend_from_slice(meta::EN),
            _ => {}
        }
    }

    fn stored(&mut self, out: &mut Vec<u8>, outcome: StoreOutcome) {
        if let TextReply::Store(reply) = self {
            reply.write(out, Some(outcome));
        }
    }

    fn deleted(&mut self, out: &mut Vec<u8>, outcome: DeleteOutcome) {
        match self {
            TextReply::Delete { noreply: false } => out.extend_from_slice(match outcome {
                DeleteOutcome::Deleted => text::DELETED,
                DeleteOutcome::NotFound | DeleteOutcome::Exists => text::NOT_FOUND,
            }),
            TextReply::MetaDelete { key, flags } => {
                let code = match outcome {
                    DeleteOutcome::Deleted if flags.quiet => return,
                    DeleteOutcome::Deleted => MetaCode::Hd,
                    DeleteOutcome::NotFound => MetaCode::Nf,
                    DeleteOutcome::Exists => MetaCode::Ex,
                };
                let values = MetaValues {
                    key: Some((&key[..], key.is_binary())),
                    opaque: flags.opaque,
                    ..MetaValues::default()
                };
                meta::meta_line(out, code, &flags.returns, &values);
            }
            _ => {}
        }
    }

    fn counted(&mut self, out: &mut Vec<u8>, outcome: ArithOutcome, counted: Counted) {
        let (key, flags) = match self {
            TextReply::Arith { noreply: true } => return,
            TextReply::Arith { noreply: false } => {
                match outcome {
                    ArithOutcome::Value { value, .. } => text::counter(out, value),
                    ArithOutcome::NotFound => out.extend_from_slice(text::NOT_FOUND),
                    ArithOutcome::NonNumeric => out.extend_from_slice(errors::NON_NUMERIC),
                    ArithOutcome::Exists => out.extend_from_slice(text::EXISTS),
                    ArithOutcome::OutOfMemory => {
                        out.extend_from_slice(b"SERVER_ERROR out of memory\r\n")
                    }
                }
                return;
            }
            TextReply::MetaArith { key, flags } => (key, flags),
            _ => return,
        };
        let mut values = MetaValues {
            key: Some((&key[..], key.is_binary())),
            opaque: flags.opaque,
            ..MetaValues::default()
        };
        let (value, cas) = match outcome {
            ArithOutcome::Value { value, cas } => (value, cas),
            ArithOutcome::NotFound => {
                meta::meta_line(out, MetaCode::Nf, &flags.returns, &values);
                return;
            }
            ArithOutcome::Exists => {
                meta::meta_line(out, MetaCode::Ex, &flags.returns, &values);
                return;
            }
            ArithOutcome::NonNumeric => {
                out.extend_from_slice(errors::NON_NUMERIC);
                return;
            }
            ArithOutcome::OutOfMemory => {
                out.extend_from_slice(b"SERVER_ERROR out of memory\r\n");
                return;
            }
        };
        // memcached's `q` holds back the whole success reply, a `VA` included (1.6.45: also
        // for a counter `N` created).
        if flags.quiet {
            return;
        }
        values.cas = Some(cas);
        values.ttl = Some(ttl_left(counted.expiry, counted.now));
        let mut digits = Vec::with_capacity(20);
        text::counter(&mut digits, value);
        let number = &digits[..digits.len() - 2];
        if flags.value {
            meta::meta_line(out, MetaCode::Va(number.len()), &flags.returns, &values);
            out.extend_from_slice(&digits);
        } else {
            meta::meta_line(out, MetaCode::Hd, &flags.returns, &values);
        }
    }

    fn refused(&mut self, out: &mut Vec<u8>) {
        if let TextReply::Refused(line) = self {
            out.extend_from_slice(line);
        }
    }
}
