// The software verbs library's progress thread: a context's requests sent, answered and retried, its peers'
// requests written into registered memory, over TCP, or over a shared-memory pipe to a context of this host (see
// objects.h for the whole library).

namespace {

// --- the progress thread -----------------------------------------------------------------------------------------

void send_packet(Conn* conn, const Packet& p, const void* body = nullptr, size_t len = 0) {
    conn->out.append((const char*)&p, sizeof p);
    if (len) conn->out.append((const char*)body, len);
}

Packet header(uint8_t kind, uint32_t src, uint32_t dst, uint64_t seq) {
    Packet p;
    memset(&p, 0, sizeof p);
    p.magic = MAGIC;
    p.kind = kind;
    p.src_qpn = src;
    p.dst_qpn = dst;
    p.seq = seq;
    return p;
}

// --- shared memory between contexts of one host ------------------------------------------------------------------

// A HELLO's `nak` byte: a requester's offer of a pipe (its netns, pid and memfd in `remote_addr`, `rkey`, `len`), and
// the responder's answer.
const uint8_t SHM_OFFER = 1, SHM_ACCEPT = 2, SHM_REFUSE = 3;

bool shm_enabled() {
    const char* text = getenv("COLLC_SOFT_IB_SHM");
    return !(text && std::string(text) == "0");
}

// This process's network namespace (its inode): contexts in one namespace share a host.
uint64_t netns_id() {
    struct stat st;
    return stat("/proc/self/ns/net", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

bool established(const Conn* conn) { return conn->shm && !conn->shm_pending; }
ShmRing* incoming(Conn* conn) { return conn->shm_requester ? &conn->shm->to_requester : &conn->shm->to_responder; }
ShmRing* outgoing(Conn* conn) { return conn->shm_requester ? &conn->shm->to_responder : &conn->shm->to_requester; }

// Writes what fits of `data`; how much.
size_t ring_write(ShmRing* r, const char* data, size_t len) {
    uint64_t tail = r->tail.load(std::memory_order_relaxed), head = r->head.load(std::memory_order_acquire);
    size_t n = std::min<size_t>(len, SHM_RING - (tail - head));
    size_t at = tail % SHM_RING, first = std::min<size_t>(n, SHM_RING - at);
    memcpy(r->data + at, data, first);
    memcpy(r->data, data + first, n - first);
    r->tail.store(tail + n, std::memory_order_release);
    return n;
}

// Appends what the ring holds to `out`.
void ring_read(ShmRing* r, std::string& out) {
    uint64_t head = r->head.load(std::memory_order_relaxed), tail = r->tail.load(std::memory_order_acquire);
    size_t n = tail - head, at = head % SHM_RING, first = std::min<size_t>(n, SHM_RING - at);
    out.append(r->data + at, first);
    out.append(r->data, n - first);
    r->head.store(tail, std::memory_order_release);
}

// A requester's pipe for a QP whose destination is this host: made, and offered in `hello`.
void offer_pipe(Conn* conn, Packet& hello) {
    int fd = memfd_create("collc-soft-ib-pipe", MFD_CLOEXEC);
    void* m = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, sizeof(ShmPipe)) == 0)
        m = mmap(nullptr, sizeof(ShmPipe), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        if (fd >= 0) close(fd);
        return;  // TCP, then
    }
    conn->shm = (ShmPipe*)m;
    conn->shm_fd = fd;
    conn->shm_pending = conn->shm_requester = true;
    hello.nak = SHM_OFFER;
    hello.remote_addr = netns_id();
    hello.rkey = (uint32_t)getpid();
    hello.len = (uint32_t)fd;
}

// A responder's answer to an offered pipe: mapped through /proc where the requester shares its namespace.
void answer_pipe(Conn* conn, const Packet& p) {
    void* m = MAP_FAILED;
    if (p.remote_addr == netns_id() && p.remote_addr != 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%u/fd/%u", p.rkey, p.len);
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            m = mmap(nullptr, sizeof(ShmPipe), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
        }
    }
    Packet answer = header(HELLO, 0, 0, 0);
    answer.nak = m == MAP_FAILED ? SHM_REFUSE : SHM_ACCEPT;
    // Before anything goes through the pipe, on the socket the requester waits on (48 bytes on a new connection).
    if (send(conn->fd, &answer, sizeof answer, MSG_NOSIGNAL) != (ssize_t)sizeof answer) conn->dead = true;
    if (m != MAP_FAILED) conn->shm = (ShmPipe*)m;
}

// The requester's side of the answer.
void on_pipe_answer(Conn* conn, const Packet& p) {
    conn->shm_pending = false;
    close(conn->shm_fd);  // the mappings keep the memory
    conn->shm_fd = -1;
    if (p.nak != SHM_ACCEPT) {
        munmap(conn->shm, sizeof(ShmPipe));
        conn->shm = nullptr;
    }
}

Conn* connect_to(Ctx* c, Qp* q) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return nullptr;
    sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = q->dest_ip;
    addr.sin_port = htons((uint16_t)(q->dest_qpn >> 8));
    if (connect(fd, (sockaddr*)&addr, sizeof addr) != 0) {
        close(fd);
        return nullptr;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn* conn = new Conn();
    conn->fd = fd;
    // The hello goes first and alone on the socket (still blocking): with a pipe offered, what follows waits for
    // the answer, then takes the pipe or the socket.
    Packet hello = header(HELLO, q->qp.qp_num, q->dest_qpn, 0);
    if (q->dest_ip == c->ip && shm_enabled()) offer_pipe(conn, hello);
    if (send(fd, &hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello) {
        close_conn(conn);
        return nullptr;
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    return conn;
}

// Gathers a request's data (lkey-checked); false on a local protection error.
bool gather(Ctx* c, Request& r, std::string& data) {
    if (r.is_inline) {
        data = r.inline_data;
        return true;
    }
    for (const ibv_sge& s : r.sges) {
        Mr* m = find_mr(c, s.lkey);
        if (!m || !within(m, s.addr, s.length)) return false;
        data.append(at(m, s.addr), s.length);
    }
    return true;
}

uint64_t ib_timeout_ns(uint8_t timeout, uint8_t retries) {
    if (timeout == 0) return UINT64_MAX;  // for ever
    double one = 4096.0 * (double)(1ull << (timeout > 31 ? 31 : timeout));
    return (uint64_t)(one * (retries + 1));
}

uint64_t rnr_delay_ns(uint8_t timer) {
    // IBA's encoding, roughly: 0 is 655 ms, 1..31 from 0.01 ms doubling about every 4 codes.
    if (timer == 0) return 655360000ull;
    return 10000ull << (timer / 4);
}

// The requester's side of one QP, once a round: sends what is queued, retries after an RNR, times out a silent peer.
void run_requests(Ctx* c, Qp* q, uint64_t now) {
    if (q->qp.state != IBV_QPS_RTS) return;
    if (!q->out && (!q->queued.empty())) {
        q->out = connect_to(c, q);
        if (!q->out) {
            fail_qp(q, &q->queued.front(), IBV_WC_RETRY_EXC_ERR);
            return;
        }
    }
    if (q->out && q->out->dead) {
        Request* first = !q->inflight.empty() ? &q->inflight.front() : !q->queued.empty() ? &q->queued.front() : nullptr;
        if (first) fail_qp(q, first, IBV_WC_RETRY_EXC_ERR);
        return;
    }
    if (!q->inflight.empty() && q->inflight.front().sent_at &&
        now - q->inflight.front().sent_at > ib_timeout_ns(q->timeout, q->retry_cnt)) {
        fail_qp(q, &q->inflight.front(), IBV_WC_RETRY_EXC_ERR);
        return;
    }
    if (q->resend_at && now < q->resend_at) return;
    if (q->resend_at) {
        // After an RNR: everything from the refused request on goes again, in order.
        q->resend_at = 0;
        while (!q->inflight.empty()) {
            q->queued.push_front(q->inflight.back());
            q->inflight.pop_back();
        }
    }
    while (!q->queued.empty()) {
        Request r = q->queued.front();
        std::string data;
        if (!gather(c, r, data)) {
            fail_qp(q, &q->queued.front(), IBV_WC_LOC_PROT_ERR);
            return;
        }
        q->queued.pop_front();
        if (!r.seq) r.seq = q->next_seq++;
        r.len = (uint32_t)data.size();
        uint8_t kind = r.opcode == IBV_WR_RDMA_WRITE ? WRITE
                       : r.opcode == IBV_WR_RDMA_WRITE_WITH_IMM ? WRITE_IMM
                       : r.opcode == IBV_WR_SEND_WITH_IMM ? SEND_IMM : SEND;
        Packet p = header(kind, q->qp.qp_num, q->dest_qpn, r.seq);
        p.remote_addr = r.remote_addr;
        p.rkey = r.rkey;
        p.len = r.len;
        p.imm = r.imm;
        send_packet(q->out, p, data.data(), data.size());
        r.sent_at = now;
        q->inflight.push_back(r);
    }
}

// An answer on a QP's own connection.
void on_answer(Ctx* c, Qp* q, const Packet& p) {
    (void)c;
    if (q->qp.state == IBV_QPS_ERR) return;
    auto it = q->inflight.begin();
    while (it != q->inflight.end() && it->seq != p.seq) ++it;
    if (it == q->inflight.end()) return;  // an answer to a request already retried or failed
    if (p.kind == ACK) {
        // RC: an ACK covers every earlier request.
        while (!q->inflight.empty()) {
            Request r = q->inflight.front();
            q->inflight.pop_front();
            if (r.signaled || q->sig_all)
                complete(q->qp.send_cq, r.wr_id, IBV_WC_SUCCESS, send_opcode(r.opcode), q->qp.qp_num, r.len);
            if (r.seq == p.seq) break;
        }
        return;
    }
    if (p.nak == NAK_RNR) {
        if (q->rnr_retry != 7 && ++it->rnr_tries > q->rnr_retry) {
            fail_qp(q, &*it, IBV_WC_RNR_RETRY_EXC_ERR);
            return;
        }
        q->resend_at = now_ns() + rnr_delay_ns(q->min_rnr_timer);
        // Later requests already sent are dropped by the responder (it waits for this one again).
        for (auto& r : q->inflight) r.sent_at = 0;
        return;
    }
    fail_qp(q, &*it, p.nak == NAK_ACCESS ? IBV_WC_REM_ACCESS_ERR : IBV_WC_REM_INV_REQ_ERR);
}

// A request from a peer, for `q` (its connection `conn`).
void on_request(Ctx* c, Qp* q, Conn* conn, const Packet& p, const char* body) {
    FaultPlan plan = fault_plan();
    uint64_t n = ++requests_seen;
    bool faulty = plan.kind != NONE && n >= plan.after;
    if (faulty && plan.kind == F_VANISH) _exit(137);
    if (faulty && plan.kind == F_SILENT) return;
    if (faulty && plan.kind == F_ERROR) {
        fail_qp(q, nullptr, IBV_WC_SUCCESS);
        return;
    }
    Packet answer = header(ACK, q->qp.qp_num, p.src_qpn, p.seq);
    if (q->qp.state != IBV_QPS_RTR && q->qp.state != IBV_QPS_RTS) return;  // not ready: the requester times out
    if (p.seq < q->expected) {
        send_packet(conn, answer);  // a duplicate: answered again
        return;
    }
    if (p.seq > q->expected) return;  // after a refused request: dropped until it comes again
    bool imm = p.kind == WRITE_IMM || p.kind == SEND_IMM;
    bool consumes = imm || p.kind == SEND;
    if (consumes && (q->recvs.empty() || (faulty && plan.kind == F_RNR))) {
        answer.kind = NAK;
        answer.nak = NAK_RNR;
        send_packet(conn, answer);
        return;
    }
    if (p.kind == WRITE || p.kind == WRITE_IMM) {
        Mr* m = find_mr(c, p.rkey);
        bool allowed = m && (m->access & IBV_ACCESS_REMOTE_WRITE) && (q->access & IBV_ACCESS_REMOTE_WRITE) &&
                       within(m, p.remote_addr, p.len) && !(faulty && plan.kind == F_ACCESS);
        if (!allowed) {
            answer.kind = NAK;
            answer.nak = NAK_ACCESS;
            send_packet(conn, answer);
            return;
        }
        if (p.len) memcpy(at(m, p.remote_addr), body, p.len);
    }
    if (consumes) {
        Recv r = q->recvs.front();
        q->recvs.pop_front();
        uint32_t len = p.len;
        if (p.kind == SEND || p.kind == SEND_IMM) {
            uint64_t room = 0;
            for (const ibv_sge& s : r.sges) room += s.length;
            if (room < p.len) {
                complete(q->qp.recv_cq, r.wr_id, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV, q->qp.qp_num, 0);
                answer.kind = NAK;
                answer.nak = NAK_INVALID;
                send_packet(conn, answer);
                fail_qp(q, nullptr, IBV_WC_SUCCESS);
                return;
            }
            uint64_t done = 0;
            for (const ibv_sge& s : r.sges) {
                Mr* m = find_mr(c, s.lkey);
                uint64_t take = std::min<uint64_t>(s.length, p.len - done);
                if (!m || !within(m, s.addr, take) || !(m->access & IBV_ACCESS_LOCAL_WRITE)) {
                    complete(q->qp.recv_cq, r.wr_id, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, q->qp.qp_num, 0);
                    fail_qp(q, nullptr, IBV_WC_SUCCESS);
                    return;
                }
                memcpy(at(m, s.addr), body + done, take);
                done += take;
                if (done == p.len) break;
            }
        }
        ibv_wc_opcode op = p.kind == WRITE_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
        complete(q->qp.recv_cq, r.wr_id, IBV_WC_SUCCESS, op, q->qp.qp_num, len, p.imm, imm, p.src_qpn);
    }
    q->expected++;
    send_packet(conn, answer);
}

Qp* qp_numbered(Ctx* c, uint32_t qpn) {
    if ((qpn >> 8) != c->port) return nullptr;
    uint32_t index = qpn & 0xff;
    return index < c->qps.size() ? c->qps[index] : nullptr;
}

// Reads what `conn` has; whole packets go to their QP. `mine`: the QP whose requests it carries (answers come back
// on it), else null (a peer's requests, for the QP its hello named).
void read_conn(Ctx* c, Conn* conn, Qp* mine) {
    char buf[65536];
    for (;;) {
        ssize_t n = read(conn->fd, buf, sizeof buf);
        if (n > 0) {
            if (!established(conn)) conn->in.append(buf, (size_t)n);  // else doorbells
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) conn->dead = true;
        break;
    }
    if (established(conn)) ring_read(incoming(conn), conn->in);
    size_t at = 0;
    while (conn->in.size() - at >= sizeof(Packet)) {
        Packet p;
        memcpy(&p, conn->in.data() + at, sizeof p);
        if (p.magic != MAGIC) {
            conn->dead = true;
            break;
        }
        bool body = p.kind == WRITE || p.kind == WRITE_IMM || p.kind == SEND || p.kind == SEND_IMM;
        size_t whole = sizeof p + (body ? p.len : 0);
        if (conn->in.size() - at < whole) break;
        const char* data = conn->in.data() + at + sizeof p;
        if (mine) {
            if (p.kind == ACK || p.kind == NAK) on_answer(c, mine, p);
            if (p.kind == HELLO && conn->shm_pending) on_pipe_answer(conn, p);
        } else if (p.kind == HELLO) {
            if (p.nak == SHM_OFFER) answer_pipe(conn, p);
            conn->hello = true;
            conn->hello_dst = p.dst_qpn;
            conn->hello_src = p.src_qpn;
        } else {
            if (!conn->qp) {
                Qp* q = conn->hello ? qp_numbered(c, conn->hello_dst) : nullptr;
                bool ready = q && (q->qp.state == IBV_QPS_RTR || q->qp.state == IBV_QPS_RTS);
                if (ready && q->dest_qpn != conn->hello_src) {
                    conn->dead = true;  // a QP connected to another
                    break;
                }
                if (!ready) break;  // not ready to receive yet: the request waits in the connection
                conn->qp = q;
                q->in = conn;
            }
            on_request(c, conn->qp, conn, p, data);
        }
        at += whole;
        if (c->stop) break;
    }
    conn->in.erase(0, at);
}

void flush_out(Conn* conn) {
    if (conn->shm_pending) return;  // until the pipe's answer
    if (established(conn)) {
        if (conn->out.empty() || conn->dead) return;
        ShmRing* r = outgoing(conn);
        size_t n = ring_write(r, conn->out.data(), conn->out.size());
        conn->out.erase(0, n);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (n && r->sleeping.load(std::memory_order_relaxed)) {
            char bell = 1;
            if (send(conn->fd, &bell, 1, MSG_NOSIGNAL) < 0 && errno != EAGAIN && errno != EWOULDBLOCK) conn->dead = true;
        }
        return;
    }
    while (!conn->out.empty() && !conn->dead) {
        ssize_t n = send(conn->fd, conn->out.data(), conn->out.size(), MSG_NOSIGNAL);
        if (n > 0) {
            conn->out.erase(0, (size_t)n);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
        conn->dead = true;
    }
}

void progress(Ctx* c) {
    std::vector<pollfd> fds;
    int wait_ms = 1;
    while (!c->stop) {
        {
            std::lock_guard<std::mutex> guard(c->lock);
            uint64_t now = now_ns();
            for (Qp* q : c->qps)
                if (q) run_requests(c, q, now);
            fds.clear();
            fds.push_back({c->wake, POLLIN, 0});
            fds.push_back({c->listener, POLLIN, 0});
            auto add = [&](Conn* conn) {
                if (conn && !conn->dead) {
                    flush_out(conn);
                    fds.push_back({conn->fd, (short)(POLLIN | (conn->out.empty() || conn->shm ? 0 : POLLOUT)), 0});
                }
            };
            for (Qp* q : c->qps)
                if (q) add(q->out);
            for (Conn* conn : c->conns) add(conn);
            // Pipes: say this thread may sleep, then look once more (a writer that saw no sleeper wrote before).
            auto doze = [&](Conn* conn) {
                if (!conn || conn->dead || !established(conn)) return;
                incoming(conn)->sleeping.store(1, std::memory_order_relaxed);
                std::atomic_thread_fence(std::memory_order_seq_cst);
                ShmRing* r = incoming(conn);
                if (r->tail.load(std::memory_order_relaxed) != r->head.load(std::memory_order_relaxed) ||
                    !conn->out.empty())
                    wait_ms = 0;
            };
            wait_ms = 1;
            for (Qp* q : c->qps)
                if (q) doze(q->out);
            for (Conn* conn : c->conns) doze(conn);
        }
        poll(fds.data(), fds.size(), wait_ms);
        std::lock_guard<std::mutex> guard(c->lock);
        auto wake_up = [](Conn* conn) {
            if (conn && established(conn)) incoming(conn)->sleeping.store(0, std::memory_order_relaxed);
        };
        for (Qp* q : c->qps)
            if (q) wake_up(q->out);
        for (Conn* conn : c->conns) wake_up(conn);
        if (fds[0].revents) {
            uint64_t count;
            ssize_t n = read(c->wake, &count, 8);
            (void)n;
        }
        if (fds[1].revents) {
            int fd = accept4(c->listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd >= 0) {
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                Conn* conn = new Conn();
                conn->fd = fd;
                c->conns.push_back(conn);
            }
        }
        for (Qp* q : c->qps)
            if (q && q->out && !q->out->dead) read_conn(c, q->out, q);
        for (Conn* conn : c->conns)
            if (!conn->dead) read_conn(c, conn, nullptr);
        for (Qp* q : c->qps)
            if (q && q->out) flush_out(q->out);
        for (Conn* conn : c->conns) flush_out(conn);
    }
}

}  // namespace
