//! Reduction operators users define (`op absmax(a, b) = max(abs(a), abs(b))` in a `.coll` file): the expression,
//! its type check against a call's data type, the reference evaluation every compiled form is tested against, and
//! the check of the two properties an algorithm that reorders a reduction relies on.
//!
//! Types: `elem` (the call's data type, what `a`, `b` and the result are), `f32`, `f64`, `i64` and `bool`. Literals
//! take the type their context asks for (a fraction only where that is a float type); everything else converts only
//! by a cast (`f32(a)`, `elem(x)`). Arithmetic is the built-in operators' (`crate::element`): integers wrap, `f16`
//! and `bf16` compute each operation in `f32` and round back, `min`/`max` of floats lose a NaN to a number and order
//! -0 below +0. Integer `/` and `%` by zero give 0 (no trap: every executor computes the same). A float cast to an
//! integer saturates, NaN giving 0 (Rust's `as`).

use std::fmt;

use half::{bf16, f16};
use thiserror::Error;

use crate::DataType;

mod device;
mod native;
mod registry;

pub use device::cuda_source;
pub use native::{Native, NativeKernel};
pub use registry::{Prepared, RegistryFull, UserOp};

/// Where a node was written: a byte range of its source.
pub type At = (u32, u32);

/// An operator's body: an expression over its two operands.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub kind: Kind,
    pub at: At,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// The first operand (the accumulated value) and the second.
    A,
    B,
    Int(i128),
    Float(f64),
    Bool(bool),
    Unary(Unary, Box<Node>),
    Binary(Binary, Box<Node>, Box<Node>),
    /// `if c { x } else { y }`
    Select(Box<Node>, Box<Node>, Box<Node>),
    Cast(Ty, Box<Node>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    Neg,
    Abs,
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Min,
    Max,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    And,
    Or,
}

/// The types an operator's expressions have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    Elem,
    F32,
    F64,
    I64,
    Bool,
}

impl Ty {
    /// The name a cast to the type is written with (`bool` has none).
    pub fn name(self) -> &'static str {
        match self {
            Ty::Elem => "elem",
            Ty::F32 => "f32",
            Ty::F64 => "f64",
            Ty::I64 => "i64",
            Ty::Bool => "bool",
        }
    }

    /// The cast's name in the language (`f32(x)`), or `None`.
    pub fn from_cast(name: &str) -> Option<Ty> {
        match name {
            "elem" => Some(Ty::Elem),
            "f32" => Some(Ty::F32),
            "f64" => Some(Ty::F64),
            "i64" => Some(Ty::I64),
            _ => None,
        }
    }
}

/// A user's operator: its name, and its body over `a` and `b`.
#[derive(Clone, Debug, PartialEq)]
pub struct Operator {
    pub name: String,
    pub body: Node,
}

impl Operator {
    /// A hash of the name and the body as printed (spans left out): equal for one operator written in two files,
    /// and the same in every process (FNV-1a), so ranks can compare operators by it.
    pub fn digest(&self) -> u64 {
        let text = format!("{}(a, b) = {}", self.name, self.body);
        text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, byte| (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
    }
}

impl fmt::Display for Node {
    /// The body fully parenthesised, in the language's syntax.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::A => f.write_str("a"),
            Kind::B => f.write_str("b"),
            Kind::Int(v) => write!(f, "{v}"),
            Kind::Float(v) => write!(f, "{v:?}"),
            Kind::Bool(v) => write!(f, "{v}"),
            Kind::Unary(Unary::Neg, e) => write!(f, "(-{e})"),
            Kind::Unary(Unary::Not, e) => write!(f, "(!{e})"),
            Kind::Unary(Unary::Abs, e) => write!(f, "abs({e})"),
            Kind::Binary(op @ (Binary::Min | Binary::Max), l, r) => {
                write!(f, "{}({l}, {r})", if *op == Binary::Min { "min" } else { "max" })
            }
            Kind::Binary(op, l, r) => write!(f, "({l} {} {r})", op.symbol()),
            Kind::Select(c, x, y) => write!(f, "(if {c} {{ {x} }} else {{ {y} }})"),
            Kind::Cast(ty, e) => write!(f, "{}({e})", ty.name()),
        }
    }
}

