//! collc-compiler: lowering, scheduling, optimisation and verification of collective algorithms.
//!
//! `compile` chains the stages: parse -> lower -> schedule -> optimise -> verify. Each stage is one public
//! function. Architecture invariant: this crate does no I/O (but for drawing a verification seed from the OS's
//! random source) and starts no threads; only `verify` makes a
//! `VerifiedSchedule`, and emitters take nothing else.

pub mod build;
pub mod collective;
pub mod cost;
pub mod diag;
pub mod emit;
pub mod fxhash;
pub mod ir;
pub mod library;
pub mod lower;
pub mod msccl;
pub mod operator;
pub mod optimise;
pub mod replicas;
pub mod sched;

pub mod verify;

pub use build::{build, BuildOptions};
pub use collective::Collective;
pub use diag::{Error, Errors};
pub use lower::{lower, Bindings};
pub use sched::{schedule, Placement, Schedule};
pub use verify::{verify, verify_sched, Seed, Verdict, Verification, VerifiedSchedule};

/// Bounds on every stage, so that no input can take unbounded time or memory. All are configurable from the CLI.
#[derive(Clone, Debug)]
pub struct Limits {
    pub syntax: collc_grammar::Limits,
    pub max_ranks: u32,
    pub max_eval_steps: u64,
    pub max_call_depth: u32,
    pub max_transfers: usize,
    /// Chunk slots summed over all buffers of all ranks.
    pub max_slots: u64,
    pub max_channels: u32,
    /// Errors reported before a stage stops looking for more.
    pub max_errors: usize,
    /// Messages a connection holds before a send blocks, in the deadlock check (NCCL's NCCL_STEPS is 8).
    pub channel_slots: u32,
    /// How the postcondition compares multisets: exactly, or keyed (by default exactly for small schedules and
    /// keyed above, with a seed drawn from the OS when the limits are made).
    pub verification: verify::Verification,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            syntax: collc_grammar::Limits::default(),
            max_ranks: 1 << 16,
            max_eval_steps: 1_000_000_000,
            max_call_depth: 256,
            max_transfers: 64 << 20,
            max_slots: 1 << 26,
            max_channels: 32,
            max_errors: 20,
            channel_slots: CHANNEL_SLOTS,
            verification: verify::Verification::default(),
        }
    }
}

/// Messages a connection holds before a send blocks: NCCL's NCCL_STEPS, the deadlock check's default and the number
/// of slots every runtime link has (`VerifiedSchedule::channel_slots` records the count a schedule was proved with).
pub const CHANNEL_SLOTS: u32 = 8;

/// What to build: which placement, with which optimisations.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub placement: Placement,
    /// Fuse Recv+Reduce+Send chains into NCCL's fused instructions.
    pub fuse: bool,
    /// Slices per chunk for the pipelining pass; `None` takes the algorithm's `pipeline` declaration (default 1).
    pub pipeline: Option<u32>,
}

impl Default for Options {
    fn default() -> Self {
        Options { placement: Placement::OutOfPlace, fuse: true, pipeline: None }
    }
}

impl Options {
    pub fn placed(placement: Placement) -> Self {
        Options { placement, ..Options::default() }
    }

    /// The slices per chunk `program` is pipelined in under these options (1: not pipelined).
    pub fn slices(&self, program: &ir::Program) -> u32 {
        self.pipeline.unwrap_or(program.pipeline)
    }
}

/// Parses, lowers, schedules, optimises and verifies one algorithm for one binding.
pub fn compile(
    source: &str,
    bindings: &Bindings,
    options: Options,
    limits: &Limits,
) -> Result<VerifiedSchedule, Errors> {
    let file = collc_grammar::parse(source, &limits.syntax).map_err(Error::from)?;
    let program = lower(&file, bindings, limits)?;
    compile_program(&program, source, options, limits)
}

/// `program` after the pipelining pass `options` ask for (or the algorithm declares).
pub fn pipelined<'p>(
    program: &'p ir::Program,
    options: Options,
    limits: &Limits,
) -> Result<std::borrow::Cow<'p, ir::Program>, Errors> {
    match options.slices(program) {
        0 | 1 => Ok(std::borrow::Cow::Borrowed(program)),
        slices => Ok(std::borrow::Cow::Owned(optimise::pipeline(program, slices, limits)?)),
    }
}

/// Pipelines, schedules, optimises and verifies one lowered program.
///
/// A fused instruction receives and forwards in one go, so it needs room on its outgoing connection before it may
/// receive; that can deadlock a schedule whose unfused form cannot (many chunks in flight per connection). An
/// optimisation must not turn a correct program into a rejected one: whenever the fused schedule fails to verify,
/// the unfused schedule is verified and returned instead, and its errors, if it has any, are the ones reported.
/// (The library's tests check that fusion itself verifies, so this fallback does not hide a fusion bug there.)
pub fn compile_program(
    program: &ir::Program,
    source: &str,
    options: Options,
    limits: &Limits,
) -> Result<VerifiedSchedule, Errors> {
    let program = &*pipelined(program, options, limits)?;
    if !options.fuse {
        return verify(schedule(program, options.placement), source, limits);
    }
    compile_fused(program, options.placement, source, limits)
}

