//! A checked operator compiled with cranelift into a native reduction loop, `dst[i] = a[i] (op) b[i]`, computing
//! what [`Typed::eval`] computes, bit for bit.
//!
//! Values live in registers as the narrowest cranelift type that holds them: integer types in their own width,
//! `half` and `bfloat16` as `f32` values already rounded to their type, `bool` as an `i8` of 0 or 1. Every float
//! operation of a half type is computed in `f32` and rounded back (docs/language.md §16); the roundings, the half
//! types' loads and stores and the float remainder call small Rust functions (`half`'s conversions, the ones the
//! reference uses), everything else is inline.
//!
//! Where every node of the operator computes in the element's own width (no casts, no integer `/` or `%`, no float
//! `%`), the loop runs on 128-bit vectors first (x64's widest in cranelift), comparisons as lane masks and selects as
//! `bitselect`, the half types as `f32x4` with their conversions and rounding inline, then element by element for
//! the tail. Anything cranelift cannot lower that way falls back to the scalar loop.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, AbiParam, FuncRef, InstBuilder, MemFlagsData, Signature, Type, Value};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};
use half::{bf16, f16};

use super::{rep, Binary, Rep, TKind, TNode, Ty, Typed, Unary, Val};
use crate::DataType;

/// `dst[i] = a[i] (op) b[i]` for `n` elements: the host kernels' reduction signature.
pub type NativeKernel = unsafe extern "C" fn(*mut u8, *const u8, *const u8, usize);

/// An operator compiled for one data type: its loop, and the elements each iteration of its main loop takes (1: a
/// scalar loop; more: a vector loop, then a scalar tail).
#[derive(Clone, Copy, Debug)]
pub struct Native {
    pub kernel: NativeKernel,
    pub lanes: u32,
}

/// The Rust functions the generated code calls, by the names it declares them under.
const HELPERS: &[(&str, *const u8, &[Type], Type)] = &[
    ("round_f16", round_f16 as *const u8, &[types::F64], types::F32),
    ("round_bf16", round_bf16 as *const u8, &[types::F64], types::F32),
    ("load_f16", load_f16 as *const u8, &[types::I32], types::F32),
    ("load_bf16", load_bf16 as *const u8, &[types::I32], types::F32),
    ("store_f16", store_f16 as *const u8, &[types::F32], types::I32),
    ("store_bf16", store_bf16 as *const u8, &[types::F32], types::I32),
    ("rem_f32", rem_f32 as *const u8, &[types::F32, types::F32], types::F32),
    ("rem_f64", rem_f64 as *const u8, &[types::F64, types::F64], types::F64),
];

extern "C" fn round_f16(v: f64) -> f32 {
    f16::from_f32(v as f32).to_f32()
}
extern "C" fn round_bf16(v: f64) -> f32 {
    bf16::from_f32(v as f32).to_f32()
}
extern "C" fn load_f16(bits: u32) -> f32 {
    f16::from_bits(bits as u16).to_f64() as f32
}
extern "C" fn load_bf16(bits: u32) -> f32 {
    bf16::from_bits(bits as u16).to_f64() as f32
}
extern "C" fn store_f16(v: f32) -> u32 {
    u32::from(f16::from_f32(v).to_bits())
}
extern "C" fn store_bf16(v: f32) -> u32 {
    u32::from(bf16::from_f32(v).to_bits())
}
extern "C" fn rem_f32(x: f32, y: f32) -> f32 {
    x % y
}
extern "C" fn rem_f64(x: f64, y: f64) -> f64 {
    x % y
}

/// The cranelift type a value of `rep` lives in.
fn ir_type(rep: Rep) -> Type {
    match rep {
        Rep::Int { bits: 8, .. } | Rep::Bool => types::I8,
        Rep::Int { bits: 32, .. } => types::I32,
        Rep::Int { .. } => types::I64,
        Rep::F16 | Rep::Bf16 | Rep::F32 => types::F32,
        Rep::F64 => types::F64,
    }
}

/// Elements a 128-bit vector of `dtype`'s computing type holds, where the vector loop applies to it.
fn lanes(dtype: DataType) -> Option<u32> {
    match dtype {
        DataType::I8 | DataType::U8 => Some(16),
        DataType::I32 | DataType::U32 | DataType::F32 | DataType::Bf16 | DataType::F16 => Some(4),
        DataType::I64 | DataType::U64 | DataType::F64 => Some(2),
    }
}

