//! uring_floor: the io_uring floor of a memcached binary-protocol server on this machine.
//!
//! The companion of `tools/floor/floor.c` (the epoll floor): a responder with no store that
//! answers exactly as that one does, but talks to the kernel the way Headroom's ring does, and
//! does nothing else. Each thread owns one ring (`SINGLE_ISSUER`, `COOP_TASKRUN` and
//! `TASKRUN_FLAG` where the kernel has them, as `src/ring/` sets it up) and its own
//! `SO_REUSEPORT` listener. A connection's completed `RECV` is answered by a `SEND` of every
//! reply it completed, queued together with the connection's next `RECV`. The thread submits
//! all of a pass's entries and waits for the next completion in a single `io_uring_enter`.
//! There is no executor, no task, no eventfd and no second ring.
//!
//! So it is the least CPU per request an io_uring server with one ring per thread can spend
//! here: the difference between Headroom and this is Headroom's own machinery.
//!
//! Answers: every GET-family request (GET, GETQ, GETK, GETKQ) is a hit with a fixed 32-byte value
//! and flags 0 (GETK and GETKQ echo the key); quiet mutations and QUITQ get no reply; every
//! other request gets an empty success carrying its opcode and opaque (QUIT closes after it).
//!
//! With `--eventfd-hop` a thread sleeps the way a Headroom shard does, to measure what that costs:
//! the ring signals an eventfd, and when a pass finds nothing to do the thread waits in a second
//! ring for a read of that eventfd (glommio's ring waiting for the eventfd reader). Entries are
//! submitted with the eventfd off, as Headroom's ring submits them.
//!
//! With `--multishot` a connection's receive is armed once (`RECV` with `IORING_RECV_MULTISHOT`)
//! and every arrival completes into a buffer the thread provides through a buffer ring (the
//! server's own, `headroom::ring::multishot::ProvidedBuffers`); the
//! thread copies the bytes into the connection's input and gives the buffer back at once. It
//! measures what a receive re-armed per request costs against one that stays armed.
//!
//! Usage: `cargo run --release --example uring_floor -- PORT THREADS [ADDR] [--eventfd-hop]
//! [--multishot]` (ADDR defaults to 127.0.0.1).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use headroom::proto::{opcode as op, HEADER_BYTES, REQUEST_MAGIC, RESPONSE_MAGIC};
// The server's own buffer ring (512 buffers of 8 KiB), so the floor measures what it runs.
use headroom::ring::multishot::{ProvidedBuffers, BUFFER_GROUP};
use io_uring::{opcode, squeue, types, IoUring};
use nix::sys::socket::{setsockopt, sockopt};

const FLAGS_BYTES: usize = 4;
const VALUE: &[u8; 32] = b"floor-responder-fixed-value-32by";
const IN_BYTES: usize = 64 * 1024;
const RING_ENTRIES: u32 = 1024;

/// What a completion is for, in the low bits of its user data; the connection's slot above.
const ACCEPT: u64 = 0;
const RECV: u64 = 1;
const SEND: u64 = 2;

fn is_get(code: u8) -> bool {
    matches!(code, op::GET | op::GETQ | op::GETK | op::GETKQ)
}

fn is_quiet_mutation(code: u8) -> bool {
    matches!(
        code,
        op::SETQ
            | op::ADDQ
            | op::REPLACEQ
            | op::DELETEQ
            | op::INCREMENTQ
            | op::DECREMENTQ
            | op::FLUSHQ
            | op::APPENDQ
            | op::PREPENDQ
    )
}

/// Appends the reply to the request whose header starts `frame` (its key after its extras).
fn reply(frame: &[u8], out: &mut Vec<u8>) {
    let code = frame[1];
    if is_quiet_mutation(code) || code == op::QUITQ {
        return;
    }
    let start = out.len();
    out.resize(start + HEADER_BYTES, 0);
    out[start] = RESPONSE_MAGIC;
    out[start + 1] = code;
    out[start + 12..start + 16].copy_from_slice(&frame[12..16]);
    if !is_get(code) {
        return;
    }
    let key_len = if matches!(code, op::GETK | op::GETKQ) {
        u16::from_be_bytes([frame[2], frame[3]]) as usize
    } else {
        0
    };
    out[start + 2..start + 4].copy_from_slice(&(key_len as u16).to_be_bytes());
    out[start + 4] = FLAGS_BYTES as u8;
    let body = (FLAGS_BYTES + key_len + VALUE.len()) as u32;
    out[start + 8..start + 12].copy_from_slice(&body.to_be_bytes());
    out[start + 23] = 1; // CAS
    out.extend_from_slice(&0u32.to_be_bytes());
    let key_at = HEADER_BYTES + frame[4] as usize;
    out.extend_from_slice(&frame[key_at..key_at + key_len]);
    out.extend_from_slice(VALUE);
}

