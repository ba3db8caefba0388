//! Reduction operators users define (`op absmax(a, b) = max(abs(a), abs(b))`): an `ast::OpDef` lowered into the
//! kernels' `operator::Operator`, checked against a data type, with a diagnostic at the source span of whatever does
//! not fit. The language and its arithmetic: docs/language.md §16.

use crate::diag::{Error, Errors};
use collc_grammar::ast::{BinOp, Expr, ExprKind, OpDef, Span, UnOp};
use collc_kernels::operator::{Binary, Kind, Node, Operator, Ty, Typed, Unary};
use collc_kernels::DataType;

/// `def` as an operator over its two operands, or the first construct an operator cannot hold.
pub fn lower_op(def: &OpDef) -> Result<Operator, Error> {
    let [a, b] = &def.operands;
    if a.name == b.name {
        return Err(Error::new(
            "collc::op::operands",
            format!("both operands are named `{}`", a.name),
            "name them apart: (a, b)",
        )
        .at(b.span, "named again"));
    }
    let body = node(&def.body, (&a.name, &b.name))?;
    Ok(Operator { name: def.name.name.clone(), body })
}

/// The operators of a file that holds only operators (`op NAME(a, b) = EXPR`, docs/language.md §16), lowered: what
/// a library user registers (`collc_kernels::operator::UserOp::register`) to call collectives with them.
pub fn parse_operators(source: &str, limits: &collc_grammar::Limits) -> Result<Vec<Operator>, Errors> {
    let defs = collc_grammar::parse_ops(source, limits).map_err(|e| Errors(vec![Error::from(e)]))?;
    let (operators, errors): (Vec<_>, Vec<_>) = defs.iter().map(lower_op).partition(Result::is_ok);
    match errors.is_empty() {
        true => Ok(operators.into_iter().map(Result::unwrap).collect()),
        false => Err(Errors(errors.into_iter().filter_map(Result::err).collect())),
    }
}

/// `def` for `dtype`: lowered and type-checked.
pub fn check_op(def: &OpDef, dtype: DataType) -> Result<Typed, Error> {
    lower_op(def)?.check(dtype).map_err(|e| {
        let error = Error::new(
            "collc::op::type",
            format!("`{}` on {dtype}: {}", def.name.name, e.message),
            e.help.unwrap_or_default(),
        );
        error.at(Span::new(e.at.0 as usize, e.at.1 as usize), "here")
    })
}

fn node(expr: &Expr, operands: (&str, &str)) -> Result<Node, Error> {
    let at = (expr.span.start, expr.span.end);
    let child = |e: &Expr| node(e, operands).map(Box::new);
    let unsupported = |what: String, help: &str| {
        Error::new("collc::op::expr", format!("{what} is not part of an operator"), help.to_string())
            .at(expr.span, "here")
    };
    let kind = match &expr.kind {
        ExprKind::Int(v) => Kind::Int(i128::from(*v)),
        ExprKind::Float(v) => Kind::Float(*v),
        ExprKind::Var(name) if name == operands.0 => Kind::A,
        ExprKind::Var(name) if name == operands.1 => Kind::B,
        ExprKind::Var(name) => {
            let help = format!("an operator reads only its operands, `{}` and `{}`", operands.0, operands.1);
            return Err(
                Error::new("collc::op::name", format!("unknown name `{name}`"), help).at(expr.span, "not an operand")
            );
        }
        ExprKind::Unary(UnOp::Neg, e) => Kind::Unary(Unary::Neg, child(e)?),
        ExprKind::Unary(UnOp::Not, e) => Kind::Unary(Unary::Not, child(e)?),
        ExprKind::Unary(UnOp::BitNot, _) => {
            return Err(unsupported(
                "`~`".into(),
                "operators compute with arithmetic, min/max/abs, comparisons and `if`",
            ))
        }
        ExprKind::Binary(op, l, r) => {
            let op = match op {
                BinOp::Add => Binary::Add,
                BinOp::Sub => Binary::Sub,
                BinOp::Mul => Binary::Mul,
                BinOp::Div => Binary::Div,
                BinOp::Rem => Binary::Rem,
                BinOp::Lt => Binary::Lt,
                BinOp::Le => Binary::Le,
                BinOp::Gt => Binary::Gt,
                BinOp::Ge => Binary::Ge,
                BinOp::Eq => Binary::Eq,
                BinOp::Ne => Binary::Ne,
                BinOp::And => Binary::And,
                BinOp::Or => Binary::Or,
                other => {
                    let help = "operators compute with + - * / %, min/max/abs, comparisons, && || ! and `if`";
                    return Err(unsupported(format!("`{}`", other.symbol()), help));
                }
            };
            Kind::Binary(op, child(l)?, child(r)?)
        }
        ExprKind::If(c, x, y) => Kind::Select(child(c)?, child(x)?, child(y)?),
        ExprKind::Call(name, args) => {
            let arity = |n: usize| {
                (args.len() == n).then_some(()).ok_or_else(|| {
                    Error::new(
                        "collc::op::call",
                        format!("`{}` takes {n} argument(s), not {}", name.name, args.len()),
                        "fix the call",
                    )
                    .at(expr.span, "this call")
                })
            };
            match name.name.as_str() {
                "abs" => {
                    arity(1)?;
                    Kind::Unary(Unary::Abs, child(&args[0])?)
                }
                "min" | "max" => {
                    arity(2)?;
                    let op = if name.name == "min" { Binary::Min } else { Binary::Max };
                    Kind::Binary(op, child(&args[0])?, child(&args[1])?)
                }
                cast => match Ty::from_cast(cast) {
                    Some(ty) => {
                        arity(1)?;
                        Kind::Cast(ty, child(&args[0])?)
                    }
                    None => {
                        let help = "an operator calls abs, min, max and the casts elem, f32, f64, i64";
                        return Err(unsupported(format!("a call of `{cast}`"), help));
                    }
                },
            }
        }
    };
    Ok(Node { kind, at })
}