impl Binary {
    fn symbol(self) -> &'static str {
        match self {
            Binary::Add => "+",
            Binary::Sub => "-",
            Binary::Mul => "*",
            Binary::Div => "/",
            Binary::Rem => "%",
            Binary::Min => "min",
            Binary::Max => "max",
            Binary::Lt => "<",
            Binary::Le => "<=",
            Binary::Gt => ">",
            Binary::Ge => ">=",
            Binary::Eq => "==",
            Binary::Ne => "!=",
            Binary::And => "&&",
            Binary::Or => "||",
        }
    }
}

/// Why an operator does not type for a data type, and where.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct TypeError {
    pub message: String,
    pub at: At,
    pub help: Option<String>,
}

/// What a type is for one data type: how values of it are stored and computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rep {
    Int { bits: u32, signed: bool },
    F16,
    Bf16,
    F32,
    F64,
    Bool,
}

fn rep(ty: Ty, dtype: DataType) -> Rep {
    match ty {
        Ty::F32 => Rep::F32,
        Ty::F64 => Rep::F64,
        Ty::I64 => Rep::Int { bits: 64, signed: true },
        Ty::Bool => Rep::Bool,
        Ty::Elem => match dtype {
            DataType::I8 => Rep::Int { bits: 8, signed: true },
            DataType::U8 => Rep::Int { bits: 8, signed: false },
            DataType::I32 => Rep::Int { bits: 32, signed: true },
            DataType::U32 => Rep::Int { bits: 32, signed: false },
            DataType::I64 => Rep::Int { bits: 64, signed: true },
            DataType::U64 => Rep::Int { bits: 64, signed: false },
            DataType::F16 => Rep::F16,
            DataType::Bf16 => Rep::Bf16,
            DataType::F32 => Rep::F32,
            DataType::F64 => Rep::F64,
        },
    }
}

fn is_float(rep: Rep) -> bool {
    matches!(rep, Rep::F16 | Rep::Bf16 | Rep::F32 | Rep::F64)
}

/// An operator checked for one data type: its body with every node's type, literals already in theirs.
#[derive(Clone, Debug)]
pub struct Typed {
    pub name: String,
    pub dtype: DataType,
    body: TNode,
}

/// A node of a checked body and its type.
#[derive(Clone, Debug)]
struct TNode {
    kind: TKind,
    ty: Ty,
}

#[derive(Clone, Debug)]
enum TKind {
    A,
    B,
    Lit(Val),
    Unary(Unary, Box<TNode>),
    Binary(Binary, Box<TNode>, Box<TNode>),
    Select(Box<TNode>, Box<TNode>, Box<TNode>),
    Cast(Box<TNode>),
}

impl Operator {
    /// The operator for `dtype`, or the first place its body does not type.
    pub fn check(&self, dtype: DataType) -> Result<Typed, TypeError> {
        let body = infer(&self.body, Some(Ty::Elem), dtype)?;
        if body.ty != Ty::Elem {
            return Err(TypeError {
                message: format!("`{}` computes {}, not the element type ({dtype})", self.name, name(body.ty, dtype)),
                at: self.body.at,
                help: Some("cast the result: elem(...)".into()),
            });
        }
        Ok(Typed { name: self.name.clone(), dtype, body })
    }
}

fn name(ty: Ty, dtype: DataType) -> String {
    match ty {
        Ty::Elem => format!("elem ({dtype})"),
        Ty::F32 => "f32".into(),
        Ty::F64 => "f64".into(),
        Ty::I64 => "i64".into(),
        Ty::Bool => "bool".into(),
    }
}

