//! Side-by-side runs: the same load against two servers in interleaved rounds (A B A B ...),
//! so drift on a shared machine lands on both; each figure is the median of its rounds.
//! `ab` is Headroom against itself with `--perverse`; `vs` is Headroom against a peer.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::load::{self, LoadConfig, LoadReport};
use super::meta;
use super::process::{self, Target};
use super::report::{figures_of, Comparison, Figure};
use super::stats::median;

pub struct Side {
    pub name: String,
    pub target: Target,
    /// The Headroom binary the target was started from, when it was (its `--version` goes
    /// into the results).
    pub binary: Option<PathBuf>,
}

/// Runs `rounds` rounds of `cfg` against A then B. Each side is prefilled (when asked) in
/// its first round only; round `r` uses seed `cfg.seed + r` on both sides.
pub fn interleave(
    cfg: &LoadConfig,
    a: &Side,
    b: &Side,
    rounds: usize,
    notes: Vec<String>,
) -> Result<Comparison, String> {
    interleave_with(cfg, a, b, rounds, notes, false)
}

/// Headroom's STAT `arena` promotion figures: (bytes read local, foreign, exchanges).
fn arena_figures(target: &Target) -> Option<(u64, u64, u64)> {
    let mut conn =
        super::client::Conn::connect(target.addr(), std::time::Duration::from_secs(10)).ok()?;
    let stats = conn.stats("arena").ok()?;
    let get = |name: &str| -> Option<u64> { stats.iter().find(|(n, _)| n == name)?.1.parse().ok() };
    Some((
        get("head_bytes_read_local")?,
        get("head_bytes_read_foreign")?,
        get("promotion_exchanges")?,
    ))
}

/// As [`interleave`]; with `headroom_stats`, each round also records where Headroom's
/// fixed-head reads were served from and the promotion exchanges it made.
pub fn interleave_with(
    cfg: &LoadConfig,
    a: &Side,
    b: &Side,
    rounds: usize,
    notes: Vec<String>,
    headroom_stats: bool,
) -> Result<Comparison, String> {
    if rounds == 0 {
        return Err("at least one round".into());
    }
    let servers = vec![
        meta::describe("A", &a.name, &a.target, a.binary.as_deref()),
        meta::describe("B", &b.name, &b.target, b.binary.as_deref()),
    ];
    let mut results: [Vec<LoadReport>; 2] = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, side) in [a, b].iter().enumerate() {
            let mut run = cfg.clone();
            run.seed = cfg.seed + round as u64;
            run.prefill = cfg.prefill && round == 0;
            if cfg.progress {
                eprintln!("round {} of {rounds}: {}", round + 1, side.name);
            }
            let cpu = || side.target.cpu_seconds();
            let before = headroom_stats
                .then(|| arena_figures(&side.target))
                .flatten();
            let mut report = load::run(&run, side.target.addr(), &cpu)
                .map_err(|e| format!("{}: {e}", side.name))?;
            let after = headroom_stats
                .then(|| arena_figures(&side.target))
                .flatten();
            if let (Some(b0), Some(b1)) = (before, after) {
                let (local, foreign) = (b1.0 - b0.0, b1.1 - b0.1);
                report.head_reads_local_share =
                    Some(local as f64 / (local + foreign).max(1) as f64);
                report.promotion_exchanges = Some(b1.2 - b0.2);
            }
            results[i].push(report);
        }
    }
    let [a_rounds, b_rounds] = results;
    Ok(Comparison {
        a: a.name.clone(),
        b: b.name.clone(),
        rounds,
        figures: compare_figures(&a_rounds, &b_rounds),
        notes,
        a_rounds,
        b_rounds,
        servers,
    })
}