#[cfg(test)]
mod tests {
    use super::*;
    use collc_grammar::{parse_ops, Limits};

    fn ops(source: &str) -> Vec<OpDef> {
        parse_ops(source, &Limits::default()).expect("parses")
    }

    /// Operators parse from a file of their own, lower, type for every data type they admit and evaluate; what an
    /// operator cannot hold is named at its span.
    #[test]
    fn operators_lower_check_and_say_what_does_not_fit() {
        let source = "## the larger magnitude\nop absmax(a, b) = max(abs(a), abs(b))\n\
                      op half_sum(x, y) = (x + y) * 0.5\n\
                      op clip(a, b) = if a + b > 100 { 100 } else { a + b }\n";
        let defs = ops(source);
        assert_eq!(defs.len(), 3);
        assert_eq!(defs[0].doc, vec!["the larger magnitude".to_string()]);
        for &dtype in DataType::ALL {
            let absmax = check_op(&defs[0], dtype).expect("absmax types everywhere");
            assert_eq!(absmax.reorderable(), Ok(()), "{dtype}");
        }
        let error = check_op(&defs[1], DataType::I32).unwrap_err();
        assert_eq!(error.code, "collc::op::type");
        assert_eq!(error.message, "`half_sum` on int32: a fraction where elem (int32) is expected");
        assert_eq!(&source[error.primary_span().unwrap().start as usize..][..3], "0.5");
        let half_sum = check_op(&defs[1], DataType::F32).expect("a float type takes the fraction");
        assert_eq!(half_sum.reorderable().unwrap_err().property, "associative");
        let clip = check_op(&defs[2], DataType::U8).expect("types on uint8");
        let mut out = [0u8];
        clip.eval(&[60], &[70], &mut out);
        assert_eq!(out, [100]);

        for (text, says) in [
            ("op bad(a, b) = a << b", "`<<` is not part of an operator"),
            ("op bad(a, b) = a + c", "unknown name `c`"),
            ("op bad(a, b) = sqrt(a)", "a call of `sqrt` is not part of an operator"),
            ("op bad(a, a) = a", "both operands are named `a`"),
            ("op bad(a, b) = max(a)", "`max` takes 2 argument(s), not 1"),
        ] {
            let error = lower_op(&ops(text)[0]).unwrap_err();
            assert_eq!(error.message, says, "{text}");
        }
    }

    /// In an algorithm, a fraction is an error at its span; an algorithm file may start with operators.
    #[test]
    fn an_algorithm_file_may_define_operators_and_refuses_fractions() {
        let source = "op absmax(a, b) = max(abs(a), abs(b))\nalgorithm x for allreduce {\n    ranks p\n    param k = 1.5\n    for r in 1..p { send in[0] from r to 0 reduce }\n    for r in 1..p { send in[0] from 0 to r }\n}\n";
        let file = collc_grammar::parse(source, &Limits::default()).expect("parses");
        assert_eq!(file.ops.len(), 1);
        let errors =
            crate::lower(&file, &crate::Bindings::ranks(2), &crate::Limits::default()).expect_err("a fraction");
        assert_eq!(errors.0[0].code, "collc::lower::float");
    }