fn is_literal(node: &Node) -> bool {
    matches!(node.kind, Kind::Int(_) | Kind::Float(_))
        || matches!(&node.kind, Kind::Unary(Unary::Neg, e) if is_literal(e))
}

/// `node` typed, where `want` is what its context asks for (literals take it).
fn infer(node: &Node, want: Option<Ty>, dtype: DataType) -> Result<TNode, TypeError> {
    let fail = |message: String, help: Option<&str>| TypeError { message, at: node.at, help: help.map(String::from) };
    let typed = |kind: TKind, ty: Ty| Ok(TNode { kind, ty });
    let numeric = |ty: Ty| ty != Ty::Bool;
    match &node.kind {
        Kind::A => typed(TKind::A, Ty::Elem),
        Kind::B => typed(TKind::B, Ty::Elem),
        Kind::Bool(v) => typed(TKind::Lit(Val::Bool(*v)), Ty::Bool),
        Kind::Int(v) => {
            let ty = want.filter(|&t| numeric(t)).unwrap_or(Ty::I64);
            match rep(ty, dtype) {
                Rep::Int { bits, signed } if wrap(*v, bits, signed) != *v => {
                    Err(fail(format!("{v} does not fit {}", name(ty, dtype)), None))
                }
                r => typed(TKind::Lit(convert(Val::Int(*v), r)), ty),
            }
        }
        Kind::Float(v) => match want.filter(|&t| numeric(t)) {
            Some(t) if is_float(rep(t, dtype)) => typed(TKind::Lit(convert(Val::Float(*v), rep(t, dtype))), t),
            Some(t) => Err(fail(
                format!("a fraction where {} is expected", name(t, dtype)),
                Some("a float literal needs a float type: cast the other side, f64(a)"),
            )),
            None => typed(TKind::Lit(Val::Float(*v)), Ty::F64),
        },
        Kind::Unary(Unary::Not, e) => typed(TKind::Unary(Unary::Not, Box::new(expect(e, Ty::Bool, dtype)?)), Ty::Bool),
        Kind::Unary(op, e) => {
            let e = infer(e, want, dtype)?;
            match numeric(e.ty) {
                true => {
                    let ty = e.ty;
                    typed(TKind::Unary(*op, Box::new(e)), ty)
                }
                false => Err(fail("a number is expected, not a bool".into(), None)),
            }
        }
        Kind::Binary(op, l, r) => {
            if matches!(op, Binary::And | Binary::Or) {
                let (l, r) = (expect(l, Ty::Bool, dtype)?, expect(r, Ty::Bool, dtype)?);
                return typed(TKind::Binary(*op, Box::new(l), Box::new(r)), Ty::Bool);
            }
            let compares = matches!(op, Binary::Lt | Binary::Le | Binary::Gt | Binary::Ge | Binary::Eq | Binary::Ne);
            let (l, r) = same(l, r, if compares { None } else { want }, dtype)?;
            if !numeric(l.ty) {
                return Err(fail("arithmetic and comparisons take numbers, not bools".into(), None));
            }
            let ty = if compares { Ty::Bool } else { l.ty };
            typed(TKind::Binary(*op, Box::new(l), Box::new(r)), ty)
        }
        Kind::Select(c, x, y) => {
            let c = expect(c, Ty::Bool, dtype)?;
            let (x, y) = same(x, y, want, dtype)?;
            let ty = x.ty;
            typed(TKind::Select(Box::new(c), Box::new(x), Box::new(y)), ty)
        }
        Kind::Cast(to, e) => {
            let e = infer(e, None, dtype)?;
            match numeric(e.ty) {
                true => typed(TKind::Cast(Box::new(e)), *to),
                false => {
                    Err(fail("a bool cannot be cast to a number".into(), Some("select instead: if c { 1 } else { 0 }")))
                }
            }
        }
    }
}

/// `node` must have type `ty`.
fn expect(node: &Node, ty: Ty, dtype: DataType) -> Result<TNode, TypeError> {
    let got = infer(node, Some(ty), dtype)?;
    match got.ty == ty {
        true => Ok(got),
        false => Err(TypeError {
            message: format!("{} is expected, this is {}", name(ty, dtype), name(got.ty, dtype)),
            at: node.at,
            help: None,
        }),
    }
}

