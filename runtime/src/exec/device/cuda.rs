//! The device executor on GPUs (feature `cuda`): the kernels compiled by NVRTC with the encoder's layout, loaded
//! through the driver (both found at run time); each rank's image, state and scratch in device memory; connection
//! records in the receiver's device memory; and a `Launcher` per GPU and call shape, so the ranks that share a GPU
//! run one cooperative launch per call (their blocks wait on each other, so they must be resident together).
//!
//! Ranks on different GPUs of one process reach each other's records through peer access (`cuCtxEnablePeerAccess`,
//! checked with `cuDeviceCanAccessPeer`; a pair without it is an error), with system-scope fences.

use super::super::{Call, Executor, Plan};
use super::encode::{self, code, conn, control, CONTROL_WORDS, SLOTS, THREADS};
use super::launch::{self, most_telling, Launcher, Target};
use crate::error::RuntimeError;
use crate::transport::{Fabric, Transport};
use crate::wait::Backoff;
use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use std::collections::HashMap;
use std::ffi::{c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The PTX of every kernel for `arch`, compiled with the layout constants of `encode.rs`, as the executor loads it.
pub fn kernels_ptx(arch: &'static str) -> Result<String, String> {
    collc_kernels::cuda::compile(&encode::layout_defines(), arch)
}

/// `kernels_ptx`, kept in `$XDG_CACHE_HOME/collc` (or `~/.cache/collc`) under a hash of the program, NVRTC's version
/// and `arch`, so a process does not pay NVRTC's seconds again for kernels it compiled before.
/// `COLLC_CUDA_PTX` names a PTX file to load instead (made by `collc gpu ptx` of the same build, for a machine
/// without NVRTC).
fn cached_ptx(arch: &'static str) -> Result<String, String> {
    if let Some(path) = std::env::var_os("COLLC_CUDA_PTX") {
        return std::fs::read_to_string(&path)
            .map_err(|e| format!("COLLC_CUDA_PTX={}: {e}", std::path::Path::new(&path).display()));
    }
    let defines = encode::layout_defines();
    let version = collc_kernels::cuda::nvrtc_version()?;
    let key = format!("{}|{version:?}|{arch}", collc_kernels::cuda::program(&defines));
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    let dir = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| std::path::PathBuf::from(home).join(".cache")))
        .map(|base| base.join("collc"));
    let path = dir.as_ref().map(|dir| dir.join(format!("kernels-{arch}-{hash:016x}.ptx")));
    if let Some(ptx) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok(ptx);
    }
    let ptx = kernels_ptx(arch)?;
    if let (Some(dir), Some(path)) = (dir, path) {
        // A cache that cannot be written only costs the next process the compile.
        let temporary = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::create_dir_all(&dir).is_ok() && std::fs::write(&temporary, &ptx).is_ok() {
            let _ = std::fs::rename(&temporary, &path);
        }
    }
    Ok(ptx)
}

fn ok(result: CUresult, what: &str) -> Result<(), String> {
    if result == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string, or leaves it null.
    unsafe { sys::cuGetErrorString(result, &mut text) };
    let name = if text.is_null() {
        format!("{result:?}")
    } else {
        // SAFETY: non-null: a static NUL-terminated string of the driver's.
        unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
    };
    Err(format!("{what}: {name}"))
}

/// The CUDA driver, once per process: loaded, initialised, with its version and device count.
pub struct Driver {
    pub version: i32,
    pub devices: i32,
}

/// The driver, or why there is none ("no CUDA driver found: ...").
pub fn driver() -> Result<&'static Driver, String> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            // SAFETY: only tries to open the library by its names.
            if !unsafe { sys::is_culib_present() } {
                return Err("no CUDA driver found: libcuda.so.1 could not be loaded (install the NVIDIA driver; \
                            the threads, shm, tcp and twin transports need none)"
                    .into());
            }
            // SAFETY: the library is loaded; cuInit takes flags 0.
            ok(unsafe { sys::cuInit(0) }, "no CUDA driver found: cuInit")?;
            let (mut version, mut devices) = (0, 0);
            // SAFETY: valid out-pointers.
            ok(unsafe { sys::cuDriverGetVersion(&mut version) }, "cuDriverGetVersion")?;
            ok(unsafe { sys::cuDeviceGetCount(&mut devices) }, "cuDeviceGetCount")?;
            if devices == 0 {
                return Err(format!("no CUDA device found (driver {})", version_text(version)));
            }
            Ok(Driver { version, devices })
        })
        .as_ref()
        .map_err(Clone::clone)
}

pub fn version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// The paths of the CUDA libraries this process has loaded (from /proc/self/maps): what `collc run` reports.
pub fn loaded_libraries() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut paths: Vec<String> = maps
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| path.contains("libcuda.so") || path.contains("libnvrtc"))
        .map(str::to_string)
        .collect();
    paths.sort();
    paths.dedup();
    paths
}

/// One GPU: its primary context, the kernels loaded in it, and what a launch needs to know of it.
pub struct Gpu {
    pub ordinal: i32,
    pub name: String,
    pub sms: u32,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    _module: sys::CUmodule,
    interpret: sys::CUfunction,
    pub(crate) kernels: Kernels,
    stream: sys::CUstream,
    /// Blocks of the interpreter one SM holds at once.
    per_sm: u32,
    /// An interpreter kernel did not finish: its memory may still be in use, so none is freed, and nothing more
    /// is launched.
    wedged: AtomicBool,
}

/// The standalone kernels (the benchmark's copy and reduce, the empty launch).
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    pub copy: sys::CUfunction,
    pub empty: sys::CUfunction,
}

// SAFETY: CUDA handles may be used from any thread once the context is made current there (`bind`).
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

