//! Joining a job started by someone else: the rank, world size and a job id read from the environment of
//! collc's own launcher, torchrun, Open MPI, MPICH/Hydra or Slurm (REFERENCE.md section 5).

/// Where this process sits in a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub rank: u32,
    pub world_size: u32,
    /// Ranks on this host, when the launcher says.
    pub local_world_size: Option<u32>,
    /// Identifies the job among others on the host: every rank of one job computes the same id.
    pub job: String,
    pub launcher: &'static str,
    /// The tcp rendezvous (`host:port`) and the job's token, where the caller shares them itself (torch.distributed's
    /// store); `None`: the environment's (`TcpJob::from_env`).
    pub rendezvous: Option<(String, String)>,
}

impl Launch {
    /// Whether every rank of the job is on this host (as far as the launcher says: one that does not is taken at
    /// its word that they are).
    pub fn all_local(&self) -> bool {
        self.local_world_size.is_none_or(|local| local == self.world_size)
    }
}

/// One launcher's variables: rank, world size, local world size, and those that identify the job.
struct Convention {
    launcher: &'static str,
    rank: &'static str,
    size: &'static str,
    local_size: Option<&'static str>,
    job: &'static [&'static str],
}

const CONVENTIONS: &[Convention] = &[
    Convention {
        launcher: "collc",
        rank: "COLLC_RANK",
        size: "COLLC_WORLD_SIZE",
        local_size: None,
        job: &["COLLC_JOB"],
    },
    Convention {
        launcher: "torchrun",
        rank: "RANK",
        size: "WORLD_SIZE",
        local_size: Some("LOCAL_WORLD_SIZE"),
        // Not MASTER_ADDR: ranks may spell rank 0's host differently (a name on one, its address on another).
        job: &["TORCHELASTIC_RUN_ID", "MASTER_PORT"],
    },
    Convention {
        launcher: "mpirun (Open MPI)",
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
        job: &["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri"],
    },
    Convention {
        launcher: "mpirun (MPICH)",
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_size: None,
        job: &["PMI_KVSNAME", "PMI_PORT"],
    },
    Convention {
        launcher: "slurm",
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_size: Some("SLURM_NTASKS_PER_NODE"),
        job: &["SLURM_JOB_ID", "SLURM_STEP_ID"],
    },
];

/// Reads the first launcher whose rank and size variables are set. `Ok(None)`: not started by a launcher.
pub fn from_env() -> Result<Option<Launch>, String> {
    from_vars(|name| std::env::var(name).ok())
}

pub(crate) fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>, String> {
    for c in CONVENTIONS {
        let (Some(rank), Some(size)) = (var(c.rank), var(c.size)) else { continue };
        let number = |name: &str, text: &str| {
            text.trim().parse::<u32>().map_err(|_| format!("{name}=`{text}` (set by {}) is not a number", c.launcher))
        };
        let rank = number(c.rank, &rank)?;
        let world_size = number(c.size, &size)?;
        if world_size == 0 || rank >= world_size {
            return Err(format!("{}={rank} is outside {}={world_size} (set by {})", c.rank, c.size, c.launcher));
        }
        // Slurm writes `2(x3)` for three nodes of two tasks: the count before the parenthesis is this host's.
        let local_world_size =
            c.local_size.and_then(&var).and_then(|text| text.split('(').next().and_then(|t| t.trim().parse().ok()));
        let parts: Vec<String> = c.job.iter().filter_map(|name| var(name)).collect();
        if parts.is_empty() {
            return Err(format!(
                "{} set {} and {} but none of {}: cannot tell this job from others on the host",
                c.launcher,
                c.rank,
                c.size,
                c.job.join(", ")
            ));
        }
        let job = if c.launcher == "collc" { parts[0].clone() } else { format!("{:016x}", hash(&parts.join("|"))) };
        return Ok(Some(Launch { rank, world_size, local_world_size, job, launcher: c.launcher, rendezvous: None }));
    }
    Ok(None)
}

