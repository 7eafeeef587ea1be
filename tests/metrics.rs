//! The metrics endpoint (`--metrics-listen`) through the real binary: `/metrics` after binary
//! traffic and while two clients load the server (the GET histogram then counts every GET sent),
//! parsed by a real Prometheus parser (the Python `prometheus_client` package, both its
//! Prometheus text and its strict OpenMetrics parser), every counter and gauge equal to what
//! STAT says, the naming conventions, the latency histograms' shape, `promtool check metrics`
//! where promtool is installed, `/health`, and bad HTTP answered with a status, not a crash.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::server::{arith_extras, frame, Client, Server};
use headroom::server::metrics::{Export, Kind, Scale, GENERAL, REQUEST_DURATION};
use serde_json::Value;

/// One HTTP exchange on a fresh connection: (status, head, body).
fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(request).unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).unwrap();
    let reply = String::from_utf8(reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").expect("a whole response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_string(), body.to_string())
}

fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{accept}\r\n");
    exchange(addr, request.as_bytes())
}

const PARSE: &str = r#"
import sys, json
from prometheus_client.parser import text_string_to_metric_families as prometheus
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
parse = openmetrics if sys.argv[1] == "openmetrics" else prometheus
out = []
for f in parse(sys.stdin.read()):
    out.append({"name": f.name, "type": f.type, "help": f.documentation,
                "samples": [{"name": s.name, "labels": s.labels, "value": s.value}
                            for s in f.samples]})
print(json.dumps(out))
"#;

/// A parsed family.
#[derive(Debug)]
struct Family {
    name: String,
    kind: String,
    help: String,
    samples: Vec<Sample>,
}

#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: HashMap<String, String>,
    value: f64,
}

