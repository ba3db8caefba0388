//! `collc run --trace FILE`: which calls each rank records, and where its part goes. Rank threads hand their parts
//! to this process, which writes FILE once they are done; a rank process writes `FILE.rankN.json`, and the `collc
//! run` that spawned the ranks merges those parts into FILE once they have exited (removing them). Under another
//! launcher (torchrun, mpirun, Slurm) the parts stay for the user, as nothing outlives the ranks to merge them.

use collc_runtime::trace::{chrome, RankTrace};
use collc_runtime::Communicator;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What `--trace` and `--trace-iters` asked for.
#[derive(Clone, Debug)]
pub struct TraceJob {
    pub path: PathBuf,
    /// The last this many timed calls of each row and placement are recorded.
    pub iters: u32,
}

impl TraceJob {
    /// Whether timed call `k` (from 0) of `iters` is recorded.
    pub fn records(&self, k: u32, iters: u32) -> bool {
        k + self.iters.min(iters) >= iters
    }

    /// What the trace's metadata says was recorded.
    pub fn describe(&self) -> String {
        format!(
            "the last {} timed call(s) of each row (size, data type, op) and placement; warm-up and data-check calls \
             are not recorded",
            self.iters
        )
    }
}

/// Where rank `rank`'s part of the trace goes when the ranks are processes: `FILE.rankN.json`.
pub fn part_path(path: &Path, rank: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".rank{rank}.json"));
    PathBuf::from(name)
}

/// Checks, before any rank starts, that `path` can be written: a file there is left as it is, one this check made
/// is removed again.
pub fn check_writable(path: &Path) -> Result<(), String> {
    if path.is_dir() {
        return Err(format!("--trace {}: is a directory; give a file name (ring.json)", path.display()));
    }
    let existed = path.exists();
    match std::fs::OpenOptions::new().append(true).create(true).open(path) {
        Ok(_) if !existed => {
            let _ = std::fs::remove_file(path);
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(e) => Err(format!("--trace {}: cannot write it: {e}", path.display())),
    }
}

/// Rank threads' parts, written together once every rank is done.
static PARTS: Mutex<Vec<RankTrace>> = Mutex::new(Vec::new());

/// After rank `comm`'s sweep (well or not): its part, to this process's collection (`threads`) or to its file.
pub fn hand_over(comm: &Communicator, job: &TraceJob, threads: bool) -> Result<(), String> {
    let Some(part) = comm.take_trace() else { return Ok(()) };
    if threads {
        PARTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(part);
        return Ok(());
    }
    let path = part_path(&job.path, part.rank);
    let text = serde_json::to_string(&part).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("--trace: cannot write {}: {e}", path.display()))
}

/// Writes the rank threads' parts into the trace file.
pub fn write_threads(job: &TraceJob) -> Result<(), String> {
    let mut parts = std::mem::take(&mut *PARTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    write(job, &mut parts)
}

/// Merges the parts the `n_ranks` rank processes wrote into the trace file and removes them; a rank without a part
/// (it died before writing one) is listed as missing in the trace's metadata.
pub fn merge_processes(job: &TraceJob, n_ranks: u32) -> Result<(), String> {
    let mut parts = Vec::new();
    for rank in 0..n_ranks {
        let path = part_path(&job.path, rank);
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        let _ = std::fs::remove_file(&path);
        let part: RankTrace = serde_json::from_str(&text)
            .map_err(|e| format!("--trace: {} is not a rank's part of the trace: {e}", path.display()))?;
        parts.push(part);
    }
    if parts.is_empty() {
        return Err(format!("--trace {}: no rank wrote its part (every rank failed early)", job.path.display()));
    }
    write(job, &mut parts)
}

fn write(job: &TraceJob, parts: &mut [RankTrace]) -> Result<(), String> {
    parts.sort_by_key(|part| part.rank);
    let text = chrome::write(parts, &job.describe());
    std::fs::write(&job.path, text).map_err(|e| format!("--trace: cannot write {}: {e}", job.path.display()))
}
