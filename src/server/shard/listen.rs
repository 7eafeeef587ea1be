//! Binding `--listen` before anything is mapped: one SO_REUSEPORT socket per shard (the kernel
//! spreads connections over them), refused outright when the address is not ours alone.
//!
//! SO_REUSEPORT lets any process of the same user join the port, and the kernel would then
//! split clients between two independent caches. So the sockets listening on the port are read
//! from `/proc/net/tcp{,6}` before and after binding: a listener that is not one of ours, on an
//! address that overlaps ours, is another server, and start-up stops with its pid and name.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Connections the kernel queues per listener before accepting.
pub const LISTEN_BACKLOG: i32 = 1024;
/// What memcached sends a connection past its limit before it closes it (memcached.c, the
/// accept past `maxconns`). It goes to binary clients too: the protocol is not known yet.
pub const TOO_MANY_CONNECTIONS: &[u8] = b"ERROR Too many open connections\r\n";
/// The most a refused connection's early bytes are read away before its close.
const REFUSED_DRAIN_MAX_BYTES: usize = 64 << 10;

/// Why `--listen` cannot be served.
#[derive(Debug)]
pub struct BindError {
    pub addr: SocketAddr,
    pub cause: BindCause,
}

#[derive(Debug)]
pub enum BindCause {
    /// Another process already serves an overlapping address (with or without SO_REUSEPORT).
    InUse {
        holder: Option<Holder>,
    },
    NotAssignable,
    PermissionDenied,
    Other(io::Error),
}

/// A process holding a socket, as /proc tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    pub name: String,
}

impl fmt::Display for BindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = self.addr;
        match &self.cause {
            BindCause::InUse {
                holder: Some(holder),
            } => write!(
                f,
                "--listen {addr}: the address is already served by {} (pid {}); stop it or choose another --listen",
                holder.name, holder.pid
            ),
            BindCause::InUse { holder: None } => write!(
                f,
                "--listen {addr}: the address is already served by another process; stop it or choose another --listen"
            ),
            BindCause::NotAssignable => write!(
                f,
                "--listen {addr}: no interface of this machine has the address {}",
                addr.ip()
            ),
            BindCause::PermissionDenied => write!(
                f,
                "--listen {addr}: permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
            ),
            BindCause::Other(err) => write!(f, "--listen {addr}: cannot listen there: {err}"),
        }
    }
}

impl std::error::Error for BindError {}

/// Listening sockets, one per shard, all on `addr`.
#[derive(Debug)]
pub struct Listeners {
    pub addr: SocketAddr,
    pub sockets: Vec<std::net::TcpListener>,
}

/// Binds `count` SO_REUSEPORT listeners on each address of `addrs` (port 0: a free port, the
/// same for all of that address's), refusing an address another process serves.
pub fn bind_all(addrs: &[SocketAddr], count: usize) -> Result<Vec<Listeners>, BindError> {
    let mut bound: Vec<Listeners> = Vec::with_capacity(addrs.len());
    for &addr in addrs {
        // Our own sockets on an overlapping address (a wildcard beside a specific one) are
        // not another server's.
        let ours: Vec<u64> = bound
            .iter()
            .flat_map(|l| l.sockets.iter().filter_map(socket_inode))
            .collect();
        bound.push(bind_address(addr, count, &ours)?);
    }
    Ok(bound)
}

/// Binds `count` SO_REUSEPORT listeners on `listen`; `ours` are sockets already bound here.
fn bind_address(listen: SocketAddr, count: usize, ours: &[u64]) -> Result<Listeners, BindError> {
    let fail = |addr: SocketAddr, cause: BindCause| BindError { addr, cause };
    if listen.port() != 0 {
        if let Some(inode) = foreign_listener(listen, ours) {
            return Err(fail(
                listen,
                BindCause::InUse {
                    holder: holder_of_socket(inode),
                },
            ));
        }
    }
    let mut sockets = Vec::with_capacity(count);
    let mut addr = listen;
    for _ in 0..count.max(1) {
        let socket = bind_one(addr).map_err(|err| fail(addr, cause_of(addr, err)))?;
        addr = socket
            .local_addr()
            .map_err(|err| fail(addr, BindCause::Other(err)))?;
        sockets.push(socket);
    }
    // Another server that joined the port meanwhile (SO_REUSEPORT lets it): refuse, and let it
    // see ours and refuse too, rather than both serving half the clients.
    let ours: Vec<u64> = sockets
        .iter()
        .filter_map(socket_inode)
        .chain(ours.iter().copied())
        .collect();
    if let Some(inode) = foreign_listener(addr, &ours) {
        return Err(fail(
            addr,
            BindCause::InUse {
                holder: holder_of_socket(inode),
            },
        ));
    }
    Ok(Listeners { addr, sockets })
}

