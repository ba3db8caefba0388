//! The data check of `collc run -c 1` and of the tests: inputs crafted so every float result is exact, and the
//! expected output of each collective computed element by element from its definition (not from any schedule),
//! with the scalar reference kernels.

use crate::comm::CallShape;
use collc_compiler::Collective;
use collc_kernels::{reference, DataType, ReduceOp};

/// Blocks of `count` elements in each rank's send and receive buffer (NCCL's sizes).
fn blocks(collective: Collective, n_ranks: u32) -> (usize, usize) {
    let (input, output) = collective.buffer_chunks(n_ranks, 1);
    (input as usize, output as usize)
}

/// Where one rank's input and output sit in the buffers of a call, in bytes. Out of place, `input` lies in the send
/// buffer and `output` in the receive buffer; in place both lie in one buffer of `send` (= `recv`) bytes, as NCCL
/// lays them out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Windows {
    pub send: usize,
    pub recv: usize,
    pub input: std::ops::Range<usize>,
    pub output: std::ops::Range<usize>,
}

impl Windows {
    /// The one buffer of an in-place call: `input` in its window, a marker byte (0xEE) everywhere else.
    pub fn in_place_buffer(&self, input: &[u8]) -> Vec<u8> {
        let mut buffer = vec![0xEE; self.send];
        buffer[self.input.clone()].copy_from_slice(input);
        buffer
    }
}

pub fn windows(shape: &CallShape, n_ranks: u32, rank: u32, in_place: bool) -> Windows {
    let block = shape.count * shape.dtype.size_bytes();
    let (in_blocks, out_blocks) = blocks(shape.collective, n_ranks);
    let (input, output) = if in_place { shape.collective.in_place_offsets(rank, 1) } else { (0, 0) };
    let (input, output) = (input as usize * block, output as usize * block);
    let (send, recv) = match in_place {
        true => (in_blocks.max(out_blocks) * block, in_blocks.max(out_blocks) * block),
        false => (in_blocks * block, out_blocks * block),
    };
    Windows { send, recv, input: input..input + in_blocks * block, output: output..output + out_blocks * block }
}

/// The operators the test matrices run: the five built-ins, and a premulsum whose factor every type holds and whose
/// products of the check's inputs stay exact, so every result compares bit for bit.
pub const OPS: [ReduceOp; 6] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
    ReduceOp::PreMulSum(collc_kernels::Scalar::Int(3)),
];

/// Two operators a user might write, for the test matrices (registered on first use): `absmax`, commutative and
/// associative, which every algorithm runs; and `horner`, `a * 2 + b`, neither, which only a schedule that reduces
/// in rank order computes the collective with (the ranks' inputs read as the digits of one number, rank 0 first).
pub fn user_ops() -> [ReduceOp; 2] {
    static OPS: std::sync::OnceLock<[ReduceOp; 2]> = std::sync::OnceLock::new();
    *OPS.get_or_init(|| {
        let source = "op absmax(a, b) = max(abs(a), abs(b))\nop horner(a, b) = a * 2 + b\n";
        let operators = collc_compiler::operator::parse_operators(source, &Default::default());
        operators
            .expect("the operators compile")
            .into_iter()
            .map(|operator| {
                ReduceOp::User(collc_kernels::operator::UserOp::register(operator).expect("room in the registry"))
            })
            .collect::<Vec<_>>()
            .try_into()
            .expect("two operators")
    })
}

/// Input element `index` of `rank`: small integers, so sums of up to thousands of ranks and products of a few
/// twos stay exact in every type, `f16` and `bf16` included (under premulsum, before its factor; a user's operator
/// gets a sum's inputs).
pub fn input_value(op: ReduceOp, rank: u32, index: usize) -> i64 {
    let mix = (rank as usize).wrapping_mul(7).wrapping_add(index.wrapping_mul(3));
    match op {
        ReduceOp::Prod => 1 + i64::from(mix.is_multiple_of(16)),
        ReduceOp::Max | ReduceOp::Min => (mix % 101) as i64 - 50,
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) | ReduceOp::User(_) => (mix % 5) as i64,
    }
}

/// Writes `value` as one `dtype` element into `out`.
pub fn encode(dtype: DataType, value: i64, out: &mut [u8]) {
    match dtype {
        DataType::I8 => out.copy_from_slice(&(value as i8).to_le_bytes()),
        DataType::U8 => out.copy_from_slice(&(value as u8).to_le_bytes()),
        DataType::I32 => out.copy_from_slice(&(value as i32).to_le_bytes()),
        DataType::U32 => out.copy_from_slice(&(value as u32).to_le_bytes()),
        DataType::I64 => out.copy_from_slice(&value.to_le_bytes()),
        DataType::U64 => out.copy_from_slice(&(value as u64).to_le_bytes()),
        DataType::F16 => out.copy_from_slice(&half::f16::from_f64(value as f64).to_le_bytes()),
        DataType::Bf16 => out.copy_from_slice(&half::bf16::from_f64(value as f64).to_le_bytes()),
        DataType::F32 => out.copy_from_slice(&(value as f32).to_le_bytes()),
        DataType::F64 => out.copy_from_slice(&(value as f64).to_le_bytes()),
    }
}

