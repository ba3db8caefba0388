//! The verbs the ib transport uses, on the ibverbs crate's bindings (rdma-core's libibverbs): a device opened on the
//! port `COLLC_IB_HCA` chooses (its GID by `COLLC_IB_GID_INDEX` or NCCL's rule), RC queue pairs and their RDMA
//! writes, registered memory. `carrier.rs` moves the links' messages with them.

use super::hca::{self, HcaPattern, Port};
use crate::transport::net::frame;
use ibverbs_sys as ffi;
use std::sync::Arc;

/// Receives each queue pair keeps posted (writes with immediate consume one each).
const RECVS: u32 = 512;
/// Work requests a queue pair's send queue holds.
const SENDS: u32 = 2048;
/// Bytes a write carries inline (in the request, not read from registered memory): a frame header, a small body.
pub(super) const INLINE: usize = frame::HEADER;

/// An opened device: its context, protection domain and completion queue (every queue pair's), and the port.
pub(crate) struct Device {
    pub(super) ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
    pub(super) cq: *mut ffi::ibv_cq,
    pub port: Port,
    pub gid: [u8; 16],
    pub lid: u16,
    pub ethernet: bool,
    /// The GID this rank's queue pairs send from (RoCE).
    pub gid_index: i32,
    mtu: u32,
}

// SAFETY: verbs objects may be used from any thread (libibverbs is thread-safe); the pointers live until drop.
unsafe impl Send for Device {}
unsafe impl Sync for Device {}

/// Where the ib transport looks: `COLLC_IB_HCA`, `COLLC_IB_GID_INDEX` (`None`: on RoCE the first RoCE v2 GID that
/// is an IPv4 address, NCCL's default; else index 0).
pub(crate) struct Choice {
    pub hca: Option<HcaPattern>,
    pub gid_index: Option<i32>,
}

impl Choice {
    pub fn from_env() -> Result<Choice, String> {
        let hca = match std::env::var("COLLC_IB_HCA") {
            Ok(text) => Some(text.parse::<HcaPattern>().map_err(|e| format!("COLLC_IB_HCA: {e}"))?),
            Err(_) => None,
        };
        let gid_index = match std::env::var("COLLC_IB_GID_INDEX") {
            Ok(text) => text
                .trim()
                .parse::<i32>()
                .ok()
                .filter(|&i| i >= 0)
                .map(Some)
                .ok_or(format!("COLLC_IB_GID_INDEX=`{text}` is not a GID table index (0, 1, 3, ...)"))?,
            Err(_) => None,
        };
        Ok(Choice { hca, gid_index })
    }
}

