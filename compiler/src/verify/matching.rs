//! Matching: on every connection (sender, receiver, channel) the i-th send and the i-th receive exist and carry
//! the same number of chunks. Also builds the connection table the deadlock simulation runs on (and the cost model's
//! play of a schedule on shared cores, `cost/cores.rs`).

use super::Context;
use crate::diag::Error;
use crate::fxhash::FxBuildHasher;
use crate::sched::{Instr, RankProgram, Schedule, NO_RANK};
use std::collections::HashMap;

/// A directed connection and the instructions that use it, in program order (`Connections::sends_of`,
/// `Connections::recvs_of`).
#[derive(Clone, Copy)]
pub(crate) struct Connection {
    pub from: u32,
    pub to: u32,
    pub channel: u8,
    /// Where the instruction indices on `from` that send here lie in `Connections::send_list`.
    sends: Run,
    /// Where the instruction indices on `to` that receive from here lie in `Connections::recv_list`.
    recvs: Run,
}

/// A stretch of a list: `list[start..start + len]`.
#[derive(Clone, Copy, Default)]
struct Run {
    start: u32,
    len: u32,
}

impl Run {
    fn of(self, list: &[u32]) -> &[u32] {
        &list[self.start as usize..(self.start + self.len) as usize]
    }

    /// Writes `value` after the stretch, which `lay_out` made room for, and takes it in.
    fn push(&mut self, list: &mut [u32], value: u32) {
        list[(self.start + self.len) as usize] = value;
        self.len += 1;
    }
}

/// Every connection of a schedule, and for each rank the connections it sends and receives on.
pub(crate) struct Connections {
    pub list: Vec<Connection>,
    /// Every connection's sends, and its receives, each connection's in one stretch: all the sends of a connection
    /// come from one rank and all its receives go to one, so each stretch is laid out when its rank is added. Two
    /// lists sized once (at most one entry per instruction), not two per connection, which the system allocator
    /// served from fresh memory (536 MB at p = 4096, both placements), where these are cut from the pages the
    /// lowered program freed.
    send_list: Vec<u32>,
    recv_list: Vec<u32>,
    /// Where each rank's instructions start in the global numbering; the last entry is the total.
    pub rank_start: Vec<u32>,
    /// Per rank, the connections it sends on (keyed by receiver) and those it receives on (keyed by sender). An
    /// instruction finds its connections here by its peers and channel: a table per rank, not a pair of connection
    /// numbers per instruction, which at p = 4096 took 268 MB per schedule.
    sending: PeerIndex,
    receiving: PeerIndex,
}

/// Per rank, its connections sorted by (peer, channel): `entries[start[rank]..start[rank + 1]]`.
struct PeerIndex {
    start: Vec<u32>,
    entries: Vec<PeerConnection>,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct PeerConnection {
    peer: u32,
    channel: u8,
    conn: u32,
}

impl PeerIndex {
    fn new(n_ranks: usize) -> Self {
        let mut start = Vec::with_capacity(n_ranks + 1);
        start.push(0);
        PeerIndex { start, entries: Vec::new() }
    }

    /// Sorts the entries pushed since the last rank was closed, drops repeats, and closes the next rank.
    fn close_rank(&mut self) {
        let from = self.start[self.start.len() - 1] as usize;
        self.entries[from..].sort_unstable();
        let mut kept = from;
        for i in from..self.entries.len() {
            if kept == from || self.entries[kept - 1] != self.entries[i] {
                self.entries[kept] = self.entries[i];
                kept += 1;
            }
        }
        self.entries.truncate(kept);
        self.start.push(kept as u32);
    }

    #[inline]
    fn of_rank(&self, rank: u32) -> &[PeerConnection] {
        &self.entries[self.start[rank as usize] as usize..self.start[rank as usize + 1] as usize]
    }
}

/// One rank's connections: where its instructions send and receive.
#[derive(Clone, Copy)]
pub(crate) struct RankConnections<'a> {
    sending: &'a [PeerConnection],
    receiving: &'a [PeerConnection],
}

impl RankConnections<'_> {
    /// The connections `instr` (of this rank) sends and receives on, `u32::MAX` for none.
    #[inline]
    pub fn of(&self, instr: &Instr) -> (u32, u32) {
        (find(self.sending, instr.send_peer, instr.channel), find(self.receiving, instr.recv_peer, instr.channel))
    }
}

/// The connection to or from `peer` on `channel` (`u32::MAX` for `NO_RANK`). Most ranks have one connection each
/// way, which needs no search.
#[inline]
fn find(entries: &[PeerConnection], peer: u32, channel: u8) -> u32 {
    if peer == NO_RANK {
        return u32::MAX;
    }
    let at = match entries {
        [only] => only,
        _ => {
            let at = entries.partition_point(|e| (e.peer, e.channel) < (peer, channel));
            &entries[at]
        }
    };
    debug_assert!((at.peer, at.channel) == (peer, channel), "every peer of a rank's instructions is indexed");
    at.conn
}

