//! The spanned abstract syntax tree of a `.coll` file. Every node carries the byte span of its source text.

use serde::Serialize;
use std::fmt;

/// A byte range in the source file: `start..end`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn new(start: usize, end: usize) -> Self {
        Span { start: start as u32, end: end as u32 }
    }

    pub fn len(self) -> usize {
        self.end.saturating_sub(self.start) as usize
    }

    pub fn is_empty(self) -> bool {
        self.start == self.end
    }
}

impl From<Span> for miette::SourceSpan {
    fn from(span: Span) -> Self {
        (span.start as usize, span.len()).into()
    }
}

/// A name as written, with where it was written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// A parsed file: one algorithm, the reduction operators and doc comments before it.
#[derive(Clone, Debug, Serialize)]
pub struct File {
    pub doc: Vec<String>,
    pub ops: Vec<OpDef>,
    pub algorithm: Algorithm,
}

/// `op name(a, b) = body`: an elementwise reduction operator.
#[derive(Clone, Debug, Serialize)]
pub struct OpDef {
    pub doc: Vec<String>,
    pub name: Ident,
    pub operands: [Ident; 2],
    pub body: Expr,
    pub span: Span,
}

/// `algorithm NAME for COLLECTIVE { items }`
#[derive(Clone, Debug, Serialize)]
pub struct Algorithm {
    pub name: Ident,
    pub collective: Ident,
    pub items: Vec<Item>,
    pub span: Span,
}

/// A top-level item of an algorithm body. (An AST is built once per file; boxing the large variants buys nothing.)
#[derive(Clone, Debug, Serialize)]
#[allow(clippy::large_enum_variant)]
pub enum Item {
    /// `ranks p [where c]`
    Ranks { var: Ident, constraint: Option<Expr>, span: Span },
    /// `nodes n local g [where c]`
    Nodes { nodes: Ident, local: Ident, constraint: Option<Expr>, span: Span },
    /// `root r [where c]`
    Root { var: Ident, constraint: Option<Expr>, span: Span },
    /// `peer d [where c]`
    Peer { var: Ident, constraint: Option<Expr>, span: Span },
    /// `param k = default [where c]`
    Param { var: Ident, default: Expr, constraint: Option<Expr>, span: Span },
    /// `where c`
    Where { cond: Expr, span: Span },
    /// `chunks C`
    Chunks { count: Expr, span: Span },
    /// `pipeline K`: the default slice count of the pipelining pass
    Pipeline { slices: Expr, span: Span },
    /// `scratch name[size]`
    Scratch { name: Ident, size: Expr, span: Span },
    /// `fn name(params) = body`
    Fn(FnDef),
    /// A statement at the top level.
    Stmt(Stmt),
}

/// `fn name(a, b) = body`: a pure integer function; may call itself.
#[derive(Clone, Debug, Serialize)]
pub struct FnDef {
    pub doc: Vec<String>,
    pub name: Ident,
    pub params: Vec<Ident>,
    pub body: Expr,
    pub span: Span,
}

#[derive(Clone, Debug, Serialize)]
pub struct Stmt {
    pub kind: StmtKind,
    pub span: Span,
}

#[derive(Clone, Debug, Serialize)]
pub enum StmtKind {
    Let { var: Ident, value: Expr },
    For { var: Ident, start: Expr, end: Expr, by: Option<Expr>, body: Vec<Stmt> },
    If { cond: Expr, then_body: Vec<Stmt>, else_body: Option<Vec<Stmt>> },
    Step { body: Vec<Stmt> },
    Send { src: BufRef, from: Expr, to: Expr, dst: Option<BufRef>, reduce: bool, channel: Option<Expr> },
    Copy { src: BufRef, dst: BufRef, on: Expr },
    Reduce { src: BufRef, dst: BufRef, on: Expr },
}

/// `buf[start]` or `buf[start..end]`.
#[derive(Clone, Debug, Serialize)]
pub struct BufRef {
    pub buf: Ident,
    pub start: Expr,
    pub end: Option<Expr>,
    pub span: Span,
}

#[derive(Clone, Debug, Serialize)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, Serialize)]
pub enum ExprKind {
    Int(i64),
    /// A literal with a fraction or exponent: only reduction operators take one.
    Float(f64),
    Var(String),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Call(Ident, Vec<Expr>),
    If(Box<Expr>, Box<Expr>, Box<Expr>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum UnOp {
    Neg,
    Not,
    BitNot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum BinOp {
    Or,
    And,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    BitOr,
    BitXor,
    BitAnd,
    Shl,
    Shr,
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Pow,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        use BinOp::*;
        match self {
            Or => "||",
            And => "&&",
            Eq => "==",
            Ne => "!=",
            Lt => "<",
            Le => "<=",
            Gt => ">",
            Ge => ">=",
            BitOr => "|",
            BitXor => "^",
            BitAnd => "&",
            Shl => "<<",
            Shr => ">>",
            Add => "+",
            Sub => "-",
            Mul => "*",
            Div => "/",
            Rem => "%",
            Pow => "**",
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ExprKind::Int(v) => write!(f, "{v}"),
            ExprKind::Float(v) => write!(f, "{v:?}"),
            ExprKind::Var(name) => f.write_str(name),
            ExprKind::Unary(op, e) => {
                let sym = match op {
                    UnOp::Neg => "-",
                    UnOp::Not => "!",
                    UnOp::BitNot => "~",
                };
                write!(f, "{sym}{e}")
            }
            ExprKind::Binary(op, a, b) => write!(f, "({a} {} {b})", op.symbol()),
            ExprKind::Call(name, args) => {
                write!(f, "{}(", name.name)?;
                for (i, arg) in args.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{arg}")?;
                }
                f.write_str(")")
            }
            ExprKind::If(c, a, b) => write!(f, "if {c} {{ {a} }} else {{ {b} }}"),
        }
    }
}
