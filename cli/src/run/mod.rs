//! `collc run`: runs an algorithm on real data with nccl-tests' flags and table. With `--transport threads` the
//! ranks are threads of this process; with `shm` this process spawns one process per rank (or, started by
//! torchrun, mpirun or Slurm, it is one rank of their job).

mod launch;
mod resources;
mod sweep;
mod table;
mod trace;

use crate::args::{parse_size, size_sweep};
use crate::library;
use clap::{Args, ValueEnum};
use collc_compiler::cost::Topology;
use collc_compiler::emit::SchedLines;
use collc_compiler::{compile, Bindings, Collective, Error, Errors, Limits, Options as CompileOptions};
use collc_compiler::{Placement, VerifiedSchedule};
use collc_kernels::{DataType, ReduceOp, UnknownReduceOp};
use collc_runtime::{Communicator, Options, Transport};
use std::sync::Arc;

/// `--transport`: the runtime's transports, each with its line of help.
fn transport_parser() -> impl clap::builder::TypedValueParser<Value = Transport> {
    use clap::builder::TypedValueParser;
    let values = Transport::all().map(|t| clap::builder::PossibleValue::new(t.name()).help(t.about()));
    clap::builder::PossibleValuesParser::new(values).map(|name| name.parse::<Transport>().expect("a possible value"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Args, Clone, Debug)]
pub struct RunArgs {
    /// A library name such as `allreduce/ring`, a path to a `.coll` file, a `.sched` schedule file (verified, then
    /// run as it stands, in its placement), or a collective (`allreduce`: the cost model picks per size).
    pub algorithm: String,
    /// Number of ranks [default: 2, or a schedule file's] (a launcher's environment sets the world size instead).
    #[arg(long)]
    pub ranks: Option<u32>,
    /// How the ranks run and reach each other (one of the backends below; under a launcher, `threads` means shm on
    /// one host and tcp across hosts).
    #[arg(long, default_value = "threads", value_parser = transport_parser())]
    pub transport: Transport,
    /// Smallest message size in bytes (K, M, G suffixes are powers of 1024), as nccl-tests' -b.
    #[arg(short = 'b', long = "minbytes", default_value = "8")]
    pub min_bytes: String,
    /// Largest message size, as nccl-tests' -e.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M")]
    pub max_bytes: String,
    /// Multiply the size by this factor between rows, as nccl-tests' -f.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub factor: u64,
    /// Add this many bytes between rows instead of multiplying (nccl-tests' -i).
    #[arg(short = 'i', long = "stepbytes")]
    pub step_bytes: Option<String>,
    /// Timed iterations per row.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: u32,
    /// Untimed warm-up iterations per row.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: u32,
    /// Check the results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    pub check: u32,
    /// Data type: float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64, or `all`.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    pub dtype: String,
    /// Reduction: sum, prod, max, min, avg, premulsum:S (each input multiplied by S, then summed: NCCL's PreMulSum),
    /// `all` (the first five), or an operator the algorithm's file or an --ops file defines.
    #[arg(short = 'o', long = "op", default_value = "sum")]
    pub op: String,
    /// A file of reduction operators (`op NAME(a, b) = EXPR`, docs/language.md §16) that -o may name; an
    /// algorithm file's own operators need none. Repeatable.
    #[arg(long = "ops", value_name = "FILE")]
    pub ops: Vec<String>,
    /// Root rank for rooted collectives (the sender of sendrecv) [default: 0, or a schedule file's].
    #[arg(short = 'r', long = "root")]
    pub root: Option<u32>,
    /// Destination rank of sendrecv (default: root + 1).
    #[arg(long)]
    pub peer: Option<u32>,
    /// Bind a `param` (or `nodes`/`local`) by name: `--set k=2`. Repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = crate::args::parse_set)]
    pub set: Vec<(String, i64)>,
    /// Print a table (nccl-tests') or one JSON document.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// What runs each rank's plan on a host transport: `interp`, the interpreter, or `jit`, each plan compiled with
    /// cranelift into one native function (threads and shm; elsewhere interpreted, with a WARN)
    /// [default: $COLLC_EXECUTOR, else interp].
    #[arg(long, value_name = "EXECUTOR")]
    pub executor: Option<collc_runtime::HostExecutor>,
    /// Seconds any wait may last before the run fails [default: $COLLC_TIMEOUT, else 60].
    #[arg(long)]
    pub timeout: Option<f64>,
    /// With a collective instead of an algorithm: the candidates, in NCCL_ALGO's grammar (`ring,tree`, `^naive`,
    /// `allreduce:ring,tree;broadcast:chain`; default $COLLC_ALGO, else the whole library).
    #[arg(long)]
    pub algo: Option<String>,
    /// With a collective instead of an algorithm: the topology the cost model selects on (default $COLLC_TOPO,
    /// else one node with the built-in constants; `collc cost --calibrate` writes one for this host).
    #[arg(long)]
    pub topo: Option<String>,
    /// With a collective instead of an algorithm and no topology file: measure this host again for the cost
    /// model (by default the calibration cached on first use is read).
    #[arg(long)]
    pub recalibrate: bool,
    /// With a collective instead of an algorithm: time every candidate at every size, in turn within this one
    /// launch (so a slow spell of the machine hits them alike), and print per size the measured fastest beside the
    /// cost model's choice.
    #[arg(long)]
    pub compare: bool,
    /// Run only an algorithm whose ranks get bitwise identical results (its replicas agree); `=strict`: also the
    /// same bits whatever the message size. A named algorithm that lacks it is an error; with a collective, the
    /// candidates that lack it are not admitted (as `deterministic` in --algo).
    #[arg(long, value_name = "LEVEL", num_args = 0..=1, require_equals = true, default_missing_value = "replicas",
          value_parser = crate::args::determinism_parser())]
    pub deterministic: Option<collc_compiler::replicas::Determinism>,
    /// Write a Chrome / Perfetto trace (Trace Event Format JSON: open it in ui.perfetto.dev or chrome://tracing) of
    /// what each rank did: a process per rank, a thread per channel, a span per instruction and tile from when its
    /// data started to move to when it was done (waits are the gaps), an arrow from each send to its receive.
    /// Recorded: the last --trace-iters timed calls of each row and placement (not warm-up or data-check calls), at
    /// most 65536 spans and 4096 calls per rank and the first 4 tiles of each call (the trace's metadata says what
    /// was left out). Every host executor and the twin record; a cuda GPU's instructions are not traced. Rank
    /// processes write FILE.rankN.json, merged into FILE when they exit (under another launcher the parts stay).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<std::path::PathBuf>,
    /// With --trace: how many of the last timed calls of each row and placement are recorded.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "trace")]
    pub trace_iters: u32,
}

