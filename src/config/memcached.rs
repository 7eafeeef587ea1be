//! memcached 1.6.45's command line read as Headroom's: every flag `memcached -h` lists and
//! every `-o` option 1.6.45 parses, each mapped to Headroom's flags, accepted with a note where
//! Headroom makes it moot, or refused with the reason and an exit status.
//!
//! [`FLAGS`] and [`OPTIONS`] are the one source: the reader applies them, and the table in
//! docs/operations.md ("Coming from memcached") is [`markdown_table`]'s output, checked by a
//! test. A line is read this way when it holds one of memcached's short flags, or with
//! `--memcached-args` or `--memcached-conf FILE` (Debian's `/etc/memcached.conf` format);
//! Headroom's own long flags may stand beside memcached's.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use clap::{CommandFactory, Parser};

use super::Cli;

/// memcached's exit status for a flag it does not know or a value it refuses (`return 1` in
/// its option loop).
pub const EXIT_BAD_FLAG: i32 = 1;
/// memcached's exit status for a feature it was built without (`EX_USAGE`): Headroom's for a
/// flag it cannot honour.
pub const EXIT_UNSUPPORTED: i32 = 64;
/// memcached's default port.
pub const MEMCACHED_PORT: u16 = 11211;
/// memcached's default `-I`.
pub const MEMCACHED_ITEM_SIZE_MAX: &str = "1M";
/// memcached's default `-t`: its worker threads, here shards (at most one per CPU).
pub const MEMCACHED_THREADS: usize = 4;
/// memcached's `ssl_wbuf_size` default, in KiB.
const MEMCACHED_SSL_WBUF_KIB: u32 = 16;
/// Where the data directory goes on this path when started as root with none named (a
/// service's state, as a distribution package keeps it); `./data` otherwise.
pub const ROOT_DATA_DIR: &str = "/var/lib/headroom";

/// Whether a flag takes a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    None,
    Required,
    /// `--verbose[=N]`: only in the `=` form.
    Optional,
}

