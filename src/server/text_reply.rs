//! The text and meta protocols' replies to storage commands, as memcached 1.6 writes them:
//! for a value stored on the spot (`text.rs`) and for one streamed to a segment (`large.rs`).

use crate::proto::meta::{self, MetaCode, MetaValues};
use crate::proto::text::{self, errors, TextStore};
use crate::proto::StoreMode;
use crate::store::{StoreOutcome, CAS_NEVER_ISSUED, RELATIVE_EXPIRY_MAX_SECONDS};

/// An exptime as the store takes it. memcached's text protocol lets it be negative ("expired
/// at once"); an absolute time just past the relative range is long gone, so the item is
/// stored (or touched) and never seen again, as memcached does.
pub fn store_exptime(exptime: i32) -> u32 {
    u32::try_from(exptime).unwrap_or(RELATIVE_EXPIRY_MAX_SECONDS + 1)
}

/// What memcached's classic storage commands answer for an outcome: an ADD of a live key and
/// a REPLACE of a missing one are `NOT_STORED` (binary says "exists" and "not found"); only a
/// CAS names the missing key.
pub(super) fn classic_store_reply(
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
pub(super) fn meta_store_code(
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
    /// `ms`: its reply flags (O k c) and opaque.
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
        let new_cas = match outcome {
            StoreOutcome::Stored { cas } => cas,
            _ => 0,
        };
        let values = MetaValues {
            cas: Some(new_cas),
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
            meta: self
                .meta
                .as_ref()
                .map(|(returns, opaque)| (*returns, opaque.as_deref())),
        }
    }
}

/// The CAS a storage command compares with, as the store takes it (0: none).
pub(super) fn compare_cas(store: &TextStore) -> u64 {
    match (store.mode, store.cas) {
        // memcached's add ignores a CAS (only `ms` can give one: "add-with-cas works the same
        // as add").
        (StoreMode::Add, _) => 0,
        // A `cas` (or `ms C0`) with unique 0 still compares, and fails.
        (StoreMode::Set | StoreMode::Replace, Some(0)) => CAS_NEVER_ISSUED,
        (_, cas) => cas.unwrap_or(0),
    }
}