/// Two operands of one type (a literal takes the other's).
fn same(l: &Node, r: &Node, want: Option<Ty>, dtype: DataType) -> Result<(TNode, TNode), TypeError> {
    let (tl, tr) = match is_literal(l) && !is_literal(r) {
        true => {
            let tr = infer(r, want, dtype)?;
            (infer(l, Some(tr.ty), dtype)?, tr)
        }
        false => {
            let tl = infer(l, want, dtype)?;
            let tr = infer(r, Some(tl.ty), dtype)?;
            (tl, tr)
        }
    };
    match tl.ty == tr.ty {
        true => Ok((tl, tr)),
        false => Err(TypeError {
            message: format!("mismatched types: {} and {}", name(tl.ty, dtype), name(tr.ty, dtype)),
            at: (l.at.0, r.at.1),
            help: Some("cast one side: f32(a), elem(x)".into()),
        }),
    }
}

/// A value while an operator is evaluated: integers in their type's range, floats exactly their type's value.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Val {
    Int(i128),
    Float(f64),
    Bool(bool),
}

impl Typed {
    /// `a (op) b` for one element of the data type, little-endian bytes in, bytes out: the reference evaluation.
    pub fn eval(&self, a: &[u8], b: &[u8], out: &mut [u8]) {
        let elem = rep(Ty::Elem, self.dtype);
        let (a, b) = (load(a, elem, self.dtype), load(b, elem, self.dtype));
        store(self.value(&self.body, a, b), elem, out);
    }

    /// `dst[i] = dst[i] (op) src[i]` over whole elements: what a reduction does with the operator.
    pub fn reduce(&self, dst: &mut [u8], src: &[u8]) {
        let size = self.dtype.size_bytes();
        let mut out = [0u8; 8];
        for (d, s) in dst.chunks_exact_mut(size).zip(src.chunks_exact(size)) {
            self.eval(d, s, &mut out[..size]);
            d.copy_from_slice(&out[..size]);
        }
    }

    fn value(&self, node: &TNode, a: Val, b: Val) -> Val {
        let r = |ty: Ty| rep(ty, self.dtype);
        match &node.kind {
            TKind::A => a,
            TKind::B => b,
            TKind::Lit(v) => *v,
            TKind::Unary(op, e) => unary(*op, self.value(e, a, b), r(node.ty)),
            TKind::Binary(op, l, rhs) => binary(*op, self.value(l, a, b), self.value(rhs, a, b), r(l.ty)),
            TKind::Select(c, x, y) => match self.value(c, a, b) {
                Val::Bool(true) => self.value(x, a, b),
                _ => self.value(y, a, b),
            },
            TKind::Cast(e) => convert(self.value(e, a, b), r(node.ty)),
        }
    }
}

fn load(bytes: &[u8], rep: Rep, dtype: DataType) -> Val {
    let mut raw = [0u8; 8];
    raw[..dtype.size_bytes()].copy_from_slice(&bytes[..dtype.size_bytes()]);
    let bits = u64::from_le_bytes(raw);
    match rep {
        Rep::Int { bits: width, signed } => Val::Int(wrap(i128::from(bits), width, signed)),
        Rep::F16 => Val::Float(f16::from_bits(bits as u16).to_f64()),
        Rep::Bf16 => Val::Float(bf16::from_bits(bits as u16).to_f64()),
        Rep::F32 => Val::Float(f64::from(f32::from_bits(bits as u32))),
        Rep::F64 | Rep::Bool => Val::Float(f64::from_bits(bits)),
    }
}

