//! Device memory and host memory mapped for the device.

use super::{ok, Gpu};
use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use std::ffi::c_void;
use std::sync::Arc;

/// Device memory, freed on drop.
pub struct DeviceAlloc {
    pub ptr: CUdeviceptr,
    pub bytes: usize,
    pub(crate) gpu: Arc<Gpu>,
}

// SAFETY: a device address; every use binds the GPU's context first.
unsafe impl Send for DeviceAlloc {}
unsafe impl Sync for DeviceAlloc {}

impl DeviceAlloc {
    /// `bytes` of zeroed memory on `gpu` (an out-of-memory is an error naming the GPU and the size).
    pub fn zeroed(gpu: &Arc<Gpu>, bytes: usize) -> Result<DeviceAlloc, String> {
        gpu.bind()?;
        let mut ptr = 0;
        // SAFETY: a valid out-pointer; then a memset of the memory just allocated.
        unsafe {
            ok(
                sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)),
                &format!("cuMemAlloc of {bytes} bytes on GPU {}", gpu.ordinal),
            )?;
            ok(sys::cuMemsetD8_v2(ptr, 0, bytes.max(1)), "cuMemsetD8")?;
        }
        Ok(DeviceAlloc { ptr, bytes, gpu: gpu.clone() })
    }

    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), String> {
        if offset + data.len() > self.bytes {
            return Err(format!(
                "a write of {} bytes at {offset} into {} bytes of device memory",
                data.len(),
                self.bytes
            ));
        }
        self.gpu.bind()?;
        // SAFETY: in bounds (checked); the host slice is valid for its length.
        ok(unsafe { sys::cuMemcpyHtoD_v2(self.ptr + offset as u64, data.as_ptr().cast(), data.len()) }, "cuMemcpyHtoD")
    }

    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        if offset + out.len() > self.bytes {
            return Err(format!(
                "a read of {} bytes at {offset} from {} bytes of device memory",
                out.len(),
                self.bytes
            ));
        }
        self.gpu.bind()?;
        // SAFETY: as `write`.
        ok(
            unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr + offset as u64, out.len()) },
            "cuMemcpyDtoH",
        )
    }

    /// A dma-buf file descriptor of the whole allocation, for a NIC to read and write it (GPUDirect RDMA): an error
    /// saying why where the GPU or its driver cannot export one. The allocation's size is a whole number of pages.
    #[cfg_attr(not(feature = "ib"), allow(dead_code))]
    pub fn dma_buf(&self) -> Result<std::os::fd::OwnedFd, String> {
        use std::os::fd::FromRawFd;
        self.gpu.bind()?;
        let mut supported = 0;
        let attribute = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED;
        // SAFETY: a valid out-pointer and this GPU's ordinal.
        let asked = unsafe { sys::cuDeviceGetAttribute(&mut supported, attribute, self.gpu.ordinal) };
        if asked != CUresult::CUDA_SUCCESS || supported == 0 {
            return Err(format!("GPU {} or its driver does not support dma-buf", self.gpu.ordinal));
        }
        let mut fd: i32 = -1;
        // SAFETY: `fd` receives the descriptor; the range is this allocation.
        ok(
            unsafe {
                sys::cuMemGetHandleForAddressRange(
                    (&mut fd as *mut i32).cast(),
                    self.ptr,
                    self.bytes.next_multiple_of(4096),
                    sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    0,
                )
            },
            "cuMemGetHandleForAddressRange",
        )?;
        // SAFETY: a descriptor the driver just opened for this process, owned from here.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    pub fn fill(&self, byte: u8) -> Result<(), String> {
        self.gpu.bind()?;
        // SAFETY: the whole allocation.
        ok(unsafe { sys::cuMemsetD8_v2(self.ptr, byte, self.bytes.max(1)) }, "cuMemsetD8")
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() && !self.gpu.is_wedged() {
            // SAFETY: allocated by cuMemAlloc, freed once.
            unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// Whether `addr` is device memory of GPU `ordinal` (not host memory, another GPU's, or unknown to the driver).
pub fn is_device_memory(gpu: &Gpu, addr: u64) -> bool {
    if gpu.bind().is_err() {
        return false;
    }
    let mut ordinal: i32 = -1;
    // SAFETY: the attribute is a 4-byte device ordinal written into `ordinal`.
    let on = unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            addr,
        )
    };
    if on != CUresult::CUDA_SUCCESS || ordinal != gpu.ordinal {
        return false;
    }
    let mut kind: u32 = 0;
    // SAFETY: the attribute is a 4-byte memory type written into `kind`.
    let result = unsafe {
        sys::cuPointerGetAttribute(
            (&mut kind as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            addr,
        )
    };
    result == CUresult::CUDA_SUCCESS && kind == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
}

/// Host memory the device reads and writes directly (mapped, pinned): the launch table, the bases and the control
/// words, which the host writes or reads without a copy.
pub(crate) struct Pinned {
    pub(crate) host: *mut u64,
    pub(crate) dev: CUdeviceptr,
    pub(crate) words: usize,
    pub(crate) gpu: Arc<Gpu>,
}

// SAFETY: pinned memory of the process; words are written by one side at a time as the protocol says.
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Pinned {
    pub(crate) fn new(gpu: &Arc<Gpu>, words: usize) -> Result<Pinned, String> {
        gpu.bind()?;
        let mut host = std::ptr::null_mut();
        let mut dev = 0;
        let bytes = words.max(1) * 8;
        // SAFETY: valid out-pointers; the flags ask for memory mapped into every context (portable + device map).
        unsafe {
            ok(sys::cuMemHostAlloc(&mut host, bytes, 0x1 | 0x2), "cuMemHostAlloc")?;
            std::ptr::write_bytes(host.cast::<u8>(), 0, bytes);
            ok(sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0), "cuMemHostGetDevicePointer")?;
        }
        Ok(Pinned { host: host.cast(), dev, words, gpu: gpu.clone() })
    }

    pub(crate) fn set(&self, i: usize, value: u64) {
        assert!(i < self.words);
        // SAFETY: in bounds; a volatile store the device sees.
        unsafe { self.host.add(i).write_volatile(value) }
    }

    pub(crate) fn get(&self, i: usize) -> u64 {
        assert!(i < self.words);
        // SAFETY: in bounds; a volatile load of what the device wrote.
        unsafe { self.host.add(i).read_volatile() }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() && !self.gpu.is_wedged() {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            unsafe { sys::cuMemFreeHost(self.host.cast::<c_void>()) };
        }
    }
}
