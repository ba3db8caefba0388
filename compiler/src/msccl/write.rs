//! `VerifiedSchedule` -> MSCCL XML of a target runtime, its limits checked before a byte is written (a diagnostic
//! naming the limit and the `.coll` line, never a file the runtime would refuse or silently replace), and the
//! result read back and verified (a thread block runs its steps in order, which the schedule's dataflow did not ask).
//!
//! Thread blocks: the connections of a rank (peer, channel, direction) are grouped so that an instruction's send and
//! receive connection share its block; a block then runs its instructions in the schedule's program order.
//! Dependencies between blocks become `depid`/`deps`, one per step, more as `nop` steps before it; `hasdep="1"` on
//! every step another block waits on. Scratch buffers are laid end to end in `s`, each from a multiple of C, so a
//! chunk keeps its position in its block.

use crate::diag::Error;
use crate::fxhash::FxBuildHasher;
use crate::sched::{BufId, Instr, Op, Operand, Placement, Schedule};
use crate::{Errors, Limits, VerifiedSchedule};
use std::collections::HashMap;
use std::fmt::Write;

/// The runtime an exported file is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The NCCL fork's interpreter (msccl-tools' runtime).
    Legacy,
    /// msccl-executor-nccl and RCCL's MSCCL: requires `outofplace`, `minBytes`, `maxBytes`.
    Executor,
}

/// What a target's runtime accepts (msccl's `MSCCL_MAX_NUM_STEPS`, `MSCCL_MAX_COUNT`, thread blocks per channel,
/// `depid` in an int8, NCCL's `MAXCHANNELS`).
struct TargetLimits {
    name: &'static str,
    steps_per_tb: usize,
    tbs_per_channel: usize,
    count: u32,
    tb_id: usize,
    channels: usize,
}

impl Target {
    pub fn name(self) -> &'static str {
        self.limits().name
    }

    pub fn from_name(name: &str) -> Option<Target> {
        [Target::Legacy, Target::Executor].into_iter().find(|t| t.name() == name)
    }

    fn limits(self) -> TargetLimits {
        let steps_per_tb = match self {
            Target::Legacy => 255,
            Target::Executor => 63,
        };
        let name = match self {
            Target::Legacy => "msccl-legacy",
            Target::Executor => "msccl-executor",
        };
        TargetLimits { name, steps_per_tb, tbs_per_channel: 32, count: 71, tb_id: 127, channels: 32 }
    }
}

/// One `<step>` as written.
struct XmlStep {
    kind: &'static str,
    src: (char, u32),
    dst: (char, u32),
    count: u32,
    dep: Option<(usize, usize)>,
    has_dep: bool,
    /// The instruction it came from (for diagnostics); `nop`s carry the one they precede.
    instr: usize,
}

struct XmlTb {
    send: Option<u32>,
    recv: Option<u32>,
    channel: u8,
    steps: Vec<XmlStep>,
}

/// Exports a verified schedule as MSCCL XML for `target`; the file is read back and verified before it is returned.
pub fn export(verified: &VerifiedSchedule, target: Target, limits: &Limits) -> Result<String, Errors> {
    let sched = verified.schedule();
    check_collective(sched, target.name())?;
    let scratch_base = scratch_bases(sched);
    let mut gpus = Vec::with_capacity(sched.ranks.len());
    for rank in 0..sched.n_ranks {
        gpus.push(thread_blocks(sched, rank, &scratch_base, target)?);
    }
    let text = write_xml(sched, &gpus, &scratch_base, target);
    match super::import(&text, limits).and_then(|imported| super::verify(imported, &text, limits)) {
        Ok(_) => Ok(text),
        Err(errors) => Err(Errors(vec![Error::new(
            "collc::msccl::export",
            format!("the {} file made of this schedule does not verify", target.name()),
            "a thread block runs its steps in order, which can deadlock a schedule that only its dataflow ordered; \
             give the transfers that wait on each other different channels",
        )
        .with_note(errors.0.iter().map(|e| format!("{}: {}", e.code, e.message)).collect::<Vec<_>>().join("\n"))])),
    }
}

/// MSCCL XML has the collectives but no root and no peer: rooted ones are written for root 0.
pub(super) fn check_collective(sched: &Schedule, format: &str) -> Result<(), Errors> {
    let span = sched.spans.first().copied().unwrap_or_default();
    let refuse = |message: String, help: &str| {
        Errors(vec![Error::new("collc::msccl::limit", message, help).at(span, "this algorithm")])
    };
    if sched.collective == crate::Collective::SendRecv {
        return Err(refuse(
            format!("{format} has no sendrecv collective"),
            "MSCCL runs send and recv as NCCL's own calls",
        ));
    }
    if sched.collective.rooted() && sched.root != 0 {
        return Err(refuse(
            format!(
                "MSCCL XML names no root, and its runtimes run a {} file for root 0; this schedule is for root {}",
                sched.collective, sched.root
            ),
            "build it with --root 0",
        ));
    }
    Ok(())
}

