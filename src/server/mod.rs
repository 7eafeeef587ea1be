//! The server: one glommio executor per serving CPU (a shard: its listener, connections, ring
//! and block batch), the key space in partitions any shard serves under a short lock, and a
//! placement master; a channel mesh joins them for the control plane only. See
//! `docs/server.md`.
//!
//! Start-up takes what can be refused cheaply first: the data directory's lock, the listening
//! sockets, the admin socket and the password file; only then is the arena mapped and are the
//! segments mounted, so a server that cannot serve never maps anything.
//!
//! Its layers, top first: a file imports only its own folder and the layers below it, and no
//! two files of a folder import each other (`tests/layering.rs` checks both;
//! `docs/architecture.md` says what each file owns). This file, the top, starts them.
//!
//! | layer | owns |
//! | --- | --- |
//! | [`net`] | connections: accept, the shell, the codecs, TLS sessions |
//! | [`ops`] | STAT, metrics, the warm restart, the placement master, the admin socket |
//! | [`exec`] | running commands against the store, large values streamed |
//! | [`shard`] | what every task of a shard shares, and the leaf services it holds |

pub mod exec;
pub mod net;
pub mod ops;
pub mod shard;

// What the binary, the benchmarks and the tests use by these names.
pub use net::lookahead;
pub use ops::metrics;
pub use shard::{data_dir, latency, listen, user};

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glommio::channels::channel_mesh::MeshBuilder;
use glommio::{CpuSet, LocalExecutorBuilder, Placement};

use crate::arena::{Arena, MemoryPlan};
use crate::config::{self, Settings};
use crate::store::{KeyHasher, StoreConfig};
use crate::topology::Topology;

use crate::placement::Placer;
use crate::segment::mount_all;

use net::tasks;
use ops::{admin, master, warm};
use shard::ctx::{self as shard_ctx, Message, ShardCtx};
use shard::shared::{random_seed, Shared, STOP_WRITE_GRACE};
use shard::{auth, tls_config, unix_socket, warm_report, watch, wire};

/// Messages a mesh channel holds before a sender waits.
const MESH_CHANNEL_MESSAGES: usize = 1024;
/// io_uring memory glommio preallocates per executor (its minimum: we do no DMA through it).
const EXECUTOR_IO_MEMORY_BYTES: usize = 64 << 10;
/// How long start-up waits for every shard to report ready before it logs which have not (a
/// large warm restore can take longer; it keeps waiting either way).
const START_UP_PATIENCE: Duration = Duration::from_secs(10);
/// This machine, as a failure domain (peers come with multi-host deployments).
const LOCAL_HOST: crate::segment::HostId = 0;

#[derive(Debug)]
pub enum ServerError {
    DataDir(String),
    /// `--user`/`--allow-root`: who may run it (an invalid configuration, exit 2).
    User(String),
    /// Dropping to `--user` failed (setgroups, setgid or setuid refused; the log file could
    /// not be handed over): a runtime failure, exit 1.
    Drop(String),
    Bind(listen::BindError),
    Admin(String),
    /// `--unix-socket` cannot be taken.
    UnixSocket(String),
    /// `--tls-cert`, `--tls-key` or `--tls-ca` do not load.
    Tls(String),
    Credentials(String),
    /// `--metrics-listen` cannot be bound.
    Metrics(String),
    Map(crate::arena::MapError),
    Mount(crate::segment::MountFailure),
    Executor(String),
    /// A shard stopped before it served (its reason is in the log).
    Shard(String),
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerError::DataDir(reason)
            | ServerError::User(reason)
            | ServerError::Drop(reason)
            | ServerError::Admin(reason)
            | ServerError::UnixSocket(reason)
            | ServerError::Tls(reason)
            | ServerError::Credentials(reason)
            | ServerError::Metrics(reason) => write!(f, "{reason}"),
            ServerError::Bind(err) => write!(f, "{err}"),
            ServerError::Map(err) => write!(f, "{err}"),
            ServerError::Mount(err) => write!(f, "{err}"),
            ServerError::Executor(reason) => write!(f, "cannot start a shard: {reason}"),
            ServerError::Shard(reason) => write!(f, "a shard stopped during start-up: {reason}"),
        }
    }
}

