//! A blocking NETLINK_ROUTE socket that sends one request at a time and
//! collects its answer: the ACK (or error) of a change, the reply of a get,
//! or every part of a dump up to `NLMSG_DONE`.
//!
//! Invariants: each request carries a fresh sequence number and replies with
//! another sequence number (leftovers of an abandoned dump) are skipped; the
//! socket asks for extended ACKs (`NETLINK_EXT_ACK`) so errors carry the
//! kernel's own explanation, and for capped ACKs (`NETLINK_CAP_ACK`) so an
//! error does not echo our whole request back.
//!
//! Retries: `EINTR` on send/recv is retried; a dump that the kernel flags as
//! inconsistent (`NLM_F_DUMP_INTR`, the tree changed while it was walked) or
//! that overran the socket buffer (`ENOBUFS`) is restarted from scratch a few
//! times. A change request is never re-sent: we cannot know whether it was
//! applied.
//!
//! Non-goals: multicast notifications, asynchronous use, batching.

use std::io;

use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

use super::message::{align4, parse_attrs};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;

pub(crate) const NLM_F_REQUEST: u16 = 0x1;
/// Ask the kernel to send the created object back (a filter's priority).
pub(crate) const NLM_F_ECHO: u16 = 0x8;
const NLM_F_MULTI: u16 = 0x2;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP_INTR: u16 = 0x10;
const NLM_F_DUMP: u16 = 0x300;
pub(crate) const NLM_F_REPLACE: u16 = 0x100;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
/// Set by the kernel on an error message whose echoed request was cut to
/// its header (we asked for that with `NETLINK_CAP_ACK`).
const NLM_F_CAPPED: u16 = 0x100;
/// Set by the kernel when extended-ACK attributes follow the error.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// `NLMSGERR_ATTR_MSG` in `include/uapi/linux/netlink.h`.
const NLMSGERR_ATTR_MSG: u16 = 1;

/// How often an inconsistent dump is restarted before giving up.
const DUMP_ATTEMPTS: u32 = 5;

/// A failed request: the errno and, if the kernel gave one, its extended-ACK
/// message (e.g. "Specified qdisc kind is unknown").
#[derive(Debug)]
pub(crate) struct NlError {
    pub source: io::Error,
    pub kernel: Option<String>,
}

impl NlError {
    fn io(source: io::Error) -> Self {
        Self {
            source,
            kernel: None,
        }
    }

    fn malformed(detail: String) -> Self {
        Self::io(io::Error::new(io::ErrorKind::InvalidData, detail))
    }

    /// The errno, if this came from the kernel or a syscall.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

/// One parsed netlink message: its type, flags and body (after the header).
struct Frame {
    ty: u16,
    flags: u16,
    seq: u32,
    body: Vec<u8>,
}

/// A NETLINK_ROUTE socket in the calling thread's network namespace.
pub(crate) struct Netlink {
    socket: Socket,
    seq: u32,
}

impl Netlink {
    /// Opens and binds the socket and turns on extended, capped ACKs.
    pub fn open() -> io::Result<Self> {
        Self::open_protocol(NETLINK_ROUTE)
    }

    /// Opens a socket of another netlink family (e.g. NETLINK_NETFILTER for
    /// ctnetlink, whose dumps and errors follow the same rules).
    pub fn open_protocol(protocol: isize) -> io::Result<Self> {
        let mut socket = Socket::new(protocol)?;
        socket.bind_auto()?;
        // Old kernels lack these options; errors then simply carry no text.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_cap_ack(true);
        Ok(Self { socket, seq: 0 })
    }

    /// Sends a change or get request (`NLM_F_REQUEST | NLM_F_ACK | flags`)
    /// and returns the bodies of the messages the kernel sent before its
    /// ACK (a get's reply; nothing for a change).
    pub fn request(&mut self, ty: u16, flags: u16, body: &[u8]) -> Result<Vec<Vec<u8>>, NlError> {
        let seq = self.send(ty, NLM_F_REQUEST | NLM_F_ACK | flags, body)?;
        let mut replies = Vec::new();
        loop {
            for frame in self.recv_frames()? {
                if frame.seq != seq {
                    continue;
                }
                if frame.ty == NLMSG_ERROR {
                    return ack_result(&frame).map(|()| replies);
                }
                replies.push(frame.body);
            }
        }
    }

