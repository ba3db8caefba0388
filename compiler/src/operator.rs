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
}