impl Gpu {
    /// Whether a kernel of this GPU's interpreter never finished (so no memory is freed and nothing launched).
    pub fn is_wedged(&self) -> bool {
        self.wedged.load(Ordering::Acquire)
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<(), String> {
        // SAFETY: a context retained for the process's lifetime.
        ok(unsafe { sys::cuCtxSetCurrent(self.ctx) }, "cuCtxSetCurrent")
    }
}

/// GPU `ordinal`, its kernels compiled and loaded on first use.
pub fn gpu(ordinal: i32) -> Result<Arc<Gpu>, String> {
    static GPUS: OnceLock<Mutex<HashMap<i32, Arc<Gpu>>>> = OnceLock::new();
    let driver = driver()?;
    if ordinal < 0 || ordinal >= driver.devices {
        return Err(format!("GPU {ordinal} does not exist ({} found)", driver.devices));
    }
    let mut gpus = GPUS.get_or_init(Default::default).lock().map_err(|_| "a poisoned lock".to_string())?;
    if let Some(gpu) = gpus.get(&ordinal) {
        return Ok(gpu.clone());
    }
    let gpu = Arc::new(open_gpu(ordinal)?);
    gpus.insert(ordinal, gpu.clone());
    Ok(gpu)
}

fn open_gpu(ordinal: i32) -> Result<Gpu, String> {
    let mut device = 0;
    // SAFETY: valid out-pointers throughout; handles come from the calls before.
    unsafe {
        ok(sys::cuDeviceGet(&mut device, ordinal), "cuDeviceGet")?;
        let mut name = [0 as std::ffi::c_char; 128];
        ok(sys::cuDeviceGetName(name.as_mut_ptr(), 128, device), "cuDeviceGetName")?;
        let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
        let attribute = |a: sys::CUdevice_attribute| -> Result<i32, String> {
            let mut v = 0;
            ok(sys::cuDeviceGetAttribute(&mut v, a, device), "cuDeviceGetAttribute")?;
            Ok(v)
        };
        let sms = attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        if attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? == 0 {
            return Err(format!("GPU {ordinal} ({name}) cannot launch cooperatively, which the interpreter needs"));
        }
        let (major, minor) = (
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let mut ctx = std::ptr::null_mut();
        ok(sys::cuDevicePrimaryCtxRetain(&mut ctx, device), "cuDevicePrimaryCtxRetain")?;
        ok(sys::cuCtxSetCurrent(ctx), "cuCtxSetCurrent")?;
        let arch = arch_for(major, minor).ok_or(format!(
            "GPU {ordinal} ({name}) is sm_{major}{minor}: below sm_75, which NVRTC 13 no longer compiles for"
        ))?;
        let ptx = CString::new(cached_ptx(arch)?).map_err(|_| "PTX with a NUL byte".to_string())?;
        let mut module = std::ptr::null_mut();
        ok(sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()), "cuModuleLoadData (the kernels' PTX)")?;
        let function = |entry: &str| -> Result<sys::CUfunction, String> {
            let mut f = std::ptr::null_mut();
            let entry_c = CString::new(entry).expect("no NUL");
            ok(sys::cuModuleGetFunction(&mut f, module, entry_c.as_ptr()), entry)?;
            Ok(f)
        };
        let interpret = function("collc_interpret")?;
        let kernels = Kernels { copy: function("collc_copy")?, empty: function("collc_empty")? };
        let mut per_sm = 0;
        ok(
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, interpret, THREADS as i32, 0),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        )?;
        let mut stream = std::ptr::null_mut();
        ok(sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32), "cuStreamCreate")?;
        let per_sm = per_sm as u32;
        let wedged = AtomicBool::new(false);
        Ok(Gpu { ordinal, name, sms, device, ctx, _module: module, interpret, kernels, stream, per_sm, wedged })
    }
}

/// The virtual architecture to compile for: the GPU's own, within what NVRTC 12/13 know.
fn arch_for(major: i32, minor: i32) -> Option<&'static str> {
    Some(match (major, minor) {
        (9, _) => "compute_90",
        (8, 9) => "compute_89",
        (8, 6..) => "compute_86",
        (8, _) => "compute_80",
        (7, 5..) => "compute_75",
        (m, _) if m >= 10 => "compute_90",
        _ => return None,
    })
}

/// Device memory, freed on drop.
pub struct DeviceAlloc {
    pub ptr: CUdeviceptr,
    pub bytes: usize,
    gpu: Arc<Gpu>,
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
    host: *mut u64,
    dev: CUdeviceptr,
    words: usize,
    gpu: Arc<Gpu>,
}

// SAFETY: pinned memory of the process; words are written by one side at a time as the protocol says.
unsafe impl Send for Pinned {}
unsafe impl Sync for Pinned {}

