//! The memory a run needs, checked against what this machine has before any rank starts: a run that cannot fit is
//! refused with what it needs and what to change, instead of being killed by the OOM killer or aborting in an
//! allocation.

use super::sweep::size_factor;
use super::Job;
use collc_runtime::{check, CallShape};

/// What one run needs, in bytes.
struct Needs {
    /// User buffers per rank at the largest size (send, receive, and a copy of the output to check it against).
    buffers: usize,
    connections: usize,
    fifos: usize,
    total: usize,
}

fn needs(job: &Job, local_ranks: u32) -> Needs {
    let bytes = job.sizes.iter().copied().max().unwrap_or(0);
    let dtype = job.dtypes.iter().copied().min_by_key(|d| d.size_bytes()).expect("at least one data type");
    let count = bytes / (dtype.size_bytes() * size_factor(job.collective, job.n_ranks));
    let shape = CallShape {
        collective: job.collective,
        count,
        dtype,
        op: collc_kernels::ReduceOp::Sum,
        root: job.root,
        peer: job.peer,
    };
    let per_rank = |rank: u32| {
        let w = check::windows(&shape, job.n_ranks, rank, false);
        w.send + w.recv + if job.check { w.recv } else { 0 }
    };
    // Rooted collectives hold more on the root; the largest rank is the bound for all.
    let buffers = [0, job.root].into_iter().map(per_rank).max().unwrap_or(0);
    let connections = connections(job);
    let fifos = connections.saturating_mul(fifo_bytes_per_connection(job, connections));
    let total = buffers.saturating_mul(local_ranks as usize).saturating_add(if local_ranks == 1 { 0 } else { fifos });
    Needs { buffers, connections, fifos, total }
}

/// A connection's FIFO memory over the sweep: at each size its slots hold its largest message (at most the call's
/// buffer, at most the slot cap: the larger one of a call that goes by reference whole, as a bound), and sizes
/// whose slots round to the same power of two share one FIFO.
fn fifo_bytes_per_connection(job: &Job, connections: usize) -> usize {
    let cap = job.options.slot_cap(job.transport, connections, true);
    let mut slots: Vec<usize> = job.sizes.iter().map(|&bytes| bytes.max(1).next_power_of_two().min(cap)).collect();
    slots.sort_unstable();
    slots.dedup();
    slots.into_iter().map(collc_runtime::fifo_bytes).sum()
}

/// The most connections any of the run's algorithms uses.
fn connections(job: &Job) -> usize {
    let choices = job.algorithms.choices.iter().chain(&job.algorithms.compared);
    choices.map(|choice| choice.connections).max().unwrap_or(0)
}

/// This machine's available memory (`MemAvailable`), if it says.
fn available() -> Option<usize> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `1.5 GiB`, `12.0 MiB`, `512 B`.
fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// Refuses a run that needs more than 90% of the available memory, saying what it needs and what to change.
pub fn check(job: &Job, local_ranks: u32) -> Result<(), String> {
    let Some(available) = available() else { return Ok(()) };
    let needs = needs(job, local_ranks);
    if needs.total <= available / 10 * 9 {
        return Ok(());
    }
    let fifos = match local_ranks {
        1 => String::new(),
        _ => format!(" and {} of FIFOs on {} connections", human(needs.fifos), needs.connections),
    };
    Err(format!(
        "this run needs about {} ({} of buffers per rank at the largest size x {local_ranks} ranks{fifos}), but this \
         machine has {} available; choose fewer ranks, a smaller -e, or -c 0 (no check copy); COLLC_SLOT_BYTES (64 bytes to \
         1 GiB) caps the FIFO slot size, and so the FIFOs",
        human(needs.total),
        human(needs.buffers),
        human(available)
    ))
}
