//! Turns source text into the spanned AST. The only file that sees pest's `Rule`.

use crate::ast::*;
use crate::error::{Limits, SyntaxError};
use pest::iterators::Pair;
use pest::pratt_parser::{Assoc, Op, PrattParser};
use pest::Parser;
use std::sync::OnceLock;

#[derive(pest_derive::Parser)]
#[grammar = "coll.pest"]
struct CollParser;

type Result<T> = std::result::Result<T, SyntaxError>;

/// Parses one `.coll` file. Bounded in time and memory by `limits` (source size, nesting depth).
pub fn parse(source: &str, limits: &Limits) -> Result<File> {
    check_limits(source, limits)?;
    let mut pairs = CollParser::parse(Rule::file, source).map_err(|e| from_pest(e, source))?;
    let file = pairs.next().expect("pest returns the `file` rule it was asked for");
    let mut doc = Vec::new();
    let mut ops = Vec::new();
    let mut algorithm = None;
    for pair in file.into_inner() {
        match pair.as_rule() {
            Rule::doc => doc.push(doc_text(&pair)),
            Rule::op_def => ops.push(build_op(pair, std::mem::take(&mut doc), limits)?),
            Rule::algorithm => algorithm = Some(build_algorithm(pair, limits)?),
            _ => {}
        }
    }
    let algorithm = algorithm.expect("the grammar requires exactly one algorithm");
    Ok(File { doc, ops, algorithm })
}

/// Parses a file of reduction operators only (`op NAME(a, b) = EXPR`, with doc comments).
pub fn parse_ops(source: &str, limits: &Limits) -> Result<Vec<OpDef>> {
    check_limits(source, limits)?;
    let mut pairs = CollParser::parse(Rule::ops_file, source).map_err(|e| from_pest(e, source))?;
    let file = pairs.next().expect("pest returns the `ops_file` rule it was asked for");
    let mut doc = Vec::new();
    let mut ops = Vec::new();
    for pair in file.into_inner() {
        match pair.as_rule() {
            Rule::doc => doc.push(doc_text(&pair)),
            Rule::op_def => ops.push(build_op(pair, std::mem::take(&mut doc), limits)?),
            _ => {}
        }
    }
    Ok(ops)
}

fn build_op(pair: Pair<Rule>, doc: Vec<String>, limits: &Limits) -> Result<OpDef> {
    let span = span_of(&pair);
    let mut inner = pair.into_inner().filter(|p| !is_keyword(p.as_rule()));
    let mut next = || inner.next().expect("op_def's parts");
    let (name, a, b) = (ident(next()), ident(next()), ident(next()));
    let body = build_expr(next(), limits)?;
    Ok(OpDef { doc, name, operands: [a, b], body, span })
}

