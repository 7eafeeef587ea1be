//! The configuration rules, run through the real binary: every invalid combination exits 2
//! with its own one-sentence error naming the flag, and every valid one prints the expected
//! `--dry-run` plan without mapping anything.

use std::process::Command;

const ONE: &str = "tests/data/topology-1node.toml";
const TWO: &str = "config/topology-2node.toml";
const THREE: &str = "tests/data/topology-3node.toml";

fn headroom(topology: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(args)
        .env("HEADROOM_TOPOLOGY", topology)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run headroom");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_invalid_combination_has_its_own_error_and_exit_2() {
    let table: &[(&str, &[&str], &str)] = &[
        (
            ONE,
            &["--segment", "file:/tmp/headroom-never-made,size=1048577T"],
            "--segment file:/tmp/headroom-never-made,size=1048577 TiB: the size must be a nonzero whole multiple of 4 KiB (and, for memory, of 4 KiB per node) of at most 1 EiB",
        ),
        (
            ONE,
            &["--block", "3M"],
            "--block 3 MiB must be a power of two",
        ),
        (
            ONE,
            &["--block", "1M"],
            "--block 1 MiB must be a power-of-two multiple of the 2 MiB huge page size",
        ),
        (
            ONE,
            &["--block", "2G", "--memory", "2G"],
            "--block 2 GiB must be at most 1 GiB",
        ),
        (
            ONE,
            &["--io-pool", "3M"],
            "--io-pool 3 MiB must be a whole multiple of --block 2 MiB",
        ),
        (
            ONE,
            &["--io-pool", "2M", "--io-chunk", "2M"],
            "--io-pool 2 MiB must hold at least two --io-chunk 2 MiB",
        ),
        (
            ONE,
            &["--io-ring", "maybe"],
            "--io-ring 'maybe' must be on or off",
        ),
        (
            ONE,
            &["--receive-timestamps", "sometimes"],
            "--receive-timestamps 'sometimes' must be on or off",
        ),
        (
            ONE,
            &["--multishot-receive", "maybe"],
            "--multishot-receive 'maybe' must be on or off",
        ),
        (
            ONE,
            &["--verify-reads", "sometimes"],
            "--verify-reads 'sometimes' must be files, on or off",
        ),
        (
            ONE,
            &["--pin-shards", "socket"],
            "--pin-shards socket: must be core or node",
        ),
        (
            ONE,
            &["--promotion-half-life", "0"],
            "--promotion-half-life must be at least 1 second",
        ),
        (
            ONE,
            &["--ram-head", "96K"],
            "--ram-head 96 KiB must be a power of two",
        ),
        (
            ONE,
            &["--ram-head", "2K"],
            "--ram-head 2 KiB must be at least 4 KiB",
        ),
        (
            ONE,
            &["--ram-head", "4M"],
            "--ram-head 4 MiB must be no larger than --block 2 MiB",
        ),
        (
            ONE,
            &["--small-min-alloc", "32"],
            "--small-min-alloc 32 must be 8 or 16",
        ),
        (
            ONE,
            &["--io-chunk", "12K"],
            "--io-chunk 12 KiB must be a power of two",
        ),
        (
            ONE,
            &["--io-chunk", "2K"],
            "--io-chunk 2 KiB must be at least 4 KiB",
        ),
        (
            ONE,
            &["--io-chunk", "4M"],
            "--io-chunk 4 MiB must be no larger than --block 2 MiB",
        ),
        (
            ONE,
            &["--memory", "1M"],
            "--memory 1 MiB must be at least one --block (2 MiB)",
        ),
        (
            ONE,
            &["--memory", "0"],
            "--memory 0 B must be at least one --block (2 MiB)",
        ),
        (
            ONE,
            &["--memory", "5M"],
            "--memory 5 MiB must be a whole multiple of --block 2 MiB",
        ),
        (
            TWO,
            &["--numa", "0", "--sub-memory", "3M"],
            "--sub-memory 3 MiB must be a whole multiple of --block 2 MiB",
        ),
        (
            ONE,
            &["--small-memory", "1M"],
            "--small-memory 1 MiB must be at least one --block",
        ),
        (
            TWO,
            &[
                "--numa",
                "0",
                "--small-memory",
                "4M",
                "--small-sub-memory",
                "6M",
                "--block",
                "4M",
            ],
            "--small-sub-memory 6 MiB must be a whole multiple of --block 4 MiB",
        ),
        (
            TWO,
            &["--sub-memory", "4M"],
            "--sub-memory needs an explicit --numa NODE",
        ),
        (
            TWO,
            &["--numa", "auto", "--sub-memory", "4M"],
            "--sub-memory needs an explicit --numa NODE",
        ),
        (
            TWO,
            &["--numa", "0", "--small-sub-memory", "4M"],
            "--small-sub-memory needs --small-memory",
        ),
        (
            TWO,
            &["--small-memory", "4M", "--small-sub-memory", "4M"],
            "--small-sub-memory needs an explicit --numa NODE",
        ),
        (
            TWO,
            &["--no-numa", "--perverse"],
            "--perverse cannot be used with --no-numa",
        ),
        (
            ONE,
            &["--perverse"],
            "--perverse needs at least two online NUMA nodes, and this machine has 1",
        ),
        (
            ONE,
            &["--numa", "3"],
            "--numa 3 is not an online NUMA node (online: [0])",
        ),
        (
            ONE,
            &["--listen", "nowhere"],
            "--listen nowhere: not a HOST:PORT address",
        ),
        (
            ONE,
            &["--metrics-listen", "nowhere"],
            "--metrics-listen nowhere: not a HOST:PORT address",
        ),
        (
            ONE,
            &["--config", "tests/data/does-not-exist.toml"],
            "--config tests/data/does-not-exist.toml:",
        ),
        (
            ONE,
            &["--config", "tests/data/bad-key.toml"],
            "unknown field `memroy`",
        ),
        (
            ONE,
            &["--log-level", "loud=="],
            "--log-level loud==: not a log filter",
        ),
        (
            TWO,
            &[
                "--numa",
                "0",
                "--memory",
                "16000000T",
                "--sub-memory",
                "16000000T",
            ],
            "add up to 16777216000000 blocks",
        ),
        (
            TWO,
            &[
                "--numa",
                "0",
                "--memory",
                "8796093022208M",
                "--sub-memory",
                "8796093022208M",
            ],
            "add up to 8796093022208 blocks",
        ),
        (ONE, &["--threads", "0"], "--threads must be at least 1"),
        (
            ONE,
            &["--threads", "3"],
            "--threads 3 exceeds the 2 CPUs of the serving node",
        ),
        (
            ONE,
            &["--max-connections", "0"],
            "--max-connections must be at least 1",
        ),
        (
            ONE,
            &["--body-timeout", "18446744073709551615"],
            "--body-timeout 18446744073709551615 must be at most 86400 seconds",
        ),
        (
            ONE,
            &["--idle-timeout", "86401"],
            "--idle-timeout 86401 must be at most 86400 seconds",
        ),
        (
            ONE,
            &["--max-item-size", "512"],
            "--max-item-size 512 B must be from 1 KiB",
        ),
        (
            ONE,
            &["--max-item-size", "4G"],
            "--max-item-size 4 GiB must be from 1 KiB",
        ),
    ];
    let mut messages = std::collections::HashSet::new();
    for (topology, args, expected) in table {
        let (code, stdout, stderr) = headroom(topology, args);
        assert_eq!(code, 2, "{args:?}: exit {code}, stderr {stderr}");
        assert!(stdout.is_empty(), "{args:?} printed a plan: {stdout}");
        assert!(
            stderr.contains(expected),
            "{args:?}: expected {expected:?}, got {stderr:?}"
        );
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{args:?}: one sentence, got {stderr:?}"
        );
        messages.insert(stderr);
    }
    let rules: std::collections::HashSet<&str> = table.iter().map(|(_, _, e)| *e).collect();
    assert_eq!(
        messages.len(),
        rules.len(),
        "two rules share an error message"
    );
}