/// What a memcached flag or `-o` option becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meaning {
    /// Headroom's flags, set from it (the text names them).
    Mapped(&'static str),
    /// Accepted with one INFO line: the text, which says what takes its place.
    Noted(&'static str),
    /// Refused at start: the sentence, and the exit status.
    Refused(&'static str, i32),
}

/// One of memcached's flags.
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    pub short: char,
    pub long: Option<&'static str>,
    pub value: Value,
    pub meaning: Meaning,
}

/// One of memcached's `-o` options.
#[derive(Clone, Copy, Debug)]
pub struct SubOption {
    pub name: &'static str,
    pub meaning: Meaning,
}

const fn flag(short: char, long: &'static str, value: Value, meaning: Meaning) -> Flag {
    Flag {
        short,
        long: if long.is_empty() { None } else { Some(long) },
        value,
        meaning,
    }
}

const fn option(name: &'static str, meaning: Meaning) -> SubOption {
    SubOption { name, meaning }
}

use Meaning::{Mapped, Noted, Refused};
use Value::{None as Bare, Optional, Required};

const NO_SLABS: &str = "no slab classes to tune: heads live in buddy slots and small items are \
    packed byte-granular, with compaction (docs/arena.md)";
const NO_LRU_SEGMENTS: &str = "one CLOCK per partition replaces memcached's segmented LRU and \
    its maintainer thread; nothing to tune";
const NO_HASH_TUNING: &str = "each partition's index grows by itself; nothing to tune";
const NO_EXTSTORE_TUNING: &str = "values above --ram-head go whole to the segments (-o \
    ext_path), written and read with O_DIRECT by each shard's ring; nothing to tune";
const NO_LOG_BUFFERS: &str = "watchers get lines through a bounded queue per watcher; nothing \
    to tune";

/// Every flag `memcached -h` of 1.6.45 lists, in its order.
pub const FLAGS: &[Flag] = &[
    flag('p', "port", Required, Mapped("the port of every --listen address (default 11211)")),
    flag('U', "udp-port", Required, Mapped("0 only (UDP off, memcached's default); any other port is refused: Headroom has no UDP")),
    flag('s', "unix-socket", Required, Mapped("--unix-socket, and --listen none: TCP is off, as memcached does with -s")),
    flag('a', "unix-mask", Required, Mapped("--unix-socket-mode")),
    flag('A', "enable-shutdown", Bare, Mapped("--shutdown-command on")),
    flag('l', "listen", Required, Mapped("--listen: each address (repeated or comma-separated) with -p's port unless it names one; without -l, every address ([::] takes IPv4 too), as memcached; with -Z, notls:, btls: and mtls: as --listen's plain:, tls: and mtls:")),
    flag('d', "daemon", Bare, Mapped("--daemon (in a --memcached-conf file it is skipped, as Debian's systemd wrapper does)")),
    flag('r', "enable-coredumps", Bare, Noted("the core file limit is left as started: set LimitCORE= in the unit, or ulimit -c")),
    flag('u', "user", Required, Mapped("--user")),
    flag('m', "memory-limit", Required, Mapped("--memory in MiB, rounded up to whole --block units (2 MiB here)")),
    flag('M', "disable-evictions", Bare, Mapped("--evictions off")),
    flag('c', "conn-limit", Required, Mapped("--max-connections")),
    flag('k', "lock-memory", Bare, Noted("the arena is always preallocated on huge pages and never swapped")),
    flag('v', "verbose", Optional, Mapped("--log-level: none or -v info, -vv debug, -vvv trace")),
    flag('h', "help", Bare, Mapped("prints this table and Headroom's --help pointer, then exits 0")),
    flag('i', "license", Bare, Mapped("prints Headroom's license, then exits 0")),
    flag('V', "version", Bare, Mapped("prints Headroom's version, then exits 0")),
    flag('P', "pidfile", Required, Mapped("--pid-file (written once serving, removed on a clean stop)")),
    flag('f', "slab-growth-factor", Required, Noted(NO_SLABS)),
    flag('n', "slab-min-size", Required, Noted(NO_SLABS)),
    flag('L', "enable-largepages", Bare, Noted("the arena is always on huge pages (hugetlb)")),
    flag('D', "", Required, Noted("no per-prefix statistics; `stats detail` counts by key prefix up to ':'")),
    flag('t', "threads", Required, Mapped("--threads, at most one shard per CPU of the serving node (memcached's default 4 applies, capped the same way)")),
    flag('R', "max-reqs-per-event", Required, Noted("a shard serves every request a read brought, then the next connection; nothing to tune")),
    flag('C', "disable-cas", Bare, Noted("CAS stays on: every item keeps its 8-byte CAS")),
    flag('b', "listen-backlog", Required, Noted("each listening socket's backlog is 1024, capped by net.core.somaxconn")),
    flag('B', "protocol", Required, Mapped("auto, ascii or binary accepted: every port negotiates text, meta and binary per connection")),
    flag('I', "max-item-size", Required, Mapped("--max-item-size (k and m suffixes; memcached's default 1m applies; up to 4095m, since large values stream to segments)")),
    flag('S', "enable-sasl", Bare, Mapped("--sasl-password-file from $MEMCACHED_SASL_PWDB (user:password lines), or refused without one")),
    flag('F', "disable-flush-all", Bare, Mapped("--flush-all-command off")),
    flag('X', "disable-dumping", Bare, Mapped("--dump-commands off")),
    flag('W', "disable-watch", Bare, Mapped("--watch-command off")),
    flag('Y', "auth-file", Required, Refused("-Y: Headroom has no text-protocol authentication; use -S (SASL, binary protocol) with $MEMCACHED_SASL_PWDB, or TLS client certificates (-Z -o ssl_ca_cert=...,ssl_verify_mode=2)", EXIT_UNSUPPORTED)),
    flag('e', "memory-file", Required, Mapped("--warm-restart on: a graceful stop writes the items to the data directory's snapshot, not to this file (without -e, warm restart is off, as memcached)")),
    flag('o', "extended", Required, Mapped("the -o options below")),
    flag('N', "napi-ids", Required, Noted("each shard serves the connections the kernel spreads to its listening socket; no NAPI-ID steering")),
    flag('Z', "enable-ssl", Bare, Mapped("TLS on every --listen address but -l's notls: ones: --tls-cert and --tls-key from ssl_chain_cert and ssl_key (both needed)")),
];

/// Every `-o` option memcached 1.6.45 parses (memcached.c, then extstore's in storage.c).
pub const OPTIONS: &[SubOption] = &[
    option("maxconns_fast", Noted("a connection over --max-connections is always told and closed at once")),
    option("no_maxconns_fast", Noted("a connection over --max-connections is always told and closed at once")),
    option("hashpower", Noted(NO_HASH_TUNING)),
    option("no_hashexpand", Noted(NO_HASH_TUNING)),
    option("hash_algorithm", Noted("keys are hashed with a seeded hash of Headroom's own; nothing to choose")),
    option("slab_reassign", Noted(NO_SLABS)),
    option("no_slab_reassign", Noted(NO_SLABS)),
    option("slab_automove", Noted(NO_SLABS)),
    option("no_slab_automove", Noted(NO_SLABS)),
    option("slab_automove_ratio", Noted(NO_SLABS)),
    option("slab_automove_window", Noted(NO_SLABS)),
    option("slab_automove_freeratio", Noted(NO_SLABS)),
    option("slab_sizes", Noted(NO_SLABS)),
    option("slab_chunk_max", Noted(NO_SLABS)),
    option("no_chunked_items", Noted(NO_SLABS)),
    option("tail_repair_time", Noted("an item is never locked for long enough to need repair; nothing to tune")),
    option("lru_crawler", Mapped("--lru-crawler on")),
    option("no_lru_crawler", Mapped("--lru-crawler off")),
    option("lru_crawler_sleep", Noted("the crawler reclaims expired items in small steps between requests; nothing to tune")),
    option("lru_crawler_tocrawl", Noted("the crawler reclaims expired items in small steps between requests; nothing to tune")),
    option("lru_maintainer", Noted(NO_LRU_SEGMENTS)),
    option("no_lru_maintainer", Noted(NO_LRU_SEGMENTS)),
    option("hot_lru_pct", Noted(NO_LRU_SEGMENTS)),
    option("warm_lru_pct", Noted(NO_LRU_SEGMENTS)),
    option("hot_max_factor", Noted(NO_LRU_SEGMENTS)),
    option("warm_max_factor", Noted(NO_LRU_SEGMENTS)),
    option("temporary_ttl", Noted(NO_LRU_SEGMENTS)),
    option("idle_timeout", Mapped("--idle-timeout")),
    option("watcher_logbuf_size", Noted(NO_LOG_BUFFERS)),
    option("worker_logbuf_size", Noted(NO_LOG_BUFFERS)),
    option("track_sizes", Noted("`stats sizes` is not kept; STAT item counts per size class come from `stats slabs`")),
    option("no_inline_ascii_resp", Noted("no effect in memcached 1.6 either")),
    option("inline_ascii_resp", Noted("no effect in memcached 1.6 either")),
    option("modern", Noted("no effect in memcached 1.6.45 either")),
    option("no_modern", Noted("memcached 1.4's defaults are slab and LRU settings Headroom does not have")),
    option("no_drop_privileges", Noted("Headroom drops to --user; restrict system calls with the unit's SystemCallFilter=")),
    option("drop_privileges", Noted("Headroom drops to --user; restrict system calls with the unit's SystemCallFilter=")),
    option("resp_obj_mem_limit", Noted("deprecated in memcached too")),
    option("read_buf_mem_limit", Noted("each shard keeps at most 256 free read and reply buffers; an idle connection holds none")),
    option("ssl_chain_cert", Mapped("--tls-cert (with -Z)")),
    option("ssl_key", Mapped("--tls-key (with -Z)")),
    option("ssl_verify_mode", Mapped("0: --tls-client-cert none; 1: --tls-client-cert optional; 2 and 3: --tls-client-cert required (1 to 3 need ssl_ca_cert)")),
    option("ssl_keyformat", Mapped("1 (PEM) only; any other is refused")),
    option("ssl_ciphers", Noted("rustls's cipher suites are used: TLS 1.3's, and TLS 1.2's ECDHE with AES-GCM or ChaCha20-Poly1305")),
    option("ssl_ca_cert", Mapped("--tls-ca (clients of an address without a prefix are asked for certificates only with ssl_verify_mode 1 to 3; mtls: addresses always ask)")),
    option("ssl_wbuf_size", Mapped("--tls-write-buffer, in KiB as memcached takes it; memcached's default, 16 KiB, without it")),
    option("ssl_session_cache", Mapped("--tls-session-resumption on; without it, off, memcached's default")),
    option("ssl_kernel_tls", Noted("TLS runs in user space on each connection (docs/server.md)")),
    option("ssl_min_version", Mapped("0 to 2: TLS 1.2 (older versions are never served); 3: --tls-min-version 1.3")),
    option("proxy_config", Refused("-o proxy_config: Headroom is a cache, not memcached's proxy; run memcached-proxy in front of it", EXIT_UNSUPPORTED)),
    option("proxy_arg", Refused("-o proxy_arg: Headroom is a cache, not memcached's proxy; run memcached-proxy in front of it", EXIT_UNSUPPORTED)),
    option("proxy_uring", Refused("-o proxy_uring: Headroom is a cache, not memcached's proxy; run memcached-proxy in front of it", EXIT_UNSUPPORTED)),
    option("proxy_memprofile", Refused("-o proxy_memprofile: Headroom is a cache, not memcached's proxy; run memcached-proxy in front of it", EXIT_UNSUPPORTED)),
    option("relaxed_privileges", Noted("a debug build's option of memcached; nothing to relax")),
    option("sock_cookie_id", Refused("-o sock_cookie_id: memcached offers it only where SO_USER_COOKIE exists (not on Linux), and refuses it here the same way", EXIT_BAD_FLAG)),
    option("ext_path", Mapped("--segment file:PATH,size=SIZE, repeatable (a bucket after the size is noted and ignored)")),
    option("ext_page_size", Noted(NO_EXTSTORE_TUNING)),
    option("ext_wbuf_size", Noted(NO_EXTSTORE_TUNING)),
    option("ext_threads", Noted(NO_EXTSTORE_TUNING)),
    option("ext_io_depth", Noted(NO_EXTSTORE_TUNING)),
    option("ext_item_size", Noted("values above --ram-head (256 KiB) keep their head in RAM and the rest in a segment")),
    option("ext_item_age", Noted(NO_EXTSTORE_TUNING)),
    option("ext_low_ttl", Noted(NO_EXTSTORE_TUNING)),
    option("ext_recache_rate", Noted(NO_EXTSTORE_TUNING)),
    option("ext_compact_under", Noted(NO_EXTSTORE_TUNING)),
    option("ext_drop_under", Noted("a full segment refuses a large value (--segment-eviction none), or evicts large values least recently used first with --segment-eviction lru")),
    option("ext_max_sleep", Noted(NO_EXTSTORE_TUNING)),
    option("ext_max_frag", Noted(NO_EXTSTORE_TUNING)),
    option("ext_drop_unread", Noted(NO_EXTSTORE_TUNING)),
];

/// A memcached command line that cannot be served: the sentence and the exit status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub message: String,
    pub exit_status: i32,
}