/// Whether every node computes in the element's width, lane for lane.
fn vectorizable(node: &TNode, dtype: DataType) -> bool {
    let float = dtype.is_float();
    match &node.kind {
        TKind::A | TKind::B | TKind::Lit(_) => true,
        TKind::Unary(_, e) => vectorizable(e, dtype),
        TKind::Binary(op, l, r) => {
            let divides = matches!(op, Binary::Rem) || (*op == Binary::Div && !float);
            !divides && vectorizable(l, dtype) && vectorizable(r, dtype)
        }
        TKind::Select(c, x, y) => vectorizable(c, dtype) && vectorizable(x, dtype) && vectorizable(y, dtype),
        TKind::Cast(_) => false,
    }
}

impl Typed {
    /// The operator as native code for this machine (a vector loop where the operator allows one), or why cranelift
    /// could not make it (the caller then evaluates the expression instead).
    pub fn compile(&self) -> Result<Native, String> {
        let vector = lanes(self.dtype).filter(|_| vectorizable(&self.body, self.dtype));
        let vectors = vector.and_then(|lanes| Some(Native { kernel: compile(self, lanes).ok()?, lanes }));
        let scalar = || compile(self, 1).map(|kernel| Native { kernel, lanes: 1 });
        vectors
            .map_or_else(scalar, Ok)
            .map_err(|e| format!("cranelift could not compile `{}` for {}: {e}", self.name, self.dtype))
    }
}

/// The loop, `lanes` elements per iteration (1: scalar only; more: vectors, then a scalar tail).
fn compile(typed: &Typed, lanes: u32) -> Result<NativeKernel, Box<dyn std::error::Error>> {
    let mut flags = settings::builder();
    flags.set("opt_level", "speed")?;
    flags.set("use_colocated_libcalls", "false")?;
    flags.set("is_pic", "false")?;
    let isa = cranelift_native::builder()?.finish(settings::Flags::new(flags))?;
    let mut jit = JITBuilder::with_isa(isa, default_libcall_names());
    for &(name, address, _, _) in HELPERS {
        jit.symbol(name, address);
    }
    let mut module = JITModule::new(jit);
    let pointer = module.target_config().pointer_type();
    let call_conv = module.target_config().default_call_conv;

    let mut helpers = Vec::new();
    for &(name, _, params, result) in HELPERS {
        let mut sig = Signature::new(call_conv);
        sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        sig.returns.push(AbiParam::new(result));
        helpers.push(module.declare_function(name, Linkage::Import, &sig)?);
    }

    let mut ctx = module.make_context();
    ctx.func.signature.params.extend([AbiParam::new(pointer); 4]);
    let id = module.declare_function("reduce", Linkage::Export, &ctx.func.signature)?;
    let mut fctx = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let refs: Vec<FuncRef> = helpers.iter().map(|&h| module.declare_func_in_func(h, b.func)).collect();
        let (entry, header, body, exit) = (b.create_block(), b.create_block(), b.create_block(), b.create_block());
        b.append_block_params_for_function_params(entry);
        b.append_block_param(header, pointer);
        b.switch_to_block(entry);
        let [dst, a, bp, n] = [0, 1, 2, 3].map(|k| b.block_params(entry)[k]);
        let zero = b.ins().iconst(pointer, 0);
        let size = typed.dtype.size_bytes() as i64;
        if lanes > 1 {
            // Whole vectors while `lanes` more elements remain, then the scalar loop from where they stopped.
            let (vheader, vbody) = (b.create_block(), b.create_block());
            b.append_block_param(vheader, pointer);
            b.ins().jump(vheader, &[zero.into()]);
            b.switch_to_block(vheader);
            let i = b.block_params(vheader)[0];
            let end = b.ins().iadd_imm_s(i, i64::from(lanes));
            let fits = b.ins().icmp(IntCC::UnsignedLessThanOrEqual, end, n);
            b.ins().brif(fits, vbody, &[], header, &[i.into()]);
            b.switch_to_block(vbody);
            let offset = b.ins().imul_imm_s(i, size);
            let (at_a, at_b, at_dst) = (b.ins().iadd(a, offset), b.ins().iadd(bp, offset), b.ins().iadd(dst, offset));
            let mut emit = Emit { b: &mut b, dtype: typed.dtype, helpers: refs.clone(), a: None, b_val: None, lanes };
            let va = emit.load(at_a);
            let vb = emit.load(at_b);
            (emit.a, emit.b_val) = (Some(va), Some(vb));
            let result = emit.value(&typed.body);
            emit.store(result, at_dst);
            b.ins().jump(vheader, &[end.into()]);
        } else {
            b.ins().jump(header, &[zero.into()]);
        }

        b.switch_to_block(header);
        let i = b.block_params(header)[0];
        let more = b.ins().icmp(IntCC::UnsignedLessThan, i, n);
        b.ins().brif(more, body, &[], exit, &[]);

        b.switch_to_block(body);
        let offset = b.ins().imul_imm_s(i, size);
        let (at_a, at_b, at_dst) = (b.ins().iadd(a, offset), b.ins().iadd(bp, offset), b.ins().iadd(dst, offset));
        let mut emit = Emit { b: &mut b, dtype: typed.dtype, helpers: refs, a: None, b_val: None, lanes: 1 };
        let va = emit.load(at_a);
        let vb = emit.load(at_b);
        (emit.a, emit.b_val) = (Some(va), Some(vb));
        let result = emit.value(&typed.body);
        emit.store(result, at_dst);
        let next = b.ins().iadd_imm_s(i, 1);
        b.ins().jump(header, &[next.into()]);

        b.switch_to_block(exit);
        b.ins().return_(&[]);
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    module.define_function(id, &mut ctx)?;
    module.clear_context(&mut ctx);
    module.finalize_definitions()?;
    let code = module.get_finalized_function(id);
    // The code lives as long as the process: operators are registered once and never dropped.
    std::mem::forget(module);
    // SAFETY: the function was built with `NativeKernel`'s signature in the target's default calling convention.
    Ok(unsafe { std::mem::transmute::<*const u8, NativeKernel>(code) })
}