/// One algorithm and the sizes it runs (up to `max_bytes`, after the previous choice's), with its bindings.
#[derive(Clone, Debug)]
pub struct Choice {
    pub max_bytes: usize,
    pub name: String,
    pub source: String,
    pub params: Vec<(String, i64)>,
    /// A `.sched` file's verified schedule (and its instructions' lines there), which runs as it stands.
    pub schedule: Option<Arc<(VerifiedSchedule, SchedLines)>>,
    /// The connections its out-of-place schedule uses at the run's rank count (each gets a FIFO).
    pub connections: usize,
    /// Chosen by this host's timings (`Selection::learn`) rather than by the cost model.
    pub measured: bool,
}

/// Everything a rank needs to run the sweep, resolved once.
#[derive(Clone, Debug)]
pub struct Job {
    pub collective: Collective,
    pub n_ranks: u32,
    pub sizes: Vec<usize>,
    /// `-b` and `-e` as given (nccl-tests' header prints these, not the sizes the factor reaches).
    pub byte_range: (usize, usize),
    pub dtypes: Vec<DataType>,
    pub ops: Vec<ReduceOp>,
    pub root: u32,
    pub peer: u32,
    pub iters: u32,
    pub warmup: u32,
    pub check: bool,
    pub format: Format,
    pub transport: Transport,
    /// Whether every rank is on this host (then `--compare` teaches this host's selections what it measured).
    pub one_host: bool,
    pub options: Options,
    /// What runs: the named algorithm, or the cost model's choice per size range, in size order.
    pub algorithms: Algorithms,
    /// `--trace`: the file and the calls recorded.
    pub trace: Option<trace::TraceJob>,
}

