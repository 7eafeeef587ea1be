//! headroom-man: writes the `headroom(1)` man page, generated from the server's own command-line
//! definition (`headroom::config::Cli`), so the page lists exactly the flags the binary takes.
//!
//! `headroom-man [DIR]` writes `DIR/headroom.1` (DIR defaults to the working directory);
//! `headroom-man -` writes the page to stdout. Read it with `man -l headroom.1`; install it with
//! `install -m 644 headroom.1 /usr/local/share/man/man1/`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::CommandFactory;
use clap_mangen::roff::{bold, italic, line_break, roman, Roff};
use clap_mangen::Man;

use headroom::config::Cli;

/// Sections the flag list cannot tell: notes (the `--help` epilogue), exit status,
/// environment, signals, files.
fn more_sections(roff: &mut Roff, after_help: Option<String>) {
    if let Some(text) = after_help {
        roff.control("SH", ["NOTES"]);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            roff.text([roman(line), line_break()]);
        }
    }

    roff.control("SH", ["EXIT STATUS"]);
    for (code, meaning) in [
        (
            "0",
            "success, --dry-run, a graceful stop, or a stop signal during start-up",
        ),
        (
            "1",
            "runtime failure: topology unreadable, data directory or address taken, memory that cannot be locked or mapped, a segment that cannot be mounted",
        ),
        (
            "2",
            "invalid configuration or usage; stderr has one sentence naming the flag and the rule",
        ),
    ] {
        roff.control("TP", []).text([bold(code)]).text([roman(meaning)]);
    }

    roff.control("SH", ["ENVIRONMENT"]);
    roff.control("TP", []).text([bold("STATE_DIRECTORY")]).text([roman(
        "The default --data-dir when set (systemd sets it for a unit with StateDirectory=; the first path when there are several). Without it and without --data-dir the data directory is ./data.",
    )]);
    roff.control("TP", [])
        .text([bold("HEADROOM_TOPOLOGY")])
        .text([roman(
            "A synthetic NUMA topology file to plan against instead of sysfs (docs/topology.md).",
        )]);

    roff.control("SH", ["SIGNALS"]);
    for (signal, meaning) in [
        (
            "SIGTERM, SIGINT, SIGUSR1",
            "Stop gracefully: no new connections, in-flight requests finish, the warm-restart snapshot is written to the data directory, exit 0. A second one while stopping exits at once (status 1, no snapshot). During start-up they exit at once.",
        ),
        (
            "SIGHUP",
            "Reopen --log-file (after log rotation moved it away); never stops the server.",
        ),
    ] {
        roff.control("TP", []).text([bold(signal)]).text([roman(meaning)]);
    }

    roff.control("SH", ["FILES"]);
    for (file, meaning) in [
        (
            "DATA_DIR/headroom.lock",
            "Locks the data directory for the life of the process (holds its pid).",
        ),
        (
            "DATA_DIR/segment-0",
            "The default file segment (a 1 GiB sparse file) when no --segment is given.",
        ),
        (
            "DATA_DIR/snapshot",
            "The warm-restart snapshot written on a graceful stop and read at the next start.",
        ),
    ] {
        roff.control("TP", [])
            .text([italic(file)])
            .text([roman(meaning)]);
    }

    roff.control("SH", ["SEE ALSO"]);
    roff.text([
        bold("headroom-bench --help"),
        roman(" (load, side by side with memcached, placement replay), "),
        bold("systemd.exec"),
        roman("(5), "),
        bold("memcached"),
        roman("(1). The source tree's docs/configuration.md, docs/protocol.md and contrib/headroom.service."),
    ]);
}

fn render() -> std::io::Result<Vec<u8>> {
    let mut cmd = Cli::command();
    cmd.build();
    let man = Man::new(cmd.clone()).manual("Headroom manual");
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    let mut roff = Roff::new();
    more_sections(&mut roff, cmd.get_after_help().map(|h| h.to_string()));
    roff.to_writer(&mut out)?;
    man.render_version_section(&mut out)?;
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") || args.len() > 1 {
        eprintln!("usage: headroom-man [DIR | -]   writes DIR/headroom.1 (default: .), or the page to stdout with -");
        return ExitCode::from(if args.len() > 1 { 2 } else { 0 });
    }
    let page = match render() {
        Ok(page) => page,
        Err(err) => {
            eprintln!("headroom-man: {err}");
            return ExitCode::from(1);
        }
    };
    if args.first().is_some_and(|a| a == "-") {
        return match std::io::stdout().write_all(&page) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("headroom-man: {err}");
                ExitCode::from(1)
            }
        };
    }
    let dir = PathBuf::from(args.first().map_or(".", String::as_str));
    let path = dir.join("headroom.1");
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &page)) {
        Ok(()) => {
            println!("wrote {}", path.display());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("headroom-man: {}: {err}", path.display());
            ExitCode::from(1)
        }
    }
}