    /// Dumps all objects of a kind (`NLM_F_DUMP`) and returns the bodies of
    /// the messages of type `reply_ty`. Restarts an inconsistent dump.
    pub fn dump(&mut self, ty: u16, reply_ty: u16, body: &[u8]) -> Result<Vec<Vec<u8>>, NlError> {
        let mut attempt = 1;
        loop {
            match self.dump_once(ty, reply_ty, body) {
                Ok(Some(bodies)) => return Ok(bodies),
                Ok(None) if attempt < DUMP_ATTEMPTS => {}
                Ok(None) => {
                    return Err(NlError::malformed(format!(
                        "the dump stayed inconsistent (NLM_F_DUMP_INTR) over {DUMP_ATTEMPTS} \
                         attempts: the tree is changing under us"
                    )));
                }
                Err(e) if e.errno() == Some(libc::ENOBUFS) && attempt < DUMP_ATTEMPTS => {}
                Err(e) => return Err(e),
            }
            attempt += 1;
        }
    }

    /// One dump attempt; `None` if the kernel flagged it inconsistent.
    fn dump_once(
        &mut self,
        ty: u16,
        reply_ty: u16,
        body: &[u8],
    ) -> Result<Option<Vec<Vec<u8>>>, NlError> {
        let seq = self.send(ty, NLM_F_REQUEST | NLM_F_DUMP, body)?;
        let mut bodies = Vec::new();
        let mut interrupted = false;
        loop {
            for frame in self.recv_frames()? {
                if frame.seq != seq {
                    continue;
                }
                interrupted |= frame.flags & NLM_F_DUMP_INTR != 0;
                match frame.ty {
                    NLMSG_DONE => {
                        // The body of DONE is the dump's final status.
                        ack_result(&frame)?;
                        return Ok((!interrupted).then_some(bodies));
                    }
                    NLMSG_ERROR => {
                        ack_result(&frame)?;
                        return Ok((!interrupted).then_some(bodies));
                    }
                    t if t == reply_ty => bodies.push(frame.body),
                    _ => {}
                }
                if frame.flags & NLM_F_MULTI == 0 && frame.ty == reply_ty {
                    // A non-multipart answer ends the dump by itself.
                    return Ok((!interrupted).then_some(bodies));
                }
            }
        }
    }

    fn send(&mut self, ty: u16, flags: u16, body: &[u8]) -> Result<u32, NlError> {
        self.seq = self.seq.wrapping_add(1);
        let len = u32::try_from(NLMSG_HDRLEN + body.len())
            .map_err(|_| NlError::malformed("request larger than 4 GiB".into()))?;
        let mut msg = Vec::with_capacity(NLMSG_HDRLEN + body.len());
        msg.extend_from_slice(&len.to_ne_bytes());
        msg.extend_from_slice(&ty.to_ne_bytes());
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&self.seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel fills it in
        msg.extend_from_slice(body);
        loop {
            match self.socket.send(&msg, 0) {
                Ok(_) => return Ok(self.seq),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NlError::io(e)),
            }
        }
    }

    /// Receives one datagram, sized by peeking first so that no message is
    /// ever truncated, and splits it into frames.
    fn recv_frames(&mut self) -> Result<Vec<Frame>, NlError> {
        let size = loop {
            let mut probe: Vec<u8> = Vec::with_capacity(64);
            match self
                .socket
                .recv(&mut probe, libc::MSG_PEEK | libc::MSG_TRUNC)
            {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NlError::io(e)),
            }
        };
        let mut buf: Vec<u8> = Vec::with_capacity(size.max(64));
        loop {
            match self.socket.recv(&mut buf, 0) {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NlError::io(e)),
            }
        }
        split_frames(&buf).map_err(NlError::malformed)
    }
}

/// Splits a datagram into netlink messages.
fn split_frames(mut buf: &[u8]) -> Result<Vec<Frame>, String> {
    let mut frames = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(format!(
                "netlink message length {len} with {} bytes left",
                buf.len()
            ));
        }
        frames.push(Frame {
            ty: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]),
            body: buf[NLMSG_HDRLEN..len].to_vec(),
        });
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(frames)
}