impl Connections {
    /// The instruction indices on `c.from` that send on `c`, in program order.
    pub fn sends_of(&self, c: &Connection) -> &[u32] {
        c.sends.of(&self.send_list)
    }

    /// The instruction indices on `c.to` that receive on `c`, in program order.
    pub fn recvs_of(&self, c: &Connection) -> &[u32] {
        c.recvs.of(&self.recv_list)
    }

    #[inline]
    pub fn rank(&self, rank: u32) -> RankConnections<'_> {
        RankConnections { sending: self.sending.of_rank(rank), receiving: self.receiving.of_rank(rank) }
    }

    pub fn build(sched: &Schedule) -> Self {
        let mut builder = ConnectionsBuilder::new(sched);
        for (rank, program) in sched.ranks.iter().enumerate() {
            builder.add_rank(rank as u32, program);
        }
        builder.finish()
    }
}

/// `Connections` built rank by rank, in rank order (the verifier adds each rank while its other per-rank checks
/// have it in cache).
pub(crate) struct ConnectionsBuilder {
    index: HashMap<(u32, u32, u8), u32, FxBuildHasher>,
    connections: Connections,
}

impl ConnectionsBuilder {
    pub fn new(sched: &Schedule) -> Self {
        let mut rank_start = Vec::with_capacity(sched.ranks.len() + 1);
        rank_start.push(0u32);
        for program in &sched.ranks {
            rank_start.push(rank_start[rank_start.len() - 1] + program.len() as u32);
        }
        ConnectionsBuilder {
            index: HashMap::default(),
            connections: Connections {
                list: Vec::new(),
                send_list: Vec::with_capacity(sched.n_instrs()),
                recv_list: Vec::with_capacity(sched.n_instrs()),
                rank_start,
                sending: PeerIndex::new(sched.ranks.len()),
                receiving: PeerIndex::new(sched.ranks.len()),
            },
        }
    }

    /// Adds the instructions of `rank`, the rank after the last one added; returns its connections.
    pub fn add_rank(&mut self, rank: u32, program: &RankProgram) -> RankConnections<'_> {
        let Connections { list, sending, receiving, send_list, recv_list, .. } = &mut self.connections;
        let index = &mut self.index;
        let mut conn = |from: u32, to: u32, channel: u8, list: &mut Vec<Connection>| {
            *index.entry((from, to, channel)).or_insert_with(|| {
                let empty = Run::default();
                list.push(Connection { from, to, channel, sends: empty, recvs: empty });
                (list.len() - 1) as u32
            })
        };
        // Find the connections and count each one's sends and receives. Most instructions use the connection their
        // rank's previous send (or receive) used: look that up first.
        let (mut last_send, mut last_recv) = ((NO_RANK, 0u8, 0u32), (NO_RANK, 0u8, 0u32));
        for instr in &program.instrs {
            if let Some(peer) = instr.send_peer() {
                if (last_send.0, last_send.1) != (peer, instr.channel) {
                    last_send = (peer, instr.channel, conn(rank, peer, instr.channel, list));
                    sending.entries.push(PeerConnection { peer, channel: instr.channel, conn: last_send.2 });
                }
                list[last_send.2 as usize].sends.len += 1;
            }
            if let Some(peer) = instr.recv_peer() {
                if (last_recv.0, last_recv.1) != (peer, instr.channel) {
                    last_recv = (peer, instr.channel, conn(peer, rank, instr.channel, list));
                    receiving.entries.push(PeerConnection { peer, channel: instr.channel, conn: last_recv.2 });
                }
                list[last_recv.2 as usize].recvs.len += 1;
            }
        }
        sending.close_rank();
        receiving.close_rank();
        // Give each connection its stretch, then fill it in program order.
        let (sends, recvs) = (sending.of_rank(rank), receiving.of_rank(rank));
        lay_out(sends, list, |c| &mut c.sends, send_list);
        lay_out(recvs, list, |c| &mut c.recvs, recv_list);
        let own = RankConnections { sending: sends, receiving: recvs };
        for (i, instr) in program.instrs.iter().enumerate() {
            let (send, recv) = own.of(instr);
            if send != u32::MAX {
                list[send as usize].sends.push(send_list, i as u32);
            }
            if recv != u32::MAX {
                list[recv as usize].recvs.push(recv_list, i as u32);
            }
        }
        self.connections.rank(rank)
    }

    pub fn finish(self) -> Connections {
        self.connections
    }
}

