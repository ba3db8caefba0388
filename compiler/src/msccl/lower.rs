//! `Algo` -> `Schedule`: MSCCL's buffers, thread blocks and dependencies in collc's memory model, each
//! instruction keeping the `<step>` it came from (its line in the file, its thread block and step number).
//!
//! - `i`, `o`, `s` are `in`, `out` and one scratch buffer (as large as the largest `s_chunks`). In place, `in` and
//!   `out` are windows of one buffer, as MSCCL's in-place calls pass them (allgather's input at `o[r·C]`).
//! - A thread block runs its steps in order: each step depends on the one before it in its block, and on the step
//!   its `depid`/`deps` name. A `nop` is no instruction: what waits on it waits on what it waited on. A rank's
//!   instructions are its blocks' steps interleaved in an order those dependencies allow.
//! - `rrc`, `rrs`, `rrcs` reduce the message with `srcbuf[srcoff]` of the receiving rank, as the runtimes read it
//!   (msccl-tools writes the sender's coordinates there; in every file seen the two are the same chunk).
//! - MSCCL XML names no root: a rooted collective's file is read as written for root 0.
//! - A connection is (sender, receiver, channel): MSCCL gives each one thread block on each side, so its messages
//!   keep that block's order; a file with two blocks on one side of a connection is refused (the runtimes would
//!   interleave their messages at random).

use super::model::{Algo, BufName, Gpu, Step, StepKind, StepOperand, Tb};
use crate::collective::Collective;
use crate::diag::Error;
use crate::emit::{InstrLine, SchedLines};
use crate::sched::{BufId, BufferDecl, Instr, Op, Operand, Placement, RankProgram, Schedule, MAX_SPANS, NO_RANK};
use collc_grammar::ast::Span;

/// Where an instruction came from: its thread block and step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    pub tb: u32,
    pub step: u32,
    pub send: Option<u32>,
    pub recv: Option<u32>,
    pub channel: u32,
}

const HELP: &str = "see ../shared/REFERENCE.md section 6 and docs/language.md (MSCCL XML import)";

/// The collective an `<algo coll>` names, and its chunks per rank block (C) from `nchunksperloop`.
pub fn collective_of(algo: &Algo) -> Result<(Collective, u32), Error> {
    let collective = match algo.coll.as_str() {
        "allreduce" => Collective::AllReduce,
        "allgather" => Collective::AllGather,
        "reduce_scatter" | "reducescatter" => Collective::ReduceScatter,
        "alltoall" => Collective::AllToAll,
        "broadcast" => Collective::Broadcast,
        "reduce" => Collective::Reduce,
        "gather" => Collective::Gather,
        "scatter" => Collective::Scatter,
        other => {
            return Err(Error::new(
                "collc::msccl::collective",
                format!("coll=\"{other}\" is not a collective collc imports"),
                "MSCCL files of allreduce, allgather, reduce_scatter (reducescatter), alltoall, and of broadcast, \
                 reduce, gather and scatter from root 0, import",
            )
            .at(algo.coll_span, "this collective"))
        }
    };
    let per_rank = match collective {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => 1,
        _ => algo.n_gpus,
    };
    if algo.chunks_per_loop % per_rank != 0 {
        return Err(Error::new(
            "collc::msccl::chunks",
            format!("nchunksperloop=\"{}\" is not a multiple of ngpus=\"{}\"", algo.chunks_per_loop, algo.n_gpus),
            format!("a {} splits its buffer into one block per rank", collective.name()),
        )
        .at(algo.span, "here"));
    }
    Ok((collective, algo.chunks_per_loop / per_rank))
}

/// The placements a file declares, the one it is read in first: in place when `inplace="1"` and not
/// `outofplace="1"`; both when both say 1 (out of place first); out of place otherwise.
pub fn placements_of(algo: &Algo) -> Vec<Placement> {
    match (algo.in_place, algo.out_of_place) {
        (true, None | Some(false)) => vec![Placement::InPlace],
        (true, Some(true)) => vec![Placement::OutOfPlace, Placement::InPlace],
        _ => vec![Placement::OutOfPlace],
    }
}