/// Interprets an `NLMSG_ERROR` or `NLMSG_DONE` body: `struct nlmsgerr` (or
/// a bare status for DONE), then extended-ACK attributes when flagged.
/// Status 0 is success; a kernel message on success is a warning, logged.
fn ack_result(frame: &Frame) -> Result<(), NlError> {
    let body = &frame.body;
    if body.len() < 4 {
        // An empty DONE (old kernels) means success.
        return if frame.ty == NLMSG_DONE {
            Ok(())
        } else {
            Err(NlError::malformed("short NLMSG_ERROR".into()))
        };
    }
    let status = i32::from_ne_bytes([body[0], body[1], body[2], body[3]]);
    let kernel = if frame.flags & NLM_F_ACK_TLVS != 0 {
        ext_ack_message(frame)
    } else {
        None
    };
    if status == 0 {
        if let Some(msg) = kernel {
            tracing::debug!(kernel = %msg, "netlink request succeeded with a warning");
        }
        return Ok(());
    }
    Err(NlError {
        source: io::Error::from_raw_os_error(status.saturating_neg()),
        kernel,
    })
}

/// Finds `NLMSGERR_ATTR_MSG` after the (possibly capped) echoed request.
fn ext_ack_message(frame: &Frame) -> Option<String> {
    let body = &frame.body;
    let tlv_start = if frame.ty == NLMSG_DONE {
        4
    } else {
        // error code, then the echoed nlmsghdr, then (uncapped) its payload.
        let echoed = body.get(4..4 + NLMSG_HDRLEN)?;
        let echoed_len = u32::from_ne_bytes([echoed[0], echoed[1], echoed[2], echoed[3]]) as usize;
        if frame.flags & NLM_F_CAPPED != 0 {
            4 + NLMSG_HDRLEN
        } else {
            4 + align4(echoed_len)
        }
    };
    let attrs = parse_attrs(body.get(tlv_start..)?).ok()?;
    let msg = attrs.iter().find(|a| a.number() == NLMSGERR_ATTR_MSG)?;
    msg.as_str()
        .map(|s| s.trim_end().to_owned())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tc::message::{Attr, encode_attrs};

    fn error_frame(status: i32, capped: bool, msg: Option<&str>) -> Frame {
        let mut body = status.to_ne_bytes().to_vec();
        let echoed_len: u32 = 16 + 20;
        body.extend_from_slice(&echoed_len.to_ne_bytes());
        body.extend_from_slice(&[0; 12]);
        if !capped {
            body.extend_from_slice(&[0; 20]);
        }
        let mut flags = if capped { NLM_F_CAPPED } else { 0 };
        if let Some(m) = msg {
            flags |= NLM_F_ACK_TLVS;
            body.extend_from_slice(&encode_attrs(&[Attr::string(NLMSGERR_ATTR_MSG, m)]));
        }
        Frame {
            ty: NLMSG_ERROR,
            flags,
            seq: 1,
            body,
        }
    }

    #[test]
    fn error_with_extended_ack_message() {
        for capped in [true, false] {
            let e = ack_result(&error_frame(
                -libc::ENOENT,
                capped,
                Some("Specified qdisc kind is unknown."),
            ))
            .expect_err("must fail");
            assert_eq!(e.errno(), Some(libc::ENOENT));
            assert_eq!(
                e.kernel.as_deref(),
                Some("Specified qdisc kind is unknown.")
            );
        }
    }

    #[test]
    fn ack_without_message_is_ok() {
        assert!(ack_result(&error_frame(0, true, None)).is_ok());
        assert!(ack_result(&error_frame(0, true, Some("a warning"))).is_ok());
        let e = ack_result(&error_frame(-libc::EINVAL, true, None)).expect_err("must fail");
        assert_eq!(e.errno(), Some(libc::EINVAL));
        assert!(e.kernel.is_none());
    }

    #[test]
    fn frames_split_and_reject_bad_lengths() {
        let mut buf = Vec::new();
        for ty in [36u16, NLMSG_DONE] {
            buf.extend_from_slice(&20u32.to_ne_bytes());
            buf.extend_from_slice(&ty.to_ne_bytes());
            buf.extend_from_slice(&NLM_F_MULTI.to_ne_bytes());
            buf.extend_from_slice(&[0; 8]);
            buf.extend_from_slice(&[0; 4]);
        }
        let frames = split_frames(&buf).expect("must succeed");
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].ty, NLMSG_DONE);
        buf[0] = 200;
        assert!(split_frames(&buf).is_err());
    }
}