fn store(value: Val, rep: Rep, out: &mut [u8]) {
    let bits: u64 = match (value, rep) {
        (Val::Int(v), _) => v as u64,
        (Val::Float(v), Rep::F16) => u64::from(f16::from_f32(v as f32).to_bits()),
        (Val::Float(v), Rep::Bf16) => u64::from(bf16::from_f32(v as f32).to_bits()),
        (Val::Float(v), Rep::F32) => u64::from((v as f32).to_bits()),
        (Val::Float(v), _) => v.to_bits(),
        (Val::Bool(v), _) => u64::from(v),
    };
    let n = out.len();
    out.copy_from_slice(&bits.to_le_bytes()[..n]);
}

/// `v` in the range of an integer of `bits`, wrapping.
fn wrap(v: i128, bits: u32, signed: bool) -> i128 {
    let modulus = 1i128 << bits;
    let low = v.rem_euclid(modulus);
    match signed && low >= modulus / 2 {
        true => low - modulus,
        false => low,
    }
}

/// A float rounded to `rep`'s precision (exactly representable in f64 for every float type). A half type is reached
/// through f32, each step rounding to nearest even: `half`'s own conversions from f64 differ with the CPU (through
/// f32 with F16C, directly without), and the device rounds through f32 too.
fn round(v: f64, rep: Rep) -> f64 {
    match rep {
        Rep::F16 => f16::from_f32(v as f32).to_f64(),
        Rep::Bf16 => bf16::from_f32(v as f32).to_f64(),
        Rep::F32 => f64::from(v as f32),
        _ => v,
    }
}

/// `value` converted to `rep`: integers wrap, floats round, a float to an integer saturates (NaN: 0).
fn convert(value: Val, rep: Rep) -> Val {
    match (value, rep) {
        (Val::Int(v), Rep::Int { bits, signed }) => Val::Int(wrap(v, bits, signed)),
        (Val::Float(v), Rep::Int { bits, signed }) => {
            let (lo, hi) = match signed {
                true => (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1),
                false => (0, (1i128 << bits) - 1),
            };
            Val::Int(if v.is_nan() { 0 } else { (v.clamp(lo as f64, hi as f64) as i128).clamp(lo, hi) })
        }
        // Rust's i128 -> f32 rounds once, to nearest even, as the compiled forms' conversions do.
        (Val::Int(v), Rep::F32 | Rep::F16 | Rep::Bf16) => Val::Float(round(f64::from(v as f32), rep)),
        (Val::Int(v), _) => Val::Float(v as f64),
        (Val::Float(v), _) => Val::Float(round(v, rep)),
        (Val::Bool(v), _) => Val::Bool(v),
    }
}

fn unary(op: Unary, x: Val, rep: Rep) -> Val {
    match (op, x) {
        (Unary::Not, Val::Bool(v)) => Val::Bool(!v),
        (Unary::Neg, Val::Int(v)) => convert(Val::Int(-v), rep),
        (Unary::Abs, Val::Int(v)) => convert(Val::Int(v.abs()), rep),
        (Unary::Neg, Val::Float(v)) => Val::Float(-v),
        (Unary::Abs, Val::Float(v)) => Val::Float(v.abs()),
        (_, v) => v,
    }
}