struct Conn {
    fd: OwnedFd,
    input: Vec<u8>,
    filled: usize,
    /// Replies being sent (the kernel reads them until the send completes) and from where.
    sending: Vec<u8>,
    sent: usize,
    /// Replies completed while a send was in flight: they go out when it is done.
    waiting: Vec<u8>,
    /// Whether a RECV is queued or in flight.
    receiving: bool,
    closing: bool,
}

struct Worker {
    ring: IoUring,
    listener: OwnedFd,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    hop: Option<EventfdHop>,
    provided: Option<ProvidedBuffers>,
}

/// The second ring a thread sleeps in under `--eventfd-hop`, and the eventfd it reads there.
struct EventfdHop {
    outer: IoUring,
    eventfd: OwnedFd,
    /// Where the outer ring's read puts the eventfd's count (boxed: the kernel writes it).
    count: Box<u64>,
    read_queued: bool,
}

impl EventfdHop {
    fn new(inner: &IoUring) -> io::Result<EventfdHop> {
        // SAFETY: a plain eventfd call; the descriptor is owned at once.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let eventfd = unsafe { OwnedFd::from_raw_fd(raw) };
        inner.submitter().register_eventfd(eventfd.as_raw_fd())?;
        Ok(EventfdHop {
            outer: IoUring::new(8)?,
            eventfd,
            count: Box::new(0),
            read_queued: false,
        })
    }
}

impl Worker {
    fn push(&mut self, entry: squeue::Entry) {
        // SAFETY: every buffer an entry names is the heap storage of a `Conn`'s `input` or
        // `sending`, which is neither freed nor grown until the entry's completion is reaped
        // (a `Conn` is dropped only with nothing in flight, and replies go to `waiting` while
        // a send is); moving the `Conn` itself does not move that storage. A full queue is
        // submitted first.
        unsafe {
            while self.ring.submission().push(&entry).is_err() {
                self.ring.submit().expect("io_uring_enter");
            }
        }
    }

    fn queue_accept(&mut self) {
        let entry = opcode::AcceptMulti::new(types::Fd(self.listener.as_raw_fd()))
            .build()
            .user_data(ACCEPT);
        self.push(entry);
    }

    fn queue_recv(&mut self, slot: usize) {
        let conn = self.conns[slot].as_mut().expect("a live connection");
        conn.receiving = true;
        if self.provided.is_some() {
            let entry = opcode::RecvMulti::new(types::Fd(conn.fd.as_raw_fd()), BUFFER_GROUP)
                .build()
                .user_data((slot as u64) << 2 | RECV);
            return self.push(entry);
        }
        let room = &mut conn.input[conn.filled..];
        let entry = opcode::Recv::new(
            types::Fd(conn.fd.as_raw_fd()),
            room.as_mut_ptr(),
            room.len() as u32,
        )
        .build()
        .user_data((slot as u64) << 2 | RECV);
        self.push(entry);
    }

    fn queue_send(&mut self, slot: usize) {
        let conn = self.conns[slot].as_mut().expect("a live connection");
        let rest = &conn.sending[conn.sent..];
        let entry = opcode::Send::new(
            types::Fd(conn.fd.as_raw_fd()),
            rest.as_ptr(),
            rest.len() as u32,
        )
        .flags(libc::MSG_NOSIGNAL)
        .build()
        .user_data((slot as u64) << 2 | SEND);
        self.push(entry);
    }

