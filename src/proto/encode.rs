//! Frames out: response frames (the same 24-byte header with the status where the vbucket
//! was), and request frames for the clients Headroom ships (the benchmark tool, tests).

use super::{Status, REQUEST_MAGIC, RESPONSE_MAGIC};

/// Bytes of a request or response header.
pub const HEADER_BYTES: usize = 24;

/// The header of a request frame with `extras`, a key of `key_len` bytes and a value of
/// `value_len` bytes after it (data type raw, vbucket 0).
pub fn request_header(
    opcode: u8,
    extras_len: u8,
    key_len: u16,
    value_len: u32,
    opaque: u32,
    cas: u64,
) -> [u8; HEADER_BYTES] {
    let body_len = u32::from(extras_len) + u32::from(key_len) + value_len;
    let mut header = [0u8; HEADER_BYTES];
    header[0] = REQUEST_MAGIC;
    header[1] = opcode;
    header[2..4].copy_from_slice(&key_len.to_be_bytes());
    header[4] = extras_len;
    header[8..12].copy_from_slice(&body_len.to_be_bytes());
    header[12..16].copy_from_slice(&opaque.to_be_bytes());
    header[16..24].copy_from_slice(&cas.to_be_bytes());
    header
}

/// Appends a request frame: header, extras, key, value.
pub fn write_request(
    out: &mut Vec<u8>,
    opcode: u8,
    (extras, key, value): (&[u8], &[u8], &[u8]),
    opaque: u32,
    cas: u64,
) {
    let header = request_header(
        opcode,
        extras.len() as u8,
        key.len() as u16,
        value.len() as u32,
        opaque,
        cas,
    );
    out.reserve(HEADER_BYTES + extras.len() + key.len() + value.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Appends responses to a buffer.
pub struct ResponseWriter<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> ResponseWriter<'a> {
    pub fn new(out: &'a mut Vec<u8>) -> ResponseWriter<'a> {
        ResponseWriter { out }
    }

    /// Appends a header for a body of `extras + key + value_len` bytes; the caller appends the
    /// body parts (or uses [`ResponseWriter::reply`]).
    #[allow(clippy::too_many_arguments)]
    pub fn header(
        &mut self,
        opcode: u8,
        opaque: u32,
        status: Status,
        cas: u64,
        extras_len: u8,
        key_len: u16,
        value_len: u32,
    ) {
        let body_len = u32::from(extras_len) + u32::from(key_len) + value_len;
        let out = &mut *self.out;
        out.reserve(HEADER_BYTES + body_len as usize);
        out.push(RESPONSE_MAGIC);
        out.push(opcode);
        out.extend_from_slice(&key_len.to_be_bytes());
        out.push(extras_len);
        out.push(0); // data type: raw bytes
        out.extend_from_slice(&(status as u16).to_be_bytes());
        out.extend_from_slice(&body_len.to_be_bytes());
        out.extend_from_slice(&opaque.to_be_bytes());
        out.extend_from_slice(&cas.to_be_bytes());
    }

    /// A whole response.
    #[allow(clippy::too_many_arguments)]
    pub fn reply(
        &mut self,
        opcode: u8,
        opaque: u32,
        status: Status,
        cas: u64,
        extras: &[u8],
        key: &[u8],
        value: &[u8],
    ) {
        self.header(
            opcode,
            opaque,
            status,
            cas,
            extras.len() as u8,
            key.len() as u16,
            value.len() as u32,
        );
        self.out.extend_from_slice(extras);
        self.out.extend_from_slice(key);
        self.out.extend_from_slice(value);
    }

    /// An error response: the status and memcached's text for it as the body.
    pub fn error(&mut self, opcode: u8, opaque: u32, status: Status) {
        self.reply(
            opcode,
            opaque,
            status,
            0,
            &[],
            &[],
            status.message().as_bytes(),
        );
    }

    /// Appends raw body bytes after a [`ResponseWriter::header`].
    pub fn body(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }
}
