//! Real text-protocol clients against the real server: pymemcache used as an application uses
//! it (values from 0 B to the item limit, every storage, counter and housekeeping command, meta
//! commands on the same connection, text and binary sharing one store), and twemproxy
//! (nutcracker) spreading keys over two servers with consistent hashing; meta-memcache's
//! compare-and-swap over the meta protocol.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{fresh_data_dir, Server};

/// `--max-item-size` of the application test: the script stores a value of exactly this size
/// and is refused one byte more.
const MAX_ITEM: u64 = 8 << 20;

/// pymemcache against one server. Values are compared byte for byte in Python; everything else
/// is printed as `name: repr(result)` for the Rust side to compare line by line.
const APP_SCRIPT: &str = r##"
import random, sys
from pymemcache import serde
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheClientError, MemcacheServerError

host, port = sys.argv[1].rsplit(":", 1)
max_item, pid = int(sys.argv[2]), int(sys.argv[3])
server = (host, int(port))
# default_noreply=False: storage commands wait for their reply, so their results are checkable.
c = Client(server, connect_timeout=5, timeout=10, default_noreply=False)
rng = random.Random(7)

def out(name, value):
    print(f"{name}: {value!r}", flush=True)

# Small objects, both sides of the 256 KiB RAM head, streamed values, exactly the item limit.
sizes = [0, 1, 2, 100, 1023, 4096, 65535, 65536, 262143, 262144, 262145, 1 << 20,
         3 * (1 << 20) + 7, max_item]
values = {f"size-{n}": rng.randbytes(n) for n in sizes}
# Data a line-oriented server could mistake for commands.
values["looks-like-protocol"] = b"VALUE k 0 3\r\nEND\r\nset x 0 0 1\r\n\r\n\x00\xff"
values["crlf"] = b"\r\n"
bad = []
for key, value in values.items():
    if c.set(key, value) is not True:
        bad.append(("set", key))
for key, value in values.items():
    got = c.get(key)
    if got != value:
        bad.append(("get", key, None if got is None else len(got)))
out("sizes round-trip (bad)", bad)
small = {k: v for k, v in values.items() if len(v) <= 1 << 20}
out("get_many exact", c.get_many(list(small) + ["never-set"]) == small)
batch = {f"batch-{i}": rng.randbytes(rng.randrange(0, 3000)) for i in range(200)}
out("set_many failed", c.set_many(batch))
out("get_many batch exact", c.get_many(list(batch)) == batch)
tokens = c.gets_many(["batch-0", "batch-1", "never-set"])
out("gets_many", sorted((k, v == batch[k], int(t) > 0) for k, (v, t) in tokens.items()))
try:
    c.set("too-large", b"x" * (max_item + 1))
    out("one byte over the limit", "stored")
except MemcacheServerError:
    out("one byte over the limit", "SERVER_ERROR")
out("too-large absent", c.get("too-large") is None)
out("connection still works", c.get("size-1") == values["size-1"])

out("add new", c.add("a", b"1"))
out("add existing", c.add("a", b"2"))
out("a", c.get("a"))
out("replace missing", c.replace("nope", b"x"))
out("replace existing", c.replace("a", b"3"))
out("append", c.append("a", b"45"))
out("prepend", c.prepend("a", b"12"))
out("a", c.get("a"))
out("append missing", c.append("nope", b"x"))
# A value in a segment grows too: the sum is built in a segment.
streamed = f"size-{3 * (1 << 20) + 7}"
out("append to a streamed value", c.append(streamed, b"tail"))
out("streamed value appended", c.get(streamed) == values[streamed] + b"tail")

value, token = c.gets("a")
out("gets", value)
out("cas stale", c.cas("a", b"x", int(token) + 1))
out("cas current", c.cas("a", b"casd", token))
out("after cas", c.get("a"))
out("cas reused token", c.cas("a", b"y", token))
out("cas missing", c.cas("nope", b"y", token))
out("gets missing", c.gets("nope"))