/// Rejects inputs whose size or nesting would make parsing slow or recursion deep, before pest sees them.
fn check_limits(source: &str, limits: &Limits) -> Result<()> {
    if source.len() > limits.max_source_bytes {
        return Err(SyntaxError::new(
            format!("the file is {} bytes; the limit is {}", source.len(), limits.max_source_bytes),
            Span::new(0, 0),
            "split the algorithm or raise the limit with --max-source-bytes",
        ));
    }
    let (mut depth, mut ifs) = (0usize, 0usize);
    for (at, byte) in source.bytes().enumerate() {
        match byte {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if source.as_bytes()[at..].starts_with(b"if") {
            ifs += 1;
        }
        if depth > limits.max_nesting || ifs > limits.max_ifs {
            return Err(SyntaxError::new(
                format!(
                    "nesting is deeper than the limit of {} brackets or {} `if`s",
                    limits.max_nesting, limits.max_ifs
                ),
                Span::new(at, at + 1),
                "flatten the expression or move parts of it into a `fn`",
            ));
        }
    }
    Ok(())
}

/// A node's span without the whitespace and comments pest lets a rule swallow at its end.
fn span_of(pair: &Pair<Rule>) -> Span {
    let s = pair.as_span();
    Span::new(s.start(), s.start() + trimmed_len(pair.as_str()))
}

fn trimmed_len(text: &str) -> usize {
    let mut end = text.len();
    loop {
        let body = text[..end].trim_end();
        let line_start = body.rfind('\n').map_or(0, |i| i + 1);
        let line = &body[line_start..];
        match line.find('#') {
            Some(hash) if line.trim_start().starts_with('#') || hash > 0 => end = line_start + hash,
            _ => return body.len(),
        }
        if end == 0 {
            return 0;
        }
    }
}

fn doc_text(pair: &Pair<Rule>) -> String {
    pair.as_str().trim_start_matches('#').trim().to_string()
}

fn ident(pair: Pair<Rule>) -> Ident {
    Ident { name: pair.as_str().to_string(), span: span_of(&pair) }
}

fn is_keyword(rule: Rule) -> bool {
    use Rule::*;
    matches!(
        rule,
        k_algorithm
            | k_for
            | k_ranks
            | k_nodes
            | k_local
            | k_root
            | k_peer
            | k_param
            | k_where
            | k_chunks
            | k_pipeline
            | k_scratch
            | k_let
            | k_fn
            | k_in
            | k_step
            | k_if
            | k_else
            | k_send
            | k_from
            | k_to
            | k_as
            | k_reduce
            | k_copy
            | k_into
            | k_on
            | k_channel
            | k_by
            | k_op
    )
}

/// The children of a node without its keywords, each tagged with the keyword that preceded it.
fn parts(pair: Pair<Rule>) -> Vec<(Option<Rule>, Pair<Rule>)> {
    let mut out = Vec::new();
    let mut last_keyword = None;
    for child in pair.into_inner() {
        if is_keyword(child.as_rule()) {
            last_keyword = Some(child.as_rule());
            if child.as_rule() == Rule::k_reduce {
                out.push((last_keyword, child));
            }
        } else {
            out.push((last_keyword, child));
        }
    }
    out
}

fn build_algorithm(pair: Pair<Rule>, limits: &Limits) -> Result<Algorithm> {
    let span = span_of(&pair);
    let mut inner = pair.into_inner().filter(|p| !is_keyword(p.as_rule()));
    let name = ident(inner.next().expect("algorithm name"));
    let collective = ident(inner.next().expect("collective name"));
    let mut items = Vec::new();
    let mut pending_doc = Vec::new();
    for pair in inner {
        if pair.as_rule() == Rule::doc {
            pending_doc.push(doc_text(&pair));
            continue;
        }
        items.push(build_item(pair, std::mem::take(&mut pending_doc), limits)?);
    }
    Ok(Algorithm { name, collective, items, span })
}

fn optional_constraint(
    parts: &mut std::vec::IntoIter<(Option<Rule>, Pair<Rule>)>,
    limits: &Limits,
) -> Result<Option<Expr>> {
    parts.next().map(|(_, p)| build_expr(p, limits)).transpose()
}

fn build_item(pair: Pair<Rule>, doc: Vec<String>, limits: &Limits) -> Result<Item> {
    let span = span_of(&pair);
    let rule = pair.as_rule();
    if rule == Rule::stmt {
        return Ok(Item::Stmt(build_stmt(pair, limits)?));
    }
    let mut parts = parts(pair).into_iter();
    let mut next = || parts.next().expect("grammar guarantees this part").1;
    Ok(match rule {
        Rule::ranks_decl => {
            let var = ident(next());
            Item::Ranks { var, constraint: optional_constraint(&mut parts, limits)?, span }
        }
        Rule::nodes_decl => {
            let nodes = ident(next());
            let local = ident(next());
            Item::Nodes { nodes, local, constraint: optional_constraint(&mut parts, limits)?, span }
        }
        Rule::root_decl => {
            let var = ident(next());
            Item::Root { var, constraint: optional_constraint(&mut parts, limits)?, span }
        }
        Rule::peer_decl => {
            let var = ident(next());
            Item::Peer { var, constraint: optional_constraint(&mut parts, limits)?, span }
        }
        Rule::param_decl => {
            let var = ident(next());
            let default = build_expr(next(), limits)?;
            Item::Param { var, default, constraint: optional_constraint(&mut parts, limits)?, span }
        }
        Rule::where_decl => Item::Where { cond: build_expr(next(), limits)?, span },
        Rule::chunks_decl => Item::Chunks { count: build_expr(next(), limits)?, span },
        Rule::pipeline_decl => Item::Pipeline { slices: build_expr(next(), limits)?, span },
        Rule::scratch_decl => {
            let name = ident(next());
            Item::Scratch { name, size: build_expr(next(), limits)?, span }
        }
        Rule::fn_def => {
            let mut all: Vec<Pair<Rule>> = std::iter::once(next()).chain(parts.map(|(_, p)| p)).collect();
            let body = build_expr(all.pop().expect("fn body"), limits)?;
            let mut idents = all.into_iter().map(ident);
            let name = idents.next().expect("fn name");
            Item::Fn(FnDef { doc, name, params: idents.collect(), body, span })
        }
        other => unreachable!("item rule {other:?} is not in the grammar's item list"),
    })
}

fn build_block(pair: Pair<Rule>, limits: &Limits) -> Result<Vec<Stmt>> {
    pair.into_inner().filter(|p| p.as_rule() == Rule::stmt).map(|p| build_stmt(p, limits)).collect()
}

fn build_stmt(pair: Pair<Rule>, limits: &Limits) -> Result<Stmt> {
    let inner = pair.into_inner().next().expect("stmt has one child");
    let span = span_of(&inner);
    let rule = inner.as_rule();
    let mut parts = parts(inner).into_iter().peekable();
    let kind = match rule {
        Rule::let_stmt => {
            let var = ident(parts.next().expect("let name").1);
            StmtKind::Let { var, value: build_expr(parts.next().expect("let value").1, limits)? }
        }
        Rule::for_stmt => {
            let var = ident(parts.next().expect("for var").1);
            let start = build_expr(parts.next().expect("for start").1, limits)?;
            let end = build_expr(parts.next().expect("for end").1, limits)?;
            let (keyword, next) = parts.next().expect("for body or step");
            let (by, body) = if keyword == Some(Rule::k_by) && next.as_rule() == Rule::expr {
                (Some(build_expr(next, limits)?), parts.next().expect("for body").1)
            } else {
                (None, next)
            };
            StmtKind::For { var, start, end, by, body: build_block(body, limits)? }
        }
        Rule::if_stmt => {
            let cond = build_expr(parts.next().expect("if cond").1, limits)?;
            let then_body = build_block(parts.next().expect("if body").1, limits)?;
            let else_body = match parts.next() {
                None => None,
                Some((_, p)) if p.as_rule() == Rule::if_stmt => {
                    let wrapped = build_stmt_from_if(p, limits)?;
                    Some(vec![wrapped])
                }
                Some((_, p)) => Some(build_block(p, limits)?),
            };
            StmtKind::If { cond, then_body, else_body }
        }
        Rule::step_stmt => StmtKind::Step { body: build_block(parts.next().expect("step body").1, limits)? },
        Rule::send_stmt => build_send(parts.collect(), limits)?,
        Rule::copy_stmt | Rule::reduce_stmt => {
            let mut parts = parts.filter(|(_, p)| p.as_rule() != Rule::k_reduce);
            let src = build_buf_ref(parts.next().expect("source").1, limits)?;
            let dst = build_buf_ref(parts.next().expect("destination").1, limits)?;
            let on = build_expr(parts.next().expect("rank").1, limits)?;
            if rule == Rule::copy_stmt {
                StmtKind::Copy { src, dst, on }
            } else {
                StmtKind::Reduce { src, dst, on }
            }
        }
        other => unreachable!("statement rule {other:?} is not in the grammar's stmt list"),
    };
    Ok(Stmt { kind, span })
}

/// `else if` chains nest: the inner `if_stmt` pair is not wrapped in a `stmt`, so build it here.
fn build_stmt_from_if(pair: Pair<Rule>, limits: &Limits) -> Result<Stmt> {
    let span = span_of(&pair);
    let mut parts = parts(pair).into_iter();
    let cond = build_expr(parts.next().expect("if cond").1, limits)?;
    let then_body = build_block(parts.next().expect("if body").1, limits)?;
    let else_body = match parts.next() {
        None => None,
        Some((_, p)) if p.as_rule() == Rule::if_stmt => Some(vec![build_stmt_from_if(p, limits)?]),
        Some((_, p)) => Some(build_block(p, limits)?),
    };
    Ok(Stmt { kind: StmtKind::If { cond, then_body, else_body }, span })
}

fn build_send(parts: Vec<(Option<Rule>, Pair<Rule>)>, limits: &Limits) -> Result<StmtKind> {
    let mut src = None;
    let (mut from, mut to, mut dst, mut channel, mut reduce) = (None, None, None, None, false);
    for (keyword, pair) in parts {
        match (keyword, pair.as_rule()) {
            (_, Rule::k_reduce) => reduce = true,
            (Some(Rule::k_send), _) => src = Some(build_buf_ref(pair, limits)?),
            (Some(Rule::k_from), _) => from = Some(build_expr(pair, limits)?),
            (Some(Rule::k_to), _) => to = Some(build_expr(pair, limits)?),
            (Some(Rule::k_as), _) => dst = Some(build_buf_ref(pair, limits)?),
            (Some(Rule::k_channel), _) => channel = Some(build_expr(pair, limits)?),
            (k, r) => unreachable!("send part {r:?} after {k:?}"),
        }
    }
    Ok(StmtKind::Send {
        src: src.expect("send source"),
        from: from.expect("send from"),
        to: to.expect("send to"),
        dst,
        reduce,
        channel,
    })
}

fn build_buf_ref(pair: Pair<Rule>, limits: &Limits) -> Result<BufRef> {
    let span = span_of(&pair);
    let mut inner = pair.into_inner();
    let buf = ident(inner.next().expect("buffer name"));
    let start = build_expr(inner.next().expect("chunk index"), limits)?;
    let end = inner.next().map(|p| build_expr(p, limits)).transpose()?;
    Ok(BufRef { buf, start, end, span })
}

fn pratt() -> &'static PrattParser<Rule> {
    static PRATT: OnceLock<PrattParser<Rule>> = OnceLock::new();
    PRATT.get_or_init(|| {
        PrattParser::new()
            .op(Op::infix(Rule::or, Assoc::Left))
            .op(Op::infix(Rule::and, Assoc::Left))
            .op(Op::infix(Rule::eq, Assoc::Left)
                | Op::infix(Rule::ne, Assoc::Left)
                | Op::infix(Rule::lt, Assoc::Left)
                | Op::infix(Rule::le, Assoc::Left)
                | Op::infix(Rule::gt, Assoc::Left)
                | Op::infix(Rule::ge, Assoc::Left))
            .op(Op::infix(Rule::bor, Assoc::Left))
            .op(Op::infix(Rule::bxor, Assoc::Left))
            .op(Op::infix(Rule::band, Assoc::Left))
            .op(Op::infix(Rule::shl, Assoc::Left) | Op::infix(Rule::shr, Assoc::Left))
            .op(Op::infix(Rule::add, Assoc::Left) | Op::infix(Rule::sub, Assoc::Left))
            .op(Op::infix(Rule::mul, Assoc::Left)
                | Op::infix(Rule::div, Assoc::Left)
                | Op::infix(Rule::rem, Assoc::Left))
            .op(Op::infix(Rule::pow, Assoc::Right))
            .op(Op::prefix(Rule::neg) | Op::prefix(Rule::not) | Op::prefix(Rule::bnot))
    })
}

