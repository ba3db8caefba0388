//! Small random schedules over 2..=5 ranks: `constructive` builds one meant to compute its collective (random
//! routes, forwards and reductions, so the verifier accepts many of them), `noise` is random ops, operands, peers,
//! channels and dependencies (which it almost always rejects).

use super::mutate::named;
use super::{in_place_offsets, program, rooted, shared_and_other, Entries, Rng};
use crate::contract::{buffer_chunks, contract, has_input};
use collc_compiler::sched::{BufId, BufferDecl, Instr, Op, Operand, RankProgram, NO_RANK};
use collc_compiler::{Collective, Placement, Schedule};
use collc_grammar::ast::Span;
use std::collections::HashMap;

/// A forward through a middle rank: the rank, its instruction, the values it sends on, and where it keeps a copy.
type Forward = (u32, Instr, Vec<Option<Multiset>>, Option<Loc>);

const COLLECTIVES: [Collective; 9] = [
    Collective::AllReduce,
    Collective::ReduceScatter,
    Collective::AllGather,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::Gather,
    Collective::Scatter,
    Collective::AllToAll,
    Collective::SendRecv,
];

/// A random header: collective, 2..=5 ranks, 1..=`max_chunks` chunks, placement, root and peer, and maybe a
/// scratch buffer (its size a multiple of the chunk count, or not).
fn header(rng: &mut Rng, max_chunks: u32) -> Schedule {
    let collective = rng.pick(&COLLECTIVES);
    let p = rng.range(2, 5);
    let c = rng.range(1, max_chunks);
    let placement = if rng.chance(50) { Placement::InPlace } else { Placement::OutOfPlace };
    let root = if rooted(collective) { rng.below(p as usize) as u32 } else { 0 };
    let peer = match collective {
        Collective::SendRecv => (root + 1 + rng.below(p as usize - 1) as u32) % p,
        _ => (root + 1) % p,
    };
    let (in_chunks, out_chunks) = buffer_chunks(collective, p, c);
    let mut buffers = vec![
        BufferDecl { name: "in".into(), chunks: in_chunks },
        BufferDecl { name: "out".into(), chunks: out_chunks },
    ];
    let scratch = rng.pick(&[0, 0, 1, 2, p]);
    if scratch > 0 {
        let odd = if rng.chance(20) { rng.range(1, 2) } else { 0 };
        buffers.push(BufferDecl { name: "tmp".into(), chunks: scratch * c + odd });
    }
    Schedule {
        algorithm: "fuzz".into(),
        collective,
        placement,
        n_ranks: p,
        chunks: c,
        root,
        peer,
        params: Vec::new(),
        buffers,
        ranks: vec![RankProgram::default(); p as usize],
        spans: vec![Span { start: 0, end: 0 }],
    }
}

fn instr(op: Op, count: u32) -> Instr {
    Instr {
        op,
        channel: 0,
        span: 0,
        count,
        send_peer: NO_RANK,
        recv_peer: NO_RANK,
        src: Operand::NONE,
        acc: Operand::NONE,
        dst: Operand::NONE,
    }
}

/// A multiset of input contributions (rank, chunk), sorted.
type Multiset = Vec<(u32, u32)>;

fn sum(a: &Multiset, b: &Multiset) -> Multiset {
    let mut s: Multiset = a.iter().chain(b).copied().collect();
    s.sort_unstable();
    s
}

/// `a - b` when `b` is a sub-multiset of `a`.
fn minus(a: &Multiset, b: &Multiset) -> Option<Multiset> {
    let mut rest = a.clone();
    for x in b {
        let at = rest.iter().position(|y| y == x)?;
        rest.remove(at);
    }
    Some(rest)
}

fn within(small: &Multiset, big: &Multiset) -> bool {
    minus(big, small).is_some()
}

/// Physical memory of one rank: (buffer, index); in place `in` and `out` are the shared buffer.
type Loc = (BufId, u32);

