//! headroom-bench end to end: a short load run against the real server (zero errors, JSON and
//! SVG written), the live RL pattern, Headroom against memcached, the A/B refusing on one
//! node with the server's own reason, and the placement replay's comparison on its default
//! RL pattern (asserted on counts, never on time).

mod common;

use std::process::{Command, Output};

use common::server::{fresh_data_dir, Server};
use headroom::bench::replay::{self, RlPattern, Targets};
use headroom::bench::trace;
use headroom::placement::Policy;

fn bench(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_headroom-bench"))
        .args(args)
        .output()
        .expect("run headroom-bench");
    println!(
        "headroom-bench {args:?}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("the JSON was written"))
        .expect("valid JSON")
}

#[test]
fn a_short_load_run_has_no_errors_and_writes_json_and_svg() {
    let server = Server::start(&["--threads", "2"]);
    let out_dir = fresh_data_dir();
    let out = bench(&[
        "load",
        "--server",
        &server.addr.to_string(),
        "--duration",
        "2",
        "--warmup",
        "0.5",
        "--keys",
        "2000",
        "--value-size",
        "32:9,1K:1",
        "--key-dist",
        "zipf",
        "--pipeline",
        "4",
        "--out",
        out_dir.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(out.status.success());
    let report = json(&out_dir.join("load.json"));
    assert_eq!(report["wrong_values"], 0);
    assert_eq!(report["connection_errors"], 0);
    assert_eq!(report["error_replies"].as_array().unwrap().len(), 0);
    assert!(report["requests"].as_u64().unwrap() > 1000);
    // Prefilled: every GET hits.
    assert_eq!(report["get_misses"], 0);
    assert!(report["get"]["p99_us"].as_u64().unwrap() >= report["get"]["p50_us"].as_u64().unwrap());
    let svg = std::fs::read_to_string(out_dir.join("load.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<path"));
    // The result says where it came from.
    let meta = &report["meta"];
    assert_eq!(meta["tool"], "headroom-bench");
    assert!(meta["tool_version"].as_str().unwrap().contains("commit "));
    assert!(meta["tool_arguments"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "load"));
    assert!(!meta["host"].as_str().unwrap().is_empty());
    assert!(!meta["kernel"].as_str().unwrap().is_empty());
    assert!(meta["cpus"].as_u64().unwrap() >= 1);
    assert!(meta["date"].as_str().unwrap().ends_with('Z'));
    let servers = meta["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0]["address"], server.addr.to_string());
    assert!(servers[0]["stat_version"].as_str().is_some());
    assert!(!servers[0]["stat_settings"].as_object().unwrap().is_empty());
    let _ = std::fs::remove_dir_all(out_dir);
}

#[test]
fn wrong_values_are_counted_not_hidden() {
    // A server that stores other bytes under the bench's keys: every GET hit is wrong.
    let server = Server::start(&["--threads", "1"]);
    let mut c = server.client();
    for i in 0..50u64 {
        let key = format!("hb:{i:012}");
        assert_eq!(c.set(key.as_bytes(), &[0xAA; 32], 0, 0).status, 0);
    }
    let out_dir = fresh_data_dir();
    let out = bench(&[
        "load",
        "--server",
        &server.addr.to_string(),
        "--no-prefill",
        "--ratio",
        "0:1",
        "--keys",
        "50",
        "--duration",
        "0.5",
        "--warmup",
        "0",
        "--threads",
        "1",
        "--connections",
        "1",
        "--out",
        out_dir.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(!out.status.success(), "errors make the run fail");
    let report = json(&out_dir.join("load.json"));
    assert!(report["wrong_values"].as_u64().unwrap() > 0);
    assert_eq!(report["wrong_values"], report["get_hits"]);
    let _ = std::fs::remove_dir_all(out_dir);
}

#[test]
fn the_live_rl_pattern_reads_back_everything_it_wrote() {
    let server = Server::start(&["--threads", "2"]);
    let out_dir = fresh_data_dir();
    let out = bench(&[
        "rl",
        "--server",
        &server.addr.to_string(),
        "--ranks",
        "3",
        "--steps",
        "4",
        "--keys-min",
        "2",
        "--keys-max",
        "4",
        "--key-min",
        "4K",
        "--key-max",
        "512K",
        "--whole-min",
        "1M",
        "--whole-max",
        "3M",
        "--out",
        out_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let report = json(&out_dir.join("rl.json"));
    assert_eq!(report["wrong_reads"], 0);
    assert_eq!(report["missing_reads"], 0);
    assert_eq!(report["failures"].as_array().unwrap().len(), 0);
    assert_eq!(report["reads"], report["puts"]);
    // Steps 0 and 1 were deleted two steps later.
    assert!(report["deletes"].as_u64().unwrap() > 0);
    let _ = std::fs::remove_dir_all(out_dir);
}

#[test]
fn headroom_against_memcached_in_interleaved_rounds() {
    if Command::new("memcached").arg("-h").output().is_err() {
        assert!(
            std::env::var_os("HEADROOM_REQUIRE_ROOT_TESTS").is_none(),
            "memcached is missing (scripts/install-deps installs it)"
        );
        println!("skipped: memcached is not installed");
        return;
    }
    let out_dir = fresh_data_dir();
    let data_dir = fresh_data_dir();
    let out = bench(&[
        "vs",
        "--peer-command",
        "memcached -t 1 -m 64 -U 0",
        "--rounds",
        "2",
        "--duration",
        "0.5",
        "--warmup",
        "0.2",
        "--keys",
        "500",
        "--threads",
        "1",
        "--connections",
        "2",
        "--out",
        out_dir.to_str().unwrap(),
        "--quiet",
        "--",
        "--threads",
        "1",
        "--data-dir",
        data_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let c = json(&out_dir.join("vs.json"));
    assert_eq!(c["rounds"], 2);
    assert_eq!(c["a_rounds"].as_array().unwrap().len(), 2);
    assert_eq!(c["b_rounds"].as_array().unwrap().len(), 2);
    let figures = c["figures"].as_array().unwrap();
    let rps = figures.iter().find(|f| f["name"] == "requests/s").unwrap();
    assert!(rps["a"].as_f64().unwrap() > 0.0 && rps["b"].as_f64().unwrap() > 0.0);
    let ratio = rps["b"].as_f64().unwrap() / rps["a"].as_f64().unwrap();
    assert!((rps["ratio_b_over_a"].as_f64().unwrap() - ratio).abs() < 1e-9);
    assert!(figures
        .iter()
        .any(|f| f["name"] == "server CPU µs per request"));
    assert!(std::fs::read_to_string(out_dir.join("vs.svg"))
        .unwrap()
        .contains("<path"));
    // Both sides are named in the metadata, with how the bench started them.
    let servers = c["meta"]["servers"].as_array().unwrap();
    let roles: Vec<&str> = servers
        .iter()
        .map(|s| s["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["A", "B"]);
    assert!(servers
        .iter()
        .all(|s| s["command"].as_str().is_some() && s["stat_version"].as_str().is_some()));
    let headroom = servers.iter().find(|s| s["name"] == "headroom").unwrap();
    assert!(headroom["binary_version"]
        .as_str()
        .unwrap()
        .contains("commit"));
    let _ = std::fs::remove_dir_all(out_dir);
    let _ = std::fs::remove_dir_all(data_dir);
}

#[test]
fn the_ab_refuses_one_node_with_the_servers_reason() {
    let nodes = std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("node"))
                .count()
        })
        .unwrap_or(1);
    if nodes > 1 {
        println!("skipped: this machine has {nodes} NUMA nodes");
        return;
    }
    let out = bench(&["ab", "--duration", "1", "--", "--numa", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--perverse needs at least two online NUMA nodes"),
        "{stderr}"
    );
}

#[test]
fn best_fit_keeps_room_for_large_objects_where_random_fragments() {
    let pattern = RlPattern::default();
    let events = replay::rl_events(&pattern);
    let targets = Targets::default();
    let run = |policy| replay::replay(&events, &targets, policy, 1920 << 20, None, 42);
    let (random, best_fit) = (run(Policy::Random), run(Policy::BestFit));
    let margin = 2 * pattern.whole_max_bytes;
    // Best fit never fails while free space exceeds the largest request by a margin.
    for f in &best_fit.failures {
        assert!(
            f.free_bytes < margin,
            "best_fit failed with {} free",
            f.free_bytes
        );
    }
    // Random fails on the same sequence, from fragmentation: room in total, no hole.
    let fragmented: Vec<_> = random
        .failures
        .iter()
        .filter(|f| f.fragmentation && f.free_bytes >= margin)
        .collect();
    assert!(
        fragmented.len() >= 5,
        "random: {} failures, {} with free space past the margin",
        random.failures.len(),
        fragmented.len()
    );
    assert!(best_fit.largest_hole_p50_bytes > random.largest_hole_p50_bytes);
    assert!(best_fit.probe_fits > random.probe_fits);
    // Every event is accounted for: a put placed or failed, a remove of a placed key or of
    // one whose put had failed.
    let puts = events
        .iter()
        .filter(|e| e.kind == trace::EventKind::Put)
        .count() as u64;
    let removes = events.len() as u64 - puts;
    for r in [&random, &best_fit] {
        assert_eq!(r.puts + r.failures.len() as u64, puts);
        assert_eq!(r.removes + r.removes_unknown, removes);
        assert!(r.removes_unknown <= r.failures.len() as u64);
    }
}

#[test]
fn a_trace_replays_like_the_pattern_it_records() {
    let pattern = RlPattern {
        steps: 12,
        ..RlPattern::default()
    };
    let events = replay::rl_events(&pattern);
    let text: String = events
        .iter()
        .map(|e| trace::format_event(e) + "\n")
        .collect::<String>()
        + "this line is not an event\n";
    let dir = fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rl.trace");
    std::fs::write(&path, &text).unwrap();
    let out = bench(&[
        "placement",
        "--trace-events",
        path.to_str().unwrap(),
        "--policies",
        "best_fit",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("line {}", events.len() + 1)),
        "{stderr}"
    );
    let report = json(&dir.join("placement.json"));
    let direct = replay::replay(
        &events,
        &Targets::default(),
        Policy::BestFit,
        1920 << 20,
        Some(100),
        42,
    );
    assert_eq!(report["reports"][0]["puts"], direct.puts);
    assert_eq!(report["reports"][0]["removes"], direct.removes);
    let _ = std::fs::remove_dir_all(dir);
}
