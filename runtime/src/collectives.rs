//! NCCL-shaped typed calls on a `Communicator`: `all_reduce(send, recv, op)` and friends, each with an in-place
//! form. Counts come from the slices (NCCL's `count` argument), checked against what the call needs.

use crate::comm::{Buffers, CallShape, Communicator};
use crate::error::RuntimeError;
use collc_compiler::Collective;
use collc_kernels::{DataType, ReduceOp};

/// A Rust type a collective can move: its NCCL data type, and plain little-endian bytes with no padding.
///
/// # Safety
/// `DTYPE.size_bytes()` equals `size_of::<Self>()` and every bit pattern is a valid value.
pub unsafe trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        // SAFETY: a primitive of exactly the data type's size, valid for every bit pattern.
        unsafe impl Element for $t {
            const DTYPE: DataType = DataType::$d;
        }
    )*};
}

element!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32, f64 => F64,
    half::f16 => F16, half::bf16 => Bf16);

fn bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: T is plain data (Element's contract); the length covers the same memory.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

fn bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `bytes`, and every byte pattern written back is a valid T.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}

impl Communicator {
    fn typed<T: Element>(
        &mut self,
        collective: Collective,
        count: usize,
        op: ReduceOp,
        root: u32,
        buffers: Buffers,
    ) -> Result<(), RuntimeError> {
        if collective.rooted() && root >= self.n_ranks() {
            return Err(RuntimeError::Config(format!("root {root} is outside a world of {} ranks", self.n_ranks())));
        }
        let peer = (root + 1) % self.n_ranks();
        self.call(CallShape { collective, count, dtype: T::DTYPE, op, root, peer }, buffers)
    }

    /// Every rank's `recv` gets the elementwise reduction of all ranks' `send` (`ncclAllReduce`).
    pub fn all_reduce<T: Element>(&mut self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<(), RuntimeError> {
        let buffers = Buffers::OutOfPlace { send: bytes(send), recv: bytes_mut(recv) };
        self.typed::<T>(Collective::AllReduce, send.len(), op, 0, buffers)
    }

    pub fn all_reduce_in_place<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<(), RuntimeError> {
        let count = buf.len();
        self.typed::<T>(Collective::AllReduce, count, op, 0, Buffers::InPlace(bytes_mut(buf)))
    }

    /// Root's `send` lands in every rank's `recv`; `send` is read on the root only (`ncclBroadcast`).
    pub fn broadcast<T: Element>(&mut self, send: &[T], recv: &mut [T], root: u32) -> Result<(), RuntimeError> {
        let count = recv.len();
        let buffers = Buffers::OutOfPlace { send: bytes(send), recv: bytes_mut(recv) };
        self.typed::<T>(Collective::Broadcast, count, ReduceOp::Sum, root, buffers)
    }

    pub fn broadcast_in_place<T: Element>(&mut self, buf: &mut [T], root: u32) -> Result<(), RuntimeError> {
        let count = buf.len();
        self.typed::<T>(Collective::Broadcast, count, ReduceOp::Sum, root, Buffers::InPlace(bytes_mut(buf)))
    }

    /// The root's `recv` gets the reduction of all ranks' `send` (`ncclReduce`).
    pub fn reduce<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: u32,
    ) -> Result<(), RuntimeError> {
        let buffers = Buffers::OutOfPlace { send: bytes(send), recv: bytes_mut(recv) };
        self.typed::<T>(Collective::Reduce, send.len(), op, root, buffers)
    }

    /// Every rank's `recv` (n_ranks x `send.len()`) gets all ranks' `send` in rank order (`ncclAllGather`).
    pub fn all_gather<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<(), RuntimeError> {
        let buffers = Buffers::OutOfPlace { send: bytes(send), recv: bytes_mut(recv) };
        self.typed::<T>(Collective::AllGather, send.len(), ReduceOp::Sum, 0, buffers)
    }