/// An expression node, rejected when it nests deeper than the limit (deep trees overflow the stack later).
fn node(kind: ExprKind, span: Span, depth: usize, limits: &Limits) -> Result<(Expr, usize)> {
    if depth > limits.max_expr_depth {
        return Err(SyntaxError::new(
            format!("this expression nests {depth} operators deep; the limit is {}", limits.max_expr_depth),
            span,
            "split it with `let` or a `fn`",
        ));
    }
    Ok((Expr { kind, span }, depth))
}

fn build_expr(pair: Pair<Rule>, limits: &Limits) -> Result<Expr> {
    build_expr_depth(pair, limits).map(|(e, _)| e)
}

fn build_expr_depth(pair: Pair<Rule>, limits: &Limits) -> Result<(Expr, usize)> {
    pratt()
        .map_primary(|p| build_primary(p, limits))
        .map_prefix(|op, rhs| {
            let (rhs, d) = rhs?;
            let unop = match op.as_rule() {
                Rule::neg => UnOp::Neg,
                Rule::not => UnOp::Not,
                _ => UnOp::BitNot,
            };
            let span = Span::new(op.as_span().start(), rhs.span.end as usize);
            node(ExprKind::Unary(unop, Box::new(rhs)), span, d + 1, limits)
        })
        .map_infix(|lhs, op, rhs| {
            let ((lhs, dl), (rhs, dr)) = (lhs?, rhs?);
            let span = Span::new(lhs.span.start as usize, rhs.span.end as usize);
            let kind = ExprKind::Binary(binop(op.as_rule()), Box::new(lhs), Box::new(rhs));
            node(kind, span, dl.max(dr) + 1, limits)
        })
        .parse(pair.into_inner())
}

