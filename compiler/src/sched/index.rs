//! Which transfers name each rank: the index scheduling gathers a rank's transfers by, built in parts of the
//! program that can be indexed side by side.

use crate::ir::{Program, Transfer};
use std::ops::Range;

/// The indices of the transfers each rank sends, receives or runs, in program order: per part of the program (in
/// program order too), a compressed row per rank. A rank's list is its rows of every part, one after another.
pub struct TransferIndex {
    parts: Vec<IndexPart>,
}

/// The rows of one part of the program, for every rank.
pub struct IndexPart {
    start: Vec<usize>,
    list: Vec<u32>,
}

/// How many ranks' transfers `TransferIndex::gather` copies at once. A block's transfers of one step lie side by
/// side (a ring's ranks r..r+64 name transfers r-1..r+64 of each step), so a wider block reads longer runs, which
/// the hardware prefetches; the steps lie far apart. At p = 4096, 64 ranks at a time took 4.0 s of scheduling
/// where 8 took 4.3-4.5 (32: 4.1, 128: 4.0; the gathered lists then hold 23 MB per thread).
pub(super) const GATHER_BLOCK: u32 = 64;

impl IndexPart {
    /// The rows of the transfers `transfers` of `program`: two passes over those transfers only, so two threads
    /// can each index half of the program (each reads half of it twice, where one per half of the ranks read all
    /// of it twice).
    pub fn new(program: &Program, transfers: Range<usize>) -> Self {
        let part = &program.transfers[transfers.clone()];
        let mut start = vec![0usize; program.n_ranks as usize + 1];
        for t in part {
            start[t.from as usize + 1] += 1;
            if t.from != t.to {
                start[t.to as usize + 1] += 1;
            }
        }
        for r in 1..start.len() {
            start[r] += start[r - 1];
        }
        let mut fill = start.clone();
        let mut list = vec![0u32; start[start.len() - 1]];
        let mut put = |rank: u32, t: usize| {
            list[fill[rank as usize]] = t as u32;
            fill[rank as usize] += 1;
        };
        for (i, t) in part.iter().enumerate() {
            put(t.from, transfers.start + i);
            if t.from != t.to {
                put(t.to, transfers.start + i);
            }
        }
        IndexPart { start, list }
    }

    fn of(&self, rank: u32) -> &[u32] {
        &self.list[self.start[rank as usize]..self.start[rank as usize + 1]]
    }
}

impl TransferIndex {
    /// The index of the whole program in one part.
    pub fn new(program: &Program) -> Self {
        TransferIndex { parts: vec![IndexPart::new(program, 0..program.transfers.len())] }
    }

    /// The index made of `parts`, which cover the program in order.
    pub fn from_parts(parts: Vec<IndexPart>) -> Self {
        TransferIndex { parts }
    }

    /// Copies the transfers of each rank of `ranks` (at most `GATHER_BLOCK`) into `into[rank - ranks.start]`, in
    /// program order. A rank's transfers lie far apart in the program, but neighbouring ranks' often sit side by
    /// side (a ring's rank r sends what rank r + 1 receives), so the lists are read in turns, position by
    /// position: one miss then serves several ranks, where gathering rank by rank missed on every transfer.
    pub(super) fn gather(&self, program: &Program, ranks: Range<u32>, into: &mut [Vec<(u32, Transfer)>]) {
        for (rank, out) in ranks.clone().zip(into.iter_mut()) {
            out.clear();
            out.reserve(self.parts.iter().map(|p| p.of(rank).len()).sum());
        }
        for part in &self.parts {
            let lists: Vec<&[u32]> = ranks.clone().map(|rank| part.of(rank)).collect();
            let longest = lists.iter().map(|l| l.len()).max().unwrap_or(0);
            for k in 0..longest {
                for (list, out) in lists.iter().zip(into.iter_mut()) {
                    if let Some(&t) = list.get(k) {
                        out.push((t, program.transfers[t as usize]));
                    }
                }
            }
        }
    }
}
