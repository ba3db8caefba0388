//! The data plane of the tcp transport: one rank's sockets to its peers and the message slots of its links.
//!
//! - Every link (a connection of the plan: from, to, channel, slot size) has `SLOTS` slots on each end, in local
//!   memory. The sender writes a message into its slot and posts it: the frame (header + message) goes onto the
//!   socket at once with one `writev`, or as much of it as the socket takes, the rest at the next pump.
//! - The receiver reads frames off the socket into its slots: the header first, whose link and length are checked
//!   against the links this rank's plans opened before the message is read (straight into its slot when large).
//! - Credits keep the sender within the receiver's slots, as shared memory's ring does: a receiver that releases a
//!   message sends a credit frame (coalesced: the latest count goes out), and the sender reserves only while it has
//!   fewer than `SLOTS` messages unconsumed. So every frame that arrives has a slot, and the schedules the verifier
//!   proved deadlock-free with `SLOTS` slots per connection (or fewer) stay so when several links share a socket.
//! - A frame for a link this rank has not opened yet (a peer already in the next call) waits in the socket until
//!   a plan opens that link; frames after it on that socket belong to that call or later ones, which this rank
//!   does not need before then.
//!
//! There is no thread: the executor drives the sockets (non-blocking) when it posts, peeks, or goes idle
//! (`Link::progress`), and the rendezvous reports failures.

use super::frame::{self, Frame, Kind};
use crate::transport::{CallInfo, LinkEnd, Stamp, SLOTS};
use std::collections::{HashMap, VecDeque};
use std::io::{IoSlice, Read, Write};
use std::net::TcpStream;

const SLOTS_U: usize = SLOTS as usize;
/// The staging buffer of a socket; a message body larger than this is read straight into its slot.
const STAGE: usize = 64 << 10;
/// Bytes read into the staging buffer at a time: a header and a small message, or many small frames, in one
/// read, but no more than this of a large body copied through the staging buffer.
const STAGE_READ: usize = 4 << 10;

/// A link's memory: `SLOTS` slots of `slot_bytes`, 64-byte aligned.
struct Slots {
    storage: Vec<u8>,
    offset: usize,
    slot_bytes: usize,
}

impl Slots {
    fn new(slot_bytes: usize) -> Slots {
        let storage = vec![0u8; SLOTS_U * slot_bytes + 64];
        let offset = storage.as_ptr().align_offset(64);
        Slots { storage, offset, slot_bytes }
    }

    fn ptr(&mut self, message: u64) -> *mut u8 {
        let index = (message % SLOTS) as usize;
        self.storage[self.offset + index * self.slot_bytes..].as_mut_ptr()
    }
}

/// One registered link.
struct LinkState {
    end: LinkEnd,
    peer: u32,
    /// Which of the peer's sockets carries it.
    socket: usize,
    slots: Slots,
    /// Sender: messages posted, and consumed by the receiver as its last credit said.
    posted: u64,
    credited: u64,
    /// Sender: each slot's frame header, kept until the frame is written.
    headers: [[u8; frame::HEADER]; SLOTS_U],
    /// Receiver: messages arrived whole, consumed, and the consumed count last sent as a credit.
    received: u64,
    consumed: u64,
    reported: u64,
    credit_queued: bool,
    /// Receiver: each slot's header as it arrived (stamp, length, the sender's call).
    arrived: [Option<Frame>; SLOTS_U],
}

/// What a socket still has to write, in order.
#[derive(Clone, Copy, Debug)]
enum Out {
    /// The frame of slot `message % SLOTS` of a link.
    Data { link: u32, message: u64 },
    /// A credit for a link: its count is read when it is written.
    Credit { link: u32 },
}

/// The frame being read off a socket.
#[derive(Clone, Copy)]
enum Reading {
    /// Waiting for a header.
    Header,
    /// A message body: into `link`'s slot of message `message`, `got` of `len` bytes so far.
    Body { link: u32, message: u64, len: usize, got: usize },
    /// A data frame for a link not opened yet: kept until a plan opens it.
    Parked(Frame),
}

pub(crate) struct Socket {
    stream: TcpStream,
    out: VecDeque<Out>,
    /// Bytes of `out.front()` already written (its header then its message).
    written: usize,
    /// The credit frame being written, fixed once it starts.
    credit: Option<[u8; frame::HEADER]>,
    stage: Box<[u8]>,
    stage_lo: usize,
    stage_hi: usize,
    reading: Reading,
    closed: bool,
}

