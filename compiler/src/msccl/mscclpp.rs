//! `VerifiedSchedule` -> MSCCL++ execution-plan JSON, the format `src/core/executor/execution_plan.cc` reads and
//! `src/core/include/execution_kernel.hpp` runs, at microsoft/mscclpp commit 00668b4a41acbf25214c03df74d743849d8518e8
//! (the format has no version field; docs/language.md §13 says the same).
//!
//! MSCCL++ has no two-sided messages: a rank `put`s into a peer's memory and `signal`s a memory channel, the peer
//! `wait`s on it. So each message of the schedule gets a scratch slot of its own on the receiver (after the
//! schedule's own scratch): the sender puts its chunks there, then signals the pair's data channel; the receiver
//! waits, copies or reduces out of the slot, and signals the pair's ack channel; at the end of its thread block the
//! sender waits for every ack, so no call returns while a peer may still read a slot the next call writes. Data and
//! acks take two channels per pair and collc channel (a `wait` counts the peer's signals on its channel, so the
//! two kinds must not share one), listed alike on both sides, as MSCCL++ pairs a rank's k-th channel to a peer with
//! the peer's k-th.
//!
//! Thread blocks are the XML export's connection groups; an operation runs on every thread of its block with no
//! barrier after it, so a `nop` (`__syncthreads`) follows every data operation and every `wait`, and goes before
//! every `signal`. A dependency between blocks is a semaphore (`sem_release` after, `sem_acquire` before). A block
//! longer than the executor's 64 operations is cut into blocks chained by semaphores.
//!
//! A block runs its operations in order, which the schedule's dataflow did not ask: the schedule with that order
//! added as dependencies is verified before the plan is written (puts never wait for room, so the verifier's
//! bounded channels are the stricter test).

use super::write::{check_collective, connection_groups, limit_error, scratch_bases};
use crate::diag::Error;
use crate::sched::{BufId, Instr, Op, Operand, Schedule};
use crate::{Errors, Limits, VerifiedSchedule};
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};

/// `MAX_OPERATION` in the executor: operations per thread block, `nop`s included.
const MAX_OPS: usize = 64;
/// Channels a thread block may name.
const MAX_TB_CHANNELS: usize = 16;

/// One message: the receiver's slot in its scratch.
type Slots = HashMap<(u32, u32, u8, usize), u32>;

/// Exports a verified schedule as an MSCCL++ execution plan (JSON text).
pub fn export(verified: &VerifiedSchedule, limits: &Limits) -> Result<String, Errors> {
    let sched = verified.schedule();
    check_collective(sched, "mscclpp-json")?;
    check_block_order(sched, limits)?;
    let bases = scratch_bases(sched);
    let own_scratch = (0..sched.buffers.len())
        .filter(|&b| BufId(b as u8).is_scratch())
        .map(|b| bases[b] + sched.buffers[b].chunks)
        .max()
        .unwrap_or(0);
    let (slots, scratch_chunks) = message_slots(sched, own_scratch);
    let channels = pair_channels(sched);
    let mut gpus = Vec::with_capacity(sched.ranks.len());
    for rank in 0..sched.n_ranks {
        let gpu = Gpu::new(sched, rank, &channels);
        gpus.push(gpu.plan(sched, &bases, &slots, scratch_chunks[rank as usize])?);
    }
    let plan = json!({
        "name": sched.algorithm,
        "collective": sched.collective.name(),
        "protocol": "Simple",
        "inplace": sched.placement == crate::Placement::InPlace,
        "reuse_resources": false,
        "use_double_scratch_buffer": false,
        "num_threads_per_block": 1024,
        "buffer_alignment": 16,
        "min_message_size": 0,
        "max_message_size": u64::MAX,
        "gpus": gpus,
    });
    Ok(serde_json::to_string_pretty(&plan).expect("JSON values serialise") + "\n")
}

/// Verifies the schedule with each thread block's instructions chained in program order, as the plan runs them.
fn check_block_order(sched: &Schedule, limits: &Limits) -> Result<(), Errors> {
    let mut chained = sched.clone();
    for program in &mut chained.ranks {
        let groups = connection_groups(&program.instrs);
        let mut last: HashMap<usize, u32> = HashMap::new();
        let mut rebuilt = crate::sched::RankProgram::default();
        for (i, instr) in program.instrs.iter().enumerate() {
            let mut deps = program.deps_of(i).to_vec();
            if let Some(&prev) = last.get(&groups[i]) {
                deps.push(prev);
            }
            deps.sort_unstable();
            deps.dedup();
            rebuilt.push(*instr, &deps);
            last.insert(groups[i], i as u32);
        }
        *program = rebuilt;
    }
    match crate::verify::verify_sched(chained, "", &Default::default(), limits) {
        Ok(_) => Ok(()),
        Err(errors) => Err(Errors(vec![Error::new(
            "collc::msccl::export",
            "the MSCCL++ plan's thread blocks run their operations in order, and in that order this schedule does not \
             verify",
            "give the transfers that wait on each other different channels, so they fall into different thread blocks",
        )
        .with_note(errors.0.iter().map(|e| format!("{}: {}", e.code, e.message)).collect::<Vec<_>>().join("\n"))])),
    }
}

