//! `collc fr analyze DIR`: reads the flight-recorder dump of every rank (`collc-fr-rank<R>.json`, written on a
//! timeout, an abort or SIGUSR1 into `COLLC_DUMP_DIR`) and says which ranks are missing or behind, where each rank
//! in a call stands (instruction, `.coll` line, what it waits for), and on whom the others wait; with `--trace`,
//! also the hang as a Chrome / Perfetto trace (`trace.rs`).

mod trace;

use clap::{Args, Subcommand};
use collc_runtime::recorder::Dump;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args)]
pub struct FrArgs {
    #[command(subcommand)]
    command: FrCommand,
}

#[derive(Subcommand)]
enum FrCommand {
    /// Read every rank's dump in DIR and say who is missing or behind and on whom the others wait.
    Analyze {
        /// The directory COLLC_DUMP_DIR named.
        dir: PathBuf,
        /// Also write the hang as a Chrome / Perfetto trace (open it in ui.perfetto.dev): per rank the instructions
        /// done in its current tile, an open span where each channel waits, arrows for the messages both ends show. The
        /// dumps carry no clock: times are laid out in order (the trace's metadata says so).
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
    },
}

pub fn run(args: FrArgs) -> u8 {
    let FrCommand::Analyze { dir, trace } = args.command;
    // The trace's file is made first: a path that cannot be written is a usage error, before any analysis.
    if let Some(Err(e)) = trace.as_ref().map(std::fs::File::create) {
        eprintln!(
            "error: --trace {}: cannot write it: {e}",
            trace.as_ref().map_or("".into(), |p| p.display().to_string())
        );
        return 2;
    }
    let dumps = match read(&dir) {
        Ok(dumps) => dumps,
        Err(message) => {
            eprintln!("error: {message}");
            return 1;
        }
    };
    print!("{}", analyze(&dumps));
    if let Some(path) = trace {
        if let Err(e) = std::fs::write(&path, trace::write(&dumps)) {
            eprintln!("error: --trace {}: cannot write it: {e}", path.display());
            return 2;
        }
    }
    0
}

/// The most ranks a dump may claim: sixteen times the compiler's default limit on a job (`Limits::max_ranks`, 65536,
/// which `--max-ranks` raises), so a real job's dump always reads and a damaged one cannot size an allocation.
const MAX_RANKS: u32 = 1 << 20;

/// Every dump in `dir`, by rank: all of one job, each checked.
fn read(dir: &std::path::Path) -> Result<BTreeMap<u32, Dump>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut dumps = BTreeMap::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !(name.starts_with("collc-fr-rank") && name.ends_with(".json")) {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let dump: Dump =
            serde_json::from_str(&text).map_err(|e| format!("{}: not a flight-recorder dump: {e}", path.display()))?;
        // A dump is input like any other: its numbers are checked before anything is sized by them.
        if dump.n_ranks == 0 || dump.n_ranks > MAX_RANKS || dump.rank >= dump.n_ranks {
            return Err(format!(
                "{}: rank {} of {} ranks is not a job collc runs (1 to {MAX_RANKS} ranks): a damaged or foreign dump",
                path.display(),
                dump.rank,
                dump.n_ranks
            ));
        }
        dumps.insert(dump.rank, dump);
    }
    let mut jobs: BTreeMap<(&str, u32), Vec<u32>> = BTreeMap::new();
    for dump in dumps.values() {
        jobs.entry((dump.job.as_str(), dump.n_ranks)).or_default().push(dump.rank);
    }
    if jobs.len() > 1 {
        let each: Vec<String> =
            jobs.iter().map(|((job, n), ranks)| format!("job `{job}` of {n} ranks: ranks {ranks:?}")).collect();
        return Err(format!(
            "{} holds the dumps of {} jobs ({}): give each job a COLLC_DUMP_DIR of its own, or remove the stale dumps",
            dir.display(),
            jobs.len(),
            each.join("; ")
        ));
    }
    if dumps.is_empty() {
        return Err(format!(
            "{}: no collc-fr-rank<R>.json here (set COLLC_DUMP_DIR for the job; dumps come on a timeout, an abort \
             or SIGUSR1)",
            dir.display()
        ));
    }
    Ok(dumps)
}

/// The call a rank is in or last made: (sequence number, whether it is still in it).
fn position(dump: &Dump) -> (u64, bool) {
    match (&dump.current, dump.calls.last()) {
        (Some(current), _) => (current.seq, true),
        (None, Some(last)) => (last.seq, last.state == "running"),
        (None, None) => (0, false),
    }
}

