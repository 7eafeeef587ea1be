//! The metrics endpoint's name tables: each STAT name of the general, `io`, `segments` and
//! `placement` groups mapped to a metric (name, type, unit, labels, help), or skipped with a
//! reason (`metrics.rs` builds the exposition from them; its unit tests check that every name a
//! STAT group can produce is here).

use prometheus_client::metrics::MetricType;

/// Every metric's name starts with this (and `_`).
pub const PREFIX: &str = "headroom";

/// A metric's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (resets with the process or STAT `reset`); samples end in `_total`.
    Counter,
    Gauge,
    /// A constant 1 whose labels carry text (a version, a policy); samples end in `_info`.
    Info,
    Histogram,
}

/// The unit a metric's name ends in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    None,
    Bytes,
    Seconds,
}

/// How a STAT value becomes the metric's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    AsIs,
    /// STAT says nanoseconds; the metric is in seconds.
    NanosToSeconds,
}

/// One exposed metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Metric {
    /// The name after `headroom_`, before the unit and the suffix the encoder adds (`_total`
    /// for counters, `_info` for info).
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Unit,
    pub help: &'static str,
}

impl Metric {
    /// The family's name as exposed (`# TYPE` in OpenMetrics): prefix, name, unit.
    pub fn family_name(&self) -> String {
        match self.unit {
            Unit::None => format!("{PREFIX}_{}", self.name),
            Unit::Bytes => format!("{PREFIX}_{}_bytes", self.name),
            Unit::Seconds => format!("{PREFIX}_{}_seconds", self.name),
        }
    }

    /// The name its samples carry (what a query names; histograms add `_bucket`, `_sum` and
    /// `_count` to it).
    pub fn sample_name(&self) -> String {
        match self.kind {
            Kind::Counter => format!("{}_total", self.family_name()),
            Kind::Info => format!("{}_info", self.family_name()),
            Kind::Gauge | Kind::Histogram => self.family_name(),
        }
    }

    pub(crate) fn metric_type(&self) -> MetricType {
        match self.kind {
            Kind::Counter => MetricType::Counter,
            Kind::Gauge => MetricType::Gauge,
            Kind::Info => MetricType::Info,
            Kind::Histogram => MetricType::Histogram,
        }
    }

    pub(crate) fn prometheus_unit(&self) -> Option<prometheus_client::registry::Unit> {
        match self.unit {
            Unit::None => None,
            Unit::Bytes => Some(prometheus_client::registry::Unit::Bytes),
            Unit::Seconds => Some(prometheus_client::registry::Unit::Seconds),
        }
    }
}

/// Label names and values fixed by a table row.
pub type Labels = &'static [(&'static str, &'static str)];

/// What becomes of one STAT name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Export {
    /// The value is a sample of `metric` with these labels.
    Sample {
        metric: Metric,
        labels: Labels,
        scale: Scale,
    },
    /// The value is the text of `label` on the info metric `metric`.
    InfoLabel { metric: Metric, label: &'static str },
    /// The value is a label on every sample of its row (a segment target's kind, host, node).
    RowLabel(&'static str),
    /// A state: the sample is 1 when the value is `when`, else 0.
    Flag { metric: Metric, when: &'static str },
    /// Not exposed, for this reason.
    Skip(&'static str),
}

const fn counter(name: &'static str, unit: Unit, help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Counter,
        unit,
        help,
    }
}

const fn gauge(name: &'static str, unit: Unit, help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Gauge,
        unit,
        help,
    }
}

const fn info(name: &'static str, help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Info,
        unit: Unit::None,
        help,
    }
}

const fn sample(metric: Metric) -> Export {
    labelled(metric, &[])
}

const fn labelled(metric: Metric, labels: Labels) -> Export {
    Export::Sample {
        metric,
        labels,
        scale: Scale::AsIs,
    }
}

/// Items the warm restart did not bring back, by reason (the log says each reason once).
const WARM_RESTART_SKIPPED: Metric = counter(
    "warm_restart_skipped",
    N,
    "Items the warm restart did not bring back, by reason (part of warm_restart_dropped).",
);

const fn skip(why: &'static str) -> Export {
    Export::Skip(why)
}

const B: Unit = Unit::Bytes;
const N: Unit = Unit::None;
const S: Unit = Unit::Seconds;