/// Hands a bound listener to the current glommio executor (which accepts through its ring).
pub fn into_glommio(listener: std::net::TcpListener) -> glommio::net::TcpListener {
    stream_listener(listener.into())
}

/// Any listening stream socket (TCP, or a unix socket's) as a glommio TCP listener: its
/// `accept` is the plain socket call (through the ring), which serves either kind; the
/// connections it returns are served with plain socket calls too (`serve.rs`).
pub fn stream_listener(listener: std::os::fd::OwnedFd) -> glommio::net::TcpListener {
    use std::os::fd::{FromRawFd, IntoRawFd};
    // SAFETY: the descriptor is a bound, listening stream socket that nothing else owns once
    // `into_raw_fd` gave it up; the glommio listener closes it.
    unsafe { glommio::net::TcpListener::from_raw_fd(listener.into_raw_fd()) }
}

/// Refuses an accepted connection over `--max-connections` as memcached does: sends
/// [`TOO_MANY_CONNECTIONS`], then closes. The send does not wait (a fresh socket's buffer takes
/// the line whole; a peer that cannot take it gets the close alone), and whatever the peer
/// already sent is read away first, so the close is a FIN after the line, not a reset that
/// would destroy the line before the client reads it.
pub fn refuse_over_limit(stream: glommio::net::TcpStream) {
    use nix::sys::socket::{recv, send, MsgFlags};
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
    if let Err(err) = send(fd, TOO_MANY_CONNECTIONS, flags) {
        tracing::debug!(%err, "refusing a connection: the line was not sent");
    }
    let mut scratch = [0u8; 4096];
    let mut drained = 0;
    while drained < REFUSED_DRAIN_MAX_BYTES {
        match recv(fd, &mut scratch, MsgFlags::MSG_DONTWAIT) {
            Ok(n) if n > 0 => drained += n,
            _ => break,
        }
    }
    drop(stream);
}

/// Takes an accepted connection out of its glommio stream, to hand to another shard: its own
/// descriptor (a vendored glommio patch gives it up without closing it).
pub fn detach_stream(stream: glommio::net::TcpStream) -> std::os::fd::OwnedFd {
    use std::os::fd::IntoRawFd;
    // The same descriptor moves (no dup), so descriptors keep following accept order.
    let fd = stream.into_raw_fd();
    // SAFETY: the stream gave the descriptor up; nobody else owns it.
    unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }
}

/// Serves a connection handed over by [`detach_stream`] on this shard's glommio executor.
pub fn adopt_stream(fd: std::os::fd::OwnedFd) -> glommio::net::TcpStream {
    use std::os::fd::{FromRawFd, IntoRawFd};
    // SAFETY: the descriptor is owned, and its ownership passes to the stream.
    unsafe { glommio::net::TcpStream::from_raw_fd(fd.into_raw_fd()) }
}

fn bind_one(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let domain = if addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let socket = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_port(true)?;
    socket.set_cloexec(true)?;
    socket.bind(&SockAddr::from(addr))?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

fn cause_of(addr: SocketAddr, err: io::Error) -> BindCause {
    match err.raw_os_error() {
        Some(libc::EADDRINUSE) => BindCause::InUse {
            holder: foreign_listener(addr, &[]).and_then(holder_of_socket),
        },
        Some(libc::EADDRNOTAVAIL) => BindCause::NotAssignable,
        Some(libc::EACCES) | Some(libc::EPERM) => BindCause::PermissionDenied,
        _ => BindCause::Other(err),
    }
}

fn socket_inode(socket: &std::net::TcpListener) -> Option<u64> {
    nix::sys::stat::fstat(socket).ok().map(|stat| stat.st_ino)
}

/// A listening TCP socket from `/proc/net/tcp{,6}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcListener {
    pub addr: SocketAddr,
    pub inode: u64,
}

/// The inode of a listening socket, not among `ours`, whose address overlaps `addr`.
fn foreign_listener(addr: SocketAddr, ours: &[u64]) -> Option<u64> {
    // A listener no process holds belongs to a server that just died: the kernel tears its
    // io_uring rings down (and the sockets their operations hold) a few milliseconds after the
    // process is gone. A restart right after a crash waits for it rather than refusing.
    let deadline = std::time::Instant::now() + ORPHAN_LISTENER_WAIT;
    loop {
        match foreign_listener_now(addr, ours) {
            Some(inode)
                if holder_of_socket(inode).is_none() && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            found => return found,
        }
    }
}

/// How long start-up waits for a listener no process holds to go (see [`foreign_listener`]).
const ORPHAN_LISTENER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

fn foreign_listener_now(addr: SocketAddr, ours: &[u64]) -> Option<u64> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .flat_map(|text| parse_proc_net_tcp(&text))
        .find(|l| !ours.contains(&l.inode) && overlaps(l.addr, addr))
        .map(|l| l.inode)
}