/// The values repeat with this period in the element index (3 is coprime to each modulus).
fn period(op: ReduceOp) -> usize {
    match op {
        ReduceOp::Prod => 16,
        ReduceOp::Max | ReduceOp::Min => 101,
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) | ReduceOp::User(_) => 5,
    }
}

/// `rank`'s whole send buffer (`blocks * count` elements): one period encoded, then repeated.
pub fn input(shape: &CallShape, n_ranks: u32, rank: u32) -> Vec<u8> {
    let elem = shape.dtype.size_bytes();
    let n = blocks(shape.collective, n_ranks).0 * shape.count;
    let mut pattern = vec![0u8; period(shape.op) * elem];
    for (i, element) in pattern.chunks_exact_mut(elem).enumerate() {
        encode(shape.dtype, input_value(shape.op, rank, i), element);
    }
    pattern.iter().copied().cycle().take(n * elem).collect()
}

/// Every rank's send buffer.
pub fn inputs(shape: &CallShape, n_ranks: u32) -> Vec<Vec<u8>> {
    (0..n_ranks).map(|r| input(shape, n_ranks, r)).collect()
}

/// What `rank`'s receive buffer must hold after the call, or `None` where the collective leaves it undefined
/// (a non-root's output of reduce, ranks other than the receiver of sendrecv).
pub fn expected(shape: &CallShape, n_ranks: u32, rank: u32) -> Option<Vec<u8>> {
    expected_from(shape, n_ranks, rank, &inputs(shape, n_ranks))
}

/// `expected`, given every rank's input (`inputs`).
pub fn expected_from(shape: &CallShape, n_ranks: u32, rank: u32, inputs: &[Vec<u8>]) -> Option<Vec<u8>> {
    let (elem, count) = (shape.dtype.size_bytes(), shape.count);
    let block = |r: u32, b: usize| &inputs[r as usize][b * count * elem..(b + 1) * count * elem];
    // Under premulsum every rank's block multiplied by the factor (every rank passes the same one here).
    let factor = shape.op.factor().map(|f| f.element(shape.dtype).expect("a factor the call's type holds"));
    let contribution = |r: u32, b: usize| {
        let mut bytes = block(r, b).to_vec();
        if let Some(factor) = &factor {
            reference::premultiply(shape.dtype, factor, &mut bytes).expect("whole elements");
        }
        bytes
    };
    let reduced = |b: usize| {
        let mut sum = contribution(0, b);
        for r in 1..n_ranks {
            reference::reduce(shape.dtype, shape.op, &mut sum, &contribution(r, b)).expect("same lengths");
        }
        if shape.op == ReduceOp::Avg {
            reference::finish_avg(shape.dtype, &mut sum, n_ranks as usize).expect("whole elements");
        }
        sum
    };
    let concat = |blocks: Vec<&[u8]>| blocks.concat();
    let (root, peer, all) = (shape.root, shape.peer, 0..n_ranks);
    Some(match shape.collective {
        Collective::AllReduce => reduced(0),
        Collective::ReduceScatter => reduced(rank as usize),
        Collective::AllGather => concat(all.map(|q| block(q, 0)).collect()),
        Collective::Broadcast => block(root, 0).to_vec(),
        Collective::Reduce if rank == root => reduced(0),
        Collective::Gather if rank == root => concat(all.map(|q| block(q, 0)).collect()),
        Collective::Scatter => block(root, rank as usize).to_vec(),
        Collective::AllToAll => concat(all.map(|q| block(q, rank as usize)).collect()),
        Collective::SendRecv if rank == peer => block(root, 0).to_vec(),
        _ => return None,
    })
}

/// Elements of `got` that differ from `want`: bit for bit, except under a float premulsum, whose products round
/// unless the factor is a power of two or the values small multiples of it: the sum of rounded products depends on
/// the order the schedule adds them in. There each element may differ from `want` by the rounding of `n_ranks`
/// additions of partial sums no larger than `n_ranks` times the largest term (|factor| x 4, the largest input).
pub fn count_wrong_for(shape: &CallShape, n_ranks: u32, want: &[u8], got: &[u8]) -> usize {
    let (Some(factor), Some(epsilon)) = (shape.op.factor(), epsilon(shape.dtype)) else {
        return count_wrong(shape.dtype, want, got);
    };
    let n = f64::from(n_ranks);
    let tolerance = epsilon * n * n * 4.0 * factor.as_f64().abs();
    let elem = shape.dtype.size_bytes();
    let value = |bytes: &[u8]| as_f64(shape.dtype, bytes);
    let differing = want
        .chunks_exact(elem)
        .zip(got.chunks_exact(elem))
        // NaN differences are wrong too: `within` is false for them.
        .filter(|(a, b)| a != b && !within((value(a) - value(b)).abs(), tolerance))
        .count();
    differing + want.len().abs_diff(got.len()) / elem
}