    /// In place: this rank's part already sits at `rank * count` of `buf`.
    pub fn all_gather_in_place<T: Element>(&mut self, buf: &mut [T]) -> Result<(), RuntimeError> {
        let count = self.per_rank(buf.len())?;
        self.typed::<T>(Collective::AllGather, count, ReduceOp::Sum, 0, Buffers::InPlace(bytes_mut(buf)))
    }

    /// Rank r's `recv` gets block r of the reduction of all ranks' `send` (`ncclReduceScatter`).
    pub fn reduce_scatter<T: Element>(&mut self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<(), RuntimeError> {
        let count = recv.len();
        let buffers = Buffers::OutOfPlace { send: bytes(send), recv: bytes_mut(recv) };
        self.typed::<T>(Collective::ReduceScatter, count, op, 0, buffers)
    }

    /// In place: the result is block `rank` of `buf`.
    pub fn reduce_scatter_in_place<T: Element>(&mut self, buf: &mut [T], op: ReduceOp) -> Result<(), RuntimeError> {
        let count = self.per_rank(buf.len())?;
        self.typed::<T>(Collective::ReduceScatter, count, op, 0, Buffers::InPlace(bytes_mut(buf)))
    }

    /// The root's `recv` (n_ranks x `send.len()`) gets every rank's `send` in rank order.
    pub fn gather<T: Element>(&mut self, send: &[T], recv: &mut [T], root: u32) -> Result<(), RuntimeError> {
        let buffers = Buffers::OutOfPlace { send: bytes(send), recv: bytes_mut(recv) };
        self.typed::<T>(Collective::Gather, send.len(), ReduceOp::Sum, root, buffers)
    }

    /// Rank r's `recv` gets block r of the root's `send` (n_ranks x `recv.len()`).
    pub fn scatter<T: Element>(&mut self, send: &[T], recv: &mut [T], root: u32) -> Result<(), RuntimeError> {
        let count = recv.len();
        let buffers = Buffers::OutOfPlace { send: bytes(send), recv: bytes_mut(recv) };
        self.typed::<T>(Collective::Scatter, count, ReduceOp::Sum, root, buffers)
    }

    /// Block q of rank r's `send` lands in block r of rank q's `recv`; blocks are `send.len() / n_ranks` long.
    pub fn all_to_all<T: Element>(&mut self, send: &[T], recv: &mut [T]) -> Result<(), RuntimeError> {
        let count = self.per_rank(send.len())?;
        let buffers = Buffers::OutOfPlace { send: bytes(send), recv: bytes_mut(recv) };
        self.typed::<T>(Collective::AllToAll, count, ReduceOp::Sum, 0, buffers)
    }

    /// `from`'s `send` lands in `to`'s `recv`; every rank calls it (ranks other than the two do nothing).
    pub fn send_recv<T: Element>(
        &mut self,
        send: &[T],
        recv: &mut [T],
        from: u32,
        to: u32,
    ) -> Result<(), RuntimeError> {
        if from >= self.n_ranks() || to >= self.n_ranks() || from == to {
            return Err(RuntimeError::Config(format!(
                "send_recv from {from} to {to}: both must be distinct ranks below {}",
                self.n_ranks()
            )));
        }
        let count = recv.len();
        let shape = CallShape {
            collective: Collective::SendRecv,
            count,
            dtype: T::DTYPE,
            op: ReduceOp::Sum,
            root: from,
            peer: to,
        };
        self.call(shape, Buffers::OutOfPlace { send: bytes(send), recv: bytes_mut(recv) })
    }

    fn per_rank(&self, len: usize) -> Result<usize, RuntimeError> {
        let p = self.n_ranks() as usize;
        if !len.is_multiple_of(p) {
            return Err(RuntimeError::Config(format!(
                "a buffer of {len} elements does not split into {p} equal blocks, one per rank"
            )));
        }
        Ok(len / p)
    }
}