impl Socket {
    pub fn new(stream: TcpStream) -> std::io::Result<Socket> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(Socket {
            stream,
            out: VecDeque::new(),
            written: 0,
            credit: None,
            stage: vec![0u8; STAGE].into_boxed_slice(),
            stage_lo: 0,
            stage_hi: 0,
            reading: Reading::Header,
            closed: false,
        })
    }
}

/// A fault on the data plane: the peer, and what happened.
pub(crate) type Fault = (u32, String);

/// One rank's sockets and links.
pub(crate) struct Wire {
    pub rank: u32,
    pub job: u64,
    /// Sockets to each peer (empty until a plan needs the peer).
    pub peers: Vec<Vec<Socket>>,
    links: Vec<LinkState>,
    by_end: HashMap<LinkEnd, u32>,
    /// The call being run, for the headers of what is sent.
    pub call: CallInfo,
    pub fault: Option<Fault>,
}

/// `writev` that does not raise SIGPIPE when the peer has gone (`sendmsg` with `MSG_NOSIGNAL`, as std's own
/// `write` on a socket does): a dead peer is an error naming it, not the death of this rank.
fn send_vectored(stream: &TcpStream, slices: &[IoSlice]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: msghdr is plain data; the iovecs point at `slices`, which IoSlice lays out as iovec and which live
    // for the call.
    let sent = unsafe {
        let mut message: libc::msghdr = std::mem::zeroed();
        message.msg_iov = slices.as_ptr() as *mut libc::iovec;
        message.msg_iovlen = slices.len() as _;
        libc::sendmsg(stream.as_raw_fd(), &message, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted)
}

impl Wire {
    pub fn new(rank: u32, n_ranks: u32, job: u64) -> Wire {
        Wire {
            rank,
            job,
            peers: (0..n_ranks).map(|_| Vec::new()).collect(),
            links: Vec::new(),
            by_end: HashMap::new(),
            call: CallInfo::NONE,
            fault: None,
        }
    }

    /// The link of `end`, registered on first use (its peer's sockets must be up).
    pub fn register(&mut self, end: &LinkEnd) -> u32 {
        if let Some(&id) = self.by_end.get(end) {
            return id;
        }
        let peer = if end.from == self.rank { end.to } else { end.from };
        let sockets = self.peers[peer as usize].len().max(1);
        let state = LinkState {
            end: *end,
            peer,
            socket: end.channel as usize % sockets,
            slots: Slots::new(end.slot_bytes),
            posted: 0,
            credited: 0,
            headers: [[0u8; frame::HEADER]; SLOTS_U],
            received: 0,
            consumed: 0,
            reported: 0,
            credit_queued: false,
            arrived: [None; SLOTS_U],
        };
        self.links.push(state);
        let id = (self.links.len() - 1) as u32;
        self.by_end.insert(*end, id);
        id
    }

    fn fail(&mut self, peer: u32, how: String) {
        self.fault.get_or_insert((peer, how));
    }

    // --- the sending end -------------------------------------------------------------------------------------

    pub fn reserve(&mut self, link: u32) -> Option<*mut u8> {
        let state = &self.links[link as usize];
        if state.posted - state.credited >= SLOTS {
            // Credits come with the peer's frames: read them.
            self.pump_in(state.peer, state.socket);
            let state = &self.links[link as usize];
            if state.posted - state.credited >= SLOTS {
                return None;
            }
        }
        let state = &mut self.links[link as usize];
        Some(state.slots.ptr(state.posted))
    }

    pub fn post(&mut self, link: u32, stamp: Stamp, len: usize) {
        let (job, call) = (self.job, self.call);
        let end = self.links[link as usize].end;
        let mut header = Frame::data(end.channel, end.slot_bytes as u32, len as u32, stamp, job, call);
        // The credit of the link the other way rides on the message, if it owes one.
        let back = LinkEnd { from: end.to, to: end.from, ..end };
        if let Some(&back) = self.by_end.get(&back) {
            let back = &mut self.links[back as usize];
            if back.consumed > back.reported {
                back.reported = back.consumed;
                header.credit = back.consumed + 1;
            }
        }
        let state = &mut self.links[link as usize];
        let message = state.posted;
        state.headers[(message % SLOTS) as usize] = header.encode();
        state.posted += 1;
        let (peer, socket) = (state.peer, state.socket);
        self.peers[peer as usize][socket].out.push_back(Out::Data { link, message });
        self.pump_out(peer, socket);
    }

    // --- the receiving end -----------------------------------------------------------------------------------

    pub fn peek(&mut self, link: u32) -> Option<(Stamp, *const u8)> {
        if self.links[link as usize].received == self.links[link as usize].consumed {
            let (peer, socket) = (self.links[link as usize].peer, self.links[link as usize].socket);
            self.pump_in(peer, socket);
        }
        let state = &mut self.links[link as usize];
        if state.received == state.consumed {
            return None;
        }
        let frame = state.arrived[(state.consumed % SLOTS) as usize].expect("an arrived message has its header");
        Some((frame.stamp(), state.slots.ptr(state.consumed) as *const u8))
    }

    /// The call of the sender of the message `peek` returned last.
    pub fn sender_call(&self, link: u32) -> Option<CallInfo> {
        let state = &self.links[link as usize];
        state.arrived[(state.consumed % SLOTS) as usize].map(|f| f.call)
    }

    /// Frees the slot; the sender hears of it with this rank's next message to it on the link the other way, when
    /// half the slots are free again, or when this rank waits past spinning (`flush_credits`): a message costs the
    /// receiver no system call of its own.
    pub fn release(&mut self, link: u32) {
        let state = &mut self.links[link as usize];
        state.arrived[(state.consumed % SLOTS) as usize] = None;
        state.consumed += 1;
        if state.consumed - state.reported >= SLOTS / 2 {
            self.send_credit(link);
        }
    }

    fn send_credit(&mut self, link: u32) {
        let state = &mut self.links[link as usize];
        state.reported = state.consumed;
        let (peer, socket) = (state.peer, state.socket);
        if !state.credit_queued {
            state.credit_queued = true;
            self.peers[peer as usize][socket].out.push_back(Out::Credit { link });
        }
        self.pump_out(peer, socket);
    }

    /// Sends every credit not sent yet: a rank about to wait tells its senders of all the room it has. (A sender
    /// that waits for room while this rank waits for its next message would otherwise wait for good.)
    pub fn flush_credits(&mut self) {
        for link in 0..self.links.len() as u32 {
            let state = &self.links[link as usize];
            if state.consumed > state.reported {
                self.send_credit(link);
            }
        }
    }

    // --- the sockets -----------------------------------------------------------------------------------------

    /// Moves what can move on every socket without waiting.
    pub fn pump_all(&mut self) {
        for peer in 0..self.peers.len() as u32 {
            for socket in 0..self.peers[peer as usize].len() {
                self.pump_out(peer, socket);
                self.pump_in(peer, socket);
            }
        }
    }

    /// Sleeps until a socket can be read (or written, if it has something to write), at most `timeout`: the wait
    /// of a rank that has spun long enough, woken by the kernel when data comes instead of taking turns on a core.
    pub fn sleep(&self, timeout: std::time::Duration) {
        use std::os::fd::AsRawFd;
        let mut fds: Vec<libc::pollfd> = Vec::new();
        for s in self.peers.iter().flatten().filter(|s| !s.closed) {
            let mut events = 0;
            if !matches!(s.reading, Reading::Parked(_)) {
                events |= libc::POLLIN;
            }
            if !s.out.is_empty() {
                events |= libc::POLLOUT;
            }
            if events != 0 {
                fds.push(libc::pollfd { fd: s.stream.as_raw_fd(), events, revents: 0 });
            }
        }
        if fds.is_empty() {
            std::thread::sleep(timeout.min(std::time::Duration::from_micros(100)));
            return;
        }
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures for the call's duration.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout.as_millis().max(1) as i32) };
    }

    /// Whether every socket has written all it has.
    pub fn flushed(&self) -> bool {
        self.peers.iter().flatten().all(|s| s.out.is_empty())
    }

    /// Writes as much of `peer`'s socket's queue as it takes.
    fn pump_out(&mut self, peer: u32, socket: usize) {
        loop {
            let s = &mut self.peers[peer as usize][socket];
            let Some(&front) = s.out.front() else { return };
            if s.closed {
                return;
            }
            let result = match front {
                Out::Data { link, message } => {
                    let state = &mut self.links[link as usize];
                    let header = &state.headers[(message % SLOTS) as usize];
                    let len = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes")) as usize;
                    let body = state.slots.ptr(message);
                    // SAFETY: the slot holds `len` bytes of the posted message until the receiver's credit frees it.
                    let body = unsafe { std::slice::from_raw_parts(body as *const u8, len) };
                    let total = frame::HEADER + len;
                    let done = s.written;
                    let wrote = if done < frame::HEADER {
                        send_vectored(&s.stream, &[IoSlice::new(&header[done..]), IoSlice::new(body)])
                    } else {
                        s.stream.write(&body[done - frame::HEADER..])
                    };
                    wrote.map(|n| (n, total))
                }
                Out::Credit { link } => {
                    let state = &mut self.links[link as usize];
                    let header = *s.credit.get_or_insert_with(|| {
                        state.credit_queued = false;
                        let end = state.end;
                        Frame::credit(end.channel, end.slot_bytes as u32, state.consumed, self.job).encode()
                    });
                    s.stream.write(&header[s.written..]).map(|n| (n, frame::HEADER))
                }
            };
            match result {
                Ok((n, total)) => {
                    s.written += n;
                    if s.written < total {
                        continue;
                    }
                    s.written = 0;
                    s.credit = None;
                    s.out.pop_front();
                }
                Err(e) if would_block(&e) => return,
                Err(e) => {
                    s.closed = true;
                    self.fail(peer, format!("broke its connection to this rank ({e})"));
                    return;
                }
            }
        }
    }

    /// Reads what `peer`'s socket has, into the slots of the links its frames are for.
    fn pump_in(&mut self, peer: u32, socket: usize) {
        let mut reads = 0;
        loop {
            if !self.consume_stage(peer, socket) {
                return;
            }
            let s = &mut self.peers[peer as usize][socket];
            if s.closed || reads == 4 {
                return;
            }
            reads += 1;
            // A large body goes straight into its slot; everything else through the staging buffer.
            let result = match s.reading {
                Reading::Body { link, message, len, got } if len - got >= STAGE_READ && s.stage_lo == s.stage_hi => {
                    let slot = self.links[link as usize].slots.ptr(message);
                    // SAFETY: the slot has room for `len` bytes (checked against its size when the header came).
                    let dst = unsafe { std::slice::from_raw_parts_mut(slot.add(got), len - got) };
                    match s.stream.read(dst) {
                        Ok(n) if n > 0 => {
                            s.reading = Reading::Body { link, message, len, got: got + n };
                            continue;
                        }
                        other => other,
                    }
                }
                _ => {
                    if s.stage_lo > 0 {
                        s.stage.copy_within(s.stage_lo..s.stage_hi, 0);
                        s.stage_hi -= s.stage_lo;
                        s.stage_lo = 0;
                    }
                    let hi = s.stage_hi;
                    let end = (hi + STAGE_READ).min(STAGE);
                    match s.stream.read(&mut s.stage[hi..end]) {
                        Ok(n) if n > 0 => {
                            s.stage_hi += n;
                            continue;
                        }
                        other => other,
                    }
                }
            };
            match result {
                Ok(_) => {
                    // End of stream: the peer closed. Whatever it sent has arrived; a wait for more fails on the
                    // rendezvous' notice or the timeout.
                    s.closed = true;
                    return;
                }
                Err(e) if would_block(&e) => return,
                Err(e) => {
                    s.closed = true;
                    self.fail(peer, format!("broke its connection to this rank ({e})"));
                    return;
                }
            }
        }
    }

    /// Takes whole frames (and body bytes) out of the socket's staging buffer; false when it cannot go on
    /// (a parked frame, or a fault).
    fn consume_stage(&mut self, peer: u32, socket: usize) -> bool {
        loop {
            let s = &mut self.peers[peer as usize][socket];
            match s.reading {
                Reading::Parked(frame) => {
                    let end = LinkEnd {
                        from: peer,
                        to: self.rank,
                        channel: frame.channel,
                        slot_bytes: frame.slot_bytes as usize,
                    };
                    let Some(&link) = self.by_end.get(&end) else { return false };
                    if !self.accept_data(peer, socket, link, frame) {
                        return false;
                    }
                }
                Reading::Body { link, message, len, got } => {
                    let available = s.stage_hi - s.stage_lo;
                    if got < len && available == 0 {
                        return true;
                    }
                    let n = (len - got).min(available);
                    let slot = self.links[link as usize].slots.ptr(message);
                    // SAFETY: got + n <= len <= the slot's size.
                    unsafe { std::ptr::copy_nonoverlapping(s.stage[s.stage_lo..].as_ptr(), slot.add(got), n) };
                    s.stage_lo += n;
                    if got + n < len {
                        s.reading = Reading::Body { link, message, len, got: got + n };
                        return true;
                    }
                    s.reading = Reading::Header;
                    self.links[link as usize].received += 1;
                }
                Reading::Header => {
                    if s.stage_hi - s.stage_lo < frame::HEADER {
                        return true;
                    }
                    let bytes: [u8; frame::HEADER] =
                        s.stage[s.stage_lo..s.stage_lo + frame::HEADER].try_into().expect("a header");
                    s.stage_lo += frame::HEADER;
                    let frame = match Frame::decode(&bytes) {
                        Ok(frame) if frame.job == self.job => frame,
                        Ok(frame) => {
                            let how =
                                format!("sent a frame of another job ({:#x}, this job {:#x})", frame.job, self.job);
                            return self.protocol_fault(peer, socket, how);
                        }
                        Err(e) => return self.protocol_fault(peer, socket, format!("sent a bad frame: {e}")),
                    };
                    let end = LinkEnd {
                        from: peer,
                        to: self.rank,
                        channel: frame.channel,
                        slot_bytes: frame.slot_bytes as usize,
                    };
                    match frame.kind {
                        Kind::Credit => {
                            // A credit is for the link this rank sends on.
                            let ours = LinkEnd { from: self.rank, to: peer, ..end };
                            let Some(&link) = self.by_end.get(&ours) else {
                                return self.protocol_fault(
                                    peer,
                                    socket,
                                    format!("sent a credit for no link ({ours:?})"),
                                );
                            };
                            if !self.take_credit(peer, socket, link, frame.seq) {
                                return false;
                            }
                        }
                        Kind::Data => {
                            if frame.credit != 0 {
                                let ours = LinkEnd { from: self.rank, to: peer, ..end };
                                let Some(&back) = self.by_end.get(&ours) else {
                                    let how = format!("sent a credit for no link ({ours:?})");
                                    return self.protocol_fault(peer, socket, how);
                                };
                                if !self.take_credit(peer, socket, back, frame.credit - 1) {
                                    return false;
                                }
                            }
                            match self.by_end.get(&end) {
                                Some(&link) => {
                                    if !self.accept_data(peer, socket, link, frame) {
                                        return false;
                                    }
                                }
                                None => {
                                    self.peers[peer as usize][socket].reading = Reading::Parked(frame);
                                    return false;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The receiver of this rank's `link` has consumed `consumed` of its messages; false on a fault. A credit older
    /// than one already taken (a credit frame can overtake the message carrying an older one) changes nothing.
    fn take_credit(&mut self, peer: u32, socket: usize, link: u32, consumed: u64) -> bool {
        let state = &mut self.links[link as usize];
        if consumed > state.posted {
            let how = format!("sent a credit for {consumed} messages on a link with {} posted", state.posted);
            return self.protocol_fault(peer, socket, how);
        }
        state.credited = state.credited.max(consumed);
        true
    }

    /// Starts reading the body of `frame` into `link`'s next slot; false on a fault.
    fn accept_data(&mut self, peer: u32, socket: usize, link: u32, frame: Frame) -> bool {
        let state = &mut self.links[link as usize];
        if state.received - state.consumed >= SLOTS {
            let how = format!("sent more than {SLOTS} messages ahead of this rank on a link (beyond its credits)");
            return self.protocol_fault(peer, socket, how);
        }
        let message = state.received;
        state.arrived[(message % SLOTS) as usize] = Some(frame);
        let s = &mut self.peers[peer as usize][socket];
        if frame.len == 0 {
            s.reading = Reading::Header;
            self.links[link as usize].received += 1;
        } else {
            s.reading = Reading::Body { link, message, len: frame.len as usize, got: 0 };
        }
        true
    }

    fn protocol_fault(&mut self, peer: u32, socket: usize, how: String) -> bool {
        let s = &mut self.peers[peer as usize][socket];
        s.closed = true;
        let _ = s.stream.shutdown(std::net::Shutdown::Both);
        crate::log::warn(
            crate::log::Subsys::Net,
            format_args!("rank {}: rank {peer} {how}; connection closed", self.rank),
        );
        self.fail(peer, how);
        false
    }

    /// The frame parked on a socket from `peer`, if one waits for a link this rank has not opened: a peer in
    /// another call (mismatch reports).
    pub fn parked_from(&self, peer: u32) -> Option<Frame> {
        self.peers[peer as usize].iter().find_map(|s| match s.reading {
            Reading::Parked(frame) => Some(frame),
            _ => None,
        })
    }

    /// Peers whose sockets have frames parked.
    pub fn parked(&self) -> impl Iterator<Item = (u32, Frame)> + '_ {
        (0..self.peers.len() as u32).filter_map(|p| self.parked_from(p).map(|f| (p, f)))
    }
}