/// Places the stretches (`run` of each connection) of one rank's connections one after the other at the end of
/// `list`, each as long as its count, and empties them for filling.
fn lay_out(
    rank: &[PeerConnection],
    connections: &mut [Connection],
    run: impl Fn(&mut Connection) -> &mut Run,
    list: &mut Vec<u32>,
) {
    let mut end = list.len() as u32;
    for e in rank {
        let run = run(&mut connections[e.conn as usize]);
        let len = run.len;
        *run = Run { start: end, len: 0 };
        end += len;
    }
    list.resize(end as usize, 0);
}

pub(crate) fn check(ctx: &Context, connections: &Connections, errors: &mut Vec<Error>) {
    for c in &connections.list {
        let ranks = &ctx.sched.ranks;
        let (sends, recvs) = (connections.sends_of(c), connections.recvs_of(c));
        for k in 0..sends.len().max(recvs.len()) {
            match (sends.get(k), recvs.get(k)) {
                (Some(&s), Some(&r)) => {
                    let (si, ri) =
                        (&ranks[c.from as usize].instrs[s as usize], &ranks[c.to as usize].instrs[r as usize]);
                    let chunks = ctx.sched.chunks;
                    // The same index is the same position, without dividing (the common case).
                    let same_position =
                        si.first_index() == ri.first_index() || si.position(chunks) == ri.position(chunks);
                    if si.count == ri.count && same_position {
                        continue;
                    }
                    errors.push(mismatch(ctx, c, (s, si), (r, ri)));
                    // A chunk at the wrong position leaves the pairs after it in step; a wrong size does not.
                    if si.count != ri.count {
                        break;
                    }
                }
                (Some(&s), None) => {
                    errors.push(unmatched(ctx, c, Unmatched::Send(s), k, sends.len(), recvs.len()));
                    break;
                }
                (None, Some(&r)) => {
                    errors.push(unmatched(ctx, c, Unmatched::Receive(r), k, sends.len(), recvs.len()));
                    break;
                }
                (None, None) => unreachable!("k is below the longer list's length"),
            }
        }
        if errors.len() >= ctx.limits.max_errors {
            return;
        }
    }
}

/// A send and its receive (instruction index and instruction each) that differ in size, or else in the position of
/// their chunk within its block.
fn mismatch(ctx: &Context, c: &Connection, (s, si): (u32, &Instr), (r, ri): (u32, &Instr)) -> Error {
    let (sender, receiver) = (ctx.describe(c.from, s as usize), ctx.describe(c.to, r as usize));
    if si.count == ri.count {
        let chunks = ctx.sched.chunks;
        let (sent_at, received_at) = (si.position(chunks).unwrap_or(0), ri.position(chunks).unwrap_or(0));
        let message =
            format!("{sender} sends chunk position {sent_at} of a block into position {received_at} on {receiver}");
        let help = "a chunk keeps its position in its block (index modulo chunks) everywhere it goes";
        return ctx
            .error("collc::verify::matching", message, help, (c.from, s as usize), "this send")
            .at(ctx.span((c.to, r as usize)), "this receive");
    }
    let message = format!("{sender} sends {} chunks but {receiver} receives {}", si.count, ri.count);
    let help = "the n-th send and the n-th receive of a connection must have the same size";
    ctx.error("collc::verify::matching", message, help, (c.from, s as usize), "this send")
        .at(ctx.span((c.to, r as usize)), "this receive")
}

/// The instruction (index on its rank) of a connection whose other side has no counterpart.
enum Unmatched {
    Send(u32),
    Receive(u32),
}

/// The `k`-th send or receive of connection `c`, which has `n_sends` sends and `n_recvs` receives, unmatched.
fn unmatched(ctx: &Context, c: &Connection, side: Unmatched, k: usize, n_sends: usize, n_recvs: usize) -> Error {
    let k = k + 1;
    let (rank, index, peer, does, never, counts, help, label) = match side {
        Unmatched::Send(s) => (
            c.from,
            s,
            c.to,
            "sends to",
            "never receives it",
            format!("send {k} of {n_sends}, {n_recvs} receives"),
            "every send needs a matching receive on the peer",
            "unmatched send",
        ),
        Unmatched::Receive(r) => (
            c.to,
            r,
            c.from,
            "receives from",
            "never sends it",
            format!("receive {k} of {n_recvs}, {n_sends} sends"),
            "every receive needs a matching send on the peer",
            "unmatched receive",
        ),
    };
    let who = ctx.describe(rank, index as usize);
    let message = format!("{who} {does} rank {peer} on channel {}, which {never} ({counts})", c.channel);
    ctx.error("collc::verify::matching", message, help, (rank, index as usize), label)
}