impl std::error::Error for ServerError {}

/// A running server: its addresses and a handle to stop it.
pub struct Running {
    /// The TCP addresses it serves (empty: only a unix socket), each with its port resolved.
    pub addrs: Vec<SocketAddr>,
    /// The metrics endpoint's address (`--metrics-listen`), when it has one.
    pub metrics_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    handles: Vec<glommio::ExecutorJoinHandle<()>>,
}

impl Running {
    /// TLS on `--listen`, for SIGHUP to reload.
    pub fn tls(&self) -> Option<Arc<tls_config::Tls>> {
        self.shared.tls.clone()
    }

    /// Stops accepting, lets in-flight requests finish, and waits for every shard to exit.
    /// An error says what of the warm-restart snapshot was not written (nothing of it will
    /// be restored): the stop was not clean.
    pub fn stop(self) -> Result<(), String> {
        self.shared.stop.store(true, Ordering::Release);
        for bell in &self.shared.doorbells[..self.shared.settings.cpus.len()] {
            bell.ring();
        }
        for handle in self.handles {
            let _ = handle.join();
        }
        tracing::info!("stopped");
        let failures = self
            .shared
            .snapshot_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match failures.is_empty() {
            true => Ok(()),
            false => Err(format!(
                "the warm-restart snapshot was not written, so nothing of it will be restored: {}",
                failures.join("; ")
            )),
        }
    }
}

