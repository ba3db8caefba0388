//! The JIT executor (`HostExecutor::Jit`, `collc run --executor jit`): each rank's plan compiled with cranelift, once
//! per prepared plan (a call shape: schedule, count, data type, operator, tile), into one native function that runs
//! a tile in dataflow order. The instructions are unrolled in program order; each is tried in turn, as the
//! interpreter tries its waiting list, and the function loops over them until none can run (then it returns, and
//! `host::drive` waits, checks the peers and the timeout, and calls it again) or all have.
//!
//! Per instruction the code holds as constants what the interpreter looks up: the addresses of its connections'
//! counters and slots, its dependents, the element offsets and lengths of its chunks (whole constants when the call
//! is one tile), and the data type and operator. Flag waits, stamp checks, posts and releases are inline loads and
//! stores of the rings (`link::Ring`). Copies of up to `INLINE_COPY_BYTES` are inline 16-byte moves, and reductions
//! of up to `INLINE_REDUCE_BYTES` inline 128-bit vector operations where cranelift computes the operator as the
//! kernels do (`Lanewise`); larger ones, other operators and the non-temporal stores call the host kernels (AVX-512
//! where the CPU has it). What the inline
//! path does not cover (PreMulSum's factors, fused instructions of more than a block, tiles whose sizes vary)
//! calls the interpreter's own `host::execute` for that instruction, so both compute the same bytes.
//!
//! Only links whose rings are memory both ends map (threads, shm) compile; elsewhere, or for a plan of more than
//! `MAX_STEPS` instructions, the plan runs interpreted, with one WARN per process and reason.

use super::host::{self, Engine, Host, Round};
use super::plan::{Place, Plan, Step, NONE};
use super::{Call, Executor};
use crate::error::RuntimeError;
use crate::link::{Link, Ring, Stamp, SLOTS};
use crate::recorder::Current;
use crate::trace::TraceLog;
use collc_compiler::sched::Op;
use collc_kernels::{DataType, ReduceOp};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, AbiParam, Block, FuncRef, InstBuilder, MemFlagsData, Signature, Type, Value};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, Linkage, Module};
use std::sync::atomic::{AtomicBool, Ordering};

/// Copies up to this many bytes are inline moves; larger ones call the host kernels.
const INLINE_COPY_BYTES: usize = 256;
/// Reductions up to this many bytes are inline 128-bit vector loops (where `Lanewise` covers the operator); larger
/// ones call the host kernels, whose AVX-512 loops are four times as wide.
const INLINE_REDUCE_BYTES: usize = 256;
/// Plans of more instructions than this run interpreted (the function grows with them).
const MAX_STEPS: usize = 8192;

/// Cranelift's optimisation level.
const OPT_LEVEL: &str = "speed";

/// What the compiled function returns.
const DONE: u32 = 0;
const STALLED: u32 = 1;
const PROGRESSED: u32 = 2;
const MISMATCH: u32 = 3;

/// What the compiled function reads and writes besides the rings: one per executor, its pointers set per call.
#[repr(C)]
struct Frame {
    /// `Plan::bases`: where each buffer starts.
    bases: *const *mut u8,
    /// The tile: its first element and the one past its end.
    lo: u64,
    hi: u64,
    seq: u64,
    fingerprint: u64,
    /// Per instruction: whether it ran in this tile, and how many of its dependencies have not.
    done: *mut u8,
    unmet: *mut u32,
    /// Per piece of a send that may go by reference: the reference to its source at element 0 (`u64::MAX`: it may
    /// not in this call).
    tokens: *const u64,
    /// The instruction whose message came from another call (`MISMATCH`).
    failed: u32,
    /// Instructions of the tile still to run.
    remaining: u32,
    /// For `step_data`: the plan, and per link what a reference plus it is here.
    plan: *const Plan,
    deref: *const u64,
    /// The call's trace log while it is recorded (null otherwise), and the tile its spans are of.
    trace: *mut TraceLog,
    tile: u64,
}

// SAFETY: the pointers are the executor's own state (set per call), used by the thread running the call.
unsafe impl Send for Frame {}

macro_rules! frame_at {
    ($field:ident) => {
        std::mem::offset_of!(Frame, $field) as i32
    };
}

/// The function: runs what it can of the tile the frame names.
type Entry = unsafe extern "C" fn(*mut Frame) -> u32;

/// The code's memory, freed with the executor.
struct Code {
    module: Option<JITModule>,
    entry: Entry,
}

// SAFETY: the module is only the code's memory (and its symbol tables), used by one thread at a time.
unsafe impl Send for Code {}

impl Drop for Code {
    fn drop(&mut self) {
        if let Some(module) = self.module.take() {
            // SAFETY: the function is not running (the executor that calls it is being dropped) and no pointer to
            // it is left.
            unsafe { module.free_memory() };
        }
    }
}

/// A plan compiled, over its links.
pub(crate) struct Jit<L> {
    plan: Plan,
    links: Vec<L>,
    code: Code,
    state: State,
}

/// The compiled function's side of the state, with the places of the interpreter's that `drive` and the flight
/// recorder read.
struct State {
    frame: Box<Frame>,
    done: Vec<u8>,
    unmet: Vec<u32>,
    tokens: Vec<u64>,
    deref: Vec<u64>,
    /// The operands of `reduce_kernel`: the call's data type and operator, which the code points at.
    _spec: Box<(DataType, ReduceOp)>,
}