impl Pinned {
    fn new(gpu: &Arc<Gpu>, words: usize) -> Result<Pinned, String> {
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

    fn set(&self, i: usize, value: u64) {
        assert!(i < self.words);
        // SAFETY: in bounds; a volatile store the device sees.
        unsafe { self.host.add(i).write_volatile(value) }
    }

    fn get(&self, i: usize) -> u64 {
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

type GpuLauncher = Arc<Launcher<CudaTarget>>;

/// A connection's record: sender, receiver, channel, slot bytes, lane.
type ConnKey = (u32, u32, u8, usize, u32);

/// The `cuda` transport's fabric for ranks that are threads of this process: rank r on GPU `r % gpus`.
pub(crate) struct CudaFabric {
    gpus: Vec<Arc<Gpu>>,
    n_ranks: u32,
    conns: Mutex<HashMap<ConnKey, Arc<DeviceAlloc>>>,
    /// By call shape (fingerprint) and GPU.
    launchers: Mutex<HashMap<(u64, i32), GpuLauncher>>,
}

impl CudaFabric {
    /// Opens `gpus` GPUs (every one the driver sees when `None`) and enables peer access between them.
    pub fn new(n_ranks: u32, gpus: Option<u32>) -> Result<CudaFabric, String> {
        let driver = driver()?;
        let n = gpus.unwrap_or(driver.devices as u32).min(driver.devices as u32).min(n_ranks.max(1)).max(1);
        let gpus: Vec<Arc<Gpu>> = (0..n as i32).map(gpu).collect::<Result<_, _>>()?;
        for a in &gpus {
            for b in &gpus {
                if a.ordinal == b.ordinal {
                    continue;
                }
                let mut can = 0;
                // SAFETY: valid devices and out-pointer.
                ok(unsafe { sys::cuDeviceCanAccessPeer(&mut can, a.device, b.device) }, "cuDeviceCanAccessPeer")?;
                if can == 0 {
                    return Err(format!(
                        "GPU {} cannot access GPU {}'s memory (no peer access over NVLink or PCIe): run with \
                         COLLC_CUDA_GPUS=1, or one process per GPU",
                        a.ordinal, b.ordinal
                    ));
                }
                a.bind()?;
                // SAFETY: b's context is retained; already-enabled is not an error.
                let result = unsafe { sys::cuCtxEnablePeerAccess(b.ctx, 0) };
                if result != CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
                    ok(result, "cuCtxEnablePeerAccess")?;
                }
            }
        }
        Ok(CudaFabric { gpus, n_ranks, conns: Mutex::default(), launchers: Mutex::default() })
    }

    pub fn gpu_of(&self, rank: u32) -> &Arc<Gpu> {
        &self.gpus[rank as usize % self.gpus.len()]
    }

    /// The same on every rank: from the most ranks any GPU holds and the fewest SMs any has.
    fn lanes(&self, plan: &Plan) -> Result<u32, String> {
        let per_gpu = self.n_ranks.div_ceil(self.gpus.len() as u32);
        let sms = self.gpus.iter().map(|g| g.sms).min().unwrap_or(1);
        lanes_for(sms, per_gpu, plan)
    }

    fn ranks_on(&self, ordinal: i32) -> Vec<u32> {
        (0..self.n_ranks).filter(|&r| self.gpu_of(r).ordinal == ordinal).collect()
    }
}

impl Fabric for CudaFabric {
    fn transport(&self) -> Transport {
        Transport::Cuda
    }

    fn remove_all(&self) {}

    fn gpu_ordinal(&self, rank: u32) -> Option<i32> {
        Some(self.gpu_of(rank).ordinal)
    }

    fn prepare(&self, plan: Plan) -> Result<Box<dyn Executor>, RuntimeError> {
        let rank = plan.rank;
        let config = |e: String| RuntimeError::Config(format!("rank {rank}: {e}"));
        let gpu = self.gpu_of(plan.rank).clone();
        let lanes = self.lanes(&plan).map_err(config)?;
        let image = encode::encode(&[&plan], lanes).map_err(config)?;
        let mut conns = Vec::with_capacity(image.conns.len());
        {
            let mut registry = self.conns.lock().map_err(|_| RuntimeError::Poisoned)?;
            for &(from, to, channel, slot_bytes, lane) in &image.conns {
                let record = match registry.get(&(from, to, channel, slot_bytes, lane)) {
                    Some(record) => record.clone(),
                    None => {
                        // The record and its slots live with the receiver, which reads them most.
                        let record = Arc::new(conn_record(self.gpu_of(to), slot_bytes).map_err(config)?);
                        registry.insert((from, to, channel, slot_bytes, lane), record.clone());
                        record
                    }
                };
                conns.push(record);
            }
        }
        let table: Vec<u64> = conns.iter().map(|c| c.ptr).collect();
        let launcher = {
            let mut launchers = self.launchers.lock().map_err(|_| RuntimeError::Poisoned)?;
            let key = (plan.fingerprint, gpu.ordinal);
            match launchers.get(&key) {
                Some(l) => l.clone(),
                None => {
                    let ranks = self.ranks_on(gpu.ordinal);
                    let stop = DeviceAlloc::zeroed(&gpu, 8).map_err(config)?;
                    let target = CudaTarget { gpu: gpu.clone(), system_scope: self.gpus.len() > 1, stop };
                    let l = Arc::new(Launcher::new(target, ranks));
                    launchers.insert(key, l.clone());
                    l
                }
            }
        };
        CudaExec::upload(plan, &gpu, &image, &table, Keep::Shared { _records: conns }, launcher).map_err(config)
    }
}

/// The `cuda` transport for ranks that are processes on one host (a launcher's, or `collc run`'s with `COLLC_RANK`):
/// each process one rank, on GPU `rank mod G`, launching its own blocks. A connection's records are the receiver's
/// device memory, one allocation per prepared call shape, which the sender maps through CUDA IPC: the handle and
/// where each record sits in it are exchanged over the bootstrap when the shape is first prepared (collectively, as
/// every rank prepares the same shapes in the same order). Processes on one GPU run concurrently only under MPS;
/// without it the GPU time-slices their kernels, which is slow but still completes.
pub(crate) struct IpcFabric {
    gpu: Arc<Gpu>,
    gpus: u32,
    n_ranks: u32,
    /// The job's shared memory, where the bootstrap's control block is.
    bootstrap_memory: Arc<crate::transport::shm::Memory>,
}

impl IpcFabric {
    pub fn new(
        rank: u32,
        n_ranks: u32,
        gpus: Option<u32>,
        bootstrap_memory: Arc<crate::transport::shm::Memory>,
    ) -> Result<IpcFabric, String> {
        let driver = driver()?;
        let gpus = gpus.unwrap_or(driver.devices as u32).min(driver.devices as u32).max(1);
        let gpu = gpu((rank % gpus) as i32)?;
        Ok(IpcFabric { gpu, gpus, n_ranks, bootstrap_memory })
    }

    /// From the most ranks any GPU holds and this GPU's SMs; the ranks check that they agree.
    fn lanes(&self, plan: &Plan) -> Result<u32, String> {
        lanes_for(self.gpu.sms, self.n_ranks.div_ceil(self.gpus), plan)
    }
}

/// What each rank publishes of one incoming record: (sender, channel, lane, slot bytes, offset in its allocation).
type Published = (u32, u8, u32, u32, u64);
const PUBLISHED_BYTES: usize = 4 + 1 + 4 + 4 + 8;

impl Fabric for IpcFabric {
    fn transport(&self) -> Transport {
        Transport::Cuda
    }

    fn remove_all(&self) {
        self.bootstrap_memory.remove_all();
    }

    fn gpu_ordinal(&self, _rank: u32) -> Option<i32> {
        Some(self.gpu.ordinal)
    }

    fn prepare(&self, _plan: Plan) -> Result<Box<dyn Executor>, RuntimeError> {
        Err(RuntimeError::Config("the cuda transport's processes prepare together (prepare_collective)".into()))
    }

    fn prepare_collective(
        &self,
        plan: Plan,
        gather: &mut crate::transport::Gather,
    ) -> Result<Box<dyn Executor>, RuntimeError> {
        let rank = plan.rank;
        let config = |e: String| RuntimeError::Config(format!("rank {rank}: {e}"));
        let gpu = self.gpu.clone();
        let lanes = self.lanes(&plan).map_err(config)?;
        let image = encode::encode(&[&plan], lanes).map_err(config)?;
        // This rank's incoming records, one allocation, each record 256-byte aligned, after a word per rank that is
        // 1 while that rank may have the allocation mapped (see `Exported`).
        let mut offsets = vec![u64::MAX; image.conns.len()];
        let mut size = importer_words_bytes(self.n_ranks);
        let mut published: Vec<Published> = Vec::new();
        for (c, &(from, to, channel, slot_bytes, lane)) in image.conns.iter().enumerate() {
            if to == rank {
                offsets[c] = size as u64;
                published.push((from, channel, lane, slot_bytes as u32, size as u64));
                size += encode::record_bytes(slot_bytes).next_multiple_of(256);
            }
        }
        sweep_exported();
        let incoming = DeviceAlloc::zeroed(&gpu, size).map_err(config)?;
        let mut importers = vec![0u64; self.n_ranks as usize];
        for (c, &(from, to, _, slot_bytes, _)) in image.conns.iter().enumerate() {
            if to == rank {
                importers[from as usize] = 1;
                incoming
                    .write(offsets[c] as usize + conn::SLOT_BYTES * 8, &(slot_bytes as u64).to_le_bytes())
                    .map_err(config)?;
            }
        }
        let words: Vec<u8> = importers.iter().flat_map(|w| w.to_le_bytes()).collect();
        incoming.write(0, &words).map_err(config)?;
        // From here the handle may be out: whatever happens, the allocation is freed only once its importers let go.
        let incoming = Exported { memory: Some(incoming), n_ranks: self.n_ranks };
        let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
        // SAFETY: a valid out-pointer and an allocation of this context.
        ok(unsafe { sys::cuIpcGetMemHandle(&mut handle, incoming.ptr()) }, "cuIpcGetMemHandle").map_err(config)?;
        // Round 1: every rank's handle, its call's fingerprint, how many records it publishes, its lanes and where
        // its schedule came from (for a mismatch report).
        let mut first: Vec<u8> = handle.reserved.iter().map(|&b| b as u8).collect();
        first.extend_from_slice(&plan.fingerprint.to_le_bytes());
        first.extend_from_slice(&(published.len() as u32).to_le_bytes());
        first.extend_from_slice(&lanes.to_le_bytes());
        first.extend_from_slice(crate::transport::clip_source(&plan.source).as_bytes());
        let firsts = gather(&first)?;
        let mut handles = Vec::with_capacity(firsts.len());
        let mut most = 0usize;
        for (peer, blob) in firsts.iter().enumerate() {
            if blob.len() < 64 + 8 + 4 + 4 {
                return Err(config(format!("rank {peer} sent a malformed IPC announcement")));
            }
            let fingerprint = u64::from_le_bytes(blob[64..72].try_into().expect("8 bytes"));
            if fingerprint != plan.fingerprint {
                let source = String::from_utf8_lossy(&blob[80..]);
                return Err(RuntimeError::Mismatch {
                    rank,
                    peer: peer as u32,
                    ours: format!("a call with {}, fingerprint {:016x}", plan.source, plan.fingerprint),
                    theirs: format!("a call with {source}, fingerprint {fingerprint:016x}"),
                });
            }
            most = most.max(u32::from_le_bytes(blob[72..76].try_into().expect("4 bytes")) as usize);
            let theirs = u32::from_le_bytes(blob[76..80].try_into().expect("4 bytes"));
            if theirs != lanes {
                return Err(config(format!(
                    "rank {peer} runs {theirs} lanes and this rank {lanes} (GPUs of different sizes?): set \
                     COLLC_CUDA_LANES to the same number on every rank"
                )));
            }
            let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
            for (d, &b) in h.reserved.iter_mut().zip(&blob[..64]) {
                *d = b as std::ffi::c_char;
            }
            handles.push(h);
        }
        // Then the records themselves, as many a round as a blob holds.
        let per_round = crate::transport::BLOB_BYTES / PUBLISHED_BYTES;
        let mut theirs: Vec<Vec<Published>> = vec![Vec::new(); firsts.len()];
        for round in 0..most.div_ceil(per_round) {
            let mut blob = Vec::new();
            for &(from, channel, lane, slot, offset) in published.iter().skip(round * per_round).take(per_round) {
                blob.extend_from_slice(&from.to_le_bytes());
                blob.push(channel);
                blob.extend_from_slice(&lane.to_le_bytes());
                blob.extend_from_slice(&slot.to_le_bytes());
                blob.extend_from_slice(&offset.to_le_bytes());
            }
            for (peer, blob) in gather(&blob)?.into_iter().enumerate() {
                for e in blob.chunks_exact(PUBLISHED_BYTES) {
                    let word = |at: usize| u32::from_le_bytes(e[at..at + 4].try_into().expect("4 bytes"));
                    let offset = u64::from_le_bytes(e[13..21].try_into().expect("8 bytes"));
                    theirs[peer].push((word(0), e[4], word(5), word(9), offset));
                }
            }
        }
        // Map the records of every rank this one sends to, and lay out the connection table.
        let mut mapped: HashMap<u32, IpcMapping> = HashMap::new();
        let mut map_all = || -> Result<Vec<u64>, RuntimeError> {
            let mut table = Vec::with_capacity(image.conns.len());
            for (c, &(from, to, channel, slot_bytes, lane)) in image.conns.iter().enumerate() {
                let address = if to == rank {
                    incoming.ptr() + offsets[c]
                } else {
                    let entry = theirs[to as usize]
                        .iter()
                        .find(|&&(f, ch, l, _, _)| (f, ch, l) == (from, channel, lane))
                        .ok_or_else(|| {
                            config(format!(
                                "rank {to} publishes no record for the connection from {from} channel {channel}"
                            ))
                        })?;
                    if entry.3 as usize != slot_bytes {
                        return Err(config(format!(
                            "rank {to} sizes the slots from {from} channel {channel} differently"
                        )));
                    }
                    let mapping = match mapped.entry(to) {
                        std::collections::hash_map::Entry::Occupied(m) => m.into_mut(),
                        std::collections::hash_map::Entry::Vacant(v) => {
                            let opened = IpcMapping::open(&gpu, handles[to as usize], rank)
                                .map_err(|e| config(format!("mapping rank {to}'s connection records: {e}")))?;
                            v.insert(opened)
                        }
                    };
                    mapping.ptr + entry.4
                };
                table.push(address);
            }
            Ok(table)
        };
        let table = map_all();
        // Every rank says whether it mapped its peers' records, so none launches a shape another could not set up;
        // a peer gone meanwhile is named by this round itself.
        let verdicts = gather(&[table.is_ok() as u8])?;
        let table = table?;
        if let Some(peer) = verdicts.iter().position(|v| v.first() != Some(&1)) {
            return Err(config(format!("rank {peer} could not map its peers' connection records (see its error)")));
        }
        let stop = DeviceAlloc::zeroed(&gpu, 8).map_err(config)?;
        // System-scope fences: a peer process may be on another GPU even where this one sees only its own.
        let launcher = Arc::new(Launcher::new(CudaTarget { gpu: gpu.clone(), system_scope: true, stop }, vec![rank]));
        let keep = Keep::Ipc { _mapped: mapped.into_values().collect(), _incoming: incoming };
        CudaExec::upload(plan, &gpu, &image, &table, keep, launcher).map_err(config)
    }
}

/// The bytes before the records of an exported allocation: a word per rank, 1 while that rank may map it.
fn importer_words_bytes(n_ranks: u32) -> usize {
    (n_ranks as usize * 8).next_multiple_of(256)
}

/// A rank's incoming records once their IPC handle may have gone out. CUDA leaves it undefined what freeing such
/// memory does before every importer has closed its mapping, so it is freed only when every rank's word in its
/// head is 0 again (each importer clears its own word before it closes); until then it waits in a list swept at
/// each later setup and drop, and what is left at exit goes with the process.
pub(crate) struct Exported {
    memory: Option<DeviceAlloc>,
    n_ranks: u32,
}

impl Exported {
    fn ptr(&self) -> CUdeviceptr {
        self.memory.as_ref().map_or(0, |m| m.ptr)
    }

    /// Whether no rank has the allocation mapped any longer (an unreadable head counts as mapped).
    fn released(&self) -> bool {
        let Some(memory) = &self.memory else { return true };
        let mut words = vec![0u8; self.n_ranks as usize * 8];
        memory.read(0, &mut words).is_ok() && words.iter().all(|&b| b == 0)
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        if !self.released() {
            if let Ok(mut waiting) = EXPORTED.lock() {
                waiting.push(Exported { memory: self.memory.take(), n_ranks: self.n_ranks });
            } else {
                std::mem::forget(self.memory.take());
            }
        }
        sweep_exported();
    }
}

/// Exported allocations some importer may still have mapped.
static EXPORTED: Mutex<Vec<Exported>> = Mutex::new(Vec::new());

/// Frees the waiting exported allocations no rank maps any longer.
fn sweep_exported() {
    let released: Vec<Exported> = match EXPORTED.lock() {
        Ok(mut waiting) => {
            let (released, kept) = std::mem::take(&mut *waiting).into_iter().partition(Exported::released);
            *waiting = kept;
            released
        }
        Err(_) => return,
    };
    drop(released);
}

/// A peer's allocation mapped into this process through CUDA IPC, unmapped on drop after clearing this rank's word
/// in its head.
pub(crate) struct IpcMapping {
    ptr: CUdeviceptr,
    rank: u32,
    gpu: Arc<Gpu>,
}

// SAFETY: a device address; every use binds the GPU's context first.
unsafe impl Send for IpcMapping {}
unsafe impl Sync for IpcMapping {}

impl IpcMapping {
    fn open(gpu: &Arc<Gpu>, handle: sys::CUipcMemHandle_st, rank: u32) -> Result<IpcMapping, String> {
        gpu.bind()?;
        let mut ptr = 0;
        // SAFETY: a handle another process of this job exported; flag 1 enables peer access lazily.
        ok(unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, 1) }, "cuIpcOpenMemHandle")?;
        Ok(IpcMapping { ptr, rank, gpu: gpu.clone() })
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.gpu.bind().is_ok() && !self.gpu.is_wedged() {
            let zero = 0u64.to_le_bytes();
            // SAFETY: the mapping's head holds a word per rank (`Exported`); this rank's is in it. Then the mapping,
            // opened by cuIpcOpenMemHandle, is closed once.
            unsafe {
                sys::cuMemcpyHtoD_v2(self.ptr + 8 * self.rank as u64, zero.as_ptr().cast(), 8);
                sys::cuIpcCloseMemHandle(self.ptr);
            }
        }
    }
}

