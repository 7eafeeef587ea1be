//! The warm restart follows the data: a data directory copied to another path, and a segment
//! file renamed, restore every value, small and large, byte for byte (a segment is known by
//! the id in its label, not by its path); another segment at the old path restores none of
//! its values and the log says which, counted in STAT and `/metrics`; a stop that cannot write
//! its snapshot exits non-zero with one ERROR line and the next start serves; and a snapshot
//! and segment written by the build before segment ids (`tests/data/warm-restart-v1`) restore.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::pattern;
use common::server::{frame, set_extras, Client, Server};

const SMALL: usize = 30_000;
/// Large values: (key, bytes).
const LARGE: &[(&str, usize)] = &[
    ("large-a", 1 << 20),
    ("large-b", (2 << 20) + 7),
    ("large-c", 3 << 20),
];

fn small_value(i: usize) -> Vec<u8> {
    format!("small value {i} {}", "x".repeat(i % 50)).into_bytes()
}

/// Stores the small values (pipelined SETQs, then a NOOP) and the large ones.
fn fill(c: &mut Client) {
    let mut batch = Vec::new();
    for i in 0..SMALL {
        let key = format!("small-{i}");
        batch.extend(frame(
            0x11,
            &set_extras(0, 0),
            key.as_bytes(),
            &small_value(i),
            0,
            0,
        ));
        if batch.len() > 1 << 20 || i == SMALL - 1 {
            batch.extend(frame(0x0a, &[], &[], &[], 0, 0));
            c.send(&batch);
            batch.clear();
            let r = c.recv().expect("the NOOP");
            assert_eq!((r.opcode, r.status), (0x0a, 0), "a SETQ failed: {r:?}");
        }
    }
    for (i, &(key, len)) in LARGE.iter().enumerate() {
        let r = c.set_streamed(0x01, key.as_bytes(), &pattern(i as u64, len), 7);
        assert_eq!(r.status, 0, "SET {key}");
    }
}

/// How many small values are back byte for byte (pipelined GETKQs, then a NOOP).
fn small_back(c: &mut Client) -> usize {
    let mut request = Vec::new();
    for i in 0..SMALL {
        request.extend(frame(0x0d, &[], format!("small-{i}").as_bytes(), &[], 0, 0));
    }
    request.extend(frame(0x0a, &[], &[], &[], 0, 0));
    // Replies are read on another thread so neither side waits on a full socket buffer.
    let mut reader = Client {
        stream: c.stream.try_clone().unwrap(),
    };
    let replies = std::thread::spawn(move || {
        let mut back = 0;
        loop {
            let r = reader.recv().expect("a reply");
            if r.opcode == 0x0a {
                return back;
            }
            let i: usize = String::from_utf8(r.key).unwrap()[6..].parse().unwrap();
            assert!(r.value == small_value(i), "small-{i} came back different");
            back += 1;
        }
    });
    c.send(&request);
    replies.join().unwrap()
}

/// How many large values are back byte for byte, with their flags.
fn large_back(c: &mut Client) -> usize {
    let mut back = 0;
    for (i, &(key, len)) in LARGE.iter().enumerate() {
        let got = c.get(key.as_bytes());
        if got.status == 0 {
            assert!(
                got.value == pattern(i as u64, len),
                "{key} came back different"
            );
            assert_eq!(got.flags(), 7);
            back += 1;
        }
    }
    back
}

/// Copies a directory's files (a sparse segment stays sparse), as an operator would.
fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .args(["-a", "--sparse=always"])
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// A data directory made by a server stopped cleanly after [`fill`].
fn filled_and_stopped(dir: &Path, args: &[&str]) {
    let server = Server::start_in(dir, args);
    fill(&mut server.client());
    assert_eq!(server.stop().code(), Some(0), "the stop was not clean");
}