impl Refusal {
    fn bad(message: impl Into<String>) -> Refusal {
        Refusal {
            message: message.into(),
            exit_status: EXIT_BAD_FLAG,
        }
    }

    fn unsupported(message: impl Into<String>) -> Refusal {
        Refusal {
            message: message.into(),
            exit_status: EXIT_UNSUPPORTED,
        }
    }

    /// A clash with a Headroom rule: Headroom's configuration error status.
    fn config(message: impl Into<String>) -> Refusal {
        Refusal {
            message: message.into(),
            exit_status: super::CONFIG_ERROR_EXIT,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A memcached command line read as Headroom's flags.
#[derive(Debug)]
pub struct Translation {
    pub cli: Cli,
    /// One INFO line per flag accepted without a Headroom meaning, and per default that
    /// differs from Headroom's own, in the order read.
    pub notices: Vec<String>,
}

/// What the command line asks.
#[derive(Debug)]
pub enum CommandLine {
    /// Headroom's own flags.
    Headroom(Box<Cli>),
    /// memcached's flags (and Headroom's long ones beside them).
    Memcached(Box<Translation>),
    /// Print this on stdout and exit 0 (`-h`, `-V`, `-i`).
    Print(String),
}

/// Reads the process's arguments (`args[0]` is the program): memcached's flags when the line
/// holds one of their short forms, `--memcached-args` or `--memcached-conf`; Headroom's
/// otherwise (clap then prints its own errors and exits).
pub fn read(args: Vec<OsString>) -> Result<CommandLine, Refusal> {
    let words: Vec<String> = match args
        .iter()
        .skip(1)
        .map(|a| a.clone().into_string())
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(words) => words,
        // Not UTF-8: only Headroom's own flags (paths) can be that; clap reads them.
        Err(_) => return Ok(CommandLine::Headroom(Box::new(Cli::parse_from(args)))),
    };
    if !is_memcached_line(&words) {
        return Ok(CommandLine::Headroom(Box::new(Cli::parse_from(args))));
    }
    let mut line = Line::default();
    // The file's flags come before the command line's, wherever --memcached-conf stands.
    let mut from_file = Vec::new();
    let mut given = Vec::with_capacity(words.len());
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        if word == "--memcached-args" {
            continue;
        }
        let conf = if word == "--memcached-conf" {
            Some(words.next().ok_or_else(|| {
                Refusal::config("--memcached-conf needs a FILE (memcached.conf's format)")
            })?)
        } else {
            word.strip_prefix("--memcached-conf=").map(str::to_string)
        };
        match conf {
            Some(path) => from_file.extend(line.conf_words(&PathBuf::from(path))?),
            None => given.push(word),
        }
    }
    from_file.extend(given);
    line.read_words(from_file)
}

/// Whether the words hold one of memcached's short flags (`-m`, `-vv`, `-p11211`), or ask for
/// this reading outright.
fn is_memcached_line(words: &[String]) -> bool {
    words.iter().any(|w| {
        w == "--memcached-args"
            || w == "--memcached-conf"
            || w.starts_with("--memcached-conf=")
            || w.strip_prefix('-').is_some_and(|rest| {
                // `-h` and `-V` alone mean the same in both: left to Headroom's reading.
                let first = rest.chars().next();
                !rest.starts_with('-')
                    && first.is_some_and(|c| find_short(c).is_some())
                    && rest != "h"
                    && rest != "V"
            })
    })
}

fn find_short(letter: char) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.short == letter)
}