/// The connection memory an executor keeps alive: records shared with rank threads, or (processes) its own
/// incoming records and its mappings of its peers'.
pub(crate) enum Keep {
    Shared {
        _records: Vec<Arc<DeviceAlloc>>,
    },
    /// The mappings go first: this rank's word in each peer's head is cleared before its own allocation is looked at.
    Ipc {
        _mapped: Vec<IpcMapping>,
        _incoming: Exported,
    },
}

/// Lanes for `per_gpu` ranks sharing a GPU of `sms` SMs: as many as fill them with one block each, within 64 MiB of
/// slots per connection; `COLLC_CUDA_LANES` overrides. Both ends of a connection must get the same count.
fn lanes_for(sms: u32, per_gpu: u32, plan: &Plan) -> Result<u32, String> {
    if let Ok(text) = std::env::var("COLLC_CUDA_LANES") {
        return text
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or(format!("COLLC_CUDA_LANES=`{text}` is not a positive number"));
    }
    // Each lane has its own slots: at most 64 MiB of them per connection (NCCL keeps 4 MiB per channel).
    let by_memory = ((64usize << 20) / (SLOTS as usize * plan.widest_slot.max(1))).max(1) as u32;
    Ok((sms / (per_gpu.max(1) * plan.channels.max(1))).clamp(1, 64).min(by_memory))
}