struct Emit<'f, 'b> {
    b: &'f mut FunctionBuilder<'b>,
    dtype: DataType,
    helpers: Vec<FuncRef>,
    a: Option<Value>,
    b_val: Option<Value>,
    /// Elements per value: 1, or a vector's lanes.
    lanes: u32,
}

/// `ty` as a vector of `lanes` (itself for one).
fn widened(ty: Type, lanes: u32) -> Type {
    match lanes {
        1 => ty,
        lanes => ty.by(lanes).expect("a 128-bit vector type"),
    }
}

impl Emit<'_, '_> {
    fn call(&mut self, name: &str, args: &[Value]) -> Value {
        let k = HELPERS.iter().position(|h| h.0 == name).expect("a declared helper");
        let call = self.b.ins().call(self.helpers[k], args);
        self.b.inst_results(call)[0]
    }

    fn elem(&self) -> Rep {
        rep(Ty::Elem, self.dtype)
    }

    /// A value's type: `rep`'s, in vectors as wide as the element's (a bool is a lane mask of the element's width).
    fn ty(&self, rep: Rep) -> Type {
        let scalar = match (rep, self.lanes) {
            (Rep::Bool, 1) => types::I8,
            (Rep::Bool, _) => ir_type(self.elem()).as_int(),
            (rep, _) => ir_type(rep),
        };
        widened(scalar, self.lanes)
    }

    fn vector(&self) -> bool {
        self.lanes > 1
    }

    /// `x` where `mask` (a bool) is set, else `y`.
    fn choose(&mut self, mask: Value, x: Value, y: Value) -> Value {
        if !self.vector() {
            return self.b.ins().select(mask, x, y);
        }
        let ty = self.b.func.dfg.value_type(x);
        let mask = match self.b.func.dfg.value_type(mask) == ty {
            true => mask,
            false => self.b.ins().bitcast(ty, MemFlagsData::new(), mask),
        };
        self.b.ins().bitselect(mask, x, y)
    }

    fn splat_int(&mut self, lane: Type, v: i64) -> Value {
        let scalar = self.b.ins().iconst(lane, v);
        self.b.ins().splat(lane.by(self.lanes).expect("a vector"), scalar)
    }