impl Job {
    /// The algorithm that runs calls of `bytes`: the named one, or the cost model's choice.
    pub fn algorithm_for(&self, bytes: usize) -> &Choice {
        let choices = &self.algorithms.choices;
        choices.iter().find(|c| bytes <= c.max_bytes).unwrap_or(&choices[choices.len() - 1])
    }

    /// Whether rows measure `placement`: both, unless a schedule file fixes one.
    pub fn runs(&self, placement: Placement) -> bool {
        self.algorithms.choices[0].schedule.as_ref().is_none_or(|s| s.0.placement == placement)
    }

    /// The algorithms timed at `bytes`, in turn: every candidate with `--compare`, else the one that runs.
    pub fn timed_at(&self, bytes: usize) -> Vec<&Choice> {
        match self.algorithms.compared.is_empty() {
            true => vec![self.algorithm_for(bytes)],
            false => self.algorithms.compared.iter().collect(),
        }
    }
}

pub fn run(args: RunArgs) -> u8 {
    let launched = match collc_runtime::launch::from_env() {
        Ok(launched) => launched,
        Err(message) => return usage(&message),
    };
    if launched.is_some() {
        // A rank process answers SIGUSR1 (a flight recorder dump) from its first moment, never dies of it.
        collc_runtime::recorder::catch_dump_requests();
    }
    let schedule_ranks = schedule_file_ranks(&args.algorithm);
    let n_ranks = launched.as_ref().map_or(args.ranks.or(schedule_ranks).unwrap_or(2), |l| l.world_size);
    // A launcher says how many ranks share a node; ranks spawned here are all on this one.
    let per_node = launched.as_ref().and_then(|l| l.local_world_size).unwrap_or(n_ranks);
    let job = match resolve(&args, n_ranks, per_node, launched.is_some()) {
        Ok(job) => job,
        Err((code, message)) => {
            say_error(message);
            return code;
        }
    };
    // The trace's file (a rank process's part of it) can be written, before any rank starts.
    if let Some(trace) = &job.trace {
        let path = match &launched {
            Some(launch) => trace::part_path(&trace.path, launch.rank),
            None => trace.path.clone(),
        };
        if let Err(message) = trace::check_writable(&path) {
            return usage(&message);
        }
    }
    match launched {
        Some(launch) => launch::run_one_rank(&job, &launch),
        None if job.transport.processes() => launch::spawn_ranks(&job),
        None => launch::run_threads(&job),
    }
}

fn usage(message: &str) -> u8 {
    say_error(message);
    2
}