    fn accepted(&mut self, fd: RawFd) {
        // SAFETY: a descriptor the kernel just returned from accept, owned from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let _ = setsockopt(&fd, sockopt::TcpNoDelay, &true);
        let conn = Conn {
            fd,
            input: vec![0; IN_BYTES],
            filled: 0,
            sending: Vec::with_capacity(4 * IN_BYTES),
            sent: 0,
            waiting: Vec::new(),
            receiving: false,
            closing: false,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.conns[slot] = Some(conn);
                slot
            }
            None => {
                self.conns.push(Some(conn));
                self.conns.len() - 1
            }
        };
        self.queue_recv(slot);
    }

    fn received(&mut self, slot: usize, result: i32, flags: u32) {
        let conn = self.conns[slot].as_mut().expect("a live connection");
        // A multishot receive stays armed while its completions say more follow.
        let armed = self.provided.is_some() && io_uring::cqueue::more(flags);
        conn.receiving = armed;
        if result == -libc::ENOBUFS && !armed {
            // Every provided buffer was in use: arm again (they are given back at once).
            return self.queue_recv(slot);
        }
        if result <= 0 {
            conn.closing = true;
            return self.close_if_idle(slot);
        }
        let len = result as usize;
        if let Some(provided) = self.provided.as_mut() {
            let id = io_uring::cqueue::buffer_select(flags).expect("a provided buffer");
            if conn.filled + len > IN_BYTES {
                // Like a frame larger than the input buffer (below): the floors' loads never.
                provided.give_back(id);
                conn.closing = true;
                return self.close_if_idle(slot);
            }
            conn.input[conn.filled..conn.filled + len].copy_from_slice(provided.bytes(id, len));
            provided.give_back(id);
        }
        conn.filled += len;
        let in_flight = conn.sent < conn.sending.len();
        let out = if in_flight {
            &mut conn.waiting
        } else {
            conn.sending.clear();
            conn.sent = 0;
            &mut conn.sending
        };
        let mut at = 0;
        while conn.filled - at >= HEADER_BYTES {
            let frame = &conn.input[at..conn.filled];
            let body = u32::from_be_bytes([frame[8], frame[9], frame[10], frame[11]]) as usize;
            let key_and_extras =
                u16::from_be_bytes([frame[2], frame[3]]) as usize + frame[4] as usize;
            // Not a request, or a key that overruns its body: the connection is closed, as
            // `floor.c` does. A frame larger than the buffer is closed too (`floor.c` answers it
            // and drops its body): the floors' loads send 32-byte values.
            if frame[0] != REQUEST_MAGIC || HEADER_BYTES + body > IN_BYTES || key_and_extras > body
            {
                conn.closing = true;
                break;
            }
            if frame.len() < HEADER_BYTES + body {
                break;
            }
            reply(frame, out);
            if matches!(frame[1], op::QUIT | op::QUITQ) {
                conn.closing = true;
            }
            at += HEADER_BYTES + body;
        }
        conn.input.copy_within(at..conn.filled, 0);
        conn.filled -= at;
        let (send, closing) = (!in_flight && !conn.sending.is_empty(), conn.closing);
        let fd = conn.fd.as_raw_fd();
        if send {
            self.queue_send(slot);
        }
        if closing {
            if armed {
                // The armed receive ends (0 bytes) once the socket is shut down for reading.
                let _ = nix::sys::socket::shutdown(fd, nix::sys::socket::Shutdown::Read);
            }
            return self.close_if_idle(slot);
        }
        if !armed {
            self.queue_recv(slot);
        }
    }

    fn sent(&mut self, slot: usize, result: i32) {
        let conn = self.conns[slot].as_mut().expect("a live connection");
        if result < 0 {
            conn.sending.clear();
            conn.sent = 0;
            conn.closing = true;
            return self.close_if_idle(slot);
        }
        conn.sent += result as usize;
        if conn.sent < conn.sending.len() {
            return self.queue_send(slot);
        }
        conn.sending.clear();
        conn.sent = 0;
        if !conn.waiting.is_empty() {
            std::mem::swap(&mut conn.sending, &mut conn.waiting);
            return self.queue_send(slot);
        }
        self.close_if_idle(slot);
    }

    /// Frees a closing connection once no operation on it is left.
    fn close_if_idle(&mut self, slot: usize) {
        let conn = self.conns[slot].as_ref().expect("a live connection");
        if conn.closing && !conn.receiving && conn.sent >= conn.sending.len() {
            self.conns[slot] = None;
            self.free.push(slot);
        }
    }

    /// Under `--eventfd-hop`: submits the pass's entries with the eventfd off, and if nothing has
    /// completed, sleeps in the outer ring until the eventfd is read.
    fn submit_then_sleep_through_eventfd(&mut self) -> io::Result<()> {
        self.ring.completion().disable_eventfd();
        let submitted = self.ring.submit();
        self.ring.completion().enable_eventfd();
        submitted?;
        if !self.ring.completion().is_empty() {
            return Ok(());
        }
        let hop = self.hop.as_mut().expect("the eventfd hop");
        if !hop.read_queued {
            let count: *mut u64 = &mut *hop.count;
            let read = opcode::Read::new(types::Fd(hop.eventfd.as_raw_fd()), count.cast(), 8)
                .build()
                .user_data(0);
            // SAFETY: the read writes the boxed count, which lives as long as the outer ring.
            unsafe { hop.outer.submission().push(&read) }.expect("an empty outer queue");
            hop.read_queued = true;
        }
        hop.outer.submit_and_wait(1)?;
        if hop.outer.completion().next().is_some() {
            hop.read_queued = false;
        }
        Ok(())
    }

    fn run(&mut self) -> io::Result<()> {
        self.queue_accept();
        let mut done = Vec::with_capacity(RING_ENTRIES as usize);
        loop {
            if self.hop.is_some() {
                self.submit_then_sleep_through_eventfd()?;
            } else {
                self.ring.submit_and_wait(1)?;
            }
            done.extend(
                self.ring
                    .completion()
                    .map(|c| (c.user_data(), c.result(), c.flags())),
            );
            for (data, result, flags) in done.drain(..) {
                let slot = (data >> 2) as usize;
                match data & 3 {
                    ACCEPT => {
                        if result >= 0 {
                            self.accepted(result);
                        }
                        if !io_uring::cqueue::more(flags) {
                            self.queue_accept();
                        }
                    }
                    RECV => self.received(slot, result, flags),
                    _ => self.sent(slot, result),
                }
            }
        }
    }
}

