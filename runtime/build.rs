//! With the `ib` feature: where the ibverbs crate's rdma-core headers are, for the software verbs library the tests
//! compile (`transport::ib::soft`).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if let Ok(include) = std::env::var("DEP_IBVERBS_INCLUDE") {
        println!("cargo:rustc-env=COLLC_IBVERBS_INCLUDE={include}");
    }
}