    /// bfloat16 lanes in `f32x4` (`bits`: i32x4 of the f32 bits) rounded to bfloat16 as `half` rounds (nearest even,
    /// a NaN made quiet), as `f32x4`.
    fn round_bf16_lanes(&mut self, bits: Value) -> Value {
        let nan = self.nan_lanes(bits);
        let high = self.splat_int(types::I32, 0xFFFF_0000u32 as i64);
        let kept = self.b.ins().band(bits, high);
        let quiet_bit = self.splat_int(types::I32, 0x0040_0000);
        let quiet = self.b.ins().bor(kept, quiet_bit);
        let (half, sticky, zero) =
            (self.splat_int(types::I32, 0x8000), self.splat_int(types::I32, 0x1_7FFF), self.splat_int(types::I32, 0));
        let at_half = self.b.ins().band(bits, half);
        let at_half = self.b.ins().icmp(IntCC::NotEqual, at_half, zero);
        let odd_or_more = self.b.ins().band(bits, sticky);
        let odd_or_more = self.b.ins().icmp(IntCC::NotEqual, odd_or_more, zero);
        let up = self.b.ins().band(at_half, odd_or_more);
        let one = self.splat_int(types::I32, 0x1_0000);
        let step = self.b.ins().band(up, one);
        let rounded = self.b.ins().iadd(kept, step);
        let result = self.b.ins().bitselect(nan, quiet, rounded);
        self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), result)
    }

    /// The lanes of `bits` (i32x4 of f32 bits) that are NaNs, as a mask.
    fn nan_lanes(&mut self, bits: Value) -> Value {
        let magnitude = self.splat_int(types::I32, 0x7FFF_FFFF);
        let magnitude = self.b.ins().band(bits, magnitude);
        let infinity = self.splat_int(types::I32, 0x7F80_0000);
        self.b.ins().icmp(IntCC::UnsignedGreaterThan, magnitude, infinity)
    }

    /// Half values (i32x4 of their bits) as `f32x4`, exactly, a NaN made quiet with its payload (as F16C and `half`
    /// widen): exponent and mantissa moved into f32's places and scaled by 2^112 (which makes subnormals normal),
    /// infinities and NaNs rebuilt, the sign put back.
    fn widen_f16_lanes(&mut self, h: Value) -> Value {
        let flags = MemFlagsData::new();
        let (sign_mask, magnitude_mask) = (self.splat_int(types::I32, 0x8000), self.splat_int(types::I32, 0x7FFF));
        let sign = self.b.ins().band(h, sign_mask);
        let sign = self.b.ins().ishl_imm_s(sign, 16);
        let em = self.b.ins().band(h, magnitude_mask);
        let moved = self.b.ins().ishl_imm_s(em, 13);
        let moved = self.b.ins().bitcast(types::F32X4, flags, moved);
        let scale = self.b.ins().f32const(f32::from_bits(0x7780_0000));
        let scale = self.b.ins().splat(types::F32X4, scale);
        let finite = self.b.ins().fmul(moved, scale);
        let finite = self.b.ins().bitcast(types::I32X4, flags, finite);
        let infinity = self.splat_int(types::I32, 0x7C00);
        let special = self.b.ins().icmp(IntCC::UnsignedGreaterThanOrEqual, em, infinity);
        let nan = self.b.ins().icmp(IntCC::UnsignedGreaterThan, em, infinity);
        let mantissa_mask = self.splat_int(types::I32, 0x3FF);
        let mantissa = self.b.ins().band(em, mantissa_mask);
        let mantissa = self.b.ins().ishl_imm_s(mantissa, 13);
        let f32_infinity = self.splat_int(types::I32, 0x7F80_0000);
        let quiet_bit = self.splat_int(types::I32, 0x0040_0000);
        let quiet = self.b.ins().band(nan, quiet_bit);
        let rebuilt = self.b.ins().bor(f32_infinity, mantissa);
        let rebuilt = self.b.ins().bor(rebuilt, quiet);
        let bits = self.b.ins().bitselect(special, rebuilt, finite);
        let bits = self.b.ins().bor(bits, sign);
        self.b.ins().bitcast(types::F32X4, flags, bits)
    }

    /// `f32x4` lanes rounded to half (nearest even, as F16C and `half` round; a NaN quiet with the top of its
    /// payload, as `half` makes it), as i32x4 of the half bits: subnormals by adding a magic float whose exponent
    /// lines the half's last mantissa bit up with f32's (the FPU rounds), normals by rebiasing the exponent and
    /// adding half an ulp less one plus the odd bit, overflow to infinity.
    fn narrow_f16_lanes(&mut self, v: Value) -> Value {
        let flags = MemFlagsData::new();
        let x = self.b.ins().bitcast(types::I32X4, flags, v);
        let sign_mask = self.splat_int(types::I32, 0x8000_0000u32 as i64);
        let sign = self.b.ins().band(x, sign_mask);
        let a = self.b.ins().bxor(x, sign);
        let sign = self.b.ins().ushr_imm_s(sign, 16);
        // Infinity, NaN, and what overflows half (|x| >= 65536, rounded or not).
        let f16_overflow = self.splat_int(types::I32, (127 + 16) << 23);
        let big = self.b.ins().icmp(IntCC::UnsignedGreaterThanOrEqual, a, f16_overflow);
        let f32_infinity = self.splat_int(types::I32, 0x7F80_0000);
        let nan = self.b.ins().icmp(IntCC::UnsignedGreaterThan, a, f32_infinity);
        let mantissa_mask = self.splat_int(types::I32, 0x7F_FFFF);
        let payload = self.b.ins().band(a, mantissa_mask);
        let payload = self.b.ins().ushr_imm_s(payload, 13);
        let quiet_nan = self.splat_int(types::I32, 0x7E00);
        let nan_bits = self.b.ins().bor(quiet_nan, payload);
        let infinity = self.splat_int(types::I32, 0x7C00);
        let big_bits = self.b.ins().bitselect(nan, nan_bits, infinity);
        // Subnormal results (|x| < 2^-14).
        let smallest_normal = self.splat_int(types::I32, 113 << 23);
        let subnormal = self.b.ins().icmp(IntCC::UnsignedLessThan, a, smallest_normal);
        let magic = self.splat_int(types::I32, ((127 - 15) + (23 - 10) + 1) << 23);
        let (a_float, magic_float) =
            (self.b.ins().bitcast(types::F32X4, flags, a), self.b.ins().bitcast(types::F32X4, flags, magic));
        let summed = self.b.ins().fadd(a_float, magic_float);
        let summed = self.b.ins().bitcast(types::I32X4, flags, summed);
        let subnormal_bits = self.b.ins().isub(summed, magic);
        // Normal results.
        let odd = self.b.ins().ushr_imm_s(a, 13);
        let one = self.splat_int(types::I32, 1);
        let odd = self.b.ins().band(odd, one);
        let rebias = self.splat_int(types::I32, ((15 - 127) << 23) + 0xFFF);
        let normal = self.b.ins().iadd(a, rebias);
        let normal = self.b.ins().iadd(normal, odd);
        let normal_bits = self.b.ins().ushr_imm_s(normal, 13);
        let small = self.b.ins().bitselect(subnormal, subnormal_bits, normal_bits);
        let bits = self.b.ins().bitselect(big, big_bits, small);
        self.b.ins().bor(bits, sign)
    }

    fn load(&mut self, at: Value) -> Value {
        let flags = MemFlagsData::new();
        if self.vector() {
            if self.dtype == DataType::F16 {
                let bits = self.b.ins().uload16x4(flags, at, 0);
                return self.widen_f16_lanes(bits);
            }
            if self.dtype != DataType::Bf16 {
                let ty = self.ty(self.elem());
                return self.b.ins().load(ty, flags, at, 0);
            }
            // Four bfloat16s widened to the top halves of f32 lanes, a NaN made quiet (as `half` loads it).
            let bits = self.b.ins().uload16x4(flags, at, 0);
            let bits = self.b.ins().ishl_imm_s(bits, 16);
            let nan = self.nan_lanes(bits);
            let quiet_bit = self.splat_int(types::I32, 0x0040_0000);
            let quiet = self.b.ins().band(nan, quiet_bit);
            let bits = self.b.ins().bor(bits, quiet);
            return self.b.ins().bitcast(types::F32X4, flags, bits);
        }
        match self.elem() {
            rep @ (Rep::F16 | Rep::Bf16) => {
                let bits = self.b.ins().load(types::I16, flags, at, 0);
                let bits = self.b.ins().uextend(types::I32, bits);
                self.call(if rep == Rep::F16 { "load_f16" } else { "load_bf16" }, &[bits])
            }
            rep => self.b.ins().load(ir_type(rep), flags, at, 0),
        }
    }

    fn store(&mut self, v: Value, at: Value) {
        let flags = MemFlagsData::new();
        if self.vector() {
            let bits = match self.dtype {
                // The lanes are half values already (every operation rounds): converted exactly.
                DataType::F16 => self.narrow_f16_lanes(v),
                // bfloat16 values already: their top halves.
                DataType::Bf16 => {
                    let bits = self.b.ins().bitcast(types::I32X4, flags, v);
                    self.b.ins().ushr_imm_s(bits, 16)
                }
                _ => {
                    self.b.ins().store(flags, v, at, 0);
                    return;
                }
            };
            let narrow = self.b.ins().unarrow(bits, bits);
            let little = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
            let words = self.b.ins().bitcast(types::I64X2, little, narrow);
            let low = self.b.ins().extractlane(words, 0);
            self.b.ins().store(flags, low, at, 0);
            return;
        }
        match self.elem() {
            rep @ (Rep::F16 | Rep::Bf16) => {
                let bits = self.call(if rep == Rep::F16 { "store_f16" } else { "store_bf16" }, &[v]);
                let bits = self.b.ins().ireduce(types::I16, bits);
                self.b.ins().store(flags, bits, at, 0);
            }
            _ => {
                self.b.ins().store(flags, v, at, 0);
            }
        }
    }

    /// An `f64` or `f32` value rounded to a half type (as `f32`); other reps as they are.
    fn round(&mut self, v: Value, to: Rep) -> Value {
        if self.vector() {
            return match to {
                Rep::Bf16 => {
                    let bits = self.b.ins().bitcast(types::I32X4, MemFlagsData::new(), v);
                    self.round_bf16_lanes(bits)
                }
                Rep::F16 => {
                    let half = self.narrow_f16_lanes(v);
                    self.widen_f16_lanes(half)
                }
                _ => v,
            };
        }
        let helper = match to {
            Rep::F16 => "round_f16",
            Rep::Bf16 => "round_bf16",
            _ => return v,
        };
        let wide = match self.b.func.dfg.value_type(v) {
            types::F64 => v,
            _ => self.b.ins().fpromote(types::F64, v),
        };
        self.call(helper, &[wide])
    }

    fn value(&mut self, node: &TNode) -> Value {
        let here = rep(node.ty, self.dtype);
        match &node.kind {
            TKind::A => self.a.expect("loaded"),
            TKind::B => self.b_val.expect("loaded"),
            TKind::Lit(v) => self.literal(*v, here),
            TKind::Unary(op, e) => {
                let x = self.value(e);
                self.unary(*op, x, here)
            }
            TKind::Binary(op, l, r) => {
                let operands = rep(l.ty, self.dtype);
                let (x, y) = (self.value(l), self.value(r));
                self.binary(*op, x, y, operands)
            }
            TKind::Select(c, x, y) => {
                let (c, x, y) = (self.value(c), self.value(x), self.value(y));
                self.choose(c, x, y)
            }
            TKind::Cast(e) => {
                let from = rep(e.ty, self.dtype);
                let x = self.value(e);
                self.convert(x, from, here)
            }
        }
    }

    fn literal(&mut self, v: Val, rep: Rep) -> Value {
        if self.vector() {
            let lane = self.ty(rep).lane_type();
            let scalar = match v {
                Val::Bool(v) => self.b.ins().iconst(lane, -i64::from(v)),
                Val::Int(v) => self.b.ins().iconst(lane, v as i64),
                Val::Float(v) if rep == Rep::F64 => self.b.ins().f64const(v),
                Val::Float(v) => self.b.ins().f32const(v as f32),
            };
            let ty = self.ty(rep);
            return self.b.ins().splat(ty, scalar);
        }
        let ins = self.b.ins();
        match v {
            Val::Int(v) => ins.iconst(ir_type(rep), v as i64),
            Val::Bool(v) => ins.iconst(types::I8, i64::from(v)),
            Val::Float(v) if rep == Rep::F64 => ins.f64const(v),
            Val::Float(v) => ins.f32const(v as f32),
        }
    }

    fn unary(&mut self, op: Unary, x: Value, rep: Rep) -> Value {
        let ins = self.b.ins();
        match (op, rep) {
            (Unary::Not, _) if self.lanes > 1 => ins.bnot(x),
            (Unary::Not, _) => ins.bxor_imm_s(x, 1),
            (Unary::Neg, Rep::Int { .. }) => ins.ineg(x),
            (Unary::Abs, Rep::Int { signed: true, .. }) => ins.iabs(x),
            (Unary::Abs, Rep::Int { signed: false, .. }) => x,
            (Unary::Neg, _) => ins.fneg(x),
            (Unary::Abs, _) => ins.fabs(x),
        }
    }

    fn binary(&mut self, op: Binary, x: Value, y: Value, rep: Rep) -> Value {
        match rep {
            Rep::Bool => match op {
                Binary::And => self.b.ins().band(x, y),
                _ => self.b.ins().bor(x, y),
            },
            Rep::Int { signed, .. } => self.int_binary(op, x, y, signed),
            _ => self.float_binary(op, x, y, rep),
        }
    }

    fn int_binary(&mut self, op: Binary, x: Value, y: Value, signed: bool) -> Value {
        let cc = |s: IntCC, u: IntCC| if signed { s } else { u };
        let ins = self.b.ins();
        match op {
            Binary::Add => ins.iadd(x, y),
            Binary::Sub => ins.isub(x, y),
            Binary::Mul => ins.imul(x, y),
            Binary::Div | Binary::Rem => self.int_divide(op, x, y, signed),
            Binary::Min if signed => ins.smin(x, y),
            Binary::Min => ins.umin(x, y),
            Binary::Max if signed => ins.smax(x, y),
            Binary::Max => ins.umax(x, y),
            Binary::Lt => ins.icmp(cc(IntCC::SignedLessThan, IntCC::UnsignedLessThan), x, y),
            Binary::Le => ins.icmp(cc(IntCC::SignedLessThanOrEqual, IntCC::UnsignedLessThanOrEqual), x, y),
            Binary::Gt => ins.icmp(cc(IntCC::SignedGreaterThan, IntCC::UnsignedGreaterThan), x, y),
            Binary::Ge => ins.icmp(cc(IntCC::SignedGreaterThanOrEqual, IntCC::UnsignedGreaterThanOrEqual), x, y),
            Binary::Eq => ins.icmp(IntCC::Equal, x, y),
            Binary::Ne => ins.icmp(IntCC::NotEqual, x, y),
            Binary::And | Binary::Or => unreachable!("bool operands"),
        }
    }

    /// Integer `/` and `%` that never trap: by 0 they give 0, and `MIN / -1` wraps (its remainder is 0). Computed
    /// in 64 bits, so a narrow type cannot overflow; 64-bit signed division by -1 is a negation.
    fn int_divide(&mut self, op: Binary, x: Value, y: Value, signed: bool) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        let widen = |b: &mut FunctionBuilder, v: Value| match (ty == types::I64, signed) {
            (true, _) => v,
            (false, true) => b.ins().sextend(types::I64, v),
            (false, false) => b.ins().uextend(types::I64, v),
        };
        let (x, y) = (widen(self.b, x), widen(self.b, y));
        let ins = self.b.ins();
        let zero = ins.iconst(types::I64, 0);
        let one = self.b.ins().iconst(types::I64, 1);
        let by_zero = self.b.ins().icmp_imm_s(IntCC::Equal, y, 0);
        let result = if signed {
            let by_minus_one = self.b.ins().icmp_imm_s(IntCC::Equal, y, -1);
            let special = self.b.ins().bor(by_zero, by_minus_one);
            let safe = self.b.ins().select(special, one, y);
            match op {
                Binary::Div => {
                    let q = self.b.ins().sdiv(x, safe);
                    let negated = self.b.ins().ineg(x);
                    let q = self.b.ins().select(by_minus_one, negated, q);
                    self.b.ins().select(by_zero, zero, q)
                }
                _ => {
                    let r = self.b.ins().srem(x, safe);
                    self.b.ins().select(special, zero, r)
                }
            }
        } else {
            let safe = self.b.ins().select(by_zero, one, y);
            let q = match op {
                Binary::Div => self.b.ins().udiv(x, safe),
                _ => self.b.ins().urem(x, safe),
            };
            self.b.ins().select(by_zero, zero, q)
        };
        match ty == types::I64 {
            true => result,
            false => self.b.ins().ireduce(ty, result),
        }
    }

    fn float_binary(&mut self, op: Binary, x: Value, y: Value, rep: Rep) -> Value {
        let ins = self.b.ins();
        let computed = match op {
            Binary::Add => ins.fadd(x, y),
            Binary::Sub => ins.fsub(x, y),
            Binary::Mul => ins.fmul(x, y),
            Binary::Div => ins.fdiv(x, y),
            Binary::Rem => {
                let wide = rep == Rep::F64;
                self.call(if wide { "rem_f64" } else { "rem_f32" }, &[x, y])
            }
            Binary::Min | Binary::Max => return self.float_min_max(op, x, y),
            Binary::Lt => return ins.fcmp(FloatCC::LessThan, x, y),
            Binary::Le => return ins.fcmp(FloatCC::LessThanOrEqual, x, y),
            Binary::Gt => return ins.fcmp(FloatCC::GreaterThan, x, y),
            Binary::Ge => return ins.fcmp(FloatCC::GreaterThanOrEqual, x, y),
            Binary::Eq => return ins.fcmp(FloatCC::Equal, x, y),
            Binary::Ne => return ins.fcmp(FloatCC::NotEqual, x, y),
            Binary::And | Binary::Or => unreachable!("number operands"),
        };
        self.round(computed, rep)
    }

    /// The built-in max/min (`crate::element`): a NaN loses to the other operand, and -0 is below +0.
    fn float_min_max(&mut self, op: Binary, x: Value, y: Value) -> Value {
        let ty = self.b.func.dfg.value_type(x);
        let int = ty.as_int();
        let ins = self.b.ins();
        let x_nan = ins.fcmp(FloatCC::Unordered, x, x);
        let y_nan = self.b.ins().fcmp(FloatCC::Unordered, y, y);
        let equal = self.b.ins().fcmp(FloatCC::Equal, x, y);
        let (beats, signed_side) = match op {
            Binary::Max => (self.b.ins().fcmp(FloatCC::GreaterThan, x, y), y),
            _ => (self.b.ins().fcmp(FloatCC::LessThan, x, y), x),
        };
        let bits = self.b.ins().bitcast(int, MemFlagsData::new(), signed_side);
        let negative = match self.vector() {
            true => {
                let zero = self.splat_int(int.lane_type(), 0);
                self.b.ins().icmp(IntCC::SignedLessThan, bits, zero)
            }
            false => self.b.ins().icmp_imm_s(IntCC::SignedLessThan, bits, 0),
        };
        let tie = self.b.ins().band(equal, negative);
        let pick_x = self.b.ins().bor(beats, tie);
        let r = self.choose(pick_x, x, y);
        let r = self.choose(y_nan, x, r);
        self.choose(x_nan, y, r)
    }

    /// `x` of `from` as `to` ([`super::convert`]'s rules).
    fn convert(&mut self, x: Value, from: Rep, to: Rep) -> Value {
        if from == to {
            return x;
        }
        match (from, to) {
            (Rep::Int { bits: fb, signed }, Rep::Int { bits: tb, .. }) => match fb.cmp(&tb) {
                std::cmp::Ordering::Less if signed => self.b.ins().sextend(ir_type(to), x),
                std::cmp::Ordering::Less => self.b.ins().uextend(ir_type(to), x),
                std::cmp::Ordering::Greater => self.b.ins().ireduce(ir_type(to), x),
                std::cmp::Ordering::Equal => x,
            },
            (_, Rep::Int { bits, signed }) => {
                // Saturate into 64 bits (NaN: 0), then clamp into the narrower type.
                let wide = match (bits, signed) {
                    (64, false) => self.b.ins().fcvt_to_uint_sat(types::I64, x),
                    _ => self.b.ins().fcvt_to_sint_sat(types::I64, x),
                };
                if bits == 64 {
                    return wide;
                }
                let (lo, hi) = match signed {
                    true => (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1),
                    false => (0, (1i64 << bits) - 1),
                };
                let (lo, hi) = (self.b.ins().iconst(types::I64, lo), self.b.ins().iconst(types::I64, hi));
                let clamped = self.b.ins().smax(wide, lo);
                let clamped = self.b.ins().smin(clamped, hi);
                self.b.ins().ireduce(ir_type(to), clamped)
            }
            (Rep::Int { bits, signed }, _) => {
                let wide = match (bits, signed) {
                    (64, _) => x,
                    (_, true) => self.b.ins().sextend(types::I64, x),
                    (_, false) => self.b.ins().uextend(types::I64, x),
                };
                let float = if to == Rep::F64 { types::F64 } else { types::F32 };
                let v = match signed {
                    true => self.b.ins().fcvt_from_sint(float, wide),
                    false => self.b.ins().fcvt_from_uint(float, wide),
                };
                self.round(v, to)
            }
            (_, Rep::F64) => self.b.ins().fpromote(types::F64, x),
            (Rep::F64, Rep::F32) => self.b.ins().fdemote(types::F32, x),
            // Half types are `f32` values already: widening to `f32` is exact, anything else rounds.
            (_, Rep::F32) => x,
            (_, to) => self.round(x, to),
        }
    }
}
