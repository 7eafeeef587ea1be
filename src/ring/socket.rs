//! The ring's socket operations: sends (owned bytes, lent bytes, a header and a lent value in
//! one `SENDMSG`, zero-copy where it pays) and receives (one-shot, with the kernel's receive
//! timestamp, multishot into provided buffers). Each owns its memory until its last completion
//! (`Buf`); they run through the ring's queue, submission and reap in `mod.rs`.

use super::*;

/// Replies of at least this many bytes (a pipelined batch's, about 16 small replies) are
/// submitted as soon as they are queued.
pub const SEND_AT_ONCE_BYTES: usize = 512;

impl Ring {
    /// Sends all of `bytes` (plain `SEND`), in as many operations as the socket needs.
    /// Returns the buffer for reuse (it is lost if the send failed midway).
    pub async fn send_all(self: &Rc<Self>, fd: RawFd, bytes: Vec<u8>) -> io::Result<Vec<u8>> {
        let total = bytes.len();
        // A pipelined batch's replies go to the kernel at once, so the client works on them
        // while this pass serves the other connections; a lone reply waits for the pass's
        // one submission (docs/io.md, "Submission").
        let at_once = total >= SEND_AT_ONCE_BYTES;
        let mut buf = Buf::Owned(bytes);
        let mut sent = 0;
        while sent < total {
            let at = sent;
            let (result, back) = self
                .submit_with(OpKind::Send, fd, (buf, None), at_once, |b, target| {
                    // SAFETY (of the pointer arithmetic): `at < len` of the owned buffer.
                    opcode::Send::new(target, b.ptr().wrapping_add(at), (total - at) as u32)
                        .flags(libc::MSG_NOSIGNAL)
                        .build()
                })
                .await;
            sent += result?;
            buf = back.expect("a plain send hands its buffer back");
        }
        match buf {
            Buf::Owned(v) => Ok(v),
            _ => unreachable!("send_all sends owned bytes"),
        }
    }

    /// Sends all of the lent `buf` straight from its memory, without a user-space copy:
    /// with `SEND_ZC` (from its fixed buffer when it lies in one) unless the bytes sit on huge
    /// pages or the connection's `report` says the kernel copies anyway, then with plain
    /// `SEND`. Returns once the bytes are queued; the memory is released when the kernel is
    /// done with it (the notification, for a zero-copy send).
    pub async fn send_lent_all(
        self: &Rc<Self>,
        fd: RawFd,
        buf: Buf,
        report: &Rc<ZcReport>,
    ) -> io::Result<()> {
        let zero_copy = !self.lent_goes_plain(buf.ptr(), report);
        // A send that goes out in parts needs the memory until the last part is done with it.
        let shared = buf.into_lent();
        for (ptr, total) in shared.runs() {
            let index = self.buffers.find(ptr as usize, total);
            let mut sent = 0;
            while sent < total {
                let at = sent;
                let part = Buf::Lent(Rc::clone(&shared));
                let (result, _) = if zero_copy {
                    self.submit(
                        OpKind::SendZc,
                        fd,
                        part,
                        Some(Rc::clone(report)),
                        |_, target| {
                            let mut op = opcode::SendZc::new(
                                target,
                                ptr.wrapping_add(at),
                                (total - at) as u32,
                            )
                            .flags(libc::MSG_NOSIGNAL)
                            .zc_flags(SEND_ZC_REPORT_USAGE);
                            if let Some(index) = index {
                                op = op.buf_index(Some(index));
                            }
                            op.build()
                        },
                    )
                    .await
                } else {
                    self.submit(OpKind::Send, fd, part, None, |_, target| {
                        opcode::Send::new(target, ptr.wrapping_add(at), (total - at) as u32)
                            .flags(libc::MSG_NOSIGNAL)
                            .build()
                    })
                    .await
                };
                sent += result?;
            }
        }
        Ok(())
    }

    /// Whether lent bytes at `ptr` go out with a plain send (counted): they sit on huge pages
    /// (zero-copy from them stalls), or the connection's notifications say the kernel copies.
    pub fn lent_goes_plain(&self, ptr: *const u8, report: &ZcReport) -> bool {
        let on_huge_pages = self
            .huge_page_ranges
            .iter()
            .any(|&(start, len)| (ptr as usize) >= start && (ptr as usize) < start + len);
        if report.unsupported {
            self.stats.borrow_mut().lent_sends_not_tcp += 1;
            true
        } else if on_huge_pages {
            self.stats.borrow_mut().lent_sends_huge_pages += 1;
            true
        } else if report.kernel_copies() {
            self.stats.borrow_mut().lent_sends_kernel_copies += 1;
            true
        } else {
            false
        }
    }

