//! Pipelining: cuts every chunk into k slices and moves slice j of step s to step s + j, so a chain or a tree
//! forwards one slice while the next arrives (NCCL's pipelining of chunks through its steps). Reductions and copies
//! are elementwise, so each slice computes what its chunk did, in the same order of steps; two transfers that now
//! share a step touch different slices or came from one step. The result is verified like every pass's.

use crate::diag::Error;
use crate::ir::{Loc, Program, Transfer};
use crate::Limits;

/// `program` with every chunk cut into `slices` slices. Every buffer is cut into blocks of C chunks (a scratch
/// buffer's last block may be short); chunk c of a block becomes chunk `block*C*k + j*C + c` for j in 0..k. So a
/// range within a block stays contiguous in each slice, the contract's chunk numbering holds with C*k chunks, and
/// every chunk keeps its position in its block (what lowering requires, as chunk sizes depend on it).
pub fn pipeline(program: &Program, slices: u32, limits: &Limits) -> Result<Program, Error> {
    if slices <= 1 {
        return Ok(program.clone());
    }
    // Slots of every buffer of every rank after the pass, as verification counts them: in, out, scratch (rounded up
    // to whole blocks) and the out-of-place work buffer the size of the larger of in and out.
    let chunks = program.chunks.checked_mul(slices).filter(|&c| {
        let (in_blocks, out_blocks) = program.collective.buffer_chunks(program.n_ranks, 1);
        let (in_c, out_c) = (in_blocks as u64 * c as u64, out_blocks as u64 * c as u64);
        let scratch: u64 = program.scratch.iter().map(|s| s.chunks.div_ceil(program.chunks) as u64 * c as u64).sum();
        let per_rank = in_c + out_c + in_c.max(out_c) + scratch;
        in_c <= u32::MAX as u64 && per_rank.saturating_mul(program.n_ranks as u64) <= limits.max_slots
    });
    let Some(chunks) = chunks else {
        return Err(too_large(program, slices, format!("more than {} chunk slots", limits.max_slots)));
    };
    let mut transfers = Vec::with_capacity(program.transfers.len() * slices as usize);
    for j in 0..slices {
        for t in &program.transfers {
            for (offset, count) in pieces(t, program.chunks) {
                let at = |loc: Loc| Loc { buf: loc.buf, index: sliced(loc.index + offset, program.chunks, j, slices) };
                transfers.push(Transfer { src: at(t.src), dst: at(t.dst), count, step: t.step + j, ..*t });
            }
            if transfers.len() > limits.max_transfers {
                return Err(too_large(program, slices, format!("more than {} transfers", limits.max_transfers)));
            }
        }
    }
    // Stable: within a step, earlier slices first, then program order.
    transfers.sort_by_key(|t| t.step);
    let mut scratch = program.scratch.clone();
    for s in &mut scratch {
        s.chunks = s.chunks.div_ceil(program.chunks) * program.chunks * slices;
    }
    let n_steps = if program.transfers.is_empty() { 0 } else { program.n_steps + slices - 1 };
    Ok(Program {
        name: program.name.clone(),
        collective: program.collective,
        n_ranks: program.n_ranks,
        chunks,
        pipeline: 1,
        root: program.root,
        peer: program.peer,
        params: program.params.clone(),
        scratch,
        max_count: transfers.iter().map(|t| t.count).max().unwrap_or(0),
        transfers,
        n_steps,
        spans: program.spans.clone(),
    })
}

fn too_large(program: &Program, slices: u32, what: String) -> Error {
    Error::new(
        "collc::optimise::pipeline",
        format!("pipelining {} into {slices} slices per chunk needs {what}", program.name),
        "use fewer slices (--pipeline), or raise --max-slots / --max-transfers",
    )
}

/// Where chunk `index` of a buffer cut into blocks of `block` chunks lands in slice `j` of `slices`.
fn sliced(index: u32, block: u32, j: u32, slices: u32) -> u32 {
    (index / block) * block * slices + j * block + index % block
}

/// The transfer's chunk range cut where its blocks end: (offset, count) pieces. Source and destination sit at the
/// same position in their blocks (lowering requires it), so their blocks end together.
fn pieces(t: &Transfer, block: u32) -> impl Iterator<Item = (u32, u32)> {
    let (start, count) = (t.src.index, t.count);
    let mut offset = 0;
    std::iter::from_fn(move || {
        if offset >= count {
            return None;
        }
        let n = (block - (start + offset) % block).min(count - offset);
        let piece = (offset, n);
        offset += n;
        Some(piece)
    })
}