const BUILD: Metric = info(
    "build",
    "Headroom's version (STAT headroom_version) and the memcached release whose protocols it \
     speaks (STAT version).",
);
const CPU: Metric = counter(
    "cpu",
    S,
    "CPU time the process has used, by mode (getrusage).",
);
const COMMANDS: Metric = counter(
    "commands",
    N,
    "Commands run, by command, as STAT counts them: get (one per key, GATs included), set \
     (every storage command), touch, flush.",
);
const COMMAND_RESULTS: Metric = counter(
    "command_results",
    N,
    "Keyed commands by result: hit (found and applied), miss (not found), badval (a CAS whose \
     value had changed).",
);
const BAD_FRAMES: Metric = counter(
    "bad_frames",
    N,
    "Binary frames refused, by reason (docs/protocol.md, Bad input).",
);
const MESH_MESSAGES: Metric = counter(
    "mesh_messages",
    N,
    "Control-plane messages the shards sent over the channel mesh, by purpose (requests send \
     none).",
);

/// The general STAT group (`stats` with no argument): every name STAT can give, in its order.
pub const GENERAL: &[(&str, Export)] = &[
    ("pid", skip("a process attribute, not a measurement")),
    (
        "uptime",
        sample(gauge("uptime", S, "Seconds since the server started.")),
    ),
    (
        "time",
        skip("the server's clock: Prometheus stamps every scrape itself"),
    ),
    (
        "version",
        Export::InfoLabel {
            metric: BUILD,
            label: "memcached_version",
        },
    ),
    ("pointer_size", skip("a build constant")),
    ("rusage_user", labelled(CPU, &[("mode", "user")])),
    ("rusage_system", labelled(CPU, &[("mode", "system")])),
    (
        "max_connections",
        sample(gauge(
            "max_connections",
            N,
            "The --max-connections limit: connections beyond it are closed on accept.",
        )),
    ),
    (
        "curr_connections",
        sample(gauge("open_connections", N, "Client connections open now.")),
    ),
    (
        "total_connections",
        sample(counter(
            "accepted_connections",
            N,
            "Client connections accepted (those closed at --max-connections are not).",
        )),
    ),
    (
        "rejected_connections",
        sample(counter(
            "rejected_connections",
            N,
            "Connections closed on accept because --max-connections were open.",
        )),
    ),
    (
        "conn_bytes",
        sample(gauge(
            "connection_memory",
            B,
            "What client connections hold: each one's task and state, and the read and reply \
             buffers lent to it now (an idle connection holds none). Kernel socket buffers \
             are not counted.",
        )),
    ),
    (
        "read_buf_count",
        sample(gauge(
            "read_buffers",
            N,
            "Read buffers held by connections with bytes to run, and kept free for the next.",
        )),
    ),
    (
        "read_buf_bytes",
        sample(gauge(
            "read_buffer_memory",
            B,
            "Bytes of the read buffers held by connections and kept free.",
        )),
    ),
    (
        "read_buf_bytes_free",
        sample(gauge(
            "read_buffer_free_memory",
            B,
            "Bytes of the read buffers kept free for the next connection that needs one.",
        )),
    ),
    (
        "warm_restart_restored",
        sample(counter(
            "warm_restart_restored_items",
            N,
            "Items the warm restart at start brought back (RAM items and large values).",
        )),
    ),
    (
        "warm_restart_dropped",
        sample(counter(
            "warm_restart_dropped",
            N,
            "Items the warm restart could not bring back, and damaged stretches of its files.",
        )),
    ),
    (
        "warm_restart_evicted",
        sample(counter(
            "warm_restart_evicted",
            N,
            "Items the warm restart brought back and then evicted again: they did not all fit \
             --memory (the coldest go first).",
        )),
    ),
    (
        "warm_restart_skipped_segment_missing",
        labelled(WARM_RESTART_SKIPPED, &[("reason", "segment_missing")]),
    ),
    (
        "warm_restart_skipped_segment_changed",
        labelled(WARM_RESTART_SKIPPED, &[("reason", "segment_changed")]),
    ),
    (
        "warm_restart_skipped_data_changed",
        labelled(WARM_RESTART_SKIPPED, &[("reason", "data_changed")]),
    ),
    (
        "warm_restart_skipped_extents_taken",
        labelled(WARM_RESTART_SKIPPED, &[("reason", "extents_taken")]),
    ),
    (
        "warm_restart_skipped_record_damaged",
        labelled(WARM_RESTART_SKIPPED, &[("reason", "record_damaged")]),
    ),
    (
        "warm_restart_skipped_not_stored",
        labelled(WARM_RESTART_SKIPPED, &[("reason", "not_stored")]),
    ),
    (
        "warm_restart_skipped_ram_damaged",
        labelled(WARM_RESTART_SKIPPED, &[("reason", "ram_damaged")]),
    ),
    (
        "warm_restart_skipped_ram_not_stored",
        labelled(WARM_RESTART_SKIPPED, &[("reason", "ram_not_stored")]),
    ),
    (
        "warm_restart_ns",
        Export::Sample {
            metric: gauge(
                "warm_restart",
                S,
                "How long the warm restart at start took (the slowest shard).",
            ),
            labels: &[],
            scale: Scale::NanosToSeconds,
        },
    ),
    (
        "listen",
        Export::InfoLabel {
            metric: LISTENERS,
            label: "tcp",
        },
    ),
    (
        "listen_tls",
        Export::InfoLabel {
            metric: LISTENERS,
            label: "tls",
        },
    ),
    (
        "listen_unix",
        Export::InfoLabel {
            metric: LISTENERS,
            label: "unix",
        },
    ),
    (
        "ssl_new_sessions",
        sample(counter(
            "tls_new_sessions",
            N,
            "TLS handshakes on --listen that made a new session (with --tls-session-resumption on).",
        )),
    ),
    (
        "tls_resumed_sessions",
        sample(counter(
            "tls_resumed_sessions",
            N,
            "TLS handshakes that resumed a session (ssl_new_sessions counts the ones made).",
        )),
    ),
    (
        "ssl_handshake_errors",
        sample(counter(
            "tls_handshake_errors",
            N,
            "TLS handshakes that failed or timed out (--tls-handshake-timeout).",
        )),
    ),
    (
        "ssl_proto_errors",
        sample(counter(
            "tls_protocol_errors",
            N,
            "TLS sessions ended by a TLS error after the handshake.",
        )),
    ),
    (
        "time_since_server_cert_refresh",
        sample(gauge(
            "tls_certificate_age",
            S,
            "Seconds since the TLS certificate in use was loaded (at start or by SIGHUP).",
        )),
    ),
    ("cmd_get", labelled(COMMANDS, &[("command", "get")])),
    ("cmd_set", labelled(COMMANDS, &[("command", "set")])),
    ("cmd_flush", labelled(COMMANDS, &[("command", "flush")])),
    ("cmd_touch", labelled(COMMANDS, &[("command", "touch")])),
    (
        "get_hits",
        labelled(COMMAND_RESULTS, &[("command", "get"), ("result", "hit")]),
    ),
    (
        "get_misses",
        labelled(COMMAND_RESULTS, &[("command", "get"), ("result", "miss")]),
    ),
    (
        "get_expired",
        sample(counter(
            "get_expired",
            N,
            "Lookups that found their item expired (memcached's get_expired).",
        )),
    ),
    (
        "get_flushed",
        skip("always 0: a FLUSH frees the items it covers, so no lookup finds one"),
    ),
    (
        "delete_misses",
        labelled(
            COMMAND_RESULTS,
            &[("command", "delete"), ("result", "miss")],
        ),
    ),
    (
        "delete_hits",
        labelled(COMMAND_RESULTS, &[("command", "delete"), ("result", "hit")]),
    ),
    (
        "incr_misses",
        labelled(COMMAND_RESULTS, &[("command", "incr"), ("result", "miss")]),
    ),
    (
        "incr_hits",
        labelled(COMMAND_RESULTS, &[("command", "incr"), ("result", "hit")]),
    ),
    (
        "decr_misses",
        labelled(COMMAND_RESULTS, &[("command", "decr"), ("result", "miss")]),
    ),
    (
        "decr_hits",
        labelled(COMMAND_RESULTS, &[("command", "decr"), ("result", "hit")]),
    ),
    (
        "cas_misses",
        labelled(COMMAND_RESULTS, &[("command", "cas"), ("result", "miss")]),
    ),
    (
        "cas_hits",
        labelled(COMMAND_RESULTS, &[("command", "cas"), ("result", "hit")]),
    ),
    (
        "cas_badval",
        labelled(COMMAND_RESULTS, &[("command", "cas"), ("result", "badval")]),
    ),
    (
        "touch_hits",
        labelled(COMMAND_RESULTS, &[("command", "touch"), ("result", "hit")]),
    ),
    (
        "touch_misses",
        labelled(COMMAND_RESULTS, &[("command", "touch"), ("result", "miss")]),
    ),
    (
        "bytes_read",
        sample(counter("read", B, "Bytes read from client connections.")),
    ),
    (
        "bytes_written",
        sample(counter(
            "written",
            B,
            "Bytes written to client connections.",
        )),
    ),
    (
        "limit_maxbytes",
        sample(gauge(
            "limit",
            B,
            "RAM the cache holds items in (memcached's limit_maxbytes).",
        )),
    ),
    (
        "accepting_conns",
        skip("always 1: Headroom never stops listening"),
    ),
    (
        "listen_disabled_num",
        skip("always 0: Headroom never stops listening"),
    ),
    (
        "time_in_listen_disabled_us",
        skip("always 0: Headroom never stops listening"),
    ),
    (
        "threads",
        sample(gauge("shards", N, "Serving shards, one thread each.")),
    ),
    (
        "bytes",
        sample(gauge(
            "current",
            B,
            "Bytes items hold now: in RAM (ram_bytes) and their values in segments \
             (large_bytes).",
        )),
    ),
    (
        "curr_items",
        sample(gauge("current_items", N, "Items stored now.")),
    ),
    (
        "total_items",
        sample(counter(
            "items",
            N,
            "Items stored: every successful store, as memcached counts total_items.",
        )),
    ),
    (
        "evictions",
        sample(counter(
            "items_evicted",
            N,
            "Items evicted to make room in RAM.",
        )),
    ),
    (
        "reclaimed",
        skip("the same figure as expired_reclaimed (memcached's older name)"),
    ),
    (
        "expired_reclaimed",
        sample(counter(
            "items_reclaimed",
            N,
            "Expired items whose memory was reclaimed, by the sweep or on lookup.",
        )),
    ),
    (
        "lrutail_reflocked",
        sample(counter(
            "eviction_pinned_skips",
            N,
            "Records the CLOCK hand passed over because a send in flight pinned them \
             (memcached's lrutail_reflocked).",
        )),
    ),
    (
        "index_bytes",
        sample(gauge(
            "index",
            B,
            "Bytes of the key indexes (the per-item overhead outside the arena).",
        )),
    ),
    (
        "large_items",
        sample(gauge(
            "large_items",
            N,
            "Items larger than --ram-head: values whole in segments, heads in RAM.",
        )),
    ),
    (
        "ram_bytes",
        sample(gauge(
            "ram",
            B,
            "Arena bytes items hold now (records and fixed head slots).",
        )),
    ),
    (
        "large_bytes",
        sample(gauge("large_items", B, "Bytes of the large items' values.")),
    ),
    (
        "large_heads_dropped",
        sample(counter(
            "large_heads_dropped",
            N,
            "RAM head copies of large items given up to make room.",
        )),
    ),
    (
        "too_large",
        sample(counter(
            "too_large_values",
            N,
            "Stores refused as too large (over --max-item-size).",
        )),
    ),
    (
        "large_values_refused",
        sample(counter(
            "large_values_refused",
            N,
            "APPENDs and PREPENDs refused because the result would outgrow --ram-head (values \
             in segments are written whole).",
        )),
    ),
    (
        "store_too_large",
        skip("the same count as too_large, under memcached's name"),
    ),
    (
        "store_no_memory",
        skip("the same count as out_of_memory, under memcached's name"),
    ),
    (
        "out_of_memory",
        sample(counter(
            "out_of_memory_errors",
            N,
            "Stores refused for lack of memory.",
        )),
    ),
    (
        "compactions",
        sample(counter("compactions", N, "Small-object blocks compacted.")),
    ),
    (
        "compaction_bytes_moved",
        sample(counter("compaction_moved", B, "Bytes moved by compaction.")),
    ),
    (
        "commands",
        sample(counter(
            "requests",
            N,
            "Commands decoded, of every kind and protocol.",
        )),
    ),
    (
        "frame_bad_magic",
        labelled(BAD_FRAMES, &[("reason", "bad_magic")]),
    ),
    (
        "frame_body_too_short",
        labelled(BAD_FRAMES, &[("reason", "body_too_short")]),
    ),
    (
        "frame_key_too_long",
        labelled(BAD_FRAMES, &[("reason", "key_too_long")]),
    ),
    (
        "frame_invalid",
        labelled(BAD_FRAMES, &[("reason", "invalid")]),
    ),
    (
        "frame_unknown_opcode",
        labelled(BAD_FRAMES, &[("reason", "unknown_opcode")]),
    ),
    (
        "frame_too_large",
        labelled(BAD_FRAMES, &[("reason", "too_large")]),
    ),
    (
        "text_errors",
        sample(counter(
            "text_errors",
            N,
            "Text and meta commands answered with an error line, or a close.",
        )),
    ),
    (
        "line_scan_bytes",
        sample(counter(
            "line_scanned",
            B,
            "Bytes examined by searches for a text line's end (each byte of a line once).",
        )),
    ),
    (
        "line_incomplete_reads",
        sample(counter(
            "line_incomplete_reads",
            N,
            "Passes over received bytes (about one per read) that ended inside an unfinished text line.",
        )),
    ),
    (
        "read_buffer_max_bytes",
        sample(gauge(
            "read_buffer_max",
            B,
            "The largest read buffer any connection has had (a high-water mark; growth stops \
             at the longest line accepted, unless a frame needs more).",
        )),
    ),
    (
        "idle_closed",
        sample(counter(
            "idle_closed_connections",
            N,
            "Connections closed after --idle-timeout without traffic.",
        )),
    ),
    (
        "body_timeouts",
        sample(counter(
            "body_timeouts",
            N,
            "Large SETs dropped, and their connections closed, because the body brought too \
             few bytes in a --body-timeout window (docs/server.md).",
        )),
    ),
    (
        "segment_read_crc_errors",
        sample(counter(
            "segment_read_crc_errors",
            N,
            "Large values that failed their CRC32C as a GET streamed them out of their \
             segment (the connection closed, the item dropped).",
        )),
    ),
    (
        "badcrc_from_extstore",
        skip("the same count as segment_read_crc_errors, under memcached's name"),
    ),
    (
        "segment_write_errors",
        sample(counter(
            "segment_write_errors",
            N,
            "Large SETs refused because writing the value to its segment failed.",
        )),
    ),
    (
        "segment_write_no_space",
        sample(counter(
            "segment_write_no_space_errors",
            N,
            "Segment write failures for lack of space on the segment's filesystem (ENOSPC).",
        )),
    ),
    (
        "auth_cmds",
        sample(counter("auth_commands", N, "SASL authentication commands.")),
    ),
    (
        "auth_errors",
        sample(counter(
            "auth_errors",
            N,
            "SASL authentication commands that failed.",
        )),
    ),
    (
        "auth_closed",
        sample(counter(
            "auth_closed_connections",
            N,
            "Connections closed for failed SASL authentications (a connection's last allowed \
             failure).",
        )),
    ),
    (
        "auth_held",
        sample(counter(
            "auth_held_attempts",
            N,
            "SASL authentication attempts held until their source's failure budget had a \
             token (right passwords and wrong).",
        )),
    ),
    (
        "auth_sources_held",
        sample(gauge(
            "auth_sources_held",
            N,
            "Sources whose failure budget is spent now: their next attempt is held.",
        )),
    ),
    (
        "log_watchers",
        sample(gauge(
            "log_watchers",
            N,
            "`watch` connections open now.",
        )),
    ),
    (
        "large_evictions",
        sample(counter(
            "large_evictions",
            N,
            "Large items evicted to make segment room (--segment-eviction lru).",
        )),
    ),
    (
        "headroom_version",
        Export::InfoLabel {
            metric: BUILD,
            label: "version",
        },
    ),
    (
        "partitions",
        sample(gauge("partitions", N, "Partitions of the key space.")),
    ),
    (
        "partition_locks",
        sample(counter(
            "partition_lock_acquisitions",
            N,
            "Partition lock acquisitions.",
        )),
    ),
    (
        "partition_locks_contended",
        sample(counter(
            "partition_lock_contentions",
            N,
            "Partition lock acquisitions that found the lock held by another thread.",
        )),
    ),
    (
        "partition_lock_hold_p50_ns",
        Export::Sample {
            metric: gauge(
                "partition_lock_hold_p50",
                S,
                "The median partition lock hold time, over a sample of every 64th hold (the upper bound of its \
                 power-of-two bucket).",
            ),
            labels: &[],
            scale: Scale::NanosToSeconds,
        },
    ),
    (
        "partition_lock_hold_p99_ns",
        Export::Sample {
            metric: gauge(
                "partition_lock_hold_p99",
                S,
                "The 99th percentile of partition lock hold times, over a sample of every 64th hold (the upper bound of its \
                 power-of-two bucket).",
            ),
            labels: &[],
            scale: Scale::NanosToSeconds,
        },
    ),
    (
        "partition_lock_hold_max_ns",
        Export::Sample {
            metric: gauge(
                "partition_lock_hold_max",
                S,
                "The longest partition lock hold, over a sample of every 64th hold (the upper bound of its \
                 power-of-two bucket).",
            ),
            labels: &[],
            scale: Scale::NanosToSeconds,
        },
    ),
    (
        "mesh_messages_placement",
        labelled(MESH_MESSAGES, &[("purpose", "placement")]),
    ),
    (
        "mesh_messages_control",
        labelled(MESH_MESSAGES, &[("purpose", "control")]),
    ),
    (
        "mesh_messages_connection",
        labelled(MESH_MESSAGES, &[("purpose", "connection")]),
    ),
    (
        "core_batch_idle_blocks",
        sample(gauge(
            "core_batch_idle_blocks",
            N,
            "Idle arena blocks in the shards' per-core batches.",
        )),
    ),
];

