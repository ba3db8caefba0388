//! One queued call's memory: the `(address, bytes)` regions Python handed over (tensors the call's `keep` holds),
//! made into the runtime's `Buffers`, and the call run.

use collc_runtime::log::{self, Level, Subsys};
use collc_runtime::{Buffers, CallShape, Communicator, RuntimeError};

#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    addr: usize,
    bytes: usize,
}

impl Region {
    pub(crate) fn new((addr, bytes): (usize, usize)) -> Region {
        Region { addr, bytes }
    }

    fn end(self) -> usize {
        self.addr + self.bytes
    }

    fn overlaps(self, other: Region) -> bool {
        self.bytes > 0 && other.bytes > 0 && self.addr < other.end() && other.addr < self.end()
    }

    /// # Safety
    /// The region is memory the caller keeps alive and does not touch for the call (Python's `keep`).
    unsafe fn slice<'a>(self) -> &'a [u8] {
        match self.bytes {
            0 => &[],
            // SAFETY: as the function's contract says.
            bytes => unsafe { std::slice::from_raw_parts(self.addr as *const u8, bytes) },
        }
    }

    /// # Safety
    /// As `slice`, and nothing else reads or writes it during the call.
    unsafe fn slice_mut<'a>(self) -> &'a mut [u8] {
        match self.bytes {
            0 => &mut [],
            // SAFETY: as the function's contract says.
            bytes => unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, bytes) },
        }
    }
}

/// The one buffer of NCCL's in-place form, where `send` and `recv` sit in it as that form puts them (the same
/// address; allgather's input at block `rank` of the output; reducescatter's output at block `rank` of the input).
fn in_place(shape: &CallShape, rank: u32, send: Region, recv: Region) -> Option<Region> {
    let block = shape.count * shape.dtype.size_bytes();
    let (send_at, recv_at) = shape.collective.in_place_offsets(rank, 1);
    let base = send.addr.checked_sub(send_at as usize * block)?;
    if recv.addr.checked_sub(recv_at as usize * block)? != base || send.bytes == 0 || recv.bytes == 0 {
        return None;
    }
    Some(Region { addr: base, bytes: send.end().max(recv.end()) - base })
}

/// Runs one call over `send` and `recv`: in place where they sit as NCCL's in-place form has them, out of place where
/// they are apart, and out of place from a copy of `send` where they overlap otherwise. Logs the call and the
/// algorithm it runs at INFO (`COLLC_DEBUG=INFO`), as NCCL_DEBUG_SUBSYS=COLL does.
///
/// # Safety
/// Both regions are memory the caller keeps alive and leaves alone until this returns.
pub(crate) unsafe fn run(
    comm: &mut Communicator,
    seq: u64,
    shape: CallShape,
    send: Region,
    recv: Region,
) -> Result<(), RuntimeError> {
    if log::enabled(Level::Info, Subsys::Coll) {
        let algorithm = comm.algorithm_of(&shape).unwrap_or_else(|e| format!("(none: {e})"));
        log::info(
            Subsys::Coll,
            format_args!(
                "{}: opCount {seq:x} sendbuff {:#x} recvbuff {:#x} count {} datatype {} op {} root {} peer {} nranks {} \
                 algorithm {algorithm}",
                shape.collective,
                send.addr,
                recv.addr,
                shape.count,
                shape.dtype.nccl_name(),
                shape.op,
                shape.root,
                shape.peer,
                comm.n_ranks()
            ),
        );
    }
    if let Some(buffer) = in_place(&shape, comm.rank(), send, recv) {
        // SAFETY: the caller's contract; the one buffer covers both regions.
        return comm.call(shape, Buffers::InPlace(unsafe { buffer.slice_mut() }));
    }
    let copy;
    let send = if send.overlaps(recv) {
        // SAFETY: the caller's contract.
        copy = unsafe { send.slice() }.to_vec();
        &copy[..]
    } else {
        // SAFETY: the caller's contract; apart from `recv`.
        unsafe { send.slice() }
    };
    // SAFETY: the caller's contract.
    comm.call(shape, Buffers::OutOfPlace { send, recv: unsafe { recv.slice_mut() } })
}
