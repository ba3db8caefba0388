//! The device executor on GPUs (feature `cuda`): the kernels compiled by NVRTC with the encoder's layout, loaded
//! through the driver (both found at run time); each rank's image, state and scratch in device memory; connection
//! records in the receiver's device memory; and a `Launcher` per GPU and call shape, so the ranks that share a GPU
//! run one cooperative launch per call (their blocks wait on each other, so they must be resident together).
//!
//! Ranks on different GPUs of one process reach each other's records through peer access (`cuCtxEnablePeerAccess`,
//! checked with `cuDeviceCanAccessPeer`; a pair without it is an error), with system-scope fences.
//!
//! By concern: the driver, the GPUs and the kernels' PTX here; device and host-mapped memory (`memory.rs`); a GPU as
//! the launch target and the executor of one rank's plan on it (`target.rs`); `collc gpu bench`'s timings
//! (`bench.rs`). The fabrics that place connection records and map them between processes are the `cuda`
//! transport's (`transport/cuda/`).

mod bench;
mod memory;
mod target;

pub use bench::{copy_rates, empty_launch_us};
pub(crate) use memory::Pinned;
pub use memory::{is_device_memory, DeviceAlloc};
pub(crate) use target::{CudaExec, CudaTarget};

use super::encode::{self, THREADS};
use collc_kernels::operator::UserOp;
use collc_kernels::{DataType, ReduceOp};
use cudarc::driver::sys::{self, CUresult};
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The PTX of every kernel for `arch`, compiled with the layout constants of `encode.rs`, as the executor loads it.
pub fn kernels_ptx(arch: &'static str) -> Result<String, String> {
    collc_kernels::cuda::compile(&encode::layout_defines(), arch)
}

/// The text of a user's operator for the device (`operator::cuda_source`): the operator on every data type it types
/// on; with none, the stub `OP_USER` traps in.
fn user_source(user: Option<UserOp>) -> String {
    let typed: Vec<_> = match user {
        Some(op) => DataType::ALL.iter().filter_map(|&d| op.prepare(d).ok()).map(|p| &p.typed).collect(),
        None => Vec::new(),
    };
    collc_kernels::operator::cuda_source(&typed)
}

/// `kernels_ptx`, kept in `$XDG_CACHE_HOME/collc` (or `~/.cache/collc`) under a hash of the program, NVRTC's version
/// and `arch`, so a process does not pay NVRTC's seconds again for kernels it compiled before.
/// `COLLC_CUDA_PTX` names a PTX file to load instead (made by `collc gpu ptx` of the same build, for a machine
/// without NVRTC).
/// With a user's operator, the kernels are compiled with it (always by NVRTC: `COLLC_CUDA_PTX` holds the built-in
/// operators only).
fn cached_ptx(arch: &'static str, user: Option<UserOp>) -> Result<String, String> {
    if let Some(path) = std::env::var_os("COLLC_CUDA_PTX") {
        if let Some(op) = user {
            return Err(format!(
                "the operator `{}` is compiled into the kernels by NVRTC, and COLLC_CUDA_PTX names prebuilt kernels: \
                 unset it where NVRTC is installed",
                op.name()
            ));
        }
        return std::fs::read_to_string(&path)
            .map_err(|e| format!("COLLC_CUDA_PTX={}: {e}", std::path::Path::new(&path).display()));
    }
    let defines = encode::layout_defines();
    let version = collc_kernels::cuda::nvrtc_version()?;
    let user = user_source(user);
    let key = format!("{}|{version:?}|{arch}", collc_kernels::cuda::program_with(&defines, &user));
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    let dir = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| std::path::PathBuf::from(home).join(".cache")))
        .map(|base| base.join("collc"));
    let path = dir.as_ref().map(|dir| dir.join(format!("kernels-{arch}-{hash:016x}.ptx")));
    if let Some(ptx) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok(ptx);
    }
    let ptx = collc_kernels::cuda::compile_with(&defines, &user, arch)?;
    if let (Some(dir), Some(path)) = (dir, path) {
        // A cache that cannot be written only costs the next process the compile.
        let temporary = path.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::create_dir_all(&dir).is_ok() && std::fs::write(&temporary, &ptx).is_ok() {
            let _ = std::fs::rename(&temporary, &path);
        }
    }
    Ok(ptx)
}

