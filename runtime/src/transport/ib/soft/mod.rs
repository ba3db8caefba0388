//! The software verbs library the ib transport's tests run on (`objects.h`: what it is made of; `progress.cpp`: the
//! wire; `verbs.cpp`: the verbs): `build_soft_verbs` compiles them, as one unit, with the host's C++ compiler against the ibverbs crate's rdma-core headers into `libibverbs.so.1`, with rdma-core's
//! symbol versions, so a process started with its directory first on `LD_LIBRARY_PATH` runs collc's verbs code on
//! it unchanged.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The library's parts, in the order they are compiled.
const PARTS: [(&str, &str); 3] = [
    ("objects.h", include_str!("objects.h")),
    ("progress.cpp", include_str!("progress.cpp")),
    ("verbs.cpp", include_str!("verbs.cpp")),
];

/// The symbol versions of rdma-core's `libibverbs.map.in` for the verbs `verbs.cpp` defines.
const VERSIONS: &str = "IBVERBS_1.0 { local: *; };
IBVERBS_1.1 {
  global:
    ibv_get_device_list; ibv_free_device_list; ibv_get_device_name; ibv_get_device_guid; ibv_open_device;
    ibv_close_device; ibv_query_device; ibv_query_port; ibv_query_gid; ibv_query_pkey; ibv_alloc_pd;
    ibv_dealloc_pd; ibv_reg_mr; ibv_dereg_mr; ibv_create_cq; ibv_destroy_cq; ibv_create_qp; ibv_query_qp;
    ibv_modify_qp; ibv_destroy_qp; ibv_wc_status_str;
} IBVERBS_1.0;
IBVERBS_1.8 { global: ibv_reg_mr_iova2; } IBVERBS_1.1;
IBVERBS_1.9 { global: ibv_get_device_index; } IBVERBS_1.8;
IBVERBS_1.11 { global: _ibv_query_gid_ex; _ibv_query_gid_table; } IBVERBS_1.9;
IBVERBS_1.12 { global: ibv_reg_dmabuf_mr; } IBVERBS_1.11;
";

/// Builds `libibverbs.so.1` (and `libibverbs.so`) into `dir`.
pub fn build_soft_verbs(dir: &Path) -> Result<(), String> {
    let rdma_core = rdma_core()?;
    let include = dir.join("include");
    let headers = include.join("infiniband");
    std::fs::create_dir_all(&headers).map_err(|e| format!("cannot create {}: {e}", headers.display()))?;
    for (name, from) in [
        ("verbs.h", "libibverbs/verbs.h"),
        ("verbs_api.h", "libibverbs/verbs_api.h"),
        ("ib_user_ioctl_verbs.h", "kernel-headers/rdma/ib_user_ioctl_verbs.h"),
    ] {
        let link = headers.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(rdma_core.join(from), &link)
            .map_err(|e| format!("cannot link {}: {e}", link.display()))?;
    }
    let cpp = dir.join("soft_verbs.cpp");
    let text: String = PARTS
        .iter()
        .map(|(name, part)| format!("#line 1 \"runtime/src/transport/ib/soft/{name}\"\n{part}\n"))
        .collect();
    std::fs::write(&cpp, text).map_err(|e| format!("cannot write {}: {e}", cpp.display()))?;
    let map = dir.join("libibverbs.map");
    std::fs::write(&map, VERSIONS).map_err(|e| format!("cannot write {}: {e}", map.display()))?;
    let output = dir.join("libibverbs.so.1");
    let compiler = std::env::var_os("CXX").map(PathBuf::from).unwrap_or_else(|| "c++".into());
    let result = Command::new(&compiler)
        .current_dir(dir)
        .args(["-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-Wall", "-Wno-missing-field-initializers"])
        .arg(format!("-I{}", include.display()))
        .arg(format!("-I{}", rdma_core.join("kernel-headers").display()))
        .arg(format!("-Wl,--version-script={}", map.display()))
        .args(["-Wl,-soname,libibverbs.so.1", "-o"])
        .arg(&output)
        .arg(&cpp)
        .output()
        .map_err(|e| {
            format!("cannot run the C++ compiler `{}` ({e}): the software verbs library needs one", compiler.display())
        })?;
    if !result.status.success() {
        return Err(format!(
            "`{}` could not compile the software verbs library:\n{}",
            compiler.display(),
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    let link = dir.join("libibverbs.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libibverbs.so.1", &link).map_err(|e| format!("cannot link {}: {e}", link.display()))
}

/// The ibverbs crate's vendored rdma-core (its headers), from the include path its build announces.
fn rdma_core() -> Result<PathBuf, String> {
    let include = PathBuf::from(env!("COLLC_IBVERBS_INCLUDE"));
    // `.../vendor/rdma-core/build/include`: the headers themselves are in the source tree.
    let root = include.parent().and_then(Path::parent).map(Path::to_path_buf);
    root.filter(|root| root.join("libibverbs/verbs.h").is_file()).ok_or_else(|| {
        format!("rdma-core's headers are not where the ibverbs crate said ({}): rebuild it", include.display())
    })
}
