//! A blocking memcached binary-protocol client for the load generator: pipelined requests
//! written in one go, replies read in order. Values are streamed through a reusable buffer,
//! never kept.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::proto::request_header;

pub use crate::proto::opcode::{DELETE, GET, SET, SETX, STAT};

pub const STATUS_OK: u16 = 0x0000;
pub const STATUS_NOT_FOUND: u16 = 0x0001;
pub const STATUS_OUT_OF_MEMORY: u16 = 0x0082;

/// A check of a value's bytes, given piece by piece (offset in the value, bytes).
pub type ValueCheck<'a> = &'a mut dyn FnMut(usize, &[u8]) -> bool;

/// One reply: its opcode and status, the value's length and, when asked for, its bytes.
#[derive(Clone, Debug, Default)]
pub struct Reply {
    pub opcode: u8,
    pub status: u16,
    pub extras: Vec<u8>,
    pub value_len: u64,
    /// A check of the value's bytes, when the reader was given one.
    pub value_ok: bool,
}

pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: BufWriter<TcpStream>,
    scratch: Vec<u8>,
}

impl Conn {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        Ok(Conn {
            reader: BufReader::with_capacity(256 << 10, stream.try_clone()?),
            writer: BufWriter::with_capacity(256 << 10, stream),
            scratch: vec![0; 256 << 10],
        })
    }

    /// Queues one request (sent at [`Conn::flush`]).
    pub fn queue(&mut self, opcode: u8, extras: &[u8], key: &[u8], value: &[u8]) -> io::Result<()> {
        let (extras_len, key_len) = (extras.len() as u8, key.len() as u16);
        let header = request_header(opcode, extras_len, key_len, value.len() as u32, 0, 0);
        self.writer.write_all(&header)?;
        self.writer.write_all(extras)?;
        self.writer.write_all(key)?;
        self.writer.write_all(value)
    }

    pub fn queue_get(&mut self, key: &[u8]) -> io::Result<()> {
        self.queue(GET, &[], key, &[])
    }

    pub fn queue_set(&mut self, key: &[u8], value: &[u8], ttl_seconds: u32) -> io::Result<()> {
        let mut extras = [0u8; 8];
        extras[4..].copy_from_slice(&ttl_seconds.to_be_bytes());
        self.queue(SET, &extras, key, value)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    /// Reads the next reply. With `check`, the value's bytes are passed to it piece by piece
    /// (offset, bytes) and `value_ok` is whether it accepted all of them.
    pub fn read_reply(&mut self, mut check: Option<ValueCheck>) -> io::Result<Reply> {
        let mut header = [0u8; 24];
        self.reader.read_exact(&mut header)?;
        if header[0] != 0x81 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad reply magic {:#04x}", header[0]),
            ));
        }
        let key_len = u16::from_be_bytes([header[2], header[3]]) as usize;
        let extras_len = header[4] as usize;
        let status = u16::from_be_bytes([header[6], header[7]]);
        let body = u32::from_be_bytes(header[8..12].try_into().unwrap()) as usize;
        if extras_len + key_len > body {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "reply key and extras longer than its body",
            ));
        }
        let mut extras = vec![0u8; extras_len];
        self.reader.read_exact(&mut extras)?;
        let mut left = key_len;
        while left > 0 {
            let n = left.min(self.scratch.len());
            self.reader.read_exact(&mut self.scratch[..n])?;
            left -= n;
        }
        let value_len = body - extras_len - key_len;
        let mut at = 0;
        let mut ok = true;
        while at < value_len {
            let n = (value_len - at).min(self.scratch.len());
            self.reader.read_exact(&mut self.scratch[..n])?;
            if let Some(check) = check.as_mut() {
                ok &= check(at, &self.scratch[..n]);
            }
            at += n;
        }
        Ok(Reply {
            opcode: header[1],
            status,
            extras,
            value_len: value_len as u64,
            value_ok: ok,
        })
    }

    /// STAT of one group, as (name, value) pairs.
    pub fn stats(&mut self, group: &str) -> io::Result<Vec<(String, String)>> {
        self.queue(STAT, &[], group.as_bytes(), &[])?;
        self.flush()?;
        let mut out = Vec::new();
        loop {
            let mut header = [0u8; 24];
            self.reader.read_exact(&mut header)?;
            let key_len = u16::from_be_bytes([header[2], header[3]]) as usize;
            let extras_len = header[4] as usize;
            let body = u32::from_be_bytes(header[8..12].try_into().unwrap()) as usize;
            let mut bytes = vec![0u8; body];
            self.reader.read_exact(&mut bytes)?;
            if key_len == 0 {
                return Ok(out);
            }
            let key = &bytes[extras_len..extras_len + key_len];
            let value = &bytes[extras_len + key_len..];
            out.push((
                String::from_utf8_lossy(key).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            ));
        }
    }
}

/// SETX extras (`docs/protocol.md`): flags, expiry, replicas, no node preference, not strict.
pub fn setx_extras(ttl_seconds: u32, replicas: u8) -> Vec<u8> {
    let mut extras = vec![0u8; 14];
    extras[4..8].copy_from_slice(&ttl_seconds.to_be_bytes());
    extras[8] = replicas;
    extras[9..11].copy_from_slice(&0xffffu16.to_be_bytes());
    extras
}
