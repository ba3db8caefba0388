//! Evaluates resolved integer expressions: checked 64-bit arithmetic, mathematical modulo, bounded recursion and fuel.

use super::resolve::{Builtin, RExpr, RFn};
use crate::diag::Error;
use crate::Limits;
use collc_grammar::ast::{BinOp, Span, UnOp};

/// Evaluation state shared by the whole lowering: the functions, the global parameters, the fuel left.
pub(crate) struct Machine<'a> {
    pub fns: &'a [RFn],
    pub globals: Vec<i64>,
    pub fuel: u64,
    pub depth: u32,
    pub limits: &'a Limits,
}

/// Errors are boxed on the evaluation path: a large `Err` in every return of a deep recursion costs more than
/// the arithmetic.
type Result<T> = std::result::Result<T, Box<Error>>;

fn arith(span: Span, what: impl Into<String>, help: &str) -> Box<Error> {
    Box::new(Error::new("collc::lower::arithmetic", what, help).at(span, "in this expression"))
}

impl Machine<'_> {
    /// Evaluates `expr` with the locals in `frame`.
    pub fn eval(&mut self, expr: &RExpr, frame: &[i64]) -> std::result::Result<i64, Error> {
        self.operand(expr, frame).map_err(|e| *e)
    }

    /// Leaves are read in place, without a call or fuel: they are most of what loops evaluate. Interior nodes pay
    /// fuel in `value`, which bounds the leaves too.
    #[inline(always)]
    fn operand(&mut self, expr: &RExpr, frame: &[i64]) -> Result<i64> {
        match expr {
            RExpr::Const(v, _) => Ok(*v),
            RExpr::Local(slot, _) => Ok(frame[*slot as usize]),
            RExpr::Global(slot, _) => Ok(self.globals[*slot as usize]),
            _ => self.value(expr, frame),
        }
    }

    fn value(&mut self, expr: &RExpr, frame: &[i64]) -> Result<i64> {
        if self.fuel == 0 {
            return Err(Box::new(
                Error::new(
                    "collc::lower::limit",
                    format!("evaluation took more than {} steps", self.limits.max_eval_steps),
                    "a loop bound or recursion is far larger than intended; raise the limit with --max-eval-steps",
                )
                .at(expr.span(), "still evaluating here"),
            ));
        }
        self.fuel -= 1;
        match expr {
            RExpr::Const(v, _) => Ok(*v),
            RExpr::Local(slot, _) => Ok(frame[*slot as usize]),
            RExpr::Global(slot, _) => Ok(self.globals[*slot as usize]),
            RExpr::Unary(op, e, _) => {
                let v = self.operand(e, frame)?;
                Ok(match op {
                    UnOp::Neg => v
                        .checked_neg()
                        .ok_or_else(|| arith(expr.span(), "negation overflows", "values are signed 64-bit"))?,
                    UnOp::Not => (v == 0) as i64,
                    UnOp::BitNot => !v,
                })
            }
            RExpr::Binary(op, a, b, span) => self.binary(*op, a, b, *span, frame),
            RExpr::If(c, a, b) => {
                if self.operand(c, frame)? != 0 {
                    self.operand(a, frame)
                } else {
                    self.operand(b, frame)
                }
            }
            RExpr::Builtin(f, args, span) => self.builtin(*f, args, *span, frame),
            RExpr::Call(index, args, span) => self.call(*index, args, *span, frame),
        }
    }

    fn binary(&mut self, op: BinOp, a: &RExpr, b: &RExpr, span: Span, frame: &[i64]) -> Result<i64> {
        let x = self.operand(a, frame)?;
        match op {
            BinOp::And if x == 0 => return Ok(0),
            BinOp::Or if x != 0 => return Ok(1),
            _ => {}
        }
        let y = self.operand(b, frame)?;
        binary_value(op, x, y).ok_or_else(|| binary_error(op, x, y, span))
    }

    fn builtin(&mut self, f: Builtin, args: &[RExpr], span: Span, frame: &[i64]) -> Result<i64> {
        let mut values = [0i64; 8];
        for (slot, arg) in values.iter_mut().zip(args) {
            *slot = self.operand(arg, frame)?;
        }
        let values = &values[..args.len()];
        let x = values[0];
        let positive = |name: &str| {
            if x <= 0 {
                Err(arith(span, format!("{name}({x}) is undefined"), "the argument must be positive"))
            } else {
                Ok(x)
            }
        };
        Ok(match f {
            Builtin::Min => *values.iter().min().expect("arity checked at resolve time"),
            Builtin::Max => *values.iter().max().expect("arity checked at resolve time"),
            Builtin::Abs => x.checked_abs().ok_or_else(|| arith(span, "abs overflows", "values are signed 64-bit"))?,
            Builtin::Log2 => 63 - positive("log2")?.leading_zeros() as i64,
            Builtin::CLog2 => {
                let v = positive("clog2")?;
                64 - (v - 1).leading_zeros() as i64
            }
            Builtin::Pow2 if !(0..63).contains(&x) => {
                return Err(arith(span, format!("pow2({x}) is outside 64 bits"), "the exponent must be 0 to 62"))
            }
            Builtin::Pow2 => 1 << x,
        })
    }

    fn call(&mut self, index: u32, args: &[RExpr], span: Span, frame: &[i64]) -> Result<i64> {
        let f = &self.fns[index as usize];
        if self.depth >= self.limits.max_call_depth {
            return Err(Box::new(
                Error::new(
                    "collc::lower::limit",
                    format!("recursion in `{}` is deeper than {} calls", f.name, self.limits.max_call_depth),
                    "make sure every recursive call moves toward a base case; raise the limit with --max-call-depth",
                )
                .at(span, "this call")
                .at(f.span, "in this function"),
            ));
        }
        // Most functions have a handful of parameters: keep their frame on the stack.
        let mut inline = [0i64; 8];
        let mut heap = Vec::new();
        let callee_frame: &mut [i64] = if f.frame_size as usize <= inline.len() {
            &mut inline[..f.frame_size as usize]
        } else {
            heap.resize(f.frame_size as usize, 0);
            &mut heap
        };
        for (slot, arg) in callee_frame.iter_mut().zip(args) {
            *slot = self.operand(arg, frame)?;
        }
        self.depth += 1;
        let fns = self.fns;
        let result = self.operand(&fns[index as usize].body, callee_frame);
        self.depth -= 1;
        result
    }
}

