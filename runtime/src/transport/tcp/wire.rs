//! The data plane of the tcp transport, as the network proxy runs it (`net/proxy.rs`): one rank's sockets to its peers
//! and the links' rings (`net/ring.rs`), which the executor fills and drains without a lock; its `Carrier`.
//!
//! - A message the executor posted goes onto its socket at once with one `writev` (header + message), or as much of
//!   it as the socket takes, the rest at the next pump; `Ring::sent` then says the slot may be reused.
//! - The proxy reads frames off the socket into the rings' slots: the header first, whose link and length are
//!   checked against the links this rank's plans opened before the message is read (straight into its slot when
//!   large).
//! - Credits keep the sender within the receiver's slots, as shared memory's ring does: the sender reserves only
//!   while it has fewer than `SLOTS` messages unconsumed; a receiver's consumption goes back as a credit riding on a
//!   message the other way, as a credit frame once half the slots are free, or when the proxy has nothing else to
//!   do. So every frame that arrives has a slot, and the schedules the verifier proved deadlock-free with `SLOTS`
//!   slots per connection (or fewer) stay so when several links share a socket.
//! - A frame for a link this rank has not opened yet (a peer already in the next call) waits in the socket until
//!   a plan opens that link; frames after it on that socket belong to that call or later ones, which this rank
//!   does not need before then.