fn find_long(name: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.long == Some(name))
}

/// What the memcached flags asked, before it becomes Headroom's flags.
#[derive(Default, Debug)]
struct Line {
    port: Option<u16>,
    listen: Vec<String>,
    unix_socket: Option<String>,
    verbosity: u32,
    tls: bool,
    ssl_cert: Option<String>,
    ssl_key: Option<String>,
    ssl_ca: Option<String>,
    ssl_verify_mode: Option<u32>,
    ssl_min_version: Option<u32>,
    ssl_session_cache: bool,
    ssl_wbuf_kib: Option<u32>,
    sasl: bool,
    ext_paths: Vec<String>,
    /// Headroom's flags, each with its value: from memcached's, and the long ones given
    /// beside them, in the order read.
    headroom: Vec<(String, Option<String>)>,
    notices: Vec<String>,
    print: Option<String>,
}

impl Line {
    /// A memcached.conf file's words: one flag (and its value) a line, `#` to the end of a
    /// line a comment (`\#` is kept), `logfile FILE` as --log-file; `-d` and `-h` are skipped,
    /// as Debian's systemd wrapper skips them (a service runs in the foreground).
    fn conf_words(&mut self, path: &std::path::Path) -> Result<Vec<String>, Refusal> {
        let text = std::fs::read_to_string(path).map_err(|err| {
            Refusal::config(format!("--memcached-conf {}: {err}", path.display()))
        })?;
        let mut words = Vec::new();
        for (number, raw) in text.lines().enumerate() {
            let line = strip_comment(raw);
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let at = format!("--memcached-conf {} line {}", path.display(), number + 1);
            if line.starts_with("-d") || line.starts_with("-h") {
                self.notices.push(format!(
                    "{at}: '{line}' skipped, as Debian's systemd wrapper skips it: the server \
                     stays in the foreground for its service manager"
                ));
                continue;
            }
            let mut parts = line.split_whitespace().map(unquote);
            if !line.starts_with('-') {
                let directive = parts.next().unwrap_or_default();
                match (directive.as_str(), parts.next()) {
                    ("logfile", Some(file)) => {
                        words.push("--log-file".to_string());
                        words.push(file);
                    }
                    _ => self.notices.push(format!(
                        "{at}: '{line}' ignored: not a flag, and not a directive Debian's \
                         scripts read (logfile)"
                    )),
                }
                continue;
            }
            words.extend(parts);
        }
        Ok(words)
    }

    /// Reads memcached's flags (getopt's rules: clustered short flags, a value attached or in
    /// the next word, `--long=value` or `--long value`); Headroom's long flags pass through.
    fn read_words(mut self, words: Vec<String>) -> Result<CommandLine, Refusal> {
        let mut words = words.into_iter();
        while let Some(word) = words.next() {
            if let Some(long) = word.strip_prefix("--") {
                let (name, attached) = match long.split_once('=') {
                    Some((name, value)) => (name, Some(value.to_string())),
                    None => (long, None),
                };
                match find_long(name) {
                    Some(flag) => {
                        let value =
                            match (flag.value, attached) {
                                (Value::None, Some(_)) => {
                                    return Err(Refusal::bad(format!(
                                        "--{name} takes no value (memcached's -{})",
                                        flag.short
                                    )))
                                }
                                (Value::Required, None) => Some(words.next().ok_or_else(|| {
                                    Refusal::bad(format!("--{name} needs a value"))
                                })?),
                                (_, attached) => attached,
                            };
                        self.apply(flag, value)?;
                    }
                    None => {
                        // Headroom's own flag, with its value when it takes one.
                        let takes_value = Cli::command()
                            .get_arguments()
                            .find(|a| a.get_long() == Some(name))
                            .is_some_and(|a| a.get_action().takes_values());
                        let value = match (takes_value, attached) {
                            (true, None) => words.next(),
                            (_, attached) => attached,
                        };
                        self.put(&format!("--{name}"), value);
                    }
                }
                continue;
            }
            let Some(cluster) = word.strip_prefix('-').filter(|c| !c.is_empty()) else {
                return Err(Refusal::bad(format!(
                    "'{word}' is not a flag: memcached's command line takes flags only"
                )));
            };
            for (at, letter) in cluster.char_indices() {
                let Some(flag) = find_short(letter) else {
                    return Err(Refusal::bad(format!(
                        "illegal argument '-{letter}': not a flag of memcached 1.6.45 (docs/operations.md lists them)"
                    )));
                };
                if flag.value == Value::Required {
                    let attached = &cluster[at + letter.len_utf8()..];
                    let value = match attached.is_empty() {
                        true => words
                            .next()
                            .ok_or_else(|| Refusal::bad(format!("-{letter} needs a value")))?,
                        false => attached.to_string(),
                    };
                    self.apply(flag, Some(value))?;
                    break;
                }
                self.apply(flag, None)?;
            }
        }
        if let Some(text) = self.print.take() {
            return Ok(CommandLine::Print(text));
        }
        self.finish()
    }