/// The fused schedule of an already pipelined program, verified (or the unfused one's outcome).
fn compile_fused(
    program: &ir::Program,
    placement: Placement,
    source: &str,
    limits: &Limits,
) -> Result<VerifiedSchedule, Errors> {
    let fused = sched::schedule_with(program, placement, optimise::fuse_new_rank);
    verify_or_unfused(fused, source, limits, || verify(schedule(program, placement), source, limits))
}

/// The verified `fused` schedule; if it fails to verify, the outcome `unfused` gives (the unfused schedule's).
fn verify_or_unfused(
    fused: Schedule,
    source: &str,
    limits: &Limits,
    unfused: impl FnOnce() -> Result<VerifiedSchedule, Errors>,
) -> Result<VerifiedSchedule, Errors> {
    match verify(fused, source, limits) {
        Err(_) => unfused(),
        outcome => outcome,
    }
}

/// Runs two pieces of work and returns both results: in turn, or at once where the caller has threads to spare.
/// The compiler starts no threads itself; `compile_placements` takes one of these.
pub trait Join {
    fn join<A: Send, B: Send>(&self, a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B);
}

/// `Join` that runs the two pieces one after the other.
pub struct InTurn;

impl Join for InTurn {
    fn join<A: Send, B: Send>(&self, a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
        (a(), b())
    }
}

/// `compile_program` for two placements of one program, the same schedules and outcomes, with the work split in
/// two halves that `join` may run at once: first the ranks (the lower half and the upper half of the ranks, each
/// rank's transfers gathered once for both placements), then the verification of each placement. `options` must
/// differ in placement only, and neither placement may need the pass that replays the program to find cuts
/// (`sched::Layout::needs_cut_pass`); otherwise each placement is compiled on its own, the two in one `join`.
///
/// The program is dropped once the ranks are built, before the verifiers make their tables (at p = 4096 its
/// transfers are 1.3 GB and the tables 1.5 GB; an allocator that keeps freed memory can hand its pages on). Should a
/// fused schedule fail to verify, `relower` makes the program again for the unfused schedule (`compile_program`).
pub fn compile_placements(
    program: ir::Program,
    relower: &(impl Fn() -> Result<ir::Program, Errors> + Sync),
    source: &str,
    options: [Options; 2],
    limits: &Limits,
    join: &impl Join,
) -> [Result<VerifiedSchedule, Errors>; 2] {
    let [first, second] = options;
    let alike = first.fuse && second.fuse && first.pipeline == second.pipeline && first.placement != second.placement;
    if !alike {
        let program = &program;
        let (a, b) = join.join(
            || compile_program(program, source, first, limits),
            || compile_program(program, source, second, limits),
        );
        return [a, b];
    }
    let sliced = pipelined(&program, first, limits).map(|p| match p {
        std::borrow::Cow::Owned(sliced) => Some(sliced),
        std::borrow::Cow::Borrowed(_) => None,
    });
    let program = match sliced {
        Ok(sliced) => sliced.unwrap_or(program),
        Err(errors) => return [Err(errors.clone()), Err(errors)],
    };
    // A placement whose layout replays the whole program to find cuts would make the other wait: then each
    // placement is built on its own, the replay beside the other's ranks.
    if [first, second].iter().any(|o| sched::Layout::needs_cut_pass(&program, o.placement)) {
        let program = &program;
        let (a, b) = join.join(
            || compile_fused(program, first.placement, source, limits),
            || compile_fused(program, second.placement, source, limits),
        );
        return [a, b];
    }
    let [a, b] = schedule_placements(&program, [first.placement, second.placement], join);
    drop(program);
    let unfused = |options: Options| {
        relower().and_then(|program| compile_program(&program, source, Options { fuse: false, ..options }, limits))
    };
    let (a, b) = join.join(
        || verify_or_unfused(a, source, limits, || unfused(first)),
        || verify_or_unfused(b, source, limits, || unfused(second)),
    );
    [a, b]
}

/// The fused schedules of `program` for two placements, each rank's transfers gathered once for both, the ranks
/// built in two halves that `join` may run at once.
fn schedule_placements(program: &ir::Program, placements: [Placement; 2], join: &impl Join) -> [Schedule; 2] {
    let layouts = placements.map(|placement| sched::Layout::new(program, placement));
    let half = program.transfers.len() / 2;
    let (first_half, second_half) = join.join(
        || sched::IndexPart::new(program, 0..half),
        || sched::IndexPart::new(program, half..program.transfers.len()),
    );
    let index = sched::TransferIndex::from_parts(vec![first_half, second_half]);
    let middle = program.n_ranks / 2;
    let (low, high) = join.join(
        || sched::schedule_ranks(program, &layouts, &index, 0..middle, optimise::fuse_new_rank),
        || sched::schedule_ranks(program, &layouts, &index, middle..program.n_ranks, optimise::fuse_new_rank),
    );
    // Not needed past scheduling: its pages go back before the verifiers allocate theirs.
    drop(index);
    let mut schedules = layouts.iter().zip(low.into_iter().zip(high)).map(|(layout, (mut ranks, upper))| {
        ranks.extend(upper);
        layout.assemble(program, ranks)
    });
    [schedules.next().expect("two layouts"), schedules.next().expect("two layouts")]
}