/// A connection's record (`CONN_WORDS` words) followed, `RECORD_BYTES` in, by its `SLOTS` slots.
fn conn_record(gpu: &Arc<Gpu>, slot_bytes: usize) -> Result<DeviceAlloc, String> {
    let memory = DeviceAlloc::zeroed(gpu, encode::record_bytes(slot_bytes))?;
    memory.write(conn::SLOT_BYTES * 8, &(slot_bytes as u64).to_le_bytes())?;
    Ok(memory)
}

/// One rank's part in the launches of its GPU.
pub(crate) struct CudaEntry {
    image: CUdeviceptr,
    state: CUdeviceptr,
    bases: CUdeviceptr,
    blocks: u32,
}

/// A GPU as a launch target: cooperative grids of the interpreter, with the device word a faulting block sets to
/// the call's sequence number so every block stops.
pub(crate) struct CudaTarget {
    gpu: Arc<Gpu>,
    system_scope: bool,
    stop: DeviceAlloc,
}

impl Target for CudaTarget {
    type Entry = CudaEntry;
    /// The launch table (4 words per block) and the control words (the abort request, then a fault report of
    /// `CONTROL_WORDS` per block), both host-mapped, and the grid.
    type Cached = (Pinned, Pinned, u32);

    fn blocks(entry: &CudaEntry) -> u32 {
        entry.blocks
    }