fn analyze(dumps: &BTreeMap<u32, Dump>) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let n_ranks = dumps.values().map(|d| d.n_ranks).max().unwrap_or(0);
    let missing: Vec<u32> = (0..n_ranks).filter(|r| !dumps.contains_key(r)).collect();
    let furthest = dumps.values().map(|d| position(d).0).max().unwrap_or(0);
    let _ = writeln!(out, "# collc fr analyze: {} of {n_ranks} ranks dumped", dumps.len());
    for &rank in &missing {
        let _ = writeln!(out, "rank {rank}: MISSING (no dump: its process is gone, or it never got the signal)");
    }
    // Who each rank in a call waits for.
    let mut waited_on: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (&rank, dump) in dumps {
        let (seq, in_call) = position(dump);
        let behind = if seq < furthest { format!(", BEHIND (others at call #{furthest})") } else { String::new() };
        let host = format!("{} pid {}", dump.host, dump.pid);
        let Some(current) = dump.current.as_ref().filter(|_| in_call) else {
            let last = dump.calls.last().map_or("no call yet".into(), |c| {
                format!("last call #{} {} with {}: {}", c.seq, c.call, c.algorithm, c.state)
            });
            let _ = writeln!(out, "rank {rank} ({host}): not in a collective; {last}{behind} [{}]", dump.reason);
            continue;
        };
        let what = dump.calls.iter().rev().find(|c| c.seq == current.seq).map_or(String::new(), |c| c.call.clone());
        let done = current.instructions.iter().filter(|i| i.state == "done").count();
        let _ = writeln!(
            out,
            "rank {rank} ({host}): in call #{} {what} with {}, tile {} of {}, {done} of {} instructions done{behind} \
             [{}]",
            current.seq,
            current.algorithm,
            current.tile + 1,
            current.tiles,
            current.instructions.len(),
            dump.reason
        );
        for instr in current.instructions.iter().filter(|i| i.state == "waiting") {
            let _ = writeln!(
                out,
                "  waits at instruction #{} {} ({} line {}) for {}",
                instr.index,
                instr.op,
                current.algorithm,
                instr.line,
                instr.waiting_for.as_deref().unwrap_or("?")
            );
            if let Some(peer) = instr.recv_from {
                let waiters = waited_on.entry(peer).or_default();
                if !waiters.contains(&rank) {
                    waiters.push(rank);
                }
            }
        }
    }
    // The rank the wait starts from: waited on, and itself missing, behind, outside the call, or waiting on no one.
    let stuck: Vec<u32> = waited_on
        .keys()
        .copied()
        .filter(|peer| match dumps.get(peer) {
            None => true,
            Some(dump) => {
                let (seq, in_call) = position(dump);
                seq < furthest || !in_call || !waited_on.values().flatten().any(|w| w == peer)
            }
        })
        .collect();
    for peer in &stuck {
        let waiters = &waited_on[peer];
        let why = match dumps.get(peer) {
            None => "missing".to_string(),
            Some(dump) if position(dump).0 < furthest => format!("behind, at call #{}", position(dump).0),
            Some(dump) if !position(dump).1 => "not in the collective".to_string(),
            Some(_) => "in the call, waiting on no one this analysis can see".to_string(),
        };
        let list: Vec<String> = waiters.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "=> ranks {} wait on rank {peer} ({why})", list.join(", "));
    }
    if stuck.is_empty() && !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(u32::to_string).collect();
        let _ = writeln!(out, "=> look at the missing ranks first: {}", list.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use collc_runtime::recorder::{CallRecord, Current, InstrState};

    fn dump(rank: u32, seq: u64, waits_on: Option<u32>) -> Dump {
        let call = CallRecord {
            seq,
            call: "allreduce float sum count 1000 root 0 out-of-place".into(),
            algorithm: "allreduce/ring".into(),
            state: "running".into(),
        };
        let instructions = vec![
            InstrState {
                index: 0,
                op: "Send".into(),
                line: 9,
                channel: 0,
                state: "done".into(),
                waiting_for: None,
                recv_from: None,
                send_to: Some((rank + 1) % 4),
            },
            InstrState {
                index: 1,
                op: "RecvReduceSend".into(),
                line: 11,
                channel: 0,
                state: if waits_on.is_some() { "waiting" } else { "done" }.into(),
                waiting_for: waits_on.map(|p| format!("a message from rank {p} on channel 0")),
                recv_from: waits_on,
                send_to: None,
            },
        ];
        Dump {
            rank,
            n_ranks: 4,
            job: "test".into(),
            host: "h".into(),
            pid: 1,
            reason: "timeout".into(),
            calls: vec![call],
            current: Some(Current { seq, algorithm: "allreduce/ring".into(), tile: 0, tiles: 1, instructions }),
        }
    }

    #[test]
    fn a_missing_rank_is_found_at_the_end_of_the_waits() {
        // Rank 3 is gone; rank 0 waits on it, rank 1 on rank 0, rank 2 on rank 1.
        let dumps: BTreeMap<u32, Dump> =
            [(0, dump(0, 5, Some(3))), (1, dump(1, 5, Some(0))), (2, dump(2, 5, Some(1)))].into_iter().collect();
        let report = analyze(&dumps);
        assert!(report.contains("rank 3: MISSING"), "{report}");
        assert!(report.contains("=> ranks 0 wait on rank 3 (missing)"), "{report}");
        assert!(report.contains("waits at instruction #1 RecvReduceSend (allreduce/ring line 11)"), "{report}");
        assert!(!report.contains("wait on rank 0 ("), "{report}");
    }

    #[test]
    fn a_rank_behind_is_named() {
        let mut behind = dump(2, 4, None);
        behind.current = None;
        behind.calls[0].state = "done".into();
        let dumps: BTreeMap<u32, Dump> =
            [(0, dump(0, 5, Some(2))), (1, dump(1, 5, Some(0))), (2, behind), (3, dump(3, 5, Some(1)))]
                .into_iter()
                .collect();
        let report = analyze(&dumps);
        assert!(report.contains("rank 2 (h pid 1): not in a collective; last call #4"), "{report}");
        assert!(report.contains("BEHIND (others at call #5)"), "{report}");
        assert!(report.contains("=> ranks 0 wait on rank 2 (behind, at call #4)"), "{report}");
    }
}