pub(crate) fn ok(result: CUresult, what: &str) -> Result<(), String> {
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
    pub(crate) device: sys::CUdevice,
    pub(crate) ctx: sys::CUcontext,
    /// The virtual architecture its kernels are compiled for.
    arch: &'static str,
    _module: sys::CUmodule,
    pub(crate) interpret: sys::CUfunction,
    /// The interpreter of each user's operator called on this GPU (its module and function), by the operator's digest.
    users: Mutex<HashMap<u64, (sys::CUmodule, sys::CUfunction)>>,
    pub(crate) kernels: Kernels,
    pub(crate) stream: sys::CUstream,
    /// Blocks of the interpreter one SM holds at once.
    pub(crate) per_sm: u32,
    /// An interpreter kernel did not finish: its memory may still be in use, so none is freed, and nothing more
    /// is launched.
    pub(crate) wedged: AtomicBool,
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

    /// Makes the NIC's writes into this GPU's memory so far visible to its kernels (GPUDirect RDMA: a PCIe write
    /// may otherwise still be on its way when the kernel sees the flag posted after it).
    pub fn flush_rdma_writes(&self) -> Result<(), String> {
        self.bind()?;
        use sys::CUflushGPUDirectRDMAWritesScope as Scope;
        use sys::CUflushGPUDirectRDMAWritesTarget as Target;
        // SAFETY: this GPU's context is current.
        let flushed = unsafe {
            sys::cuFlushGPUDirectRDMAWrites(
                Target::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                Scope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
            )
        };
        ok(flushed, "cuFlushGPUDirectRDMAWrites")
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
        let module = load_module(arch, None)?;
        let function = |entry: &str| function_of(module, entry);
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
        let users = Mutex::new(HashMap::new());
        Ok(Gpu {
            ordinal,
            name,
            sms,
            device,
            ctx,
            arch,
            _module: module,
            interpret,
            users,
            kernels,
            stream,
            per_sm,
            wedged,
        })
    }
}

/// The kernels for `arch` (with a user's operator) loaded into the current context.
fn load_module(arch: &'static str, user: Option<UserOp>) -> Result<sys::CUmodule, String> {
    let ptx = CString::new(cached_ptx(arch, user)?).map_err(|_| "PTX with a NUL byte".to_string())?;
    let mut module = std::ptr::null_mut();
    let what = match user {
        Some(op) => format!("cuModuleLoadData (the kernels compiled with the operator `{}`)", op.name()),
        None => "cuModuleLoadData (the kernels' PTX)".to_string(),
    };
    // SAFETY: a valid out-pointer and a NUL-terminated PTX image; the caller made the GPU's context current.
    ok(unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) }, &what)?;
    Ok(module)
}

fn function_of(module: sys::CUmodule, entry: &str) -> Result<sys::CUfunction, String> {
    let mut f = std::ptr::null_mut();
    let entry_c = CString::new(entry).expect("no NUL");
    // SAFETY: a valid out-pointer and a loaded module.
    ok(unsafe { sys::cuModuleGetFunction(&mut f, module, entry_c.as_ptr()) }, entry)?;
    Ok(f)
}

impl Gpu {
    /// The interpreter a call by `op` launches: the one built with the kernels, or for a user's operator the one of
    /// a module compiled with it, on first use, and kept (by the operator's digest) while the process lives.
    pub(crate) fn interpreter_for(&self, op: ReduceOp) -> Result<sys::CUfunction, String> {
        let ReduceOp::User(user) = op else { return Ok(self.interpret) };
        let mut users = self.users.lock().map_err(|_| "a poisoned lock".to_string())?;
        if let Some(&(_, function)) = users.get(&user.digest()) {
            return Ok(function);
        }
        self.bind()?;
        let module = load_module(self.arch, Some(user))?;
        let function = function_of(module, "collc_interpret")?;
        users.insert(user.digest(), (module, function));
        Ok(function)
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

    /// NVRTC compiles the program with a user's operator generated for every data type it types on.
    #[test]
    fn nvrtc_compiles_a_users_operator() {
        use collc_kernels::DataType;
        let source = "op clip(a, b) = if a + b > 100 { 100 } else { elem(f64(a) * 0.5 + f64(b) % 3) }\n";
        let clip = collc_compiler::operator::parse_operators(source, &Default::default()).expect("compiles").remove(0);
        let op = collc_kernels::operator::UserOp::register(clip).expect("room in the registry");
        let typed: Vec<_> = DataType::ALL.iter().filter_map(|&d| op.prepare(d).ok()).map(|p| &p.typed).collect();
        assert_eq!(typed.len(), DataType::ALL.len());
        let user = collc_kernels::operator::cuda_source(&typed);
        let ptx = collc_kernels::cuda::compile_with(&encode::layout_defines(), &user, DEFAULT_ARCH);
        let ptx = ptx.unwrap_or_else(|e| panic!("{e}"));
        assert!(ptx.contains(".entry collc_interpret("), "{}", &ptx[..ptx.len().min(400)]);
        // The operator's text is part of what NVRTC compiles: a broken one fails the compile, at its place.
        let broken = collc_kernels::cuda::compile_with(&encode::layout_defines(), "not C\n", DEFAULT_ARCH);
        assert!(broken.is_err_and(|log| log.contains("user operator")), "a broken operator compiles");
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
}
