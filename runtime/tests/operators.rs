//! Users' operators compiled with cranelift for the host executor, against the reference evaluation (`Typed::eval`),
//! bit for bit on every data type an operator types on and every pair of edge values (`check::edge_pairs`); where
//! both give a NaN, its payload may differ only as the hardware picks between two NaN operands. The CUDA source
//! generated from them is tested the same way in `exec/device/tests.rs` (built for the CPU) and compiled by NVRTC in
//! `exec/device/cuda`'s tests.

use collc_compiler::operator::parse_operators;
use collc_kernels::operator::UserOp;
use collc_kernels::DataType;
use collc_runtime::check::{edge_pairs, is_nan, EVERY_OPERATOR};

/// Every construct of the language, compiled with cranelift (in vectors where the operator allows), computes what
/// the reference evaluation computes, bit for bit, on every data type it types on and every pair of edge values (a
/// result both compute as NaN may differ in its payload only where x86 and the reference pick different NaN
/// operands).
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
    let (mut compiled, mut vectorized) = (0, 0);
    for operator in
        parse_operators(&format!("{source}{EVERY_OPERATOR}"), &Default::default()).expect("the operators compile")
    {
        let name = operator.name.clone();
        let op = UserOp::register(operator).expect("room in the registry");
        for &dtype in DataType::ALL {
            let Ok(prepared) = op.prepare(dtype) else { continue };
            let native = prepared.native.clone().unwrap_or_else(|e| panic!("{e}"));
            compiled += 1;
            vectorized += usize::from(native.lanes > 1);
            let size = dtype.size_bytes();
            let (a, b) = edge_pairs(dtype);
            let mut compiled_out = vec![0u8; a.len()];
            // SAFETY: three buffers of the same whole number of elements.
            unsafe { (native.kernel)(compiled_out.as_mut_ptr(), a.as_ptr(), b.as_ptr(), a.len() / size) };
            let mut want = [0u8; 8];
            for k in 0..a.len() / size {
                let at = k * size..(k + 1) * size;
                prepared.typed.eval(&a[at.clone()], &b[at.clone()], &mut want[..size]);
                let both_nan = is_nan(dtype, &want[..size]) && is_nan(dtype, &compiled_out[at.clone()]);
                assert!(
                    compiled_out[at.clone()] == want[..size] || both_nan,
                    "`{}` on {dtype}: a={:02x?} b={:02x?}: compiled {:02x?}, reference {:02x?}",
                    name,
                    &a[at.clone()],
                    &b[at.clone()],
                    &compiled_out[at.clone()],
                    &want[..size]
                );
            }
        }
    }
    assert!(compiled >= 60, "most operators type on most types: {compiled}");
    assert!(vectorized >= 30, "absmax, minmax, pick and cmp on most types, mean on floats: {vectorized}");
}
