//! Binds an algorithm's declared parameters (ranks, nodes/local, root, peer, params) to values and checks `where`.

use super::eval::Machine;
use super::resolve::{RFn, Resolver};
use crate::collective::Collective;
use crate::diag::{Error, Errors};
use crate::sched::BufId;
use crate::Limits;
use collc_grammar::ast::{Algorithm, Expr, Item, Span};

/// The values given on the command line: `--ranks`, `--root`, `--peer`, `--set k=v`.
#[derive(Clone, Debug, Default)]
pub struct Bindings {
    pub n_ranks: u32,
    pub root: Option<u32>,
    pub peer: Option<u32>,
    pub params: Vec<(String, i64)>,
}

impl Bindings {
    pub fn ranks(n_ranks: u32) -> Self {
        Bindings { n_ranks, ..Default::default() }
    }

    /// Binds the ranks per node of an algorithm's `nodes n local g` to `per_node` when neither name is bound yet
    /// (a single host is one node of p ranks; a topology file or a launcher may say otherwise).
    pub fn with_default_split(mut self, algo: &Algorithm, per_node: u32) -> Self {
        if let Some((nodes, local)) = node_split(algo) {
            if !self.params.iter().any(|(name, _)| name == nodes || name == local) {
                self.params.push((local.to_string(), per_node as i64));
            }
        }
        self
    }
}

/// The first `--set` name `algo` cannot take (what is wrong, and how to fix it), or `None`: a `param` or a `nodes`
/// / `local` name binds; the rank count, root and peer do not, nor a name the algorithm does not declare. The CLI
/// checks this once, as a usage error, before it compiles for any rank count or root.
pub fn unbindable(algo: &Algorithm, params: &[(String, i64)]) -> Option<(String, String)> {
    let (names, _, _) = declared(algo);
    let fixed: Vec<&str> = algo
        .items
        .iter()
        .filter_map(|i| match i {
            Item::Ranks { var, .. } | Item::Root { var, .. } | Item::Peer { var, .. } => Some(var.name.as_str()),
            _ => None,
        })
        .collect();
    params.iter().find_map(|(name, _)| {
        if fixed.contains(&name.as_str()) {
            return Some((
                format!("--set {name}=...: `{name}` is the rank count, root or peer"),
                "bind it with --ranks, --root or --peer".to_string(),
            ));
        }
        let known: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).filter(|n| !fixed.contains(n)).collect();
        (!names.iter().any(|(n, _)| n == name)).then(|| {
            let help = match known.is_empty() {
                true => format!("`{}` has no parameters to set", algo.name.name),
                false => {
                    crate::diag::with_suggestion(format!("its parameters are: {}", known.join(", ")), name, &known)
                }
            };
            (format!("--set {name}=...: the algorithm has no parameter `{name}`"), help)
        })
    })
}

/// The names of an algorithm's `nodes n local g` declaration, if it has one.
pub fn node_split(algo: &Algorithm) -> Option<(&str, &str)> {
    algo.items.iter().find_map(|item| match item {
        Item::Nodes { nodes, local, .. } => Some((nodes.name.as_str(), local.name.as_str())),
        _ => None,
    })
}

/// Everything `bind` produces: global names and values, functions, chunks, scratch sizes.
pub(crate) struct Bound {
    pub n_ranks: u32,
    pub globals: Vec<String>,
    pub values: Vec<i64>,
    pub fns: Vec<RFn>,
    pub fn_names: Vec<(String, usize)>,
    pub chunks: u32,
    /// The declared default slice count of the pipelining pass (1 when not declared).
    pub pipeline: u32,
    pub scratch: Vec<(String, u32)>,
    pub root: u32,
    pub peer: u32,
}

type Result<T> = std::result::Result<T, Errors>;

/// The most slices the pipelining pass cuts a chunk into.
pub const MAX_SLICES: u32 = 1024;

fn declared(algo: &Algorithm) -> (Vec<(String, Span)>, Option<Span>, Option<Span>) {
    let mut names = Vec::new();
    let (mut root, mut peer) = (None, None);
    for item in &algo.items {
        match item {
            Item::Ranks { var, .. } => names.push((var.name.clone(), var.span)),
            Item::Nodes { nodes, local, .. } => {
                names.push((nodes.name.clone(), nodes.span));
                names.push((local.name.clone(), local.span));
            }
            Item::Root { var, span, .. } => {
                names.push((var.name.clone(), var.span));
                root = Some(*span);
            }
            Item::Peer { var, span, .. } => {
                names.push((var.name.clone(), var.span));
                peer = Some(*span);
            }
            Item::Param { var, .. } => names.push((var.name.clone(), var.span)),
            _ => {}
        }
    }
    (names, root, peer)
}