fn listener(addr: SocketAddr) -> io::Result<OwnedFd> {
    let socket = nix::sys::socket::socket(
        match addr {
            SocketAddr::V4(_) => nix::sys::socket::AddressFamily::Inet,
            SocketAddr::V6(_) => nix::sys::socket::AddressFamily::Inet6,
        },
        nix::sys::socket::SockType::Stream,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&socket, sockopt::ReuseAddr, &true)?;
    setsockopt(&socket, sockopt::ReusePort, &true)?;
    nix::sys::socket::bind(
        socket.as_raw_fd(),
        &nix::sys::socket::SockaddrStorage::from(addr),
    )?;
    nix::sys::socket::listen(&socket, nix::sys::socket::Backlog::new(1024)?)?;
    Ok(socket)
}

fn ring() -> io::Result<IoUring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .build(RING_ENTRIES)
        .or_else(|_| IoUring::new(RING_ENTRIES))
}

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    let hop = args.iter().any(|a| a == "--eventfd-hop");
    let multishot = args.iter().any(|a| a == "--multishot");
    args.retain(|a| a != "--eventfd-hop" && a != "--multishot");
    let usage = "usage: uring_floor PORT THREADS [ADDR] [--eventfd-hop] [--multishot]";
    let (Some(port), Some(threads)) = (
        args.get(1).and_then(|p| p.parse::<u16>().ok()),
        args.get(2).and_then(|t| t.parse::<usize>().ok()),
    ) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let ip: IpAddr = match args.get(3).map_or(Ok([127, 0, 0, 1].into()), |a| a.parse()) {
        Ok(ip) => ip,
        Err(err) => {
            eprintln!("uring_floor: bad ADDR: {err}\n{usage}");
            std::process::exit(2);
        }
    };
    let addr = SocketAddr::new(ip, port);
    let workers: Vec<_> = (0..threads.max(1))
        .map(|_| {
            let listener = listener(addr).unwrap_or_else(|err| {
                eprintln!("uring_floor: {addr}: {err}");
                std::process::exit(1);
            });
            std::thread::spawn(move || {
                // Made on the thread that submits to it (`SINGLE_ISSUER` binds the creator).
                let ring = ring().unwrap_or_else(|err| {
                    eprintln!("uring_floor: io_uring_setup: {err}");
                    std::process::exit(1);
                });
                let hop = hop.then(|| EventfdHop::new(&ring)).transpose();
                let hop = hop.unwrap_or_else(|err| {
                    eprintln!("uring_floor: eventfd hop: {err}");
                    std::process::exit(1);
                });
                let provided = multishot
                    .then(|| ProvidedBuffers::register(&ring))
                    .transpose();
                let provided = provided.unwrap_or_else(|err| {
                    eprintln!("uring_floor: provided buffer ring: {err}");
                    std::process::exit(1);
                });
                let mut worker = Worker {
                    ring,
                    listener,
                    conns: Vec::new(),
                    free: Vec::new(),
                    hop,
                    provided,
                };
                if let Err(err) = worker.run() {
                    eprintln!("uring_floor: {err}");
                    std::process::exit(1);
                }
            })
        })
        .collect();
    eprintln!(
        "uring_floor: listening on {addr} with {} threads",
        workers.len()
    );
    for worker in workers {
        let _ = worker.join();
    }
}
