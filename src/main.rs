//! The `headroom` binary: read the configuration, plan and map the arena, serve until
//! SIGINT or SIGTERM.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use headroom::arena::MemoryPlan;
use headroom::config::{self, Cli, CONFIG_ERROR_EXIT};
use headroom::server;
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

/// Blocks SIGINT and SIGTERM in this thread (and so in every thread it starts), so they
/// arrive only where `wait_for_stop_signal` waits for them.
fn block_stop_signals() -> Result<nix::sys::signal::SigSet, nix::Error> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()?;
    Ok(set)
}

/// A panic is a bug; a shard that died would leave its peers waiting for it forever. Report it
/// and stop the whole process instead of serving half-alive.
fn abort_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        eprintln!(
            "headroom: internal error (a bug): aborting rather than serving with a dead shard"
        );
        std::process::abort();
    }));
}

fn main() -> ExitCode {
    abort_on_panic();
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
    let signals = match block_stop_signals() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("headroom: cannot block SIGINT/SIGTERM: {err}");
            return ExitCode::from(1);
        }
    };
    let running = match server::start(settings, &topology) {
        Ok(running) => running,
        Err(err) => {
            eprintln!("headroom: {err}");
            return ExitCode::from(1);
        }
    };
    match signals.wait() {
        Ok(signal) => {
            tracing::info!(%signal, "stopping: no new connections, finishing in-flight requests")
        }
        Err(err) => tracing::error!(%err, "waiting for a stop signal failed; stopping"),
    }
    running.stop();
    ExitCode::SUCCESS
}