/// Lowers a read file into a schedule, its instructions' lines in `text`, and their origins.
pub fn lower(
    algo: &Algo,
    text: &str,
    placement: Placement,
    max_slots: u64,
) -> Result<(Schedule, SchedLines, Vec<Vec<Origin>>), Error> {
    let (collective, chunks) = collective_of(algo)?;
    let (in_chunks, out_chunks) = collective.buffer_chunks(algo.n_gpus, chunks);
    let scratch = algo.gpus.iter().map(|g| g.s_chunks).max().unwrap_or(0);
    let slots = algo.n_gpus as u64 * (in_chunks as u64 + out_chunks as u64 + scratch as u64);
    if slots > max_slots {
        return Err(Error::new(
            "collc::msccl::chunks",
            format!(
                "{} GPUs of {in_chunks} + {out_chunks} + {scratch} chunks are {slots} chunk slots; at most {max_slots}",
                algo.n_gpus
            ),
            "raise --max-slots for a file this large",
        )
        .at(algo.span, "here"));
    }
    let mut buffers = vec![
        BufferDecl { name: "in".into(), chunks: in_chunks },
        BufferDecl { name: "out".into(), chunks: out_chunks },
    ];
    if scratch > 0 {
        buffers.push(BufferDecl { name: "scratch".into(), chunks: scratch });
    }
    let per_step = algo.n_steps() < MAX_SPANS;
    let mut spans = vec![algo.span];
    let mut sched = Schedule {
        algorithm: algo.name.clone(),
        collective,
        placement,
        n_ranks: algo.n_gpus,
        chunks,
        root: 0,
        peer: 1 % algo.n_gpus,
        params: Vec::new(),
        buffers,
        ranks: Vec::with_capacity(algo.gpus.len()),
        spans: Vec::new(),
    };
    let mut lines = SchedLines::default();
    let mut origins = Vec::new();
    let line_starts: Vec<u32> = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i as u32 + 1)).collect();
    for gpu in &algo.gpus {
        check_sizes(gpu, &sched)?;
        check_connections(gpu)?;
        let rank = RankBuilder { gpu, sched: &sched, line_starts: &line_starts, per_step, spans: &mut spans };
        let (program, rank_lines, rank_origins) = rank.build()?;
        sched.ranks.push(program);
        lines.ranks.push(rank_lines);
        origins.push(rank_origins);
    }
    sched.spans = spans;
    super::positions::keep_positions(&mut sched);
    Ok((sched, lines, origins))
}

/// A GPU's declared sizes must fit the collective's buffers (0 for a buffer the file leaves unused).
fn check_sizes(gpu: &Gpu, sched: &Schedule) -> Result<(), Error> {
    for (name, declared, buf) in [("i_chunks", gpu.i_chunks, BufId::IN), ("o_chunks", gpu.o_chunks, BufId::OUT)] {
        let expected = sched.buffer(buf).chunks;
        if declared > expected {
            return Err(Error::new(
                "collc::msccl::chunks",
                format!(
                    "gpu {}: {name}=\"{declared}\", but a {} of {} ranks with {} chunks per block has {expected}",
                    gpu.id,
                    sched.collective.name(),
                    sched.n_ranks,
                    sched.chunks
                ),
                "i_chunks and o_chunks are nchunksperloop (allreduce) or nchunksperloop / ngpus per rank's block",
            )
            .at(gpu.span, "this GPU"));
        }
    }
    Ok(())
}

/// Each (peer, channel) has at most one sending and one receiving thread block on a GPU.
fn check_connections(gpu: &Gpu) -> Result<(), Error> {
    let mut seen: Vec<(bool, u32, u32, &Tb)> = Vec::new();
    for tb in &gpu.tbs {
        for (sends, peer) in [(true, tb.send), (false, tb.recv)] {
            let Some(peer) = peer else { continue };
            let used = tb.steps.iter().any(|s| match sends {
                true => op_of(s.kind).is_some_and(Op::sends),
                false => op_of(s.kind).is_some_and(Op::receives),
            });
            if !used {
                continue;
            }
            if let Some((_, _, _, other)) =
                seen.iter().find(|(s, p, c, _)| *s == sends && *p == peer && *c == tb.channel)
            {
                let dir = if sends { "send to" } else { "receive from" };
                return Err(Error::new(
                    "collc::msccl::connection",
                    format!(
                        "gpu {}: thread blocks {} and {} both {dir} rank {peer} on channel {}",
                        gpu.id, other.id, tb.id, tb.channel
                    ),
                    "MSCCL gives a connection (peer, channel) one thread block on each side; put one of them on \
                     another channel",
                )
                .at(tb.span, "this thread block")
                .at(other.span, "and this one"));
            }
            seen.push((sends, peer, tb.channel, tb));
        }
    }
    Ok(())
}

fn op_of(kind: StepKind) -> Option<Op> {
    Some(match kind {
        StepKind::Send => Op::Send,
        StepKind::Recv => Op::Recv,
        StepKind::RecvCopySend => Op::RecvCopySend,
        StepKind::RecvReduceSend => Op::RecvReduceSend,
        StepKind::RecvReduceCopy => Op::RecvReduceCopy,
        StepKind::RecvReduceCopySend => Op::RecvReduceCopySend,
        StepKind::Copy => Op::Copy,
        StepKind::Reduce => Op::Reduce,
        StepKind::Nop => return None,
    })
}

