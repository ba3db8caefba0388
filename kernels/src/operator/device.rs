//! A user's operator as CUDA C for the device interpreter: one struct per data type it types on, whose `apply` the
//! interpreter's `reduce_range` calls, and `collc_user_reduce`, which `reduce_any` (`kernels/cuda/elementwise.cu`)
//! calls for `OP_USER`. The arithmetic is `Typed::eval`'s: integers wrap (computed in the unsigned type of their
//! width), the half types compute each operation in `float` and round back (`round_f16`, `round_bf16`), division
//! and remainder never trap, casts to integers saturate (the `uo_*` helpers of elementwise.cu). Literals are written
//! as their bits, so the text holds no decimal rounding of its own.

use super::{rep, Binary, Rep, TKind, TNode, Ty, Typed, Unary, Val};
use crate::DataType;

/// The C type a value of `rep` is computed in.
fn c_type(rep: Rep) -> &'static str {
    match rep {
        Rep::Int { bits: 8, signed: true } => "i8",
        Rep::Int { bits: 8, signed: false } => "u8",
        Rep::Int { bits: 32, signed: true } => "i32",
        Rep::Int { bits: 32, signed: false } => "u32",
        Rep::Int { signed: true, .. } => "i64",
        Rep::Int { signed: false, .. } => "u64",
        Rep::F16 | Rep::Bf16 | Rep::F32 => "float",
        Rep::F64 => "double",
        Rep::Bool => "bool",
    }
}

/// The unsigned type of an integer's width, which its wrapping arithmetic is computed in.
fn unsigned(bits: u32) -> &'static str {
    match bits {
        8 => "u8",
        32 => "u32",
        _ => "u64",
    }
}

/// The element type elementwise.cu stores `dtype` as.
fn storage(dtype: DataType) -> &'static str {
    match dtype {
        DataType::F16 => "f16",
        DataType::Bf16 => "bf16",
        DataType::F32 => "float",
        DataType::F64 => "double",
        _ => c_type(rep(Ty::Elem, dtype)),
    }
}

impl Typed {
    /// The struct `name` whose `apply(a, b)` computes the operator on this data type, as elementwise.cu's
    /// operators do (`IntOp`, `FloatOp`, `HalfOp`).
    pub fn cuda_struct(&self, name: &str) -> String {
        let t = storage(self.dtype);
        let body = self.c(&self.body);
        let (params, load, result) = match self.dtype {
            DataType::F16 => {
                (format!("{t} a0, {t} b0"), "float a = to_f32(a0), b = to_f32(b0); ", format!("to_f16({body})"))
            }
            DataType::Bf16 => {
                (format!("{t} a0, {t} b0"), "float a = to_f32(a0), b = to_f32(b0); ", format!("to_bf16({body})"))
            }
            _ => (format!("{t} a, {t} b"), "", body),
        };
        format!("struct {name} {{\n    __device__ __forceinline__ static {t} apply({params}) {{ {load}return {result}; }}\n}};\n")
    }

    fn c(&self, node: &TNode) -> String {
        let here = rep(node.ty, self.dtype);
        match &node.kind {
            TKind::A => "a".into(),
            TKind::B => "b".into(),
            TKind::Lit(v) => literal(*v, here),
            TKind::Unary(op, e) => {
                let x = self.c(e);
                match (op, here) {
                    (Unary::Not, _) => format!("(!{x})"),
                    (Unary::Neg, Rep::Int { bits, .. }) => format!("uo_neg<{}, {}>({x})", c_type(here), unsigned(bits)),
                    (Unary::Abs, Rep::Int { bits, signed: true }) => {
                        format!("uo_abs<{}, {}>({x})", c_type(here), unsigned(bits))
                    }
                    (Unary::Abs, Rep::Int { signed: false, .. }) => x,
                    (Unary::Neg, _) => format!("(-{x})"),
                    (Unary::Abs, _) => format!("uo_fabs({x})"),
                }
            }
            TKind::Binary(op, l, r) => {
                let operands = rep(l.ty, self.dtype);
                let (x, y) = (self.c(l), self.c(r));
                binary(*op, &x, &y, operands)
            }
            TKind::Select(c, x, y) => format!("({} ? {} : {})", self.c(c), self.c(x), self.c(y)),
            TKind::Cast(e) => convert(&self.c(e), rep(e.ty, self.dtype), here),
        }
    }
}

fn literal(v: Val, rep: Rep) -> String {
    match v {
        Val::Bool(v) => v.to_string(),
        Val::Int(v) => format!("(({})0x{:x}ull)", c_type(rep), v as u64),
        Val::Float(v) if rep == Rep::F64 => format!("__longlong_as_double(0x{:x}ll)", v.to_bits()),
        Val::Float(v) => format!("__uint_as_float(0x{:x}u)", (v as f32).to_bits()),
    }
}