/// Takes the data directory, the listeners, the admin socket and the credentials, then maps
/// the arena, mounts the segments, starts one shard per CPU of `settings.cpus` and the
/// placement master, and returns once every shard serves.
pub fn start(settings: Settings, topology: &Topology) -> Result<Running, ServerError> {
    let shards = settings.cpus.len();
    let privileges =
        user::plan(settings.user.as_deref(), settings.allow_root).map_err(ServerError::User)?;
    let data_dir = data_dir::DataDir::take(&settings.data_dir, privileges.run_as())
        .map(Arc::new)
        .map_err(ServerError::DataDir)?;
    shard::open_files::raise_for(settings.max_connections);
    let listen_addrs: Vec<SocketAddr> = settings.listen.iter().map(|l| l.addr).collect();
    let listeners = listen::bind_all(&listen_addrs, shards).map_err(ServerError::Bind)?;
    let addrs: Vec<SocketAddr> = listeners.iter().map(|l| l.addr).collect();
    // Shard i takes the i-th socket of every address.
    let mut by_shard: Vec<Vec<std::net::TcpListener>> = (0..shards).map(|_| Vec::new()).collect();
    for address in listeners {
        for (shard, socket) in address.sockets.into_iter().enumerate() {
            by_shard[shard].push(socket);
        }
    }
    // Bound now, as the ports are, so a server that drops root still binds where only root
    // may write; shard 0 serves it.
    let mut admin_listener = match &settings.admin_socket {
        Some(path) => {
            unix_socket::prepare("--admin-socket", path).map_err(ServerError::Admin)?;
            let mode = admin::ADMIN_SOCKET_MODE;
            let bound = unix_socket::bind("--admin-socket", path, mode, privileges.run_as());
            Some(bound.map_err(ServerError::Admin)?)
        }
        None => None,
    };
    let mut unix_listener = match &settings.unix_socket {
        Some(path) => {
            let flag = "--unix-socket";
            unix_socket::prepare(flag, path).map_err(ServerError::UnixSocket)?;
            let mode = settings.unix_socket_mode;
            let bound = unix_socket::bind(flag, path, mode, privileges.run_as());
            Some(bound.map_err(ServerError::UnixSocket)?)
        }
        None => None,
    };
    // Loaded as root (before `--user`): SIGHUP reloads as the user, who must be able to read
    // the files then.
    let tls = match &settings.tls {
        Some(files) => {
            let timeout = Duration::from_secs(settings.tls_handshake_timeout_seconds);
            let policies: Vec<config::ClientCerts> = settings
                .listen
                .iter()
                .filter_map(|l| match l.tls {
                    config::ListenerTls::On(policy) => Some(policy),
                    config::ListenerTls::Off => None,
                })
                .collect();
            let tls = tls_config::Tls::load(files.clone(), &policies, timeout)
                .map_err(ServerError::Tls)?;
            tracing::info!(
                cert = %files.cert.display(),
                client_certificates = files.ca.is_some(),
                session_resumption = files.session_resumption,
                write_buffer_bytes = files.write_buffer_bytes,
                kernel_tls = tls_config::kernel_tls_offered(),
                "TLS on --listen, in user space: each connection opens and seals its records on its own socket (ssl_kernel_tls no; docs/server.md)"
            );
            if files.ca.is_none() {
                let required = config::ListenerTls::On(config::ClientCerts::Required);
                for listen in settings.listen.iter().filter(|l| l.tls == required) {
                    tracing::warn!(
                        addr = %listen.addr,
                        "mtls:{} requires a client certificate and there is no --tls-ca to verify one against: every client of this address is refused (as memcached does without ssl_ca_cert)",
                        listen.addr
                    );
                }
            }
            Some(Arc::new(tls))
        }
        None => None,
    };
    let credentials = match &settings.sasl_password_file {
        Some(path) => Some(auth::Credentials::read(path).map_err(ServerError::Credentials)?),
        None => None,
    };
    let metrics = match settings.metrics_listen {
        Some(addr) => Some(metrics::bind(addr).map_err(ServerError::Metrics)?),
        None => None,
    };
    let metrics_addr = metrics.as_ref().and_then(|l| l.local_addr().ok());
    if let Some(addr) = metrics_addr {
        tracing::info!(%addr, "metrics on http://{addr}/metrics (and /health)");
    }
    let plan = MemoryPlan::new(&settings.arena, topology);
    let arena = Arena::map_for_serving(plan, topology, shards).map_err(ServerError::Map)?;
    let origin = crate::segment::MountOrigin::CommandLine {
        data_dir: Arc::clone(&data_dir.dir),
    };
    let held = master::memory_held(&arena, topology, std::iter::empty());
    let targets = mount_all(&settings.segments, topology, LOCAL_HOST, &origin, &held)
        .map_err(ServerError::Mount)?;
    let mut placer = Placer::new(LOCAL_HOST, settings.placement_policy, random_seed());
    for target in &targets {
        placer.mount(target.spec.clone()).map_err(|err| {
            ServerError::Mount(crate::segment::MountFailure {
                segment: target.spec.name.clone(),
                reason: err.to_string(),
            })
        })?;
        tracing::info!(
            segment = %target.spec.name,
            kind = ?target.spec.kind,
            bytes = target.spec.size,
            node = %target.spec.locality.map_or("unknown".to_string(), |n| n.to_string()),
            "segment mounted"
        );
    }
    let doorbells = (0..=shards)
        .map(|_| crate::ring::Doorbell::new())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| ServerError::Executor(format!("eventfd: {err}")))?;
    let count = settings
        .partitions
        .unwrap_or_else(|| crate::store::partition::default_count_for(shards, arena.plan()));
    let seed = match warm::kept_seed(&data_dir.dir, settings.warm_restart) {
        Some(seed) => {
            tracing::info!("key hash seed kept from the warm-restart snapshot");
            seed
        }
        None => random_seed(),
    };
    let partitions = crate::store::partition::Partitions::new(
        &arena,
        KeyHasher::with_seed(seed),
        count,
        |index| StoreConfig {
            max_item_bytes: settings.max_item_bytes,
            partition: index,
            partitions: count,
            promotion_half_life_seconds: settings.promotion_half_life_seconds,
            evictions: settings.evictions,
        },
    );
    tracing::info!(
        partitions = partitions.len(),
        shards,
        "key space partitioned"
    );
    // Everything that needs root is held: drop it before any executor thread starts.
    if let user::Privileges::DropTo(user) = &privileges {
        data_dir.hand_to(privileges.run_as()).map_err(|err| {
            ServerError::DataDir(format!(
                "--data-dir {}: cannot hand it to --user {}: {err}",
                settings.data_dir.display(),
                user.name
            ))
        })?;
        user::drop_to(user, settings.log_file.as_deref()).map_err(ServerError::Drop)?;
    }
    let shared = Arc::new(Shared {
        partitions,
        restore_done: std::sync::Barrier::new(shards),
        version: crate::proto::MEMCACHED_VERSION.to_string(),
        started: Instant::now(),
        serving: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        doorbells,
        credentials,
        auth_gate: Default::default(),
        tls,
        listen_addrs: addrs.clone(),
        curr_connections: AtomicUsize::new(0),
        watchers: watch::Watchers::default(),
        connections_by_shard: (0..shards).map(|_| AtomicUsize::new(0)).collect(),
        total_connections: AtomicU64::new(0),
        rejected_connections: AtomicU64::new(0),
        drained: AtomicUsize::new(0),
        finished: AtomicUsize::new(0),
        restored: AtomicUsize::new(0),
        snapshot_written: AtomicUsize::new(0),
        snapshot_failures: std::sync::Mutex::new(Vec::new()),
        warm_restart: warm_report::WarmRestartFigures::default(),
        io_fallback_said: std::sync::atomic::AtomicBool::new(false),
        multishot_fallback_said: std::sync::atomic::AtomicBool::new(false),
        crawler_enabled: AtomicBool::new(settings.lru_crawler),
        targets,
        topology: topology.clone(),
        peers: Mutex::new((vec![None; shards], None)),
        joined: std::sync::Barrier::new(shards + 1),
        data_dir,
        arena,
        settings,
    });
    // Every shard and the placement master are peers of one mesh.
    let mesh = MeshBuilder::<Message, _>::full(shards + 1, MESH_CHANNEL_MESSAGES);
    let master = {
        let shared = Arc::clone(&shared);
        let mesh = mesh.clone();
        LocalExecutorBuilder::new(Placement::Unbound)
            .name("placement")
            .io_memory(EXECUTOR_IO_MEMORY_BYTES)
            .spawn(move || master::master_main(shared, mesh, placer, metrics))
            .map_err(|err| ServerError::Executor(format!("placement master: {err}")))?
    };
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<(usize, Result<(), String>)>();
    let mut handles = Vec::with_capacity(shards + 1);
    // `--pin-shards node`: every shard fenced into the shards' CPUs (the serving node's), so
    // the scheduler may run a woken shard on whichever of them is idle.
    let node_fence = if shared.settings.pin_shards_to_node {
        let cpus = &shared.settings.cpus;
        let online = CpuSet::online()
            .map_err(|err| ServerError::Executor(format!("the online CPUs: {err}")))?;
        Some(online.filter(|location| cpus.contains(&location.cpu)))
    } else {
        None
    };
    for ((index, &cpu), listener) in shared.settings.cpus.iter().enumerate().zip(by_shard) {
        let shared = Arc::clone(&shared);
        let mesh = mesh.clone();
        let ready = ready_tx.clone();
        let (admin, unix) = if index == 0 {
            (admin_listener.take(), unix_listener.take())
        } else {
            (None, None)
        };
        let placement = match &node_fence {
            Some(node_cpus) => Placement::Fenced(node_cpus.clone()),
            None => Placement::Fixed(cpu),
        };
        let mut builder = LocalExecutorBuilder::new(placement)
            .name(&format!("shard-{index}"))
            .io_memory(EXECUTOR_IO_MEMORY_BYTES);
        let spin = shared.settings.spin_before_park_micros;
        if spin > 0 {
            builder = builder.spin_before_park(Duration::from_micros(spin));
        }
        let handle = builder
            .spawn(move || {
                let listeners = ShardListeners {
                    tcp: listener,
                    unix,
                    admin,
                };
                shard_main(index, shared, mesh, listeners, ready)
            })
            .map_err(|err| ServerError::Executor(format!("CPU {cpu}: {err}")))?;
        handles.push(handle);
    }
    handles.push(master);
    drop(ready_tx);
    let mut ready = vec![false; shards];
    let start_wait = Instant::now();
    let mut said_slow = false;
    while ready.iter().any(|r| !r) {
        let report = match ready_rx.recv_timeout(START_UP_PATIENCE) {
            Ok((index, report)) => {
                ready[index] = true;
                report
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // A start-up that hangs says where instead of staying silent.
                if !said_slow {
                    said_slow = true;
                    let waiting: Vec<usize> = (0..shards).filter(|&i| !ready[i]).collect();
                    tracing::warn!(
                        ?waiting,
                        waited_s = start_wait.elapsed().as_secs(),
                        "start-up is slow: these shards have not finished joining their peers, \
                         restoring and setting up their data path; still waiting"
                    );
                }
                continue;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err("a shard stopped before it listened".to_string())
            }
        };
        if let Err(reason) = report {
            let running = Running {
                addrs,
                metrics_addr,
                shared,
                handles,
            };
            // A start that failed writes no snapshot worth reporting.
            let _ = running.stop();
            return Err(ServerError::Shard(reason));
        }
    }
    shared.serving.store(true, Ordering::Release);
    let pin_shards = shared.settings.pin_shards();
    let listening = match addrs.is_empty() {
        true => "no TCP address (the unix socket only)".to_string(),
        false => addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    };
    tracing::info!(
        addr = %listening,
        shards,
        cpus = ?shared.settings.cpus,
        pin_shards,
        "listening on {listening}"
    );
    Ok(Running {
        addrs,
        metrics_addr,
        shared,
        handles,
    })
}