fn binop(rule: Rule) -> BinOp {
    use BinOp::*;
    match rule {
        Rule::or => Or,
        Rule::and => And,
        Rule::eq => Eq,
        Rule::ne => Ne,
        Rule::lt => Lt,
        Rule::le => Le,
        Rule::gt => Gt,
        Rule::ge => Ge,
        Rule::bor => BitOr,
        Rule::bxor => BitXor,
        Rule::band => BitAnd,
        Rule::shl => Shl,
        Rule::shr => Shr,
        Rule::add => Add,
        Rule::sub => Sub,
        Rule::mul => Mul,
        Rule::div => Div,
        Rule::rem => Rem,
        Rule::pow => Pow,
        other => unreachable!("{other:?} is not an infix operator"),
    }
}

fn build_primary(pair: Pair<Rule>, limits: &Limits) -> Result<(Expr, usize)> {
    let span = span_of(&pair);
    match pair.as_rule() {
        Rule::int => Ok((Expr { kind: ExprKind::Int(parse_int(pair.as_str(), span)?), span }, 1)),
        Rule::float => {
            let value = pair.as_str().parse::<f64>().expect("the grammar's float is Rust's");
            Ok((Expr { kind: ExprKind::Float(value), span }, 1))
        }
        Rule::boolean => Ok((Expr { kind: ExprKind::Int((pair.as_str() == "true") as i64), span }, 1)),
        Rule::ident => Ok((Expr { kind: ExprKind::Var(pair.as_str().to_string()), span }, 1)),
        Rule::expr => build_expr_depth(pair, limits),
        Rule::call => {
            let mut inner = pair.into_inner();
            let name = ident(inner.next().expect("callee"));
            let mut depth = 0;
            let mut args = Vec::new();
            for arg in inner {
                let (e, d) = build_expr_depth(arg, limits)?;
                depth = depth.max(d);
                args.push(e);
            }
            node(ExprKind::Call(name, args), span, depth + 1, limits)
        }
        Rule::if_expr => {
            let mut depth = 0;
            let mut operands = Vec::new();
            for part in pair.into_inner().filter(|p| !is_keyword(p.as_rule())) {
                let (e, d) = build_primary(part, limits)?;
                depth = depth.max(d);
                operands.push(Box::new(e));
            }
            let [c, a, b]: [Box<Expr>; 3] = operands.try_into().expect("if expression has three operands");
            node(ExprKind::If(c, a, b), span, depth + 1, limits)
        }
        other => unreachable!("{other:?} is not a primary expression"),
    }
}