use crate::transport::net::frame::{self, Frame, Kind};
use crate::transport::net::proxy::{Carrier, Fault};
use crate::transport::net::ring::{Ring, SLOTS_U};
use crate::transport::{LinkEnd, SLOTS};
use std::collections::{HashMap, VecDeque};
use std::io::{IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The staging buffer of a socket; a message body larger than this is read straight into its slot.
const STAGE: usize = 64 << 10;
/// Bytes read into the staging buffer at a time: a header and a small message, or many small frames, in one
/// read, but no more than this of a large body copied through the staging buffer.
const STAGE_READ: usize = 4 << 10;

/// One registered link, as the proxy keeps it.
struct LinkState {
    ring: Arc<Ring>,
    /// Sender: messages queued on the socket so far.
    queued: u64,
    /// Sender: each slot's frame header, made when queued and kept until the frame is written.
    headers: [[u8; frame::HEADER]; SLOTS_U],
    /// Receiver: the consumed count last sent as a credit, and whether a credit frame is queued.
    reported: u64,
    credit_queued: bool,
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

/// One rank's sockets and links, owned by its proxy thread.
pub(crate) struct Wire {
    pub rank: u32,
    pub job: u64,
    /// Sockets to each peer (empty until a plan needs the peer).
    pub peers: Vec<Vec<Socket>>,
    links: Vec<LinkState>,
    by_end: HashMap<(LinkEnd, u16), u32>,
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
            fault: None,
        }
    }

    /// Takes `ring` on (its peer's sockets must be up).
    pub fn register(&mut self, ring: Arc<Ring>) {
        let key = (ring.end, ring.lane);
        if self.by_end.contains_key(&key) {
            return;
        }
        self.links.push(LinkState {
            ring,
            queued: 0,
            headers: [[0u8; frame::HEADER]; SLOTS_U],
            reported: 0,
            credit_queued: false,
        });
        self.by_end.insert(key, (self.links.len() - 1) as u32);
    }

    fn fail(&mut self, peer: u32, how: String) {
        self.fault.get_or_insert((peer, how));
    }

    /// One round of the proxy: queues what the executors posted, moves what can move on every socket without
    /// waiting, and sends the credits owed (all of them when `idle`: the proxy is about to wait, and a sender that
    /// waits for room while this rank waits for its next message would otherwise wait for good). Whether anything
    /// moved.
    pub fn pump(&mut self, idle: bool) -> bool {
        let mut moved = self.queue_posted();
        moved |= self.queue_credits(idle);
        for peer in 0..self.peers.len() as u32 {
            for socket in 0..self.peers[peer as usize].len() {
                moved |= self.pump_out(peer, socket);
                moved |= self.pump_in(peer, socket);
            }
        }
        moved
    }

    /// Inline: queues what the executor posted and writes `peer`'s socket `socket` (where the post went).
    pub fn send_posted(&mut self, peer: u32, socket: usize) {
        self.queue_posted();
        self.pump_out(peer, socket);
    }

    /// Inline: queues the credits owed for half a ring or more, and writes them.
    pub fn send_credits(&mut self) {
        if self.queue_credits(false) {
            for peer in 0..self.peers.len() as u32 {
                for socket in 0..self.peers[peer as usize].len() {
                    if !self.peers[peer as usize][socket].out.is_empty() {
                        self.pump_out(peer, socket);
                    }
                }
            }
        }
    }

    /// Inline: reads `peer`'s socket `socket` (a ring on it was empty, or full and waiting for credits).
    pub fn receive(&mut self, peer: u32, socket: usize) {
        self.pump_in(peer, socket);
    }

    /// Queues on their sockets the messages posted since the last round, each with its frame header (and the
    /// credit of the link the other way riding on it, if that one owes one).
    fn queue_posted(&mut self) -> bool {
        let mut moved = false;
        for link in 0..self.links.len() {
            let posted = self.links[link].ring.posted.load(Ordering::Acquire);
            while self.links[link].queued < posted {
                let (ring, message) = (self.links[link].ring.clone(), self.links[link].queued);
                let meta = ring.meta(message);
                let (end, lane) = (ring.end, ring.lane);
                let (key, len) = ((end.channel, lane), meta.len as u32);
                let mut header = Frame::data(key, end.slot_bytes as u32, len, meta.stamp, self.job, meta.call);
                let back = LinkEnd { from: end.to, to: end.from, ..end };
                if let Some(&back) = self.by_end.get(&(back, lane)) {
                    let back = &mut self.links[back as usize];
                    let consumed = back.ring.consumed.load(Ordering::Acquire);
                    if consumed > back.reported {
                        back.reported = consumed;
                        header.credit = consumed + 1;
                    }
                }
                let state = &mut self.links[link];
                state.headers[(message % SLOTS) as usize] = header.encode();
                state.queued += 1;
                self.peers[ring.peer as usize][ring.socket].out.push_back(Out::Data { link: link as u32, message });
                moved = true;
            }
        }
        moved
    }

    /// Queues a credit frame for every link whose receiver consumed half its slots since the last credit (any, when
    /// `all`).
    fn queue_credits(&mut self, all: bool) -> bool {
        let mut moved = false;
        for link in 0..self.links.len() {
            let state = &mut self.links[link];
            let consumed = state.ring.consumed.load(Ordering::Acquire);
            let owed = consumed - state.reported;
            if state.credit_queued || owed == 0 || (!all && owed < SLOTS / 2) {
                continue;
            }
            state.reported = consumed;
            state.credit_queued = true;
            let (peer, socket) = (state.ring.peer, state.ring.socket);
            self.peers[peer as usize][socket].out.push_back(Out::Credit { link: link as u32 });
            moved = true;
        }
        moved
    }

    /// The sockets' descriptors and the events to wait for: readable, unless a frame is parked; writable, if it has
    /// something to write.
    pub fn poll_fds(&self, fds: &mut Vec<libc::pollfd>) {
        use std::os::fd::AsRawFd;
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
    }

    /// Writes as much of `peer`'s socket's queue as it takes; whether a byte moved.
    fn pump_out(&mut self, peer: u32, socket: usize) -> bool {
        let mut moved = false;
        loop {
            let s = &mut self.peers[peer as usize][socket];
            let Some(&front) = s.out.front() else { return moved };
            if s.closed {
                return moved;
            }
            let result = match front {
                Out::Data { link, message } => {
                    let state = &self.links[link as usize];
                    let header = &state.headers[(message % SLOTS) as usize];
                    let len = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes")) as usize;
                    let body = state.ring.slot(message);
                    // SAFETY: the slot holds `len` bytes of the posted message until `sent` passes it.
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
                        let end = state.ring.end;
                        let key = (end.channel, state.ring.lane);
                        Frame::credit(key, end.slot_bytes as u32, state.reported, self.job).encode()
                    });
                    s.stream.write(&header[s.written..]).map(|n| (n, frame::HEADER))
                }
            };
            match result {
                Ok((n, total)) => {
                    moved |= n > 0;
                    s.written += n;
                    if s.written < total {
                        continue;
                    }
                    s.written = 0;
                    s.credit = None;
                    if let Some(Out::Data { link, message }) = s.out.pop_front() {
                        self.links[link as usize].ring.sent.store(message + 1, Ordering::Release);
                    }
                }
                Err(e) if would_block(&e) => return moved,
                Err(e) => {
                    s.closed = true;
                    self.fail(peer, format!("broke its connection to this rank ({e})"));
                    return moved;
                }
            }
        }
    }

    /// Reads what `peer`'s socket has, into the slots of the links its frames are for; whether a byte moved.
    fn pump_in(&mut self, peer: u32, socket: usize) -> bool {
        let mut reads = 0;
        let mut moved = false;
        loop {
            if !self.consume_stage(peer, socket) {
                return moved;
            }
            let s = &mut self.peers[peer as usize][socket];
            if s.closed || reads == 4 {
                return moved;
            }
            reads += 1;
            // A large body goes straight into its slot; everything else through the staging buffer.
            let result = match s.reading {
                Reading::Body { link, message, len, got } if len - got >= STAGE_READ && s.stage_lo == s.stage_hi => {
                    let slot = self.links[link as usize].ring.slot(message);
                    // SAFETY: the slot has room for `len` bytes (checked against its size when the header came), and
                    // is the proxy's until `received` passes it.
                    let dst = unsafe { std::slice::from_raw_parts_mut(slot.add(got), len - got) };
                    match s.stream.read(dst) {
                        Ok(n) if n > 0 => {
                            moved = true;
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
                            moved = true;
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
                    return moved;
                }
                Err(e) if would_block(&e) => return moved,
                Err(e) => {
                    s.closed = true;
                    self.fail(peer, format!("broke its connection to this rank ({e})"));
                    return moved;
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
                    let Some(&link) = self.by_end.get(&(end, frame.lane)) else { return false };
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
                    let slot = self.links[link as usize].ring.slot(message);
                    // SAFETY: got + n <= len <= the slot's size; the slot is the proxy's until `received` passes it.
                    unsafe { std::ptr::copy_nonoverlapping(s.stage[s.stage_lo..].as_ptr(), slot.add(got), n) };
                    s.stage_lo += n;
                    if got + n < len {
                        s.reading = Reading::Body { link, message, len, got: got + n };
                        return true;
                    }
                    s.reading = Reading::Header;
                    self.links[link as usize].ring.received.store(message + 1, Ordering::Release);
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
                            let Some(&link) = self.by_end.get(&(ours, frame.lane)) else {
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
                                let Some(&back) = self.by_end.get(&(ours, frame.lane)) else {
                                    let how = format!("sent a credit for no link ({ours:?})");
                                    return self.protocol_fault(peer, socket, how);
                                };
                                if !self.take_credit(peer, socket, back, frame.credit - 1) {
                                    return false;
                                }
                            }
                            match self.by_end.get(&(end, frame.lane)) {
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
        let ring = &self.links[link as usize].ring;
        let sent = ring.sent.load(Ordering::Relaxed);
        if consumed > sent {
            let how = format!("sent a credit for {consumed} messages on a link with {sent} sent");
            return self.protocol_fault(peer, socket, how);
        }
        ring.credited.fetch_max(consumed, Ordering::Release);
        true
    }

    /// Starts reading the body of `frame` into `link`'s next slot; false on a fault.
    fn accept_data(&mut self, peer: u32, socket: usize, link: u32, frame: Frame) -> bool {
        let ring = &self.links[link as usize].ring;
        let message = ring.received.load(Ordering::Relaxed);
        if message - ring.consumed.load(Ordering::Acquire) >= SLOTS {
            let how = format!("sent more than {SLOTS} messages ahead of this rank on a link (beyond its credits)");
            return self.protocol_fault(peer, socket, how);
        }
        ring.set_arrived(message, frame);
        let s = &mut self.peers[peer as usize][socket];
        if frame.len == 0 {
            s.reading = Reading::Header;
            ring.received.store(message + 1, Ordering::Release);
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

    /// Frames parked on sockets waiting for a link this rank has not opened (a peer in another call, for mismatch
    /// reports): the peer and the frame.
    pub fn parked(&self) -> Vec<(u32, Frame)> {
        let mut found = Vec::new();
        for (peer, sockets) in self.peers.iter().enumerate() {
            for s in sockets {
                if let Reading::Parked(frame) = s.reading {
                    found.push((peer as u32, frame));
                }
            }
        }
        found
    }
}

/// The proxy carries a rank's sockets: `Peer` is a peer's sockets.
impl Carrier for Wire {
    type Peer = Vec<Socket>;

    fn rank(&self) -> u32 {
        self.rank
    }

    fn add_peer(&mut self, peer: u32, sockets: Vec<Socket>) {
        self.peers[peer as usize] = sockets;
    }

    fn register(&mut self, ring: Arc<Ring>) {
        Wire::register(self, ring);
    }

    fn pump(&mut self, idle: bool) -> bool {
        Wire::pump(self, idle)
    }

    fn send_posted(&mut self, ring: &Ring) {
        Wire::send_posted(self, ring.peer, ring.socket);
    }

    fn send_credits(&mut self) {
        Wire::send_credits(self);
    }

    fn receive(&mut self, ring: &Ring) {
        Wire::receive(self, ring.peer, ring.socket);
    }

    fn poll_fds(&self, fds: &mut Vec<libc::pollfd>) {
        Wire::poll_fds(self, fds);
    }

    fn fault(&self) -> Option<&Fault> {
        self.fault.as_ref()
    }

    fn parked(&self) -> Vec<(u32, Frame)> {
        Wire::parked(self)
    }
}