#[test]
fn a_data_directory_copied_to_another_path_restores_every_value() {
    let old = common::server::fresh_data_dir();
    // The default segment: `segment-0` in the data directory, 1 GiB (sparse).
    filled_and_stopped(&old, &["--threads", "2"]);
    let new = common::fresh_temp_path("moved-data-dir");
    copy_dir(&old, &new);
    std::fs::remove_dir_all(&old).unwrap();

    let server = Server::start_in(&new, &["--threads", "2"]);
    let mut c = server.client();
    assert_eq!(small_back(&mut c), SMALL);
    assert_eq!(large_back(&mut c), LARGE.len(), "{}", server.log_text());
    assert_eq!(c.stat("", "warm_restart_dropped"), 0);
    assert!(!server.logs("not restored"), "{}", server.log_text());
}

#[test]
fn a_renamed_segment_outside_the_data_directory_restores_its_values() {
    let dir = common::server::fresh_data_dir();
    let segments = common::fresh_temp_path("segments");
    std::fs::create_dir(&segments).unwrap();
    let spec = |name: &str| format!("file:{},size=64M", segments.join(name).display());
    let first = spec("before");
    filled_and_stopped(&dir, &["--threads", "2", "--segment", &first]);
    std::fs::rename(segments.join("before"), segments.join("after")).unwrap();

    let second = spec("after");
    let server = Server::start_in(&dir, &["--threads", "2", "--segment", &second]);
    let mut c = server.client();
    assert_eq!(large_back(&mut c), LARGE.len(), "{}", server.log_text());
    assert_eq!(small_back(&mut c), SMALL);
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The id in a segment file's label (`segment::label`'s `id` line).
fn segment_id(path: &Path, size: u64) -> String {
    use std::os::unix::fs::FileExt;
    let mut block = vec![0u8; 4096];
    let file = std::fs::File::open(path).unwrap();
    file.read_exact_at(&mut block, size).unwrap();
    let text = String::from_utf8_lossy(&block).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("id "))
        .expect("a label with an id")
        .to_string()
}

