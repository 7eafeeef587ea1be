//! The client matrix: real client libraries in four languages against the real server, each
//! used as an application uses it (values from 0 B to several MiB, multi-get, compare-and-swap
//! with a stale write, incr/decr, touch, append/prepend past the 256 KiB RAM head), each from a
//! script in `tests/clients/`:
//!
//! - pylibmc (libmemcached) over the binary and the text protocol, keys spread by ketama over two
//!   servers;
//! - Django's two memcached backends (pymemcache and pylibmc underneath);
//! - memjs (npm) authenticating with SASL PLAIN;
//! - dalli (Debian's ruby-dalli), over two servers.
//!
//! pymemcache and meta-memcache are driven from `tests/text_clients.rs`. Every script passes
//! against stock memcached 1.6.45 as well (`docs/testing.md`). `scripts/install-deps` installs
//! the clients; a missing one fails its test, naming it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::server::Server;

/// What each test server is given: values up to the scripts' largest (3 MiB and a little) and a
/// segment file that holds every large value the scripts keep at once.
const SERVER_ARGS: &[&str] = &["--max-item-size", "8M", "--memory", "64M"];

fn servers_arg(servers: &[&Server]) -> String {
    let addrs: Vec<String> = servers.iter().map(|s| s.addr.to_string()).collect();
    addrs.join(",")
}

/// Items the server holds now.
fn curr_items(server: &Server) -> u64 {
    server.client().stat("", "curr_items")
}

fn python_script(module: &str, name: &str, args: &[&str]) -> Command {
    let mut command = Command::new(common::python_with(module));
    command.arg(common::client_script(name)).args(args);
    command
}

#[test]
fn pylibmc_binary_and_text_spread_over_two_servers_by_ketama() {
    for protocol in ["binary", "text"] {
        let servers = [Server::start(SERVER_ARGS), Server::start(SERVER_ARGS)];
        let list = servers_arg(&[&servers[0], &servers[1]]);
        common::run_checks(
            python_script("pylibmc", "pylibmc_app.py", &[protocol, &list]),
            30,
        );
        for (i, server) in servers.iter().enumerate() {
            assert!(
                curr_items(server) > 10,
                "{protocol}: ketama left server {i} nearly empty"
            );
        }
    }
}

#[test]
fn django_pymemcache_and_pylibmc_backends() {
    for backend in ["pymemcache", "pylibmc"] {
        let servers = [Server::start(SERVER_ARGS), Server::start(SERVER_ARGS)];
        let list = servers_arg(&[&servers[0], &servers[1]]);
        common::run_checks(
            python_script("django", "django_app.py", &[backend, &list]),
            25,
        );
    }
}

/// The npm packages' directory: `HEADROOM_NODE_MODULES`, else where `scripts/install-deps`
/// puts them.
fn node_modules() -> PathBuf {
    std::env::var_os("HEADROOM_NODE_MODULES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/headroom-node/node_modules")
        })
}

#[test]
fn memjs_authenticates_with_sasl_and_serves_as_memcached() {
    let modules = node_modules();
    assert!(
        modules.join("memjs").is_dir(),
        "memjs is not in {}: run scripts/install-deps",
        modules.display()
    );
    let dir = common::server::fresh_data_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let passwords = dir.join("passwords");
    std::fs::write(&passwords, "alice:wonderland\n").unwrap();
    let passwords = passwords.display().to_string();
    let mut args = SERVER_ARGS.to_vec();
    args.extend(["--sasl-password-file", &passwords]);
    let server = Server::start_in(&dir, &args);
    let mut command = Command::new("node");
    command
        .env("NODE_PATH", &modules)
        .arg(common::client_script("memjs_app.js"))
        .args([&server.addr.to_string(), "alice", "wonderland"]);
    common::run_checks(command, 30);
}

#[test]
fn dalli_spreads_over_two_servers() {
    let servers = [Server::start(SERVER_ARGS), Server::start(SERVER_ARGS)];
    let mut command = Command::new("ruby");
    command
        .arg(common::client_script("dalli_app.rb"))
        .arg(servers_arg(&[&servers[0], &servers[1]]));
    common::run_checks(command, 30);
}
