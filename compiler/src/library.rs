//! The algorithm library (`algorithms/**/*.coll`), embedded at build time, and each collective's default algorithm.

use crate::Collective;

include!(concat!(env!("OUT_DIR"), "/library.rs"));

/// The source of library algorithm `name` (`allreduce/ring`).
pub fn get(name: &str) -> Option<&'static str> {
    LIBRARY.iter().find(|(n, _)| *n == name).map(|(_, text)| *text)
}

/// What runs when a call names no algorithm: the ring where there is one, as NCCL's default.
pub fn default_for(collective: Collective) -> &'static str {
    match collective {
        Collective::AllReduce => "allreduce/ring",
        Collective::ReduceScatter => "reducescatter/ring",
        Collective::AllGather => "allgather/ring",
        Collective::Broadcast => "broadcast/binomial",
        Collective::Reduce => "reduce/binomial",
        Collective::Gather => "gather/linear",
        Collective::Scatter => "scatter/linear",
        Collective::AllToAll => "alltoall/pairwise",
        Collective::SendRecv => "sendrecv/direct",
    }
}