#[test]
fn another_segment_at_the_old_path_restores_none_of_its_values_and_says_so() {
    let (ours, theirs) = (
        common::server::fresh_data_dir(),
        common::server::fresh_data_dir(),
    );
    let size = 64u64 << 20;
    let args = |dir: &Path| -> Vec<String> {
        let segment = format!("file:{},size=64M", dir.join("segment-0").display());
        ["--threads", "2", "--segment", &segment]
            .map(String::from)
            .to_vec()
    };
    filled_and_stopped(&ours, &as_strs(&args(&ours)));
    filled_and_stopped(&theirs, &as_strs(&args(&theirs)));
    let (our_id, their_id) = (
        segment_id(&ours.join("segment-0"), size),
        segment_id(&theirs.join("segment-0"), size),
    );
    assert_ne!(our_id, their_id, "two segments formatted with one id");
    // The other server's segment (same size, same name) where ours was.
    std::fs::copy(theirs.join("segment-0"), ours.join("segment-0")).unwrap();

    let mut start = args(&ours);
    start.extend(["--metrics-listen".into(), "127.0.0.1:0".into()]);
    let server = Server::start_in(&ours, &as_strs(&start));
    let mut c = server.client();
    assert_eq!(
        large_back(&mut c),
        0,
        "a value from another segment was served"
    );
    assert_eq!(small_back(&mut c), SMALL, "RAM values depend on no segment");
    assert_eq!(c.stat("", "warm_restart_skipped_segment_missing"), 3);
    assert_eq!(c.stat("", "warm_restart_dropped"), 3);
    assert_eq!(c.segment_used(), 0, "space claimed for values not restored");
    let line = server
        .log_text()
        .lines()
        .find(|l| l.contains("WARN") && l.contains("large values not restored"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no WARN line:\n{}", server.log_text()));
    for part in [
        "3 large values not restored".to_string(),
        format!("segment-0 (id {our_id}) is not mounted"),
        format!("now holds another segment, id {their_id}"),
    ] {
        assert!(line.contains(&part), "{part:?} is not in {line:?}");
    }
    let metrics = common::http_get(server.metrics_addr(), "/metrics");
    assert!(
        metrics.contains("headroom_warm_restart_skipped_total{reason=\"segment_missing\"} 3"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("warm_restart"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn a_stop_that_cannot_write_its_snapshot_exits_non_zero_and_the_next_start_serves() {
    // The data directory on an 8 MiB filesystem; about 30 MiB of values in RAM.
    let Some(fs) = common::TinyFs::or_skip(8) else {
        return;
    };
    let dir = fs.mount.join("data");
    let args = ["--threads", "2", "--segment", "mem:size=16M,numa=0"];
    let server = Server::start_in(&dir, &args);
    let mut c = server.client();
    let value = pattern(5, 100 << 10);
    for i in 0..300 {
        assert_eq!(c.set(format!("k{i}").as_bytes(), &value, 0, 0).status, 0);
    }
    let (status, log) = server.stop_logged();
    assert_eq!(status.code(), Some(1), "{log}");
    let last = log.lines().last().unwrap_or_default();
    for part in [
        "ERROR",
        "the warm-restart snapshot was not written",
        dir.join("snapshot").to_str().unwrap(),
        "No space left on device",
        "RAM items",
    ] {
        assert!(
            last.contains(part),
            "{part:?} is not in the last line {last:?}"
        );
    }
    // Nothing of it is restored, and the next start serves.
    let server = Server::start_in(&dir, &args);
    let mut c = server.client();
    assert_eq!(c.get(b"k0").status, 1, "a snapshot in part was restored");
    assert_eq!(c.stat("", "warm_restart_restored"), 0);
    assert_eq!(c.set(b"after", b"serves", 0, 0).status, 0);
    assert_eq!(server.stop().code(), Some(0));
}

/// Where the version 1 fixture was written: a snapshot of that version names its segment by
/// a hash of this path, so it restores only here.
const V1_FIXTURE_DIR: &str = "/tmp/headroom-warm-restart-v1-fixture";

/// The fixture's files (`tests/data/warm-restart-v1/`: the snapshot directory's files and
/// `segment-0`), written by the build before segment ids (171ca4b) with [`V1_ARGS`], holding
/// `small-0`..`small-99` and `large-0`..`large-3` ([`v1_value`]).
/// `HEADROOM_WRITE_V1_FIXTURE=<that build's headroom>` writes them again.
fn v1_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/warm-restart-v1")
}

const V1_ARGS: &[&str] = &[
    "--threads",
    "2",
    "--ram-head",
    "4K",
    "--segment",
    "file:/tmp/headroom-warm-restart-v1-fixture/segment-0,size=1M",
];

fn v1_keys() -> impl Iterator<Item = String> {
    (0..100)
        .map(|n| format!("small-{n}"))
        .chain((0..4).map(|n| format!("large-{n}")))
}

/// Writes the fixture with the older build `binary`.
fn write_v1_fixture(binary: &str) {
    let dir = Path::new(V1_FIXTURE_DIR);
    let _ = std::fs::remove_dir_all(dir);
    let server = Server::start_binary(binary, &[], dir, V1_ARGS);
    let mut c = server.client();
    for key in v1_keys() {
        assert_eq!(c.set(key.as_bytes(), &v1_value(&key), 0, 0).status, 0);
    }
    assert_eq!(server.stop().code(), Some(0));
    let to = v1_fixture();
    let _ = std::fs::remove_dir_all(&to);
    std::fs::create_dir_all(&to).unwrap();
    std::fs::copy(dir.join("segment-0"), to.join("segment-0")).unwrap();
    for entry in std::fs::read_dir(dir.join("snapshot")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// The fixture's values: small ones under 4 KiB, large ones of 40-100 KiB.
fn v1_value(key: &str) -> Vec<u8> {
    let n: u64 = key.rsplit('-').next().unwrap().parse().unwrap();
    match key.starts_with("large") {
        true => pattern(1000 + n, 40_000 + 20_000 * n as usize),
        false => pattern(n, 100 + n as usize * 30),
    }
}

#[test]
fn a_version_1_snapshot_and_segment_are_restored_by_this_build() {
    let dir = Path::new(V1_FIXTURE_DIR);
    let _turn = common::PathLock::take(Path::new("/tmp/headroom-warm-restart-v1-fixture.lock"));
    if let Ok(binary) = std::env::var("HEADROOM_WRITE_V1_FIXTURE") {
        write_v1_fixture(&binary);
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("snapshot")).unwrap();
    for entry in std::fs::read_dir(v1_fixture()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let to = if name == "segment-0" {
            dir.join(&name)
        } else {
            dir.join("snapshot").join(&name)
        };
        std::fs::copy(entry.path(), to).unwrap();
    }
    let args = V1_ARGS;
    let server = Server::start_in(dir, args);
    let mut c = server.client();
    for key in v1_keys() {
        let got = c.get(key.as_bytes());
        assert_eq!(got.status, 0, "{key} not restored:\n{}", server.log_text());
        assert!(got.value == v1_value(&key), "{key} came back different");
    }
    assert!(
        server.logs("segment given an id: its label was written by an older build"),
        "{}",
        server.log_text()
    );
    // The segment has its id now: the next restart names it by that.
    assert_eq!(server.stop().code(), Some(0));
    let server = Server::start_in(dir, args);
    assert_eq!(server.client().get(b"large-3").value, v1_value("large-3"));
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// A loop device over an image file, detached on drop.
struct Loop {
    device: String,
}

impl Loop {
    fn attach(image: &Path) -> Result<Loop, String> {
        let out = Command::new("losetup")
            .args(["-f", "--show"])
            .arg(image)
            .output()
            .map_err(|err| format!("losetup: {err}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Ok(Loop { device })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
    }
}

/// A block device segment keeps its label in the last 4 KiB of the bytes it was given (the
/// target is that much smaller, nothing past them is written), and its values come back when
/// the device appears under another name.
#[test]
fn a_block_device_segment_is_known_by_its_label_under_another_name() {
    let skip = |why: String| {
        assert!(
            std::env::var_os("HEADROOM_REQUIRE_ROOT_TESTS").is_none(),
            "HEADROOM_REQUIRE_ROOT_TESTS is set but {why}"
        );
        println!("skipped: {why}");
    };
    if !nix::unistd::geteuid().is_root() {
        return skip("loop devices need root".into());
    }
    let size = 16u64 << 20;
    let image = common::fresh_temp_path("block-segment");
    // A mebibyte past the segment's bytes, to show nothing is written there.
    std::fs::File::create(&image)
        .and_then(|f| f.set_len(size + (1 << 20)))
        .unwrap();
    let first = match Loop::attach(&image) {
        Ok(device) => device,
        Err(why) => return skip(format!("no loop device: {why}")),
    };
    let dir = common::server::fresh_data_dir();
    let spec = |device: &str| format!("file:{device},size=16M");
    let args = |spec: &str| -> Vec<String> {
        ["--threads", "2", "--ram-head", "256K", "--segment", spec]
            .map(String::from)
            .to_vec()
    };
    let server = Server::start_in(&dir, &as_strs(&args(&spec(&first.device))));
    let mut c = server.client();
    let capacity: u64 = c
        .stats("segments")
        .iter()
        .find(|(name, _)| name.ends_with("_capacity"))
        .map(|(_, v)| v.parse().unwrap())
        .expect("a capacity");
    assert_eq!(
        capacity,
        size - 4096,
        "the label's block is not the target's"
    );
    for (i, &(key, len)) in LARGE.iter().enumerate() {
        let r = c.set_streamed(0x01, key.as_bytes(), &pattern(i as u64, len), 7);
        assert_eq!(r.status, 0, "SET {key}");
    }
    assert_eq!(server.stop().code(), Some(0));
    drop(first);

    // The same bytes under another device name (a placeholder takes the first free one).
    let placeholder_image = common::fresh_temp_path("block-placeholder");
    std::fs::File::create(&placeholder_image)
        .and_then(|f| f.set_len(1 << 20))
        .unwrap();
    let _placeholder = Loop::attach(&placeholder_image).unwrap();
    let second = Loop::attach(&image).unwrap();
    let server = Server::start_in(&dir, &as_strs(&args(&spec(&second.device))));
    let mut c = server.client();
    assert_eq!(large_back(&mut c), LARGE.len(), "{}", server.log_text());
    drop(server);

    let bytes = std::fs::read(&image).unwrap();
    let label = &bytes[(size - 4096) as usize..size as usize];
    assert!(
        label.starts_with(b"headroom segment label v2\n"),
        "no label at the end"
    );
    assert!(
        bytes[size as usize..].iter().all(|&b| b == 0),
        "a byte past the segment was written"
    );
}