struct Builder {
    sched: Schedule,
    ranks: Vec<Entries>,
    /// Per rank, per instruction: physical slots read and written.
    touches: Vec<Vec<(Vec<Loc>, Vec<Loc>)>>,
    content: Vec<HashMap<Loc, Multiset>>,
    goals: HashMap<(u32, Loc), Multiset>,
}

/// How a step stores its value at its destination: replacing what is there, or adding to it.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Overwrite,
    Accumulate,
}

impl Builder {
    fn new(sched: Schedule) -> Self {
        let p = sched.n_ranks;
        let mut b = Builder {
            ranks: vec![Vec::new(); p as usize],
            touches: vec![Vec::new(); p as usize],
            content: vec![HashMap::new(); p as usize],
            goals: HashMap::new(),
            sched,
        };
        let (in_chunks, out_chunks) = buffer_chunks(b.sched.collective, p, b.sched.chunks);
        for rank in 0..p {
            let (input, output) = b.windows(rank);
            if has_input(&b.sched, rank) {
                for c in 0..in_chunks {
                    b.content[rank as usize].insert((input.0, input.1 + c), vec![(rank, c)]);
                }
            }
            for c in 0..out_chunks {
                if let Some(want) = contract(&b.sched, rank, c) {
                    let mut want = want;
                    want.sort_unstable();
                    b.goals.insert((rank, (output.0, output.1 + c)), want);
                }
            }
        }
        b
    }

    /// Where the input and output windows start in physical memory.
    fn windows(&self, rank: u32) -> (Loc, Loc) {
        if self.sched.placement == Placement::OutOfPlace {
            return ((BufId::IN, 0), (BufId::OUT, 0));
        }
        let (shared, _) = shared_and_other(&self.sched);
        let (i, o) = in_place_offsets(self.sched.collective, rank, self.sched.chunks);
        ((shared, i), (shared, o))
    }

    /// Every physical buffer of a rank and its size.
    fn physical_buffers(&self) -> Vec<(BufId, u32)> {
        let (_, other) = shared_and_other(&self.sched);
        let in_place = self.sched.placement == Placement::InPlace;
        (0..self.sched.buffers.len())
            .map(|b| (BufId(b as u8), self.sched.buffers[b].chunks))
            .filter(|(b, _)| !(in_place && *b == other))
            .collect()
    }

    fn size(&self, buf: BufId) -> u32 {
        self.sched.buffers[buf.0 as usize].chunks
    }

    fn writable(&self, buf: BufId) -> bool {
        !(self.sched.placement == Placement::OutOfPlace && buf == BufId::IN)
    }

    fn pos(&self, loc: Loc) -> u32 {
        loc.1 % self.sched.chunks.max(1)
    }

    fn at(&self, rank: u32, loc: Loc, k: u32) -> Option<&Multiset> {
        self.content[rank as usize].get(&(loc.0, loc.1 + k))
    }

    fn fits(&self, loc: Loc, n: u32) -> bool {
        loc.1 + n <= self.size(loc.0)
    }

    /// Appends `instr` (operands given physically) to `rank`, named at random, with the dependencies its reads and
    /// writes need on this rank.
    fn push(&mut self, rank: u32, mut e: Instr, rng: &mut Rng) {
        let n = e.count;
        let span =
            |o: Operand| -> Vec<Loc> { o.get().map_or(Vec::new(), |o| (0..n).map(|k| (o.buf, o.index + k)).collect()) };
        let reads: Vec<Loc> = span(e.src).into_iter().chain(span(e.acc)).collect();
        let writes = span(e.dst);
        let mut deps = Vec::new();
        for (j, (r, w)) in self.touches[rank as usize].iter().enumerate() {
            let hit = |a: &[Loc], b: &[Loc]| a.iter().any(|x| b.contains(x));
            if hit(&writes, r) || hit(&writes, w) || hit(&reads, w) {
                deps.push(j as u32);
            }
        }
        if rng.chance(5) && !self.ranks[rank as usize].is_empty() {
            deps.push(rng.below(self.ranks[rank as usize].len()) as u32);
        }
        for o in [&mut e.src, &mut e.acc, &mut e.dst] {
            if let Some(x) = o.get() {
                *o = named(&self.sched, rank, (x.buf, x.index), n, rng);
            }
        }
        self.touches[rank as usize].push((reads, writes));
        self.ranks[rank as usize].push((e, deps));
    }