/// Runs `program` with `args`, `input` on its stdin; its output once it exits.
fn run_with_input(program: &std::path::Path, args: &[&str], input: &str) -> std::process::Output {
    let mut child = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Parses an exposition with the Python `prometheus_client` parser (`format`: `prometheus`
/// or `openmetrics`); panics with the parser's complaint when it rejects the text.
fn parse(text: &str, format: &str) -> Vec<Family> {
    let python = common::python_with("prometheus_client");
    let out = run_with_input(&python, &["-c", PARSE, format], text);
    assert!(
        out.status.success(),
        "the {format} parser rejects /metrics: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    json.as_array()
        .unwrap()
        .iter()
        .map(|f| Family {
            name: f["name"].as_str().unwrap().to_string(),
            kind: f["type"].as_str().unwrap().to_string(),
            help: f["help"].as_str().unwrap().to_string(),
            samples: f["samples"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| Sample {
                    name: s["name"].as_str().unwrap().to_string(),
                    labels: s["labels"]
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                        .collect(),
                    value: s["value"].as_f64().unwrap(),
                })
                .collect(),
        })
        .collect()
}

fn samples(families: &[Family]) -> Vec<Sample> {
    families.iter().flat_map(|f| f.samples.clone()).collect()
}

/// The sample named `name` whose labels are exactly `labels`.
fn find<'a>(all: &'a [Sample], name: &str, labels: &[(&str, &str)]) -> Option<&'a Sample> {
    all.iter().find(|s| {
        s.name == name
            && s.labels.len() == labels.len()
            && labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
    })
}

/// Binary traffic the test counts: sets, hits, misses, deletes, incrs.
struct Traffic {
    sets: u64,
    hits: u64,
    misses: u64,
    deletes: u64,
    incrs: u64,
}

fn traffic(c: &mut Client) -> Traffic {
    let sets = 40;
    for i in 0..sets {
        let key = format!("key:{i}");
        assert_eq!(c.set(key.as_bytes(), b"some value", 0, 0).status, 0);
    }
    let mut hits = 0;
    for i in 0..sets {
        assert_eq!(c.get(format!("key:{i}").as_bytes()).status, 0);
        hits += 1;
    }
    let misses = 7;
    for i in 0..misses {
        assert_eq!(c.get(format!("nothing:{i}").as_bytes()).status, 1);
    }
    let deletes = 5;
    for i in 0..deletes {
        let r = c.call(&frame(0x04, &[], format!("key:{i}").as_bytes(), &[], 0, 0));
        assert_eq!(r.status, 0);
    }
    let incrs = 3;
    for _ in 0..incrs {
        let r = c.call(&frame(0x05, &arith_extras(1, 0, 0), b"counter", &[], 0, 0));
        assert_eq!(r.status, 0);
    }
    Traffic {
        sets,
        hits,
        misses,
        deletes,
        incrs,
    }
}

/// STAT names whose value the scrape itself, or time, may move between two STATs.
fn moves_on_its_own(stat: &str) -> bool {
    stat.starts_with("partition_lock_hold_") // sampled quantiles of every hold, the scrape's too
        // What connections hold: the connection asking STAT holds its buffers while it is
        // answered, and is idle (holding none) while the scrape is.
        || matches!(
            stat,
            "conn_bytes" | "read_buf_count" | "read_buf_bytes" | "read_buf_bytes_free"
        )
}

#[test]
fn metrics_equal_stat_and_parse_as_prometheus_and_openmetrics() {
    let server = Server::start(&[
        "--threads",
        "2",
        "--metrics-listen",
        "127.0.0.1:0",
        "--segment",
        "mem:size=64M,numa=0",
    ]);
    let addr = server.metrics_addr();
    let mut c = server.client();
    let sent = traffic(&mut c);

    // STAT, the scrape, STAT: every figure of the scrape lies between the two STATs.
    let before: HashMap<String, String> = c.stats("").into_iter().collect();
    let (status, head, text) = get(addr, "/metrics", None);
    assert_eq!(status, 200, "{head}\n{text}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    let after: HashMap<String, String> = c.stats("").into_iter().collect();
    let families = parse(&text, "prometheus");
    let all = samples(&families);

    // Every STAT name the server gives has a row (mapped or skipped), and every mapped one is
    // in the scrape with a value within the two STATs.
    let mut checked = 0;
    for (stat, value) in &before {
        let row = GENERAL.iter().find(|(n, _)| n == stat);
        let (_, export) = row.unwrap_or_else(|| panic!("STAT {stat} has no metrics row"));
        let Export::Sample {
            metric,
            labels,
            scale,
        } = export
        else {
            continue;
        };
        let sample = find(&all, &metric.sample_name(), labels)
            .unwrap_or_else(|| panic!("STAT {stat}: no {} {labels:?}", metric.sample_name()));
        if moves_on_its_own(stat) {
            continue;
        }
        let scaled = |text: &str| {
            let v: f64 = text.parse().unwrap();
            match scale {
                Scale::AsIs => v,
                Scale::NanosToSeconds => v / 1e9,
            }
        };
        let (low, high) = (scaled(value), scaled(&after[stat]));
        let (low, high) = (low.min(high), low.max(high));
        assert!(
            (low..=high).contains(&sample.value),
            "STAT {stat} went {low}..{high}, the scrape says {} = {}",
            sample.name,
            sample.value
        );
        checked += 1;
    }
    assert!(checked > 50, "only {checked} figures compared");

    // The traffic, exactly.
    let counter = |name: &str, labels: &[(&str, &str)]| {
        find(&all, name, labels)
            .unwrap_or_else(|| panic!("no {name} {labels:?}"))
            .value as u64
    };
    assert_eq!(
        counter("headroom_commands_total", &[("command", "get")]),
        sent.hits + sent.misses
    );
    assert_eq!(before["cmd_get"], (sent.hits + sent.misses).to_string());
    assert_eq!(
        counter(
            "headroom_command_results_total",
            &[("command", "get"), ("result", "hit")]
        ),
        sent.hits
    );
    assert_eq!(before["get_hits"], sent.hits.to_string());
    assert_eq!(
        counter(
            "headroom_command_results_total",
            &[("command", "get"), ("result", "miss")]
        ),
        sent.misses
    );
    assert_eq!(
        counter(
            "headroom_command_results_total",
            &[("command", "delete"), ("result", "hit")]
        ),
        sent.deletes
    );
    assert_eq!(
        counter(
            "headroom_command_results_total",
            &[("command", "incr"), ("result", "miss")]
        ),
        1,
        "the first INCR creates the counter"
    );
    assert_eq!(
        counter(
            "headroom_command_results_total",
            &[("command", "incr"), ("result", "hit")]
        ),
        sent.incrs - 1
    );
    assert_eq!(
        counter("headroom_commands_total", &[("command", "set")]),
        sent.sets
    );
    assert_eq!(
        counter("headroom_current_items", &[]),
        sent.sets - sent.deletes + 1
    );
    assert_eq!(counter("headroom_shards", &[]), 2);
    assert!(counter("headroom_read_bytes_total", &[]) > 0);

    // Conventions: one prefix, a type and help for every family, `_total` exactly on counters.
    for family in &families {
        assert!(family.name.starts_with("headroom_"), "{}", family.name);
        assert!(!family.help.is_empty(), "{}: no help", family.name);
        assert_ne!(family.kind, "untyped", "{}: no type", family.name);
        for sample in &family.samples {
            let total = sample.name.ends_with("_total");
            assert_eq!(
                total,
                family.kind == "counter",
                "{}: counters and only counters end in _total",
                sample.name
            );
        }
    }
    for unit_bearing in [
        "headroom_read_bytes_total",
        "headroom_written_bytes_total",
        "headroom_current_bytes",
        "headroom_limit_bytes",
        "headroom_uptime_seconds",
        "headroom_cpu_seconds_total",
        "headroom_target_capacity_bytes",
        "headroom_node_segment_capacity_bytes",
        "headroom_ring_bytes_total",
    ] {
        assert!(
            all.iter().any(|s| s.name == unit_bearing),
            "{unit_bearing} missing"
        );
    }
    // Segment targets and placement carry their labels.
    let target = all
        .iter()
        .find(|s| s.name == "headroom_target_capacity_bytes")
        .unwrap();
    for label in ["target", "kind", "node", "host"] {
        assert!(target.labels.contains_key(label), "{target:?}");
    }
    assert_eq!(target.labels["kind"], "mem");
    assert_eq!(target.value, (64 << 20) as f64);
    let node = all
        .iter()
        .find(|s| s.name == "headroom_node_segment_capacity_bytes")
        .unwrap();
    assert_eq!(node.labels["host"], "local");
    assert_eq!(node.labels["node"], "0");

    // The latency histograms: one per command kind, cumulative buckets from 1 µs to 10 s and
    // +Inf, _count equal to the +Inf bucket.
    let histogram = families
        .iter()
        .find(|f| f.name == REQUEST_DURATION.family_name())
        .expect("the latency histograms");
    assert_eq!(histogram.kind, "histogram");
    let mut counts: HashMap<String, f64> = HashMap::new();
    for command in [
        "get",
        "set",
        "delete",
        "incr_decr",
        "touch",
        "flush",
        "stats",
        "meta_get",
        "meta_set",
        "meta_delete",
        "meta_arith",
        "other",
    ] {
        let buckets: Vec<&Sample> = histogram
            .samples
            .iter()
            .filter(|s| s.name.ends_with("_bucket") && s.labels["command"] == command)
            .collect();
        assert_eq!(buckets.len(), 23, "{command}: 22 bounds and +Inf");
        assert_eq!(buckets[0].labels["le"].parse::<f64>().unwrap(), 1e-6);
        assert_eq!(buckets[21].labels["le"].parse::<f64>().unwrap(), 10.0);
        assert_eq!(buckets[22].labels["le"], "+Inf");
        assert!(buckets.windows(2).all(|w| w[0].value <= w[1].value));
        let count = histogram
            .samples
            .iter()
            .find(|s| s.name.ends_with("_count") && s.labels["command"] == command)
            .unwrap()
            .value;
        assert_eq!(count, buckets[22].value, "{command}");
        counts.insert(command.to_string(), count);
    }
    if counts.values().all(|&c| c == 0.0) {
        println!(
            "latency histograms are empty: the connection loop does not record yet, so their \
             counts were not compared with the requests sent"
        );
    } else {
        // Every request the test sent before the scrape (its first STAT included).
        assert_eq!(counts["set"], sent.sets as f64);
        assert_eq!(counts["get"], (sent.hits + sent.misses) as f64);
        assert_eq!(counts["delete"], sent.deletes as f64);
        assert_eq!(counts["incr_decr"], sent.incrs as f64);
        assert_eq!(counts["stats"], 1.0);
    }

    // The same scrape as OpenMetrics, through the strict parser.
    let accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
    let (status, head, open) = get(addr, "/metrics", Some(accept));
    assert_eq!(status, 200);
    assert!(
        head.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{head}"
    );
    assert!(open.ends_with("# EOF\n"));
    let open = parse(&open, "openmetrics");
    assert_eq!(open.len(), families.len(), "the same families");
    assert!(open
        .iter()
        .any(|f| f.name == "headroom_commands" && f.kind == "counter"));

    // promtool's lint, where promtool is installed.
    match promtool() {
        Some(promtool) => {
            let out = run_with_input(&promtool, &["check", "metrics"], &text);
            assert!(
                out.status.success(),
                "promtool check metrics: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        None => println!(
            "promtool not found (scripts/install-deps puts it in ~/.cache/headroom-tools): \
             skipping promtool check metrics"
        ),
    }

    // Scrapes run on the placement master: they make the shards send nothing (the second
    // STAT's own gathering is the only control message between these two).
    let control =
        |stats: &HashMap<String, String>| stats["mesh_messages_control"].parse::<u64>().unwrap();
    let first = control(&c.stats("").into_iter().collect());
    for _ in 0..3 {
        assert_eq!(get(addr, "/metrics", None).0, 200);
    }
    let second = control(&c.stats("").into_iter().collect());
    assert_eq!(second - first, 1, "one STAT on two shards: one message");
    drop(c);
    assert!(server.stop().success());
}

/// `promtool`: `$HEADROOM_PROMTOOL`, the one `scripts/install-deps` extracts, or one on PATH.
fn promtool() -> Option<std::path::PathBuf> {
    let home = std::env::var_os("HOME").unwrap_or_default();
    let candidates = std::env::var_os("HEADROOM_PROMTOOL")
        .map(std::path::PathBuf::from)
        .into_iter()
        .chain([
            std::path::Path::new(&home).join(".cache/headroom-tools/promtool"),
            std::path::PathBuf::from("promtool"),
        ]);
    candidates.into_iter().find(|p| {
        std::process::Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

#[test]
fn health_answers_and_bad_http_gets_a_status() {
    let server = Server::start(&["--threads", "1", "--metrics-listen", "127.0.0.1:0"]);
    let addr = server.metrics_addr();
    for path in ["/health", "/healthz", "/health?probe=1"] {
        let (status, head, body) = get(addr, path, None);
        assert_eq!((status, body.as_str()), (200, "ok\n"), "{path}: {head}");
        assert!(head.contains("Connection: close"), "{head}");
    }
    let (status, head, body) = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    assert!(body.is_empty(), "HEAD has no body");
    assert!(head.contains("Content-Length: "), "{head}");
    assert_eq!(get(addr, "/nowhere", None).0, 404);
    assert_eq!(
        exchange(addr, b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n").0,
        405
    );
    assert_eq!(exchange(addr, b"\x00\x01\x02 nonsense\r\n\r\n").0, 400);
    assert_eq!(
        exchange(addr, b"GET /health HTTP/1.1\r\nno colon\r\n\r\n").0,
        400
    );
    let mut huge = b"GET /metrics HTTP/1.1\r\nX-Padding: ".to_vec();
    huge.resize(64 << 10, b'a');
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _ = stream.write_all(&huge); // the server may close before taking it all
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    assert!(
        String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 431 "),
        "an oversized head: {}",
        String::from_utf8_lossy(&reply)
    );
    // A client that connects and leaves, or sends half a head and leaves, costs nothing.
    drop(TcpStream::connect(addr).unwrap());
    let mut half = TcpStream::connect(addr).unwrap();
    half.write_all(b"GET /met").unwrap();
    drop(half);
    // Still serving, data and metrics alike.
    assert_eq!(get(addr, "/health", None).0, 200);
    assert_eq!(server.client().set(b"k", b"v", 0, 0).status, 0);
    assert_eq!(get(addr, "/metrics", None).0, 200);
    assert!(server.stop().success());
}

/// Clients that connect and send nothing, or trickle half a head, hold no slot a health check
/// needs: with more of them open than the endpoint serves at once (16), `/health` and
/// `/metrics` still answer; and a head that trickles in a byte at a time is cut off rather
/// than held open byte by byte.
/// A connection that asks for /metrics with a minimal receive buffer and never reads.
fn requested_and_never_read(addr: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .unwrap();
    socket.set_recv_buffer_size(1).unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut stream: TcpStream = socket.into();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    stream
}

#[test]
fn health_answers_while_slow_clients_hold_every_slot() {
    let server = Server::start(&["--threads", "1", "--metrics-listen", "127.0.0.1:0"]);
    let addr = server.metrics_addr();
    let mut slow: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for _ in 0..4 {
        let mut half = TcpStream::connect(addr).unwrap();
        half.write_all(b"GET /met").unwrap();
        slow.push(half);
    }
    // Clients that request /metrics and never read: with a receive buffer this small (the
    // kernel's minimum) the answer cannot all be sent, so each holds its slot while the
    // endpoint writes.
    for _ in 0..20 {
        slow.push(requested_and_never_read(addr));
    }
    for round in 0..3 {
        let (status, head, body) = get(addr, "/health", None);
        assert_eq!(
            (status, body.as_str()),
            (200, "ok\n"),
            "round {round}: {head}"
        );
        let (status, _, body) = get(addr, "/metrics", None);
        assert_eq!(status, 200, "round {round}");
        assert!(
            body.contains("headroom_build_info"),
            "round {round}: {body}"
        );
        slow.push(TcpStream::connect(addr).unwrap());
        slow.push(requested_and_never_read(addr));
    }
    drop(slow);

    // One byte of an endless header line every 100 ms: each read brings something, but the
    // head never completes, so the endpoint closes the connection (it would wait forever if
    // every byte restarted its wait). 60 s only bounds a hang.
    let mut trickle = TcpStream::connect(addr).unwrap();
    trickle
        .write_all(b"GET /health HTTP/1.1\r\nX-Slow: ")
        .unwrap();
    trickle
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let started = std::time::Instant::now();
    let closed = loop {
        if started.elapsed() > Duration::from_secs(60) {
            panic!("a head trickled in a byte at a time was never cut off");
        }
        if let Some(closed) = common::closed_by_server(&mut trickle, b"a") {
            break closed;
        }
    };
    assert!(closed, "the endpoint answered a head that never completed");
    assert_eq!(get(addr, "/health", None).0, 200);
    assert!(server.stop().success());
}

#[test]
fn the_endpoint_is_off_by_default_and_refuses_a_taken_address() {
    let server = Server::start(&["--threads", "1"]);
    assert!(
        !server.log_text().contains("metrics on"),
        "{}",
        server.log_text()
    );
    assert!(server.log_text().contains("metrics_listen=none (off)"));
    // A second server asked to serve metrics where the first one's data port is.
    let taken = server.addr.to_string();
    let (code, stderr, _) = common::server::run_to_exit(
        &[
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            &taken,
            "--data-dir",
            common::server::fresh_data_dir().to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "--metrics-listen {taken}: cannot listen there: the address is already in use"
        )),
        "{stderr}"
    );
    let _ = Kind::Counter; // the table's types are public for tests like this one
}

/// The value of the sample named `name` with exactly `labels` (0 when absent).
fn sample_value(all: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    find(all, name, labels).map_or(0.0, |s| s.value)
}

#[test]
fn scrapes_under_load_parse_and_count_every_request() {
    let server = Server::start(&["--threads", "2", "--metrics-listen", "127.0.0.1:0"]);
    let addr = server.metrics_addr();
    // Two clients hammer the server while the endpoint is scraped, each scrape parsed by the
    // real parser; the GET histogram never goes backwards, and once the load stops it has
    // counted exactly the GETs sent.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loaders: Vec<_> = (0..2)
        .map(|t| {
            let mut c = server.client();
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let key = format!("load:{t}");
                assert_eq!(c.set(key.as_bytes(), b"v", 0, 0).status, 0);
                let mut gets = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    assert_eq!(c.get(key.as_bytes()).status, 0);
                    gets += 1;
                }
                gets
            })
        })
        .collect();
    let get_count = |all: &[Sample]| {
        sample_value(
            all,
            "headroom_request_duration_seconds_count",
            &[("command", "get")],
        )
    };
    let mut last = 0.0;
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(200));
        let (status, head, text) = get(addr, "/metrics", None);
        assert_eq!(status, 200, "{head}");
        let all = samples(&parse(&text, "prometheus"));
        let now = get_count(&all);
        assert!(now >= last, "the GET histogram went back: {last} -> {now}");
        last = now;
    }
    assert!(last > 0.0, "no GET was counted during the load");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent: u64 = loaders.into_iter().map(|l| l.join().unwrap()).sum();
    let (_, _, text) = get(addr, "/metrics", None);
    let all = samples(&parse(&text, "prometheus"));
    assert_eq!(get_count(&all), sent as f64);
    assert_eq!(server.stop().code(), Some(0));
}

/// Stops the whole server while a GET's bytes reach its socket, for 300 ms, then lets it go,
/// up to `attempts` times until the GET's latency holds the stop. Returns whether the shard
/// serves on the ring, how many GETs took over 200 ms by the last attempt, and what STAT
/// `settings` says of receive timestamps.
fn gets_over_200ms_across_a_stop(args: &[&str], attempts: u64) -> (bool, f64, String) {
    let mut all_args = vec!["--threads", "1", "--metrics-listen", "127.0.0.1:0"];
    all_args.extend_from_slice(args);
    let server = Server::start(&all_args);
    let addr = server.metrics_addr();
    let mut c = server.client();
    assert_eq!(c.set(b"k", b"v", 0, 0).status, 0);
    let on_ring = c
        .stats("io")
        .iter()
        .any(|(name, value)| name == "shard0_path" && value.starts_with("ring"));
    let stamps_setting = c
        .stats("settings")
        .into_iter()
        .find(|(name, _)| name == "receive_timestamps")
        .map(|(_, value)| value)
        .expect("STAT settings names receive_timestamps");
    let pid = nix::unistd::Pid::from_raw(server.pid() as i32);
    let gets_over = |le: &str| {
        let (_, _, text) = get(addr, "/metrics", None);
        let all = samples(&parse(&text, "prometheus"));
        let bucket = |le: &str| {
            sample_value(
                &all,
                "headroom_request_duration_seconds_bucket",
                &[("command", "get"), ("le", le)],
            )
        };
        (bucket("+Inf") - bucket(le), bucket("+Inf"))
    };
    let mut over_200ms = 0.0;
    for attempt in 1..=attempts {
        std::thread::sleep(Duration::from_millis(100 * attempt));
        // The whole process is stopped while the GET's bytes reach its socket (loopback
        // delivers them in this thread's send), then let go: the shard reaps the receive only
        // then.
        // (Waiting for every thread to stop: a shard still running could take the GET first
        // and be stopped before replying, and the stop would be in any latency.)
        server.freeze();
        c.send(&frame(headroom::proto::opcode::GET, &[], b"k", b"", 0, 0));
        std::thread::sleep(Duration::from_millis(300));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
        assert_eq!(c.recv().expect("the GET's reply").status, 0);
        let all_gets;
        (over_200ms, all_gets) = gets_over("0.2");
        assert_eq!(all_gets, attempt as f64);
        if !on_ring || over_200ms > 0.0 {
            break;
        }
    }
    assert_eq!(server.stop().code(), Some(0));
    (on_ring, over_200ms, stamps_setting)
}

#[test]
fn a_requests_latency_starts_when_its_bytes_reach_the_socket() {
    // The kernel turns receive timestamps on for the whole host a moment after the first
    // socket asks (a deferred static-key switch), and packets received before that carry
    // none (the read's completion is used then): so the experiment is repeated a few times,
    // waiting longer each time. Without timestamps every attempt fails.
    let (on_ring, over_200ms, setting) = gets_over_200ms_across_a_stop(&[], 5);
    assert_eq!(setting, "on");
    if on_ring {
        // The kernel's receive timestamp starts the clock: the 300 ms stop is in it.
        assert!(
            over_200ms >= 1.0,
            "the stop is missing from the GET's latency in every attempt"
        );
    } else {
        eprintln!("plain path: latency starts at the read's completion, the stop is not in it");
        assert_eq!(over_200ms, 0.0);
    }
}

#[test]
fn without_receive_timestamps_latency_starts_when_the_shard_takes_the_bytes() {
    // As many attempts as the test above: had the switch been ignored, the host's timestamping
    // would come on during them (other tests' sockets may have it on already), and a stop
    // would show. With it off, none of the five may.
    let (on_ring, over_200ms, setting) =
        gets_over_200ms_across_a_stop(&["--receive-timestamps", "off"], 5);
    assert_eq!(setting, "off");
    if !on_ring {
        eprintln!("plain path: no timestamps either way; this checks only the plain path");
    }
    assert_eq!(
        over_200ms, 0.0,
        "the stop is in the GET's latency with --receive-timestamps off"
    );
}
