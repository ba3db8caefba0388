// The software verbs library's verbs: the ops verbs.h calls inline (post_send, post_recv, poll_cq) and the
// exported functions with rdma-core's symbol versions (see objects.h for the whole library).

namespace {

// --- ops the inline verbs call -----------------------------------------------------------------------------------

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
    Qp* q = qp_of(qp);
    Ctx* c = q->ctx;
    std::lock_guard<std::mutex> guard(c->lock);
    for (; wr; wr = wr->next) {
        if (q->qp.state == IBV_QPS_ERR) {
            // A queue pair in error takes requests and flushes them, as a NIC does.
            complete(q->qp.send_cq, wr->wr_id, IBV_WC_WR_FLUSH_ERR, send_opcode(wr->opcode), q->qp.qp_num, 0);
            continue;
        }
        int error = 0;
        if (q->qp.state != IBV_QPS_RTS) error = EINVAL;
        else if (q->queued.size() + q->inflight.size() >= q->cap.max_send_wr) error = ENOMEM;
        else if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_send_sge) error = EINVAL;
        else if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
                 wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM)
            error = EINVAL;
        Request r;
        if (!error) {
            r.wr_id = wr->wr_id;
            r.opcode = wr->opcode;
            r.signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0;
            r.is_inline = (wr->send_flags & IBV_SEND_INLINE) != 0;
            r.remote_addr = wr->wr.rdma.remote_addr;
            r.rkey = wr->wr.rdma.rkey;
            r.imm = wr->imm_data;
            for (int i = 0; i < wr->num_sge; i++) r.sges.push_back(wr->sg_list[i]);
            if (r.is_inline) {
                for (const ibv_sge& s : r.sges) r.inline_data.append((const char*)(uintptr_t)s.addr, s.length);
                if (r.inline_data.size() > q->cap.max_inline_data) error = EINVAL;
            }
        }
        if (error) {
            if (bad) *bad = wr;
            return error;
        }
        q->queued.push_back(r);
    }
    wake(c);
    return 0;
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
    Qp* q = qp_of(qp);
    std::lock_guard<std::mutex> guard(q->ctx->lock);
    for (; wr; wr = wr->next) {
        if (q->qp.state == IBV_QPS_ERR) {
            complete(q->qp.recv_cq, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, q->qp.qp_num, 0);
            continue;
        }
        int error = 0;
        if (q->qp.state == IBV_QPS_RESET) error = EINVAL;
        else if (q->recvs.size() >= q->cap.max_recv_wr) error = ENOMEM;
        else if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->cap.max_recv_sge) error = EINVAL;
        if (error) {
            if (bad) *bad = wr;
            return error;
        }
        Recv r;
        r.wr_id = wr->wr_id;
        for (int i = 0; i < wr->num_sge; i++) r.sges.push_back(wr->sg_list[i]);
        q->recvs.push_back(r);
    }
    return 0;
}

int poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
    Cq* q = cq_of(cq);
    std::lock_guard<std::mutex> guard(q->lock);
    int got = 0;
    while (got < n && !q->entries.empty()) {
        wc[got++] = q->entries.front();
        q->entries.pop_front();
    }
    return got;
}

int req_notify_cq(ibv_cq*, int) { return EOPNOTSUPP; }

}  // namespace

// --- the exported verbs ------------------------------------------------------------------------------------------

