//! Arguments shared by subcommands: bindings (`--ranks`, `--root`, `--set`) and limits.

use clap::Args;
use collc_compiler::replicas::Determinism;
use collc_compiler::{Bindings, Limits, Options, Placement, VerifiedSchedule};

#[derive(Args, Clone, Debug)]
pub struct BindArgs {
    /// Root rank (broadcast, reduce, gather, scatter; the source of sendrecv) [default: 0].
    #[arg(long)]
    pub root: Option<u32>,
    #[command(flatten)]
    pub params: ParamArgs,
}

impl BindArgs {
    pub fn options(&self, placement: Placement) -> Options {
        self.params.options(placement)
    }

    pub fn bindings(&self, n_ranks: u32) -> Bindings {
        self.params.bindings(n_ranks, self.root)
    }
}

/// The bindings besides the root: `collc check` takes a list of roots (`--root all|N,M,..`) instead of one.
#[derive(Args, Clone, Debug)]
pub struct ParamArgs {
    /// Destination rank of sendrecv (default: root + 1).
    #[arg(long)]
    pub peer: Option<u32>,
    /// Bind a `param` (or `nodes`/`local`) by name: `--set k=2`. Repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_set)]
    pub set: Vec<(String, i64)>,
    /// Cut every chunk into K slices and pipeline them over steps (default: the algorithm's `pipeline`, else 1).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=collc_compiler::lower::MAX_SLICES as i64))]
    pub pipeline: Option<u32>,
}

impl ParamArgs {
    pub fn options(&self, placement: Placement) -> Options {
        Options { pipeline: self.pipeline, ..Options::placed(placement) }
    }

    pub fn bindings(&self, n_ranks: u32, root: Option<u32>) -> Bindings {
        Bindings { n_ranks, root, peer: self.peer, params: self.set.clone() }
    }
}

/// How an algorithm is compiled where a subcommand takes an algorithm or a schedule file (`collc diff`, `collc
/// viz`): the binding, placement, fusion and limits of `collc build`, the rank count optional (a schedule file has
/// its own).
#[derive(Args)]
pub struct CompileArgs {
    /// Rank count an algorithm is compiled at (a schedule file carries its own).
    #[arg(long)]
    pub ranks: Option<u32>,
    #[command(flatten)]
    pub bind: BindArgs,
    /// Compile the in-place variant (NCCL's sendbuff == recvbuff layout).
    #[arg(long)]
    pub in_place: bool,
    /// Skip the Recv+Reduce+Send fusion pass.
    #[arg(long)]
    pub no_fuse: bool,
    #[command(flatten)]
    pub limits: LimitArgs,
}

impl CompileArgs {
    /// What `collc build` would compile with these flags.
    pub fn build_options(&self) -> collc_compiler::BuildOptions {
        collc_compiler::BuildOptions {
            placement: if self.in_place { Placement::InPlace } else { Placement::OutOfPlace },
            root: self.bind.root,
            peer: self.bind.params.peer,
            params: self.bind.params.set.clone(),
            pipeline: self.bind.params.pipeline,
            fuse: !self.no_fuse,
            limits: self.limits.limits(),
        }
    }

    /// A source's verified schedule: a schedule file (`.sched`, MSCCL XML) as it stands, else the algorithm built at
    /// `n_ranks`.
    pub fn verified(
        &self,
        source: &crate::library::Source,
        n_ranks: u32,
    ) -> Result<VerifiedSchedule, collc_compiler::Errors> {
        let options = self.build_options();
        match crate::library::is_schedule(source) {
            true => crate::library::verify_schedule(source, &options.limits).map(|(verified, _)| verified),
            false => collc_compiler::build(&source.text, n_ranks, &options),
        }
    }
}

pub fn parse_set(text: &str) -> Result<(String, i64), String> {
    let (name, value) = text.split_once('=').ok_or_else(|| format!("`{text}` is not NAME=VALUE"))?;
    let value = value.trim().parse::<i64>().map_err(|_| format!("`{value}` is not an integer"))?;
    Ok((name.trim().to_string(), value))
}

#[derive(Args, Clone, Debug)]
pub struct LimitArgs {
    /// Most expression evaluation steps while lowering.
    #[arg(long, default_value_t = Limits::default().max_eval_steps)]
    pub max_eval_steps: u64,
    /// Deepest `fn` recursion.
    #[arg(long, default_value_t = Limits::default().max_call_depth)]
    pub max_call_depth: u32,
    /// Most transfers one program may emit.
    #[arg(long, default_value_t = Limits::default().max_transfers)]
    pub max_transfers: usize,
    /// Largest rank count accepted.
    #[arg(long, default_value_t = Limits::default().max_ranks)]
    pub max_ranks: u32,
    /// Most chunk slots over all buffers of all ranks.
    #[arg(long, default_value_t = Limits::default().max_slots)]
    pub max_slots: u64,
    /// Messages in flight per connection in the deadlock check (NCCL_STEPS).
    #[arg(long, default_value_t = Limits::default().channel_slots, value_parser = clap::value_parser!(u32).range(1..))]
    pub channel_slots: u32,
    /// Largest source file, in bytes.
    #[arg(long, default_value_t = Limits::default().syntax.max_source_bytes)]
    pub max_source_bytes: usize,
}

