//! An oracle that shares no code with the verifier: it runs a schedule on concrete random `u64` chunks, with
//! wrapping addition as the reduction and unbounded FIFO queues per (sender, receiver, channel), under several
//! execution orders, and compares every output chunk with the collective's contract as DESIGN.md's table states it.
//! A schedule is correct when it is well formed and, in every order, every instruction runs, no message is left
//! unreceived, and the output windows hold exactly the contract. Slots outside the inputs start as random garbage,
//! so reading anything the contract did not provide shows up as a wrong sum.

use crate::contract::{buffer_chunks, contract, has_input, shape, windows};
use collc_compiler::sched::{BufId, Instr, Op, Operand};
use collc_compiler::{Placement, Schedule};
use std::collections::{HashMap, VecDeque};

/// SplitMix64: small, seedable, good enough to make accidental equal sums vanishingly rare.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Why one instruction is malformed: operands or peers its op does not define, or ones outside their range.
fn instr_problem(sched: &Schedule, rank: u32, instr: &Instr) -> Option<String> {
    let [src, acc, dst, sends, receives] = shape(instr.op);
    for (needed, operand) in [(src, instr.src), (acc, instr.acc), (dst, instr.dst)] {
        match operand.get() {
            None if needed => return Some("an operand is missing".into()),
            Some(_) if !needed => return Some("an operand is not used by its op".into()),
            Some(o) => match sched.buffers.get(o.buf.0 as usize) {
                Some(b) if instr.count > 0 && o.index as u64 + instr.count as u64 <= b.chunks as u64 => {}
                _ => return Some(format!("operand {o:?} x{} is outside its buffer", instr.count)),
            },
            None => {}
        }
    }
    for (needed, peer) in [(sends, instr.send_peer()), (receives, instr.recv_peer())] {
        match peer {
            None if needed => return Some("a peer is missing".into()),
            Some(_) if !needed => return Some("a peer is not used by its op".into()),
            Some(q) if q >= sched.n_ranks || q == rank => return Some(format!("peer {q} is not another rank")),
            _ => {}
        }
    }
    let writes_input = instr.dst.get().is_some_and(|d| d.buf == BufId::IN);
    (sched.placement == Placement::OutOfPlace && writes_input).then(|| "writes the input buffer".into())
}

/// Why `sched` is not a well-formed schedule of its collective, if it is not.
fn shape_problem(sched: &Schedule) -> Option<String> {
    let (in_chunks, out_chunks) = buffer_chunks(sched.collective, sched.n_ranks, sched.chunks);
    if sched.ranks.len() != sched.n_ranks as usize {
        return Some(format!("{} rank programs for {} ranks", sched.ranks.len(), sched.n_ranks));
    }
    if sched.buffers.len() < 2 || sched.buffers[0].chunks != in_chunks || sched.buffers[1].chunks != out_chunks {
        return Some("`in` and `out` do not have the collective's sizes".into());
    }
    for (rank, program) in sched.ranks.iter().enumerate() {
        if program.dep_ends.len() != program.instrs.len() && !program.deps.is_empty() {
            return Some(format!("rank {rank}: dependency table and instructions differ in length"));
        }
        for (i, instr) in program.instrs.iter().enumerate() {
            if program.deps_of(i).iter().any(|&d| d as usize >= i) {
                return Some(format!("rank {rank} #{i} depends on a later instruction"));
            }
            if let Some(problem) = instr_problem(sched, rank as u32, instr) {
                return Some(format!("rank {rank} #{i} {}: {problem}", instr.op.name()));
            }
        }
    }
    None
}

/// Which ready instruction runs next.
#[derive(Clone, Copy, Debug)]
enum Order {
    Fifo,
    Lifo,
    Random(u64),
}

/// One concrete execution: memory of every rank, connection queues, and what has run.
struct Run<'a> {
    sched: &'a Schedule,
    memory: Vec<Vec<Vec<u64>>>,
    inputs: Vec<Vec<u64>>,
    unmet: Vec<Vec<u32>>,
    dependents: Vec<Vec<Vec<u32>>>,
    done: Vec<Vec<bool>>,
    queued: Vec<Vec<bool>>,
    /// Per connection: the sending and receiving instructions in program order, the next of each, the messages.
    senders: Vec<Vec<u32>>,
    receivers: Vec<Vec<u32>>,
    next_send: Vec<usize>,
    next_recv: Vec<usize>,
    queues: Vec<VecDeque<Vec<u64>>>,
    /// Per rank, per instruction: (send connection, receive connection).
    conn_of: Vec<Vec<(Option<usize>, Option<usize>)>>,
    conn_ends: Vec<(u32, u32)>,
}

