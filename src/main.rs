//! The `headroom` binary: read the configuration, plan and map the arena.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use headroom::arena::{Arena, MemoryPlan};
use headroom::config::{self, Cli, CONFIG_ERROR_EXIT};
use headroom::topology::Topology;

fn init_logging(filter: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(filter)
        .map_err(|err| format!("--log-level {filter}: not a log filter ({err})"))?;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    Ok(())
}

/// Blocks until SIGINT or SIGTERM arrives.
fn wait_for_stop_signal() -> Result<(), nix::Error> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()?;
    let signal = set.wait()?;
    tracing::info!(%signal, "stopping");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let topology = match Topology::load() {
        Ok(topology) => topology,
        Err(err) => {
            eprintln!("headroom: {err}");
            return ExitCode::from(1);
        }
    };
    let settings = match config::resolve(&cli, &topology) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("headroom: {err}");
            return ExitCode::from(CONFIG_ERROR_EXIT as u8);
        }
    };
    if let Err(err) = init_logging(&settings.log_level) {
        eprintln!("headroom: {err}");
        return ExitCode::from(CONFIG_ERROR_EXIT as u8);
    }
    let plan = MemoryPlan::new(&settings.arena, &topology);
    if settings.dry_run {
        print!("{}", plan.render());
        return ExitCode::SUCCESS;
    }
    tracing::info!(topology = %topology.source(), "{}", settings.numa_reason);
    let shards = 1;
    let arena = match Arena::map_for_serving(plan, &topology, shards) {
        Ok(arena) => arena,
        Err(err) => {
            eprintln!("headroom: {err}");
            return ExitCode::from(1);
        }
    };
    let stats = arena.stats(&[]);
    eprint!("{}", stats.render());
    tracing::info!(
        bytes = arena.plan().total_bytes(),
        "arena mapped and locked; this build has no protocol listener yet, so it holds the \
         arena until SIGINT or SIGTERM"
    );
    if let Err(err) = wait_for_stop_signal() {
        eprintln!("headroom: waiting for a stop signal failed: {err}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
