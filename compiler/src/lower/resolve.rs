//! Name resolution: turns AST expressions and statements into slot-indexed forms the evaluator runs fast.

use crate::diag::Error;
use crate::ir::{Buf, TransferKind};
use collc_grammar::ast::{self, BinOp, Expr, ExprKind, Span, Stmt, StmtKind, UnOp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Builtin {
    Min,
    Max,
    Abs,
    Log2,
    CLog2,
    Pow2,
}

impl Builtin {
    fn lookup(name: &str) -> Option<(Builtin, std::ops::RangeInclusive<usize>)> {
        Some(match name {
            "min" => (Builtin::Min, 1..=8),
            "max" => (Builtin::Max, 1..=8),
            "abs" => (Builtin::Abs, 1..=1),
            "log2" => (Builtin::Log2, 1..=1),
            "clog2" => (Builtin::CLog2, 1..=1),
            "pow2" => (Builtin::Pow2, 1..=1),
            _ => return None,
        })
    }
}

#[derive(Debug)]
pub(crate) enum RExpr {
    Const(i64, Span),
    Local(u32, Span),
    Global(u32, Span),
    Unary(UnOp, Box<RExpr>, Span),
    Binary(BinOp, Box<RExpr>, Box<RExpr>, Span),
    If(Box<RExpr>, Box<RExpr>, Box<RExpr>),
    Builtin(Builtin, Vec<RExpr>, Span),
    Call(u32, Vec<RExpr>, Span),
}

impl RExpr {
    pub fn span(&self) -> Span {
        match self {
            RExpr::Const(_, s) | RExpr::Local(_, s) | RExpr::Global(_, s) => *s,
            RExpr::Unary(_, _, s) | RExpr::Binary(_, _, _, s) | RExpr::Builtin(_, _, s) | RExpr::Call(_, _, s) => *s,
            RExpr::If(c, _, b) => Span { start: c.span().start, end: b.span().end },
        }
    }
}

#[derive(Debug)]
pub(crate) struct RFn {
    pub name: String,
    pub span: Span,
    pub frame_size: u32,
    pub body: RExpr,
}

#[derive(Debug)]
pub(crate) struct RBufRef {
    pub buf: Buf,
    pub start: RExpr,
    pub end: Option<RExpr>,
    pub span: Span,
}

#[derive(Debug)]
pub(crate) struct RTransfer {
    pub kind: TransferKind,
    pub src: RBufRef,
    /// `None` for a send without `as`: the destination is the source's buffer and index on the receiver.
    pub dst: Option<RBufRef>,
    pub from: RExpr,
    pub to: RExpr,
    pub channel: Option<RExpr>,
    pub span: Span,
    pub span_id: u32,
}

#[derive(Debug)]
pub(crate) enum RStmt {
    Let { slot: u32, value: RExpr },
    For { slot: u32, start: RExpr, end: RExpr, by: Option<RExpr>, body: Vec<RStmt> },
    If { cond: RExpr, then_body: Vec<RStmt>, else_body: Vec<RStmt> },
    Step { body: Vec<RStmt>, span: Span },
    Transfer(Box<RTransfer>),
}

/// Resolves names against the globals (parameters), the functions, the scratch buffers and local scopes.
pub(crate) struct Resolver<'a> {
    pub globals: &'a [String],
    pub fn_names: &'a [(String, usize)],
    pub scratch: &'a [String],
    scopes: Vec<Vec<(String, u32)>>,
    pub frame_size: u32,
    /// Spans of the transfer statements seen so far, indexed by `RTransfer::span_id`.
    pub spans: Vec<Span>,
}

type Result<T> = std::result::Result<T, Error>;

impl<'a> Resolver<'a> {
    pub fn new(globals: &'a [String], fn_names: &'a [(String, usize)], scratch: &'a [String]) -> Self {
        Resolver { globals, fn_names, scratch, scopes: vec![Vec::new()], frame_size: 0, spans: Vec::new() }
    }