impl Device {
    /// The first active port `choice` admits, opened.
    pub fn open(choice: &Choice) -> Result<Device, String> {
        let mut n = 0;
        // SAFETY: the list is freed below, after its devices are opened or passed over.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        if list.is_null() {
            let e = std::io::Error::last_os_error();
            return Err(format!(
                "no RDMA device was found: ibv_get_device_list failed ({e}): libibverbs lists the InfiniBand and \
                 RoCE devices the kernel's uverbs driver has (/sys/class/infiniband), and there are none (or no \
                 driver for them){}; --transport tcp runs without one",
                choice.hca.as_ref().map_or(String::new(), |_| ", whatever COLLC_IB_HCA says".into())
            ));
        }
        let result = Device::open_from(list, n.max(0) as usize, choice);
        // SAFETY: the list ibv_get_device_list returned; opened contexts outlive it.
        unsafe { ffi::ibv_free_device_list(list) };
        result
    }

    fn open_from(list: *mut *mut ffi::ibv_device, n: usize, choice: &Choice) -> Result<Device, String> {
        if n == 0 {
            return Err(
                "no RDMA device was found: ibv_get_device_list lists none (the InfiniBand and RoCE devices of \
                 /sys/class/infiniband); --transport tcp runs without one"
                    .into(),
            );
        }
        let mut ports = Vec::new();
        let mut contexts = Vec::new();
        for i in 0..n {
            // SAFETY: `i` < n entries of the list.
            let device = unsafe { *list.add(i) };
            // SAFETY: a device of the list; its name is a C string.
            let name = unsafe { std::ffi::CStr::from_ptr(ffi::ibv_get_device_name(device)) }.to_string_lossy();
            // SAFETY: as above.
            let ctx = unsafe { ffi::ibv_open_device(device) };
            if ctx.is_null() {
                continue;
            }
            let mut attr = ffi::ibv_device_attr::default();
            // SAFETY: an open context and an out-struct.
            if unsafe { ffi::ibv_query_device(ctx, &mut attr) } == 0 {
                for port in 1..=attr.phys_port_cnt {
                    if port_attr(ctx, port).is_some_and(|p| p.state == ffi::ibv_port_state::IBV_PORT_ACTIVE) {
                        ports.push(Port { device: name.to_string(), port });
                    }
                }
            }
            contexts.push((name.to_string(), ctx));
        }
        let chosen = hca::select(choice.hca.as_ref(), &ports).map_err(|e| format!("no RDMA port to use: {e}"));
        let mut found = None;
        for (name, ctx) in contexts {
            match &chosen {
                Ok(chosen) if found.is_none() && chosen[0].device == name => found = Some((ctx, chosen[0].clone())),
                // SAFETY: an opened context not taken.
                _ => unsafe {
                    ffi::ibv_close_device(ctx);
                },
            }
        }
        let (ctx, port) = found.ok_or_else(|| chosen.err().unwrap_or_default())?;
        Device::set_up(ctx, port, choice.gid_index)
    }

    fn set_up(ctx: *mut ffi::ibv_context, port: Port, gid_index: Option<i32>) -> Result<Device, String> {
        let fail = |what: &str| {
            let e = std::io::Error::last_os_error();
            // SAFETY: the context opened above, closed once on this path.
            unsafe { ffi::ibv_close_device(ctx) };
            format!("{port}: {what} failed ({e})")
        };
        let attr = port_attr(ctx, port.port).ok_or_else(|| fail("ibv_query_port"))?;
        let ethernet = attr.link_layer == ffi::IBV_LINK_LAYER_ETHERNET as u8;
        let gid_index = gid_index.unwrap_or_else(|| match ethernet {
            true => roce_v2_ipv4(ctx, port.port, attr.gid_tbl_len).unwrap_or(0),
            false => 0,
        });
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: an open context and an out-union.
        let rc = unsafe { ffi::ibv_query_gid(ctx, port.port, gid_index, &mut gid) };
        if rc != 0 {
            // An errno (or -1 with errno set, as rdma-core returns).
            let e = if rc > 0 { std::io::Error::from_raw_os_error(rc) } else { std::io::Error::last_os_error() };
            // SAFETY: the context opened above, closed once on this path.
            unsafe { ffi::ibv_close_device(ctx) };
            return Err(format!("{port}: ibv_query_gid of index {gid_index} (COLLC_IB_GID_INDEX) failed ({e})"));
        }
        // SAFETY: as above.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(fail("ibv_alloc_pd"));
        }
        // SAFETY: as above; no completion channel.
        let cq = unsafe { ffi::ibv_create_cq(ctx, 4096, std::ptr::null_mut(), std::ptr::null_mut(), 0) };
        if cq.is_null() {
            return Err(fail("ibv_create_cq"));
        }
        Ok(Device {
            ctx,
            pd,
            cq,
            // SAFETY: the union's raw bytes.
            gid: unsafe { gid.raw },
            lid: attr.lid,
            ethernet,
            gid_index,
            mtu: attr.active_mtu,
            port,
        })
    }

    /// Registers `len` bytes at `addr` for local use and, with `remote`, for the peers' RDMA writes.
    pub fn register(self: &Arc<Device>, addr: *mut u8, len: usize, remote: bool) -> Result<Mr, String> {
        let mut access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if remote {
            access |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        // SAFETY: the caller keeps the memory alive and in place as long as the region (it owns both).
        let mr = unsafe { ffi::ibv_reg_mr(self.pd, addr.cast(), len.max(1), access.0 as i32) };
        if mr.is_null() {
            return Err(format!("ibv_reg_mr of {len} bytes failed ({})", std::io::Error::last_os_error()));
        }
        Ok(Mr { mr, _device: self.clone() })
    }

    /// Registers `len` bytes of device memory at device address `iova`, `offset` bytes into the dma-buf `fd`
    /// (GPUDirect RDMA: the NIC reads and writes the GPU's memory), for local use and, with `remote`, for the peers'
    /// RDMA writes.
    pub fn register_dma_buf(
        self: &Arc<Device>,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        iova: u64,
        len: usize,
        remote: bool,
    ) -> Result<Mr, String> {
        use std::os::fd::AsRawFd;
        let mut access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if remote {
            access |= ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        // SAFETY: the caller keeps the memory (and its dma-buf) alive as long as the region.
        let mr = unsafe { ffi::ibv_reg_dmabuf_mr(self.pd, offset, len.max(1), iova, fd.as_raw_fd(), access.0 as i32) };
        if mr.is_null() {
            return Err(format!(
                "ibv_reg_dmabuf_mr of {len} bytes of device memory failed ({})",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Mr { mr, _device: self.clone() })
    }

    /// A new RC queue pair in INIT, its receives posted.
    pub fn queue_pair(self: &Arc<Device>) -> Result<Qp, String> {
        let mut init = ffi::ibv_qp_init_attr {
            send_cq: self.cq,
            recv_cq: self.cq,
            cap: ffi::ibv_qp_cap {
                max_send_wr: SENDS,
                max_recv_wr: RECVS,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: INLINE as u32,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            ..Default::default()
        };
        // SAFETY: the device's protection domain and completion queue.
        let qp = unsafe { ffi::ibv_create_qp(self.pd, &mut init) };
        if qp.is_null() {
            return Err(format!("ibv_create_qp failed ({})", std::io::Error::last_os_error()));
        }
        let qp = Qp { qp, device: self.clone() };
        use ffi::ibv_qp_attr_mask as m;
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        let mut attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            port_num: self.port.port,
            qp_access_flags: access.0,
            ..Default::default()
        };
        qp.modify(&mut attr, m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS, "INIT")?;
        for _ in 0..RECVS {
            qp.post_recv()?;
        }
        Ok(qp)
    }
}

/// The first GID of the port's table that is RoCE v2 and an IPv4 address (`::ffff:a.b.c.d`), as NCCL picks one.
fn roce_v2_ipv4(ctx: *mut ffi::ibv_context, port: u8, table: i32) -> Option<i32> {
    (0..table.max(0)).find(|&index| {
        let mut entry = ffi::ibv_gid_entry::default();
        let size = std::mem::size_of::<ffi::ibv_gid_entry>();
        // SAFETY: an open context and an out-struct of `size` bytes.
        let found = unsafe { ffi::_ibv_query_gid_ex(ctx, port as u32, index as u32, &mut entry, 0, size) } == 0;
        // SAFETY: the union's raw bytes.
        let raw = unsafe { entry.gid.raw };
        found && entry.gid_type == ffi::IBV_GID_TYPE_ROCE_V2 && raw[..10] == [0; 10] && raw[10..12] == [0xff, 0xff]
    })
}

fn port_attr(ctx: *mut ffi::ibv_context, port: u8) -> Option<ffi::ibv_port_attr> {
    let mut attr = ffi::ibv_port_attr::default();
    // SAFETY: an open context; the exported ibv_query_port fills the compatible prefix of the struct.
    (unsafe { ffi::ibv_query_port(ctx, port, (&mut attr as *mut ffi::ibv_port_attr).cast()) } == 0).then_some(attr)
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: made in `set_up`, destroyed once, after every queue pair and region (they hold the device).
        unsafe {
            ffi::ibv_destroy_cq(self.cq);
            ffi::ibv_dealloc_pd(self.pd);
            ffi::ibv_close_device(self.ctx);
        }
    }
}

/// A registered memory region, deregistered on drop.
pub(crate) struct Mr {
    mr: *mut ffi::ibv_mr,
    _device: Arc<Device>,
}

// SAFETY: as `Device`.
unsafe impl Send for Mr {}
unsafe impl Sync for Mr {}

impl Mr {
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live region.
        unsafe { (*self.mr).lkey }
    }
    pub fn rkey(&self) -> u32 {
        // SAFETY: a live region.
        unsafe { (*self.mr).rkey }
    }
    pub fn addr(&self) -> u64 {
        // SAFETY: a live region.
        unsafe { (*self.mr).addr as u64 }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered once, deregistered once.
        unsafe { ffi::ibv_dereg_mr(self.mr) };
    }
}

/// An RC queue pair, destroyed on drop.
pub(crate) struct Qp {
    qp: *mut ffi::ibv_qp,
    device: Arc<Device>,
}

// SAFETY: as `Device`.
unsafe impl Send for Qp {}
unsafe impl Sync for Qp {}

/// What a peer's queue pair needs of this one: its number and where it is (GID, or LID on InfiniBand).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    pub qpn: u32,
    pub gid: [u8; 16],
    pub lid: u16,
}