fn binary(op: Binary, x: Val, y: Val, rep: Rep) -> Val {
    match (x, y) {
        (Val::Bool(x), Val::Bool(y)) => Val::Bool(if op == Binary::And { x && y } else { x || y }),
        (Val::Int(x), Val::Int(y)) => match op {
            Binary::Add => convert(Val::Int(x + y), rep),
            Binary::Sub => convert(Val::Int(x - y), rep),
            Binary::Mul => convert(Val::Int(x.wrapping_mul(y)), rep),
            Binary::Div => convert(Val::Int(if y == 0 { 0 } else { x / y }), rep),
            Binary::Rem => convert(Val::Int(if y == 0 { 0 } else { x % y }), rep),
            Binary::Min => Val::Int(x.min(y)),
            Binary::Max => Val::Int(x.max(y)),
            _ => Val::Bool(compare(op, x.partial_cmp(&y))),
        },
        (Val::Float(x), Val::Float(y)) => match op {
            Binary::Add => Val::Float(in_precision(x, y, rep, |x, y| x + y, |x, y| x + y)),
            Binary::Sub => Val::Float(in_precision(x, y, rep, |x, y| x - y, |x, y| x - y)),
            Binary::Mul => Val::Float(in_precision(x, y, rep, |x, y| x * y, |x, y| x * y)),
            Binary::Div => Val::Float(in_precision(x, y, rep, |x, y| x / y, |x, y| x / y)),
            Binary::Rem => Val::Float(in_precision(x, y, rep, |x, y| x % y, |x, y| x % y)),
            // The built-in max/min: a NaN loses, -0 < +0 (`crate::element`).
            Binary::Max => Val::Float(match (x.is_nan(), y.is_nan()) {
                (true, _) => y,
                (_, true) => x,
                _ if x > y || (x == y && y.is_sign_negative()) => x,
                _ => y,
            }),
            Binary::Min => Val::Float(match (x.is_nan(), y.is_nan()) {
                (true, _) => y,
                (_, true) => x,
                _ if x < y || (x == y && x.is_sign_negative()) => x,
                _ => y,
            }),
            _ => Val::Bool(compare(op, x.partial_cmp(&y))),
        },
        _ => unreachable!("operands of one type"),
    }
}

/// `x (op) y` as `rep` computes it: f64 in f64, the others in f32, rounded to their type.
fn in_precision(x: f64, y: f64, rep: Rep, f32_op: impl Fn(f32, f32) -> f32, f64_op: impl Fn(f64, f64) -> f64) -> f64 {
    match rep {
        Rep::F64 => f64_op(x, y),
        _ => round(f64::from(f32_op(x as f32, y as f32)), rep),
    }
}

fn compare(op: Binary, order: Option<std::cmp::Ordering>) -> bool {
    use std::cmp::Ordering::*;
    match (op, order) {
        (_, None) => op == Binary::Ne,
        (Binary::Lt, Some(o)) => o == Less,
        (Binary::Le, Some(o)) => o != Greater,
        (Binary::Gt, Some(o)) => o == Greater,
        (Binary::Ge, Some(o)) => o != Less,
        (Binary::Eq, Some(o)) => o == Equal,
        (_, Some(o)) => o != Equal,
    }
}

/// Why an algorithm that reorders a reduction would not compute the same as a chain in rank order.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("`{name}` is not {property} on {dtype}: {example}")]
pub struct NotReorderable {
    pub name: String,
    pub property: &'static str,
    pub dtype: DataType,
    pub example: String,
}

impl Typed {
    /// Whether the operator is commutative and associative on this data type, tried on values where the built-in
    /// arithmetic is exact (small integers and halves for float types, so a float sum passes and `(a + b) / 2` does
    /// not), and on random bits for integer types. The first counterexample otherwise.
    pub fn reorderable(&self) -> Result<(), NotReorderable> {
        let values = self.samples();
        let size = self.dtype.size_bytes();
        let op = |x: &[u8], y: &[u8]| {
            let mut out = vec![0u8; size];
            self.eval(x, y, &mut out);
            out
        };
        let show = |bytes: &[u8]| match load(bytes, rep(Ty::Elem, self.dtype), self.dtype) {
            Val::Int(v) => v.to_string(),
            Val::Float(v) => v.to_string(),
            Val::Bool(v) => v.to_string(),
        };
        let fail = |property, example| NotReorderable { name: self.name.clone(), property, dtype: self.dtype, example };
        for x in &values {
            for y in &values {
                if op(x, y) != op(y, x) {
                    let example = format!(
                        "{n}({}, {}) = {} but {n}({}, {}) = {}",
                        show(x),
                        show(y),
                        show(&op(x, y)),
                        show(y),
                        show(x),
                        show(&op(y, x)),
                        n = self.name
                    );
                    return Err(fail("commutative", example));
                }
            }
        }
        for x in &values {
            for y in &values {
                for z in values.iter().take(12) {
                    let (left, right) = (op(&op(x, y), z), op(x, &op(y, z)));
                    if left != right {
                        let example = format!(
                            "{n}({n}({}, {}), {}) = {} but {n}({}, {n}({}, {})) = {}",
                            show(x),
                            show(y),
                            show(z),
                            show(&left),
                            show(x),
                            show(y),
                            show(z),
                            show(&right),
                            n = self.name
                        );
                        return Err(fail("associative", example));
                    }
                }
            }
        }
        Ok(())
    }