/// Where each buffer of the schedule starts in MSCCL's `s` (scratch only), each rounded up to a multiple of C.
pub(super) fn scratch_bases(sched: &Schedule) -> Vec<u32> {
    let c = sched.chunks.max(1);
    let mut total = 0u32;
    sched
        .buffers
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if !BufId(i as u8).is_scratch() {
                return 0;
            }
            let base = total.div_ceil(c) * c;
            total = base + b.chunks;
            base
        })
        .collect()
}

fn scratch_total(sched: &Schedule, bases: &[u32]) -> u32 {
    (0..sched.buffers.len())
        .filter(|&i| BufId(i as u8).is_scratch())
        .map(|i| bases[i] + sched.buffers[i].chunks)
        .max()
        .unwrap_or(0)
}

fn operand(op: Operand, bases: &[u32]) -> (char, u32) {
    match op.buf {
        BufId::IN => ('i', op.index),
        BufId::OUT => ('o', op.index),
        b => ('s', bases[b.0 as usize] + op.index),
    }
}

pub(super) fn limit_error(sched: &Schedule, instr: &Instr, message: String, help: &str) -> Errors {
    let span = sched.spans.get(instr.span as usize).copied().unwrap_or_default();
    Errors(vec![Error::new("collc::msccl::limit", message, help).at(span, "this transfer")])
}

/// A rank's instructions in thread blocks (see the module's doc), with their steps and dependencies.
fn thread_blocks(sched: &Schedule, rank: u32, bases: &[u32], target: Target) -> Result<Vec<XmlTb>, Errors> {
    let program = &sched.ranks[rank as usize];
    let lim = target.limits();
    let groups = connection_groups(&program.instrs);
    let mut tbs: Vec<XmlTb> = Vec::new();
    let mut tb_of_group: Vec<Option<usize>> = vec![None; groups.iter().max().map_or(0, |&g| g + 1)];
    // Per instruction: its block and step.
    let mut placed: Vec<(usize, usize)> = Vec::with_capacity(program.len());
    for (i, instr) in program.instrs.iter().enumerate() {
        let t = *tb_of_group[groups[i]].get_or_insert_with(|| {
            tbs.push(XmlTb { send: None, recv: None, channel: instr.channel, steps: Vec::new() });
            tbs.len() - 1
        });
        let tb = &mut tbs[t];
        for (mine, theirs, what) in
            [(&mut tb.send, instr.send_peer(), "send to"), (&mut tb.recv, instr.recv_peer(), "receive from")]
        {
            match (*mine, theirs) {
                (Some(a), Some(b)) if a != b => {
                    return Err(limit_error(
                        sched,
                        instr,
                        format!(
                            "rank {rank}: instruction #{i} ({}) joins a thread block that would {what} both rank {a} \
                             and rank {b} on channel {}: an MSCCL thread block has one send peer and one receive peer, \
                             and the instructions that forward from one connection to another tie them into one block",
                            instr.op.name(),
                            instr.channel
                        ),
                        "give the transfers that share a connection in one direction but not in the other different \
                         channels (the `channel` clause of a transfer)",
                    ))
                }
                (None, Some(b)) => *mine = Some(b),
                _ => {}
            }
        }
        add_steps(program.deps_of(i), &placed, t, i, instr, bases, tb);
        placed.push((t, tb.steps.len() - 1));
        if instr.count > lim.count {
            return Err(limit_error(
                sched,
                instr,
                format!(
                    "rank {rank}: a step of {} chunks; {} allows at most {} (MSCCL_MAX_COUNT)",
                    instr.count, lim.name, lim.count
                ),
                "use fewer chunks per transfer (a smaller `chunks` or a range split into several transfers)",
            ));
        }
    }
    mark_waited(&mut tbs);
    check_counts(sched, rank, &tbs, &lim)?;
    Ok(tbs)
}

