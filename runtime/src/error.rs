//! Every way a run can fail. Faults that involve a peer name it, and the instruction and `.coll` line where the
//! rank was when it happened.

use collc_kernels::KernelError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("rank {rank}: buffer `{buffer}` has {got} bytes, the call needs {needed}")]
    BufferSize { rank: u32, buffer: String, got: usize, needed: usize },
    #[error("expected buffers for {expected} ranks, got {got}")]
    RankCount { expected: u32, got: usize },
    #[error("rank {rank} instruction #{index}: {source}")]
    Kernel { rank: u32, index: usize, source: KernelError },
    #[error("rank {rank}: {source}; pass a factor the call's data type holds")]
    Factor { rank: u32, source: collc_kernels::ScalarError },
    /// A user's operator that does not type on the call's data type, or that the algorithm would reduce in another
    /// order than the one it computes (`message` says which, with a counterexample and what to run instead).
    #[error("rank {rank}: {message}")]
    Operator { rank: u32, message: String },
    #[error("count {count} x {elem} bytes overflows the address space")]
    CountOverflow { count: usize, elem: usize },
    #[error("invalid communicator: {0}")]
    Config(String),
    #[error("shared segment {name}: {reason}")]
    Segment { name: String, reason: String },
    #[error(
        "rank {rank}: {what} at {at}: waited {seconds:.1} s for {waiting_for} (the timeout, which --timeout or \
         COLLC_TIMEOUT sets)"
    )]
    /// `waits_on`: the rank this one waited for, where one rank is the one (a message from it, room towards it).
    Timeout { rank: u32, what: String, at: String, seconds: f64, waiting_for: String, waits_on: Option<u32> },
    #[error("rank {rank}: {what} at {at}: rank {peer} {how}")]
    PeerFailed { rank: u32, what: String, at: String, peer: u32, how: String },
    /// Two ranks in one call with different fingerprints: another shape, or another schedule (`ours` and `theirs`
    /// name the call, where its schedule came from when known, and the fingerprint).
    #[error("rank {rank}: mismatched calls: this rank called {ours}; rank {peer} called {theirs}")]
    Mismatch { rank: u32, peer: u32, ours: String, theirs: String },
    /// A schedule proved deadlock-free with more message slots per connection than the transport's links have.
    #[error(
        "{name} was proved deadlock-free with {proved} message slots per connection; the {transport} transport's \
         links have {slots} (a send could block where the proof counted on room): verify it with --channel-slots \
         {slots} or fewer (`Limits {{ channel_slots: {slots}, .. }}`)"
    )]
    Slots { name: String, proved: u32, transport: &'static str, slots: u32 },
    #[error("a lock was poisoned by a panicking rank thread")]
    Poisoned,
    #[error("{0}")]
    Compile(String),
}