    /// One flag: its Headroom flags as words, its note, or its refusal.
    fn apply(&mut self, flag: &Flag, value: Option<String>) -> Result<(), Refusal> {
        let value = value.map(|v| v.trim_start().to_string());
        let text = value.clone().unwrap_or_default();
        let shown = match &value {
            Some(v) => format!("-{} {v}", flag.short),
            None => format!("-{}", flag.short),
        };
        match flag.meaning {
            Meaning::Refused(message, exit_status) => {
                return Err(Refusal {
                    message: message.to_string(),
                    exit_status,
                })
            }
            Meaning::Noted(note) => {
                self.notices.push(format!("memcached's {shown}: {note}"));
                return Ok(());
            }
            Meaning::Mapped(_) => {}
        }
        match flag.short {
            'p' => self.port = Some(parse_port(&text, "-p")?),
            'U' => {
                if parse_port(&text, "-U")? != 0 {
                    return Err(Refusal::unsupported(format!(
                        "-U {text}: Headroom has no UDP; leave -U out or give -U 0 (memcached's default: off)"
                    )));
                }
            }
            's' => self.unix_socket = Some(text),
            'a' => self.push("--unix-socket-mode", &text),
            'A' => self.push("--shutdown-command", "on"),
            'l' => self
                .listen
                .extend(text.split(',').map(str::trim).map(str::to_string)),
            'd' => self.put("--daemon", None),
            'u' => self.push("--user", &text),
            'm' => {
                let mib: u64 = text.parse().ok().filter(|&m| m > 0).ok_or_else(|| {
                    Refusal::unsupported(format!("-m {text}: must be a whole number of megabytes, at least 1"))
                })?;
                self.push("--memory", &format!("{mib}M"));
            }
            'M' => self.push("--evictions", "off"),
            'c' => {
                let count: usize = text.parse().ok().filter(|&c| c > 0).ok_or_else(|| {
                    Refusal::bad(format!("-c {text}: maximum connections must be greater than 0"))
                })?;
                self.push("--max-connections", &count.to_string());
            }
            'v' => self.verbosity += 1,
            'h' => self.print = Some(help_text()),
            'i' => self.print = Some(license_text()),
            'V' => self.print = Some(format!("headroom {}\n", super::VERSION)),
            'P' => self.push("--pid-file", &text),
            't' => {
                let threads: usize = text.parse().ok().filter(|&t| t > 0).ok_or_else(|| {
                    Refusal::bad(format!("-t {text}: the number of threads must be greater than 0"))
                })?;
                self.push("--threads", &threads.to_string());
            }
            'B' => match text.as_str() {
                "auto" => {}
                "ascii" | "binary" => self.notices.push(format!(
                    "memcached's -B {text}: every port negotiates text, meta and binary per connection, so {text} clients are served as they are"
                )),
                _ => {
                    return Err(Refusal::unsupported(format!(
                        "-B {text}: the binding protocol must be one of auto, binary, or ascii"
                    )))
                }
            },
            'I' => {
                let bytes = item_size(&text)?;
                self.push("--max-item-size", &bytes.to_string());
            }
            'S' => self.sasl = true,
            'F' => self.push("--flush-all-command", "off"),
            'X' => self.push("--dump-commands", "off"),
            'W' => self.push("--watch-command", "off"),
            'e' => {
                self.push("--warm-restart", "on");
                self.notices.push(format!(
                    "memcached's -e {text}: warm restart is on; a graceful stop (SIGTERM, SIGINT or SIGUSR1) writes the items to the data directory's snapshot, not to {text}"
                ));
            }
            'o' => {
                for part in text.split(',').filter(|p| !p.is_empty()) {
                    self.apply_option(part)?;
                }
            }
            'Z' => self.tls = true,
            other => unreachable!("-{other} is mapped in FLAGS but not here"),
        }
        Ok(())
    }

