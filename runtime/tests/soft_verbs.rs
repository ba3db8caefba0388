//! The software verbs library (`collc_runtime::build_soft_verbs`) as collc's verbs code will use it, through the
//! ibverbs crate and its `ffi`, in a child process of this test binary that loads it (the loader reads
//! LD_LIBRARY_PATH when a process starts): devices and ports, RC queue pairs through RESET, INIT, RTR and RTS with
//! their attributes checked, RDMA write with immediate into registered memory, receiver-not-ready retries, and a
//! wrong rkey, each with the completion statuses a NIC gives, and a dma-buf registered at an iova that is no address
//! of the process, over the shared-memory pipe of contexts on one host and over TCP; then the faults it injects on
//! request (`COLLC_SOFT_IB_FAULT`), each a child of its own.
#![cfg(feature = "ib")]

use ibverbs_sys as ffi;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The directory holding the library, built once per test process.
fn library_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("soft-verbs");
        collc_runtime::build_soft_verbs(&dir).unwrap_or_else(|e| panic!("{e}"));
        dir
    })
}

/// Runs case `case` in a child that loads the software library, with `fault` injected; what it printed.
fn run_child(test: &str, case: &str, fault: &str, env: &[(&str, &str)]) -> String {
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args([test, "--exact", "--nocapture"])
        .env("LD_LIBRARY_PATH", format!("{}:{path}", library_dir().display()))
        .env("COLLC_SOFT_VERBS_CHILD", case)
        .env("COLLC_SOFT_IB_DEVICES", "soft_ib0,soft_ib1")
        .env("COLLC_SOFT_IB_FAULT", fault)
        .envs(env.iter().copied())
        .output()
        .expect("the test binary runs");
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{case}: {said}");
    said
}

#[test]
fn rc_queue_pairs_write_with_immediate_and_fail_as_a_nic_does() {
    if std::env::var_os("COLLC_SOFT_VERBS_CHILD").is_some() {
        return child();
    }
    // Contexts of one host: through the shared-memory pipe, then TCP only.
    let test = "rc_queue_pairs_write_with_immediate_and_fail_as_a_nic_does";
    let said = run_child(test, "basic", "", &[]);
    assert!(said.contains("soft verbs child: 7 cases checked, over a shared-memory pipe"), "{said}");
    let said = run_child(test, "basic", "", &[("COLLC_SOFT_IB_SHM", "0")]);
    assert!(said.contains("soft verbs child: 7 cases checked, over TCP"), "{said}");
}

/// Injected faults, from the responder's first request on: a silent responder (retries exceeded after the IB
/// timeout), every write refused (a remote access error with a valid rkey), and the responder's queue pair moved
/// to the error state (its receives flushed; the requester times out).
#[test]
fn injected_faults_complete_with_the_statuses_a_nic_gives() {
    if let Ok(case) = std::env::var("COLLC_SOFT_VERBS_CHILD") {
        return fault_child(&case);
    }
    let test = "injected_faults_complete_with_the_statuses_a_nic_gives";
    for (case, fault) in [("silent", "silent@1"), ("access", "access@1"), ("error", "error@1")] {
        let said = run_child(test, case, fault, &[]);
        assert!(said.contains(&format!("fault child {case}: checked")), "{said}");
    }
}

fn fault_child(case: &str) {
    let devices: Vec<*mut ffi::ibv_device> = (0..2)
        .map(|i| {
            let mut n = 0;
            // SAFETY: the list is freed at exit (the test's process).
            unsafe { *ffi::ibv_get_device_list(&mut n).add(i) }
        })
        .collect();
    let (mut a, b) = (End::new(devices[0]), End::new(devices[1]));
    // A short IB timeout: 4.096 us x 2^8 = 1 ms, 2 tries.
    a.connect_with(&b, 7, 8, 1);
    b.connect_with(&a, 7, 8, 1);
    assert_eq!(b.post_recv(90), 0);
    let before = b.buf.clone();
    a.buf[..256].fill(0x5a);
    assert_eq!(a.write(1, 256, b.addr(), b.rkey(), Some(1)), 0);
    let expected = match case {
        "silent" | "error" => ffi::ibv_wc_status::IBV_WC_RETRY_EXC_ERR,
        _ => ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
    };
    assert_eq!(status(&a.completions(1)[0]), expected, "{case}");
    if case == "error" {
        let flushed = b.completions(1);
        assert_eq!((flushed[0].wr_id(), status(&flushed[0])), (90, ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR));
    }
    assert_eq!(b.buf, before, "{case}: nothing written");
    println!("fault child {case}: checked");
}