    /// A resolver for a function body: its parameters are the first frame slots.
    pub fn for_fn(&self, params: &[ast::Ident]) -> Result<Resolver<'a>> {
        let mut inner = Resolver::new(self.globals, self.fn_names, self.scratch);
        for param in params {
            if inner.scopes[0].iter().any(|(n, _)| *n == param.name) {
                return Err(Error::new(
                    "collc::lower::name",
                    format!("parameter `{}` appears twice", param.name),
                    "rename one of them",
                )
                .at(param.span, "second use"));
            }
            inner.bind(&param.name);
        }
        Ok(inner)
    }

    fn intern(&mut self, span: Span) -> u32 {
        self.spans.push(span);
        (self.spans.len() - 1) as u32
    }

    fn bind(&mut self, name: &str) -> u32 {
        let slot = self.frame_size;
        self.frame_size += 1;
        self.scopes.last_mut().expect("a scope is always open").push((name.to_string(), slot));
        slot
    }

    fn lookup(&self, name: &str) -> Option<RExprRef> {
        for scope in self.scopes.iter().rev() {
            if let Some((_, slot)) = scope.iter().rev().find(|(n, _)| n == name) {
                return Some(RExprRef::Local(*slot));
            }
        }
        self.globals.iter().position(|g| g == name).map(|i| RExprRef::Global(i as u32))
    }

    fn names_in_scope(&self) -> String {
        let mut names: Vec<&str> = self.scopes.iter().flatten().map(|(n, _)| n.as_str()).collect();
        names.extend(self.globals.iter().map(String::as_str));
        names.sort();
        names.dedup();
        if names.is_empty() {
            "no names are in scope here".to_string()
        } else {
            format!("names in scope here: {}", names.join(", "))
        }
    }

    pub fn expr(&self, expr: &Expr) -> Result<RExpr> {
        let span = expr.span;
        Ok(match &expr.kind {
            ExprKind::Int(v) => RExpr::Const(*v, span),
            ExprKind::Float(v) => {
                return Err(Error::new(
                    "collc::lower::float",
                    format!("`{v:?}` is a fraction; an algorithm's expressions are integers"),
                    "only reduction operators (`op NAME(a, b) = ...`) take fractions",
                )
                .at(span, "not an integer"))
            }
            ExprKind::Var(name) => match self.lookup(name) {
                Some(RExprRef::Local(slot)) => RExpr::Local(slot, span),
                Some(RExprRef::Global(slot)) => RExpr::Global(slot, span),
                None => {
                    return Err(Error::new(
                        "collc::lower::name",
                        format!("unknown name `{name}`"),
                        self.names_in_scope(),
                    )
                    .at(span, "not defined"))
                }
            },
            ExprKind::Unary(op, e) => RExpr::Unary(*op, Box::new(self.expr(e)?), span),
            ExprKind::Binary(op, a, b) => RExpr::Binary(*op, Box::new(self.expr(a)?), Box::new(self.expr(b)?), span),
            ExprKind::If(c, a, b) => {
                RExpr::If(Box::new(self.expr(c)?), Box::new(self.expr(a)?), Box::new(self.expr(b)?))
            }
            ExprKind::Call(name, args) => self.call(name, args, span)?,
        })
    }

    fn call(&self, name: &ast::Ident, args: &[Expr], span: Span) -> Result<RExpr> {
        let resolved: Vec<RExpr> = args.iter().map(|a| self.expr(a)).collect::<Result<_>>()?;
        let arity_error = |expected: String| {
            Error::new(
                "collc::lower::call",
                format!("`{}` takes {expected} argument(s), but {} were given", name.name, args.len()),
                "fix the number of arguments",
            )
            .at(span, "this call")
        };
        if let Some((builtin, arity)) = Builtin::lookup(&name.name) {
            if !arity.contains(&args.len()) {
                return Err(arity_error(format!("{}..={}", arity.start(), arity.end())));
            }
            return Ok(RExpr::Builtin(builtin, resolved, span));
        }
        let Some(index) = self.fn_names.iter().position(|(n, _)| *n == name.name) else {
            let mut known: Vec<&str> = self.fn_names.iter().map(|(n, _)| n.as_str()).collect();
            known.extend(["min", "max", "abs", "log2", "clog2", "pow2"]);
            return Err(Error::new(
                "collc::lower::name",
                format!("unknown function `{}`", name.name),
                format!("functions here: {}", known.join(", ")),
            )
            .at(name.span, "not defined"));
        };
        if self.fn_names[index].1 != args.len() {
            return Err(arity_error(self.fn_names[index].1.to_string()));
        }
        Ok(RExpr::Call(index as u32, resolved, span))
    }

    pub fn block(&mut self, stmts: &[Stmt]) -> Result<Vec<RStmt>> {
        self.scopes.push(Vec::new());
        let result = stmts.iter().map(|s| self.stmt(s)).collect();
        self.scopes.pop();
        result
    }

    pub fn stmt(&mut self, stmt: &Stmt) -> Result<RStmt> {
        Ok(match &stmt.kind {
            StmtKind::Let { var, value } => {
                let value = self.expr(value)?;
                RStmt::Let { slot: self.bind(&var.name), value }
            }
            StmtKind::For { var, start, end, by, body } => {
                let (start, end) = (self.expr(start)?, self.expr(end)?);
                let by = by.as_ref().map(|b| self.expr(b)).transpose()?;
                self.scopes.push(Vec::new());
                let slot = self.bind(&var.name);
                let body = self.block(body);
                self.scopes.pop();
                RStmt::For { slot, start, end, by, body: body? }
            }
            StmtKind::If { cond, then_body, else_body } => RStmt::If {
                cond: self.expr(cond)?,
                then_body: self.block(then_body)?,
                else_body: match else_body {
                    Some(b) => self.block(b)?,
                    None => Vec::new(),
                },
            },
            StmtKind::Step { body } => RStmt::Step { body: self.block(body)?, span: stmt.span },
            StmtKind::Send { src, from, to, dst, reduce, channel } => RStmt::Transfer(Box::new(RTransfer {
                kind: TransferKind::Send { reduce: *reduce },
                src: self.buf_ref(src)?,
                dst: dst.as_ref().map(|d| self.buf_ref(d)).transpose()?,
                from: self.expr(from)?,
                to: self.expr(to)?,
                channel: channel.as_ref().map(|c| self.expr(c)).transpose()?,
                span: stmt.span,
                span_id: self.intern(stmt.span),
            })),
            StmtKind::Copy { src, dst, on } | StmtKind::Reduce { src, dst, on } => {
                let kind =
                    if matches!(stmt.kind, StmtKind::Copy { .. }) { TransferKind::Copy } else { TransferKind::Reduce };
                RStmt::Transfer(Box::new(RTransfer {
                    kind,
                    src: self.buf_ref(src)?,
                    dst: Some(self.buf_ref(dst)?),
                    from: self.expr(on)?,
                    to: self.expr(on)?,
                    channel: None,
                    span: stmt.span,
                    span_id: self.intern(stmt.span),
                }))
            }
        })
    }

    fn buf_ref(&self, r: &ast::BufRef) -> Result<RBufRef> {
        let buf = match r.buf.name.as_str() {
            "in" => Buf::In,
            "out" => Buf::Out,
            name => match self.scratch.iter().position(|s| s == name) {
                // `bind` allowed at most 252 scratch declarations.
                Some(i) => Buf::Scratch(i as u8),
                None => {
                    let mut known = vec!["in".to_string(), "out".to_string()];
                    known.extend(self.scratch.iter().cloned());
                    return Err(Error::new(
                        "collc::lower::name",
                        format!("unknown buffer `{name}`"),
                        format!("buffers here: {}; declare others with `scratch {name}[SIZE]`", known.join(", ")),
                    )
                    .at(r.buf.span, "not a buffer"));
                }
            },
        };
        Ok(RBufRef {
            buf,
            start: self.expr(&r.start)?,
            end: r.end.as_ref().map(|e| self.expr(e)).transpose()?,
            span: r.span,
        })
    }
}

enum RExprRef {
    Local(u32),
    Global(u32),
}