/// Each instruction's group: its connections (direction, peer, channel) joined wherever one instruction uses two;
/// instructions without a peer form one group per channel.
pub(super) fn connection_groups(instrs: &[Instr]) -> Vec<usize> {
    let mut keys: HashMap<(u8, u32, u8), usize, FxBuildHasher> = HashMap::default();
    let mut parent: Vec<usize> = Vec::new();
    let mut key = |k: (u8, u32, u8), parent: &mut Vec<usize>| {
        *keys.entry(k).or_insert_with(|| {
            parent.push(parent.len());
            parent.len() - 1
        })
    };
    fn find(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let ids: Vec<usize> = instrs
        .iter()
        .map(|instr| {
            let send = instr.send_peer().map(|p| key((0, p, instr.channel), &mut parent));
            let recv = instr.recv_peer().map(|p| key((1, p, instr.channel), &mut parent));
            match (send, recv) {
                (Some(a), Some(b)) => {
                    let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
                    parent[ra] = rb;
                    a
                }
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => key((2, 0, instr.channel), &mut parent),
            }
        })
        .collect();
    ids.into_iter().map(|i| find(&mut parent, i)).collect()
}

/// Appends an instruction's step to its block, preceded by a `nop` for each dependency on another block past the
/// first (a step carries one).
fn add_steps(
    deps: &[u32],
    placed: &[(usize, usize)],
    t: usize,
    i: usize,
    instr: &Instr,
    bases: &[u32],
    tb: &mut XmlTb,
) {
    // The latest step of each other block this instruction waits on.
    let mut waits: Vec<(usize, usize)> = Vec::new();
    for &d in deps {
        let (dt, ds) = placed[d as usize];
        if dt == t {
            continue;
        }
        match waits.iter_mut().find(|(wt, _)| *wt == dt) {
            Some(w) => w.1 = w.1.max(ds),
            None => waits.push((dt, ds)),
        }
    }
    waits.sort_unstable();
    let (kind, src, dst) = step_operands(instr, bases);
    let last = waits.pop();
    for dep in waits {
        tb.steps.push(XmlStep {
            kind: "nop",
            src: ('i', 0),
            dst: ('o', 0),
            count: 0,
            dep: Some(dep),
            has_dep: false,
            instr: i,
        });
    }
    if instr.op == Op::Reduce && instr.acc != instr.dst {
        // MSCCL's `re` is dst += src: dst = acc + src is a copy of acc, then that.
        let acc = operand(instr.acc, bases);
        tb.steps.push(XmlStep { kind: "cpy", src: acc, dst, count: instr.count, dep: last, has_dep: false, instr: i });
        tb.steps.push(XmlStep { kind, src, dst, count: instr.count, dep: None, has_dep: false, instr: i });
        return;
    }
    tb.steps.push(XmlStep { kind, src, dst, count: instr.count, dep: last, has_dep: false, instr: i });
}

/// The step type and its (srcbuf, srcoff), (dstbuf, dstoff): the operand a step reads locally in `src`, what it
/// writes in `dst`; the one a step lacks repeats the other, as msccl-tools writes them.
fn step_operands(instr: &Instr, bases: &[u32]) -> (&'static str, (char, u32), (char, u32)) {
    let op = |o: Operand| o.get().map(|o| operand(o, bases));
    let (src, acc, dst) = (op(instr.src), op(instr.acc), op(instr.dst));
    let (kind, read, write) = match instr.op {
        Op::Send => ("s", src, None),
        Op::Recv => ("r", None, dst),
        Op::RecvCopySend => ("rcs", None, dst),
        Op::RecvReduceSend => ("rrs", acc, None),
        Op::RecvReduceCopy => ("rrc", acc, dst),
        Op::RecvReduceCopySend => ("rrcs", acc, dst),
        Op::Copy => ("cpy", src, dst),
        Op::Reduce => ("re", src, dst),
    };
    let read = read.or(write).unwrap_or(('i', 0));
    (kind, read, write.unwrap_or(read))
}

fn mark_waited(tbs: &mut [XmlTb]) {
    let waited: Vec<(usize, usize)> = tbs.iter().flat_map(|tb| tb.steps.iter().filter_map(|s| s.dep)).collect();
    for (t, s) in waited {
        tbs[t].steps[s].has_dep = true;
    }
}

fn check_counts(sched: &Schedule, rank: u32, tbs: &[XmlTb], lim: &TargetLimits) -> Result<(), Errors> {
    let first_instr = |tb: &XmlTb, step: usize| &sched.ranks[rank as usize].instrs[tb.steps[step].instr];
    for (t, tb) in tbs.iter().enumerate() {
        if tb.steps.len() > lim.steps_per_tb {
            return Err(limit_error(
                sched,
                first_instr(tb, lim.steps_per_tb),
                format!(
                    "rank {rank}: thread block {t} (send {:?}, recv {:?}, channel {}) has {} steps; {} runs at most {} \
                     per thread block (MSCCL_MAX_NUM_STEPS)",
                    tb.send, tb.recv, tb.channel, tb.steps.len(), lim.name, lim.steps_per_tb
                ),
                "this transfer is the first past the limit: use fewer ranks, fewer chunks, or spread the transfers over \
                 more channels; or export for msccl-legacy, which allows 255",
            ));
        }
        if (tb.channel as usize) >= lim.channels {
            return Err(limit_error(
                sched,
                first_instr(tb, 0),
                format!("channel {}: {} has at most {} channels", tb.channel, lim.name, lim.channels),
                "use fewer channels",
            ));
        }
    }
    let per_channel = |c: u8| tbs.iter().filter(|tb| tb.channel == c).count();
    if let Some(tb) = tbs.iter().find(|tb| per_channel(tb.channel) > lim.tbs_per_channel) {
        return Err(limit_error(
            sched,
            first_instr(tb, 0),
            format!(
                "rank {rank}: {} thread blocks on channel {}; {} allows {} per channel",
                per_channel(tb.channel),
                tb.channel,
                lim.name,
                lim.tbs_per_channel
            ),
            "spread the rank's peers over more channels",
        ));
    }
    if tbs.len() > lim.tb_id + 1 {
        return Err(limit_error(
            sched,
            first_instr(&tbs[lim.tb_id + 1], 0),
            format!(
                "rank {rank}: {} thread blocks; a dependency names its block in an int8 (depid), so at most {}",
                tbs.len(),
                lim.tb_id + 1
            ),
            "use fewer peers per rank or fewer channels",
        ));
    }
    Ok(())
}

fn write_xml(sched: &Schedule, gpus: &[Vec<XmlTb>], bases: &[u32], target: Target) -> String {
    let mut out = String::new();
    let w = &mut out;
    let n_channels = gpus.iter().flatten().map(|tb| tb.channel as u32 + 1).max().unwrap_or(1);
    let coll = match (sched.collective.name(), target) {
        ("reducescatter", Target::Legacy) => "reduce_scatter",
        (name, _) => name,
    };
    let in_place = sched.placement == Placement::InPlace;
    let chunks_per_loop = sched.buffer(BufId::IN).chunks.max(sched.buffer(BufId::OUT).chunks);
    let _ = write!(
        w,
        "<algo name=\"{}\" proto=\"Simple\" nchannels=\"{n_channels}\" nchunksperloop=\"{chunks_per_loop}\" ngpus=\"{}\" \
         coll=\"{coll}\" inplace=\"{}\"",
        escape(&sched.algorithm),
        sched.n_ranks,
        in_place as u8
    );
    if target == Target::Executor {
        let _ = write!(w, " outofplace=\"{}\" minBytes=\"0\" maxBytes=\"{}\"", !in_place as u8, i64::MAX);
    }
    let _ = writeln!(w, ">");
    let scratch = scratch_total(sched, bases);
    for (rank, tbs) in gpus.iter().enumerate() {
        let _ = writeln!(
            w,
            "  <gpu id=\"{rank}\" i_chunks=\"{}\" o_chunks=\"{}\" s_chunks=\"{scratch}\">",
            sched.buffer(BufId::IN).chunks,
            sched.buffer(BufId::OUT).chunks
        );
        for (t, tb) in tbs.iter().enumerate() {
            let _ = writeln!(
                w,
                "    <tb id=\"{t}\" send=\"{}\" recv=\"{}\" chan=\"{}\">",
                peer_attr(tb.send),
                peer_attr(tb.recv),
                tb.channel
            );
            for (s, step) in tb.steps.iter().enumerate() {
                let (depid, deps) = step.dep.map_or((-1, -1), |(t, s)| (t as i64, s as i64));
                let off = |o: u32| if step.kind == "nop" { -1 } else { o as i64 };
                let _ = writeln!(
                    w,
                    "      <step s=\"{s}\" type=\"{}\" srcbuf=\"{}\" srcoff=\"{}\" dstbuf=\"{}\" dstoff=\"{}\" cnt=\"{}\" \
                     depid=\"{depid}\" deps=\"{deps}\" hasdep=\"{}\"/>",
                    step.kind,
                    step.src.0,
                    off(step.src.1),
                    step.dst.0,
                    off(step.dst.1),
                    step.count,
                    step.has_dep as u8
                );
            }
            let _ = writeln!(w, "    </tb>");
        }
        let _ = writeln!(w, "  </gpu>");
    }
    let _ = writeln!(w, "</algo>");
    out
}

/// A thread block's peer as MSCCL writes it: -1 for none.
fn peer_attr(peer: Option<u32>) -> i64 {
    peer.map_or(-1, i64::from)
}

/// Escapes text for an attribute value.
pub(super) fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('"', "&quot;").replace('<', "&lt;").replace('>', "&gt;")
}