    /// One `-o` option, `name` or `name=value`.
    fn apply_option(&mut self, part: &str) -> Result<(), Refusal> {
        let (name, value) = match part.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (part, None),
        };
        let Some(option) = OPTIONS.iter().find(|o| o.name == name) else {
            return Err(Refusal::bad(format!(
                "illegal suboption '-o {part}': not an option of memcached 1.6.45 (docs/operations.md lists them)"
            )));
        };
        match option.meaning {
            Meaning::Refused(message, exit_status) => {
                return Err(Refusal {
                    message: message.to_string(),
                    exit_status,
                })
            }
            Meaning::Noted(note) => {
                self.notices.push(format!("memcached's -o {part}: {note}"));
                return Ok(());
            }
            Meaning::Mapped(_) => {}
        }
        let needs = |what: &str| {
            value
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .ok_or_else(|| Refusal::bad(format!("-o {name} needs {what}")))
        };
        let number = |what: &str| -> Result<u32, Refusal> {
            needs(what)?
                .parse()
                .map_err(|_| Refusal::bad(format!("-o {part}: could not parse {what}")))
        };
        match name {
            "lru_crawler" => self.push("--lru-crawler", "on"),
            "no_lru_crawler" => self.push("--lru-crawler", "off"),
            "idle_timeout" => {
                let seconds = number("a number of seconds")?;
                self.push("--idle-timeout", &seconds.to_string());
            }
            "ssl_chain_cert" => self.ssl_cert = Some(needs("a certificate chain file")?),
            "ssl_key" => self.ssl_key = Some(needs("a private key file")?),
            "ssl_ca_cert" => self.ssl_ca = Some(needs("a CA certificate file")?),
            "ssl_verify_mode" => {
                let mode = number("a verify mode (0 to 3)")?;
                if mode > 3 {
                    return Err(Refusal::bad(format!(
                        "-o {part}: invalid ssl_verify_mode (0: none, 1: request, 2: require, 3: once)"
                    )));
                }
                self.ssl_verify_mode = Some(mode);
            }
            "ssl_keyformat" => {
                if number("a key format")? != 1 {
                    return Err(Refusal::unsupported(format!(
                        "-o {part}: Headroom reads keys as PEM only (ssl_keyformat=1)"
                    )));
                }
            }
            "ssl_min_version" => {
                let version = number("a version (0 to 3)")?;
                if version > 3 {
                    return Err(Refusal::bad(format!(
                        "-o {part}: invalid ssl_min_version (0: TLS 1.0 to 3: TLS 1.3)"
                    )));
                }
                self.ssl_min_version = Some(version);
            }
            "ssl_session_cache" => self.ssl_session_cache = true,
            "ssl_wbuf_size" => self.ssl_wbuf_kib = Some(number("a size in kilobytes")?),
            "ext_path" => self.ext_paths.push(needs("FILE:SIZE")?),
            other => unreachable!("-o {other} is mapped in OPTIONS but not here"),
        }
        Ok(())
    }

    fn push(&mut self, flag: &str, value: &str) {
        self.put(flag, Some(value.to_string()));
    }

    /// Sets a Headroom flag. A later setting replaces an earlier one (as memcached takes the
    /// last `-m`, and the command line's flags come after a conf file's), except for the
    /// repeatable flags, which gather.
    fn put(&mut self, flag: &str, value: Option<String>) {
        let repeatable = Cli::command()
            .get_arguments()
            .find(|a| a.get_long() == flag.strip_prefix("--"))
            .is_some_and(|a| matches!(a.get_action(), clap::ArgAction::Append));
        if !repeatable {
            self.headroom.retain(|(given, _)| given != flag);
        }
        self.headroom.push((flag.to_string(), value));
    }

    fn given(&self, flag: &str) -> bool {
        self.headroom.iter().any(|(given, _)| given == flag)
    }

    /// Headroom's flags from what was read, memcached's defaults where they differ.
    fn finish(mut self) -> Result<CommandLine, Refusal> {
        // Where the line leaves a setting out, memcached's default. (`--listen` is memcached's
        // `-l` on this path, so only -l, -p and -s say where to serve.)
        let port = self.port.unwrap_or(MEMCACHED_PORT);
        if let Some(path) = self.unix_socket.clone() {
            self.push("--unix-socket", &path);
            self.push("--listen", "none");
            self.notices.push(format!(
                "memcached's -s {path}: TCP is off, as memcached does with -s; only the unix socket is served"
            ));
        } else if self.listen.is_empty() {
            let all = match ipv6_available() {
                true => format!("[::]:{port}"),
                false => format!("0.0.0.0:{port}"),
            };
            self.notices.push(format!(
                "no -l: listening on every address ({all}), as memcached does; give -l 127.0.0.1 to serve this host only"
            ));
            self.push("--listen", &all);
        } else {
            for text in std::mem::take(&mut self.listen) {
                let addr = listen_address(&text, port, self.tls)?;
                self.push("--listen", &addr);
            }
        }
        if !self.given("--log-level") {
            let level = match self.verbosity {
                0 | 1 => "info",
                2 => "debug",
                _ => "trace",
            };
            self.push("--log-level", level);
        }
        if !self.given("--max-item-size") {
            self.push("--max-item-size", MEMCACHED_ITEM_SIZE_MAX);
        }
        if !self.given("--warm-restart") {
            self.push("--warm-restart", "off");
        }
        if !self.given("--threads") {
            self.push("--threads", &MEMCACHED_THREADS.to_string());
        }
        self.finish_tls()?;
        if self.sasl && !self.given("--sasl-password-file") {
            match std::env::var_os("MEMCACHED_SASL_PWDB") {
                Some(path) if !path.is_empty() => {
                    self.push("--sasl-password-file", &path.to_string_lossy());
                }
                _ => {
                    return Err(Refusal::unsupported(
                        "-S: name the password file (user:password lines) in $MEMCACHED_SASL_PWDB, as memcached's own password database takes it, or with --sasl-password-file; Headroom has no Cyrus SASL",
                    ))
                }
            }
        }
        for ext in std::mem::take(&mut self.ext_paths) {
            let spec = ext_path_segment(&ext, &mut self.notices)?;
            self.push("--segment", &spec);
        }
        if !self.given("--data-dir")
            && std::env::var_os(super::STATE_DIRECTORY_ENV).is_none()
            && nix::unistd::geteuid().is_root()
        {
            self.push("--data-dir", ROOT_DATA_DIR);
            self.notices.push(format!(
                "data directory {ROOT_DATA_DIR} (started as root with no --data-dir): it holds the lock, the default segment for values above --ram-head, and the warm-restart snapshot"
            ));
        }
        let words: Vec<String> = self
            .headroom
            .iter()
            .flat_map(|(flag, value)| std::iter::once(flag.clone()).chain(value.clone()))
            .collect();
        let argv = std::iter::once("headroom".to_string()).chain(words.iter().cloned());
        let mut cli = Cli::try_parse_from(argv).map_err(|err| {
            let text = err.to_string();
            let first = text
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ");
            Refusal::config(format!(
                "{first} (memcached's flags read as: {})",
                words.join(" ")
            ))
        })?;
        cli.from_memcached = true;
        Ok(CommandLine::Memcached(Box::new(Translation {
            cli,
            notices: self.notices,
        })))
    }

    /// `-Z` and the `ssl_*` options as --tls-*.
    fn finish_tls(&mut self) -> Result<(), Refusal> {
        let named = self.ssl_cert.is_some()
            || self.ssl_key.is_some()
            || self.ssl_ca.is_some()
            || self.ssl_verify_mode.is_some()
            || self.ssl_min_version.is_some()
            || self.ssl_session_cache
            || self.ssl_wbuf_kib.is_some();
        if !self.tls {
            if named {
                self.notices.push(
                    "memcached's ssl_* options without -Z: TLS is off, as memcached leaves it"
                        .to_string(),
                );
            }
            return Ok(());
        }
        let (Some(cert), Some(key)) = (self.ssl_cert.clone(), self.ssl_key.clone()) else {
            return Err(Refusal::unsupported(
                "-Z needs -o ssl_chain_cert=FILE,ssl_key=FILE (the certificate chain and its private key, PEM)",
            ));
        };
        self.push("--tls-cert", &cert);
        self.push("--tls-key", &key);
        match (self.ssl_verify_mode.unwrap_or(0), self.ssl_ca.clone()) {
            // The CA still checks the clients of -l's mtls: addresses.
            (0, Some(ca)) => {
                self.push("--tls-ca", &ca);
                self.push("--tls-client-cert", "none");
            }
            (0, None) => {}
            (mode, None) => {
                return Err(Refusal::unsupported(format!(
                    "-o ssl_verify_mode={mode} needs ssl_ca_cert=FILE: the CA client certificates are checked against"
                )))
            }
            (mode, Some(ca)) => {
                self.push("--tls-ca", &ca);
                let wanted = if mode == 1 { "optional" } else { "required" };
                self.push("--tls-client-cert", wanted);
            }
        }
        let resumption = if self.ssl_session_cache { "on" } else { "off" };
        self.push("--tls-session-resumption", resumption);
        let wbuf_kib = self.ssl_wbuf_kib.unwrap_or(MEMCACHED_SSL_WBUF_KIB);
        self.push("--tls-write-buffer", &format!("{wbuf_kib}K"));
        match self.ssl_min_version {
            Some(3) => self.push("--tls-min-version", "1.3"),
            Some(version) => self.notices.push(format!(
                "memcached's ssl_min_version={version}: TLS 1.2 and 1.3 are served; 1.0 and 1.1 never are"
            )),
            None => {}
        }
        Ok(())
    }
}