pub(crate) fn bind(algo: &Algorithm, collective: Collective, b: &Bindings, limits: &Limits) -> Result<Bound> {
    let p = b.n_ranks;
    if p == 0 || p > limits.max_ranks {
        return Err(Error::new(
            "collc::lower::ranks",
            format!("--ranks {p} is outside 1..={}", limits.max_ranks),
            match p {
                0 => "choose at least one rank",
                _ => "choose fewer ranks, or raise the limit with --max-ranks",
            },
        )
        .at(algo.name.span, "for this algorithm")
        .into());
    }
    let (names, root_span, peer_span) = declared(algo);
    check_declarations(algo, collective, &names, root_span)?;
    if let Some((message, help)) = unbindable(algo, &b.params) {
        return Err(Error::new("collc::lower::param", message, help).at(algo.name.span, "in this algorithm").into());
    }
    let globals: Vec<String> = names.iter().map(|(n, _)| n.clone()).collect();
    let scratch_names: Vec<String> = algo
        .items
        .iter()
        .filter_map(|i| if let Item::Scratch { name, .. } = i { Some(name.name.clone()) } else { None })
        .collect();
    let fn_names: Vec<(String, usize)> = algo
        .items
        .iter()
        .filter_map(|i| if let Item::Fn(f) = i { Some((f.name.name.clone(), f.params.len())) } else { None })
        .collect();
    let resolver = Resolver::new(&globals, &fn_names, &scratch_names);
    let fns = resolve_fns(algo, &resolver)?;
    let mut machine =
        Machine { fns: &fns, globals: vec![0; globals.len()], fuel: limits.max_eval_steps, depth: 0, limits };
    let (root, peer) = bind_values(algo, b, &resolver, &mut machine, peer_span.is_some())?;
    check_constraints(algo, b, &resolver, &mut machine)?;
    let sizes = eval_size(algo, &resolver, &mut machine, limits, p)?;
    let values = machine.globals;
    Ok(Bound {
        n_ranks: p,
        globals,
        values,
        fns,
        fn_names,
        chunks: sizes.chunks,
        pipeline: sizes.pipeline,
        scratch: sizes.scratch,
        root,
        peer,
    })
}

fn check_declarations(
    algo: &Algorithm,
    collective: Collective,
    names: &[(String, Span)],
    root: Option<Span>,
) -> Result<()> {
    let ranks_decls = algo.items.iter().filter(|i| matches!(i, Item::Ranks { .. })).count();
    if ranks_decls != 1 {
        return Err(Error::new(
            "collc::lower::ranks",
            format!("an algorithm declares `ranks NAME` exactly once; this one has {ranks_decls}"),
            "add `ranks p` at the top of the algorithm body",
        )
        .at(algo.name.span, "this algorithm")
        .into());
    }
    for (i, (name, span)) in names.iter().enumerate() {
        if let Some((_, first)) = names[..i].iter().find(|(n, _)| n == name) {
            return Err(Error::new(
                "collc::lower::name",
                format!("`{name}` is declared twice"),
                "give each parameter its own name",
            )
            .at(*span, "second declaration")
            .at(*first, "first declaration")
            .into());
        }
    }
    let needs_root = matches!(
        collective,
        Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter | Collective::SendRecv
    );
    if needs_root && root.is_none() {
        return Err(Error::new(
            "collc::lower::declaration",
            format!("a {collective} algorithm must declare its root"),
            "add `root r` to the algorithm body; `--root` binds it",
        )
        .at(algo.collective.span, "this collective has a root")
        .into());
    }
    Ok(())
}

fn resolve_fns(algo: &Algorithm, resolver: &Resolver) -> Result<Vec<RFn>> {
    let mut fns = Vec::new();
    for item in &algo.items {
        if let Item::Fn(f) = item {
            if ["min", "max", "abs", "log2", "clog2", "pow2"].contains(&f.name.name.as_str())
                || fns.iter().any(|g: &RFn| g.name == f.name.name)
            {
                return Err(Error::new(
                    "collc::lower::name",
                    format!("`{}` is already a function", f.name.name),
                    "give the function another name",
                )
                .at(f.name.span, "redefined here")
                .into());
            }
            let inner = resolver.for_fn(&f.params)?;
            let body = inner.expr(&f.body)?;
            fns.push(RFn { name: f.name.name.clone(), span: f.name.span, frame_size: inner.frame_size, body });
        }
    }
    Ok(fns)
}