fn binary(op: Binary, x: &str, y: &str, rep: Rep) -> String {
    let compare = |symbol: &str| format!("({x} {symbol} {y})");
    match op {
        Binary::And => return compare("&&"),
        Binary::Or => return compare("||"),
        Binary::Lt => return compare("<"),
        Binary::Le => return compare("<="),
        Binary::Gt => return compare(">"),
        Binary::Ge => return compare(">="),
        Binary::Eq => return compare("=="),
        Binary::Ne => return compare("!="),
        _ => {}
    }
    let t = c_type(rep);
    if let Rep::Int { bits, signed } = rep {
        let u = unsigned(bits);
        return match op {
            Binary::Add => format!("uo_add<{t}, {u}>({x}, {y})"),
            Binary::Sub => format!("uo_sub<{t}, {u}>({x}, {y})"),
            Binary::Mul => format!("uo_mul<{t}, {u}>({x}, {y})"),
            Binary::Div if signed => format!("uo_sdiv<{t}, {u}>({x}, {y})"),
            Binary::Rem if signed => format!("uo_srem<{t}>({x}, {y})"),
            Binary::Div => format!("uo_udiv<{t}>({x}, {y})"),
            Binary::Rem => format!("uo_urem<{t}>({x}, {y})"),
            Binary::Min => format!("uo_min<{t}>({x}, {y})"),
            _ => format!("uo_max<{t}>({x}, {y})"),
        };
    }
    let computed = match op {
        Binary::Add => compare("+"),
        Binary::Sub => compare("-"),
        Binary::Mul => compare("*"),
        Binary::Div => compare("/"),
        Binary::Rem if rep == Rep::F64 => format!("fmod({x}, {y})"),
        Binary::Rem => format!("fmodf({x}, {y})"),
        Binary::Min => return format!("min_ref<{t}>({x}, {y})"),
        _ => return format!("max_ref<{t}>({x}, {y})"),
    };
    round(computed, rep)
}

/// A `float` of a half type's value rounded to that type; other reps as they are.
fn round(x: String, rep: Rep) -> String {
    match rep {
        Rep::F16 => format!("round_f16({x})"),
        Rep::Bf16 => format!("round_bf16({x})"),
        _ => x,
    }
}

/// `x` of `from` as `to` (the reference's `convert`): integers wrap, floats to integers saturate (NaN: 0), a double
/// reaches a half type through float.
fn convert(x: &str, from: Rep, to: Rep) -> String {
    if from == to {
        return x.to_string();
    }
    let t = c_type(to);
    match (from, to) {
        (Rep::Int { .. }, Rep::Int { .. }) => format!("(({t})({x}))"),
        (_, Rep::Int { bits, signed }) => {
            let (lo, hi): (i128, i128) = match signed {
                true => (-(1i128 << (bits - 1)), 1i128 << (bits - 1)),
                false => (0, 1i128 << bits),
            };
            format!(
                "uo_sat<{t}>((double)({x}), {:?}, {:?}, (({t})0x{:x}ull), (({t})0x{:x}ull))",
                lo as f64,
                hi as f64,
                lo as u64,
                (hi - 1) as u64
            )
        }
        (_, Rep::F64) => format!("((double)({x}))"),
        (Rep::F64 | Rep::Int { .. }, _) => round(format!("((float)({x}))"), to),
        // A half type is a float already: to float it is exact, to the other half type it rounds.
        (_, Rep::F32) => x.to_string(),
        (_, to) => round(x.to_string(), to),
    }
}

/// The program text for `typed` (the operator on each data type it types on): a struct per type and
/// `collc_user_reduce` dispatching on the data type; with none, a `collc_user_reduce` that traps, as every code no
/// case names does.
pub fn cuda_source(typed: &[&Typed]) -> String {
    let mut text = String::from("// A user's operator, generated by collc_kernels::operator::device.\n");
    let mut cases = String::new();
    for op in typed {
        let name = format!("collc_user_{}", op.dtype.short_name());
        text.push_str(&op.cuda_struct(&name));
        let t = storage(op.dtype);
        let code = format!("COLLC_DTYPE_{}", op.dtype.short_name().to_uppercase());
        cases.push_str(&format!(
            "    case {code}: reduce_range<{t}, {name}>(({t}*)dst, (const {t}*)a, (const {t}*)b, n, tid, nt); break;\n"
        ));
    }
    text.push_str(
        "__device__ void collc_user_reduce(u32 dtype, void* dst, const void* a, const void* b, u64 n, u32 tid, \
         u32 nt) {\n    switch (dtype) {\n",
    );
    text.push_str(&cases);
    text.push_str("    default: COLLC_TRAP();\n    }\n}\n");
    if !typed.is_empty() {
        // An entry that marks kernels compiled with a user's operator: the CUDA driver for the CPU, whose kernels
        // are its own, refuses to load them rather than run its stub.
        text.push_str("extern \"C\" __global__ void collc_user_operator() {}\n");
    }
    text
}