    fn samples(&self) -> Vec<Vec<u8>> {
        let elem = rep(Ty::Elem, self.dtype);
        let mut values: Vec<Val> = [0.0, 1.0, -1.0, 2.0, 3.0, -4.0, 0.5, 7.0].map(Val::Float).to_vec();
        if let Rep::Int { .. } = elem {
            values = [0i128, 1, -1, 2, 3, -4, 5, 7].map(Val::Int).to_vec();
            let mut state = 0x9E37_79B9_7F4A_7C15u64;
            for _ in 0..8 {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                values.push(Val::Int(i128::from(state >> 1)));
            }
        }
        values
            .into_iter()
            .map(|v| {
                let mut out = vec![0u8; self.dtype.size_bytes()];
                store(convert(v, elem), elem, &mut out);
                out
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(kind: Kind) -> Node {
        Node { kind, at: (0, 1) }
    }
    fn bin(op: Binary, l: Node, r: Node) -> Node {
        node(Kind::Binary(op, Box::new(l), Box::new(r)))
    }
    fn un(op: Unary, e: Node) -> Node {
        node(Kind::Unary(op, Box::new(e)))
    }
    fn op(name: &str, body: Node) -> Operator {
        Operator { name: name.into(), body }
    }
    fn a() -> Node {
        node(Kind::A)
    }
    fn b() -> Node {
        node(Kind::B)
    }

    /// `max(abs(a), abs(b))` equals the built-in max of the absolute values on every type, and is reorderable.
    #[test]
    fn absmax_evaluates_on_every_type_and_reorders() {
        let absmax = op("absmax", bin(Binary::Max, un(Unary::Abs, a()), un(Unary::Abs, b())));
        for &dtype in DataType::ALL {
            let typed = absmax.check(dtype).expect("types");
            let size = dtype.size_bytes();
            let (mut x, mut y, mut out) = (vec![0u8; size], vec![0u8; size], vec![0u8; size]);
            store(convert(Val::Int(-3), rep(Ty::Elem, dtype)), rep(Ty::Elem, dtype), &mut x);
            store(convert(Val::Int(2), rep(Ty::Elem, dtype)), rep(Ty::Elem, dtype), &mut y);
            typed.eval(&x, &y, &mut out);
            let want = match dtype {
                DataType::U8 => 253, // -3 wraps to 253 in uint8, which is its own absolute value
                DataType::U32 => u32::MAX as i128 - 2,
                DataType::U64 => u64::MAX as i128 - 2,
                _ => 3,
            };
            let mut expected = vec![0u8; size];
            store(convert(Val::Int(want), rep(Ty::Elem, dtype)), rep(Ty::Elem, dtype), &mut expected);
            assert_eq!(out, expected, "{dtype}");
            assert_eq!(typed.reorderable(), Ok(()), "{dtype}");
        }
    }

    /// A difference is not commutative, a mean not associative; a float sum passes (exact on the samples).
    #[test]
    fn operators_that_reorder_badly_are_named_with_an_example() {
        let diff = op("diff", bin(Binary::Sub, a(), b())).check(DataType::I32).unwrap();
        let error = diff.reorderable().unwrap_err();
        assert_eq!(error.property, "commutative");
        assert!(
            error.to_string().starts_with("`diff` is not commutative on int32: diff(0, 1) = -1 but diff(1, 0) = 1"),
            "{error}"
        );
        let two = node(Kind::Int(2));
        let mean = op("mean", bin(Binary::Div, bin(Binary::Add, a(), b()), two)).check(DataType::F32).unwrap();
        assert_eq!(mean.reorderable().unwrap_err().property, "associative");
        let sum = op("sum", bin(Binary::Add, a(), b())).check(DataType::Bf16).unwrap();
        assert_eq!(sum.reorderable(), Ok(()));
    }

    /// Literals take their context's type; a fraction in an integer type, a literal out of range, mixed types
    /// without a cast and a result of another type are errors, each at its node.
    #[test]
    fn types_are_checked_against_the_data_type() {
        let half = Node { kind: Kind::Float(0.5), at: (4, 7) };
        let error = op("h", bin(Binary::Add, a(), half.clone())).check(DataType::I32).unwrap_err();
        assert_eq!((error.message.as_str(), error.at), ("a fraction where elem (int32) is expected", (4, 7)));
        assert!(op("h", bin(Binary::Add, a(), half)).check(DataType::F16).is_ok());
        let big = op("big", bin(Binary::Min, a(), node(Kind::Int(300))));
        assert_eq!(big.check(DataType::U8).unwrap_err().message, "300 does not fit elem (uint8)");
        let mixed = op("m", bin(Binary::Add, node(Kind::Cast(Ty::F32, Box::new(a()))), b()));
        assert_eq!(mixed.check(DataType::F64).unwrap_err().message, "mismatched types: f32 and elem (double)");
        let widened = op("w", node(Kind::Cast(Ty::F64, Box::new(a()))));
        assert!(widened.check(DataType::F32).unwrap_err().message.contains("computes f64, not the element type"));
        let back = op(
            "w",
            node(Kind::Cast(
                Ty::Elem,
                Box::new(bin(Binary::Add, node(Kind::Cast(Ty::F64, Box::new(a()))), node(Kind::Float(0.25)))),
            )),
        );
        assert!(back.check(DataType::I8).is_ok(), "a cast back to elem");
    }

    /// Integer division by zero gives 0; a float max loses a NaN; f16 rounds each operation; `if` selects.
    #[test]
    fn evaluation_follows_the_built_in_arithmetic() {
        let div = op("d", bin(Binary::Div, a(), b())).check(DataType::I32).unwrap();
        let mut out = [0u8; 4];
        div.eval(&7i32.to_le_bytes(), &0i32.to_le_bytes(), &mut out);
        assert_eq!(i32::from_le_bytes(out), 0);
        div.eval(&i32::MIN.to_le_bytes(), &(-1i32).to_le_bytes(), &mut out);
        assert_eq!(i32::from_le_bytes(out), i32::MIN, "wraps");
        let max = op("m", bin(Binary::Max, a(), b())).check(DataType::F32).unwrap();
        max.eval(&f32::NAN.to_le_bytes(), &2.0f32.to_le_bytes(), &mut out);
        assert_eq!(f32::from_le_bytes(out), 2.0);
        let sum = op("s", bin(Binary::Add, a(), b())).check(DataType::F16).unwrap();
        let mut half = [0u8; 2];
        let (x, y) = (f16::from_f32(2048.0), f16::from_f32(1.0));
        sum.eval(&x.to_le_bytes(), &y.to_le_bytes(), &mut half);
        assert_eq!(f16::from_le_bytes(half), f16::from_f32(2048.0), "2049 rounds to even in f16");
        let pick = node(Kind::Select(Box::new(bin(Binary::Gt, a(), b())), Box::new(a()), Box::new(node(Kind::Int(0)))));
        let pick = op("p", pick).check(DataType::I64).unwrap();
        let mut wide = [0u8; 8];
        pick.eval(&5i64.to_le_bytes(), &3i64.to_le_bytes(), &mut wide);
        assert_eq!(i64::from_le_bytes(wide), 5);
        pick.eval(&1i64.to_le_bytes(), &3i64.to_le_bytes(), &mut wide);
        assert_eq!(i64::from_le_bytes(wide), 0);
    }
}