fn eval_global(resolver: &Resolver, machine: &mut Machine, expr: &Expr) -> std::result::Result<i64, Error> {
    let resolved = resolver.expr(expr)?;
    machine.eval(&resolved, &[])
}

fn set_global(machine: &mut Machine, globals: &[String], name: &str, value: i64) {
    let index = globals.iter().position(|g| g == name).expect("declared names are globals");
    machine.globals[index] = value;
}

fn bind_values(
    algo: &Algorithm,
    b: &Bindings,
    resolver: &Resolver,
    machine: &mut Machine,
    has_peer: bool,
) -> Result<(u32, u32)> {
    let p = b.n_ranks;
    let given = |name: &str| b.params.iter().rev().find(|(n, _)| n == name).map(|(_, v)| *v);
    if b.peer.is_some() && !has_peer {
        return Err(Error::new(
            "collc::lower::param",
            "--peer: this algorithm declares no `peer`",
            "only sendrecv-style algorithms (`peer d`) take --peer",
        )
        .at(algo.name.span, "in this algorithm")
        .into());
    }
    let root = b.root.unwrap_or(0);
    let peer = b.peer.unwrap_or((root + 1) % p);
    for (flag, value) in [("--root", root), ("--peer", peer)] {
        if value >= p {
            return Err(Error::new(
                "collc::lower::root",
                format!("{flag} {value} is not a rank of {p}"),
                format!("choose {flag} in 0..{p}"),
            )
            .at(algo.name.span, "for this algorithm")
            .into());
        }
    }
    for item in &algo.items {
        match item {
            Item::Ranks { var, .. } => set_global(machine, resolver.globals, &var.name, p as i64),
            Item::Root { var, .. } => set_global(machine, resolver.globals, &var.name, root as i64),
            Item::Peer { var, .. } => set_global(machine, resolver.globals, &var.name, peer as i64),
            Item::Nodes { nodes, local, span, .. } => {
                let (n, g) = nodes_and_local(p, given(&nodes.name), given(&local.name)).map_err(|why| {
                    Error::new(
                        "collc::lower::nodes",
                        why,
                        format!("pass `--set {}=G` with G dividing --ranks", local.name),
                    )
                    .at(*span, "declared here")
                })?;
                set_global(machine, resolver.globals, &nodes.name, n);
                set_global(machine, resolver.globals, &local.name, g);
            }
            Item::Param { var, default, .. } => {
                // A default sees only the parameters declared before it.
                let position = resolver.globals.iter().position(|g| *g == var.name).expect("declared");
                let earlier = Resolver::new(&resolver.globals[..position], resolver.fn_names, resolver.scratch);
                let value = match given(&var.name) {
                    Some(v) => v,
                    None => eval_global(&earlier, machine, default)?,
                };
                set_global(machine, resolver.globals, &var.name, value);
            }
            _ => {}
        }
    }
    Ok((root, peer))
}

fn nodes_and_local(p: u32, nodes: Option<i64>, local: Option<i64>) -> std::result::Result<(i64, i64), String> {
    let p = p as i64;
    match (nodes, local) {
        (Some(n), Some(g)) if n * g == p => Ok((n, g)),
        (Some(n), Some(g)) => Err(format!("nodes {n} x local {g} = {} ranks, but --ranks is {p}", n * g)),
        (None, Some(g)) if g > 0 && p % g == 0 => Ok((p / g, g)),
        (Some(n), None) if n > 0 && p % n == 0 => Ok((n, p / n)),
        (None, None) => Err("this algorithm needs the number of ranks per node".to_string()),
        _ => Err(format!("the ranks per node must divide --ranks {p}")),
    }
}

fn check_constraints(algo: &Algorithm, b: &Bindings, resolver: &Resolver, machine: &mut Machine) -> Result<()> {
    for item in &algo.items {
        let constraint = match item {
            Item::Ranks { constraint, .. } | Item::Nodes { constraint, .. } | Item::Root { constraint, .. } => {
                constraint.as_ref()
            }
            Item::Peer { constraint, .. } | Item::Param { constraint, .. } => constraint.as_ref(),
            Item::Where { cond, .. } => Some(cond),
            _ => None,
        };
        let Some(cond) = constraint else { continue };
        if eval_global(resolver, machine, cond)? == 0 {
            let binding = describe_binding(resolver.globals, &machine.globals);
            // Blame what the user bound: the rank count, or the `--set` values too when there are any.
            let given = match b.params.is_empty() {
                true => format!("--ranks {}", b.n_ranks),
                false => {
                    let sets: Vec<String> = b.params.iter().map(|(n, v)| format!("--set {n}={v}")).collect();
                    format!("--ranks {} with {}", b.n_ranks, sets.join(" "))
                }
            };
            return Err(Error::new(
                "collc::lower::where",
                format!("{given} does not satisfy `where {cond}` ({binding})"),
                "this algorithm does not admit these parameters; choose values the `where` clause accepts",
            )
            .at(cond.span, "this constraint is false")
            .into());
        }
    }
    Ok(())
}

