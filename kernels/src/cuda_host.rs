//! The CUDA kernels built for the CPU: the program NVRTC compiles ([`crate::cuda::program`]), behind a prelude of
//! the CUDA built-ins it uses (`kernels/cuda/host.h`: blocks as OS threads, a block's threads as coroutines) and
//! followed by host launchers (`kernels/cuda/host_launch.cpp`), compiled by the host's C++ compiler into a shared
//! library. Tests run it where no GPU is, so the device interpreter's own source, not only its Rust twin, is checked
//! against the reference; feature `cuda-host`, for tests.

use libloading::Library;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

const PRELUDE: &str = include_str!("../cuda/host.h");
const LAUNCHERS: &str = include_str!("../cuda/host_launch.cpp");
const DRIVER: &str = include_str!("../cuda/host_driver.cpp");

type Interpret = unsafe extern "C" fn(u32, u32, *const u64, *mut u64, *mut u64, u64, u64, u32);
type Copy = unsafe extern "C" fn(u32, u32, *mut u8, *const u8, u64);
type Reduce = unsafe extern "C" fn(u32, u32, u32, u32, *mut u8, *const u8, *const u8, u64);
type Divide = unsafe extern "C" fn(u32, u32, u32, *mut u8, u64, u32);

/// The kernels as a loaded library; each launcher takes the grid (blocks) and the block (threads), then the
/// kernel's parameters, and returns when every block has.
pub struct HostKernels {
    interpret: Interpret,
    copy: Copy,
    reduce: Reduce,
    divide: Divide,
    _library: Library,
}

/// Builds a CUDA driver for the CPU into `dir` (`libcuda.so` and `libcuda.so.1`): `kernels/cuda/host_driver.cpp`, the
/// entry points of the driver collc calls, over host memory and the kernels built for the CPU. With `dir` first on
/// `LD_LIBRARY_PATH`, a process built with the `cuda` feature runs the cuda transport on it, in-process and across
/// processes (IPC), where no GPU is; it models no GPU's speed.
pub fn build_driver(defines: &[(String, String)], dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let text = source(defines) + &format!("#line 1 \"kernels/cuda/host_driver.cpp\"\n{DRIVER}\n");
    compile(&text, dir, &dir.join("libcuda.so"))?;
    let link = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libcuda.so", &link).map_err(|e| format!("cannot link {}: {e}", link.display()))
}