/// The executor for `plan` over `links`: compiled when the plan asks for the JIT (`Plan::jit`) and its links allow,
/// else interpreted.
pub(crate) fn executor<L: Link + 'static>(plan: Plan, mut links: Vec<L>) -> Box<dyn Executor> {
    if !plan.jit {
        return Box::new(Host { plan, links });
    }
    let rings: Option<Vec<Ring>> = links.iter_mut().map(Link::ring).collect();
    let Some(rings) = rings else {
        warn_once(&NO_RINGS, "this transport's links are not rings in shared memory");
        return Box::new(Host { plan, links });
    };
    if plan.steps.len() > MAX_STEPS {
        warn_once(&TOO_LARGE, &format!("a plan has more than {MAX_STEPS} instructions on a rank"));
        return Box::new(Host { plan, links });
    }
    let spec = Box::new((plan.dtype, plan.op));
    match compile(&plan, &rings, &spec) {
        Ok(code) => {
            let n = plan.steps.len();
            let deref = rings.iter().map(|r| r.deref_base).collect();
            let frame = Box::new(Frame {
                bases: std::ptr::null(),
                lo: 0,
                hi: 0,
                seq: 0,
                fingerprint: plan.fingerprint,
                done: std::ptr::null_mut(),
                unmet: std::ptr::null_mut(),
                tokens: std::ptr::null(),
                failed: 0,
                remaining: 0,
                plan: std::ptr::null(),
                deref: std::ptr::null(),
                trace: std::ptr::null_mut(),
                tile: 0,
            });
            let tokens = vec![u64::MAX; plan.pieces.len()];
            let state = State { frame, done: vec![0; n], unmet: vec![0; n], tokens, deref, _spec: spec };
            Box::new(Jit { plan, links, code, state })
        }
        Err(why) => {
            warn_once(&NO_CODE, &format!("cranelift could not compile a plan: {why}"));
            Box::new(Host { plan, links })
        }
    }
}

static NO_RINGS: AtomicBool = AtomicBool::new(false);
static TOO_LARGE: AtomicBool = AtomicBool::new(false);
static NO_CODE: AtomicBool = AtomicBool::new(false);

fn warn_once(flag: &AtomicBool, why: &str) {
    if !flag.swap(true, Ordering::Relaxed) {
        let what = format_args!("the jit executor: {why}; such plans run interpreted");
        crate::log::warn(crate::log::Subsys::Coll, what);
    }
}

impl<L: Link> Executor for Jit<L> {
    fn plan_mut(&mut self) -> &mut Plan {
        &mut self.plan
    }

    fn run(&mut self, call: &Call) -> Result<(), RuntimeError> {
        let Jit { plan, links, code, state } = self;
        state.tokens_for(plan, links);
        state.frame_for(plan, call.seq);
        let mut engine = Compiled { code, state };
        host::drive(plan, links, &mut engine, call)
    }

    fn refs_outstanding(&self) -> bool {
        self.links.iter().any(|link| link.refs_outstanding())
    }

    fn settle(&self, bootstrap: &dyn crate::link::Bootstrap, timeout: std::time::Duration) {
        host::settle_refs(&self.plan, &self.links, bootstrap, timeout)
    }

    fn snapshot(&self, seq: u64) -> Current {
        self.state.snapshot(&self.plan, seq)
    }
}

impl State {
    /// Per call: the reference to each by-reference send's source, where its link can give one for the whole chunk
    /// (the call's buffers may lie inside or outside what peers can read).
    fn tokens_for<L: Link>(&mut self, plan: &Plan, links: &[L]) {
        if plan.factor.is_some() {
            return;
        }
        for step in plan.steps.iter().filter(|s| s.by_reference) {
            let first = step.first_piece as usize;
            for (k, piece) in plan.pieces[first..first + step.n as usize].iter().enumerate() {
                let src = piece.src;
                let at = plan.bases[src.buf as usize].wrapping_add(src.offset * plan.elem);
                let len = src.valid.min(plan.capacity) * plan.elem;
                self.tokens[first + k] = links[step.send as usize].reference(at, len.max(1)).unwrap_or(u64::MAX);
            }
        }
    }

    fn snapshot(&self, plan: &Plan, seq: u64) -> Current {
        host::snapshot_with(plan, seq, |i| {
            let done = self.done[i] != 0;
            let waiting = !done && self.unmet[i] == 0;
            let state = match () {
                _ if done => "done",
                _ if waiting => "waiting",
                _ => "blocked",
            };
            (state, waiting)
        })
    }

    /// Per call: where the compiled code finds this call's buffers, stamp and the state it keeps (the tile it is
    /// in is set per round).
    fn frame_for(&mut self, plan: &Plan, seq: u64) {
        let frame = &mut *self.frame;
        frame.bases = plan.bases.as_ptr();
        (frame.seq, frame.fingerprint) = (seq, plan.fingerprint);
        (frame.done, frame.unmet) = (self.done.as_mut_ptr(), self.unmet.as_mut_ptr());
        frame.tokens = self.tokens.as_ptr();
        (frame.plan, frame.deref) = (plan as *const Plan, self.deref.as_ptr());
    }
}

/// The compiled function as `drive` runs it.
struct Compiled<'a> {
    code: &'a Code,
    state: &'a mut State,
}