fn describe_binding(names: &[String], values: &[i64]) -> String {
    names.iter().zip(values).map(|(n, v)| format!("{n} = {v}")).collect::<Vec<_>>().join(", ")
}

/// A declared size out of its range, pointing at the declaration.
fn declaration_error(code: &'static str, what: String, help: &str, span: Span) -> Errors {
    Error::new(code, what, help).at(span, "here").into()
}

/// `chunks`, `pipeline` and the scratch sizes of one binding.
struct Sizes {
    chunks: u32,
    pipeline: u32,
    scratch: Vec<(String, u32)>,
}

/// Evaluates `chunks`, `pipeline` and the scratch sizes, within the slot limit.
fn eval_size(algo: &Algorithm, resolver: &Resolver, machine: &mut Machine, limits: &Limits, p: u32) -> Result<Sizes> {
    let mut chunks = 1i64;
    let mut pipeline = 1i64;
    let mut chunks_span = algo.name.span;
    let mut scratch = Vec::new();
    let mut total: i64 = 0;
    for item in &algo.items {
        match item {
            Item::Chunks { count, span } => {
                chunks = eval_global(resolver, machine, count)?;
                chunks_span = *span;
                if chunks < 1 {
                    let what = format!("`chunks` is {chunks}; it must be at least 1");
                    return Err(declaration_error(
                        "collc::lower::chunks",
                        what,
                        "cut each buffer into one or more chunks",
                        *span,
                    ));
                }
            }
            Item::Pipeline { slices, span } => {
                pipeline = eval_global(resolver, machine, slices)?;
                if !(1..=MAX_SLICES as i64).contains(&pipeline) {
                    let what = format!("`pipeline` is {pipeline}; it must be 1 to {MAX_SLICES}");
                    let help = "give the number of slices each chunk is cut into (1 turns pipelining off)";
                    return Err(declaration_error("collc::lower::pipeline", what, help, *span));
                }
            }
            Item::Scratch { name, size, span } => {
                if scratch.len() == BufId::MAX_SCRATCH {
                    let what = format!(
                        "scratch `{}` is one more than the {} scratch buffers allowed",
                        name.name,
                        BufId::MAX_SCRATCH
                    );
                    let help = "use fewer, larger scratch buffers and index into them";
                    return Err(declaration_error("collc::lower::scratch", what, help, *span));
                }
                let n = eval_global(resolver, machine, size)?;
                if n < 0 || n > u32::MAX as i64 {
                    let what = format!("scratch `{}` has size {n}", name.name);
                    return Err(declaration_error(
                        "collc::lower::scratch",
                        what,
                        "sizes are chunk counts from 0 to 2^32-1",
                        *span,
                    ));
                }
                scratch.push((name.name.clone(), n as u32));
                total = total.saturating_add(n);
            }
            _ => {}
        }
    }
    let collective: crate::Collective = algo.collective.name.parse().unwrap_or(crate::Collective::AllToAll);
    let (in_chunks, out_chunks) = collective.buffer_chunks(p, chunks.clamp(1, u32::MAX as i64 / p as i64) as u32);
    let view = in_chunks.max(out_chunks) as i64;
    // Out of place, a work buffer the size of the shared view may be added.
    let slots_per_rank = total.saturating_add(in_chunks as i64 + out_chunks as i64 + view);
    if slots_per_rank.saturating_mul(p as i64) as u64 > limits.max_slots {
        return Err(Error::new(
            "collc::lower::limit",
            format!("{p} ranks x {slots_per_rank} chunk slots exceeds the limit of {} slots", limits.max_slots),
            "use fewer chunks or ranks, or raise the limit with --max-slots",
        )
        .at(chunks_span, "chunks declared here")
        .into());
    }
    Ok(Sizes { chunks: chunks as u32, pipeline: pipeline as u32, scratch })
}
