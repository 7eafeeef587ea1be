//! Large items: values whose bytes live whole in segment extents, with at most a head copy in
//! RAM. Their ADD/REPLACE/CAS rules are checked before a byte goes to a segment and again as
//! they are linked; their extents go back when the last reader's lease ends; the master's LRU
//! choices, unmounts and the warm restart reach them by key and extent.

use crate::command::StoreMode;
use crate::placement::TargetId;
use crate::segment::Extent;

use super::item::{self, Meta, ValueAt};
use super::{
    absolute_expiry, detail, is_expired, ConcatBase, ConcatValue, LargeLink, Store, StoreOutcome,
};

impl Store {
    /// Evicts `key` if it is a large item with a replica at (`target`, `offset`) (the master's
    /// LRU choice; the key may have moved on meanwhile). Its extents join the pending frees
    /// (or wait for their readers).
    pub fn evict_large(&mut self, key: &[u8], target: TargetId, offset: u64) -> bool {
        let removed = self.remove_large_at(key, target, offset);
        if removed {
            self.keys.stats.large_evictions += 1;
        }
        removed
    }

    /// Removes `key` if it is still a large item with a replica at (`target`, `offset`) (a
    /// newer value stored meanwhile stays). Its extents join the pending frees (or wait for
    /// their readers).
    pub fn remove_large_at(&mut self, key: &[u8], target: TargetId, offset: u64) -> bool {
        let Some(loc) = self.keys.find(&self.arena, key) else {
            return false;
        };
        let matches = item::large(self.arena.bytes(loc)).is_some_and(|large| {
            large
                .replicas
                .iter()
                .any(|(t, e)| *t == target && e.offset == offset)
        });
        matches && self.remove(key)
    }

    /// Drops every large item with a replica on `target` (its unmount); returns how many. Their
    /// extents join the pending frees (or wait for their readers).
    pub fn drop_target(&mut self, target: TargetId) -> u64 {
        let keys = self.keys.large_keys_on(&self.arena, target);
        for key in &keys {
            self.remove(key);
        }
        keys.len() as u64
    }

    /// Every live large item: (key, flags, absolute expiry, placement), for a snapshot.
    pub fn large_items(&self, now: u32) -> Vec<(Vec<u8>, u32, u32, item::LargeValue)> {
        self.keys
            .large_items(&self.arena)
            .into_iter()
            .filter(|(_, meta, _)| !is_expired(meta.expiry, now))
            .map(|(key, meta, large)| (key, meta.flags, meta.expiry, large))
            .collect()
    }

    /// Whether an APPEND or PREPEND of `add_len` bytes onto `key` is built in a segment: the
    /// item is live and its value is in a segment already, or would grow past the RAM head.
    /// (A missing key is refused by the plain path.)
    pub fn concat_needs_segment(&mut self, key: &[u8], add_len: u64, now: u32) -> bool {
        let Some(loc) = self.live(key, now) else {
            return false;
        };
        let old_len = match item::value_at(self.arena.bytes(loc)) {
            ValueAt::Large => return true,
            ValueAt::Inline => item::inline_value(self.arena.bytes(loc)).len() as u64,
            ValueAt::Fixed { len, .. } => u64::from(len),
        };
        old_len + add_len > self.arena.ram_head_bytes()
    }

    /// What an APPEND or PREPEND built in a segment starts from: the live item's CAS, flags,
    /// expiry and value (copied from RAM, or its extents leased until
    /// [`Store::release_lease`]). A missing key is NOT_STORED, a CAS that does not match the
    /// item's EXISTS, as [`Store::store`] answers.
    pub fn concat_base(
        &mut self,
        key: &[u8],
        cas: u64,
        now: u32,
    ) -> Result<ConcatBase, StoreOutcome> {
        let Some(loc) = self.live(key, now) else {
            if cas != 0 {
                self.keys.stats.cas_misses += 1;
            }
            return Err(StoreOutcome::NotStored);
        };
        let meta = item::meta(self.arena.bytes(loc));
        if cas != 0 && meta.cas != cas {
            self.keys.stats.cas_badval += 1;
            return Err(StoreOutcome::Exists);
        }
        let value = match item::value_at(self.arena.bytes(loc)) {
            ValueAt::Large => {
                let large = item::large(self.arena.bytes(loc)).expect("a large record");
                ConcatValue::Segment {
                    value_len: large.value_len,
                    checksum: large.checksum,
                    lease: self.keys.lease(&large.replicas),
                    replicas: large.replicas,
                }
            }
            _ => ConcatValue::Ram(self.value_of(loc).to_vec()),
        };
        Ok(ConcatBase {
            cas: meta.cas,
            flags: meta.flags,
            expiry: meta.expiry,
            value,
        })
    }