impl<L: Link> Engine<L> for Compiled<'_> {
    fn start_tile(&mut self, plan: &mut Plan) {
        self.state.done.fill(0);
        self.state.unmet.copy_from_slice(&plan.unmet_at_start);
        self.state.frame.remaining = plan.steps.len() as u32;
    }

    fn round(
        &mut self,
        plan: &mut Plan,
        links: &mut [L],
        lo: usize,
        hi: usize,
        stamp: Stamp,
        call: &Call,
        trace: Option<&mut TraceLog>,
    ) -> Result<Round, RuntimeError> {
        let frame = &mut *self.state.frame;
        (frame.lo, frame.hi) = (lo as u64, hi as u64);
        frame.trace = trace.map_or(std::ptr::null_mut(), |log| log as *mut TraceLog);
        frame.tile = plan.at_tile as u64;
        // SAFETY: the code was compiled for this plan and these links' rings; the frame points at the call's buffers
        // and the executor's state (`State::frame_for`).
        let outcome = unsafe { (self.code.entry)(frame) };
        match outcome {
            DONE => Ok(Round::Done),
            PROGRESSED => Ok(Round::Progressed),
            STALLED => Ok(Round::Stalled),
            _ => {
                let step = plan.steps[frame.failed as usize];
                let link = &mut links[step.recv as usize];
                let got = link.peek().map_or(stamp, |(got, _)| got);
                let (peer, info) = (plan.links[step.recv as usize].from, link.sender_call());
                Err(host::mismatch(plan, peer, got, info, stamp, call))
            }
        }
    }

    fn waiting_at(&self, plan: &Plan) -> usize {
        let state = &*self.state;
        (0..plan.steps.len()).find(|&i| state.done[i] == 0 && state.unmet[i] == 0).unwrap_or(0)
    }

    fn snapshot(&self, plan: &Plan, seq: u64) -> Current {
        self.state.snapshot(plan, seq)
    }
}

/// `host::execute` for instruction `i` of the frame's tile: what the compiled code calls for what it does not
/// inline. With `refs`, the incoming message holds references, made addresses here first.
unsafe extern "C" fn step_data(frame: *const Frame, i: u32, incoming: *const u8, refs: u64, outgoing: *mut u8) {
    // SAFETY: the compiled code passes its frame, set for this call, and the data areas of the step's messages.
    unsafe {
        let frame = &*frame;
        let plan = &*frame.plan;
        let step = &plan.steps[i as usize];
        let pieces = &plan.pieces[step.first_piece as usize..(step.first_piece + step.n) as usize];
        if refs != 0 {
            let base = *frame.deref.add(step.recv as usize);
            for k in 0..step.n as usize {
                let at = (incoming as *mut u64).add(k);
                at.write(at.read().wrapping_add(base));
            }
        }
        host::execute(plan, step, pieces, incoming, refs != 0, outgoing, frame.lo as usize, frame.hi as usize);
    }
}

/// What the compiled code calls where the frame has a trace log: `event` is twice the instruction's index, plus one
/// once it is done (zero as its data starts to move).
unsafe extern "C" fn trace_step(frame: *const Frame, event: usize) {
    // SAFETY: the compiled code passes its frame, whose `trace` is the log `round` holds for this call (not null,
    // or the code would not call).
    unsafe {
        let frame = &*frame;
        let log = &mut *frame.trace;
        match event % 2 {
            0 => log.open(),
            _ => log.close(event / 2, frame.tile as usize),
        }
    }
}

unsafe extern "C" fn copy_kernel(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the compiled code's operands, inside their buffers and slots.
    unsafe { collc_kernels::host::copy(dst, src, len) }
}

unsafe extern "C" fn copy_streaming_kernel(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: as `copy_kernel`.
    unsafe { collc_kernels::host::copy_streaming(dst, src, len) }
}

unsafe extern "C" fn reduce_kernel(
    spec: *const (DataType, ReduceOp),
    dst: *mut u8,
    a: *const u8,
    b: *const u8,
    n: usize,
) {
    // SAFETY: `spec` is the executor's; the operands are inside their buffers and slots.
    unsafe {
        let (dtype, op) = *spec;
        collc_kernels::host::reduce(dtype, op, dst, a, b, n)
    }
}

/// The helpers the code calls: name, address, parameters.
fn helpers() -> [(&'static str, *const u8, usize); 5] {
    [
        ("collc_step_data", step_data as *const u8, 5),
        ("collc_copy", copy_kernel as *const u8, 3),
        ("collc_copy_streaming", copy_streaming_kernel as *const u8, 3),
        ("collc_reduce", reduce_kernel as *const u8, 5),
        ("collc_trace", trace_step as *const u8, 2),
    ]
}

fn compile(plan: &Plan, rings: &[Ring], spec: &(DataType, ReduceOp)) -> Result<Code, String> {
    let fail = |e: &dyn std::fmt::Display| e.to_string();
    let isa = target()?;
    let mut jit = JITBuilder::with_isa(isa, default_libcall_names());
    for (name, address, _) in helpers() {
        jit.symbol(name, address);
    }
    let mut module = JITModule::new(jit);
    let pointer = module.target_config().pointer_type();
    let call_conv = module.target_config().default_call_conv;
    let mut imported = Vec::new();
    for (name, _, params) in helpers() {
        let mut sig = Signature::new(call_conv);
        sig.params.extend(std::iter::repeat_n(AbiParam::new(pointer), params));
        if name == "collc_step_data" {
            sig.params[1] = AbiParam::new(types::I32);
        }
        imported.push(module.declare_function(name, Linkage::Import, &sig).map_err(|e| fail(&e))?);
    }
    let mut ctx = module.make_context();
    ctx.func.signature.params.push(AbiParam::new(pointer));
    ctx.func.signature.returns.push(AbiParam::new(types::I32));
    let id = module.declare_function("plan", Linkage::Export, &ctx.func.signature).map_err(|e| fail(&e))?;
    let mut fctx = FunctionBuilderContext::new();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let calls: Vec<FuncRef> = imported.iter().map(|&f| module.declare_func_in_func(f, b.func)).collect();
        let mut gen = Gen::new(&mut b, plan, rings, pointer, spec, calls);
        gen.function();
        b.seal_all_blocks();
        b.finalize(module.target_config());
    }
    module.define_function(id, &mut ctx).map_err(|e| format!("{e:?}"))?;
    module.clear_context(&mut ctx);
    module.finalize_definitions().map_err(|e| fail(&e))?;
    let code = module.get_finalized_function(id);
    // SAFETY: the function was built with `Entry`'s signature in the target's default calling convention.
    let entry = unsafe { std::mem::transmute::<*const u8, Entry>(code) };
    Ok(Code { module: Some(module), entry })
}