impl<'a> Run<'a> {
    fn new(sched: &'a Schedule, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let p = sched.n_ranks;
        let (in_chunks, _) = buffer_chunks(sched.collective, p, sched.chunks);
        let inputs: Vec<Vec<u64>> = (0..p).map(|_| (0..in_chunks).map(|_| rng.next()).collect()).collect();
        let mut memory = Vec::new();
        for rank in 0..p {
            let mut buffers: Vec<Vec<u64>> =
                sched.buffers.iter().map(|b| (0..b.chunks).map(|_| rng.next()).collect()).collect();
            if has_input(sched, rank) {
                let ((buf, offset), _) = windows(sched, rank);
                let window = &mut buffers[buf.0 as usize][offset as usize..(offset + in_chunks) as usize];
                window.copy_from_slice(&inputs[rank as usize]);
            }
            memory.push(buffers);
        }
        let mut run = Run {
            sched,
            memory,
            inputs,
            unmet: sched.ranks.iter().map(|r| (0..r.len()).map(|i| r.deps_of(i).len() as u32).collect()).collect(),
            dependents: Vec::new(),
            done: sched.ranks.iter().map(|r| vec![false; r.len()]).collect(),
            queued: sched.ranks.iter().map(|r| vec![false; r.len()]).collect(),
            senders: Vec::new(),
            receivers: Vec::new(),
            next_send: Vec::new(),
            next_recv: Vec::new(),
            queues: Vec::new(),
            conn_of: Vec::new(),
            conn_ends: Vec::new(),
        };
        run.connect();
        run
    }

    fn connect(&mut self) {
        let mut index: HashMap<(u32, u32, u8), usize> = HashMap::new();
        let sched = self.sched;
        for (rank, program) in sched.ranks.iter().enumerate() {
            let rank = rank as u32;
            let mut dependents = vec![Vec::new(); program.len()];
            let mut conns = Vec::new();
            for (i, instr) in program.instrs.iter().enumerate() {
                for &d in program.deps_of(i) {
                    dependents[d as usize].push(i as u32);
                }
                let mut conn = |from: u32, to: u32| {
                    *index.entry((from, to, instr.channel)).or_insert_with(|| {
                        self.conn_ends.push((from, to));
                        self.senders.push(Vec::new());
                        self.receivers.push(Vec::new());
                        self.conn_ends.len() - 1
                    })
                };
                let send = instr.send_peer().map(|q| conn(rank, q));
                let recv = instr.recv_peer().map(|q| conn(q, rank));
                if let Some(c) = send {
                    self.senders[c].push(i as u32);
                }
                if let Some(c) = recv {
                    self.receivers[c].push(i as u32);
                }
                conns.push((send, recv));
            }
            self.dependents.push(dependents);
            self.conn_of.push(conns);
        }
        let n = self.conn_ends.len();
        (self.next_send, self.next_recv, self.queues) = (vec![0; n], vec![0; n], vec![VecDeque::new(); n]);
    }

    fn ready(&self, rank: u32, i: u32) -> bool {
        let (r, at) = (rank as usize, i as usize);
        let (send, recv) = self.conn_of[r][at];
        !self.done[r][at]
            && self.unmet[r][at] == 0
            && send.is_none_or(|c| self.senders[c][self.next_send[c]] == i)
            && recv.is_none_or(|c| self.receivers[c][self.next_recv[c]] == i && !self.queues[c].is_empty())
    }