/// Per figure: the median over rounds of each side, and their ratio.
pub fn compare_figures(a: &[LoadReport], b: &[LoadReport]) -> Vec<Figure> {
    let per_round = |rs: &[LoadReport]| -> Vec<Vec<(&'static str, f64)>> {
        rs.iter().map(figures_of).collect()
    };
    let (fa, fb) = (per_round(a), per_round(b));
    let names: Vec<&str> = fa
        .first()
        .map(|f| f.iter().map(|x| x.0).collect())
        .unwrap_or_default();
    names
        .into_iter()
        .filter_map(|name| {
            let pick = |rounds: &[Vec<(&'static str, f64)>]| -> Option<f64> {
                let values: Vec<f64> = rounds
                    .iter()
                    .filter_map(|r| r.iter().find(|x| x.0 == name).map(|x| x.1))
                    .collect();
                (!values.is_empty()).then(|| median(&values))
            };
            let (va, vb) = (pick(&fa)?, pick(&fb)?);
            Some(Figure {
                name: name.to_string(),
                a: va,
                b: vb,
                ratio_b_over_a: if va == 0.0 {
                    if vb == 0.0 {
                        1.0
                    } else {
                        f64::INFINITY
                    }
                } else {
                    vb / va
                },
            })
        })
        .collect()
}

/// Whether this machine says it is virtual (timings are then not hardware figures).
pub fn hypervisor_note() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let virtual_machine = cpuinfo
        .lines()
        .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "hypervisor"));
    virtual_machine.then(|| {
        "this machine runs under a hypervisor: its timings are those of a virtual machine, not hardware figures".to_string()
    })
}

/// `args` with their `--data-dir` (given as one word or two) suffixed by `suffix`, or with
/// `--data-dir data{suffix}` added when they have none.
fn with_own_data_dir(args: &[String], suffix: &str) -> Vec<String> {
    let mut out = args.to_vec();
    let mut found = false;
    let mut i = 0;
    while i < out.len() {
        if out[i] == "--data-dir" && i + 1 < out.len() {
            out[i + 1].push_str(suffix);
            found = true;
            i += 1;
        } else if let Some(dir) = out[i].strip_prefix("--data-dir=") {
            out[i] = format!("--data-dir={dir}{suffix}");
            found = true;
        }
        i += 1;
    }
    if !found {
        out.extend(["--data-dir".to_string(), format!("data{suffix}")]);
    }
    out
}

/// The `--perverse` A/B: Headroom with `args`, then with `args --perverse`, same serving
/// CPUs. On a machine where `--perverse` cannot run, the server's own reason comes back.
/// Both servers run at once, and a server locks its data directory, so B gets its own: A's
/// `--data-dir` with `-perverse` appended (`data-perverse` when `args` name none).
pub fn ab(
    headroom: &Path,
    args: &[String],
    cfg: &LoadConfig,
    rounds: usize,
) -> Result<Comparison, String> {
    let mut perverse = with_own_data_dir(args, "-perverse");
    perverse.push("--perverse".into());
    let dry = Command::new(headroom)
        .args(&perverse)
        .arg("--dry-run")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", headroom.display()))?;
    if !dry.status.success() {
        let reason = String::from_utf8_lossy(&dry.stderr).trim().to_string();
        return Err(format!("the server refuses --perverse here: {reason}"));
    }
    let normal = process::start_headroom(headroom, args)?;
    let inverted = process::start_headroom(headroom, &perverse)?;
    let mut notes = vec![
        "A serves from memory on its own node first (local-first); B maps its preferred regions on the farthest node (--perverse); threads stay on the same CPUs".to_string(),
    ];
    notes.extend(hypervisor_note());
    notes.push("head bytes read from local blocks: the share of fixed-head bytes served from rank 0 (the preferred region: the serving node for A, the farthest node for B), with the promotion exchanges each made during the round".into());
    interleave_with(
        cfg,
        &Side {
            name: "normal".into(),
            target: Target::Started(normal),
            binary: Some(headroom.to_path_buf()),
        },
        &Side {
            name: "--perverse".into(),
            target: Target::Started(inverted),
            binary: Some(headroom.to_path_buf()),
        },
        rounds,
        notes,
        true,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_perverse_side_gets_its_own_data_dir() {
        let words = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            with_own_data_dir(&words("--memory 8M --data-dir /tmp/data --threads 1"), "-p"),
            words("--memory 8M --data-dir /tmp/data-p --threads 1")
        );
        assert_eq!(
            with_own_data_dir(&words("--data-dir=/tmp/data"), "-p"),
            words("--data-dir=/tmp/data-p")
        );
        assert_eq!(
            with_own_data_dir(&words("--memory 8M"), "-p"),
            words("--memory 8M --data-dir data-p")
        );
    }
}
