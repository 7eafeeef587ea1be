//! Per-prefix counters (STAT `detail on|off|dump`), as memcached keeps them: the prefix is the
//! key up to its first `:`; keys without one are not counted. Off by default; while on, every
//! GET, store and DELETE of a prefixed key costs one hash-map update.

use hashbrown::HashMap;

/// The delimiter ending a prefix (memcached's default `-D :`).
pub const PREFIX_DELIMITER: u8 = b':';
/// Most prefixes one store tracks; later new prefixes are not counted (bounded memory).
pub const PREFIXES_MAX: usize = 10_000;

/// One prefix's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCounts {
    pub gets: u64,
    pub hits: u64,
    pub sets: u64,
    pub deletes: u64,
}

impl PrefixCounts {
    pub fn add(&mut self, other: &PrefixCounts) {
        self.gets += other.gets;
        self.hits += other.hits;
        self.sets += other.sets;
        self.deletes += other.deletes;
    }
}

/// What happened to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOp {
    Get { hit: bool },
    Set,
    Delete,
}

#[derive(Debug, Default)]
pub struct PrefixStats {
    pub enabled: bool,
    prefixes: HashMap<Vec<u8>, PrefixCounts>,
}

impl PrefixStats {
    pub fn record(&mut self, key: &[u8], op: KeyOp) {
        if !self.enabled {
            return;
        }
        let Some(end) = key.iter().position(|&b| b == PREFIX_DELIMITER) else {
            return;
        };
        let prefix = &key[..end];
        if !self.prefixes.contains_key(prefix) {
            if self.prefixes.len() >= PREFIXES_MAX {
                return;
            }
            self.prefixes
                .insert(prefix.to_vec(), PrefixCounts::default());
        }
        let Some(counts) = self.prefixes.get_mut(prefix) else {
            return;
        };
        match op {
            KeyOp::Get { hit } => {
                counts.gets += 1;
                counts.hits += u64::from(hit);
            }
            KeyOp::Set => counts.sets += 1,
            KeyOp::Delete => counts.deletes += 1,
        }
    }

    pub fn snapshot(&self) -> Vec<(Vec<u8>, PrefixCounts)> {
        self.prefixes.iter().map(|(p, c)| (p.clone(), *c)).collect()
    }

    pub fn clear(&mut self) {
        self.prefixes.clear();
    }
}

/// memcached's dump: `PREFIX name get N hit N set N del N` lines, then `END`.
pub fn dump(prefixes: &[(Vec<u8>, PrefixCounts)]) -> String {
    let mut out = String::new();
    for (prefix, c) in prefixes {
        out.push_str(&format!(
            "PREFIX {} get {} hit {} set {} del {}\r\n",
            String::from_utf8_lossy(prefix),
            c.gets,
            c.hits,
            c.sets,
            c.deletes
        ));
    }
    out.push_str("END\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_prefixed_keys_only_while_on() {
        let mut stats = PrefixStats::default();
        stats.record(b"user:1", KeyOp::Set);
        assert!(stats.snapshot().is_empty(), "off by default");
        stats.enabled = true;
        stats.record(b"user:1", KeyOp::Set);
        stats.record(b"user:2", KeyOp::Get { hit: true });
        stats.record(b"user:3", KeyOp::Get { hit: false });
        stats.record(b"user:3", KeyOp::Delete);
        stats.record(b"plain", KeyOp::Set);
        let snapshot = stats.snapshot();
        assert_eq!(
            snapshot,
            vec![(
                b"user".to_vec(),
                PrefixCounts {
                    gets: 2,
                    hits: 1,
                    sets: 1,
                    deletes: 1
                }
            )]
        );
        assert_eq!(
            dump(&snapshot),
            "PREFIX user get 2 hit 1 set 1 del 1\r\nEND\r\n"
        );
    }
}
