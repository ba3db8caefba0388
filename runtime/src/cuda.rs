//! Device memory for the `cuda` transport's calls, and what the driver says (feature `cuda`).
//!
//! ```no_run
//! # use collc_runtime::{cuda::DeviceBuffer, Buffers, CallShape, Collective, Communicator, DataType, Options, ReduceOp};
//! let mut comms = Communicator::cuda(2, Options::default())?;
//! let comm = &mut comms[0];
//! let send = DeviceBuffer::new(comm, 4096)?;
//! let recv = DeviceBuffer::new(comm, 4096)?;
//! let shape = CallShape { collective: Collective::AllReduce, count: 1024, dtype: DataType::F32, op: ReduceOp::Sum, root: 0, peer: 0 };
//! comm.call(shape, Buffers::DeviceOutOfPlace { send: send.ptr(), recv: recv.ptr() })?; // with the other rank's call
//! # Ok::<(), collc_runtime::RuntimeError>(())
//! ```

use crate::comm::{Communicator, DevicePtr};
use crate::error::RuntimeError;
use crate::exec::cuda::{self as device, DeviceAlloc};

pub use device::{
    copy_rates, driver, empty_launch_us, gpu, is_device_memory, kernels_ptx, loaded_libraries, version_text, Driver,
    Gpu,
};

/// Memory on the GPU of a communicator's rank, freed on drop.
pub struct DeviceBuffer {
    memory: DeviceAlloc,
}

impl DeviceBuffer {
    /// `bytes` zeroed bytes on the GPU `comm`'s rank runs on.
    pub fn new(comm: &Communicator, bytes: usize) -> Result<DeviceBuffer, RuntimeError> {
        let ordinal = comm.gpu_ordinal().ok_or_else(|| {
            RuntimeError::Config(format!(
                "rank {}: device buffers need a communicator of the cuda transport",
                comm.rank()
            ))
        })?;
        DeviceBuffer::on(ordinal, bytes)
    }

    /// `bytes` zeroed bytes on GPU `ordinal`.
    pub fn on(ordinal: i32, bytes: usize) -> Result<DeviceBuffer, RuntimeError> {
        let gpu = device::gpu(ordinal).map_err(RuntimeError::Config)?;
        Ok(DeviceBuffer { memory: DeviceAlloc::zeroed(&gpu, bytes).map_err(RuntimeError::Config)? })
    }

    pub fn ptr(&self) -> DevicePtr {
        DevicePtr { addr: self.memory.ptr, bytes: self.memory.bytes }
    }

    /// A sub-range: `len` bytes from `offset`.
    pub fn slice(&self, offset: usize, len: usize) -> DevicePtr {
        assert!(offset + len <= self.memory.bytes, "{offset} + {len} beyond {} bytes", self.memory.bytes);
        DevicePtr { addr: self.memory.ptr + offset as u64, bytes: len }
    }

    pub fn len(&self) -> usize {
        self.memory.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.memory.bytes == 0
    }

    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), RuntimeError> {
        self.memory.write(offset, data).map_err(RuntimeError::Config)
    }

    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), RuntimeError> {
        self.memory.read(offset, out).map_err(RuntimeError::Config)
    }

    pub fn fill(&self, byte: u8) -> Result<(), RuntimeError> {
        self.memory.fill(byte).map_err(RuntimeError::Config)
    }
}