/// The loop variable of a batch: local `slot` takes `first`, `first + by`, ... (`n` values).
#[derive(Clone, Copy)]
pub(crate) struct Sweep {
    pub slot: u32,
    pub first: i64,
    pub by: i64,
    pub n: usize,
}

impl Sweep {
    /// A loop from `first` by `by` that runs `trips` times, when it counts up and runs at least once.
    pub fn up_to(slot: u32, first: i64, by: i64, trips: u128) -> Option<Sweep> {
        if by <= 0 || trips == 0 {
            return None;
        }
        Some(Sweep { slot, first, by, n: usize::try_from(trips).ok()? })
    }
}

impl Machine<'_> {
    /// The fuel `eval` charges for `expr` (one per interior node), or `None` when it calls a function or a builtin,
    /// which batches leave to `eval`.
    pub fn batch_cost(expr: &RExpr) -> Option<u64> {
        match expr {
            RExpr::Const(..) | RExpr::Local(..) | RExpr::Global(..) => Some(0),
            RExpr::Unary(_, e, _) => Some(1 + Self::batch_cost(e)?),
            RExpr::Binary(_, a, b, _) => Some(1 + Self::batch_cost(a)? + Self::batch_cost(b)?),
            RExpr::If(..) | RExpr::Builtin(..) | RExpr::Call(..) => None,
        }
    }

    /// `expr` for every value of the sweep's loop variable, into `out`: the values `eval` gives, or `None` when any
    /// of them is an error (the caller then evaluates one iteration at a time, which reports it as always). It
    /// charges no fuel: the caller charges `batch_cost` per iteration, as `eval` would.
    pub fn eval_batch(&self, expr: &RExpr, frame: &[i64], sweep: Sweep, out: &mut Vec<i64>) -> Option<()> {
        out.clear();
        match expr {
            RExpr::Const(v, _) => out.resize(sweep.n, *v),
            // The loop's own range: no value overflows, as the last is below the loop's bound.
            RExpr::Local(slot, _) if *slot == sweep.slot => {
                out.extend((0..sweep.n as i64).map(|k| sweep.first + k * sweep.by));
            }
            RExpr::Local(slot, _) => out.resize(sweep.n, frame[*slot as usize]),
            RExpr::Global(slot, _) => out.resize(sweep.n, self.globals[*slot as usize]),
            RExpr::Unary(op, e, _) => {
                self.eval_batch(e, frame, sweep, out)?;
                for v in out.iter_mut() {
                    *v = match op {
                        UnOp::Neg => v.checked_neg()?,
                        UnOp::Not => (*v == 0) as i64,
                        UnOp::BitNot => !*v,
                    };
                }
            }
            RExpr::Binary(op, a, b, _) => {
                let mut right = Vec::with_capacity(sweep.n);
                self.eval_batch(a, frame, sweep, out)?;
                self.eval_batch(b, frame, sweep, &mut right)?;
                // One loop per operator, so the operator is not matched again for every element.
                macro_rules! each_op {
                    ($($op:ident),*) => {
                        match op {
                            $(BinOp::$op => zip_with(out, &right, |x, y| binary_value(BinOp::$op, x, y))?,)*
                        }
                    };
                }
                each_op!(
                    Or, And, Eq, Ne, Lt, Le, Gt, Ge, BitOr, BitXor, BitAnd, Shl, Shr, Add, Sub, Mul, Div, Rem, Pow
                );
            }
            RExpr::If(..) | RExpr::Builtin(..) | RExpr::Call(..) => return None,
        }
        Some(())
    }
}