    fn run(
        &self,
        entries: &[(u32, CudaEntry)],
        cached: &mut Option<(Pinned, Pinned, u32)>,
        call: &Call,
        peers: &[u32],
    ) -> Result<[u64; CONTROL_WORDS], String> {
        if cached.is_none() {
            let grid: u32 = entries.iter().map(|(_, e)| e.blocks).sum();
            let fits = self.gpu.per_sm * self.gpu.sms;
            if grid > fits {
                return Err(format!(
                    "the launch needs {grid} blocks resident at once and GPU {} ({}) holds {fits}: put fewer \
                     ranks on it, or use an algorithm with fewer channels",
                    self.gpu.ordinal, self.gpu.name
                ));
            }
            let table = Pinned::new(&self.gpu, 4 * grid as usize)?;
            let mut at = 0;
            for (_, entry) in entries {
                for b in 0..entry.blocks {
                    table.set(4 * at, entry.image);
                    table.set(4 * at + 1, entry.state);
                    table.set(4 * at + 2, entry.bases);
                    table.set(4 * at + 3, b as u64);
                    at += 1;
                }
            }
            let control = Pinned::new(&self.gpu, 1 + CONTROL_WORDS * grid as usize)?;
            *cached = Some((table, control, grid));
        }
        let (table, control, grid) = cached.as_ref().expect("made above");
        if self.gpu.is_wedged() {
            return Err(format!(
                "GPU {} still runs an interpreter kernel that never finished (see the first error): this process \
                 cannot launch on it again; restart the job (the GPU may need a reset)",
                self.gpu.ordinal
            ));
        }
        self.gpu.bind()?;
        let (mut table_ptr, mut control_ptr, mut stop_ptr, mut seq) = (table.dev, control.dev, self.stop.ptr, call.seq);
        let mut timeout_ns = call.timeout.as_nanos().min(u64::MAX as u128) as u64;
        let mut system = self.system_scope as u32;
        let mut params: [*mut c_void; 6] = [
            (&mut table_ptr as *mut u64).cast(),
            (&mut control_ptr as *mut u64).cast(),
            (&mut stop_ptr as *mut u64).cast(),
            (&mut seq as *mut u64).cast(),
            (&mut timeout_ns as *mut u64).cast(),
            (&mut system as *mut u32).cast(),
        ];
        // SAFETY: the function takes these six parameters; the memory they point at lives in this launcher and in
        // the executors that registered, which wait for this launch before they return.
        ok(
            unsafe {
                sys::cuLaunchCooperativeKernel(
                    self.gpu.interpret,
                    *grid,
                    1,
                    1,
                    THREADS,
                    1,
                    1,
                    0,
                    self.gpu.stream,
                    params.as_mut_ptr(),
                )
            },
            "cuLaunchCooperativeKernel",
        )?;
        let mut wait = Backoff::new(Duration::MAX, call.spins);
        let started = Instant::now();
        let mut asked_to_stop = false;
        let waited = loop {
            // SAFETY: a stream of this context.
            let status = unsafe { sys::cuStreamQuery(self.gpu.stream) };
            if status == CUresult::CUDA_SUCCESS {
                break Ok(());
            }
            if status != CUresult::CUDA_ERROR_NOT_READY {
                break ok(status, "the interpreter kernel");
            }
            // The kernel times out on its own (a block idle for the timeout); a peer's failure asks it to stop. A
            // call still running long after that is a kernel that cannot stop.
            let health = wait.idle(|| call.bootstrap.health(peers));
            if health.is_err() && !asked_to_stop {
                control.set(0, call.seq);
                asked_to_stop = true;
            }
            if started.elapsed() > call.timeout * 10 + Duration::from_secs(60) {
                // The kernel may still read and write any memory of this GPU's launches: keep all of it.
                self.gpu.wedged.store(true, Ordering::Release);
                break Err(format!(
                    "the interpreter kernel on GPU {} ran 10 times its timeout without finishing or timing out: \
                     the GPU may need a reset",
                    self.gpu.ordinal
                ));
            }
        };
        // The most telling report of any block, all cleared.
        let words = most_telling(*grid as usize, |b, w| control.get(1 + CONTROL_WORDS * b + w));
        for b in 0..*grid as usize {
            control.set(1 + CONTROL_WORDS * b + control::CODE, code::OK);
        }
        waited?;
        Ok(words)
    }
}