fn within(difference: f64, tolerance: f64) -> bool {
    difference <= tolerance
}

/// A float type's relative rounding error (one ulp of 1), `None` for integers.
fn epsilon(dtype: DataType) -> Option<f64> {
    match dtype {
        DataType::F16 => Some(2f64.powi(-10)),
        DataType::Bf16 => Some(2f64.powi(-7)),
        DataType::F32 => Some(f64::from(f32::EPSILON)),
        DataType::F64 => Some(f64::EPSILON),
        _ => None,
    }
}

fn as_f64(dtype: DataType, bytes: &[u8]) -> f64 {
    match dtype {
        DataType::F16 => half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
        DataType::Bf16 => half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f64(),
        DataType::F32 => f64::from(f32::from_le_bytes(bytes.try_into().expect("4 bytes"))),
        _ => f64::from_le_bytes(bytes.try_into().expect("8 bytes")),
    }
}

/// Elements of `got` that differ from `want`, bit for bit.
pub fn count_wrong(dtype: DataType, want: &[u8], got: &[u8]) -> usize {
    if want == got {
        return 0;
    }
    let elem = dtype.size_bytes();
    let differing = want.chunks_exact(elem).zip(got.chunks_exact(elem)).filter(|(a, b)| a != b).count();
    differing + want.len().abs_diff(got.len()) / elem
}

/// Every construct of the operator language in one operator, each branch taken by some pairs of edge values: what
/// the CUDA source built for the CPU is tested with (one build of the kernels, not one per operator).
pub const EVERY_OPERATOR: &str =
    "op every(a, b) = if a < b { elem(f64(a) * 0.75 + f64(b) / 3) - elem(i64(f64(a) * 2.5)) } \
    else { if a == b { (a - b) * a + b / (a - 3) - b % a } \
    else { if a > b + 1 && !(b == 0) || a <= -b { min(a, max(b, -a)) + abs(b) } \
    else { elem(f32(a) + f32(b) * 0.1) + elem(i64(a) / i64(b) + i64(a) % 7 - abs(i64(b))) } } }\n";

/// Every pair of `dtype`'s edge values (`edge_values`), as two buffers of elements: what users' operators are tested
/// on against the reference evaluation.
pub fn edge_pairs(dtype: DataType) -> (Vec<u8>, Vec<u8>) {
    let size = dtype.size_bytes();
    let values = edge_values(dtype);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for x in &values {
        for y in &values {
            a.extend_from_slice(&x.to_le_bytes()[..size]);
            b.extend_from_slice(&y.to_le_bytes()[..size]);
        }
    }
    (a, b)
}

/// The edge values both float types test: zeros and infinities of both signs, small exact values, a fraction that
/// rounds, NaNs of both signs (each type adds its extremes, its smallest subnormal and a signalling NaN).
const FLOAT_EDGES: [f64; 12] =
    [0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, 200.7, f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -f64::NAN];

/// Values that test each data type's edges, as little-endian bit patterns: zeros of both signs, ones, the
/// extremes, subnormals, infinities and NaNs (quiet, signalling, negative), and random bits.
pub fn edge_values(dtype: DataType) -> Vec<u64> {
    let mut bits: Vec<u64> = match dtype {
        DataType::F16 => vec![
            0, 0x8000, 0x3C00, 0xBC00, 0x3800, 0x4000, 0x4200, 0x7BFF, 0xFBFF, 0x0001, 0x0400, 0x7C00, 0xFC00, 0x7E00,
            0xFE00, 0x7C01, 0x5BF8,
        ],
        DataType::Bf16 => vec![
            0, 0x8000, 0x3F80, 0xBF80, 0x3F00, 0x4000, 0x4040, 0x7F7F, 0xFF7F, 0x0001, 0x0080, 0x7F80, 0xFF80, 0x7FC0,
            0xFFC0, 0x7F81, 0x4B80,
        ],
        DataType::F32 => FLOAT_EDGES
            .iter()
            .map(|&v| v as f32)
            .chain([f32::MAX, f32::MIN, 1e-45, f32::MIN_POSITIVE, 3e9, -3e9])
            .map(|v| u64::from(v.to_bits()))
            .chain([0x7F80_0001])
            .collect(),
        DataType::F64 => FLOAT_EDGES
            .iter()
            .copied()
            .chain([f64::MAX, f64::MIN, 5e-324, f64::MIN_POSITIVE, 1e19, -1e19, 1e300])
            .map(f64::to_bits)
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

pub fn is_nan(dtype: DataType, bytes: &[u8]) -> bool {
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
