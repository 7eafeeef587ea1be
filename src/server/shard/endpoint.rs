//! What a client connection came in over: plain TCP, a unix domain socket, or TLS on the TCP
//! port, and the addresses STAT `conns` and `watch` show for it. The connection code serves
//! all of them through the same socket calls; the transport only switches off what the socket
//! cannot do (zero-copy sends and receive timestamps are TCP's).

/// How a connection's bytes travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    /// `--unix-socket`.
    Unix,
    /// TLS on the `--listen` port: the client's TCP socket, its records opened and sealed in
    /// user space by the connection's wire (`tls_stage.rs`).
    Tls,
}

/// A connection's transport and its two ends, as STAT `conns` prints them.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub transport: Transport,
    /// The client's address: `ip:port`, or memcached's `<AF 1>` for a unix socket client
    /// (it has no name).
    pub peer: String,
    /// The address it connected to: `ip:port`, or the unix socket's path.
    pub local: String,
}

impl Endpoint {
    /// A TCP connection's ends, read from its socket.
    pub fn tcp(stream: &glommio::net::TcpStream) -> Endpoint {
        Endpoint {
            transport: Transport::Tcp,
            peer: stream.peer_addr().map_or("?".into(), |a| a.to_string()),
            local: stream.local_addr().map_or("?".into(), |a| a.to_string()),
        }
    }

    /// A client of the unix socket at `path`.
    pub fn unix(path: &std::path::Path) -> Endpoint {
        Endpoint {
            transport: Transport::Unix,
            peer: format!("<AF {}>", libc::AF_UNIX),
            local: path.display().to_string(),
        }
    }

    /// Whether the socket is a TCP socket (TCP_NODELAY, SIOCOUTQ and an abortive close
    /// apply).
    pub fn is_tcp_socket(&self) -> bool {
        matches!(self.transport, Transport::Tcp | Transport::Tls)
    }

    /// Whether sends may be zero-copy (`SEND_ZC`): only TCP sockets support it, and a TLS
    /// connection sends records sealed into a buffer of its own, not the value's bytes.
    pub fn zero_copy(&self) -> bool {
        self.transport == Transport::Tcp
    }

    /// Whether the kernel's receive timestamps start a request's latency (TCP sockets'; a
    /// unix socket has none).
    pub fn receive_timestamps(&self) -> bool {
        self.is_tcp_socket()
    }

    /// memcached's protocol name in STAT `conns` addresses (`tcp:`, `unix:`).
    fn protocol_name(&self) -> &'static str {
        match self.transport {
            Transport::Tcp | Transport::Tls => "tcp",
            Transport::Unix => "unix",
        }
    }

    /// STAT `conns`' `addr`.
    pub fn conns_addr(&self) -> String {
        format!("{}:{}", self.protocol_name(), self.peer)
    }

    /// STAT `conns`' `listen_addr`.
    pub fn conns_listen_addr(&self) -> String {
        format!("{}:{}", self.protocol_name(), self.local)
    }

    /// memcached's `transport=` in `watch connevents` lines (`local` for a unix socket).
    pub fn watch_transport(&self) -> &'static str {
        match self.transport {
            Transport::Tcp | Transport::Tls => "tcp",
            Transport::Unix => "local",
        }
    }
}