/// One end: a context's protection domain, completion queue, queue pair and a registered buffer.
struct End {
    ctx: *mut ffi::ibv_context,
    cq: *mut ffi::ibv_cq,
    qp: *mut ffi::ibv_qp,
    mr: *mut ffi::ibv_mr,
    buf: Vec<u8>,
    gid: ffi::ibv_gid,
}

impl End {
    fn new(device: *mut ffi::ibv_device) -> End {
        // SAFETY: a device of the list; each object is made from the one before and checked.
        unsafe {
            let ctx = ffi::ibv_open_device(device);
            assert!(!ctx.is_null(), "ibv_open_device");
            let pd = ffi::ibv_alloc_pd(ctx);
            let cq = ffi::ibv_create_cq(ctx, 64, std::ptr::null_mut(), std::ptr::null_mut(), 0);
            assert!(!pd.is_null() && !cq.is_null());
            let mut init = ffi::ibv_qp_init_attr {
                send_cq: cq,
                recv_cq: cq,
                cap: ffi::ibv_qp_cap {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
                ..Default::default()
            };
            let qp = ffi::ibv_create_qp(pd, &mut init);
            assert!(!qp.is_null(), "ibv_create_qp");
            let mut buf = vec![0u8; 1 << 16];
            let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
            let mr = ffi::ibv_reg_mr(pd, buf.as_mut_ptr().cast(), buf.len(), access.0 as i32);
            assert!(!mr.is_null(), "ibv_reg_mr");
            let mut gid = ffi::ibv_gid::default();
            assert_eq!(ffi::ibv_query_gid(ctx, 1, 0, &mut gid), 0);
            End { ctx, cq, qp, mr, buf, gid }
        }
    }

    fn qpn(&self) -> u32 {
        // SAFETY: a live queue pair.
        unsafe { (*self.qp).qp_num }
    }

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask) -> i32 {
        // SAFETY: a live queue pair and attributes.
        unsafe { ffi::ibv_modify_qp(self.qp, attr, mask.0 as i32) }
    }

    /// RESET -> INIT -> RTR -> RTS towards `peer`, `rnr_retry` times on a receiver not ready.
    fn connect(&self, peer: &End, rnr_retry: u8) {
        self.connect_with(peer, rnr_retry, 14, 7);
    }

    /// As `connect`, with the IB timeout (4.096 us x 2^timeout) and the transport retries.
    fn connect_with(&self, peer: &End, rnr_retry: u8, timeout: u8, retry_cnt: u8) {
        use ffi::ibv_qp_attr_mask as m;
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        let mut init = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            port_num: 1,
            qp_access_flags: access.0,
            ..Default::default()
        };
        assert_eq!(
            self.modify(&mut init, m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS),
            0
        );
        let mut rtr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: ffi::IBV_MTU_4096,
            dest_qp_num: peer.qpn(),
            max_dest_rd_atomic: 1,
            min_rnr_timer: 1,
            ..Default::default()
        };
        rtr.ah_attr.is_global = 1;
        rtr.ah_attr.port_num = 1;
        rtr.ah_attr.grh.dgid = peer.gid;
        rtr.ah_attr.grh.hop_limit = 1;
        let rtr_mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC;
        // An RC queue pair needs every one of them: without the RNR timer it stays in INIT.
        assert_eq!(self.modify(&mut rtr, rtr_mask), libc::EINVAL);
        assert_eq!(self.modify(&mut rtr, rtr_mask | m::IBV_QP_MIN_RNR_TIMER), 0);
        let mut rts = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            timeout,
            retry_cnt,
            rnr_retry,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let rts_mask = m::IBV_QP_STATE
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        assert_eq!(self.modify(&mut rts, rts_mask), 0);
    }

    /// Posts an RDMA write (with immediate `imm` when given) of `len` bytes from offset 0 into `peer`'s buffer at
    /// `at`, with rkey `rkey`.
    fn write(&mut self, wr_id: u64, len: u32, peer_addr: u64, rkey: u32, imm: Option<u32>) -> i32 {
        let mut sge = ffi::ibv_sge { addr: self.buf.as_ptr() as u64, length: len, lkey: unsafe { (*self.mr).lkey } };
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: if imm.is_some() {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE
            },
            send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
        wr.wr.rdma.remote_addr = peer_addr;
        wr.wr.rdma.rkey = rkey;
        let mut bad = std::ptr::null_mut();
        // SAFETY: the context's ops (the inline ibv_post_send); the request and its list live for the call.
        unsafe { (*(*self.qp).context).ops.post_send.expect("post_send")(self.qp, &mut wr, &mut bad) }
    }

    fn post_recv(&self, wr_id: u64) -> i32 {
        let mut wr = ffi::ibv_recv_wr { wr_id, ..Default::default() };
        let mut bad = std::ptr::null_mut();
        // SAFETY: as `write`.
        unsafe { (*(*self.qp).context).ops.post_recv.expect("post_recv")(self.qp, &mut wr, &mut bad) }
    }

    /// The next `n` completions, within 10 s.
    fn completions(&self, n: usize) -> Vec<ffi::ibv_wc> {
        let mut got = Vec::new();
        let started = Instant::now();
        while got.len() < n {
            let mut wc = [ffi::ibv_wc::default(); 4];
            // SAFETY: as `write`; `wc` holds 4 entries.
            let k = unsafe { (*self.ctx).ops.poll_cq.expect("poll_cq")(self.cq, 4, wc.as_mut_ptr()) };
            assert!(k >= 0, "poll_cq");
            got.extend_from_slice(&wc[..k as usize]);
            assert!(started.elapsed() < Duration::from_secs(10), "{} of {n} completions in 10 s", got.len());
            std::thread::yield_now();
        }
        got
    }

    fn addr(&self) -> u64 {
        self.buf.as_ptr() as u64
    }

    fn rkey(&self) -> u32 {
        // SAFETY: a live memory region.
        unsafe { (*self.mr).rkey }
    }
}

