//! The cost model (Hockney alpha-beta plus gamma for reductions, per link class) and algorithm selection.
//! `topology` reads machine descriptions, `model` turns a verified program into a per-step profile that predicts
//! the time of any message size, `select` picks the predicted-fastest algorithm as NCCL's tuner does.

mod cores;
mod fields;
mod model;
mod rounds;
mod select;
mod topology;

pub use model::Profile;
pub use select::{
    bindings_on, fastest, field, profile, winning_ranges, AlgoFilter, Candidate, Costed, Field, FieldError,
};
pub use topology::{defaults, Cached, Link, LinkClass, Links, Switch, Topology, TopologyError};

use crate::diag::{Error, Errors};
use crate::{compile_program, ir, pipelined, Limits, Options};

/// The cost profile of `program` on `topo`, after the pipelining `options` ask for. Only a program whose schedule
/// verifies is costed: the model describes what would run.
pub fn analyse(
    program: &ir::Program,
    source: &str,
    options: Options,
    limits: &Limits,
    topo: &Topology,
) -> Result<Profile, Errors> {
    analyse_keeping(program, source, options, limits, topo).map(|(profile, _)| profile)
}

/// `analyse`, keeping the verified schedule it costed: the one `compile` makes for the same program and options,
/// which a caller that runs the candidate it chose need not build again.
pub fn analyse_keeping(
    program: &ir::Program,
    source: &str,
    options: Options,
    limits: &Limits,
    topo: &Topology,
) -> Result<(Profile, crate::VerifiedSchedule), Errors> {
    topo.check_ranks(program.n_ranks).map_err(|e| {
        Error::new("collc::cost::topology", e.to_string(), "describe as many ranks as --ranks in the topology file")
    })?;
    let program = pipelined(program, options, limits)?;
    let verified = compile_program(&program, source, Options { pipeline: Some(1), ..options }, limits)?;
    Ok((model::profile(&program, &verified, topo, limits.channel_slots), verified))
}

/// The cost profile of a verified schedule that comes without its program (a `.sched` file) on `topo`: its
/// transfers in the rounds its dataflow allows (`rounds`) stand for the program's steps.
pub fn analyse_schedule(sched: &crate::VerifiedSchedule, limits: &Limits, topo: &Topology) -> Result<Profile, Errors> {
    topo.check_ranks(sched.n_ranks).map_err(|e| {
        Error::new(
            "collc::cost::topology",
            e.to_string(),
            "describe as many ranks as the schedule has in the topology file",
        )
    })?;
    let program = rounds::program_of(sched);
    Ok(model::profile(&program, sched, topo, limits.channel_slots))
}