#[test]
fn clap_usage_errors_also_exit_2() {
    for args in [
        &["--numa", "1", "--no-numa"][..],
        &["--memory", "lots"],
        &["--numa", "x"],
        &["--bogus"],
    ] {
        let (code, _, stderr) = headroom(ONE, args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
    }
}

/// One region row of a plan: (reservation, order, node, locality, bytes, blocks).
type Row = (String, usize, String, String, String, u32);

/// The region rows of a plan.
fn rows(plan: &str) -> Vec<Row> {
    plan.lines()
        .filter(|line| {
            line.starts_with("shared") || line.starts_with("heads") || line.starts_with("small")
        })
        .map(|line| {
            let w: Vec<&str> = line.split_whitespace().collect();
            (
                w[0].into(),
                w[1].parse().unwrap(),
                w[2].into(),
                w[3].into(),
                format!("{} {}", w[4], w[5]),
                w[6].parse().unwrap(),
            )
        })
        .collect()
}

fn row(res: &str, order: usize, node: &str, locality: &str, bytes: &str, blocks: u32) -> Row {
    (
        res.into(),
        order,
        node.into(),
        locality.into(),
        bytes.into(),
        blocks,
    )
}

#[test]
fn every_valid_combination_prints_its_plan() {
    let table: Vec<(&str, Vec<&str>, Vec<Row>)> = vec![
        (
            ONE,
            vec![],
            vec![row("shared", 0, "0", "local", "64 MiB", 32)],
        ),
        (
            ONE,
            vec!["--no-numa", "--memory", "8M"],
            vec![row("shared", 0, "any", "unbound", "8 MiB", 4)],
        ),
        (
            ONE,
            vec![
                "--numa",
                "0",
                "--memory",
                "1G",
                "--block",
                "4M",
                "--ram-head",
                "4M",
            ],
            vec![row("shared", 0, "0", "local", "1 GiB", 256)],
        ),
        (
            TWO,
            vec!["--numa", "1", "--memory", "16M", "--sub-memory", "8M"],
            vec![
                row("shared", 0, "1", "local", "16 MiB", 8),
                row("shared", 1, "0", "foreign", "8 MiB", 4),
            ],
        ),
        (
            TWO,
            vec!["--numa", "0", "--memory", "16M", "--small-memory", "4M"],
            vec![
                row("heads", 0, "0", "local", "16 MiB", 8),
                row("small", 0, "0", "local", "4 MiB", 2),
            ],
        ),
        (
            TWO,
            vec![
                "--numa",
                "0",
                "--memory",
                "16M",
                "--sub-memory",
                "4M",
                "--small-memory",
                "4M",
                "--small-sub-memory",
                "2M",
            ],
            vec![
                row("heads", 0, "0", "local", "16 MiB", 8),
                row("heads", 1, "1", "foreign", "4 MiB", 2),
                row("small", 0, "0", "local", "4 MiB", 2),
                row("small", 1, "1", "foreign", "2 MiB", 1),
            ],
        ),
        // Perverse: the preferred region moves to the farthest node and stays first.
        (
            TWO,
            vec!["--numa", "0", "--memory", "16M", "--perverse"],
            vec![row("shared", 0, "1", "foreign", "16 MiB", 8)],
        ),
        (
            THREE,
            vec![
                "--numa",
                "0",
                "--memory",
                "16M",
                "--sub-memory",
                "2M",
                "--perverse",
            ],
            vec![
                row("shared", 0, "2", "foreign", "16 MiB", 8),
                row("shared", 1, "0", "local", "2 MiB", 1),
                row("shared", 2, "1", "foreign", "2 MiB", 1),
            ],
        ),
        (
            THREE,
            vec![
                "--numa",
                "0",
                "--memory",
                "8M",
                "--small-memory",
                "4M",
                "--small-sub-memory",
                "2M",
                "--perverse",
            ],
            vec![
                row("heads", 0, "2", "foreign", "8 MiB", 4),
                row("small", 0, "2", "foreign", "4 MiB", 2),
                row("small", 1, "0", "local", "2 MiB", 1),
                row("small", 2, "1", "foreign", "2 MiB", 1),
            ],
        ),
        // Sub-memory goes to every other node, nearest first.
        (
            THREE,
            vec!["--numa", "2", "--memory", "4M", "--sub-memory", "2M"],
            vec![
                row("shared", 0, "2", "local", "4 MiB", 2),
                row("shared", 1, "1", "foreign", "2 MiB", 1),
                row("shared", 2, "0", "foreign", "2 MiB", 1),
            ],
        ),
        // --numa auto follows the NIC that holds the listen address.
        (
            THREE,
            vec!["--listen", "10.0.2.7:11211", "--memory", "4M"],
            vec![row("shared", 0, "2", "local", "4 MiB", 2)],
        ),
        (
            THREE,
            vec!["--listen", "127.0.0.1:11211", "--memory", "4M"],
            vec![row("shared", 0, "0", "local", "4 MiB", 2)],
        ),
        // The file supplies settings; the command line wins.
        (
            TWO,
            vec!["--config", "config/headroom.example.toml"],
            vec![
                row("shared", 0, "0", "local", "256 MiB", 128),
                row("shared", 1, "1", "foreign", "64 MiB", 32),
            ],
        ),
        (
            TWO,
            vec!["--config", "config/headroom.example.toml", "--memory", "8M"],
            vec![
                row("shared", 0, "0", "local", "8 MiB", 4),
                row("shared", 1, "1", "foreign", "64 MiB", 32),
            ],
        ),
    ];
    for (topology, mut args, expected) in table {
        args.push("--dry-run");
        let (code, stdout, stderr) = headroom(topology, &args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert_eq!(rows(&stdout), expected, "{args:?}:\n{stdout}");
        assert!(stdout.contains("backing to attempt"), "{stdout}");
    }
}

#[test]
fn dry_run_reports_the_hugetlb_outlook() {
    let (_, stdout, _) = headroom(
        THREE,
        &[
            "--numa",
            "0",
            "--memory",
            "64M",
            "--sub-memory",
            "16M",
            "--dry-run",
        ],
    );
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("shared")).collect();
    assert!(lines[0].contains("(32 needed, 64 free)"), "{}", lines[0]);
    assert!(lines[1].contains("(8 needed, 8 free)"), "{}", lines[1]);
    assert!(
        lines[2].contains("(8 needed, 0 free; short, so expect the fallback)"),
        "{}",
        lines[2]
    );
}