/// The sockets a shard accepts on: its socket of each `--listen` address, and for shard 0 the
/// unix and admin sockets.
struct ShardListeners {
    tcp: Vec<std::net::TcpListener>,
    unix: Option<std::os::unix::net::UnixListener>,
    admin: Option<std::os::unix::net::UnixListener>,
}

async fn shard_main(
    index: usize,
    shared: Arc<Shared>,
    mesh: MeshBuilder<Message, glommio::channels::channel_mesh::Full>,
    listeners: ShardListeners,
    ready: std::sync::mpsc::Sender<(usize, Result<(), String>)>,
) {
    let ShardListeners { tcp, unix, admin } = listeners;
    let (senders, receivers) = mesh.join().await.expect("the mesh forms");
    let peers = shared.register_shard(index, senders.peer_id());
    let id = index;
    let tcp: Vec<_> = tcp.into_iter().map(listen::into_glommio).collect();
    crate::arena::batch::install_core_batch();
    let io = wire::ShardIo::setup(&shared, id);
    if let Some(ring) = &io.ring {
        ring.watch_receives(Box::new(lookahead::ReceiveLookahead::new(Arc::clone(
            &shared,
        ))));
    }
    let ctx = Rc::new(ShardCtx::new(id, Arc::clone(&shared), senders, peers, io));
    tasks::spawn_receivers(&ctx, receivers);
    warm::restore(&ctx).await;
    // Only the master answers during restores, so blocking this thread here is safe.
    shared.restore_done.wait();
    // Shard 0 also serves the admin socket, bound before the privileges were dropped.
    let admin = admin.map(admin::into_glommio);
    let _ = ready.send((index, Ok(())));
    drop(ready);

    // Turns the process-wide stop (a ring of this shard's doorbell) into its stop event.
    let watcher = {
        let ctx = Rc::clone(&ctx);
        glommio::spawn_local(async move {
            while !ctx.shared.stop.load(Ordering::Acquire) {
                if let Err(err) = ctx.shared.doorbells[ctx.id].wait().await {
                    tracing::error!(%err, "waiting for the stop doorbell failed; polling instead");
                    glommio::timer::sleep(Duration::from_millis(20)).await;
                }
            }
            ctx.stop.fire();
            shard_ctx::shut_connections(&ctx, nix::sys::socket::Shutdown::Read);
        })
    };
    let admin =
        admin.map(|listener| glommio::spawn_local(admin::serve_socket(Rc::clone(&ctx), listener)));
    // Shard 0 accepts the unix socket's clients (and hands some to the others, as any shard
    // does); the path goes when it stops accepting.
    let unix = unix
        .zip(shared.settings.unix_socket.clone())
        .map(|(listener, path)| {
            let listener = listen::stream_listener(listener.into());
            let listening = tasks::Listening::Unix(path.clone());
            let accept = tasks::accept_loop(Rc::clone(&ctx), listener, listening);
            glommio::spawn_local(async move {
                accept.await;
                let _ = std::fs::remove_file(&path);
            })
        });
    let sweeper = glommio::spawn_local(tasks::sweep_loop(Rc::clone(&ctx)));
    let promoter = glommio::spawn_local(tasks::promotion_loop(Rc::clone(&ctx)));
    // A shard's sockets are in `--listen`'s order.
    let accepts: Vec<_> = tcp
        .into_iter()
        .zip(shared.settings.listen.iter().map(|l| l.tls))
        .map(|(listener, tls)| {
            let listening = tasks::Listening::Tcp(tls);
            glommio::spawn_local(tasks::accept_loop(Rc::clone(&ctx), listener, listening))
        })
        .collect();
    for accept in accepts {
        accept.await;
    }
    watcher.await;
    if let Some(admin) = admin {
        admin.await;
    }
    if let Some(unix) = unix {
        unix.await;
    }
    sweeper.await;
    promoter.await;
    // Let this shard's connections finish their in-flight requests and write their replies;
    // one still writing after the grace (a peer that does not read) is cut off.
    let stopping = Instant::now();
    let mut cut_off = false;
    while ctx.live_connections.get() > 0 {
        if !cut_off && stopping.elapsed() >= STOP_WRITE_GRACE {
            cut_off = true;
            let writing = shard_ctx::shut_connections(&ctx, nix::sys::socket::Shutdown::Both);
            if writing > 0 {
                tracing::info!(
                    shard = id,
                    writing,
                    "connections still writing {STOP_WRITE_GRACE:?} after the stop are cut off"
                );
            }
        }
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    // Keep answering other shards until every shard's connections are done.
    shared.drained.fetch_add(1, Ordering::AcqRel);
    while shared.drained.load(Ordering::Acquire) < ctx.shards {
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
    // The parts are written before the ring stops: the RAM part leaves through it.
    if shared.settings.warm_restart {
        warm::write_parts(&ctx).await;
    }
    ctx.io.close(&shared).await;
    // Extents freed by the last requests reach the master before it stops.
    let mut frees = Vec::new();
    for index in shared.partitions.owned_by(id, ctx.shards) {
        let mut store = shared.partitions.lock(index);
        frees.extend(store.take_pending_frees());
        store.arena_mut().return_idle_blocks();
    }
    if !frees.is_empty() {
        ctx.call_master(shard_ctx::ShardRequest::Free(frees)).await;
    }
    crate::arena::batch::retire_core_batch(shared.arena.pool());
    shared.finished.fetch_add(1, Ordering::AcqRel);
    shared.doorbells[ctx.shards].ring();
}