/// This machine as cranelift's target, made once per process.
fn target() -> Result<cranelift_codegen::isa::OwnedTargetIsa, String> {
    static TARGET: std::sync::OnceLock<Result<cranelift_codegen::isa::OwnedTargetIsa, String>> =
        std::sync::OnceLock::new();
    let made = TARGET.get_or_init(|| {
        let fail = |e: &dyn std::fmt::Display| e.to_string();
        let mut flags = settings::builder();
        flags.set("opt_level", OPT_LEVEL).map_err(|e| fail(&e))?;
        flags.set("use_colocated_libcalls", "false").map_err(|e| fail(&e))?;
        flags.set("is_pic", "false").map_err(|e| fail(&e))?;
        // The IR verifier checks the generator (on in debug builds, which the tests run); off, a plan compiles in
        // about 0.3 ms less.
        flags.set("enable_verifier", if cfg!(debug_assertions) { "true" } else { "false" }).map_err(|e| fail(&e))?;
        let isa = cranelift_native::builder().map_err(|e| fail(&e))?;
        isa.finish(settings::Flags::new(flags)).map_err(|e| fail(&e))
    });
    made.clone()
}

/// The generator of one plan's function.
struct Gen<'f, 'b> {
    b: &'f mut FunctionBuilder<'b>,
    plan: &'f Plan,
    rings: &'f [Ring],
    ptr: Type,
    spec: *const (DataType, ReduceOp),
    /// `collc_step_data`, `collc_copy`, `collc_copy_streaming`, `collc_reduce`, `collc_trace`.
    calls: Vec<FuncRef>,
    /// Per step: the step before it on its receiving and its sending link.
    before: Vec<(Option<usize>, Option<usize>)>,
    // Values of the entry block, live throughout.
    frame: Value,
    bases: Vec<Value>,
    lo: Value,
    hi: Value,
    seq: Value,
    fingerprint: Value,
    done: Value,
    unmet: Value,
    tokens: Value,
    /// The frame's trace log: null unless the call is recorded.
    trace: Value,
    progress: Variable,
    any: Variable,
    /// Whether the call is one tile: then `lo` and `hi` are constants, and so is every length.
    whole: bool,
}

/// Plain memory access; the rings' flags use atomic loads and stores.
fn mem() -> MemFlagsData {
    MemFlagsData::new()
}

impl<'f, 'b> Gen<'f, 'b> {
    fn new(
        b: &'f mut FunctionBuilder<'b>,
        plan: &'f Plan,
        rings: &'f [Ring],
        ptr: Type,
        spec: &(DataType, ReduceOp),
        calls: Vec<FuncRef>,
    ) -> Self {
        let mut last: Vec<Option<usize>> = vec![None; rings.len()];
        let before = plan
            .steps
            .iter()
            .enumerate()
            .map(|(i, step)| {
                let mut on = |link: u16| (link != NONE).then(|| last[link as usize].replace(i)).flatten();
                let recv = on(step.recv);
                (recv, on(step.send))
            })
            .collect();
        let progress = b.declare_var(types::I8);
        let any = b.declare_var(types::I8);
        let placeholder = Value::from_u32(0);
        Gen {
            b,
            plan,
            rings,
            ptr,
            spec,
            calls,
            before,
            frame: placeholder,
            bases: Vec::new(),
            lo: placeholder,
            hi: placeholder,
            seq: placeholder,
            fingerprint: placeholder,
            done: placeholder,
            unmet: placeholder,
            tokens: placeholder,
            trace: placeholder,
            progress,
            any,
            whole: plan.n_tiles == 1,
        }
    }

    fn konst(&mut self, v: u64) -> Value {
        self.b.ins().iconst(self.ptr, v as i64)
    }

    fn load(&mut self, ty: Type, at: Value, offset: i32) -> Value {
        self.b.ins().load(ty, mem(), at, offset)
    }

    fn function(&mut self) {
        let entry = self.b.create_block();
        self.b.append_block_params_for_function_params(entry);
        self.b.switch_to_block(entry);
        let frame = self.b.block_params(entry)[0];
        self.frame = frame;
        let bases = self.load(self.ptr, frame, frame_at!(bases));
        self.bases = (0..self.plan.bases.len()).map(|k| self.load(self.ptr, bases, 8 * k as i32)).collect();
        if self.whole {
            self.lo = self.konst(0);
            self.hi = self.konst(self.plan.capacity as u64);
        } else {
            self.lo = self.load(types::I64, frame, frame_at!(lo));
            self.hi = self.load(types::I64, frame, frame_at!(hi));
        }
        self.seq = self.load(types::I64, frame, frame_at!(seq));
        self.fingerprint = self.load(types::I64, frame, frame_at!(fingerprint));
        self.done = self.load(self.ptr, frame, frame_at!(done));
        self.unmet = self.load(self.ptr, frame, frame_at!(unmet));
        self.tokens = self.load(self.ptr, frame, frame_at!(tokens));
        self.trace = self.load(self.ptr, frame, frame_at!(trace));
        let zero = self.b.ins().iconst(types::I8, 0);
        self.b.def_var(self.any, zero);
        let pass = self.b.create_block();
        self.b.ins().jump(pass, &[]);

        // A pass: every instruction tried once, in program order.
        self.b.switch_to_block(pass);
        let zero = self.b.ins().iconst(types::I8, 0);
        self.b.def_var(self.progress, zero);
        for i in 0..self.plan.steps.len() {
            let next = self.b.create_block();
            self.step(i, next);
            self.b.switch_to_block(next);
        }
        let remaining = self.b.ins().load(types::I32, mem(), frame, frame_at!(remaining));
        let (finished, more) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(remaining, more, &[], finished, &[]);
        self.b.switch_to_block(finished);
        let done = self.b.ins().iconst(types::I32, i64::from(DONE));
        self.b.ins().return_(&[done]);
        self.b.switch_to_block(more);
        let progress = self.b.use_var(self.progress);
        let (again, stop) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(progress, again, &[], stop, &[]);
        self.b.switch_to_block(again);
        let one = self.b.ins().iconst(types::I8, 1);
        self.b.def_var(self.any, one);
        self.b.ins().jump(pass, &[]);
        self.b.switch_to_block(stop);
        let any = self.b.use_var(self.any);
        let progressed = self.b.ins().iconst(types::I32, i64::from(PROGRESSED));
        let stalled = self.b.ins().iconst(types::I32, i64::from(STALLED));
        let outcome = self.b.ins().select(any, progressed, stalled);
        self.b.ins().return_(&[outcome]);
    }