    fn store(&mut self, rank: u32, loc: Loc, values: &[Option<Multiset>]) {
        for (k, v) in values.iter().enumerate() {
            let at = (loc.0, loc.1 + k as u32);
            match v {
                Some(v) => self.content[rank as usize].insert(at, v.clone()),
                None => self.content[rank as usize].remove(&at),
            };
        }
    }

    fn read(&self, rank: u32, loc: Loc, n: u32) -> Vec<Option<Multiset>> {
        (0..n).map(|k| self.at(rank, loc, k).cloned()).collect()
    }

    fn unmet(&self) -> Vec<(u32, Loc)> {
        let mut out: Vec<(u32, Loc)> =
            self.goals.iter().filter(|(&(r, l), want)| self.at(r, l, 0) != Some(*want)).map(|(k, _)| *k).collect();
        out.sort_unstable();
        out
    }

    /// Whether moving `src` on `q` (n chunks) to `g` on `r` in `mode` brings each goal chunk closer.
    fn useful(&self, r: u32, g: Loc, q: u32, src: Loc, n: u32, mode: Mode) -> bool {
        if !self.fits(g, n) || !self.fits(src, n) || !self.writable(g.0) {
            return false;
        }
        if q == r && src.0 == g.0 && src.1 < g.1 + n && g.1 < src.1 + n {
            return false;
        }
        (0..n).all(|k| {
            let goal = (g.0, g.1 + k);
            let Some(want) = self.goals.get(&(r, goal)) else { return false };
            let Some(t) = self.at(q, src, k).filter(|t| !t.is_empty()) else { return false };
            let base = self.at(r, g, k);
            match mode {
                Mode::Overwrite => within(t, want) && base != Some(t),
                Mode::Accumulate => base.and_then(|b| minus(want, b)).is_some_and(|rest| within(t, &rest)),
            }
        })
    }

    /// A scratch (or any writable) place on `rank` at the position of `like`, for `n` chunks, not overlapping
    /// `avoid`: where a message is staged.
    fn temp(&self, rank: u32, like: Loc, n: u32, avoid: &[Loc], rng: &mut Rng, any: bool) -> Option<Loc> {
        let c = self.sched.chunks.max(1);
        let mut spots = Vec::new();
        for (buf, size) in self.physical_buffers() {
            if !self.writable(buf) || (!any && !buf.is_scratch()) {
                continue;
            }
            for i in (0..size).filter(|i| i % c == like.1 % c && i + n <= size) {
                let clash = avoid.iter().any(|a| a.0 == buf && a.1 < i + n && i < a.1 + n);
                // Never clobber a goal already met or an input someone may still need: only scratch, when asked.
                let precious = (0..n)
                    .any(|k| self.goals.contains_key(&(rank, (buf, i + k))) || self.at(rank, (buf, i), k).is_some());
                if !clash && (buf.is_scratch() || !precious) {
                    spots.push((buf, i));
                }
            }
        }
        let _ = rank;
        (!spots.is_empty()).then(|| rng.pick(&spots))
    }