fn parse_int(text: &str, span: Span) -> Result<i64> {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => i64::from_str_radix(hex, 16),
        None => text.replace('_', "").parse::<i64>(),
    };
    parsed.map_err(|_| {
        SyntaxError::new(
            format!("the integer `{text}` does not fit in 64 bits"),
            span,
            "integers are signed 64-bit: at most 9223372036854775807",
        )
    })
}

/// The human name of a rule, for "expected ..." messages.
fn rule_name(rule: &Rule) -> String {
    use Rule::*;
    let name = match rule {
        EOI => "end of file",
        file => "`algorithm NAME for COLLECTIVE { ... }`",
        ops_file | op_def | k_op => "an operator `op NAME(a, b) = EXPR`",
        doc => "a `##` doc comment",
        ident | buf_name => "a name",
        collective_name => "a collective name (allreduce, reducescatter, allgather, broadcast, reduce, gather, scatter, alltoall, sendrecv)",
        algorithm | k_algorithm => "`algorithm NAME for COLLECTIVE { ... }`",
        item | ranks_decl | nodes_decl | root_decl | peer_decl | param_decl | where_decl | chunks_decl
        | pipeline_decl | scratch_decl | fn_def => {
            "a declaration (ranks, root, param, where, chunks, pipeline, scratch, fn) or a statement"
        }
        stmt | let_stmt | for_stmt | if_stmt | step_stmt | send_stmt | copy_stmt | reduce_stmt => {
            "a statement (let, for, if, step, send, copy, reduce)"
        }
        block => "a `{` block",
        buf_ref => "a buffer reference like `in[i]` or `out[a..b]`",
        expr | primary | if_expr | call | int | float | exponent | boolean => "an expression",
        or | and | eq | ne | le | ge | lt | gt | shl | shr | bor | bxor | band | add | sub | pow | mul | div | rem => {
            "an operator"
        }
        neg | not | bnot => "an expression",
        k_for => "`for`",
        k_ranks => "`ranks`",
        k_nodes => "`nodes`",
        k_local => "`local`",
        k_root => "`root`",
        k_peer => "`peer`",
        k_param => "`param`",
        k_where => "`where`",
        k_chunks => "`chunks`",
        k_pipeline => "`pipeline`",
        k_scratch => "`scratch`",
        k_let => "`let`",
        k_fn => "`fn`",
        k_in => "`in`",
        k_step => "`step`",
        k_if => "`if`",
        k_else => "`else`",
        k_send => "`send`",
        k_from => "`from`",
        k_to => "`to`",
        k_as => "`as`",
        k_reduce => "`reduce`",
        k_copy => "`copy`",
        k_into => "`into`",
        k_on => "`on`",
        k_channel => "`channel`",
        k_by => "`by`",
        other => return format!("{other:?}"),
    };
    name.to_string()
}

fn from_pest(err: pest::error::Error<Rule>, source: &str) -> SyntaxError {
    let source_len = source.len();
    let at = match err.location {
        pest::error::InputLocation::Pos(p) => p,
        pest::error::InputLocation::Span((s, _)) => s,
    };
    let message = match &err.variant {
        pest::error::ErrorVariant::ParsingError { positives, .. } if !positives.is_empty() => {
            let mut names: Vec<String> = positives.iter().map(rule_name).collect();
            names.sort();
            names.dedup();
            format!("expected {}", names.join(" or "))
        }
        pest::error::ErrorVariant::ParsingError { .. } => "unexpected input".to_string(),
        pest::error::ErrorVariant::CustomError { message } => message.clone(),
    };
    // Habits from other languages get a help line of their own.
    let help = match source.as_bytes().get(at) {
        Some(b';') => {
            "`.coll` has no `;`: a statement ends where the next one starts with its keyword (docs/language.md)"
        }
        _ => "see docs/language.md for the grammar; every statement starts with a keyword",
    };
    SyntaxError::new(message, Span::new(at.min(source_len), (at + 1).min(source_len)), help)
}
