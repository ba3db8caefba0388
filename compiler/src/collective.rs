//! The nine collectives: their buffer shapes, NCCL's in-place layout, and the contract each must compute.

use serde::Serialize;
use std::fmt;
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
    Gather,
    Scatter,
    AllToAll,
    SendRecv,
}

/// Where a rank's output chunk comes from: the sum (or single copy) of these input chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Not part of the contract (e.g. a non-root's output of Reduce).
    Unchecked,
    /// Exactly `x[rank][chunk]`.
    One { rank: u32, chunk: u32 },
    /// The sum over every rank q of `x[q][chunk]`, each exactly once.
    SumOverRanks { chunk: u32 },
}

impl Collective {
    pub const ALL: [Collective; 9] = [
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

    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::ReduceScatter => "reducescatter",
            Collective::AllGather => "allgather",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::AllToAll => "alltoall",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// Chunks in each rank's input and output buffer, for `n_ranks` ranks and `chunks` chunks per block.
    pub fn buffer_chunks(self, n_ranks: u32, chunks: u32) -> (u32, u32) {
        let whole = n_ranks * chunks;
        match self {
            Collective::ReduceScatter | Collective::Scatter => (whole, chunks),
            Collective::AllGather | Collective::Gather => (chunks, whole),
            Collective::AllToAll => (whole, whole),
            _ => (chunks, chunks),
        }
    }

    /// NCCL's in-place layout: where `in` and `out` start inside the one buffer they share.
    /// Allgather's input sits at `rank * chunks` of the output; reducescatter's output at `rank * chunks` of the input.
    pub fn in_place_offsets(self, rank: u32, chunks: u32) -> (u32, u32) {
        match self {
            Collective::AllGather | Collective::Gather => (rank * chunks, 0),
            Collective::ReduceScatter | Collective::Scatter => (0, rank * chunks),
            _ => (0, 0),
        }
    }

    /// Whether rank `rank`'s input is significant (MPI's "significant only at root").
    pub fn input_significant(self, rank: u32, root: u32) -> bool {
        match self {
            Collective::Broadcast | Collective::Scatter | Collective::SendRecv => rank == root,
            _ => true,
        }
    }

    /// Whether a call names a root (the sender, for sendrecv).
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Collective::Broadcast
                | Collective::Reduce
                | Collective::Gather
                | Collective::Scatter
                | Collective::SendRecv
        )
    }

    /// Whether the collective reduces (so `reduce` transfers make sense and sums are expected).
    /// nccl-tests' bus bandwidth factor: what makes busbw comparable to a link's bandwidth whatever the algorithm.
    pub fn bus_factor(self, n_ranks: u32) -> f64 {
        let n = n_ranks as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::ReduceScatter
            | Collective::AllGather
            | Collective::AllToAll
            | Collective::Gather
            | Collective::Scatter => (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
        }
    }

    pub fn reduces(self) -> bool {
        matches!(self, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce)
    }

    /// What output chunk `chunk` of `rank` must hold.
    pub fn expected(self, rank: u32, chunk: u32, chunks: u32, root: u32, peer: u32) -> Expected {
        match self {
            Collective::AllReduce => Expected::SumOverRanks { chunk },
            Collective::ReduceScatter => Expected::SumOverRanks { chunk: rank * chunks + chunk },
            Collective::AllGather => Expected::One { rank: chunk / chunks, chunk: chunk % chunks },
            Collective::Broadcast => Expected::One { rank: root, chunk },
            Collective::Reduce if rank == root => Expected::SumOverRanks { chunk },
            Collective::Gather if rank == root => Expected::One { rank: chunk / chunks, chunk: chunk % chunks },
            Collective::Scatter => Expected::One { rank: root, chunk: rank * chunks + chunk },
            Collective::AllToAll => Expected::One { rank: chunk / chunks, chunk: rank * chunks + chunk % chunks },
            Collective::SendRecv if rank == peer => Expected::One { rank: root, chunk },
            _ => Expected::Unchecked,
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Collective {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase().replace('_', "");
        Collective::ALL.into_iter().find(|c| c.name() == lower).ok_or_else(|| {
            let names: Vec<_> = Collective::ALL.iter().map(|c| c.name()).collect();
            let message = format!("unknown collective `{s}`; expected one of: {}", names.join(", "));
            crate::diag::with_suggestion(message, &lower, &names)
        })
    }
}