c.set("n", b"10")
out("incr", c.incr("n", 5))
out("decr below zero", c.decr("n", 20))
out("incr to max", c.incr("n", 2**64 - 1))
out("incr wraps", c.incr("n", 1))
out("incr missing", c.incr("nope", 1))
c.set("word", b"abc")
try:
    c.incr("word", 1)
    out("incr non-numeric", "no error")
except MemcacheClientError:
    out("incr non-numeric", "CLIENT_ERROR")

out("touch", c.touch("a", 100))
out("touch missing", c.touch("nope", 100))
out("delete", c.delete("a"))
out("delete missing", c.delete("a"))
out("get deleted", c.get("a"))
c.set_many({"d1": b"1", "d2": b"2"})
out("delete_many", c.delete_many(["d1", "d2", "never-set"]))
out("deleted many", c.get_many(["d1", "d2"]))

# noreply: nothing comes back (not even NOT_FOUND), so the next reply read is the get's.
c.set("quiet", b"1", noreply=True)
c.delete("never-set", noreply=True)
c.incr("quiet", 1, noreply=True)
out("after noreply", c.get("quiet"))

# Typed values through a serde, as applications store them: the flags must round-trip.
typed = Client(server, connect_timeout=5, timeout=10, default_noreply=False,
               serde=serde.pickle_serde)
objects = {"t-str": "grüße", "t-int": 42, "t-dict": {"k": [1, 2.5, None]}, "t-bytes": b"\x00raw"}
for k, v in objects.items():
    typed.set(k, v)
out("typed round-trip", [k for k, v in objects.items() if typed.get(k) != v])
# Stored over the binary protocol with flags 16 (pymemcache's FLAG_TEXT) by the Rust side.
out("from binary", typed.get("from-binary"))

# Meta commands on the same connection, each batch ended by `mn`.
out("ms", c.raw_command(b"ms meta 5 F9 T0\r\nhello\r\nmn", b"MN\r\n"))
out("mg", c.raw_command(b"mg meta v f s k\r\nmn", b"MN\r\n"))
out("ma", c.raw_command(b"ms cnt 1\r\n7\r\nma cnt D3 v\r\nmn", b"MN\r\n"))
out("md quiet", c.raw_command(b"md meta q\r\nmg meta v\r\nmn", b"MN\r\n"))
out("text get of a meta value", c.get("cnt"))

stats = c.stats()
out("stats pid", stats[b"pid"] == pid)
out("flush_all", c.flush_all())
out("after flush", c.get_many(["size-1", "batch-0", "n", "t-str", "cnt"]))
before = c.stats()[b"curr_items"]
c.set_many({f"post-{i}": b"v" for i in range(10)})
out("curr_items grew by", c.stats()[b"curr_items"] - before)
out("stats settings item_size_max", c.stats("settings")[b"item_size_max"] == max_item)
version = c.version()
out("version as in stats", version == stats[b"version"] == b"1.6.45")
c.close()
typed.close()
print("done")
"##;

/// What [`APP_SCRIPT`] prints against a correct server.
const APP_EXPECTED: &[&str] = &[
    "sizes round-trip (bad): []",
    "get_many exact: True",
    "set_many failed: []",
    "get_many batch exact: True",
    "gets_many: [('batch-0', True, True), ('batch-1', True, True)]",
    "one byte over the limit: 'SERVER_ERROR'",
    "too-large absent: True",
    "connection still works: True",
    "add new: True",
    "add existing: False",
    "a: b'1'",
    "replace missing: False",
    "replace existing: True",
    "append: True",
    "prepend: True",
    "a: b'12345'",
    "append missing: False",
    "append to a streamed value: True",
    "streamed value appended: True",
    "gets: b'12345'",
    "cas stale: False",
    "cas current: True",
    "after cas: b'casd'",
    "cas reused token: False",
    "cas missing: None",
    "gets missing: (None, None)",
    "incr: 15",
    "decr below zero: 0",
    "incr to max: 18446744073709551615",
    "incr wraps: 0",
    "incr missing: None",
    "incr non-numeric: 'CLIENT_ERROR'",
    "touch: True",
    "touch missing: False",
    "delete: True",
    "delete missing: False",
    "get deleted: None",
    "delete_many: True",
    "deleted many: {}",
    "after noreply: b'2'",
    "typed round-trip: []",
    "from binary: 'héllo'",
    "ms: b'HD\\r\\n'",
    "mg: b'VA 5 f9 s5 kmeta\\r\\nhello\\r\\n'",
    "ma: b'HD\\r\\nVA 2\\r\\n10\\r\\n'",
    "md quiet: b'EN\\r\\n'",
    "text get of a meta value: b'10'",
    "stats pid: True",
    "flush_all: True",
    "after flush: {}",
    "curr_items grew by: 10",
    "stats settings item_size_max: True",
    "version as in stats: True",
    "done",
];