struct RankBuilder<'a> {
    gpu: &'a Gpu,
    sched: &'a Schedule,
    /// Where each line of the file starts: a step's line by binary search (counting from the start of the file for
    /// every step made importing 1 MB files take a second).
    line_starts: &'a [u32],
    per_step: bool,
    spans: &'a mut Vec<Span>,
}

impl RankBuilder<'_> {
    /// Interleaves the thread blocks: round after round, each block emits its next step if what it waits for is
    /// done. A round that emits nothing while steps remain is a cycle of waits (the runtimes would hang).
    fn build(mut self) -> Result<(RankProgram, Vec<InstrLine>, Vec<Origin>), Error> {
        let tbs = &self.gpu.tbs;
        self.check_dependencies()?;
        // The instructions whose completion means step s of block t is done (one for a real step; for a nop,
        // what it waited on).
        let mut done: Vec<Vec<Vec<u32>>> = tbs.iter().map(|tb| Vec::with_capacity(tb.steps.len())).collect();
        let mut program = RankProgram::default();
        let (mut lines, mut origins) = (Vec::new(), Vec::new());
        let remaining = |done: &Vec<Vec<Vec<u32>>>| tbs.iter().zip(done).any(|(tb, d)| d.len() < tb.steps.len());
        let mut deps = Vec::new();
        while remaining(&done) {
            let mut progressed = false;
            for (t, tb) in tbs.iter().enumerate() {
                let s = done[t].len();
                let Some(step) = tb.steps.get(s) else { continue };
                let waits_on = (step.dep_tb >= 0).then(|| (step.dep_tb as usize, step.dep_step as usize));
                if waits_on.is_some_and(|(dt, ds)| done[dt].len() <= ds) {
                    continue;
                }
                progressed = true;
                deps.clear();
                if s > 0 {
                    deps.extend_from_slice(&done[t][s - 1]);
                }
                if let Some((dt, ds)) = waits_on {
                    deps.extend_from_slice(&done[dt][ds]);
                }
                deps.sort_unstable();
                deps.dedup();
                let Some(instr) = self.instr(tb, step)? else {
                    done[t].push(deps.clone());
                    continue;
                };
                let index = program.len() as u32;
                program.push(instr, &deps);
                lines.push(InstrLine {
                    line: self.line_starts.partition_point(|&start| start <= step.span.start) as u32,
                    start: step.span.start,
                    end: step.span.end,
                });
                origins.push(Origin { tb: tb.id, step: step.s, send: tb.send, recv: tb.recv, channel: tb.channel });
                done[t].push(vec![index]);
            }
            if !progressed {
                return Err(self.cycle(&done));
            }
        }
        Ok((program, lines, origins))
    }

    /// Dependencies name a step of a thread block of this GPU that publishes its completion (`hasdep="1"`).
    fn check_dependencies(&self) -> Result<(), Error> {
        let tbs = &self.gpu.tbs;
        for tb in tbs {
            for step in &tb.steps {
                if step.dep_tb < 0 && step.dep_step < 0 {
                    continue;
                }
                let at = |message: String, help: &str| {
                    Error::new(
                        "collc::msccl::dependency",
                        format!("gpu {}, thread block {}, step {}: {message}", self.gpu.id, tb.id, step.s),
                        help,
                    )
                    .at(step.span, "this step")
                };
                let target = usize::try_from(step.dep_tb).ok().and_then(|t| tbs.get(t));
                let Some(target) = target else {
                    return Err(at(format!("depid=\"{}\" names no thread block of this GPU", step.dep_tb), HELP));
                };
                let Some(waited) = usize::try_from(step.dep_step).ok().and_then(|s| target.steps.get(s)) else {
                    return Err(at(
                        format!(
                            "deps=\"{}\" names no step of thread block {} ({} steps)",
                            step.dep_step,
                            target.id,
                            target.steps.len()
                        ),
                        HELP,
                    ));
                };
                if target.id == tb.id && waited.s >= step.s {
                    return Err(at(
                        format!("waits on step {} of its own thread block, which runs after it", waited.s),
                        "a thread block runs its steps in order; a step can only wait on an earlier one",
                    ));
                }
                if !waited.has_dep && target.id != tb.id {
                    return Err(at(
                        format!("waits on thread block {} step {}, which does not publish its completion (hasdep=\"0\"): the MSCCL runtimes would wait forever", target.id, waited.s),
                        "set hasdep=\"1\" on the step waited on",
                    )
                    .at(waited.span, "the step waited on"));
                }
            }
        }
        Ok(())
    }

    fn cycle(&self, done: &[Vec<Vec<u32>>]) -> Error {
        let mut waits = Vec::new();
        let mut first = None;
        for (t, tb) in self.gpu.tbs.iter().enumerate() {
            if let Some(step) = tb.steps.get(done[t].len()) {
                first.get_or_insert(step.span);
                waits.push(format!(
                    "thread block {} step {} waits on thread block {} step {}",
                    tb.id, step.s, step.dep_tb, step.dep_step
                ));
            }
        }
        Error::new(
            "collc::msccl::dependency",
            format!(
                "gpu {}: the thread blocks' dependencies wait on each other in a cycle (the runtimes would hang)",
                self.gpu.id
            ),
            "a step can only wait on steps that do not, through their own blocks and dependencies, wait on it",
        )
        .at(first.unwrap_or(self.gpu.span), "this step never becomes ready")
        .with_note(waits.join("\n"))
    }

    /// The instruction of one step, or `None` for a `nop`.
    fn instr(&mut self, tb: &Tb, step: &Step) -> Result<Option<Instr>, Error> {
        let Some(op) = op_of(step.kind) else { return Ok(None) };
        let span = match self.per_step {
            true => step.span,
            false => tb.span,
        };
        if self.spans.last() != Some(&span) {
            self.spans.push(span);
        }
        let peer = |peer: Option<u32>, what: &str| {
            peer.ok_or_else(|| {
                self.step_error(
                    tb,
                    step,
                    format!("a `{}` step {what}s, but its thread block's {what} peer is -1", step.kind.name()),
                )
            })
        };
        let mut instr = Instr {
            op,
            channel: tb.channel as u8,
            span: (self.spans.len() - 1) as u16,
            count: step.count,
            send_peer: NO_RANK,
            recv_peer: NO_RANK,
            src: Operand::NONE,
            acc: Operand::NONE,
            dst: Operand::NONE,
        };
        if op.sends() {
            instr.send_peer = peer(tb.send, "send")?;
        }
        if op.receives() {
            instr.recv_peer = peer(tb.recv, "receive")?;
        }
        let src = || self.operand(tb, step, step.src, "src");
        let dst = || self.operand(tb, step, step.dst, "dst");
        match op {
            Op::Send | Op::Copy => instr.src = src()?,
            Op::RecvReduceSend => instr.acc = src()?,
            Op::RecvReduceCopy | Op::RecvReduceCopySend => (instr.acc, instr.dst) = (src()?, dst()?),
            Op::Reduce => (instr.src, instr.acc, instr.dst) = (src()?, dst()?, dst()?),
            Op::Recv | Op::RecvCopySend => {}
        }
        if matches!(op, Op::Copy | Op::Recv | Op::RecvCopySend) {
            instr.dst = dst()?;
        }
        Ok(Some(instr))
    }

    fn step_error(&self, tb: &Tb, step: &Step, message: String) -> Error {
        Error::new(
            "collc::msccl::step",
            format!("gpu {}, thread block {}, step {}: {message}", self.gpu.id, tb.id, step.s),
            HELP,
        )
        .at(step.span, "this step")
    }

    /// A step's buffer and offset as a collc operand, within the buffer the GPU declares.
    fn operand(&self, tb: &Tb, step: &Step, operand: Option<StepOperand>, what: &str) -> Result<Operand, Error> {
        let Some((buf, offset, at)) = operand else {
            return Err(self.step_error(tb, step, format!("a `{}` step needs its {what}buf", step.kind.name())));
        };
        let (id, declared) = match buf {
            BufName::Input => (BufId::IN, self.sched.buffer(BufId::IN).chunks),
            BufName::Output => (BufId::OUT, self.sched.buffer(BufId::OUT).chunks),
            BufName::Scratch => (BufId::FIRST_SCRATCH, self.gpu.s_chunks),
        };
        let offset = u32::try_from(offset).map_err(|_| {
            self.step_error(tb, step, format!("a `{}` step needs its {what}off (it is -1)", step.kind.name()))
        })?;
        if offset as u64 + step.count as u64 > declared as u64 {
            return Err(self
                .step_error(
                    tb,
                    step,
                    format!(
                        "{what}buf=\"{}\" {what}off=\"{offset}\" cnt=\"{}\" reaches chunk {}, past the buffer's {declared} chunks",
                        buf.name(),
                        step.count,
                        offset as u64 + step.count as u64 - 1
                    ),
                )
                .at(at, "this buffer"));
        }
        Ok(Operand::new(id, offset))
    }
}
