//! Ranks of one job that joined over different transports (`JoinMarker`).

/// A file in `/dev/shm` saying which transport this rank joins its job over, while it joins: ranks of one job on
/// one host that chose different transports meet nowhere else (shm ranks wait in `/dev/shm`, tcp ranks at the
/// rendezvous), so a rank whose join fails looks here for ranks joining over another transport, and names them.
pub(crate) struct JoinMarker {
    path: std::path::PathBuf,
    prefix: String,
    rank: u32,
    transport: &'static str,
}

impl JoinMarker {
    /// Marks rank `rank` of `job` as joining over `transport` (where `/dev/shm` is writable; else nothing is marked).
    pub(crate) fn new(job: &str, rank: u32, transport: &'static str) -> JoinMarker {
        let job: String = job.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        // Not named like the job's segments (`collc-JOB-`): a rank that fails removes those.
        let prefix = format!("collc-joining-{job}-");
        let path = std::path::Path::new(super::shm::SHM_DIR).join(format!("{prefix}{rank}"));
        let _ = std::fs::write(&path, format!("{transport}\n{}", std::process::id()));
        JoinMarker { path, prefix, rank, transport }
    }

    /// The ranks of the job joining over another transport than this one, with theirs, in rank order.
    fn others(&self) -> Vec<(u32, String)> {
        let Ok(entries) = std::fs::read_dir(super::shm::SHM_DIR) else { return Vec::new() };
        let mut found: Vec<(u32, String)> = entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let rank: u32 = name.strip_prefix(&self.prefix)?.parse().ok()?;
                let text = std::fs::read_to_string(entry.path()).ok()?;
                let transport = text.lines().next()?.to_string();
                (rank != self.rank && transport != self.transport).then_some((rank, transport))
            })
            .collect();
        found.sort();
        found
    }

    /// Removes the mark once the join is over. A join that failed while ranks of the job were joining over another
    /// transport fails naming them (and keeps its mark a moment, so that they, failing too, find it).
    pub(crate) fn joined<T>(self, joined: Result<T, crate::RuntimeError>) -> Result<T, crate::RuntimeError> {
        let error = match joined {
            Ok(done) => return Ok(done),
            Err(error) => error,
        };
        let others = self.others();
        if others.is_empty() {
            return Err(error);
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
        let named: Vec<String> =
            others.iter().map(|(rank, transport)| format!("rank {rank} over {transport}")).collect();
        Err(crate::RuntimeError::Config(format!(
            "rank {}: the job's ranks on this host join over different transports: {}, this rank over {}; every rank \
             must use one (--transport); here the join failed: {error}",
            self.rank,
            named.join(", "),
            self.transport
        )))
    }
}

impl Drop for JoinMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The process that wrote marker `name` at `path`, if it is one: a rank killed while joining leaves its marker, which
/// `Shm::remove_stale_jobs` removes once that process is gone.
pub(crate) fn marker_pid(path: &std::path::Path, name: &str) -> Option<i32> {
    name.strip_prefix("collc-joining-")?;
    std::fs::read_to_string(path).ok()?.lines().nth(1)?.parse().ok().filter(|&pid: &i32| pid > 0)
}
