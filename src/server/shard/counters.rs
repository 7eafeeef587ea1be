//! A shard's connection-level counters (STAT and `/metrics` sum them over the shards).

/// Per-shard connection-level counters.
#[derive(Clone, Debug, Default)]
pub struct ConnCounters {
    pub commands: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub bad_magic: u64,
    pub body_too_short: u64,
    pub key_too_long: u64,
    pub invalid_frames: u64,
    pub unknown_opcodes: u64,
    pub too_large_frames: u64,
    pub idle_closed: u64,
    /// FLUSH commands (one per command, however many shards it reaches).
    pub cmd_flush: u64,
    /// SASL AUTH/STEP commands, and those that failed.
    pub auth_cmds: u64,
    pub auth_errors: u64,
    /// Connections closed after `auth::AUTH_FAILURES_MAX` failed authentications.
    pub auth_closed: u64,
    /// Authentication attempts held for their source's failure budget
    /// (`auth_gate::AuthGate`), right passwords and wrong.
    pub auth_held: u64,
    /// Text and meta commands answered with an error line (or a close) by the decoder.
    pub text_errors: u64,
    /// Bytes examined by searches for a text line's end (each byte of a line once, however
    /// many reads bring it), and passes over received bytes that ended inside an unfinished
    /// line (about one per read while a long line arrives).
    pub line_scan_bytes: u64,
    pub line_incomplete_reads: u64,
    /// The largest read buffer a connection has had (bytes; a high-water mark, the largest
    /// shard's across shards).
    pub read_buffer_max_bytes: u64,
    /// Large GETs whose value failed its CRC32C as it streamed out (connection closed, item
    /// dropped).
    pub segment_read_crc_errors: u64,
    /// Large SET bodies that brought less than `net::stream::BODY_PROGRESS_MIN_BYTES` in a
    /// `--body-timeout` window (dropped, connection closed).
    pub body_timeouts: u64,
    /// Large SETs whose segment write failed, and those of them for lack of space.
    pub segment_write_errors: u64,
    pub segment_write_no_space: u64,
}

impl ConnCounters {
    pub fn add(&mut self, o: &ConnCounters) {
        self.commands += o.commands;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.bad_magic += o.bad_magic;
        self.body_too_short += o.body_too_short;
        self.key_too_long += o.key_too_long;
        self.invalid_frames += o.invalid_frames;
        self.unknown_opcodes += o.unknown_opcodes;
        self.too_large_frames += o.too_large_frames;
        self.idle_closed += o.idle_closed;
        self.cmd_flush += o.cmd_flush;
        self.auth_cmds += o.auth_cmds;
        self.auth_errors += o.auth_errors;
        self.auth_closed += o.auth_closed;
        self.auth_held += o.auth_held;
        self.text_errors += o.text_errors;
        self.line_scan_bytes += o.line_scan_bytes;
        self.line_incomplete_reads += o.line_incomplete_reads;
        self.read_buffer_max_bytes = self.read_buffer_max_bytes.max(o.read_buffer_max_bytes);
        self.segment_read_crc_errors += o.segment_read_crc_errors;
        self.body_timeouts += o.body_timeouts;
        self.segment_write_errors += o.segment_write_errors;
        self.segment_write_no_space += o.segment_write_no_space;
    }
}