extern "C" {

ibv_device** ibv_get_device_list(int* num) {
    std::vector<Device*>& all = devices();
    ibv_device** list = (ibv_device**)calloc(all.size() + 1, sizeof(ibv_device*));
    if (!list) {
        errno = ENOMEM;
        return nullptr;
    }
    for (size_t i = 0; i < all.size(); i++) list[i] = &all[i]->dev;
    if (num) *num = (int)all.size();
    return list;
}

void ibv_free_device_list(ibv_device** list) { free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device->name; }

__be64 ibv_get_device_guid(ibv_device* device) {
    for (Device* d : devices())
        if (&d->dev == device) return htobe64(d->guid);
    return 0;
}

int ibv_get_device_index(ibv_device* device) {
    std::vector<Device*>& all = devices();
    for (size_t i = 0; i < all.size(); i++)
        if (&all[i]->dev == device) return (int)i;
    return -1;
}

ibv_context* ibv_open_device(ibv_device* device) {
    Device* d = nullptr;
    for (Device* each : devices())
        if (&each->dev == device) d = each;
    if (!d) {
        errno = ENODEV;
        return nullptr;
    }
    Ctx* c = new Ctx();
    memset(&c->ctx, 0, sizeof c->ctx);
    c->ctx.device = device;
    c->ctx.ops.post_send = post_send;
    c->ctx.ops.post_recv = post_recv;
    c->ctx.ops.poll_cq = poll_cq;
    c->ctx.ops.req_notify_cq = req_notify_cq;
    c->ctx.cmd_fd = -1;
    c->ctx.async_fd = -1;
    c->ctx.num_comp_vectors = 1;
    pthread_mutex_init(&c->ctx.mutex, nullptr);
    c->device = d;
    c->ip = host_ip();
    c->listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = c->ip;
    socklen_t len = sizeof addr;
    if (c->listener < 0 || bind(c->listener, (sockaddr*)&addr, sizeof addr) != 0 || listen(c->listener, 64) != 0 ||
        getsockname(c->listener, (sockaddr*)&addr, &len) != 0) {
        int saved = errno;
        if (c->listener >= 0) close(c->listener);
        delete c;
        errno = saved;
        return nullptr;
    }
    c->port = ntohs(addr.sin_port);
    c->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->progress = std::thread(progress, c);
    return &c->ctx;
}

int ibv_close_device(ibv_context* context) {
    Ctx* c = ctx_of(context);
    c->stop = true;
    wake(c);
    c->progress.join();
    close(c->listener);
    close(c->wake);
    for (Conn* conn : c->conns) close_conn(conn);
    delete c;
    return 0;
}

int ibv_query_device(ibv_context* context, ibv_device_attr* attr) {
    Ctx* c = ctx_of(context);
    memset(attr, 0, sizeof *attr);
    snprintf(attr->fw_ver, sizeof attr->fw_ver, "collc-soft-1");
    attr->node_guid = htobe64(c->device->guid);
    attr->sys_image_guid = attr->node_guid;
    attr->max_mr_size = 1ull << 40;
    attr->page_size_cap = 4096;
    attr->vendor_id = 0xc011c;
    attr->max_qp = 255;
    attr->max_qp_wr = 4096;
    attr->max_sge = 16;
    attr->max_cq = 1024;
    attr->max_cqe = 1 << 16;
    attr->max_mr = 1 << 16;
    attr->max_pd = 1024;
    attr->max_qp_rd_atom = 16;
    attr->max_qp_init_rd_atom = 16;
    attr->phys_port_cnt = 1;
    return 0;
}

// The exported, compatible form (rdma-core's `ibv_query_port` symbol): the fields up to `link_layer`.
int ibv_query_port(ibv_context* context, uint8_t port, struct _compat_ibv_port_attr* out) {
    (void)context;
    if (port != 1) return EINVAL;
    ibv_port_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.state = IBV_PORT_ACTIVE;
    attr.max_mtu = IBV_MTU_4096;
    attr.active_mtu = IBV_MTU_4096;
    attr.gid_tbl_len = gid_entries();
    attr.max_msg_sz = 1u << 31;
    attr.pkey_tbl_len = 1;
    attr.active_width = 2;   // 4x
    attr.active_speed = 32;  // NDR-like, for show
    attr.phys_state = 5;     // link up
    attr.link_layer = IBV_LINK_LAYER_ETHERNET;
    memcpy((void*)out, &attr, offsetof(ibv_port_attr, link_layer) + 1);
    return 0;
}

int ibv_query_gid(ibv_context* context, uint8_t port, int index, ibv_gid* gid) {
    Ctx* c = ctx_of(context);
    if (port != 1 || index < 0 || index >= gid_entries()) return EINVAL;
    memset(gid, 0, sizeof *gid);
    if (gid_is_ipv4(index)) {
        gid->raw[10] = 0xff;
        gid->raw[11] = 0xff;
        memcpy(&gid->raw[12], &c->ip, 4);
    } else {
        gid->raw[0] = 0xfe;  // link-local, from the address: unreachable from another host
        gid->raw[1] = 0x80;
        memcpy(&gid->raw[12], &c->ip, 4);
    }
    return 0;
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry, uint32_t flags,
                      size_t entry_size) {
    (void)flags;
    if (entry_size < sizeof(ibv_gid_entry)) return EINVAL;
    memset(entry, 0, sizeof *entry);
    int e = ibv_query_gid(context, (uint8_t)port, (int)index, &entry->gid);
    if (e) return e;
    entry->gid_index = index;
    entry->port_num = port;
    entry->gid_type = gid_type((int)index);
    return 0;
}

ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max, uint32_t flags,
                             size_t entry_size) {
    (void)flags;
    if (entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
    size_t n = 0;
    for (int i = 0; i < gid_entries() && n < max; i++, n++) {
        int e = _ibv_query_gid_ex(context, 1, (uint32_t)i, &entries[n], 0, entry_size);
        if (e) return -e;
    }
    return (ssize_t)n;
}

int ibv_query_pkey(ibv_context*, uint8_t port, int index, __be16* pkey) {
    if (port != 1 || index != 0) return EINVAL;
    *pkey = htobe16(0xffff);
    return 0;
}

ibv_pd* ibv_alloc_pd(ibv_context* context) {
    ibv_pd* pd = new ibv_pd();
    pd->context = context;
    return pd;
}

int ibv_dealloc_pd(ibv_pd* pd) {
    delete pd;
    return 0;
}

static ibv_mr* register_mr(ibv_pd* pd, uint64_t iova, size_t length, int access) {
    // IBA: remote write (or atomic) access needs local write.
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(access & IBV_ACCESS_LOCAL_WRITE)) {
        errno = EINVAL;
        return nullptr;
    }
    Ctx* c = ctx_of(pd->context);
    Mr* m = new Mr();
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = (void*)(uintptr_t)iova;
    m->mr.length = length;
    m->access = access;
    std::lock_guard<std::mutex> guard(c->lock);
    m->mr.lkey = m->mr.rkey = c->next_key++;
    c->mrs[m->mr.lkey] = m;
    return &m->mr;
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
    return register_mr(pd, (uint64_t)(uintptr_t)addr, length, access);
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
    if (iova != (uint64_t)(uintptr_t)addr) {
        errno = EOPNOTSUPP;  // the software device addresses memory by its virtual address
        return nullptr;
    }
    return register_mr(pd, iova, length, (int)access);
}