    /// Values that test each data type's edges, as little-endian bit patterns: zeros of both signs, ones, the
    /// extremes, subnormals, infinities and NaNs (quiet, signalling, negative), and random bits.
    fn edge_values(dtype: DataType) -> Vec<u64> {
        let mut bits: Vec<u64> = match dtype {
            DataType::F16 => vec![
                0, 0x8000, 0x3C00, 0xBC00, 0x3800, 0x4000, 0x4200, 0x7BFF, 0xFBFF, 0x0001, 0x0400, 0x7C00, 0xFC00,
                0x7E00, 0xFE00, 0x7C01, 0x5BF8,
            ],
            DataType::Bf16 => vec![
                0, 0x8000, 0x3F80, 0xBF80, 0x3F00, 0x4000, 0x4040, 0x7F7F, 0xFF7F, 0x0001, 0x0080, 0x7F80, 0xFF80,
                0x7FC0, 0xFFC0, 0x7F81, 0x4B80,
            ],
            DataType::F32 => [
                0.0f32,
                -0.0,
                1.0,
                -1.0,
                0.5,
                2.0,
                3.0,
                f32::MAX,
                f32::MIN,
                1e-45,
                f32::MIN_POSITIVE,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                -f32::NAN,
                3e9,
                -3e9,
                200.7,
            ]
            .map(|v| u64::from(v.to_bits()))
            .into_iter()
            .chain([0x7F80_0001])
            .collect(),
            DataType::F64 => [
                0.0f64,
                -0.0,
                1.0,
                -1.0,
                0.5,
                2.0,
                3.0,
                f64::MAX,
                f64::MIN,
                5e-324,
                f64::MIN_POSITIVE,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::NAN,
                -f64::NAN,
                1e19,
                -1e19,
                1e300,
                200.7,
            ]
            .map(f64::to_bits)
            .into_iter()
            .chain([0x7FF0_0000_0000_0001])
            .collect(),
            _ => {
                let mask = u64::MAX >> (64 - 8 * dtype.size_bytes());
                let top = 1u64 << (8 * dtype.size_bytes() - 1);
                [0u64, 1, 2, 3, 7, 100, u64::MAX, u64::MAX - 1, u64::MAX - 99, top, top - 1, top + 1]
                    .map(|v| v & mask)
                    .to_vec()
            }
        };
        let mask = u64::MAX >> (64 - 8 * dtype.size_bytes());
        let mut state = 0x2545_F491_4F6C_DD1Du64 ^ u64::from(dtype.nccl_code());
        for _ in 0..8 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            bits.push((state >> 7) & mask);
        }
        bits
    }

    /// Every construct of the language, compiled with cranelift, computes what the reference evaluation computes,
    /// bit for bit, on every data type it types on and every pair of edge values (a result both compute as NaN may
    /// differ in its payload only where x86 and the reference pick different NaN operands).
    #[test]
    fn compiled_operators_match_the_reference_bit_for_bit() {
        let source = "op absmax(a, b) = max(abs(a), abs(b))\n\
                      op arith(a, b) = (a - b) * a + b / (a - 3) - b % a\n\
                      op minmax(a, b) = min(a, max(b, -a))\n\
                      op pick(a, b) = if a < b && !(a == 0) || a >= b + 1 { a } else { -b }\n\
                      op cmp(a, b) = if a != b { if a <= b { a } else { b } } else { a * 2 }\n\
                      op wide(a, b) = elem(f64(a) * 0.75 + f64(b) / 3)\n\
                      op narrow(a, b) = elem(f32(a) + f32(b) * 0.1)\n\
                      op ints(a, b) = elem(i64(a) / i64(b) + i64(a) % 7 - abs(i64(b)))\n\
                      op round_trip(a, b) = elem(i64(f64(a) * 2.5)) + b\n\
                      op mean(a, b) = (a + b) / 2\n";
        let defs = ops(source);
        let mut compiled = 0;
        for def in &defs {
            let op = collc_kernels::operator::UserOp::register(lower_op(def).unwrap()).unwrap();
            for &dtype in DataType::ALL {
                let Ok(prepared) = op.prepare(dtype) else { continue };
                let kernel = prepared.native.clone().unwrap_or_else(|e| panic!("{e}"));
                compiled += 1;
                let size = dtype.size_bytes();
                let values = edge_values(dtype);
                let (mut a, mut b) = (Vec::new(), Vec::new());
                for x in &values {
                    for y in &values {
                        a.extend_from_slice(&x.to_le_bytes()[..size]);
                        b.extend_from_slice(&y.to_le_bytes()[..size]);
                    }
                }
                let mut native = vec![0u8; a.len()];
                // SAFETY: three buffers of the same whole number of elements.
                unsafe { kernel(native.as_mut_ptr(), a.as_ptr(), b.as_ptr(), a.len() / size) };
                let mut want = [0u8; 8];
                for k in 0..a.len() / size {
                    let at = k * size..(k + 1) * size;
                    prepared.typed.eval(&a[at.clone()], &b[at.clone()], &mut want[..size]);
                    let both_nan = is_nan(dtype, &want[..size]) && is_nan(dtype, &native[at.clone()]);
                    assert!(
                        native[at.clone()] == want[..size] || both_nan,
                        "`{}` on {dtype}: a={:02x?} b={:02x?}: compiled {:02x?}, reference {:02x?}",
                        def.name.name,
                        &a[at.clone()],
                        &b[at.clone()],
                        &native[at.clone()],
                        &want[..size]
                    );
                }
            }
        }
        assert!(compiled >= 60, "most operators type on most types: {compiled}");
    }

    fn is_nan(dtype: DataType, bytes: &[u8]) -> bool {
        let mut raw = [0u8; 8];
        raw[..bytes.len()].copy_from_slice(bytes);
        let bits = u64::from_le_bytes(raw);
        match dtype {
            DataType::F16 => bits & 0x7C00 == 0x7C00 && bits & 0x03FF != 0,
            DataType::Bf16 => bits & 0x7F80 == 0x7F80 && bits & 0x007F != 0,
            DataType::F32 => f32::from_bits(bits as u32).is_nan(),
            DataType::F64 => f64::from_bits(bits).is_nan(),
            _ => false,
        }
    }
}