/// pymemcache through twemproxy, then straight to each server.
const PROXY_SCRIPT: &str = r##"
import random, sys
from pymemcache.client.base import Client

def client(addr):
    host, port = addr.rsplit(":", 1)
    return Client((host, int(port)), connect_timeout=5, timeout=10, default_noreply=False)

def out(name, value):
    print(f"{name}: {value!r}", flush=True)

proxy = client(sys.argv[1])
servers = [client(a) for a in sys.argv[2:]]
rng = random.Random(11)
values = {f"user:{i}:profile": rng.randbytes(rng.randrange(0, 4000)) for i in range(400)}
# A few values past the 256 KiB RAM head, which the servers stream to segments.
for i in range(4):
    values[f"blob:{i}"] = rng.randbytes(300_000 + i * 700_000)
out("set_many failed", proxy.set_many(values))
# A multi-key get is split by the proxy into one get per server.
out("get_many through the proxy exact", proxy.get_many(list(values)) == values)
out("get each through the proxy exact", all(proxy.get(k) == v for k, v in values.items()))

held = [s.get_many(list(values)) for s in servers]
out("on no server", sorted(k for k in values if not any(k in h for h in held)))
out("on several servers", sorted(k for k in values if sum(k in h for h in held) > 1))
out("direct reads exact", all(h[k] == values[k] for h in held for k in h))
print("per server: " + " ".join(str(len(h)) for h in held), flush=True)

# The other commands twemproxy forwards, each to the key's server.
out("add existing", proxy.add("user:1:profile", b"x"))
out("add new", proxy.add("counter", b"41"))
out("incr", proxy.incr("counter", 1))
out("decr", proxy.decr("counter", 2))
out("append", proxy.append("counter", b"0"))
out("prepend", proxy.prepend("counter", b"1"))
out("replace", proxy.replace("counter", b"7"))
value, token = proxy.gets("counter")
out("cas", proxy.cas("counter", b"8", token))
out("cas stale", proxy.cas("counter", b"9", token))
out("touch", proxy.touch("counter", 600))
out("counter", proxy.get("counter"))
out("counter on one server", sum(s.get("counter") == b"8" for s in servers))
out("delete", proxy.delete("counter"))
out("delete missing", proxy.delete("counter"))
out("deleted everywhere", [s.get("counter") for s in servers])
out("version", proxy.version() == b"1.6.45")
print("done")
"##;

/// What [`PROXY_SCRIPT`] prints, but for the `per server:` line (checked on its own).
const PROXY_EXPECTED: &[&str] = &[
    "set_many failed: []",
    "get_many through the proxy exact: True",
    "get each through the proxy exact: True",
    "on no server: []",
    "on several servers: []",
    "direct reads exact: True",
    "per server: *",
    "add existing: False",
    "add new: True",
    "incr: 42",
    "decr: 40",
    "append: True",
    "prepend: True",
    "replace: True",
    "cas: True",
    "cas stale: False",
    "touch: True",
    "counter: b'8'",
    "counter on one server: 1",
    "delete: True",
    "delete missing: False",
    "deleted everywhere: [None, None]",
    "version: True",
    "done",
];

/// Keys [`PROXY_SCRIPT`] writes.
const PROXY_KEYS: usize = 404;

/// Runs `script` under the venv's Python with `args`; its stdout, or a panic with its
/// traceback.
fn run_python(script: &str, args: &[&str]) -> String {
    run_python_with("pymemcache", script, args)
}