    /// Runs one ready instruction; returns the instructions whose readiness may have changed.
    fn fire(&mut self, rank: u32, i: u32) -> Result<Vec<(u32, u32)>, String> {
        let (r, at) = (rank as usize, i as usize);
        let instr = self.sched.ranks[r].instrs[at];
        let (send, recv) = self.conn_of[r][at];
        let message = recv.map(|c| {
            self.next_recv[c] += 1;
            self.queues[c].pop_front().expect("ready() saw a message")
        });
        if message.as_ref().is_some_and(|m| m.len() != instr.count as usize) {
            return Err(format!("rank {rank} #{i} receives {} chunks from a message of another size", instr.count));
        }
        let memory = &self.memory[r];
        let read = |o: Operand, k: usize| memory[o.buf.0 as usize][o.index as usize + k];
        let values: Vec<u64> = (0..instr.count as usize)
            .map(|k| {
                let incoming = match instr.op {
                    Op::Send | Op::Copy | Op::Reduce => read(instr.src, k),
                    _ => message.as_ref().expect("receiving ops have a message")[k],
                };
                instr.acc.get().map_or(incoming, |acc| read(acc, k).wrapping_add(incoming))
            })
            .collect();
        if let Some(dst) = instr.dst.get() {
            let start = dst.index as usize;
            self.memory[r][dst.buf.0 as usize][start..start + values.len()].copy_from_slice(&values);
        }
        self.done[r][at] = true;
        let mut woken: Vec<(u32, u32)> = Vec::new();
        for &d in &self.dependents[r][at] {
            self.unmet[r][d as usize] -= 1;
            woken.push((rank, d));
        }
        if let Some(c) = send {
            self.queues[c].push_back(values);
            self.next_send[c] += 1;
            woken.extend(self.senders[c].get(self.next_send[c]).map(|&j| (rank, j)));
            woken.extend(self.receivers[c].get(self.next_recv[c]).map(|&j| (self.conn_ends[c].1, j)));
        }
        if let Some(c) = recv {
            woken.extend(self.receivers[c].get(self.next_recv[c]).map(|&j| (rank, j)));
        }
        Ok(woken)
    }

    fn execute(&mut self, order: Order) -> Result<(), String> {
        let mut rng = Rng::new(match order {
            Order::Random(seed) => seed,
            _ => 0,
        });
        let mut ready: VecDeque<(u32, u32)> = VecDeque::new();
        for (rank, program) in self.sched.ranks.iter().enumerate() {
            for i in 0..program.len() as u32 {
                if self.ready(rank as u32, i) {
                    self.queued[rank][i as usize] = true;
                    ready.push_back((rank as u32, i));
                }
            }
        }
        loop {
            let next = match order {
                Order::Fifo => ready.pop_front(),
                Order::Lifo => ready.pop_back(),
                Order::Random(_) if ready.is_empty() => None,
                Order::Random(_) => ready.swap_remove_back(rng.below(ready.len())),
            };
            let Some((rank, i)) = next else { break };
            for (r, j) in self.fire(rank, i)? {
                if !self.queued[r as usize][j as usize] && self.ready(r, j) {
                    self.queued[r as usize][j as usize] = true;
                    ready.push_back((r, j));
                }
            }
        }
        self.finished()
    }

    /// Every instruction ran, every message was received, every output chunk holds the contract.
    fn finished(&self) -> Result<(), String> {
        for (rank, done) in self.done.iter().enumerate() {
            if let Some(i) = done.iter().position(|d| !d) {
                return Err(format!("stuck: rank {rank} #{i} never runs"));
            }
        }
        if let Some(c) = self.queues.iter().position(|q| !q.is_empty()) {
            return Err(format!(
                "a message from rank {} to rank {} is never received",
                self.conn_ends[c].0, self.conn_ends[c].1
            ));
        }
        let (_, out_chunks) = buffer_chunks(self.sched.collective, self.sched.n_ranks, self.sched.chunks);
        for rank in 0..self.sched.n_ranks {
            let (_, (buf, offset)) = windows(self.sched, rank);
            for chunk in 0..out_chunks {
                let Some(terms) = contract(self.sched, rank, chunk) else { continue };
                let want =
                    terms.iter().fold(0u64, |sum, &(q, c)| sum.wrapping_add(self.inputs[q as usize][c as usize]));
                if self.memory[rank as usize][buf.0 as usize][(offset + chunk) as usize] != want {
                    return Err(format!("wrong result: rank {rank} output chunk {chunk}"));
                }
            }
        }
        Ok(())
    }
}

/// `Ok` when `sched` is well formed and computes its collective in each of several execution orders.
pub fn judge(sched: &Schedule, seed: u64) -> Result<(), String> {
    if let Some(problem) = shape_problem(sched) {
        return Err(format!("malformed: {problem}"));
    }
    let orders = [Order::Fifo, Order::Lifo, Order::Random(seed), Order::Random(seed.rotate_left(17) ^ 1)];
    for order in orders {
        Run::new(sched, seed).execute(order).map_err(|why| format!("{why} (order {order:?})"))?;
    }
    Ok(())
}