/// A conf line without its comment: `#` to the end, unless escaped as `\#`.
fn strip_comment(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'#') => out.push(chars.next().unwrap_or('#')),
            '#' => break,
            c => out.push(c),
        }
    }
    out
}

/// A word without the quotes around it (the wrapper passes the file's words through a shell).
fn unquote(word: &str) -> String {
    let quoted = |q: char| word.len() >= 2 && word.starts_with(q) && word.ends_with(q);
    match quoted('"') || quoted('\'') {
        true => word[1..word.len() - 1].to_string(),
        false => word.to_string(),
    }
}

fn parse_port(text: &str, flag: &str) -> Result<u16, Refusal> {
    text.parse()
        .map_err(|_| Refusal::bad(format!("{flag} {text}: not a port number (0 to 65535)")))
}

/// `-l`'s address as `--listen` takes it: `host`, `host:port`, `[v6]`, `[v6]:port`, or a
/// bare IPv6 address, made `HOST:PORT`; memcached's `notls:`, `btls:` and `mtls:` (valid with
/// `-Z`, `tls` true) as `plain:`, `tls:` and `mtls:`; its `proto[...]:` and `tag[...]:`
/// prefixes read and noted.
fn listen_address(text: &str, port: u16, tls: bool) -> Result<String, Refusal> {
    let mut rest = text;
    let mut tls_prefix = "";
    for (memcached, headroom) in [("notls:", "plain:"), ("btls:", "tls:"), ("mtls:", "mtls:")] {
        if let Some(after) = rest.strip_prefix(memcached) {
            if !tls {
                // memcached's sentence (whose `mtls` one misspells it 'otls').
                let name = memcached.trim_end_matches(':');
                return Err(Refusal::bad(format!(
                    "-l {text}: '{name}' option is valid only when SSL is enabled"
                )));
            }
            tls_prefix = headroom;
            rest = after;
            break;
        }
    }
    loop {
        if let Some(after) = rest.strip_prefix("proto[") {
            let (proto, tail) = after.split_once("]:").ok_or_else(|| {
                Refusal::bad(format!("-l {text}: proto[...] must be followed by ':'"))
            })?;
            if !matches!(proto, "auto" | "ascii" | "binary" | "negotiate") {
                return Err(Refusal::unsupported(format!(
                    "-l {text}: proto[{proto}] is not served here (every port negotiates text, meta and binary; there is no proxy)"
                )));
            }
            rest = tail;
        } else if let Some(after) = rest.strip_prefix("tag[") {
            let (_, tail) = after.split_once("]:").ok_or_else(|| {
                Refusal::bad(format!("-l {text}: tag[...] must be followed by ':'"))
            })?;
            rest = tail;
        } else {
            break;
        }
    }
    if rest.is_empty() {
        return Err(Refusal::bad(format!("-l {text}: names no address")));
    }
    let address = if rest.starts_with('[') {
        match rest.rsplit_once("]:") {
            Some(_) => rest.to_string(),
            None => format!("{rest}:{port}"),
        }
    } else if rest.matches(':').count() > 1 {
        // A bare IPv6 address: memcached takes it with -p's port.
        format!("[{rest}]:{port}")
    } else if rest.contains(':') {
        rest.to_string()
    } else {
        format!("{rest}:{port}")
    };
    Ok(format!("{tls_prefix}{address}"))
}

