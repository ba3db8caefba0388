//! `build`: the compiler in one call, as `collc build` uses it: a `.coll` source, a rank count and `BuildOptions`
//! -> a verified schedule, whose `.sched` text (`emit::write_sched`) is what users snapshot.

use crate::diag::{render, Errors};
use crate::{compile, Bindings, Limits, Options, Placement, VerifiedSchedule};

/// What `collc build` takes besides the source and the rank count: the binding (`--root`, `--peer`, `--set`), the
/// placement (`--in-place`), the passes (`--no-fuse`, `--pipeline`) and the limits. `Default` is `collc build`'s.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// Out of place unless `--in-place`.
    pub placement: Placement,
    /// The root of a rooted collective (and the source of sendrecv); `None` is 0.
    pub root: Option<u32>,
    /// The destination of sendrecv; `None` is root + 1.
    pub peer: Option<u32>,
    /// `param`s (and `nodes`/`local`) bound by name, as `--set NAME=VALUE`.
    pub params: Vec<(String, i64)>,
    /// Slices per chunk for the pipelining pass; `None` takes the algorithm's `pipeline` (default 1).
    pub pipeline: Option<u32>,
    /// Fuse receive-forward chains into NCCL's fused instructions (`false`: `--no-fuse`).
    pub fuse: bool,
    pub limits: Limits,
}

impl Default for BuildOptions {
    fn default() -> Self {
        let Options { placement, fuse, pipeline } = Options::default();
        BuildOptions {
            placement,
            root: None,
            peer: None,
            params: Vec::new(),
            pipeline,
            fuse,
            limits: Limits::default(),
        }
    }
}

impl BuildOptions {
    /// Binds a `param` by name, as `--set NAME=VALUE` does.
    pub fn set(mut self, name: &str, value: i64) -> Self {
        self.params.push((name.to_string(), value));
        self
    }

    /// The bindings these options give at `n_ranks`.
    pub fn bindings(&self, n_ranks: u32) -> Bindings {
        Bindings { n_ranks, root: self.root, peer: self.peer, params: self.params.clone() }
    }

    /// The passes and placement these options ask for.
    pub fn options(&self) -> Options {
        Options { placement: self.placement, fuse: self.fuse, pipeline: self.pipeline }
    }
}

/// Compiles and verifies `source` for `n_ranks` ranks: the schedule `collc build` prints. Its `.sched` text,
/// `emit::write_sched(&verified, source)`, is the same bytes on every run and machine (no seed, hash or path in
/// it; a keyed verification's seed decides nothing but the verdict), so it can be snapshotted. On failure every
/// error is returned; `render_all` prints them as `collc` does.
///
/// ```
/// use collc_compiler::{build, emit::write_sched, BuildOptions};
///
/// let source = "
/// algorithm my_ring for allreduce {
///     ranks p where p >= 1
///     chunks p
///     for s in 0..p-1 { step { for r in 0..p { send in[(r - s) % p] from r to (r + 1) % p reduce } } }
///     for s in 0..p-1 { step { for r in 0..p { send in[(r + 1 - s) % p] from r to (r + 1) % p } } }
/// }
/// ";
/// let verified = build(source, 4, &BuildOptions::default()).expect("the ring verifies");
/// let text = write_sched(&verified, source);
/// assert!(text.starts_with("collc-schedule 1\nalgorithm my_ring for allreduce\nplacement out-of-place\n"));
/// assert!(text.contains("ranks 4 chunks 4 root 0 peer 1\n"));
/// assert!(text.contains("rank 3\n  #0 Send src=in[3] send=0 @1\n"));
/// assert_eq!(text, write_sched(&build(source, 4, &BuildOptions::default()).unwrap(), source));
///
/// let broken = source.replace("(r + 1) % p reduce", "(r + 2) % p reduce");
/// let errors = build(&broken, 4, &BuildOptions::default()).unwrap_err();
/// assert!(collc_compiler::build::render_all(&errors, "my_ring.coll", &broken).contains("my_ring.coll"));
/// ```
pub fn build(source: &str, n_ranks: u32, options: &BuildOptions) -> Result<VerifiedSchedule, Errors> {
    compile(source, &options.bindings(n_ranks), options.options(), &options.limits)
}

/// Every error, rendered without colour against `source` (shown as `file_name`) as `collc` prints it to a file or
/// a pipe, one after another: stable text for a test's failure message or a snapshot.
pub fn render_all(errors: &Errors, file_name: &str, source: &str) -> String {
    errors.0.iter().map(|error| render(error, file_name, source, true)).collect::<Vec<_>>().join("\n")
}