/// One rank's plan on a GPU.
pub(crate) struct CudaExec {
    plan: Plan,
    _image: DeviceAlloc,
    _state: DeviceAlloc,
    bases: Pinned,
    _scratch: Vec<DeviceAlloc>,
    _conns: Keep,
    launcher: Arc<Launcher<CudaTarget>>,
    token: u64,
}

impl CudaExec {
    /// Puts `plan`'s image on `gpu` with its state (`conn_table`: each connection record's address), scratch and
    /// host-mapped bases, and registers it with `launcher`.
    fn upload(
        plan: Plan,
        gpu: &Arc<Gpu>,
        image: &encode::Image,
        conn_table: &[u64],
        keep: Keep,
        launcher: Arc<Launcher<CudaTarget>>,
    ) -> Result<Box<dyn Executor>, String> {
        let image_mem = DeviceAlloc::zeroed(gpu, image.bytes().len())?;
        image_mem.write(0, image.bytes())?;
        let state = DeviceAlloc::zeroed(gpu, image.state_words() * 8)?;
        let table: Vec<u8> = conn_table.iter().flat_map(|a| a.to_le_bytes()).collect();
        state.write(image.conn_table_at() * 8, &table)?;
        let scratch: Vec<DeviceAlloc> =
            plan.scratch_bytes().into_iter().map(|bytes| DeviceAlloc::zeroed(gpu, bytes)).collect::<Result<_, _>>()?;
        let bases = Pinned::new(gpu, image.bases_words())?;
        for (b, memory) in scratch.iter().enumerate() {
            bases.set(2 + b, memory.ptr);
        }
        let blocks = image.header().n_blocks;
        let entry = CudaEntry { image: image_mem.ptr, state: state.ptr, bases: bases.dev, blocks };
        let token = launcher.register(plan.rank, entry);
        Ok(Box::new(CudaExec {
            plan,
            _image: image_mem,
            _state: state,
            bases,
            _scratch: scratch,
            _conns: keep,
            launcher,
            token,
        }))
    }
}

impl Drop for CudaExec {
    fn drop(&mut self) {
        // Its image, state and bases go with it: the next launch must not name them.
        self.launcher.unregister(self.plan.rank, self.token);
    }
}

impl Executor for CudaExec {
    fn plan_mut(&mut self) -> &mut Plan {
        &mut self.plan
    }

    fn run(&mut self, call: &Call) -> Result<(), RuntimeError> {
        let plan = &self.plan;
        for b in 0..2 {
            let addr = plan.bases[b] as u64;
            if addr != 0 && !is_device_memory(&self.launcher.target().gpu, addr) {
                return Err(RuntimeError::Config(format!(
                    "rank {}: buffer {addr:#x} is not device memory of its GPU {}: the cuda transport computes on \
                     memory from collc_runtime::cuda::DeviceBuffer::new(comm, ..) (or cuMemAlloc on that GPU)",
                    plan.rank,
                    self.launcher.target().gpu.ordinal
                )));
            }
            self.bases.set(b, addr);
        }
        let words = self.launcher.arrive(plan, call)?;
        launch::outcome(plan, &words, call)
    }
}