/// Where the test registers a dma-buf: no address of the process (the library must not write through it).
const IOVA: u64 = 0x7700_0000_0000;

fn status(wc: &ffi::ibv_wc) -> u32 {
    wc.error().map_or(ffi::ibv_wc_status::IBV_WC_SUCCESS, |(status, _)| status)
}

fn child() {
    let list = ibverbs::devices().expect("the software devices");
    let names: Vec<String> = list.iter().map(|d| d.name().expect("a name").to_string_lossy().into_owned()).collect();
    assert_eq!(names, ["soft_ib0", "soft_ib1"]);
    let mut cases = 1;
    // The crate's own open: an active port and a GID table.
    let ctx = list.get(0).expect("a device").open().expect("opens");
    assert_eq!(ctx.gid_table().len(), 1);
    drop(ctx);
    let devices: Vec<*mut ffi::ibv_device> = (0..2)
        .map(|i| {
            let mut n = 0;
            // SAFETY: the list is freed at exit (the test's process).
            unsafe { *ffi::ibv_get_device_list(&mut n).add(i) }
        })
        .collect();

    // A write with immediate lands in the peer's registered memory and completes on both sides.
    let (mut a, b) = (End::new(devices[0]), End::new(devices[1]));
    a.connect(&b, 7);
    b.connect(&a, 7);
    for (i, x) in a.buf.iter_mut().enumerate() {
        *x = (i % 251) as u8;
    }
    assert_eq!(b.post_recv(77), 0);
    assert_eq!(a.write(1, 4096, b.addr() + 128, b.rkey(), Some(0xc011c)), 0);
    let sent = a.completions(1);
    assert_eq!((sent[0].wr_id(), status(&sent[0])), (1, ffi::ibv_wc_status::IBV_WC_SUCCESS));
    let got = b.completions(1);
    assert_eq!((got[0].wr_id(), status(&got[0]), got[0].len()), (77, ffi::ibv_wc_status::IBV_WC_SUCCESS, 4096));
    assert_eq!(got[0].opcode(), ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM);
    assert_eq!(got[0].imm_data(), Some(0xc011cu32.to_be()));
    assert_eq!(&b.buf[128..128 + 4096], &a.buf[..4096]);
    assert!(b.buf[..128].iter().all(|&x| x == 0) && b.buf[128 + 4096..].iter().all(|&x| x == 0));
    // The library's pipes are memfds this process has mapped (both ends, here).
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let pipes = maps.lines().filter(|l| l.contains("collc-soft-ib-pipe")).count();
    let over = if pipes > 0 { "a shared-memory pipe" } else { "TCP" };
    cases += 1;

    // No receive posted: the write waits (RNR, retried for ever with rnr_retry 7) and lands once one is.
    assert_eq!(a.write(2, 64, b.addr(), b.rkey(), Some(2)), 0);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(b.post_recv(78), 0);
    assert_eq!(status(&a.completions(1)[0]), ffi::ibv_wc_status::IBV_WC_SUCCESS);
    assert_eq!(b.completions(1)[0].wr_id(), 78);
    cases += 1;

    // A wrong rkey: a remote access error, the queue pair in error, what follows flushed; nothing written.
    let before = b.buf.clone();
    a.buf[..64].fill(0xee);
    assert_eq!(a.write(3, 64, b.addr(), b.rkey() + 1000, None), 0);
    assert_eq!(a.write(4, 64, b.addr(), b.rkey(), None), 0);
    let failed = a.completions(2);
    let statuses: Vec<(u64, u32)> = failed.iter().map(|wc| (wc.wr_id(), status(wc))).collect();
    assert_eq!(
        statuses,
        [(3, ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR), (4, ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR)]
    );
    assert_eq!(b.buf, before, "a refused write writes nothing");
    // A queue pair in error takes requests and flushes them.
    assert_eq!(a.write(5, 64, b.addr(), b.rkey(), None), 0);
    let flushed = a.completions(1);
    assert_eq!((flushed[0].wr_id(), status(&flushed[0])), (5, ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR));
    cases += 1;

    // A write past the registered range is refused alike.
    let (mut c, d) = (End::new(devices[0]), End::new(devices[1]));
    c.connect(&d, 1);
    d.connect(&c, 1);
    assert_eq!(c.write(6, 64, d.addr() + d.buf.len() as u64 - 32, d.rkey(), None), 0);
    assert_eq!(status(&c.completions(1)[0]), ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
    cases += 1;

    // rnr_retry 1 and no receive ever posted: RNR retry exceeded.
    let (mut e, f) = (End::new(devices[0]), End::new(devices[1]));
    e.connect(&f, 1);
    f.connect(&e, 1);
    assert_eq!(e.write(7, 8, f.addr(), f.rkey(), Some(7)), 0);
    assert_eq!(status(&e.completions(1)[0]), ffi::ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR);
    cases += 1;

    // A dma-buf (a memfd, as the CUDA driver for the CPU exports device memory) registered from its second page at
    // an iova that is no address of this process: a write there lands in the buffer through the library's own
    // mapping of it, and one past the registered length is refused.
    let (mut g, h) = (End::new(devices[0]), End::new(devices[1]));
    g.connect(&h, 7);
    h.connect(&g, 7);
    // SAFETY: a new memfd of two pages, mapped here to look at it; registered through the peer's protection domain.
    let (view, mr) = unsafe {
        let fd = libc::memfd_create(c"soft-verbs-dmabuf".as_ptr(), 0);
        assert!(fd >= 0 && libc::ftruncate(fd, 8192) == 0);
        let view = libc::mmap(std::ptr::null_mut(), 8192, libc::PROT_READ, libc::MAP_SHARED, fd, 0);
        assert_ne!(view, libc::MAP_FAILED);
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        let mr = ffi::ibv_reg_dmabuf_mr((*h.mr).pd, 4096, 4096, IOVA, fd, access.0 as i32);
        assert!(!mr.is_null(), "ibv_reg_dmabuf_mr");
        libc::close(fd);
        (std::slice::from_raw_parts(view as *const u8, 8192), mr)
    };
    g.buf[..256].fill(0x5a);
    // SAFETY: a live memory region.
    let rkey = unsafe { (*mr).rkey };
    assert_eq!(g.write(8, 256, IOVA + 16, rkey, None), 0);
    assert_eq!(status(&g.completions(1)[0]), ffi::ibv_wc_status::IBV_WC_SUCCESS);
    assert!(view[4096 + 16..4096 + 272].iter().all(|&x| x == 0x5a), "the write lands in the buffer's second page");
    assert!(view[..4096 + 16].iter().chain(&view[4096 + 272..]).all(|&x| x == 0), "and nowhere else");
    assert_eq!(g.write(9, 256, IOVA + 4000, rkey, None), 0);
    assert_eq!(status(&g.completions(1)[0]), ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
    cases += 1;
    println!("soft verbs child: {cases} cases checked, over {over}");
}