const IO_PATH: Metric = info(
    "io_path",
    "The data path a shard serves on (ring, or plain and why).",
);
const RING_OPERATIONS: Metric = counter(
    "ring_operations",
    N,
    "io_uring operations completed, by shard and operation.",
);
const RING_BYTES: Metric = counter(
    "ring",
    B,
    "Bytes io_uring operations moved, by shard and operation.",
);
const LENT_PLAIN_SENDS: Metric = counter(
    "lent_plain_sends",
    N,
    "Lent values sent with plain SEND instead of SEND_ZC, by reason: huge_pages (zero-copy \
     from huge pages stalls), kernel_copies (the connection's notifications said the kernel \
     copies anyway), not_tcp (a unix socket's client: only TCP takes SEND_ZC).",
);

const LISTENERS: Metric = info(
    "listeners",
    "What the server listens on: the --listen addresses (tcp), the TLS of each (tls: off, tls, \
     tls_optional_cert or mtls, in the same order) and the --unix-socket path (unix, or off).",
);

/// The `io` STAT group, per shard (`shardN_` + these names; every sample gets `shard="N"`).
pub const IO: &[(&str, Export)] = &[
    (
        "path",
        Export::InfoLabel {
            metric: IO_PATH,
            label: "path",
        },
    ),
    (
        "pool_chunks",
        sample(gauge(
            "stream_pool_chunks",
            N,
            "Chunks of a shard's streaming pool.",
        )),
    ),
    (
        "pool_chunks_free",
        sample(gauge(
            "stream_pool_free_chunks",
            N,
            "Free chunks of a shard's streaming pool.",
        )),
    ),
    (
        "heads_lent",
        sample(counter(
            "lent_values",
            N,
            "Values (or heads) sent straight from their pinned arena bytes.",
        )),
    ),
    (
        "head_bytes_lent",
        sample(counter(
            "lent",
            B,
            "Bytes sent straight from pinned arena bytes.",
        )),
    ),
    (
        "fallbacks",
        sample(counter(
            "io_fallbacks",
            N,
            "Times the ring path wanted a registered buffer and the memory was not registered.",
        )),
    ),
    (
        "pool_waits",
        sample(counter(
            "io_pool_waits",
            N,
            "Large GETs that waited for a streaming pool chunk (the pool dry).",
        )),
    ),
    ("ops_send", labelled(RING_OPERATIONS, &[("op", "send")])),
    ("bytes_send", labelled(RING_BYTES, &[("op", "send")])),
    (
        "ops_send_zc",
        labelled(RING_OPERATIONS, &[("op", "send_zc")]),
    ),
    ("bytes_send_zc", labelled(RING_BYTES, &[("op", "send_zc")])),
    (
        "ops_read_fixed",
        labelled(RING_OPERATIONS, &[("op", "read_fixed")]),
    ),
    (
        "bytes_read_fixed",
        labelled(RING_BYTES, &[("op", "read_fixed")]),
    ),
    (
        "ops_write_fixed",
        labelled(RING_OPERATIONS, &[("op", "write_fixed")]),
    ),
    (
        "bytes_write_fixed",
        labelled(RING_BYTES, &[("op", "write_fixed")]),
    ),
    ("ops_recv", labelled(RING_OPERATIONS, &[("op", "recv")])),
    ("bytes_recv", labelled(RING_BYTES, &[("op", "recv")])),
    (
        "op_errors",
        sample(counter(
            "ring_operation_errors",
            N,
            "io_uring operations that completed with an error (cancellations included).",
        )),
    ),
    (
        "zc_notifications",
        sample(counter(
            "zero_copy_notifications",
            N,
            "Zero-copy send notifications received.",
        )),
    ),
    (
        "zc_copied",
        sample(counter(
            "zero_copy_kernel_copies",
            N,
            "Zero-copy notifications saying the kernel copied the bytes after all.",
        )),
    ),
    (
        "lent_sends_huge_pages",
        labelled(LENT_PLAIN_SENDS, &[("reason", "huge_pages")]),
    ),
    (
        "lent_sends_kernel_copies",
        labelled(LENT_PLAIN_SENDS, &[("reason", "kernel_copies")]),
    ),
    (
        "lent_sends_not_tcp",
        labelled(LENT_PLAIN_SENDS, &[("reason", "not_tcp")]),
    ),
    (
        "connections",
        sample(gauge(
            "shard_connections",
            N,
            "Client connections the shard serves now (accepted there or handed to it).",
        )),
    ),
    (
        "in_flight",
        sample(gauge(
            "ring_in_flight_operations",
            N,
            "io_uring operations in flight now.",
        )),
    ),
    (
        "in_flight_max",
        sample(gauge(
            "ring_in_flight_operations_max",
            N,
            "Most io_uring operations ever in flight at once.",
        )),
    ),
    (
        "ring_full_waits",
        sample(counter(
            "ring_full_waits",
            N,
            "Times a submission waited for room in the ring.",
        )),
    ),
    (
        "cq_overflows",
        sample(counter(
            "ring_cq_overflows",
            N,
            "Times the completion queue had overflowed (the kernel kept the completions).",
        )),
    ),
    (
        "cancels",
        sample(counter("ring_cancels", N, "io_uring operations cancelled.")),
    ),
    (
        "ring_wakeups",
        sample(counter(
            "ring_wakeups",
            N,
            "Sleeps in the shard's ring, or eventfd wake-ups of its driver (--ring-sleep off).",
        )),
    ),
    (
        "ring_submits",
        sample(counter(
            "ring_submits",
            N,
            "io_uring_enter calls that submitted queued entries.",
        )),
    ),
    (
        "ring_entries_submitted",
        sample(counter(
            "ring_entries_submitted",
            N,
            "Entries those io_uring_enter calls carried.",
        )),
    ),
    (
        "ring_task_runs",
        sample(counter(
            "ring_task_runs",
            N,
            "io_uring_enter calls made only to run completions waiting for the thread.",
        )),
    ),
    (
        "ring_files_registered",
        sample(gauge(
            "ring_files_registered",
            N,
            "Sockets in the ring's registered-file table now.",
        )),
    ),
    (
        "ring_files_full",
        sample(counter(
            "ring_files_full",
            N,
            "Connections that found the registered-file table full and use their descriptor.",
        )),
    ),
    (
        "receives_armed",
        sample(counter(
            "ring_receives_armed",
            N,
            "Multishot receives armed (a connection's first read, and again after a pause or an end).",
        )),
    ),
    (
        "receives_out_of_buffers",
        sample(counter(
            "ring_receives_out_of_buffers",
            N,
            "Multishot receives that ended because every provided buffer was taken.",
        )),
    ),
    (
        "receives_paused",
        sample(counter(
            "ring_receives_paused",
            N,
            "Multishot receives cancelled because their connection held too much unread.",
        )),
    ),
];