/// Every message's slot in its receiver's scratch (after `own` chunks of the schedule's scratch), keyed by
/// (sender, receiver, channel, k) for the k-th message of the connection; and each rank's scratch size.
fn message_slots(sched: &Schedule, own: u32) -> (Slots, Vec<u32>) {
    let mut slots = Slots::new();
    let mut sizes = Vec::with_capacity(sched.ranks.len());
    for (rank, program) in sched.ranks.iter().enumerate() {
        let mut next = own;
        let mut count: HashMap<(u32, u8), usize> = HashMap::new();
        for instr in program.instrs.iter() {
            if let Some(from) = instr.recv_peer() {
                let k = count.entry((from, instr.channel)).or_default();
                slots.insert((from, rank as u32, instr.channel, *k), next);
                *k += 1;
                next += instr.count;
            }
        }
        sizes.push(next);
    }
    (slots, sizes)
}

/// The (lower rank, higher rank, collc channel) of every pair that exchanges messages, in either direction.
fn pair_channels(sched: &Schedule) -> BTreeSet<(u32, u32, u8)> {
    let mut pairs = BTreeSet::new();
    for (rank, program) in sched.ranks.iter().enumerate() {
        for instr in &program.instrs {
            if let Some(peer) = instr.send_peer() {
                pairs.insert(((rank as u32).min(peer), (rank as u32).max(peer), instr.channel));
            }
        }
    }
    pairs
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Data,
    Ack,
}

/// One rank's plan in the making: its memory channels, remote buffers and semaphores.
struct Gpu {
    rank: u32,
    /// (peer, collc channel, kind), in the order both sides list them.
    channels: Vec<(u32, u8, Kind)>,
    /// Peers whose scratch this rank puts into.
    remote: Vec<u32>,
    semaphores: usize,
}

/// One thread block's operations and the GPU-level channels and remote buffers they name.
#[derive(Default)]
struct Block {
    /// The operations of the instruction being written.
    ops: Vec<Value>,
    /// Each instruction's operations, in order.
    items: Vec<(usize, Vec<Value>)>,
    channels: Vec<usize>,
    remote: Vec<usize>,
    /// Acks to wait for at the end: (GPU channel) per message sent.
    acks: Vec<usize>,
}

impl Block {
    fn channel(&mut self, gpu_channel: usize) -> usize {
        match self.channels.iter().position(|&c| c == gpu_channel) {
            Some(i) => i,
            None => {
                self.channels.push(gpu_channel);
                self.channels.len() - 1
            }
        }
    }

    fn remote(&mut self, gpu_buffer: usize) -> usize {
        match self.remote.iter().position(|&b| b == gpu_buffer) {
            Some(i) => i,
            None => {
                self.remote.push(gpu_buffer);
                self.remote.len() - 1
            }
        }
    }

    fn nop(&mut self) {
        self.ops.push(json!({"name": "nop"}));
    }

    fn signal(&mut self, gpu_channel: usize) {
        let id = self.channel(gpu_channel);
        self.ops.push(json!({"name": "signal", "channel_ids": [id], "channel_type": "memory"}));
    }

    fn wait(&mut self, gpu_channel: usize) {
        let id = self.channel(gpu_channel);
        self.ops.push(json!({"name": "wait", "channel_ids": [id], "channel_type": "memory"}));
    }

    fn put(&mut self, src: Value, gpu_buffer: usize, slot: u32, count: u32) {
        let id = self.remote(gpu_buffer);
        let dst = json!({"buffer_id": id, "index": slot, "size": count});
        self.ops.push(json!({"name": "put", "src_buff": [src], "dst_buff": [dst], "channel_type": "memory"}));
    }
}

fn local(buf: &str, index: u32, count: u32) -> Value {
    json!({"type": buf, "index": index, "size": count})
}

impl Gpu {
    fn new(sched: &Schedule, rank: u32, pairs: &BTreeSet<(u32, u32, u8)>) -> Gpu {
        let mut channels: Vec<(u32, u8, Kind)> = pairs
            .iter()
            .filter(|&&(a, b, _)| a == rank || b == rank)
            .flat_map(|&(a, b, c)| {
                let peer = if a == rank { b } else { a };
                [(peer, c, Kind::Data), (peer, c, Kind::Ack)]
            })
            .collect();
        channels.sort_by_key(|&(peer, c, kind)| (peer, c, kind == Kind::Ack));
        let remote: Vec<u32> = sched.ranks[rank as usize]
            .instrs
            .iter()
            .filter_map(Instr::send_peer)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        Gpu { rank, channels, remote, semaphores: 0 }
    }

