//! Races inside one `step`: a slot written by one transfer and read or written by another of the same step, in the
//! shared (in-place) view where `in` and `out` alias, so that both placements are covered by one check.

use super::Exec;
use crate::diag::Error;
use crate::ir::{Buf, Loc, Transfer, TransferKind};

/// `rank 1 -> rank 2` for a send, `on rank 1` for a local copy or reduce: tells apart iterations of one statement.
fn endpoints(t: &Transfer) -> String {
    match t.kind {
        TransferKind::Send { .. } => format!("rank {} -> rank {}", t.from, t.to),
        _ => format!("on rank {}", t.from),
    }
}

/// Who touched one chunk slot (in the shared in-place view) during the current step: a writer and two distinct
/// readers are enough to find a conflicting pair whenever one exists.
#[derive(Clone, Copy)]
pub(super) struct StepAccess {
    writer: u32,
    readers: [u32; 2],
}

const NOBODY: u32 = u32::MAX;

impl Exec<'_> {
    /// Index of a slot of the shared (in-place) view, where `in` and `out` alias as NCCL lays them out.
    fn slot(&self, rank: u32, loc: Loc, offset: u32) -> usize {
        let (in_off, out_off) = self.collective.in_place_offsets(rank, self.chunks);
        let base = match loc.buf {
            Buf::In => in_off,
            Buf::Out => out_off,
            Buf::Scratch(i) => self.scratch_base[i as usize],
        };
        (rank * self.slots_per_rank + base + loc.index + offset) as usize
    }

    /// A slot written and read (or written twice) by two transfers of one step is a race in either placement.
    ///
    /// Most steps have none, so sorted lists of the step's reads and writes first show whether a written slot is
    /// written again or read (a transfer never touches one slot twice: self-sends and overlapping local transfers
    /// are rejected before this); only a step where one is goes through the table that finds and reports the pairs.
    /// The lists are kept apart because each is mostly in order already (transfers come rank by rank), which the
    /// run-adaptive stable sort finishes in close to one pass.
    pub(super) fn check_step_races(&mut self, first: usize) {
        let (mut reads, mut writes) = std::mem::take(&mut self.step_keys);
        reads.clear();
        writes.clear();
        for t in &self.transfers[first..] {
            for k in 0..t.count {
                reads.push(self.slot(t.from, t.src, k) as u64);
                writes.push(self.slot(t.to, t.dst, k) as u64);
            }
        }
        reads.sort();
        writes.sort();
        let written_twice = writes.windows(2).any(|w| w[0] == w[1]);
        let suspect = written_twice || sorted_lists_meet(&reads, &writes);
        self.step_keys = (reads, writes);
        if suspect {
            self.report_step_races(first);
        }
    }

    fn report_step_races(&mut self, first: usize) {
        self.step_access.clear();
        for i in first..self.transfers.len() {
            let t = self.transfers[i];
            for k in 0..t.count {
                self.access(self.slot(t.from, t.src, k), i as u32, false);
                self.access(self.slot(t.to, t.dst, k), i as u32, true);
            }
        }
    }

    fn access(&mut self, slot: usize, transfer: u32, write: bool) {
        let entry = self.step_access.entry(slot).or_insert(StepAccess { writer: NOBODY, readers: [NOBODY; 2] });
        let other = |o: u32| o != NOBODY && o != transfer;
        // (the writer, the other transfer, whether the other one writes too)
        let conflict = match (write, entry.readers.into_iter().find(|&r| other(r))) {
            _ if other(entry.writer) && write => Some((transfer, entry.writer, true)),
            _ if other(entry.writer) => Some((entry.writer, transfer, false)),
            (true, Some(reader)) => Some((transfer, reader, false)),
            _ => None,
        };
        if write {
            entry.writer = transfer;
        } else if entry.readers[0] == NOBODY {
            entry.readers[0] = transfer;
        } else if entry.readers[0] != transfer && entry.readers[1] == NOBODY {
            entry.readers[1] = transfer;
        }
        if let Some((writer, other, other_writes)) = conflict {
            self.report_race(slot, writer, other, other_writes);
        }
    }

    fn report_race(&mut self, slot: usize, writer: u32, other: u32, other_writes: bool) {
        let (w, o) = (self.transfers[writer as usize], self.transfers[other as usize]);
        let verb = if other_writes { "writes" } else { "reads" };
        let rank = slot as u32 / self.slots_per_rank;
        let index = slot as u32 - self.slot(w.to, Loc { buf: w.dst.buf, index: 0 }, 0) as u32;
        let name = self.buf_name(w.dst.buf);
        let message =
            format!("race in one step: two transfers touch rank {rank}'s `{name}[{index}]` and one writes it");
        let error = Error::new(
            "collc::lower::race",
            message,
            "transfers in one `step` run concurrently; move one of them into a later step",
        )
        .at(self.spans[w.span as usize], format!("this transfer ({}) writes the slot", endpoints(&w)))
        .at(self.spans[o.span as usize], format!("this transfer ({}) {verb} it in the same step", endpoints(&o)));
        self.report("race", error);
    }
}

/// Whether two sorted lists share a value.
fn sorted_lists_meet(a: &[u64], b: &[u64]) -> bool {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        let (x, y) = (a[i], b[j]);
        if x == y {
            return true;
        }
        // Without a branch on which is smaller: a ring's reads and writes alternate, which mispredicted half the
        // time (13% of the samples in `Exec::block` at p = 4096, perf).
        i += usize::from(x < y);
        j += usize::from(y < x);
    }
    false
}