impl LimitArgs {
    pub fn limits(&self) -> Limits {
        let mut limits = Limits {
            max_eval_steps: self.max_eval_steps,
            max_call_depth: self.max_call_depth,
            max_transfers: self.max_transfers,
            max_ranks: self.max_ranks,
            max_slots: self.max_slots,
            channel_slots: self.channel_slots,
            ..Limits::default()
        };
        limits.syntax.max_source_bytes = self.max_source_bytes;
        limits
    }
}

/// A usage error for a rank count outside 1..=`max` (`--max-ranks`), as `collc` exits 2 for it.
pub fn check_rank_count(n_ranks: u32, max: u32) -> Result<(), String> {
    match n_ranks {
        0 => Err("--ranks 0: choose at least one rank".to_string()),
        n if n > max => Err(format!("--ranks {n}: more than --max-ranks {max}; choose fewer, or raise --max-ranks")),
        _ => Ok(()),
    }
}

/// Parses `8`, `2..=64`, `2..64`, `2,3,8` and combinations like `2..=8,16,32`.
pub fn parse_rank_list(text: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let number = |s: &str| s.trim().parse::<u32>().map_err(|_| format!("`{s}` in `{text}` is not a rank count"));
        if let Some((a, b)) = part.split_once("..=") {
            out.extend(number(a)?..=number(b)?);
        } else if let Some((a, b)) = part.split_once("..") {
            out.extend(number(a)?..number(b)?);
        } else {
            out.push(number(part)?);
        }
        if out.len() > 1 << 16 {
            return Err(format!("`{text}` lists more than 65536 rank counts"));
        }
    }
    if out.is_empty() {
        return Err(format!("`{text}` lists no rank counts; write e.g. 8, 2..=64 or 2,4,8"));
    }
    Ok(out)
}

/// `8`, `1K`, `32M`, `1G`: bytes, with nccl-tests' binary suffixes.
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let (digits, shift) = match text.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&text[..text.len() - 1], 10),
        Some('M') => (&text[..text.len() - 1], 20),
        Some('G') => (&text[..text.len() - 1], 30),
        _ => (text, 0),
    };
    let value: usize = digits.parse().map_err(|_| format!("`{text}` is not a size such as 8, 64K, 32M or 1G"))?;
    value.checked_mul(1usize << shift).ok_or_else(|| format!("`{text}` overflows"))
}

/// The sizes of a sweep from `min` to `max`: times `factor` each row, or plus `step` (nccl-tests' -f and -i).
pub fn size_sweep(min: usize, max: usize, factor: u64, step: Option<usize>) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut size = min;
    while size <= max {
        sizes.push(size);
        let next = match step {
            Some(step) => size.checked_add(step),
            None => size.checked_mul(factor as usize).filter(|&n| n > size),
        };
        match next {
            Some(n) => size = n,
            None => break,
        }
    }
    sizes
}

/// How the postcondition is checked: `--exact`, or keyed with `--seed` (default: exactly up to 64 ranks, keyed
/// above with a seed drawn from the OS). The seed also draws the roots checked above 64 ranks, in either mode.
#[derive(Args, Clone, Debug)]
pub struct VerifyArgs {
    /// Verify with the multisets of contributions themselves at every rank count (default: exactly up to 64
    /// ranks, keyed above, with an error bound of 2^-105 per schedule).
    #[arg(long)]
    pub exact: bool,
    /// Replay a verification with the seed it printed (32 hexadecimal digits; `-v` or `--format json` shows it):
    /// its keys and the roots drawn above 64 ranks (with `--exact`, the roots alone). Default: a fresh seed from
    /// the OS for each invocation.
    #[arg(long, value_name = "HEX")]
    pub seed: Option<collc_compiler::Seed>,
}

impl VerifyArgs {
    /// The invocation's one seed: `--seed`, else fresh from the OS.
    pub fn seed(&self) -> collc_compiler::Seed {
        self.seed.unwrap_or_else(collc_compiler::Seed::from_os)
    }

    /// The verification to run with the invocation's `seed`.
    pub fn verification(&self, seed: collc_compiler::Seed) -> collc_compiler::Verification {
        use collc_compiler::Verification;
        match self.exact {
            true => Verification::Exact,
            false => Verification::Auto(seed),
        }
    }
}

/// `--deterministic[=replicas|strict]`: what determinism the algorithms that run must have.
pub fn determinism_parser() -> impl clap::builder::TypedValueParser<Value = Determinism> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    let values = [
        PossibleValue::new("replicas").help("every rank gets bitwise identical results (the default)"),
        PossibleValue::new("strict").help("and the same bits whatever the message size and its cut into chunks"),
    ];
    PossibleValuesParser::new(values).map(|name| name.parse::<Determinism>().expect("a possible value"))
}

/// An error (exit 1) if `level` asks for a determinism the verified schedule `name` lacks (`replicas::analyse`).
pub fn check_deterministic(
    level: Option<Determinism>,
    name: &str,
    sched: &VerifiedSchedule,
) -> Result<(), (u8, String)> {
    let Some(why) = level.and_then(|level| level.refusal(&collc_compiler::replicas::analyse(sched))) else {
        return Ok(());
    };
    let level = level.map_or("", Determinism::name);
    Err((1, format!("{name} is not deterministic ({level}) at {} ranks: {why}", sched.n_ranks)))
}