    fn gpu_channel(&self, peer: u32, channel: u8, kind: Kind) -> usize {
        self.channels.iter().position(|&c| c == (peer, channel, kind)).expect("every pair's channels are listed")
    }

    /// The rank's thread blocks, then the JSON object of the GPU.
    fn plan(mut self, sched: &Schedule, bases: &[u32], slots: &Slots, scratch: u32) -> Result<Value, Errors> {
        let program = &sched.ranks[self.rank as usize];
        let groups = connection_groups(&program.instrs);
        let mut block_of_group: HashMap<usize, usize> = HashMap::new();
        let mut blocks: Vec<Block> = Vec::new();
        let mut placed: Vec<usize> = Vec::with_capacity(program.len());
        // Semaphores released after an instruction, per instruction.
        let mut releases: Vec<Vec<usize>> = vec![Vec::new(); program.len()];
        let mut sent: HashMap<(u32, u8), usize> = HashMap::new();
        let mut received: HashMap<(u32, u8), usize> = HashMap::new();
        for (i, instr) in program.instrs.iter().enumerate() {
            let b = *block_of_group.entry(groups[i]).or_insert_with(|| {
                blocks.push(Block::default());
                blocks.len() - 1
            });
            // Wait for the latest instruction of each other block this one depends on.
            let mut waits: HashMap<usize, u32> = HashMap::new();
            for &d in program.deps_of(i) {
                let other = placed[d as usize];
                if other != b {
                    let latest = waits.entry(other).or_insert(d);
                    *latest = (*latest).max(d);
                }
            }
            let mut waits: Vec<u32> = waits.into_values().collect();
            waits.sort_unstable();
            for d in waits {
                let sem = self.semaphores;
                self.semaphores += 1;
                releases[d as usize].push(sem);
                blocks[b].ops.push(json!({"name": "sem_acquire", "semaphore_ids": [sem]}));
                blocks[b].nop();
            }
            self.instruction(&mut blocks[b], instr, bases, slots, (&mut sent, &mut received));
            let ops = std::mem::take(&mut blocks[b].ops);
            blocks[b].items.push((i, ops));
            placed.push(b);
        }
        let mut threadblocks = Vec::new();
        for block in blocks {
            threadblocks.extend(self.segments(sched, block, &releases)?);
        }
        for (id, tb) in threadblocks.iter_mut().enumerate() {
            tb["id"] = json!(id);
        }
        let remote_buffers: Vec<Value> = self
            .remote
            .iter()
            .map(|&peer| json!({"rank": peer, "type": "s", "access_channel_types": ["memory"]}))
            .collect();
        let (in_chunks, out_chunks) = (sched.buffer(BufId::IN).chunks, sched.buffer(BufId::OUT).chunks);
        Ok(json!({
            "id": self.rank,
            "input_chunks": in_chunks,
            "output_chunks": out_chunks,
            "scratch_chunks": scratch,
            "threadblocks": threadblocks,
            "channels": [{"channel_type": "memory", "connected_to": self.channels.iter().map(|c| c.0).collect::<Vec<_>>()}],
            "remote_buffers": remote_buffers,
            "semaphores": (0..self.semaphores).map(|_| json!({"init_value": 0})).collect::<Vec<_>>(),
        }))
    }
}