/// [`run_python`] with a Python that imports `module`.
fn run_python_with(module: &str, script: &str, args: &[&str]) -> String {
    let python = common::python_with(module);
    let out = Command::new(&python)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("{}: {err}", python.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the {module} script failed ({}):\n--- stdout\n{stdout}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Compares a transcript with `expected` line by line (`*` after a prefix matches any rest),
/// naming the first difference and showing the whole transcript.
fn assert_transcript(got: &str, expected: &[&str]) {
    let lines: Vec<&str> = got.lines().collect();
    for (i, want) in expected.iter().enumerate() {
        let line = lines.get(i).copied().unwrap_or("<missing>");
        let matches = match want.strip_suffix('*') {
            Some(prefix) => line.starts_with(prefix),
            None => line == *want,
        };
        assert!(
            matches,
            "line {}: got {line:?}, want {want:?}\n--- transcript\n{got}",
            i + 1
        );
    }
    assert_eq!(lines.len(), expected.len(), "extra lines:\n{got}");
}

#[test]
fn pymemcache_as_an_application_uses_it() {
    let server = Server::start(&["--threads", "2", "--max-item-size", "8M"]);
    // The text protocol reads what the binary protocol stored, flags included.
    let mut binary = server.client();
    assert_eq!(
        binary.set(b"from-binary", "héllo".as_bytes(), 16, 0).status,
        0
    );
    let out = run_python(
        APP_SCRIPT,
        &[
            &server.addr.to_string(),
            &MAX_ITEM.to_string(),
            &server.pid().to_string(),
        ],
    );
    assert_transcript(&out, APP_EXPECTED);
    // And the binary protocol reads what the text protocol stored.
    let got = binary.get(b"post-9");
    assert_eq!(
        (got.status, got.flags(), got.value.as_slice()),
        (0, 0, &b"v"[..])
    );
    let data_dir = server.data_dir.clone();
    assert_eq!(server.stop().code(), Some(0));
    let _ = std::fs::remove_dir_all(data_dir);
}

/// The nutcracker binary: on the PATH, or in /usr/sbin (not on a user's PATH on Debian).
fn nutcracker() -> Option<PathBuf> {
    ["nutcracker", "/usr/sbin/nutcracker"]
        .iter()
        .map(PathBuf::from)
        .find(|binary| {
            Command::new(binary)
                .arg("--version")
                .output()
                .is_ok_and(|out| out.status.success())
        })
}

/// A running nutcracker, killed on drop even when the test fails.
struct Proxy {
    child: Child,
    log: PathBuf,
}

impl Proxy {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the proxy accepts connections on `addr`.
    fn wait_listening(&mut self, addr: SocketAddr) {
        let started = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("nutcracker exited ({status}): {}", self.log_text());
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nutcracker never listened on {addr}: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nutcracker_config(listen: SocketAddr, servers: &[SocketAddr]) -> String {
    let mut yaml = format!(
        "headroom:\n  listen: {listen}\n  hash: fnv1a_64\n  distribution: ketama\n  \
         auto_eject_hosts: false\n  servers:\n"
    );
    for server in servers {
        yaml.push_str(&format!("   - {server}:1\n"));
    }
    yaml
}

fn start_nutcracker(
    binary: &Path,
    dir: &Path,
    listen: SocketAddr,
    servers: &[SocketAddr],
) -> Proxy {
    let conf = dir.join("nutcracker.yml");
    std::fs::write(&conf, nutcracker_config(listen, servers)).unwrap();
    let check = Command::new(binary)
        .arg("-t")
        .arg("-c")
        .arg(&conf)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&check.stderr).into_owned()
        + &String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && said.contains("syntax is ok"),
        "nutcracker -t: {said}"
    );
    let log = dir.join("nutcracker.log");
    // Its own stats port on loopback (the default, 22222 on every interface, may be taken).
    let child = Command::new(binary)
        .arg("-c")
        .arg(&conf)
        .args(["-a", "127.0.0.1", "-s", &common::free_port().to_string()])
        .arg("-o")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut proxy = Proxy { child, log };
    proxy.wait_listening(listen);
    proxy
}

#[test]
fn twemproxy_spreads_keys_over_two_servers() {
    let Some(binary) = nutcracker() else {
        assert!(
            std::env::var_os("HEADROOM_REQUIRE_ROOT_TESTS").is_none(),
            "nutcracker (twemproxy) is missing (scripts/install-deps installs it)"
        );
        println!("skipped: nutcracker (twemproxy) is not installed");
        return;
    };
    let servers = [
        Server::start(&["--threads", "2"]),
        Server::start(&["--threads", "2"]),
    ];
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr).collect();
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let listen: SocketAddr = format!("127.0.0.1:{}", common::free_port())
        .parse()
        .unwrap();
    let mut proxy = start_nutcracker(&binary, &dir, listen, &addrs);

    let mut args = vec![listen.to_string()];
    args.extend(addrs.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_python(PROXY_SCRIPT, &args);
    assert_transcript(&out, PROXY_EXPECTED);
    // Every key is on exactly one server (checked in the script); both hold a fair share.
    let per_server: Vec<usize> = out
        .lines()
        .find_map(|line| line.strip_prefix("per server: "))
        .unwrap()
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(per_server.iter().sum::<usize>(), PROXY_KEYS, "{out}");
    for held in &per_server {
        assert!(
            held * 5 >= PROXY_KEYS,
            "ketama left a server with under 20% of the keys: {per_server:?}"
        );
    }
    // The proxy is still up: it met nothing it had to close a connection for.
    assert!(
        proxy.child.try_wait().unwrap().is_none(),
        "nutcracker exited: {}",
        proxy.log_text()
    );
    drop(proxy);
    for server in servers {
        let data_dir = server.data_dir.clone();
        assert_eq!(server.stop().code(), Some(0));
        let _ = std::fs::remove_dir_all(data_dir);
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// meta-memcache (the meta protocol client) as an application uses it: its compare-and-swap
/// reads the CAS token into 32 bits, so a stale write must be refused (it landed when Headroom's
/// CAS values carried the partition number in their top bits), and values of several MiB.
const META_MEMCACHE_SCRIPT: &str = r##"
import sys
from meta_memcache import CacheClient, ServerAddress, Key, connection_pool_factory_builder
port = int(sys.argv[1])
c = CacheClient.cache_client_from_servers(
    servers=[ServerAddress(host="127.0.0.1", port=port)],
    connection_pool_factory_fn=connection_pool_factory_builder(),
)
def out(what, value):
    print(f"{what}: {value}")
k = Key("meta-cas")
out("set", c.set(key=k, value="v1", ttl=100))
value, token = c.get_cas(key=k)
out("get_cas", (value, token is not None))
out("newer write", c.set(key=k, value="v2", ttl=100))
out("stale write", c.set(key=k, value="stale", ttl=100, cas_token=token))
out("value", c.get(key=k))
value, token = c.get_cas(key=k)
out("fresh write", c.set(key=k, value="v3", ttl=100, cas_token=token))
out("value", c.get(key=k))
big = bytes(range(256)) * (3 * 4096 + 7)
out("big set", c.set(key=Key("meta-big"), value=big, ttl=100))
out("big exact", c.get(key=Key("meta-big")) == big)
out("delete", c.delete(key=k))
out("gone", c.get(key=k))
print("done")
"##;

#[test]
fn meta_memcache_compare_and_swap_refuses_a_stale_write() {
    let server = Server::start(&["--threads", "2"]);
    let port = server.addr.port().to_string();
    let got = run_python_with("meta_memcache", META_MEMCACHE_SCRIPT, &[&port]);
    assert_transcript(
        &got,
        &[
            "set: True",
            "get_cas: ('v1', True)",
            "newer write: True",
            "stale write: False",
            "value: v2",
            "fresh write: True",
            "value: v3",
            "big set: True",
            "big exact: True",
            "delete: True",
            "gone: None",
            "done",
        ],
    );
}