    /// Branches to `next` unless instruction `index` has run.
    fn unless_done(&mut self, index: usize, next: Block) {
        let flag = self.b.ins().uload8(types::I32, mem(), self.done, index as i32);
        let go = self.b.create_block();
        self.b.ins().brif(flag, go, &[], next, &[]);
        self.b.switch_to_block(go);
    }

    /// Instruction `i`: tried, and run if its dependencies, its connections' order and their rings allow.
    fn step(&mut self, i: usize, next: Block) {
        let step = self.plan.steps[i];
        // Not run yet in this tile.
        let flag = self.b.ins().uload8(types::I32, mem(), self.done, i as i32);
        let fresh = self.b.create_block();
        self.b.ins().brif(flag, next, &[], fresh, &[]);
        self.b.switch_to_block(fresh);
        // Its dependencies done.
        let unmet = self.b.ins().load(types::I32, mem(), self.unmet, 4 * i as i32);
        let ready = self.b.create_block();
        self.b.ins().brif(unmet, next, &[], ready, &[]);
        self.b.switch_to_block(ready);
        // The instructions before it on its connections done (each connection carries messages in order).
        let (recv_before, send_before) = self.before[i];
        for earlier in [recv_before, send_before].into_iter().flatten() {
            self.unless_done(earlier, next);
        }
        // A message waiting for it, from this call.
        let mut incoming = None;
        if step.recv != NONE {
            let ring = self.rings[step.recv as usize];
            let consumed = self.konst(ring.consumed as u64);
            let msg = self.load(types::I64, consumed, 0);
            let slot = self.slot(&ring, msg);
            let at_ready = self.b.ins().iadd_imm_s(slot, i64::from(ring.ready_at));
            let flag = self.b.ins().atomic_load(types::I64, mem(), at_ready);
            let want = self.b.ins().iadd_imm_s(msg, 1);
            let arrived = self.b.ins().icmp(IntCC::Equal, flag, want);
            let (check, stamped) = (self.b.create_block(), self.b.create_block());
            self.b.ins().brif(arrived, check, &[], next, &[]);
            self.b.switch_to_block(check);
            let seq = self.load(types::I64, slot, ring.stamp_at);
            let fingerprint = self.load(types::I64, slot, ring.stamp_at + 8);
            let same_seq = self.b.ins().icmp(IntCC::Equal, seq, self.seq);
            let same_fp = self.b.ins().icmp(IntCC::Equal, fingerprint, self.fingerprint);
            let same = self.b.ins().band(same_seq, same_fp);
            let wrong = self.b.create_block();
            self.b.ins().brif(same, stamped, &[], wrong, &[]);
            self.b.switch_to_block(wrong);
            let index = self.b.ins().iconst(types::I32, i as i64);
            self.b.ins().store(mem(), index, self.frame, frame_at!(failed));
            let code = self.b.ins().iconst(types::I32, i64::from(MISMATCH));
            self.b.ins().return_(&[code]);
            self.b.switch_to_block(stamped);
            let refs = self.load(types::I64, slot, ring.refs_at);
            let data = self.b.ins().iadd_imm_s(slot, i64::from(ring.data_at));
            incoming = Some((consumed, msg, refs, data));
        }
        // Room for the message it sends.
        let mut outgoing = None;
        if step.send != NONE {
            let ring = self.rings[step.send as usize];
            let posted_at = self.konst(ring.posted as u64);
            let posted = self.load(types::I64, posted_at, 0);
            let known_at = self.konst(ring.known_consumed as u64);
            let known = self.load(types::I64, known_at, 0);
            let used = self.b.ins().isub(posted, known);
            let full = self.b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, used, SLOTS as i64);
            let (look, room) = (self.b.create_block(), self.b.create_block());
            self.b.ins().brif(full, look, &[], room, &[]);
            self.b.switch_to_block(look);
            let consumed_at = self.konst(ring.consumed as u64);
            let consumed = self.b.ins().atomic_load(types::I64, mem(), consumed_at);
            self.b.ins().store(mem(), consumed, known_at, 0);
            let used = self.b.ins().isub(posted, consumed);
            let full = self.b.ins().icmp_imm_s(IntCC::UnsignedGreaterThanOrEqual, used, SLOTS as i64);
            self.b.ins().brif(full, next, &[], room, &[]);
            self.b.switch_to_block(room);
            let slot = self.slot(&ring, posted);
            let data = self.b.ins().iadd_imm_s(slot, i64::from(ring.data_at));
            outgoing = Some((posted_at, posted, slot, data));
        }
        // Its message and room are there: its span starts.
        self.trace_event(2 * i);
        let fired = self.b.create_block();
        if let (true, Some((posted_at, posted, slot, data))) = (self.by_reference(&step), outgoing) {
            self.send_references(&step, (posted_at, posted, slot, data), fired);
        }
        // The data: inline where it is simple, else the interpreter's code for this one instruction.
        let zero = self.konst(0);
        let (in_data, refs) = incoming.map_or((zero, zero), |(_, _, refs, data)| (data, refs));
        let out_data = outgoing.map_or(zero, |(_, _, _, data)| data);
        if self.inline(&step) {
            self.inline_data(&step, in_data, refs, out_data);
        } else {
            let index = self.b.ins().iconst(types::I32, i as i64);
            let call = self.calls[0];
            self.b.ins().call(call, &[self.frame, index, in_data, refs, out_data]);
        }
        // The message out first: it is what the next rank waits for.
        if let Some((posted_at, posted, slot, _)) = outgoing {
            let ring = self.rings[step.send as usize];
            let none = self.b.ins().iconst(types::I64, 0);
            self.publish(&ring, posted_at, posted, slot, none);
        }
        if let Some((consumed, msg, _, _)) = incoming {
            let next_msg = self.b.ins().iadd_imm_s(msg, 1);
            self.release(next_msg, consumed);
        }
        self.b.ins().jump(fired, &[]);
        self.b.switch_to_block(fired);
        self.mark_done(i);
        self.trace_event(2 * i + 1);
        self.b.ins().jump(next, &[]);
    }

    /// `collc_trace(frame, event)` where the frame has a trace log: a load and a branch when it has none.
    fn trace_event(&mut self, event: usize) {
        let (record, after) = (self.b.create_block(), self.b.create_block());
        self.b.ins().brif(self.trace, record, &[], after, &[]);
        self.b.switch_to_block(record);
        let event = self.konst(event as u64);
        let call = self.calls[4];
        self.b.ins().call(call, &[self.frame, event]);
        self.b.ins().jump(after, &[]);
        self.b.switch_to_block(after);
    }

    /// The address of the slot of message `msg` on `ring`.
    fn slot(&mut self, ring: &Ring, msg: Value) -> Value {
        let index = self.b.ins().band_imm_s(msg, (SLOTS - 1) as i64);
        let offset = self.b.ins().imul_imm_s(index, ring.stride as i64);
        let slots = self.konst(ring.slots as u64);
        self.b.ins().iadd(slots, offset)
    }

    /// Publishes the message in `slot` (`refs` references in place of its bytes, or 0).
    fn publish(&mut self, ring: &Ring, posted_at: Value, posted: Value, slot: Value, refs: Value) {
        self.b.ins().store(mem(), refs, slot, ring.refs_at);
        self.b.ins().store(mem(), self.seq, slot, ring.stamp_at);
        self.b.ins().store(mem(), self.fingerprint, slot, ring.stamp_at + 8);
        let next = self.b.ins().iadd_imm_s(posted, 1);
        let at_ready = self.b.ins().iadd_imm_s(slot, i64::from(ring.ready_at));
        self.release(next, at_ready);
        self.b.ins().store(mem(), next, posted_at, 0);
    }

    /// A store with release order: on x86-64 every store has it (and cranelift keeps loads and stores in program
    /// order), so a plain one, not `atomic_store`'s sequentially consistent store and fence; elsewhere an atomic one.
    fn release(&mut self, value: Value, at: Value) {
        if cfg!(target_arch = "x86_64") {
            self.b.ins().store(mem(), value, at, 0);
        } else {
            self.b.ins().atomic_store(mem(), value, at);
        }
    }

    /// The instruction ran: its flag set, its dependents' counts lowered, one fewer to go.
    fn mark_done(&mut self, i: usize) {
        let one = self.b.ins().iconst(types::I8, 1);
        self.b.ins().store(mem(), one, self.done, i as i32);
        let (start, end) = (self.plan.dependents_start[i], self.plan.dependents_start[i + 1]);
        for d in start..end {
            let dependent = self.plan.dependents[d as usize] as i32;
            let count = self.b.ins().load(types::I32, mem(), self.unmet, 4 * dependent);
            let count = self.b.ins().iadd_imm_s(count, -1);
            self.b.ins().store(mem(), count, self.unmet, 4 * dependent);
        }
        let remaining = self.b.ins().load(types::I32, mem(), self.frame, frame_at!(remaining));
        let remaining = self.b.ins().iadd_imm_s(remaining, -1);
        self.b.ins().store(mem(), remaining, self.frame, frame_at!(remaining));
        self.b.def_var(self.progress, one);
    }

    /// Whether a send may carry references to its sources: as the interpreter decides (`host::try_fire`), without
    /// PreMulSum's factors.
    fn by_reference(&self, step: &Step) -> bool {
        if step.op != Op::Send || !step.by_reference || self.plan.factor.is_some() {
            return false;
        }
        host::refs_bytes(step.n as usize, false) <= self.plan.links[step.send as usize].slot_bytes
    }

    /// A send by reference, when every piece has a reference this call and holds the whole tile: the references
    /// written and the message published, then on to `fired`. Else on to the copy.
    fn send_references(&mut self, step: &Step, out: (Value, Value, Value, Value), fired: Block) {
        let (posted_at, posted, slot, data) = out;
        let pieces = self.pieces(step);
        let copy = self.b.create_block();
        let mut tokens = Vec::new();
        for (k, piece) in pieces.iter().enumerate() {
            if self.whole && piece.src.valid < self.plan.capacity {
                // It never holds the whole tile: always a copy.
                self.b.ins().jump(copy, &[]);
                self.b.switch_to_block(copy);
                return;
            }
            if !self.whole {
                let valid = self.konst(piece.src.valid as u64);
                let holds = self.b.ins().icmp(IntCC::UnsignedGreaterThanOrEqual, valid, self.hi);
                let go = self.b.create_block();
                self.b.ins().brif(holds, go, &[], copy, &[]);
                self.b.switch_to_block(go);
            }
            let index = (step.first_piece as usize + k) as i32;
            let token = self.load(types::I64, self.tokens, 8 * index);
            let usable = self.b.ins().icmp_imm_s(IntCC::NotEqual, token, -1);
            let go = self.b.create_block();
            self.b.ins().brif(usable, go, &[], copy, &[]);
            self.b.switch_to_block(go);
            tokens.push(token);
        }
        let lo_bytes = self.b.ins().imul_imm_s(self.lo, self.plan.elem as i64);
        for (k, token) in tokens.into_iter().enumerate() {
            let at = self.b.ins().iadd(token, lo_bytes);
            self.b.ins().store(mem(), at, data, 8 * k as i32);
        }
        let ring = self.rings[step.send as usize];
        let refs = self.b.ins().iconst(types::I64, i64::from(step.n));
        self.publish(&ring, posted_at, posted, slot, refs);
        let until = self.b.ins().iadd_imm_s(posted, 1);
        let until_at = self.konst(ring.refs_until as u64);
        self.b.ins().store(mem(), until, until_at, 0);
        self.b.ins().jump(fired, &[]);
        self.b.switch_to_block(copy);
    }

    fn pieces(&self, step: &Step) -> Vec<super::plan::Piece> {
        self.plan.pieces[step.first_piece as usize..(step.first_piece + step.n) as usize].to_vec()
    }

    /// Whether the compiled code moves this step's data itself: no factor, one tile (lengths are constants), and a
    /// fused instruction within one block (the interpreter's `host::blocks`).
    fn inline(&self, step: &Step) -> bool {
        if self.plan.factor.is_some() || !self.whole {
            return false;
        }
        let tile_bytes = self.plan.capacity * self.plan.elem;
        match step.op {
            Op::RecvReduceCopySend | Op::RecvCopySend => tile_bytes <= host::FUSED_BLOCK_BYTES,
            _ => true,
        }
    }

    /// The step's data moved inline: per piece, the interpreter's `host::execute` for one tile at element 0.
    fn inline_data(&mut self, step: &Step, incoming: Value, refs: Value, outgoing: Value) {
        let (elem, stride) = (self.plan.elem, self.plan.capacity * self.plan.elem);
        let tile = self.plan.capacity;
        let deref = if step.recv != NONE { self.rings[step.recv as usize].deref_base } else { 0 };
        let by_reference =
            if step.recv != NONE { Some(self.b.ins().icmp_imm_s(IntCC::NotEqual, refs, 0)) } else { None };
        for (k, piece) in self.pieces(step).into_iter().enumerate() {
            let slot_in = match by_reference {
                Some(by_reference) => {
                    let token = self.load(types::I64, incoming, 8 * k as i32);
                    let address = self.b.ins().iadd_imm_s(token, deref as i64);
                    let bytes = self.b.ins().iadd_imm_s(incoming, (k * stride) as i64);
                    self.b.ins().select(by_reference, address, bytes)
                }
                None => incoming,
            };
            let slot_out = self.b.ins().iadd_imm_s(outgoing, (k * stride) as i64);
            let n = |place: Place| place.valid.min(tile);
            match step.op {
                Op::Send => {
                    let src = self.place(piece.src);
                    self.copy(slot_out, src, n(piece.src) * elem, false);
                }
                Op::Recv => {
                    let dst = self.place(piece.dst);
                    self.store(piece.dst, dst, slot_in, n(piece.dst) * elem);
                }
                Op::RecvReduceCopy => {
                    let (dst, acc) = (self.place(piece.dst), self.place(piece.acc));
                    self.reduce(dst, acc, slot_in, n(piece.dst));
                }
                Op::RecvReduceSend => {
                    let acc = self.place(piece.acc);
                    self.reduce(slot_out, acc, slot_in, n(piece.acc));
                }
                Op::RecvReduceCopySend => {
                    let (dst, acc) = (self.place(piece.dst), self.place(piece.acc));
                    self.reduce(slot_out, acc, slot_in, n(piece.dst));
                    self.store(piece.dst, dst, slot_out, n(piece.dst) * elem);
                }
                Op::RecvCopySend => {
                    let dst = self.place(piece.dst);
                    self.store(piece.dst, dst, slot_in, n(piece.dst) * elem);
                    self.copy(slot_out, slot_in, tile * elem, false);
                }
                Op::Copy => {
                    let (dst, src) = (self.place(piece.dst), self.place(piece.src));
                    self.store(piece.dst, dst, src, n(piece.dst).min(n(piece.src)) * elem);
                }
                Op::Reduce => {
                    let (dst, acc, src) = (self.place(piece.dst), self.place(piece.acc), self.place(piece.src));
                    self.reduce(dst, acc, src, n(piece.dst));
                }
            }
        }
    }

    /// Where `place` is at element 0 of the call's one tile.
    fn place(&mut self, place: Place) -> Value {
        let base = self.bases[place.buf as usize];
        self.b.ins().iadd_imm_s(base, (place.offset * self.plan.elem) as i64)
    }

    /// A result written into `place`: as `host::store`, non-temporal into a user buffer of a large message.
    fn store(&mut self, place: Place, dst: Value, src: Value, bytes: usize) {
        let streaming = self.plan.streaming && place.buf < 2;
        self.copy(dst, src, bytes, streaming);
    }

    fn copy(&mut self, dst: Value, src: Value, bytes: usize, streaming: bool) {
        if bytes == 0 {
            return;
        }
        if bytes <= INLINE_COPY_BYTES && !streaming {
            let mut at = 0;
            for (width, ty) in [(16, types::I8X16), (8, types::I64), (4, types::I32), (2, types::I16), (1, types::I8)] {
                while bytes - at >= width {
                    let v = self.b.ins().load(ty, mem(), src, at as i32);
                    self.b.ins().store(mem(), v, dst, at as i32);
                    at += width;
                }
            }
            return;
        }
        let len = self.konst(bytes as u64);
        let call = self.calls[if streaming { 2 } else { 1 }];
        self.b.ins().call(call, &[dst, src, len]);
    }

    fn reduce(&mut self, dst: Value, a: Value, b: Value, n: usize) {
        if n == 0 {
            return;
        }
        if let Some(lanewise) = Lanewise::of(self.plan.dtype, self.plan.op) {
            if n * self.plan.elem <= INLINE_REDUCE_BYTES {
                return self.reduce_inline(lanewise, dst, a, b, n * self.plan.elem);
            }
        }
        let spec = self.konst(self.spec as u64);
        let n = self.konst(n as u64);
        let call = self.calls[3];
        self.b.ins().call(call, &[spec, dst, a, b, n]);
    }

    /// `dst = a (op) b` over `bytes`, 16 bytes a vector, then element by element.
    fn reduce_inline(&mut self, lanewise: Lanewise, dst: Value, a: Value, b: Value, bytes: usize) {
        let mut at = 0;
        let scalar = Lanewise { vector: lanewise.scalar, ..lanewise };
        for (op, width) in [(lanewise, 16), (scalar, lanewise.scalar.bytes() as usize)] {
            while bytes - at >= width {
                let x = self.b.ins().load(op.vector, mem(), a, at as i32);
                let y = self.b.ins().load(op.vector, mem(), b, at as i32);
                let r = op.apply(self.b, x, y);
                self.b.ins().store(mem(), r, dst, at as i32);
                at += width;
            }
        }
    }
}