    /// Ends a reader's hold on a large item's extents.
    pub fn release_lease(&mut self, lease: u64) {
        self.keys.release_lease(lease);
    }

    /// Extents that no item holds any more, for the placement master (drains the list).
    pub fn take_pending_frees(&mut self) -> Vec<(TargetId, Extent)> {
        std::mem::take(&mut self.keys.pending_frees)
    }

    /// The ADD/REPLACE/CAS rules for a large value, checked before any byte is written: the
    /// refusal, if any.
    pub fn check_large(
        &mut self,
        mode: StoreMode,
        key: &[u8],
        cas: u64,
        now: u32,
    ) -> Option<StoreOutcome> {
        let existing = self
            .live(key, now)
            .map(|loc| item::meta(self.arena.bytes(loc)));
        Self::refusal(mode, cas, existing)
    }

    fn refusal(mode: StoreMode, cas: u64, existing: Option<Meta>) -> Option<StoreOutcome> {
        if cas != 0 {
            return match existing {
                None => Some(StoreOutcome::NotFound),
                Some(old) if old.cas != cas => Some(StoreOutcome::Exists),
                Some(_) => None,
            };
        }
        match (mode, existing) {
            (StoreMode::Add, Some(_)) => Some(StoreOutcome::Exists),
            (StoreMode::Replace, None) => Some(StoreOutcome::NotFound),
            _ => None,
        }
    }

    /// Links a large value whose bytes are already in its extents: the same SET/ADD/REPLACE
    /// and CAS rules as [`Store::store`], checked now. A head copy goes to a fixed slot when
    /// one is free (never evicting for it). On any failure the new extents are released.
    #[allow(clippy::too_many_arguments)]
    pub fn link_large(
        &mut self,
        mode: StoreMode,
        key: &[u8],
        flags: u32,
        exptime: u32,
        cas: u64,
        now: u32,
        link: LargeLink,
    ) -> StoreOutcome {
        let LargeLink {
            value_len,
            checksum,
            replicas,
            head,
        } = link;
        let head = &head[..];
        self.keys.stats.cmd_set += 1;
        self.detail.record(key, detail::KeyOp::Set);
        let existing = self
            .live(key, now)
            .map(|loc| item::meta(self.arena.bytes(loc)));
        let refused = Self::refusal(mode, cas, existing);
        match (cas, refused) {
            (0, _) => {}
            (_, None) => self.keys.stats.cas_hits += 1,
            (_, Some(StoreOutcome::NotFound)) => self.keys.stats.cas_misses += 1,
            (_, Some(_)) => self.keys.stats.cas_badval += 1,
        }
        if let Some(outcome) = refused {
            replicas
                .into_iter()
                .for_each(|r| self.keys.release_extent(r));
            return outcome;
        }
        let head_slot = (!head.is_empty())
            .then(|| self.arena.try_reserve_fixed().ok())
            .flatten()
            .map(|slot| {
                let len = head.len().min(self.arena.ram_head_bytes() as usize);
                self.arena
                    .reserved_slot_writer(&slot, len)
                    .write(&head[..len]);
                self.arena.publish(slot)
            });
        let new_cas = self.new_cas();
        let meta = Meta {
            cas: new_cas,
            flags,
            expiry: absolute_expiry(exptime, now),
        };
        let large = item::LargeValue {
            checksum,
            value_len,
            head: head_slot,
            replicas,
        };
        let record = match self.admit(Some(
            item::large_record_len(key.len(), large.replicas.len()) as u32,
        )) {
            Ok(record) => record,
            Err(outcome) => {
                if let Some(slot) = head_slot {
                    self.arena.free(slot);
                }
                large
                    .replicas
                    .into_iter()
                    .for_each(|r| self.keys.release_extent(r));
                return outcome;
            }
        };
        let bytes = self.arena.reserved_mut(&record);
        item::write_large(bytes, meta, key, &large);
        item::set_accessed(bytes, now);
        let loc = self.arena.publish(record);
        if let Some(slot) = head_slot {
            self.arena.link_fixed_owner(slot, loc);
        }
        self.link_checked(key, loc, mode, cas, new_cas)
    }
}