// A dma-buf (on the CUDA driver for the CPU, device memory's memfd), registered at `iova`, the address requests
// name it by (the device pointer): the library maps the buffer itself and reaches it through that mapping, as a
// NIC reaches device memory through the dma-buf and not through the process's pointers.
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
    if (fcntl(fd, F_GETFD) == -1) return nullptr;  // errno: EBADF
    uint64_t page = 4096, start = offset & ~(page - 1);
    size_t span = (size_t)(offset - start) + length;
    void* map = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    if (map == MAP_FAILED) return nullptr;  // errno from mmap: not a buffer that can be mapped, or past its end
    ibv_mr* mr = register_mr(pd, iova, length, access);
    if (!mr) {
        munmap(map, span);
        return nullptr;
    }
    Mr* m = (Mr*)mr;
    m->map = (char*)map;
    m->map_len = span;
    m->local = (char*)map + (offset - start);
    return mr;
}

int ibv_dereg_mr(ibv_mr* mr) {
    Ctx* c = ctx_of(mr->context);
    std::lock_guard<std::mutex> guard(c->lock);
    Mr* m = find_mr(c, mr->lkey);
    if (!m) return EINVAL;
    c->mrs.erase(mr->lkey);
    if (m->map) munmap(m->map, m->map_len);
    delete m;
    return 0;
}

ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel, int vector) {
    (void)vector;
    if (cqe < 1 || cqe > (1 << 16)) {
        errno = EINVAL;
        return nullptr;
    }
    Cq* q = new Cq();
    memset(&q->cq, 0, sizeof q->cq);
    q->cq.context = context;
    q->cq.channel = channel;
    q->cq.cq_context = cq_context;
    q->cq.cqe = cqe;
    pthread_mutex_init(&q->cq.mutex, nullptr);
    pthread_cond_init(&q->cq.cond, nullptr);
    return &q->cq;
}

int ibv_destroy_cq(ibv_cq* cq) {
    delete cq_of(cq);
    return 0;
}

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* init) {
    Ctx* c = ctx_of(pd->context);
    if (init->qp_type != IBV_QPT_RC || !init->send_cq || !init->recv_cq || init->srq) {
        errno = EOPNOTSUPP;  // RC queue pairs with their own receive queue only
        return nullptr;
    }
    if (init->cap.max_send_wr > 4096 || init->cap.max_recv_wr > 4096 || init->cap.max_send_sge > 16 ||
        init->cap.max_recv_sge > 16 || init->cap.max_inline_data > 1024) {
        errno = EINVAL;
        return nullptr;
    }
    std::lock_guard<std::mutex> guard(c->lock);
    if (c->qps.size() >= 255) {
        errno = ENOMEM;
        return nullptr;
    }
    Qp* q = new Qp();
    memset(&q->qp, 0, sizeof q->qp);
    q->qp.context = pd->context;
    q->qp.qp_context = init->qp_context;
    q->qp.pd = pd;
    q->qp.send_cq = init->send_cq;
    q->qp.recv_cq = init->recv_cq;
    q->qp.qp_num = ((uint32_t)c->port << 8) | (uint32_t)c->qps.size();
    q->qp.state = IBV_QPS_RESET;
    q->qp.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&q->qp.mutex, nullptr);
    pthread_cond_init(&q->qp.cond, nullptr);
    q->ctx = c;
    q->cap = init->cap;
    if (q->cap.max_inline_data < 64) q->cap.max_inline_data = 64;
    init->cap = q->cap;
    q->sig_all = init->sq_sig_all;
    c->qps.push_back(q);
    return &q->qp;
}