/// A built-in operator on a data type that cranelift computes lane by lane exactly as the host kernels do (and the
/// reference): integers' wrapping sum, minimum and maximum, and float sums with the kernels' NaN rule. Everything
/// else calls the kernels.
#[derive(Clone, Copy, Debug)]
struct Lanewise {
    kind: LaneOp,
    /// The element's type, and the type a value has: a 128-bit vector of them, or (the tail) the element's type.
    scalar: Type,
    vector: Type,
}

#[derive(Clone, Copy, Debug)]
enum LaneOp {
    Iadd,
    Fadd,
    Smin,
    Smax,
    Umin,
    Umax,
}

impl Lanewise {
    fn of(dtype: DataType, op: ReduceOp) -> Option<Lanewise> {
        let (scalar, vector, signed) = match dtype {
            DataType::I8 => (types::I8, types::I8X16, true),
            DataType::U8 => (types::I8, types::I8X16, false),
            DataType::I32 => (types::I32, types::I32X4, true),
            DataType::U32 => (types::I32, types::I32X4, false),
            DataType::I64 => (types::I64, types::I64X2, true),
            DataType::U64 => (types::I64, types::I64X2, false),
            DataType::F32 => (types::F32, types::F32X4, true),
            DataType::F64 => (types::F64, types::F64X2, true),
            DataType::F16 | DataType::Bf16 => return None,
        };
        let (float, wide) = (dtype.is_float(), scalar == types::I64);
        let kind = match op {
            ReduceOp::Sum | ReduceOp::Avg if !float => LaneOp::Iadd,
            ReduceOp::Sum | ReduceOp::Avg => LaneOp::Fadd,
            // 64-bit lanes' minimum and maximum need AVX-512 in cranelift's x64 backend.
            ReduceOp::Min if !float && !wide => [LaneOp::Umin, LaneOp::Smin][usize::from(signed)],
            ReduceOp::Max if !float && !wide => [LaneOp::Umax, LaneOp::Smax][usize::from(signed)],
            _ => return None,
        };
        Some(Lanewise { kind, scalar, vector })
    }