/// Places a rank process of `n_ranks` on this host onto the `rank`-th CPU it may use (modulo their number). Rank
/// processes forked together start on their parent's CPU, and the scheduler can take milliseconds to spread them,
/// during which two spinning ranks share one core.
/// - With a CPU per rank, the process only starts there and may then go anywhere: binding for good (as mpirun does)
///   measured slower on a VM.
/// - With more ranks than CPUs, it stays there (rank r on CPU r mod CPUs, as the cost model's `cores_per_node`
///   assumes), rather than leaving to the scheduler which ranks share a core. Measured with 4 ranks on 2 CPUs in
///   alternating launches: from 32 KiB up, bound ranks were as fast or faster and varied less; below, it depended
///   on the algorithm.
pub fn spread_over_cores(rank: u32, n_ranks: u32) {
    let Some(allowed) = Affinity::current() else { return };
    let cpus = allowed.cpus();
    if cpus.is_empty() || !Affinity::only(cpus[rank as usize % cpus.len()]).apply() {
        return;
    }
    if n_ranks as usize <= cpus.len() {
        // The move happens at the next scheduling point: yield so it has happened before the mask widens.
        // SAFETY: sched_yield takes no arguments and only gives up the CPU.
        unsafe { libc::sched_yield() };
        allowed.apply();
    }
}

/// Runs `measure` with the calling thread (and the threads it starts, which inherit the mask) held on the first
/// CPU it may use, then restores its CPUs: ranks that share a core, as when a node runs more ranks than it has
/// cores (what `collc cost --calibrate` measures for `shared_core_alpha_us`).
pub fn on_one_cpu<T>(measure: impl FnOnce() -> T) -> T {
    let Some(allowed) = Affinity::current() else { return measure() };
    let held = allowed.cpus().first().is_some_and(|&cpu| Affinity::only(cpu).apply());
    let result = measure();
    if held {
        allowed.apply();
    }
    result
}

/// A thread's CPU affinity mask.
struct Affinity(libc::cpu_set_t);

impl Affinity {
    const SIZE: usize = std::mem::size_of::<libc::cpu_set_t>();

    /// The calling thread's mask, if it can be read.
    fn current() -> Option<Affinity> {
        // SAFETY: cpu_set_t is plain data; the call writes only the set passed in.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            (libc::sched_getaffinity(0, Self::SIZE, &mut set) == 0).then_some(Affinity(set))
        }
    }

    /// The mask of one CPU.
    fn only(cpu: usize) -> Affinity {
        // SAFETY: cpu_set_t is plain data; CPU_SET writes one bit of it (cpu < CPU_SETSIZE, from `cpus`).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            Affinity(set)
        }
    }

    fn cpus(&self) -> Vec<usize> {
        // SAFETY: CPU_ISSET reads one bit of the set.
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &self.0) }).collect()
    }

    /// Sets the calling thread's mask to this one; whether it took.
    fn apply(&self) -> bool {
        // SAFETY: the call reads only the set passed in.
        unsafe { libc::sched_setaffinity(0, Self::SIZE, &self.0) == 0 }
    }
}

fn hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::from_vars;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn torchrun_variables_make_one_job_id_for_every_rank() {
        let vars = |rank: &'static str| {
            env(&[
                ("RANK", rank),
                ("WORLD_SIZE", "4"),
                ("LOCAL_WORLD_SIZE", "4"),
                ("MASTER_ADDR", "10.0.0.1"),
                ("MASTER_PORT", "29500"),
            ])
        };
        let a = from_vars(vars("0")).unwrap().unwrap();
        let b = from_vars(vars("3")).unwrap().unwrap();
        assert_eq!((a.rank, b.rank, a.world_size, a.local_world_size), (0, 3, 4, Some(4)));
        assert_eq!(a.job, b.job);
        // Rank 0's host by name on one rank and by address on another is still one job.
        let named = |rank: &'static str| {
            env(&[("RANK", rank), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "master0"), ("MASTER_PORT", "29500")])
        };
        assert_eq!(from_vars(named("1")).unwrap().unwrap().job, a.job);
        assert_eq!(a.launcher, "torchrun");
    }

    #[test]
    fn slurm_and_open_mpi_are_read_and_bad_values_are_named() {
        let slurm = from_vars(env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2"), ("SLURM_JOB_ID", "77")])).unwrap();
        assert_eq!(slurm.unwrap().launcher, "slurm");
        let ompi =
            from_vars(env(&[("OMPI_COMM_WORLD_RANK", "5"), ("OMPI_COMM_WORLD_SIZE", "4"), ("PMIX_NAMESPACE", "x")]));
        assert!(ompi.unwrap_err().contains("OMPI_COMM_WORLD_RANK=5 is outside"));
        let no_job = from_vars(env(&[("RANK", "0"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(no_job.contains("cannot tell this job"), "{no_job}");
        assert_eq!(from_vars(env(&[])).unwrap(), None);
    }
}
