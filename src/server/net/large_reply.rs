//! How a large store is answered, in the protocol it came in: the codec's side of a value
//! streamed to a segment (`exec/large.rs` stores it and says how it ended).

use crate::placement::PlacementError;
use crate::proto::{ResponseWriter, Status};
use crate::server::exec::large::LargeOutcome;
use crate::store::StoreOutcome;

use super::text_reply::OwnedStoreReply;

/// How a large store is answered, in the protocol it came in.
#[derive(Clone, Debug)]
pub enum LargeReply {
    Binary {
        opcode: u8,
        opaque: u32,
        quiet: bool,
    },
    /// A text or `ms` command: its data block ends in `\r\n`, checked before the value is
    /// linked.
    Text(Box<OwnedStoreReply>),
}

impl LargeReply {
    /// Bytes after the value that belong to it (text's `\r\n`).
    pub fn trailer_bytes(&self) -> u64 {
        match self {
            LargeReply::Binary { .. } => 0,
            LargeReply::Text(_) => 2,
        }
    }

    pub fn write(&self, out: &mut Vec<u8>, answer: LargeOutcome, setx: bool) {
        match self {
            LargeReply::Binary {
                opcode,
                opaque,
                quiet,
            } => {
                let mut w = ResponseWriter::new(out);
                let status = match answer {
                    LargeOutcome::Stored { cas, replicas, .. } => {
                        if !quiet {
                            // A SETX reply says how many replicas were placed (fewer than
                            // asked: partial).
                            let extras: &[u8] = if setx { &[replicas] } else { &[] };
                            w.reply(*opcode, *opaque, Status::Ok, cas, extras, &[], &[]);
                        }
                        return;
                    }
                    LargeOutcome::Refused(outcome) => status_of(outcome),
                    LargeOutcome::NotPlaced(PlacementError::Strict { .. }) => {
                        Status::StrictPlacement
                    }
                    LargeOutcome::NotPlaced(PlacementError::Invalid(_)) => Status::InvalidArguments,
                    LargeOutcome::NotPlaced(PlacementError::NoSpace { .. }) => Status::OutOfMemory,
                    // The binary protocol has no status for a failed disk write: memcached's
                    // "not stored for lack of room" status, with a body that says what failed.
                    LargeOutcome::SegmentFailed { no_space } => {
                        let message: &[u8] = if no_space {
                            b"Out of disk space"
                        } else {
                            b"I/O error"
                        };
                        w.reply(*opcode, *opaque, Status::OutOfMemory, 0, &[], &[], message);
                        return;
                    }
                    LargeOutcome::BadChunk => unreachable!("binary values have no trailer"),
                };
                w.error(*opcode, *opaque, status);
            }
            LargeReply::Text(reply) => {
                let reply = reply.borrow();
                match answer {
                    LargeOutcome::Stored { cas, len, .. } => {
                        reply.write(out, Some(StoreOutcome::Stored { cas, len }));
                    }
                    LargeOutcome::Refused(outcome) => reply.write(out, Some(outcome)),
                    LargeOutcome::NotPlaced(PlacementError::NoSpace { .. }) => {
                        reply.error(out, b"SERVER_ERROR out of memory storing object\r\n");
                    }
                    // memcached's wording for a store that failed, with what failed.
                    LargeOutcome::SegmentFailed { no_space: true } => {
                        reply.error(out, b"SERVER_ERROR out of disk space storing object\r\n");
                    }
                    LargeOutcome::SegmentFailed { no_space: false } => {
                        reply.error(out, b"SERVER_ERROR I/O error storing object\r\n");
                    }
                    LargeOutcome::NotPlaced(err) => {
                        reply.error(out, format!("SERVER_ERROR {err}\r\n").as_bytes());
                    }
                    LargeOutcome::BadChunk => reply.write(out, None),
                }
            }
        }
    }
}

fn status_of(outcome: StoreOutcome) -> Status {
    match outcome {
        StoreOutcome::Stored { .. } => Status::Ok,
        StoreOutcome::Exists => Status::Exists,
        StoreOutcome::NotFound => Status::NotFound,
        StoreOutcome::NotStored => Status::NotStored,
        StoreOutcome::TooLarge => Status::TooLarge,
        StoreOutcome::OutOfMemory => Status::OutOfMemory,
    }
}