    fn apply(self, b: &mut FunctionBuilder, x: Value, y: Value) -> Value {
        match self.kind {
            LaneOp::Iadd => b.ins().iadd(x, y),
            LaneOp::Fadd => {
                // The kernels' sum: `x`'s NaN, made quiet, where `x` is one (`PIN_FIRST_NAN`), else `x + y`, whichever
                // operand order the instruction ends up with.
                let sum = b.ins().fadd(x, y);
                let (int, quiet_bit) = match self.scalar == types::F64 {
                    true => (types::I64, 0x0008_0000_0000_0000i64),
                    false => (types::I32, 0x0040_0000i64),
                };
                let (int_ty, float_ty) = match self.vector == self.scalar {
                    true => (int, self.scalar),
                    false => (int.by(16 / int.bytes()).expect("a 128-bit vector"), self.vector),
                };
                let little = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
                let bits = b.ins().bitcast(int_ty, little, x);
                let quiet = b.ins().iconst(int, quiet_bit);
                let quiet = if int_ty == int { quiet } else { b.ins().splat(int_ty, quiet) };
                let quiet = b.ins().bor(bits, quiet);
                let quiet = b.ins().bitcast(float_ty, little, quiet);
                let nan = b.ins().fcmp(FloatCC::Unordered, x, x);
                if int_ty == int {
                    b.ins().select(nan, quiet, sum)
                } else {
                    let mask = b.ins().bitcast(float_ty, little, nan);
                    b.ins().bitselect(mask, quiet, sum)
                }
            }
            LaneOp::Smin => b.ins().smin(x, y),
            LaneOp::Smax => b.ins().smax(x, y),
            LaneOp::Umin => b.ins().umin(x, y),
            LaneOp::Umax => b.ins().umax(x, y),
        }
    }
}