/// Compiles `text` into the shared library `output` with `$CXX` (else `c++`), by way of a source file in `dir`.
fn compile(text: &str, dir: &Path, output: &Path) -> Result<(), String> {
    let cpp = output.with_extension("cpp");
    std::fs::write(&cpp, text).map_err(|e| format!("cannot write {}: {e}", cpp.display()))?;
    let compiler = std::env::var_os("CXX").map(PathBuf::from).unwrap_or_else(|| "c++".into());
    // The device's arithmetic: no contraction of a*b+c (NVRTC's fmad=false); lenient aliasing (vectors are read as
    // their elements, as CUDA allows).
    let result = Command::new(&compiler)
        .current_dir(dir)
        .args(["-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing"])
        .args(["-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function", "-o"])
        .arg(output)
        .arg(&cpp)
        .output()
        .map_err(|e| {
            format!(
                "cannot run the C++ compiler `{}` ({e}): building the CUDA kernels for the CPU needs one (apt install \
                 g++, or set CXX)",
                compiler.display()
            )
        })?;
    if !result.status.success() {
        return Err(format!(
            "`{}` could not compile the CUDA kernels for the CPU:\n{}",
            compiler.display(),
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    Ok(())
}

/// The text the host compiler builds: the prelude, the program, the launchers.
pub fn source(defines: &[(String, String)]) -> String {
    source_with(defines, &crate::operator::cuda_source(&[]))
}

/// `source` with a user's operator in the program.
pub fn source_with(defines: &[(String, String)], user: &str) -> String {
    let mut text = format!("#line 1 \"kernels/cuda/host.h\"\n{PRELUDE}\n");
    text.push_str(&crate::cuda::program_with(defines, user));
    text.push_str(&format!("#line 1 \"kernels/cuda/host_launch.cpp\"\n{LAUNCHERS}\n"));
    text
}

impl HostKernels {
    /// Compiles the kernels with `$CXX` (else `c++`) and loads them; an error carries the compiler's output.
    pub fn build(defines: &[(String, String)]) -> Result<HostKernels, String> {
        Self::build_with(defines, &crate::operator::cuda_source(&[]))
    }

    /// `build` with a user's operator (`operator::cuda_source`), which `OP_USER` runs.
    pub fn build_with(defines: &[(String, String)], user: &str) -> Result<HostKernels, String> {
        static BUILDS: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "collc-host-kernels-{}-{}",
            std::process::id(),
            BUILDS.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let built = Self::build_in(&dir, defines, user);
        // The library stays mapped once loaded: the files can go.
        let _ = std::fs::remove_dir_all(&dir);
        built
    }

    fn build_in(dir: &Path, defines: &[(String, String)], user: &str) -> Result<HostKernels, String> {
        let library = dir.join("libcollc_host.so");
        compile(&source_with(defines, user), dir, &library)?;
        // SAFETY: the library is the one just built; its initialisers only set up thread-local storage.
        let loaded =
            unsafe { Library::new(&library) }.map_err(|e| format!("cannot load {}: {e}", library.display()))?;
        // SAFETY: each symbol is the launcher of that name in host_launch.cpp, of the type given here.
        unsafe {
            let interpret = *loaded.get::<Interpret>(b"collc_host_interpret\0").map_err(|e| e.to_string())?;
            let copy = *loaded.get::<Copy>(b"collc_host_copy\0").map_err(|e| e.to_string())?;
            let reduce = *loaded.get::<Reduce>(b"collc_host_reduce\0").map_err(|e| e.to_string())?;
            let divide = *loaded.get::<Divide>(b"collc_host_divide\0").map_err(|e| e.to_string())?;
            Ok(HostKernels { interpret, copy, reduce, divide, _library: loaded })
        }
    }

    /// `collc_interpret` over `grid` blocks of `threads` threads.
    ///
    /// # Safety
    /// `table` holds four words per block, pointing at live images, state and bases as the interpreter reads them;
    /// `control` has `1 + CONTROL_WORDS * grid` words and `stop` one, all live until this returns.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn interpret(
        &self,
        grid: u32,
        threads: u32,
        table: &[u64],
        control: &[AtomicU64],
        stop: &AtomicU64,
        seq: u64,
        timeout_ns: u64,
        system_scope: bool,
    ) {
        let (control, stop) = (control.as_ptr() as *mut u64, stop.as_ptr());
        // SAFETY: forwarded from the caller; the words are atomics, which the kernel reads and writes as volatile.
        unsafe { (self.interpret)(grid, threads, table.as_ptr(), control, stop, seq, timeout_ns, system_scope as u32) }
    }

    /// `collc_copy`: `dst[..bytes] = src[..bytes]`.
    pub fn copy(&self, grid: u32, threads: u32, dst: &mut [u8], src: &[u8]) {
        let bytes = dst.len().min(src.len()) as u64;
        // SAFETY: both slices hold `bytes` bytes.
        unsafe { (self.copy)(grid, threads, dst.as_mut_ptr(), src.as_ptr(), bytes) }
    }

    /// `collc_reduce`: `dst[i] = a[i] (op) b[i]` over the elements of `dtype` (NCCL's codes, `elem` bytes each) the
    /// shortest of the three holds.
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &self,
        grid: u32,
        threads: u32,
        dtype: u32,
        op: u32,
        elem: usize,
        dst: &mut [u8],
        a: &[u8],
        b: &[u8],
    ) {
        let n = (dst.len().min(a.len()).min(b.len()) / elem) as u64;
        // SAFETY: each slice holds `n` elements.
        unsafe { (self.reduce)(grid, threads, dtype, op, dst.as_mut_ptr(), a.as_ptr(), b.as_ptr(), n) }
    }

    /// `collc_divide`: every element of `buf` (whole elements of `dtype`, `elem` bytes each) divided by `ranks`.
    pub fn divide(&self, grid: u32, threads: u32, dtype: u32, elem: usize, buf: &mut [u8], ranks: u32) {
        let n = (buf.len() / elem) as u64;
        // SAFETY: `buf` holds `n` elements.
        unsafe { (self.divide)(grid, threads, dtype, buf.as_mut_ptr(), n, ranks) }
    }
}