    /// One step towards goal `(r, g)`; false when no source helps it.
    fn step(&mut self, r: u32, g: Loc, rng: &mut Rng) -> bool {
        let p = self.sched.n_ranks;
        let mut candidates = Vec::new();
        for q in 0..p {
            for (buf, size) in self.physical_buffers() {
                for i in 0..size {
                    let src = (buf, i);
                    if self.pos(src) != self.pos(g) {
                        continue;
                    }
                    for mode in [Mode::Overwrite, Mode::Accumulate] {
                        if self.useful(r, g, q, src, 1, mode) {
                            candidates.push((q, src, mode));
                        }
                    }
                }
            }
        }
        if candidates.is_empty() {
            return false;
        }
        // Of three drawn, the one that leaves the most at the goal.
        let gain = |b: &Builder, &(q, src, mode): &(u32, Loc, Mode)| {
            let t = b.at(q, src, 0).map_or(0, Vec::len);
            t + if mode == Mode::Accumulate { b.at(r, g, 0).map_or(0, Vec::len) } else { 0 }
        };
        let mut best = rng.pick(&candidates);
        for _ in 0..2 {
            let other = rng.pick(&candidates);
            if gain(self, &other) > gain(self, &best) {
                best = other;
            }
        }
        let (q, src, mode) = best;
        let mut n = rng.pick(&[1, 1, 2, 3]);
        while n > 1 && !self.useful(r, g, q, src, n, mode) {
            n -= 1;
        }
        self.emit(r, g, q, src, n, mode, rng);
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn emit(&mut self, r: u32, g: Loc, q: u32, src: Loc, n: u32, mode: Mode, rng: &mut Rng) {
        let op_of = |buf: BufId, index: u32| Operand::new(buf, index);
        if q == r {
            let value = self.read(q, src, n);
            let mut e = instr(if mode == Mode::Overwrite { Op::Copy } else { Op::Reduce }, n);
            e.dst = op_of(g.0, g.1);
            let stored = match mode {
                Mode::Overwrite => {
                    e.src = op_of(src.0, src.1);
                    value
                }
                Mode::Accumulate => {
                    let (a, b) = if rng.chance(50) { (g, src) } else { (src, g) };
                    e.acc = op_of(a.0, a.1);
                    e.src = op_of(b.0, b.1);
                    let base = self.read(r, g, n);
                    value.iter().zip(&base).map(|(v, b)| Some(sum(v.as_ref()?, b.as_ref()?))).collect()
                }
            };
            self.push(r, e, rng);
            self.store(r, g, &stored);
            return;
        }
        // Sender.
        let mut message = self.read(q, src, n);
        let mut from = q;
        let ch = |rng: &mut Rng| if rng.chance(25) { rng.range(1, 2) as u8 } else { 0 };
        let mut e = instr(Op::Send, n);
        e.src = op_of(src.0, src.1);
        e.channel = ch(rng);
        // One channel per route: a forward receives and sends on its instruction's channel.
        let hop_channel = e.channel;
        // Through a middle rank, forwarding with or without a reduction of its own.
        let middles: Vec<u32> = (0..self.sched.n_ranks).filter(|&m| m != q && m != r).collect();
        let mut forward: Option<Forward> = None;
        if !middles.is_empty() && rng.chance(30) {
            let m = rng.pick(&middles);
            let want_room = |b: &Builder, k: u32, extra: &Multiset| -> bool {
                let goal = (g.0, g.1 + k);
                let Some(want) = b.goals.get(&(r, goal)) else { return false };
                let Some(t) = message[k as usize].as_ref() else { return false };
                let total = sum(t, extra);
                match mode {
                    Mode::Overwrite => within(&total, want),
                    Mode::Accumulate => {
                        b.at(r, g, k).and_then(|base| minus(want, base)).is_some_and(|rest| within(&total, &rest))
                    }
                }
            };
            // A place on m whose value may join the sum.
            let mut reducible = Vec::new();
            for (buf, size) in self.physical_buffers() {
                for i in (0..size).filter(|&i| self.pos((buf, i)) == self.pos(g) && i + n <= size) {
                    if (0..n).all(|k| self.at(m, (buf, i), k).is_some_and(|u| !u.is_empty() && want_room(self, k, u))) {
                        reducible.push((buf, i));
                    }
                }
            }
            let kind = rng.below(3);
            let mut f = instr(Op::RecvCopySend, n);
            f.recv_peer = q;
            f.send_peer = r;
            let mut stored_at = None;
            let mut out = message.clone();
            match kind {
                0 if !reducible.is_empty() => {
                    let u = rng.pick(&reducible);
                    f.op = Op::RecvReduceSend;
                    f.acc = op_of(u.0, u.1);
                    out = (0..n as usize).map(|k| Some(sum(message[k].as_ref()?, self.at(m, u, k as u32)?))).collect();
                }
                1 if !reducible.is_empty() => {
                    let u = rng.pick(&reducible);
                    let t = if rng.chance(50) { Some(u) } else { self.temp(m, g, n, &[u], rng, true) };
                    if let Some(t) = t {
                        f.op = Op::RecvReduceCopySend;
                        f.acc = op_of(u.0, u.1);
                        f.dst = op_of(t.0, t.1);
                        out = (0..n as usize)
                            .map(|k| Some(sum(message[k].as_ref()?, self.at(m, u, k as u32)?)))
                            .collect();
                        stored_at = Some(t);
                    }
                }
                _ => {}
            }
            if f.op == Op::RecvCopySend {
                if let Some(t) = self.temp(m, g, n, &[], rng, true) {
                    f.dst = op_of(t.0, t.1);
                    stored_at = Some(t);
                }
            }
            if f.op != Op::RecvCopySend || f.dst.get().is_some() {
                forward = Some((m, f, out, stored_at));
            }
        }
        e.send_peer = forward.as_ref().map_or(r, |f| f.0);
        self.push(q, e, rng);
        if let Some((m, mut f, out, stored_at)) = forward {
            f.recv_peer = q;
            f.channel = hop_channel;
            self.push(m, f, rng);
            if let Some(t) = stored_at {
                self.store(m, t, &out);
            }
            message = out;
            from = m;
        }
        // Receiver.
        let base = self.read(r, g, n);
        let accumulated: Vec<Option<Multiset>> =
            message.iter().zip(&base).map(|(v, b)| Some(sum(v.as_ref()?, b.as_ref()?))).collect();
        let mut e = instr(Op::Recv, n);
        e.recv_peer = from;
        e.channel = hop_channel;
        // Accumulating through scratch with the result k chunks after the accumulator (k < n, a multiple of the
        // chunk count so positions stay): the accumulator partly overlaps the destination. Reading all of the
        // accumulator before writing any of the result, this computes the sum; chunk by chunk it does not.
        let c = self.sched.chunks.max(1);
        let shifts: Vec<u32> = (1..n).filter(|k| k % c == 0).collect();
        if mode == Mode::Accumulate && !shifts.is_empty() && rng.chance(15) {
            let k = rng.pick(&shifts);
            if let Some(t) = self.temp(r, g, n + k, &[g], rng, false) {
                let mut copy = instr(Op::Copy, n);
                copy.src = op_of(g.0, g.1);
                copy.dst = op_of(t.0, t.1);
                self.push(r, copy, rng);
                self.store(r, t, &base);
                e.op = Op::RecvReduceCopy;
                e.acc = op_of(t.0, t.1);
                e.dst = op_of(t.0, t.1 + k);
                self.push(r, e, rng);
                self.store(r, (t.0, t.1 + k), &accumulated);
                let mut back = instr(Op::Copy, n);
                back.src = op_of(t.0, t.1 + k);
                back.dst = op_of(g.0, g.1);
                self.push(r, back, rng);
                self.store(r, g, &accumulated);
                return;
            }
        }
        let staged = rng.chance(25).then(|| self.temp(r, g, n, &[g], rng, false)).flatten();
        match staged {
            Some(t) => {
                e.dst = op_of(t.0, t.1);
                self.push(r, e, rng);
                self.store(r, t, &message);
                let mut l = instr(if mode == Mode::Overwrite { Op::Copy } else { Op::Reduce }, n);
                l.src = op_of(t.0, t.1);
                l.dst = op_of(g.0, g.1);
                if mode == Mode::Accumulate {
                    l.acc = op_of(g.0, g.1);
                }
                self.push(r, l, rng);
            }
            None => {
                e.dst = op_of(g.0, g.1);
                if mode == Mode::Accumulate {
                    e.op = Op::RecvReduceCopy;
                    e.acc = op_of(g.0, g.1);
                }
                self.push(r, e, rng);
            }
        }
        match mode {
            Mode::Overwrite => self.store(r, g, &message),
            Mode::Accumulate => self.store(r, g, &accumulated),
        }
    }

    /// A copy of something defined into scratch, here or on another rank: spare copies for later steps.
    fn stash(&mut self, rng: &mut Rng) {
        let p = self.sched.n_ranks;
        let q = rng.below(p as usize) as u32;
        let defined: Vec<Loc> = self.content[q as usize].keys().copied().collect();
        if defined.is_empty() {
            return;
        }
        let mut defined = defined;
        defined.sort_unstable();
        let src = rng.pick(&defined);
        let r = if rng.chance(50) { q } else { rng.below(p as usize) as u32 };
        let Some(t) = self.temp(r, src, 1, &[src], rng, false) else { return };
        let value = self.read(q, src, 1);
        if q == r {
            let mut e = instr(Op::Copy, 1);
            e.src = Operand::new(src.0, src.1);
            e.dst = Operand::new(t.0, t.1);
            self.push(q, e, rng);
        } else {
            let mut s = instr(Op::Send, 1);
            s.src = Operand::new(src.0, src.1);
            s.send_peer = r;
            self.push(q, s, rng);
            let mut e = instr(Op::Recv, 1);
            e.dst = Operand::new(t.0, t.1);
            e.recv_peer = q;
            self.push(r, e, rng);
        }
        self.store(r, t, &value);
    }

    /// Every chunk straight from the input that holds it to the rank that needs it: each rank's local copies
    /// first, then all its sends (in random order, on random channels, adjacent chunks merged into one message at
    /// times), then its receives (reducing ones adding into the output), in an order that keeps each connection's
    /// order. With many chunks a connection carries more messages than it has slots, so the verifier's deadlock check
    /// and the executors' flow control both count.
    fn direct(&mut self, rng: &mut Rng) {
        let p = self.sched.n_ranks;
        let mut goals: Vec<((u32, Loc), Multiset)> = self.goals.iter().map(|(k, v)| (*k, v.clone())).collect();
        goals.sort();
        // (from, to, source on `from`, destination on `to`, reduces).
        let mut transfers: Vec<(u32, u32, Loc, Loc, bool)> = Vec::new();
        for ((r, g), want) in goals {
            let mut own = false;
            for &(q, c) in &want {
                let (input, _) = self.windows(q);
                let src = (input.0, input.1 + c);
                if q == r {
                    own = true;
                    if src != g {
                        let mut e = instr(Op::Copy, 1);
                        e.src = Operand::new(src.0, src.1);
                        e.dst = Operand::new(g.0, g.1);
                        let value = self.read(r, src, 1);
                        self.push(r, e, rng);
                        self.store(r, g, &value);
                    }
                }
            }
            // With a term of its own the destination holds it already, and the others' terms add to it.
            for &(q, c) in &want {
                if q != r {
                    let (input, _) = self.windows(q);
                    transfers.push((q, r, (input.0, input.1 + c), g, own));
                }
            }
        }
        // Messages: adjacent chunks between the same ranks, same kind, contiguous on both sides, merged.
        let mut messages: Vec<(u32, u32, Loc, Loc, bool, u32, u8)> = Vec::new();
        for t in transfers {
            let ch = if rng.chance(30) { rng.range(1, 3) as u8 } else { 0 };
            if let Some(last) = messages.last_mut() {
                let contiguous = last.0 == t.0
                    && last.1 == t.1
                    && last.4 == t.4
                    && last.2 .0 == t.2 .0
                    && last.3 .0 == t.3 .0
                    && last.2 .1 + last.5 == t.2 .1
                    && last.3 .1 + last.5 == t.3 .1;
                if contiguous && last.5 < 3 && rng.chance(50) {
                    last.5 += 1;
                    continue;
                }
            }
            messages.push((t.0, t.1, t.2, t.3, t.4, 1, ch));
        }
        let mut order: Vec<usize> = (0..messages.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        // Sends, rank by rank in the shuffled order; each connection's order is what its sends make it.
        let mut sent: Vec<usize> = Vec::new();
        for q in 0..p {
            for &m in order.iter().filter(|&&m| messages[m].0 == q) {
                let (from, to, src, _, _, n, ch) = messages[m];
                let mut e = instr(Op::Send, n);
                e.src = Operand::new(src.0, src.1);
                e.send_peer = to;
                e.channel = ch;
                self.push(from, e, rng);
                sent.push(m);
            }
        }
        // Receives: per rank, a random merge of its connections' queues (each in its sends' order).
        for r in 0..p {
            let mut queues: Vec<Vec<usize>> = Vec::new();
            for m in sent.iter().copied().filter(|&m| messages[m].1 == r) {
                let key = (messages[m].0, messages[m].6);
                match queues.iter_mut().find(|q| (messages[q[0]].0, messages[q[0]].6) == key) {
                    Some(q) => q.push(m),
                    None => queues.push(vec![m]),
                }
            }
            while !queues.is_empty() {
                let k = rng.below(queues.len());
                let (from, _, src, dst, reduces, n, ch) = messages[queues[k].remove(0)];
                if queues[k].is_empty() {
                    queues.remove(k);
                }
                let message = self.read(from, src, n);
                let mut e = instr(if reduces { Op::RecvReduceCopy } else { Op::Recv }, n);
                e.recv_peer = from;
                e.channel = ch;
                e.dst = Operand::new(dst.0, dst.1);
                if reduces {
                    e.acc = Operand::new(dst.0, dst.1);
                }
                let base = self.read(r, dst, n);
                self.push(r, e, rng);
                let stored: Vec<Option<Multiset>> = match reduces {
                    true => message.iter().zip(&base).map(|(v, b)| Some(sum(v.as_ref()?, b.as_ref()?))).collect(),
                    false => message,
                };
                self.store(r, dst, &stored);
            }
        }
    }

    fn finish(self) -> Schedule {
        let mut sched = self.sched;
        sched.ranks = self.ranks.iter().map(program).collect();
        sched
    }
}

/// A random schedule built step by step towards its collective's contract; it may get stuck (then the verifier
/// rejects it), and it may clobber data (in place), but it mostly computes the contract.
pub fn constructive(rng: &mut Rng) -> Schedule {
    let mut b = Builder::new(header(rng, 3));
    let mut stuck = 0;
    let limit = 4 * b.goals.len() + 8;
    for _ in 0..limit {
        let unmet = b.unmet();
        if unmet.is_empty() || stuck > 12 {
            break;
        }
        if rng.chance(12) {
            b.stash(rng);
        }
        let (r, g) = rng.pick(&unmet);
        if b.step(r, g, rng) {
            stuck = 0;
        } else {
            stuck += 1;
        }
    }
    b.finish()
}

/// A reducescatter in which each rank adds every peer's whole input into a scratch copy of its own with one
/// instruction per peer, the result written C chunks above or below the accumulator each time (so both overlap
/// partly; positions stay), then copies its block out. Read all before writing any, this is the contract; chunk by
/// chunk, a result written above its accumulator is read again as the accumulator of a later chunk.
pub fn sweep(rng: &mut Rng) -> Schedule {
    let mut sched = header(rng, 3);
    sched.collective = Collective::ReduceScatter;
    let (p, c) = (sched.n_ranks, sched.chunks);
    let (in_chunks, out_chunks) = buffer_chunks(sched.collective, p, c);
    sched.buffers = vec![
        BufferDecl { name: "in".into(), chunks: in_chunks },
        BufferDecl { name: "out".into(), chunks: out_chunks },
        BufferDecl { name: "tmp".into(), chunks: in_chunks + (p - 1) * c },
    ];
    sched.root = 0;
    sched.peer = 1 % p;
    let tmp = BufId(2);
    let mut b = Builder::new(sched);
    let whole = in_chunks;
    // Sends first: every rank's whole input to every other rank, in random order.
    for q in 0..p {
        let mut peers: Vec<u32> = (0..p).filter(|&r| r != q).collect();
        for i in (1..peers.len()).rev() {
            peers.swap(i, rng.below(i + 1));
        }
        let (input, _) = b.windows(q);
        for r in peers {
            let mut e = instr(Op::Send, whole);
            e.src = Operand::new(input.0, input.1);
            e.send_peer = r;
            b.push(q, e, rng);
        }
    }
    for r in 0..p {
        let (input, output) = b.windows(r);
        // Where the running sum starts in tmp: room for p - 1 shifts up, or as many down.
        let ups = rng.range(0, p - 1);
        let mut at = (p - 1 - ups) * c;
        let mut copy = instr(Op::Copy, whole);
        copy.src = Operand::new(input.0, input.1);
        copy.dst = Operand::new(tmp, at);
        b.push(r, copy, rng);
        let mut shifts: Vec<bool> = (0..p - 1).map(|k| k < ups).collect();
        for i in (1..shifts.len()).rev() {
            shifts.swap(i, rng.below(i + 1));
        }
        let peers: Vec<u32> = (0..p).filter(|&q| q != r).collect();
        for (q, up) in peers.into_iter().zip(shifts) {
            let to = if up { at + c } else { at - c };
            let mut e = instr(Op::RecvReduceCopy, whole);
            e.recv_peer = q;
            e.acc = Operand::new(tmp, at);
            e.dst = Operand::new(tmp, to);
            b.push(r, e, rng);
            at = to;
        }
        let mut out = instr(Op::Copy, c);
        out.src = Operand::new(tmp, at + r * c);
        out.dst = Operand::new(output.0, output.1);
        b.push(r, out, rng);
    }
    b.finish()
}

/// The `direct` schedule of a random header with up to 10 chunks.
pub fn direct(rng: &mut Rng) -> Schedule {
    let mut b = Builder::new(header(rng, 10));
    b.direct(rng);
    b.finish()
}

/// Random ops, operands, peers, channels and dependencies; sends and receives are made in pairs half the time.
pub fn noise(rng: &mut Rng) -> Schedule {
    let mut sched = header(rng, 3);
    let p = sched.n_ranks;
    let mut ranks: Vec<Entries> = vec![Vec::new(); p as usize];
    let random_operand = |rng: &mut Rng, count: u32| {
        let buf = rng.below(sched.buffers.len());
        let chunks = sched.buffers[buf].chunks;
        Operand::new(BufId(buf as u8), rng.range(0, chunks.saturating_sub(count)))
    };
    let events = rng.range(1, 4 * p);
    for _ in 0..events {
        let q = rng.below(p as usize) as u32;
        let count = rng.pick(&[1, 1, 1, 2, 3, 0]);
        let op = rng.pick(&Op::ALL);
        let [src, acc, dst, sends, receives] = super::mutate::shape(op);
        let mut e = instr(op, count);
        e.channel = if rng.chance(20) { 1 } else { 0 };
        if src {
            e.src = random_operand(rng, count);
        }
        if acc {
            e.acc = random_operand(rng, count);
        }
        if dst {
            e.dst = random_operand(rng, count);
        }
        let peer = |rng: &mut Rng| (q + 1 + rng.below(p as usize - 1) as u32) % p;
        if sends {
            e.send_peer = peer(rng);
        }
        if receives {
            e.recv_peer = peer(rng);
        }
        let len = ranks[q as usize].len();
        let deps = (0..len as u32).filter(|_| rng.chance(30)).collect();
        ranks[q as usize].push((e, deps));
        if sends && rng.chance(50) {
            let r = e.send_peer;
            let mut x = instr(if rng.chance(50) { Op::Recv } else { Op::RecvReduceCopy }, count);
            x.recv_peer = q;
            x.channel = e.channel;
            x.dst = random_operand(rng, count);
            if x.op == Op::RecvReduceCopy {
                x.acc = if rng.chance(50) { x.dst } else { random_operand(rng, count) };
            }
            let len = ranks[r as usize].len();
            let deps = (0..len as u32).filter(|_| rng.chance(30)).collect();
            ranks[r as usize].push((x, deps));
        }
    }
    sched.ranks = ranks.iter().map(program).collect();
    sched
}