fn zip_with(out: &mut [i64], right: &[i64], f: impl Fn(i64, i64) -> Option<i64>) -> Option<()> {
    for (x, &y) in out.iter_mut().zip(right) {
        *x = f(*x, y)?;
    }
    Some(())
}

/// The error `x op y` is, when `binary_value` has no value for it.
fn binary_error(op: BinOp, x: i64, y: i64, span: Span) -> Box<Error> {
    match op {
        BinOp::Div | BinOp::Rem if y == 0 => arith(
            span,
            format!("division by zero in `{x} {} 0`", op.symbol()),
            "guard the divisor with `if` or a `where` clause",
        ),
        BinOp::Shl | BinOp::Shr if !(0..64).contains(&y) => {
            arith(span, format!("shift by {y} is outside 0..64"), "shift amounts must be 0 to 63")
        }
        BinOp::Pow if u32::try_from(y).is_err() => {
            arith(span, format!("exponent {y} is negative or too large"), "use a non-negative exponent")
        }
        _ => arith(span, format!("`{x} {} {y}` overflows 64 bits", op.symbol()), "values are signed 64-bit"),
    }
}

/// `x op y`, or `None` where it is an error (`binary_error` says which): the one definition of the operators, for
/// `Machine::binary` and the batches alike. `&&` and `||` get both operands here; `binary` short-circuits before.
#[inline(always)]
fn binary_value(op: BinOp, x: i64, y: i64) -> Option<i64> {
    Some(match op {
        BinOp::And => (x != 0 && y != 0) as i64,
        BinOp::Or => (x != 0 || y != 0) as i64,
        BinOp::Eq => (x == y) as i64,
        BinOp::Ne => (x != y) as i64,
        BinOp::Lt => (x < y) as i64,
        BinOp::Le => (x <= y) as i64,
        BinOp::Gt => (x > y) as i64,
        BinOp::Ge => (x >= y) as i64,
        BinOp::BitOr => x | y,
        BinOp::BitXor => x ^ y,
        BinOp::BitAnd => x & y,
        BinOp::Add => x.checked_add(y)?,
        BinOp::Sub => x.checked_sub(y)?,
        BinOp::Mul => x.checked_mul(y)?,
        BinOp::Div => x.checked_div_euclid(y)?,
        // Indices wrap by at most one period in most algorithms (`(r + 1) % p`, `(r - s) % p`): add or take the
        // divisor once rather than divide, as a 64-bit division costs tens of cycles on every transfer.
        BinOp::Rem if y > 0 && (0..y).contains(&x) => x,
        BinOp::Rem if y > 0 && x < 0 && x >= -y => x + y,
        BinOp::Rem if y > 0 && x >= y && x - y < y => x - y,
        BinOp::Rem => x.checked_rem_euclid(y)?,
        BinOp::Shl | BinOp::Shr if !(0..64).contains(&y) => return None,
        BinOp::Shl => Some(x << y).filter(|s| s >> y == x)?,
        BinOp::Shr => x >> y,
        BinOp::Pow => x.checked_pow(u32::try_from(y).ok()?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::Machine;
    use crate::lower::resolve::RExpr;
    use crate::Limits;
    use collc_grammar::ast::{BinOp, Span};

    /// `%` is mathematical modulo (the sign of the divisor) on the shortcut paths and the dividing one alike.
    #[test]
    fn modulo_matches_rem_euclid_around_every_shortcut() {
        let limits = Limits::default();
        let mut machine = Machine { fns: &[], globals: Vec::new(), fuel: u64::MAX, depth: 0, limits: &limits };
        let span = Span::default();
        for y in [1i64, 2, 7, 1024, -3, -1024] {
            for x in
                [-3 * y, -y - 1, -y, -y + 1, -1, 0, 1, y - 1, y, y + 1, 2 * y - 1, 2 * y, 5 * y + 3, i64::MIN, i64::MAX]
            {
                let expr =
                    RExpr::Binary(BinOp::Rem, Box::new(RExpr::Const(x, span)), Box::new(RExpr::Const(y, span)), span);
                let expected = x.checked_rem_euclid(y);
                assert_eq!(machine.eval(&expr, &[]).ok(), expected, "{x} % {y}");
            }
        }
    }
}