/// Prints `error: {message}` to stderr in one `write`: every rank process and the launcher share the pipe, and a
/// line `eprintln!` writes in pieces can be cut by another process's line.
pub(super) fn say_error(message: impl std::fmt::Display) {
    use std::io::Write;
    let line = format!("error: {message}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Checks every argument before any rank starts; usage errors exit 2, an algorithm that does not compile 1.
fn resolve(args: &RunArgs, n_ranks: u32, per_node: u32, launched: bool) -> Result<Job, (u8, String)> {
    let usage = |message: String| (2u8, message);
    if n_ranks == 0 {
        return Err(usage("--ranks 0: a run needs at least one rank".into()));
    }
    if n_ranks > 1024 {
        return Err(usage(format!("--ranks {n_ranks}: at most 1024 ranks run on one host")));
    }
    let fixed = library::resolve(&args.algorithm);
    let selecting = fixed.is_err() && args.algorithm.parse::<Collective>().is_ok();
    if !selecting && args.algo.is_some() {
        return Err(usage(format!("--algo selects among algorithms; `{}` already names one", args.algorithm)));
    }
    if !selecting && args.compare {
        return Err(usage(format!(
            "--compare times the candidates of a collective; give one (`allreduce`), not `{}`",
            args.algorithm
        )));
    }
    let fixed = match selecting {
        true => None,
        // A collective's name is a valid argument too: suggest it when one is close (`alreduce`).
        false => Some(fixed.map_err(|message| {
            let collectives: Vec<&str> = Collective::ALL.iter().map(|c| c.name()).collect();
            usage(collc_compiler::diag::with_suggestion(message, &args.algorithm, &collectives))
        })?),
    };
    let ((min, max), sizes) = sweep(args).map_err(usage)?;
    register_operators(args, fixed.as_ref())?;
    let (dtypes, ops) = types_and_ops(args).map_err(usage)?;
    if args.iters == 0 {
        return Err(usage("-n 0: at least one timed iteration".into()));
    }
    if args.trace_iters == 0 {
        return Err(usage("--trace-iters 0: give at least 1 (or leave out --trace)".into()));
    }
    let root = args.root.unwrap_or(0);
    if root >= n_ranks {
        return Err(usage(format!("-r {root}: the root must be below the rank count {n_ranks}")));
    }
    let mut peer = args.peer.unwrap_or((root + 1) % n_ranks);
    let mut root = root;
    let mut options = Options::from_env().map_err(|e| usage(e.to_string()))?;
    options.executor = args.executor.unwrap_or(options.executor);
    if let Some(seconds) = args.timeout {
        if !(seconds > 0.0 && seconds.is_finite()) {
            return Err(usage(format!("--timeout {seconds}: must be a positive number of seconds")));
        }
        options.timeout = std::time::Duration::from_secs_f64(seconds);
    }
    args.transport.backend().built().map_err(usage)?;
    // Under a launcher the ranks are processes: `threads` means shm when they share this host, else tcp.
    let transport = match launched {
        true => args.transport.for_processes(per_node == n_ranks).map_err(usage)?,
        false => args.transport,
    };
    let (collective, algorithms) = match fixed {
        None => select(args, (n_ranks, per_node, launched), transport, (root, peer), (&sizes, &dtypes, &ops))?,
        Some(source) if library::is_schedule(&source) => {
            let (collective, algorithms) = schedule_file(args, source, n_ranks)?;
            let sched = &algorithms.choices[0].schedule.as_ref().expect("a schedule file's choice has it").0;
            (root, peer) = (sched.root, sched.peer);
            (collective, algorithms)
        }
        Some(source) => compile_fixed(args, source, n_ranks, per_node, root, peer)?,
    };
    let job = Job {
        collective,
        n_ranks,
        sizes,
        byte_range: (min, max),
        dtypes,
        ops,
        root,
        peer,
        iters: args.iters,
        warmup: args.warmup,
        check: args.check != 0,
        format: args.format,
        transport,
        one_host: per_node == n_ranks,
        options,
        algorithms,
        trace: args.trace.clone().map(|path| trace::TraceJob { path, iters: args.trace_iters }),
    };
    // A launcher's job runs one rank here; spawned or threaded, all of them.
    let local_ranks = if launched { 1 } else { n_ranks };
    resources::check(&job, local_ranks).map_err(usage)?;
    Ok(job)
}

/// `-b`, `-e` and the sizes from one to the other by `-f` (or `-i`), as nccl-tests sweeps them.
fn sweep(args: &RunArgs) -> Result<((usize, usize), Vec<usize>), String> {
    let min = parse_size(&args.min_bytes).map_err(|e| format!("-b: {e}"))?;
    let max = parse_size(&args.max_bytes).map_err(|e| format!("-e: {e}"))?;
    if min > max {
        return Err(format!("-b {min} is larger than -e {max}: the size range is empty"));
    }
    let step = args.step_bytes.as_deref().map(parse_size).transpose().map_err(|e| format!("-i: {e}"))?;
    if step.is_none() && args.factor < 2 && min != max {
        return Err("-f must be at least 2 (or give -i)".into());
    }
    if step == Some(0) {
        return Err("-i 0 would never reach -e".into());
    }
    Ok(((min, max), size_sweep(min, max, args.factor, step)))
}

/// Registers the operators of the `--ops` files and of the algorithm's own file, so `-o` can name them; one that does
/// not parse or lower is reported at its line (exit 1), a file that cannot be read is a usage error.
fn register_operators(args: &RunArgs, algorithm: Option<&library::Source>) -> Result<(), (u8, String)> {
    let mut files = Vec::new();
    for path in &args.ops {
        let text = std::fs::read_to_string(path).map_err(|e| (2, format!("--ops {path}: cannot read it: {e}")))?;
        files.push((path.clone(), text, true));
    }
    // The algorithm's own operators: what does not parse there is the compile's error to report, later.
    files.extend(algorithm.filter(|s| !library::is_schedule(s)).map(|s| (s.name.clone(), s.text.clone(), false)));
    for (name, text, ops_only) in files {
        let limits = Limits::default().syntax;
        let operators = match ops_only {
            true => collc_compiler::operator::parse_operators(&text, &limits),
            false => match collc_grammar::parse(&text, &limits) {
                Ok(file) => file
                    .ops
                    .iter()
                    .map(collc_compiler::operator::lower_op)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| Errors(vec![e])),
                Err(_) => continue,
            },
        };
        let operators = operators.map_err(|errors| {
            crate::report::print_all(&errors, &name, &text);
            (1, format!("{name}: its operators do not compile"))
        })?;
        for operator in operators {
            collc_kernels::operator::UserOp::register(operator).map_err(|e| (2, e.to_string()))?;
        }
    }
    Ok(())
}

/// `-d` and `-o`: one data type and op, or `all` of them.
fn types_and_ops(args: &RunArgs) -> Result<(Vec<DataType>, Vec<ReduceOp>), String> {
    // A misspelt name gets the closest accepted ones (`flaot`: did you mean float?).
    let suggest = |name: &str, known: Vec<String>, error: String| {
        let known: Vec<&str> = known.iter().map(String::as_str).collect();
        collc_compiler::diag::with_suggestion(error, name, &known)
    };
    let dtypes = match args.dtype.as_str() {
        "all" => DataType::ALL.to_vec(),
        name => vec![name
            .parse::<DataType>()
            .map_err(|e| suggest(name, DataType::ALL.iter().map(|d| d.to_string()).collect(), format!("-d: {e}")))?],
    };
    let ops = match args.op.as_str() {
        "all" => ReduceOp::ALL.to_vec(),
        name => vec![name.parse::<ReduceOp>().map_err(|e| match e {
            UnknownReduceOp::Name { .. } => {
                suggest(name, ReduceOp::ALL.iter().map(|o| o.to_string()).collect(), format!("-o: {e}"))
            }
            _ => format!("-o: {e}"),
        })?],
    };
    // A premulsum factor every data type of the run holds, before any rank starts.
    for (op, factor) in ops.iter().filter_map(|op| Some((op, op.factor()?))) {
        if let Some(error) = dtypes.iter().find_map(|&dtype| factor.element(dtype).err()) {
            let hint = match error.dtype.is_float() {
                true => "a smaller factor".to_string(),
                false => format!(
                    "a whole factor in its range, or a float type (-d float){}",
                    match args.dtype.as_str() {
                        "all" => " in place of -d all",
                        _ => "",
                    }
                ),
            };
            return Err(format!("-o {op}: {error}; give {hint}"));
        }
    }
    // A user's operator must type on every data type of the run.
    for user in ops.iter().filter_map(|op| match op {
        ReduceOp::User(user) => Some(*user),
        _ => None,
    }) {
        if let Some((dtype, error)) = dtypes.iter().find_map(|&d| user.prepare(d).err().map(|e| (d, e))) {
            let takes: Vec<String> =
                DataType::ALL.iter().filter(|&&d| user.prepare(d).is_ok()).map(|d| d.to_string()).collect();
            return Err(format!(
                "-o {}: it does not type on {dtype}: {error}; give -d one of the types it takes ({})",
                user.name(),
                takes.join(", ")
            ));
        }
    }
    Ok((dtypes, ops))
}

/// What runs: one algorithm for every size, or the ones the cost model selected per size range.
#[derive(Clone, Debug)]
pub struct Algorithms {
    /// In size order, never empty; a single entry (covering every size) for a named algorithm.
    pub choices: Vec<Choice>,
    /// Whether the cost model chose them (the command named a collective).
    pub selected: bool,
    /// With `--compare`: every candidate, each timed at every size; empty otherwise.
    pub compared: Vec<Choice>,
    /// Candidates of a selection that the rank count or node split does not admit, with why.
    pub not_admitted: Vec<(String, String)>,
    /// For a selection: the topology the cost model selected on, where it came from and what it says.
    pub topology: Option<String>,
    /// For a named algorithm with parameters: their values, and where those `--set` does not give came from.
    pub parameters: Option<String>,
    /// For a selection: the candidates as costed, which every rank's communicator chooses through per call (and
    /// whose costed schedules it runs without compiling them again).
    pub selection: Option<Arc<collc_runtime::select::Selection>>,
}

impl Algorithms {
    /// One algorithm for every size, as the command named it.
    fn fixed(choice: Choice) -> Algorithms {
        Algorithms {
            choices: vec![choice],
            selected: false,
            compared: Vec::new(),
            not_admitted: Vec::new(),
            topology: None,
            parameters: None,
            selection: None,
        }
    }
}

/// Compiles a named algorithm once here, so a broken one is reported once, with its diagnostics, before any rank
/// starts.
fn compile_fixed(
    args: &RunArgs,
    source: library::Source,
    n_ranks: u32,
    per_node: u32,
    root: u32,
    peer: u32,
) -> Result<(Collective, Algorithms), (u8, String)> {
    let failed = |errors: Errors| {
        crate::report::print_all(&errors, &source.name, &source.text);
        (1, format!("{} does not compile for {n_ranks} ranks", source.name))
    };
    let file = collc_grammar::parse(&source.text, &Limits::default().syntax)
        .map_err(|e| failed(Errors(vec![Error::from(e)])))?;
    // A `--set` the algorithm cannot take is a usage error, not a failure to compile.
    if let Some((message, help)) = collc_compiler::lower::unbindable(&file.algorithm, &args.set) {
        return Err((2, format!("{message} ({help})")));
    }
    let collective = file.algorithm.collective.name.parse::<Collective>().unwrap_or(Collective::AllReduce);
    let bindings = Bindings {
        n_ranks,
        root: collective.rooted().then_some(root),
        peer: (collective == Collective::SendRecv).then_some(peer),
        params: args.set.clone(),
    }
    .with_default_split(&file.algorithm, per_node);
    let schedule = compile(&source.text, &bindings, CompileOptions::default(), &Limits::default()).map_err(failed)?;
    // A deterministic run holds both placements to it: the in-place schedule may reduce in other trees.
    let in_place = match args.deterministic {
        Some(_) => {
            let options = CompileOptions { placement: Placement::InPlace, ..CompileOptions::default() };
            Some(compile(&source.text, &bindings, options, &Limits::default()).map_err(failed)?)
        }
        None => None,
    };
    let (collective, params) = (schedule.collective, bindings.params);
    for placed in std::iter::once(&schedule).chain(&in_place) {
        crate::args::check_deterministic(args.deterministic, &source.name, placed)?;
    }
    let connections = schedule.n_connections();
    let name = source.name.trim_end_matches(".coll").to_string();
    let parameters = (!params.is_empty()).then(|| {
        let values: Vec<String> = params.iter().map(|(name, value)| format!("{name}={value}")).collect();
        let split: Vec<&str> = params
            .iter()
            .filter(|(name, _)| !args.set.iter().any(|(set, _)| set == name))
            .map(|(n, _)| n.as_str())
            .collect();
        match split.is_empty() {
            true => values.join(" "),
            false => format!(
                "{} ({} from the job's node split, {per_node} ranks per node; --set {}=N to choose)",
                values.join(" "),
                split.join(", "),
                split[0]
            ),
        }
    });
    let choice = Choice {
        max_bytes: usize::MAX,
        name,
        source: source.text,
        params,
        schedule: None,
        connections,
        measured: false,
    };
    Ok((collective, Algorithms { parameters, ..Algorithms::fixed(choice) }))
}

/// The rank count in a schedule file's header, if `algorithm` names one (the file's rank count is the run's
/// default).
fn schedule_file_ranks(algorithm: &str) -> Option<u32> {
    let source = library::resolve(algorithm).ok().filter(library::is_schedule)?;
    library::schedule_ranks(&source)
}

/// A schedule file, verified here as `collc check` verifies it, before any rank starts: it runs as it stands, in
/// its placement, with its root and peer, on its rank count.
fn schedule_file(
    args: &RunArgs,
    source: library::Source,
    n_ranks: u32,
) -> Result<(Collective, Algorithms), (u8, String)> {
    let usage = |message: String| (2u8, message);
    let (verified, lines) = library::verify_schedule(&source, &Limits::default()).map_err(|errors| {
        crate::report::print_all(&errors, &source.name, &source.text);
        (1, format!("{} does not verify", source.name))
    })?;
    let sched = &verified;
    crate::args::check_deterministic(args.deterministic, &source.name, sched)?;
    if sched.n_ranks != n_ranks {
        return Err(usage(format!(
            "{} is a schedule for {} ranks, not {n_ranks}; `collc build ... --ranks {n_ranks}` writes one",
            source.name, sched.n_ranks
        )));
    }
    let differs = |given: Option<u32>, fixed: u32| given.is_some_and(|g| g != fixed);
    if (sched.collective.rooted() && differs(args.root, sched.root))
        || (sched.collective == Collective::SendRecv && differs(args.peer, sched.peer))
    {
        return Err(usage(format!(
            "{} is a schedule for root {} and peer {}; `collc build ... --root R` writes one for another",
            source.name, sched.root, sched.peer
        )));
    }
    if !args.set.is_empty() {
        return Err(usage(format!("--set binds parameters of a .coll program; {} is already bound", source.name)));
    }
    let collective = sched.collective;
    let choice = Choice {
        max_bytes: usize::MAX,
        name: source.name.clone(),
        source: String::new(),
        params: Vec::new(),
        connections: verified.n_connections(),
        schedule: Some(Arc::new((verified, lines))),
        measured: false,
    };
    Ok((collective, Algorithms::fixed(choice)))
}

/// For a run that names a collective: the predicted-fastest algorithm for each size, as NCCL's tuner picks.
fn select(
    args: &RunArgs,
    (n_ranks, per_node, launched): (u32, u32, bool),
    transport: Transport,
    (root, peer): (u32, u32),
    (sizes, dtypes, ops): (&[usize], &[DataType], &[ReduceOp]),
) -> Result<(Collective, Algorithms), (u8, String)> {
    let collective: Collective = args.algorithm.parse().map_err(|e: String| (2, e))?;
    let filter = crate::tune::algo_filter(args.algo.as_deref()).map_err(|e| (2, e))?;
    // NCCL_ALGO ignores entries for other collectives; a --algo given for this run that names none of its own is a
    // mistake (`--algo broadcast:chain` on an allreduce), not a wish for every algorithm.
    if let Some(text) = args.algo.as_deref().filter(|_| !filter.mentions(collective)) {
        return Err((
            2,
            format!("--algo `{text}` names no {collective} algorithm; write {collective}:NAME,.. or a list"),
        ));
    }
    let filter = match args.deterministic {
        Some(level) => filter.requiring(level),
        None => filter,
    };
    let from_env = std::env::var("COLLC_TOPO").ok().filter(|t| !t.is_empty());
    let file = match (args.topo.as_deref(), from_env.as_deref()) {
        (Some(path), _) => Some((format!("--topo {path}"), path)),
        (None, Some(path)) => Some((format!("COLLC_TOPO={path}"), path)),
        (None, None) => None,
    };
    // Without a topology file: on one host, this host's calibration (cached on first use); across nodes, the
    // launcher's node split with the built-in constants.
    let host = match (&file, per_node == n_ranks && !transport.backend().sockets()) {
        (None, true) => crate::calibrate::host_topology(args.recalibrate, !launched),
        _ => None,
    };
    let mut topo = match (&file, &host) {
        (Some((origin, path)), _) => crate::cost::topology_file(origin, path, n_ranks).map_err(|e| (2, e))?,
        (None, Some((topo, _))) => topo.clone(),
        // Over tcp every message pays the socket's costs, on one host or several.
        (None, None) if transport.backend().sockets() => Topology::sockets(n_ranks),
        (None, None) => Topology::uniform_nodes(n_ranks, per_node),
    };
    // Ranks that read a send whose source stays in place (up to the transport's size): priced as the transport runs it.
    topo.single_copy = collc_runtime::select::single_copy_of(transport);
    let topology = match &file {
        Some((origin, _)) if topo.name.is_empty() => format!("{origin}: {}", topo.describe()),
        Some((origin, _)) => format!("{origin} ({}): {}", topo.name, topo.describe()),
        None if host.is_some() => {
            format!("{}: {}", host.as_ref().map_or("", |(_, line)| line.as_str()), topo.describe())
        }
        // `collc cost --calibrate` measures one host; a cluster's topology file is written by hand.
        None if topo.nodes == 1 => format!(
            "the built-in topology ({}); for this host's own numbers: collc cost --calibrate -o host.json, then \
             --topo host.json or COLLC_TOPO=host.json",
            topo.describe()
        ),
        None => format!(
            "the built-in topology ({}); for this cluster's own numbers, give a topology file (docs/language.md, \
             cost model) with --topo or COLLC_TOPO",
            topo.describe()
        ),
    };
    let bind = crate::args::BindArgs {
        root: collective.rooted().then_some(root),
        params: crate::args::ParamArgs {
            peer: (collective == Collective::SendRecv).then_some(peer),
            set: args.set.clone(),
            pipeline: None,
        },
    };
    let mut selection = collc_runtime::select::Selection::new(
        collective,
        library::library(),
        &filter,
        &bind.bindings(n_ranks),
        (&topo, topology.clone()),
        &Limits::default(),
    )
    .map_err(|error| crate::tune::field_error(error, n_ranks))?;
    // On this host, without a topology file, the choice goes by what `--compare` measured here where it covers a
    // size (as a communicator's own selection does).
    if file.is_none() && per_node == n_ranks && !transport.backend().sockets() {
        selection.learn(transport.name());
    }
    // A user's operator that only a chain in rank order computes: only the candidates that reduce so.
    if let Some(narrowed) = selection.admitting(ops, dtypes) {
        selection = narrowed;
    }
    let choice = |candidate: &collc_runtime::select::Candidate, max_bytes: usize, measured: bool| Choice {
        max_bytes,
        name: candidate.name.clone(),
        source: candidate.source.clone(),
        params: candidate.params.clone(),
        schedule: None,
        // The costed schedule's connections size the run's FIFOs.
        connections: candidate.costed.profile.connections,
        measured,
    };
    let mut choices: Vec<Choice> = Vec::new();
    for &bytes in sizes {
        let chosen = selection.choose(bytes);
        let best = &selection.candidates[chosen.index];
        match choices.last_mut() {
            Some(last) if last.name == best.name && last.measured == chosen.measured => last.max_bytes = bytes,
            _ => choices.push(choice(best, bytes, chosen.measured)),
        }
    }
    let compared = match args.compare {
        true => selection.candidates.iter().map(|c| choice(c, usize::MAX, false)).collect(),
        false => Vec::new(),
    };
    let not_admitted = selection.not_admitted.clone();
    Ok((
        collective,
        Algorithms {
            choices,
            selected: true,
            compared,
            not_admitted,
            topology: Some(topology),
            parameters: None,
            selection: Some(Arc::new(selection)),
        },
    ))
}

/// A communicator set up with the job's algorithm.
pub fn configure(mut comm: Communicator, job: &Job) -> Communicator {
    if job.trace.is_some() {
        comm.enable_tracing().expect("a communicator before its first call");
    }
    if let Some(selection) = &job.algorithms.selection {
        comm.set_selection(selection.clone());
        return comm;
    }
    let first = &job.algorithms.choices[0];
    match &first.schedule {
        Some(schedule) => comm.set_schedule(&first.name, schedule.clone()),
        None => comm.set_algorithm(job.collective, &first.name, &first.source, first.params.clone()),
    }
    comm
}
