//! The ib transport (InfiniBand and RoCE verbs; issue 33), being built: `hca.rs` chooses the devices and ports
//! (`COLLC_IB_HCA`), and `soft/` is the software verbs library its tests run on where no RDMA device is. The backend
//! joins `backends()` once its data path runs (RC queue pairs driven by the network proxy).

pub mod hca;
#[cfg(feature = "ib")]
pub mod soft;