/// `-I`: bytes, or with memcached's `k`/`m` suffix (either case).
fn item_size(text: &str) -> Result<u64, Refusal> {
    let refuse = || {
        Refusal::unsupported(format!(
            "-I {text}: the item size limit must be a number of bytes, or of k or m, from 1k"
        ))
    };
    let (digits, multiplier) = match text.chars().last() {
        Some('k' | 'K') => (&text[..text.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&text[..text.len() - 1], 1 << 20),
        _ => (text, 1),
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(refuse)?;
    if bytes < 1024 {
        return Err(Refusal::unsupported(format!(
            "-I {text}: item max size cannot be less than 1024 bytes"
        )));
    }
    Ok(bytes)
}

/// `ext_path=FILE:SIZE[:BUCKET]` as `--segment file:FILE,size=SIZE`.
fn ext_path_segment(ext: &str, notices: &mut Vec<String>) -> Result<String, Refusal> {
    let mut parts = ext.split(':');
    let file = parts.next().unwrap_or_default();
    let size = parts.next().ok_or_else(|| {
        Refusal::bad(format!(
            "-o ext_path={ext}: must supply size to ext_path, ie: ext_path=/f/e:64m (m|g|t|p supported)"
        ))
    })?;
    if let Some(bucket) = parts.next() {
        notices.push(format!(
            "memcached's ext_path bucket '{bucket}' for {file}: every segment takes every large value"
        ));
    }
    let (digits, unit) = size.split_at(size.len().saturating_sub(1));
    let unit = match unit.to_ascii_lowercase().as_str() {
        "m" => "M",
        "g" => "G",
        "t" => "T",
        "p" => "P",
        _ => {
            return Err(Refusal::bad(format!(
                "-o ext_path={ext}: must supply size to ext_path, ie: ext_path=/f/e:64m (m|g|t|p supported)"
            )))
        }
    };
    if file.is_empty() || file.contains(',') || digits.parse::<u64>().is_err() {
        return Err(Refusal::bad(format!(
            "-o ext_path={ext}: needs a file path (without commas) and a whole size"
        )));
    }
    Ok(format!("file:{file},size={digits}{unit}"))
}

/// Whether this host can listen on IPv6 (it may be disabled at boot).
fn ipv6_available() -> bool {
    std::net::TcpListener::bind("[::]:0").is_ok()
}

/// `-h` on this path: the table as text, and where Headroom's own flags are.
fn help_text() -> String {
    let mut out = format!(
        "headroom {}: memcached 1.6.45's flags, and what each does here (`headroom --help` lists Headroom's own):\n",
        super::VERSION
    );
    for flag in FLAGS {
        let name = match flag.long {
            Some(long) => format!("-{}, --{long}", flag.short),
            None => format!("-{}", flag.short),
        };
        out.push_str(&format!("  {name:<28} {}\n", meaning_text(flag.meaning)));
    }
    for option in OPTIONS {
        let name = format!("-o {}", option.name);
        out.push_str(&format!("  {name:<28} {}\n", meaning_text(option.meaning)));
    }
    out
}

fn license_text() -> String {
    format!(
        "headroom {} is licensed under the Apache License, Version 2.0 (the LICENSE file of its source; https://www.apache.org/licenses/LICENSE-2.0)\n",
        super::VERSION
    )
}

/// A meaning as the table and `-h` say it.
pub fn meaning_text(meaning: Meaning) -> String {
    match meaning {
        Meaning::Mapped(text) => text.to_string(),
        Meaning::Noted(text) => format!("accepted, noted in the log: {text}"),
        Meaning::Refused(text, status) => format!("refused (exit status {status}): {text}"),
    }
}

/// The "Coming from memcached" table of docs/operations.md.
pub fn markdown_table() -> String {
    let mut out = String::from("| memcached | Headroom |\n| --- | --- |\n");
    for flag in FLAGS {
        let name = match flag.long {
            Some(long) => format!("`-{}`, `--{long}`", flag.short),
            None => format!("`-{}`", flag.short),
        };
        out.push_str(&format!("| {name} | {} |\n", meaning_text(flag.meaning)));
    }
    for option in OPTIONS {
        out.push_str(&format!(
            "| `-o {}` | {} |\n",
            option.name,
            meaning_text(option.meaning)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn a_line_is_memcached_by_its_short_flags() {
        assert!(is_memcached_line(&words("-m 64 -p 11211")));
        assert!(is_memcached_line(&words("-vv")));
        assert!(is_memcached_line(&words("--memory 64M -c 10")));
        assert!(is_memcached_line(&words("--memcached-args --port=1")));
        assert!(!is_memcached_line(&words(
            "--memory 64M --listen 127.0.0.1:0"
        )));
        assert!(!is_memcached_line(&words("-h")));
        assert!(!is_memcached_line(&words("-V")));
    }

    #[test]
    fn every_flag_and_option_is_listed_once() {
        for (i, flag) in FLAGS.iter().enumerate() {
            assert!(
                FLAGS[i + 1..].iter().all(|f| f.short != flag.short),
                "-{}",
                flag.short
            );
        }
        for (i, option) in OPTIONS.iter().enumerate() {
            assert!(
                OPTIONS[i + 1..].iter().all(|o| o.name != option.name),
                "{}",
                option.name
            );
        }
    }

    #[test]
    fn listen_addresses_take_the_port_of_p() {
        let plain = |text| listen_address(text, 7, false);
        assert_eq!(
            listen_address("127.0.0.1", 1, false).unwrap(),
            "127.0.0.1:1"
        );
        assert_eq!(
            listen_address("127.0.0.1:5", 1, false).unwrap(),
            "127.0.0.1:5"
        );
        assert_eq!(plain("::1").unwrap(), "[::1]:7");
        assert_eq!(plain("[::1]").unwrap(), "[::1]:7");
        assert_eq!(plain("[::1]:8").unwrap(), "[::1]:8");
        assert_eq!(
            plain("proto[ascii]:tag[x]:10.0.0.1:9").unwrap(),
            "10.0.0.1:9"
        );
        assert_eq!(
            plain("proto[proxy]:10.0.0.1").unwrap_err().exit_status,
            EXIT_UNSUPPORTED
        );
    }

    #[test]
    fn listen_tls_prefixes_become_headroom_s() {
        let tls = |text| listen_address(text, 7, true);
        assert_eq!(tls("notls:127.0.0.1:5").unwrap(), "plain:127.0.0.1:5");
        assert_eq!(tls("btls:127.0.0.1").unwrap(), "tls:127.0.0.1:7");
        assert_eq!(tls("mtls:proto[ascii]:tag[t]:::1").unwrap(), "mtls:[::1]:7");
        assert_eq!(tls("127.0.0.1").unwrap(), "127.0.0.1:7");
        // Without -Z, as memcached: a prefix that says which TLS needs TLS.
        let refused = listen_address("notls:127.0.0.1", 7, false).unwrap_err();
        assert_eq!(refused.exit_status, EXIT_BAD_FLAG);
        assert!(refused
            .message
            .contains("'notls' option is valid only when SSL is enabled"));
    }

    #[test]
    fn item_sizes_read_as_memcached_reads_them() {
        assert_eq!(item_size("1m").unwrap(), 1 << 20);
        assert_eq!(item_size("512K").unwrap(), 512 << 10);
        assert_eq!(item_size("2048").unwrap(), 2048);
        assert_eq!(item_size("1000").unwrap_err().exit_status, EXIT_UNSUPPORTED);
        assert!(item_size("m").is_err());
    }

    #[test]
    fn conf_comments_end_at_hash_unless_escaped() {
        assert_eq!(strip_comment("-m 64 # memory"), "-m 64 ");
        assert_eq!(strip_comment(r"-P /tmp/a\#b"), "-P /tmp/a#b");
        assert_eq!(strip_comment("# all"), "");
    }

    #[test]
    fn ext_path_becomes_a_file_segment() {
        let mut notices = Vec::new();
        assert_eq!(
            ext_path_segment("/mnt/f:64G", &mut notices).unwrap(),
            "file:/mnt/f,size=64G"
        );
        assert!(notices.is_empty());
        assert_eq!(
            ext_path_segment("/mnt/f:1g:compact", &mut notices).unwrap(),
            "file:/mnt/f,size=1G"
        );
        assert_eq!(notices.len(), 1);
        assert!(ext_path_segment("/mnt/f", &mut notices).is_err());
        assert!(ext_path_segment("/mnt/f:64k", &mut notices).is_err());
    }
}