const TARGET_INFO: Metric = info(
    "target",
    "A store target of the segments: its name and uuid, with the labels its figures carry.",
);

/// The `segments` STAT group, per target (`target_N_` + these names). Every sample gets
/// `target="N"` and the target's `kind`, `node` and `host` labels.
pub const SEGMENTS: &[(&str, Export)] = &[
    (
        "name",
        Export::InfoLabel {
            metric: TARGET_INFO,
            label: "name",
        },
    ),
    (
        "uuid",
        Export::InfoLabel {
            metric: TARGET_INFO,
            label: "uuid",
        },
    ),
    ("kind", Export::RowLabel("kind")),
    ("host", Export::RowLabel("host")),
    ("node", Export::RowLabel("node")),
    (
        "capacity",
        sample(gauge(
            "target_capacity",
            B,
            "A store target's usable bytes.",
        )),
    ),
    (
        "used",
        sample(gauge(
            "target_used",
            B,
            "Bytes of a store target that values hold.",
        )),
    ),
    (
        "largest_free",
        sample(gauge(
            "target_largest_free",
            B,
            "A store target's largest free extent.",
        )),
    ),
    (
        "objects",
        sample(gauge(
            "target_objects",
            N,
            "Values stored on a store target.",
        )),
    ),
    (
        "status",
        Export::Flag {
            metric: gauge(
                "target_draining",
                N,
                "1 while a store target drains (takes no new placements), 0 while active.",
            ),
            when: "draining",
        },
    ),
];