/// Two listening addresses overlap when they share the port and one of them covers the other:
/// the same address, or a wildcard (an IPv6 wildcard also takes IPv4 unless V6ONLY, which
/// /proc does not tell; it is counted as overlapping).
pub fn overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() {
        return false;
    }
    let wildcard_v6 = |ip: IpAddr| ip == IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    if wildcard_v6(a.ip()) || wildcard_v6(b.ip()) {
        return true;
    }
    let (a, b) = (canonical(a.ip()), canonical(b.ip()));
    a == b || (a.is_ipv4() == b.is_ipv4() && (a.is_unspecified() || b.is_unspecified()))
}

/// IPv4-mapped IPv6 addresses as the IPv4 address they are.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// Parses the listening sockets of a `/proc/net/tcp` or `/proc/net/tcp6` table (the kernel
/// writes addresses as 32-bit words in host order, hex).
pub fn parse_proc_net_tcp(text: &str) -> Vec<ProcListener> {
    const TCP_LISTEN: &str = "0A";
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 10 || fields[3] != TCP_LISTEN {
            continue;
        }
        let (Some(addr), Ok(inode)) = (parse_hex_addr(fields[1]), fields[9].parse::<u64>()) else {
            continue;
        };
        out.push(ProcListener { addr, inode });
    }
    out
}

fn parse_hex_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(ip.get(8 * i..8 * i + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// The process holding socket `inode` (scans `/proc/*/fd`; a server of the same user, which
/// SO_REUSEPORT requires, is always visible).
pub fn holder_of_socket(inode: u64) -> Option<Holder> {
    let wanted = format!("socket:[{inode}]");
    let me = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == wanted.as_str())
        });
        if holds {
            return Some(Holder {
                pid,
                name: process_name(pid),
            });
        }
    }
    None
}

/// A process's command name (`/proc/PID/comm`), or "a process" when it cannot be read.
pub fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|name| name.trim().to_string())
        .unwrap_or_else(|_| "a process".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp_listeners_are_read() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:2BCB 00000000:0000 0A 00000000:00000000 00:00000000 00000000   104        0 31337 1 0000000000000000 100 0 0 10 0\n\
   1: 0100007F:2BCB 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000   104        0 424242 1 0000000000000000 100 0 0 10 0\n";
        assert_eq!(
            parse_proc_net_tcp(v4),
            vec![ProcListener {
                addr: "127.0.0.1:11211".parse().unwrap(),
                inode: 31337
            }],
            "only LISTEN rows count"
        );
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 00000000000000000000000001000000:2BCB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0000000000000000 100 0 0 10 0\n";
        assert_eq!(
            parse_proc_net_tcp(v6),
            vec![ProcListener {
                addr: "[::1]:11211".parse().unwrap(),
                inode: 777
            }]
        );
    }

    #[test]
    fn overlapping_addresses() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(overlaps(a("127.0.0.1:11211"), a("127.0.0.1:11211")));
        assert!(overlaps(a("0.0.0.0:11211"), a("127.0.0.1:11211")));
        assert!(overlaps(a("[::]:11211"), a("127.0.0.1:11211")));
        assert!(overlaps(
            a("[::ffff:127.0.0.1]:11211"),
            a("127.0.0.1:11211")
        ));
        assert!(!overlaps(a("127.0.0.1:11211"), a("127.0.0.1:11212")));
        assert!(!overlaps(a("127.0.0.2:11211"), a("127.0.0.1:11211")));
        assert!(!overlaps(a("[::1]:11211"), a("127.0.0.1:11211")));
    }

    #[test]
    fn a_second_bind_on_our_own_address_is_refused() {
        let first = bind_all(&["127.0.0.1:0".parse().unwrap()], 2).expect("a free port");
        assert_eq!(first[0].sockets.len(), 2);
        let err = bind_all(&[first[0].addr], 1).expect_err("the address is taken");
        assert!(matches!(err.cause, BindCause::InUse { .. }), "{err}");
        assert!(err.to_string().starts_with("--listen 127.0.0.1:"), "{err}");
    }

    #[test]
    fn a_wildcard_and_a_specific_address_of_ours_are_bound_together() {
        let first = bind_all(&["127.0.0.1:0".parse().unwrap()], 1).expect("a free port");
        let port = first[0].addr.port();
        drop(first);
        let both = [
            SocketAddr::from(([127, 0, 0, 1], port)),
            SocketAddr::from(([0, 0, 0, 0], port)),
        ];
        let bound = bind_all(&both, 2).expect("our own sockets are not another server's");
        assert_eq!(bound.len(), 2);
        assert!(bound
            .iter()
            .all(|l| l.sockets.len() == 2 && l.addr.port() == port));
    }
}
