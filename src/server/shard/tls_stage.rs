//! A TLS connection's session as a stage of its wire (`wire.rs`): what the socket brings is
//! opened here before the connection's buffer sees it, and every reply is sealed here on its
//! way to the socket. The stage holds no socket: the wire moves the records, over the ring or
//! plain socket calls, as it moves a plain connection's bytes.
//!
//! The records leave in the order they were sealed, one sender at a time (`send_turn`):
//! a reply sealed while another is still going out waits its turn, and a read that makes the
//! session answer (a key update, an alert) sends through the same turn.
//!
//! A large reply's records go to the socket straight from the session's own record buffers
//! ([`TlsStage::send_now`]), as far as the socket takes them without waiting; only what it
//! does not take is copied into a send buffer. A value's bytes are then copied once in user
//! space (into the record that seals them), not twice.

use std::cell::{Cell, RefCell};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustls::ServerConnection;

use super::tls_config::Tls;

/// Ciphertext read from the socket at a time: a TLS record at most (16 KiB and its framing).
pub const RECEIVE_CHUNK_BYTES: usize = 16 << 10;
/// Records handed to one send at most: bounds the copy out of the session.
pub const SEND_CHUNK_BYTES: usize = 256 << 10;

/// What opening the received bytes gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// This many plaintext bytes.
    Plain(usize),
    /// The client ended the session (close_notify).
    End,
    /// No whole record yet: read more from the socket.
    NeedBytes,
}

/// One connection's TLS session after its handshake.
pub struct TlsStage {
    session: RefCell<ServerConnection>,
    /// Ciphertext received and not yet given to the session: `received[from..to]`. The
    /// buffer keeps its length between reads, so a read does not clear its room again.
    received: RefCell<Vec<u8>>,
    received_from: Cell<usize>,
    received_to: Cell<usize>,
    /// The records of a send, reused.
    sealed: RefCell<Vec<u8>>,
    /// One sender at a time (see the module comment).
    send_turn: glommio::sync::Semaphore,
    tls: Arc<Tls>,
}

impl TlsStage {
    /// The stage of a session whose handshake is done; `after_handshake` is the ciphertext
    /// that came with the handshake's last read (the client's first records).
    pub fn new(tls: Arc<Tls>, mut session: ServerConnection, after_handshake: Vec<u8>) -> Self {
        // Replies are sealed whole and sent at once: the session never refuses plaintext.
        session.set_buffer_limit(None);
        TlsStage {
            session: RefCell::new(session),
            received_to: Cell::new(after_handshake.len()),
            received: RefCell::new(after_handshake),
            received_from: Cell::new(0),
            sealed: RefCell::new(Vec::new()),
            send_turn: glommio::sync::Semaphore::new(1),
            tls,
        }
    }

    /// Opens what was received into `into`: the plaintext the session holds first, then the
    /// records received and not yet opened. A record that does not open (or any TLS error) is
    /// the session's end: counted (STAT `ssl_proto_errors`) and returned as an error, after
    /// which the caller sends the alert the session has for the client.
    pub fn open(&self, into: &mut [u8]) -> io::Result<Opened> {
        if into.is_empty() {
            return Ok(Opened::Plain(0));
        }
        let mut session = self.session.borrow_mut();
        loop {
            match session.reader().read(into) {
                Ok(0) => return Ok(Opened::End),
                Ok(n) => return Ok(Opened::Plain(n)),
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                Err(err) => return Err(err),
            }
            let received = self.received.borrow();
            let (from, to) = (self.received_from.get(), self.received_to.get());
            if from >= to {
                return Ok(Opened::NeedBytes);
            }
            let mut rest = &received[from..to];
            let taken = session.read_tls(&mut rest)?;
            self.received_from.set(from + taken);
            if let Err(err) = session.process_new_packets() {
                self.tls.proto_errors.fetch_add(1, Ordering::Relaxed);
                return Err(io::Error::new(io::ErrorKind::InvalidData, err));
            }
        }
    }

    /// Room for the next ciphertext read: the receive buffer with what was opened dropped,
    /// and where the new bytes go. Give it back with [`TlsStage::received`].
    pub fn receive_room(&self) -> (Vec<u8>, usize) {
        let mut buf = self.received.take();
        let (from, to) = (self.received_from.replace(0), self.received_to.replace(0));
        buf.copy_within(from..to, 0);
        let filled = to - from;
        if buf.len() < filled + RECEIVE_CHUNK_BYTES {
            buf.resize(filled + RECEIVE_CHUNK_BYTES, 0);
        }
        (buf, filled)
    }

    /// Takes back the receive buffer of [`TlsStage::receive_room`], `filled` bytes of it now
    /// holding ciphertext.
    pub fn received(&self, buf: Vec<u8>, filled: usize) {
        self.received_to.set(filled);
        *self.received.borrow_mut() = buf;
    }

    /// Seals `parts` (a reply, or the head before a value and the value) into records, in
    /// order, behind any sealed before. Returns the plaintext bytes sealed.
    pub fn seal(&self, parts: &[&[u8]]) -> usize {
        let mut session = self.session.borrow_mut();
        let mut writer = session.writer();
        for part in parts {
            // No buffer limit (above): the whole part is taken.
            writer
                .write_all(part)
                .expect("a session without a buffer limit takes any plaintext");
        }
        parts.iter().map(|part| part.len()).sum()
    }

    /// `--tls-write-buffer`: the most plaintext of a reply sealed ahead of the socket.
    pub fn write_buffer_bytes(&self) -> usize {
        self.tls.files.write_buffer_bytes as usize
    }

    /// The client's session is ended politely: a close_notify is sealed.
    pub fn seal_close(&self) {
        self.session.borrow_mut().send_close_notify();
    }

    /// Whether the session has records to send.
    pub fn wants_send(&self) -> bool {
        self.session.borrow().wants_write()
    }

    /// Waits for this connection's turn to send (see the module comment).
    pub async fn send_turn(&self) -> glommio::sync::Permit<'_> {
        self.send_turn
            .acquire_permit(1)
            .await
            .expect("the send turn is never closed")
    }

    /// Up to [`SEND_CHUNK_BYTES`] of sealed records, in the buffer reused for them (empty:
    /// nothing to send). Give the buffer back with [`TlsStage::sent`].
    pub fn next_records(&self) -> io::Result<Vec<u8>> {
        let mut out = self.sealed.take();
        out.clear();
        let mut session = self.session.borrow_mut();
        while session.wants_write() && out.len() < SEND_CHUNK_BYTES {
            session.write_tls(&mut out)?;
        }
        Ok(out)
    }

    /// Sends sealed records straight from the session to socket `fd`, as many as it takes
    /// without waiting (none when its buffer is full); the rest stay for
    /// [`TlsStage::next_records`]. Only in this connection's send turn, with no send of its
    /// records in flight: these go out ahead of anything not yet sent.
    pub fn send_now(&self, fd: RawFd) -> io::Result<()> {
        let mut session = self.session.borrow_mut();
        while session.wants_write() {
            match session.write_tls(&mut SocketNow(fd)) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Takes back the buffer of [`TlsStage::next_records`].
    pub fn sent(&self, buf: Vec<u8>) {
        *self.sealed.borrow_mut() = buf;
    }
}

/// The session's records written to a socket as far as it takes them now
/// ([`TlsStage::send_now`]): the session hands over its record buffers as one vector.
struct SocketNow(RawFd);

impl Write for SocketNow {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        crate::sys::send_now(self.0, &[IoSlice::new(bytes)])
    }

    fn write_vectored(&mut self, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        crate::sys::send_now(self.0, parts)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