    /// Sends `head` then the lent `tail` with `SENDMSG` (as many as the socket needs), without
    /// copying the tail: a reply's header and the value after it leave in one operation.
    /// Plain send semantics (no zero-copy notification): for where `SEND_ZC` does not pay.
    /// Hands `head`'s buffer back, emptied, for reuse.
    pub async fn send_pair_all(
        self: &Rc<Self>,
        fd: RawFd,
        head: Vec<u8>,
        tail: Lent,
    ) -> io::Result<Vec<u8>> {
        let total = head.len() + tail.len();
        let mut pair = Box::new(Pair {
            head,
            tail,
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 3],
            // SAFETY: a zeroed msghdr is a valid empty one.
            msg: unsafe { std::mem::zeroed() },
        });
        let mut sent = 0;
        while sent < total {
            pair.aim(sent);
            let msg: *const libc::msghdr = &pair.msg;
            let (result, back) = self
                .submit(OpKind::Send, fd, Buf::Pair(pair), None, |_, target| {
                    // The message lives in the boxed pair the slot owns until completion.
                    opcode::SendMsg::new(target, msg)
                        .flags(libc::MSG_NOSIGNAL as u32)
                        .build()
                })
                .await;
            sent += result?;
            pair = match back {
                Some(Buf::Pair(p)) => p,
                _ => unreachable!("a pair send hands its pair back"),
            };
        }
        // The value is released here; the header's buffer goes back to the caller for reuse.
        let Pair { mut head, .. } = *pair;
        head.clear();
        Ok(head)
    }

    /// Receives into `buf[at..]` (plain `RECV`, queued with the pass's other entries: no
    /// syscall of its own). Returns the bytes received (0: the peer closed) and the buffer;
    /// if this future is dropped first, the buffer stays with the ring until the kernel is
    /// done and is then freed.
    pub async fn recv(
        self: &Rc<Self>,
        fd: RawFd,
        buf: Vec<u8>,
        at: usize,
    ) -> (io::Result<usize>, Vec<u8>) {
        assert!(at < buf.len(), "a receive needs room");
        let room = (buf.len() - at) as u32;
        let (result, back) = self
            .submit(
                OpKind::Recv,
                fd,
                Buf::Received { buf, at },
                None,
                |b, target| {
                    // SAFETY (of the pointer arithmetic): `at < len` of the owned buffer.
                    opcode::Recv::new(target, b.ptr().wrapping_add(at) as *mut u8, room).build()
                },
            )
            .await;
        match back {
            Some(Buf::Received { buf, .. }) => (result, buf),
            _ => unreachable!("a receive hands its buffer back"),
        }
    }

    /// Receives into `stamped.buf[at..]` with `RECVMSG`, queued like [`Ring::recv`], bringing
    /// back the kernel's receive timestamp where the socket has `SO_TIMESTAMPNS` on (see
    /// [`Stamped::received_ns`]). If this future is dropped first, the box stays with the ring
    /// until the kernel is done and is then freed.
    pub async fn recv_stamped(
        self: &Rc<Self>,
        fd: RawFd,
        mut stamped: Box<Stamped>,
        at: usize,
    ) -> (io::Result<usize>, Box<Stamped>) {
        assert!(at < stamped.buf.len(), "a receive needs room");
        stamped.aim(at);
        let msg: *mut libc::msghdr = &mut stamped.msg;
        let (result, back) = self
            .submit(
                OpKind::Recv,
                fd,
                Buf::Stamped(stamped),
                None,
                |_, target| {
                    // The message lives in the box the slot owns until completion.
                    opcode::RecvMsg::new(target, msg).build()
                },
            )
            .await;
        match back {
            Some(Buf::Stamped(r)) => (result, r),
            _ => unreachable!("a receive hands its buffer back"),
        }
    }

    /// Reads into `buf[at..]` from `fd`'s multishot receive (arming it when it is not
    /// armed; see [`multishot`]): bytes already spilled in `inbox` at once, else the next
    /// arrival, copied straight into `buf` as it is reaped. Returns the bytes read (0: the
    /// peer closed or the socket was shut down). An idle connection's empty `buf` (at 0) lends
    /// nothing: the arrival spills and `buf` becomes one of the inbox's cache's once it has, so
    /// the connection waits holding no buffer. Needs
    /// [`Ring::multishot`]. If this future is dropped midway, `buf` is put back whole.
    pub async fn recv_multishot(
        self: &Rc<Self>,
        fd: RawFd,
        inbox: &Rc<Inbox>,
        buf: &mut Vec<u8>,
        at: usize,
    ) -> io::Result<usize> {
        assert!(
            at < buf.len() || (at == 0 && buf.is_empty()),
            "a receive needs room, or an idle connection's empty buffer"
        );
        if buf.is_empty() {
            // Idle: nothing is lent; the arrival spills, and a buffer is taken once it has.
            self.wait_received(fd, inbox).await;
            return inbox.take_received(buf);
        }
        let n = inbox.take_spilled(&mut buf[at..]);
        if n > 0 {
            return Ok(n);
        }
        if let Some(end) = inbox.ended() {
            return end;
        }
        /// Puts the lent buffer back however the wait ends.
        struct Lend<'a> {
            inbox: &'a Inbox,
            buf: &'a mut Vec<u8>,
        }
        impl Drop for Lend<'_> {
            fn drop(&mut self) {
                if let Some((buf, _)) = self.inbox.reclaim() {
                    *self.buf = buf;
                }
            }
        }
        inbox.lend(std::mem::take(buf), at);
        let lend = Lend { inbox, buf };
        let end = std::future::poll_fn(|cx| {
            if inbox.filled() {
                return Poll::Ready(None);
            }
            if let Some(end) = inbox.ended() {
                return Poll::Ready(Some(end));
            }
            // Not armed: the first read, or the receive paused, ran out of buffers, or
            // stopped.
            if !inbox.armed() {
                self.arm(fd, inbox);
            }
            inbox.wait(cx.waker());
            Poll::Pending
        })
        .await;
        let got = inbox.reclaim().map(|(back, got)| {
            *lend.buf = back;
            got
        });
        drop(lend);
        match end {
            Some(end) => end,
            None => Ok(got.expect("the lent buffer")),
        }
    }

    /// Waits until `fd`'s multishot receive has brought bytes into `inbox`'s spill or ended
    /// (arming it when it is not armed), lending no buffer: an idle connection's wait. A
    /// small future, as it is what an idle connection's task holds.
    pub fn wait_received<'a>(
        self: &'a Rc<Self>,
        fd: RawFd,
        inbox: &'a Rc<Inbox>,
    ) -> impl std::future::Future<Output = ()> + 'a {
        inbox.wait_idle();
        std::future::poll_fn(move |cx| {
            if inbox.ready() {
                return Poll::Ready(());
            }
            if !inbox.armed() {
                self.arm(fd, inbox);
            }
            inbox.wait(cx.waker());
            Poll::Pending
        })
    }

    /// Arms `fd`'s multishot receive into `inbox`.
    fn arm(self: &Rc<Self>, fd: RawFd, inbox: &Rc<Inbox>) {
        self.stats.borrow_mut().receives_armed += 1;
        let msg = match (inbox.stamped(), self.provided.borrow().as_ref()) {
            (true, Some(provided)) => Some(provided.stamped_header() as *const libc::msghdr),
            _ => None,
        };
        let (index, generation) = self.start(
            OpKind::Recv,
            fd,
            None,
            None,
            Some(Rc::clone(inbox)),
            |_, target| match msg {
                // The header lives with the provided buffers, as long as the ring.
                Some(msg) => opcode::RecvMsgMulti::new(target, msg, BUFFER_GROUP).build(),
                None => opcode::RecvMulti::new(target, BUFFER_GROUP).build(),
            },
        );
        // Nobody awaits it: the slot frees itself at its last completion.
        self.slots.borrow_mut()[index].detached = true;
        inbox.set_armed(user_data(index, generation));
    }

    /// Cancels `inbox`'s armed receive (its last completion still comes).
    pub fn cancel_receive(&self, inbox: &Inbox) {
        if let Some(user_data) = inbox.to_cancel() {
            self.cancel(user_data);
        }
    }

    /// Cancels `inbox`'s armed receive and waits for its last completion, so that nothing
    /// more arrives there: the socket may then be read some other way (bytes already
    /// spilled come first).
    pub async fn pause_receive(&self, inbox: &Inbox) {
        self.cancel_receive(inbox);
        std::future::poll_fn(|cx| {
            if !inbox.armed() {
                return Poll::Ready(());
            }
            inbox.wait(cx.waker());
            Poll::Pending
        })
        .await
    }
}