/// Launches `f` on `gpu`'s stream with `params` over `grid` blocks of `THREADS` and waits for it.
fn launch_and_wait(gpu: &Gpu, f: sys::CUfunction, grid: u32, params: &mut [*mut c_void]) -> Result<(), String> {
    // SAFETY: `params` match the kernel's parameters (the callers below pass each kernel's own).
    unsafe {
        ok(
            sys::cuLaunchKernel(f, grid, 1, 1, THREADS, 1, 1, 0, gpu.stream, params.as_mut_ptr(), std::ptr::null_mut()),
            "cuLaunchKernel",
        )?;
        ok(sys::cuStreamSynchronize(gpu.stream), "cuStreamSynchronize")
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The copy kernel's rate and `cuMemcpyDtoD`'s on `gpu`, copying `bytes` device to device: (kernel, memcpy) in
/// GB/s of bytes copied, medians of `iters` timed copies each, alternating.
pub fn copy_rates(gpu: &Arc<Gpu>, bytes: usize, iters: u32) -> Result<(f64, f64), String> {
    let (src, dst) = (DeviceAlloc::zeroed(gpu, bytes)?, DeviceAlloc::zeroed(gpu, bytes)?);
    let grid = gpu.sms * 4;
    let (mut kernel, mut memcpy) = (Vec::new(), Vec::new());
    for i in 0..iters + 2 {
        let (mut d, mut s, mut n) = (dst.ptr, src.ptr, bytes as u64);
        let mut params: [*mut c_void; 3] =
            [(&mut d as *mut u64).cast(), (&mut s as *mut u64).cast(), (&mut n as *mut u64).cast()];
        let started = Instant::now();
        launch_and_wait(gpu, gpu.kernels.copy, grid, &mut params)?;
        let k = started.elapsed().as_secs_f64();
        let started = Instant::now();
        // SAFETY: two allocations of `bytes` bytes on this context.
        unsafe {
            ok(sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, bytes, gpu.stream), "cuMemcpyDtoDAsync")?;
            ok(sys::cuStreamSynchronize(gpu.stream), "cuStreamSynchronize")?;
        }
        let m = started.elapsed().as_secs_f64();
        if i >= 2 {
            kernel.push(bytes as f64 / k / 1e9);
            memcpy.push(bytes as f64 / m / 1e9);
        }
    }
    Ok((median(kernel), median(memcpy)))
}

/// Microseconds from launching an empty kernel to its completion seen by the host: the floor of a call.
pub fn empty_launch_us(gpu: &Arc<Gpu>, iters: u32) -> Result<f64, String> {
    gpu.bind()?;
    let mut times = Vec::with_capacity(iters as usize);
    for i in 0..iters + 10 {
        let started = Instant::now();
        launch_and_wait(gpu, gpu.kernels.empty, 1, &mut [])?;
        if i >= 10 {
            times.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(times))
}

#[cfg(test)]
mod tests {
    use super::*;
    use collc_kernels::cuda::{DEFAULT_ARCH, ENTRIES};

    /// What CI checks without a GPU: NVRTC compiles every kernel for sm_90 through the runtime's own path.
    #[test]
    fn nvrtc_compiles_every_kernel_for_sm_90() {
        let (major, _) = collc_kernels::cuda::nvrtc_version().expect("NVRTC loads (installed by .ci/run)");
        assert!(major >= 12, "NVRTC {major}");
        let ptx = kernels_ptx(DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
        assert!(ptx.contains(".target sm_90"), "{}", &ptx[..ptx.len().min(400)]);
        for entry in ENTRIES {
            assert!(ptx.contains(&format!(".entry {entry}(")), "no entry {entry}");
        }
    }

    /// A struct that drifts from the encoder fails the compile, and the error shows NVRTC's log with the file.
    #[test]
    fn a_layout_that_drifts_from_the_encoder_fails_with_the_nvrtc_log() {
        let mut defines = encode::layout_defines();
        for (name, value) in &mut defines {
            if name == "COLLC_PLAN_BYTES" {
                *value = (value.parse::<usize>().expect("a number") + 8).to_string();
            }
        }
        let Err(error) = collc_kernels::cuda::compile(&defines, DEFAULT_ARCH) else {
            panic!("the static_assert fires")
        };
        assert!(error.contains("PlanDesc differs from encode.rs") && error.contains("interpret.cu"), "{error}");
    }

    /// ptxas (CUDA's assembler, installed by .ci/run) turns the PTX into sm_90 code: every entry assembles, the
    /// hot kernels spill nothing, and the interpreter fits its 512 threads in one SM's registers.
    #[test]
    fn ptxas_assembles_every_kernel_without_spills() {
        let ptx = kernels_ptx(DEFAULT_ARCH).unwrap_or_else(|e| panic!("{e}"));
        let path = std::env::temp_dir().join(format!("collc-kernels-{}.ptx", std::process::id()));
        std::fs::write(&path, ptx).expect("a temporary file");
        let out = std::process::Command::new("ptxas")
            .args(["-arch=sm_90", "-v", "-o", "/dev/null"])
            .arg(&path)
            .output()
            .expect("ptxas on PATH (.ci/run installs CUDA 13.0's from PyPI: `pip install nvidia-cuda-nvcc`)");
        let _ = std::fs::remove_file(&path);
        let log = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{log}");
        for entry in ENTRIES {
            let at = log.find(&format!("entry function '{entry}'")).unwrap_or_else(|| panic!("{entry}: {log}"));
            let report: String = log[at..].lines().skip(1).take(3).collect::<Vec<_>>().join(" ");
            if ["collc_interpret", "collc_copy", "collc_reduce"].contains(&entry) {
                assert!(
                    report.contains("0 bytes spill stores") && report.contains("0 bytes spill loads"),
                    "{entry}: {report}"
                );
            }
            if entry == "collc_interpret" {
                let registers: u32 = report
                    .split("Used ")
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("{report}"));
                assert!(registers * THREADS <= 65536, "{registers} registers x {THREADS} threads: {report}");
            }
        }
    }

    /// Without a driver (CI has none) every way in fails with the same clear message, never a panic.
    #[test]
    fn without_a_driver_the_transport_says_so() {
        if sys_has_driver() {
            return assert!(driver().is_ok());
        }
        let error = driver().err().expect("no driver here");
        assert!(error.starts_with("no CUDA driver found"), "{error}");
        assert!(CudaFabric::new(2, None).err().is_some_and(|e| e.starts_with("no CUDA driver found")));
    }

    fn sys_has_driver() -> bool {
        // SAFETY: only tries to open the library.
        unsafe { sys::is_culib_present() }
    }
}