int ibv_destroy_qp(ibv_qp* qp) {
    Qp* q = qp_of(qp);
    Ctx* c = q->ctx;
    std::lock_guard<std::mutex> guard(c->lock);
    for (Qp*& each : c->qps)
        if (each == q) each = nullptr;
    for (Conn* conn : c->conns)
        if (conn->qp == q) {
            conn->qp = nullptr;
            conn->dead = true;
        }
    if (q->out) close_conn(q->out);
    delete q;
    return 0;
}

// RESET -> INIT -> RTR -> RTS with the attributes an RC queue pair needs at each step (as mlx5 requires them), and
// to RESET or ERR from any state.
int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
    Qp* q = qp_of(qp);
    std::lock_guard<std::mutex> guard(q->ctx->lock);
    if (!(mask & IBV_QP_STATE)) return EINVAL;
    ibv_qp_state from = q->qp.state, to = attr->qp_state;
    auto has = [&](int bits) { return (mask & bits) == bits; };
    switch (to) {
    case IBV_QPS_RESET: q->qp.state = to; q->queued.clear(); q->inflight.clear(); q->recvs.clear(); return 0;
    case IBV_QPS_ERR: fail_qp(q, nullptr, IBV_WC_SUCCESS); return 0;
    case IBV_QPS_INIT:
        if (from != IBV_QPS_RESET && from != IBV_QPS_INIT) return EINVAL;
        if (!has(IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return EINVAL;
        if (attr->port_num != 1 || attr->pkey_index != 0) return EINVAL;
        q->access = attr->qp_access_flags;
        break;
    case IBV_QPS_RTR:
        if (from != IBV_QPS_INIT) return EINVAL;
        if (!has(IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                 IBV_QP_MIN_RNR_TIMER))
            return EINVAL;
        // RoCE: the destination by its GID (an IPv4-mapped address), from a source GID that is one too.
        if (!attr->ah_attr.is_global || attr->ah_attr.grh.sgid_index >= gid_entries() ||
            !gid_is_ipv4(attr->ah_attr.grh.sgid_index))
            return EINVAL;
        {
            const uint8_t* g = attr->ah_attr.grh.dgid.raw;
            static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
            if (memcmp(g, mapped, 12) != 0) return EINVAL;
            memcpy(&q->dest_ip, g + 12, 4);
        }
        if (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096) return EINVAL;
        q->dest_qpn = attr->dest_qp_num;
        q->min_rnr_timer = attr->min_rnr_timer;
        q->expected = 1;
        break;
    case IBV_QPS_RTS:
        if (from != IBV_QPS_RTR && from != IBV_QPS_RTS) return EINVAL;
        if (from == IBV_QPS_RTR &&
            !has(IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
            return EINVAL;
        if (attr->retry_cnt > 7 || attr->rnr_retry > 7 || attr->timeout > 31) return EINVAL;
        q->timeout = attr->timeout;
        q->retry_cnt = attr->retry_cnt;
        q->rnr_retry = attr->rnr_retry;
        break;
    default: return EINVAL;
    }
    q->qp.state = to;
    wake(q->ctx);
    return 0;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask, ibv_qp_init_attr* init) {
    (void)mask;
    Qp* q = qp_of(qp);
    std::lock_guard<std::mutex> guard(q->ctx->lock);
    memset(attr, 0, sizeof *attr);
    attr->qp_state = attr->cur_qp_state = q->qp.state;
    attr->dest_qp_num = q->dest_qpn;
    attr->qp_access_flags = q->access;
    attr->cap = q->cap;
    attr->timeout = q->timeout;
    attr->retry_cnt = q->retry_cnt;
    attr->rnr_retry = q->rnr_retry;
    attr->min_rnr_timer = q->min_rnr_timer;
    if (init) {
        memset(init, 0, sizeof *init);
        init->send_cq = q->qp.send_cq;
        init->recv_cq = q->qp.recv_cq;
        init->cap = q->cap;
        init->qp_type = IBV_QPT_RC;
        init->sq_sig_all = q->sig_all;
    }
    return 0;
}

const char* ibv_wc_status_str(ibv_wc_status status) {
    switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    default: return "unknown";
    }
}

}  // extern "C"