const PLACED_REPLICAS: Metric = counter(
    "placed_replicas",
    N,
    "Replicas the placement master placed, by locality tier: exact_node (this host, the \
     requested node), unknown_locality (this host, a target of unknown node), cross_node \
     (this host, another node), other_host.",
);

/// The `placement` STAT group (the NUMA RFC's placement metrics).
pub const PLACEMENT: &[(&str, Export)] = &[
    (
        "policy",
        Export::InfoLabel {
            metric: info(
                "placement_policy",
                "How the placement master ranks targets (--placement-policy).",
            ),
            label: "policy",
        },
    ),
    (
        "segment_evictions",
        sample(counter(
            "segment_evictions",
            N,
            "Large values the placement master chose to evict to make segment room.",
        )),
    ),
    (
        "requests",
        sample(counter(
            "placement_requests",
            N,
            "Placement requests the master answered.",
        )),
    ),
    (
        "requests_without_locality",
        sample(counter(
            "placement_requests_without_locality",
            N,
            "Placement requests that named no NUMA node.",
        )),
    ),
    (
        "exact_node",
        labelled(PLACED_REPLICAS, &[("tier", "exact_node")]),
    ),
    (
        "exact_node_bytes",
        sample(counter(
            "placed_exact_node",
            B,
            "Bytes of replicas placed on the requested node.",
        )),
    ),
    (
        "unknown_locality_placements",
        labelled(PLACED_REPLICAS, &[("tier", "unknown_locality")]),
    ),
    (
        "cross_node_fallbacks",
        labelled(PLACED_REPLICAS, &[("tier", "cross_node")]),
    ),
    (
        "other_host_fallbacks",
        labelled(PLACED_REPLICAS, &[("tier", "other_host")]),
    ),
    (
        "preferred_placements",
        sample(counter(
            "preferred_placements",
            N,
            "Replicas placed on a target the client preferred.",
        )),
    ),
    (
        "partial",
        sample(counter(
            "partial_placements",
            N,
            "Placement requests that got fewer replicas than asked.",
        )),
    ),
    (
        "strict_failures",
        sample(counter(
            "strict_placement_failures",
            N,
            "Strict placement requests that found no room on their node.",
        )),
    ),
    (
        "failures",
        sample(counter(
            "placement_failures",
            N,
            "Placement requests that found no room.",
        )),
    ),
    (
        "last_failure_free",
        sample(gauge(
            "last_placement_failure_free",
            B,
            "Free segment bytes at the last placement failure.",
        )),
    ),
    (
        "last_failure_largest_hole",
        sample(gauge(
            "last_placement_failure_largest_hole",
            B,
            "The largest free extent at the last placement failure.",
        )),
    ),
    (
        "targets_unknown_locality",
        sample(gauge(
            "targets_unknown_locality",
            N,
            "Store targets whose NUMA node is unknown.",
        )),
    ),
];

/// The `placement` group's per-node rows (`{local|remote}_node_{N}_` + these names). Every
/// sample gets `host` (`local`: this machine, `remote`: another) and `node` (a number, or
/// `unknown`).
pub const PLACEMENT_BY_NODE: &[(&str, Export)] = &[
    (
        "capacity",
        sample(gauge(
            "node_segment_capacity",
            B,
            "Segment bytes by host and NUMA node.",
        )),
    ),
    (
        "allocated",
        sample(gauge(
            "node_segment_allocated",
            B,
            "Segment bytes allocated, by host and NUMA node.",
        )),
    ),
];

/// The latency histograms (not a STAT group).
pub const REQUEST_DURATION: Metric = Metric {
    name: "request_duration",
    kind: Kind::Histogram,
    unit: S,
    help: "Server-side request latency by command: from the request's arrival (its read \
           completing) to its reply being handed to the kernel.",
};
