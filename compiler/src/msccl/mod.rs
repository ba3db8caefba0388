//! MSCCL XML in and out, and MSCCL++ execution plans out: `import` (text -> an unverified `Schedule` whose
//! instructions know their `<step>`), `verify` (the full verifier, its errors naming rank, thread block and step),
//! `export` (a `VerifiedSchedule` -> XML of a target dialect, its runtime's limits checked) and `mscclpp::export`.
//! Like the rest of the compiler, no I/O: text in, text or diagnostics out.

mod lower;
mod model;
pub mod mscclpp;
mod positions;
mod read;
mod write;

use crate::diag::Error;
use crate::emit::SchedLines;
use crate::sched::{Placement, Schedule};
use crate::{Errors, Limits, VerifiedSchedule};

pub use lower::Origin;
pub use model::Dialect;
pub use read::MAX_BYTES;
pub use write::{export, Target};

/// A file read and lowered: the schedule, where each instruction stands in the file, and which thread block and
/// step it came from.
#[derive(Clone, Debug)]
pub struct Imported {
    pub schedule: Schedule,
    pub lines: SchedLines,
    /// Per rank, per instruction.
    pub origins: Vec<Vec<Origin>>,
    pub dialect: Dialect,
    pub proto: String,
    /// The message sizes the file was written for (`minBytes`..=`maxBytes`, executor dialect).
    pub bytes: Option<(i64, i64)>,
    /// Every placement the file declares (`schedule` is in the first; `import_as` reads it in another).
    pub placements: Vec<Placement>,
}

/// Whether a text is MSCCL XML (by its name, or its first element after any declaration and comments), which
/// `import` reads.
pub fn is_msccl(name: &str, text: &str) -> bool {
    if name.ends_with(".xml") {
        return true;
    }
    let mut rest = text.trim_start();
    loop {
        let skipped = match rest {
            r if r.starts_with("<?") => r.find("?>").map(|end| &r[end + 2..]),
            r if r.starts_with("<!--") => r.find("-->").map(|end| &r[end + 3..]),
            _ => None,
        };
        match skipped {
            Some(after) => rest = after.trim_start(),
            None => return rest.starts_with("<algo"),
        }
    }
}

/// Reads an MSCCL XML file (either dialect) into an unverified schedule, in the first placement it declares.
pub fn import(text: &str, limits: &Limits) -> Result<Imported, Errors> {
    import_as(text, limits, None)
}

/// `import`, in `placement` (one the file declares) where given.
pub fn import_as(text: &str, limits: &Limits, placement: Option<Placement>) -> Result<Imported, Errors> {
    let algo = read::read(text, limits.max_ranks)?;
    let placements = lower::placements_of(&algo);
    let placement = placement.unwrap_or(placements[0]);
    let (schedule, lines, origins) = lower::lower(&algo, text, placement, limits.max_slots)?;
    Ok(Imported {
        schedule,
        lines,
        origins,
        dialect: algo.dialect(),
        proto: algo.proto.clone(),
        bytes: algo.min_bytes.zip(algo.max_bytes),
        placements,
    })
}

/// Verifies an imported file as `verify_sched` verifies a `.sched` file; each error also names the rank, thread
/// block and step of the instructions it points at.
pub fn verify(imported: Imported, text: &str, limits: &Limits) -> Result<(VerifiedSchedule, SchedLines), Errors> {
    let Imported { schedule, lines, origins, .. } = imported;
    match crate::verify_sched(schedule, text, &lines, limits) {
        Ok(verified) => Ok((verified, lines)),
        Err(Errors(errors)) => Err(Errors(errors.into_iter().map(|e| locate(e, &lines, &origins)).collect())),
    }
}

/// Adds to an error's note the thread block and step of each instruction its labels point at.
fn locate(mut error: Error, lines: &SchedLines, origins: &[Vec<Origin>]) -> Error {
    let mut found = Vec::new();
    for (span, _) in &error.labels {
        for (rank, rank_lines) in lines.ranks.iter().enumerate() {
            if let Some(i) = rank_lines.iter().position(|l| l.start == span.start && l.end == span.end) {
                let o = origins[rank][i];
                let peer = |p: Option<u32>| p.map_or("-1".to_string(), |p| p.to_string());
                found.push(format!(
                    "rank {rank} (<gpu id=\"{rank}\">), thread block {} (send {}, recv {}, channel {}), step {} \
                     (instruction #{i})",
                    o.tb,
                    peer(o.send),
                    peer(o.recv),
                    o.channel,
                    o.step
                ));
                break;
            }
        }
    }
    if !found.is_empty() {
        let at = format!("at {}", found.join("; "));
        error.note = Some(match error.note.take() {
            Some(note) => format!("{at}\n{note}"),
            None => at,
        });
    }
    error
}

#[cfg(test)]
mod tests {
    #[test]
    fn msccl_files_are_told_by_name_or_first_element() {
        assert!(super::is_msccl("a.xml", ""));
        assert!(super::is_msccl("a", "<?xml version=\"1.0\"?>\n<!-- (c) -->\n<algo name=\"x\">"));
        assert!(!super::is_msccl("a.sched", "collc-schedule 1\n"));
        assert!(!super::is_msccl("a.coll", "## <algo> in a comment\nalgorithm ring for allreduce"));
        assert!(!super::is_msccl("a", "<!-- never closed <algo"));
    }
}