impl Qp {
    pub fn number(&self) -> u32 {
        // SAFETY: a live queue pair.
        unsafe { (*self.qp).qp_num }
    }

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask, to: &str) -> Result<(), String> {
        // SAFETY: a live queue pair and attributes.
        let e = unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        match e {
            0 => Ok(()),
            e => Err(format!("moving a queue pair to {to} failed ({})", std::io::Error::from_raw_os_error(e))),
        }
    }

    /// RTR then RTS towards `peer`: `COLLC_IB_TIMEOUT` (4.096 us x 2^t, default 20) and `COLLC_IB_RETRY_CNT`
    /// (default 7), receivers never short (every write finds a posted receive, so RNR retries for ever).
    pub fn connect(&self, peer: &Endpoint, timeout: u8, retry_cnt: u8) -> Result<(), String> {
        use ffi::ibv_qp_attr_mask as m;
        let device = &self.device;
        let mut rtr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: device.mtu,
            dest_qp_num: peer.qpn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ..Default::default()
        };
        rtr.ah_attr.port_num = device.port.port;
        if device.ethernet {
            rtr.ah_attr.is_global = 1;
            rtr.ah_attr.grh.dgid = ffi::ibv_gid { raw: peer.gid };
            rtr.ah_attr.grh.hop_limit = 255;
            rtr.ah_attr.grh.sgid_index = device.gid_index as u8;
        } else {
            rtr.ah_attr.dlid = peer.lid;
        }
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut rtr, mask, "RTR").map_err(|e| match device.ethernet {
            true => format!(
                "{e}: its source GID is index {} of {} (COLLC_IB_GID_INDEX; unset, the first RoCE v2 GID with an \
                 IPv4 address, as NCCL picks)",
                device.gid_index, device.port
            ),
            false => e,
        })?;
        let mut rts = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            timeout,
            retry_cnt,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut rts, mask, "RTS")
    }

    pub(super) fn post_recv(&self) -> Result<(), String> {
        let mut wr = ffi::ibv_recv_wr::default();
        let mut bad = std::ptr::null_mut();
        // SAFETY: the context's ops (ibv_post_recv is inline in verbs.h); the request lives for the call.
        let e = unsafe { (*(*self.qp).context).ops.post_recv.expect("post_recv")(self.qp, &mut wr, &mut bad) };
        match e {
            0 => Ok(()),
            e => Err(format!("posting a receive failed ({})", std::io::Error::from_raw_os_error(e))),
        }
    }

    /// An RDMA write of `len` bytes at `local` (`lkey`; inline when `lkey` is `None`) to `remote` (`rkey`), with
    /// immediate `imm` if given; signaled with `wr_id` when `signaled`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write(
        &self,
        local: *const u8,
        len: usize,
        lkey: Option<u32>,
        remote: u64,
        rkey: u32,
        imm: Option<u32>,
        wr_id: u64,
        signaled: bool,
    ) -> Result<(), i32> {
        let mut sge = ffi::ibv_sge { addr: local as u64, length: len as u32, lkey: lkey.unwrap_or(0) };
        let mut flags = 0;
        if signaled {
            flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if lkey.is_none() {
            flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: if len == 0 { 0 } else { 1 },
            opcode: if imm.is_some() {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE
            },
            send_flags: flags,
            ..Default::default()
        };
        wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
        wr.wr.rdma.remote_addr = remote;
        wr.wr.rdma.rkey = rkey;
        let mut bad = std::ptr::null_mut();
        // SAFETY: as `post_recv`; the gather list is read at the post (inline) or before the completion (the
        // caller keeps it).
        match unsafe { (*(*self.qp).context).ops.post_send.expect("post_send")(self.qp, &mut wr, &mut bad) } {
            0 => Ok(()),
            e => Err(e),
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once.
        unsafe { ffi::ibv_destroy_qp(self.qp) };
    }
}