impl Gpu {
    /// The operations of one instruction (see the module's doc), into `block.ops`.
    fn instruction(
        &self,
        block: &mut Block,
        instr: &Instr,
        bases: &[u32],
        slots: &Slots,
        (sent, received): (&mut HashMap<(u32, u8), usize>, &mut HashMap<(u32, u8), usize>),
    ) {
        let n = instr.count;
        let buf = |o: Operand| match o.buf {
            BufId::IN => local("i", o.index, n),
            BufId::OUT => local("o", o.index, n),
            b => local("s", bases[b.0 as usize] + o.index, n),
        };
        // The slot of the message this instruction receives.
        let slot = instr.recv_peer().map(|from| {
            let k = received.entry((from, instr.channel)).or_default();
            let slot = slots[&(from, self.rank, instr.channel, *k)];
            *k += 1;
            block.wait(self.gpu_channel(from, instr.channel, Kind::Data));
            block.nop();
            slot
        });
        let in_slot = |slot: u32| local("s", slot, n);
        // What the instruction sends, once its local part is done.
        let outgoing = match (instr.op, slot) {
            (Op::Send, _) => Some(buf(instr.src)),
            (Op::Copy, _) => {
                block.ops.push(json!({"name": "copy", "src_buff": [buf(instr.src)], "dst_buff": [buf(instr.dst)]}));
                None
            }
            (Op::Reduce, _) => {
                block.ops.push(reduce(buf(instr.acc), buf(instr.src), buf(instr.dst)));
                None
            }
            (Op::Recv | Op::RecvCopySend, Some(slot)) => {
                block.ops.push(json!({"name": "copy", "src_buff": [in_slot(slot)], "dst_buff": [buf(instr.dst)]}));
                Some(in_slot(slot))
            }
            (Op::RecvReduceCopy | Op::RecvReduceCopySend, Some(slot)) => {
                block.ops.push(reduce(buf(instr.acc), in_slot(slot), buf(instr.dst)));
                Some(buf(instr.dst))
            }
            (Op::RecvReduceSend, Some(slot)) => {
                block.ops.push(reduce(buf(instr.acc), in_slot(slot), in_slot(slot)));
                Some(in_slot(slot))
            }
            _ => None,
        };
        if !matches!(instr.op, Op::Send) {
            block.nop();
        }
        if let (Some(to), Some(src)) = (instr.send_peer(), outgoing.filter(|_| instr.op.sends())) {
            let k = sent.entry((to, instr.channel)).or_default();
            let remote_slot = slots[&(self.rank, to, instr.channel, *k)];
            *k += 1;
            let buffer = self.remote.iter().position(|&p| p == to).expect("every peer sent to has a remote buffer");
            block.put(src, buffer, remote_slot, n);
            block.nop();
            block.signal(self.gpu_channel(to, instr.channel, Kind::Data));
            let ack = self.gpu_channel(to, instr.channel, Kind::Ack);
            block.acks.push(ack);
        }
        if let Some(from) = instr.recv_peer() {
            block.signal(self.gpu_channel(from, instr.channel, Kind::Ack));
        }
    }

    /// A block's operations, with the semaphores released after instructions other blocks wait for and the acks
    /// waited for at its end, as threadblocks of at most `MAX_OPS` operations chained by semaphores.
    fn segments(&mut self, sched: &Schedule, mut block: Block, releases: &[Vec<usize>]) -> Result<Vec<Value>, Errors> {
        if block.channels.len() > MAX_TB_CHANNELS {
            let instr = &sched.ranks[self.rank as usize].instrs[block.items[0].0];
            return Err(limit_error(
                sched,
                instr,
                format!(
                    "rank {}: a thread block names {} memory channels; MSCCL++ allows {MAX_TB_CHANNELS}",
                    self.rank,
                    block.channels.len()
                ),
                "spread the rank's transfers over more channels",
            ));
        }
        let mut ops: Vec<Value> = Vec::new();
        for (i, item) in std::mem::take(&mut block.items) {
            ops.extend(item);
            if !releases[i].is_empty() {
                ops.push(json!({"name": "nop"}));
                for chunk in releases[i].chunks(16) {
                    ops.push(json!({"name": "sem_release", "semaphore_ids": chunk}));
                }
            }
        }
        for ack in std::mem::take(&mut block.acks) {
            block.wait(ack);
        }
        ops.append(&mut block.ops);
        let channels = json!([{"channel_type": "memory", "channel_ids": block.channels}]);
        let refs = json!([{"access_channel_type": "memory", "remote_buffer_ids": block.remote}]);
        let make = |ops: Vec<Value>| json!({"id": 0, "ops": ops, "channels": channels, "remote_buffer_refs": refs});
        if ops.len() <= MAX_OPS {
            return Ok(vec![make(ops)]);
        }
        // Each later segment starts by acquiring what the one before released at its end.
        let room = MAX_OPS - 4;
        let mut segments = Vec::new();
        let pieces: Vec<Vec<Value>> = ops.chunks(room).map(<[Value]>::to_vec).collect();
        let last = pieces.len() - 1;
        for (k, piece) in pieces.into_iter().enumerate() {
            let mut segment = Vec::with_capacity(MAX_OPS);
            if k > 0 {
                segment.push(json!({"name": "sem_acquire", "semaphore_ids": [self.semaphores - 1]}));
                segment.push(json!({"name": "nop"}));
            }
            segment.extend(piece);
            if k < last {
                segment.push(json!({"name": "nop"}));
                segment.push(json!({"name": "sem_release", "semaphore_ids": [self.semaphores]}));
                self.semaphores += 1;
            }
            segments.push(make(segment));
        }
        Ok(segments)
    }
}

/// `dst = acc + other`: the executor's `re` sums its sources into its destination.
fn reduce(acc: Value, other: Value, dst: Value) -> Value {
    json!({"name": "re", "src_buff": [acc, other], "dst_buff": [dst], "channel_type": "none", "reduce_op": "sum"})
}
