// A software verbs library for collc's tests (issue 33): a `libibverbs.so.1` providing the verbs collc calls, for
// machines with no RDMA device, as kernels/cuda/host_driver.cpp is a CUDA driver for machines with no GPU. Put first
// on LD_LIBRARY_PATH, it is what collc's own ib code (the ibverbs crate, rdma-core's verbs.h) calls unchanged.
//
// Devices: `COLLC_SOFT_IB_DEVICES` (a comma-separated list, default `soft_ib0`), each with one active RoCE port
// whose one GID is this host's address IPv4-mapped (the first interface that is up and not loopback, else
// 127.0.0.1); with `COLLC_SOFT_IB_GID_TABLE=roce`, a RoCE NIC's table of four: link-local RoCE v1 and v2, then the
// address as RoCE v1 and v2 (only the IPv4 ones reach a peer). Queue pairs are RC only. A context listens on a TCP port of that address; a QP number is that port
// shifted left by 8 bits with the QP's index in the context, so a peer reaches a QP from its GID and number alone.
//
// The wire: a QP's requests travel on a connection it opens to its destination at its first request (RDMA WRITE,
// WRITE WITH IMM, SEND, SEND WITH IMM, each a packet with a sequence number), and the responder answers each on the
// same connection: an ACK, or a NAK (receiver not ready: no receive posted; remote access error: the rkey, the range
// or the QP's access flags do not allow the write; invalid request). The requester retries an RNR after the
// responder's min_rnr_timer, `rnr_retry` times (7: for ever), and gives up on a silent responder after the IB
// timeout (4.096 us x 2^timeout, retry_cnt + 1 times), completing the request with IBV_WC_RNR_RETRY_EXC_ERR or
// IBV_WC_RETRY_EXC_ERR; any error moves the QP to the error state and flushes every other request and receive with
// IBV_WC_WR_FLUSH_ERR, as a NIC does. A context's progress thread runs both sides: it reads a request's gather list
// when it sends it (a sender may not touch its buffer before the completion), and writes into registered memory
// only what a valid rkey allows.
//
// Faults on request, `COLLC_SOFT_IB_FAULT=KIND@N` (responder side, from its Nth request on, counted per process):
// `rnr` (every request with immediate finds no receive), `access` (every write is refused as by a wrong rkey),
// `silent` (requests are dropped unanswered), `error` (the QP moves to the error state), `vanish` (the process exits
// at once, as if killed).

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

const uint32_t MAGIC = 0x53425643;  // "CVBS"
enum Kind : uint8_t { HELLO = 1, WRITE, WRITE_IMM, SEND, SEND_IMM, ACK, NAK };
enum Nak : uint8_t { NAK_RNR = 1, NAK_ACCESS, NAK_INVALID };

struct Packet {
    uint32_t magic;
    uint8_t kind, nak;
    uint16_t pad;
    uint32_t src_qpn, dst_qpn;
    uint32_t rkey, len;
    uint64_t seq, remote_addr;
    uint32_t imm, pad2;
};
static_assert(sizeof(Packet) == 48, "packet header");

// The GID table: 1 entry (the address), or a RoCE NIC's 4.
bool roce_table() {
    const char* text = getenv("COLLC_SOFT_IB_GID_TABLE");
    return text && std::string(text) == "roce";
}
int gid_entries() { return roce_table() ? 4 : 1; }
// Whether entry `index` is the address (IPv4-mapped), and its type.
bool gid_is_ipv4(int index) { return roce_table() ? index >= 2 : index == 0; }
ibv_gid_type gid_type(int index) {
    return roce_table() && index % 2 == 0 ? IBV_GID_TYPE_ROCE_V1 : IBV_GID_TYPE_ROCE_V2;
}

uint64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// --- faults ------------------------------------------------------------------------------------------------------

enum Fault { NONE, F_RNR, F_ACCESS, F_SILENT, F_ERROR, F_VANISH };
struct FaultPlan {
    Fault kind = NONE;
    uint64_t after = 0;
};
FaultPlan fault_plan() {
    FaultPlan plan;
    const char* text = getenv("COLLC_SOFT_IB_FAULT");
    if (!text || !*text) return plan;
    std::string s(text);
    size_t at = s.find('@');
    std::string kind = s.substr(0, at);
    plan.after = at == std::string::npos ? 0 : strtoull(s.c_str() + at + 1, nullptr, 10);
    if (kind == "rnr") plan.kind = F_RNR;
    else if (kind == "access") plan.kind = F_ACCESS;
    else if (kind == "silent") plan.kind = F_SILENT;
    else if (kind == "error") plan.kind = F_ERROR;
    else if (kind == "vanish") plan.kind = F_VANISH;
    return plan;
}
std::atomic<uint64_t> requests_seen{0};

// --- devices -----------------------------------------------------------------------------------------------------

struct Device {
    ibv_device dev;
    uint64_t guid;
};
std::vector<Device*>* devices_made;
std::mutex devices_lock;

uint32_t host_ip() {
    ifaddrs* list = nullptr;
    uint32_t found = htonl(INADDR_LOOPBACK);
    if (getifaddrs(&list) != 0) return found;
    for (ifaddrs* a = list; a; a = a->ifa_next) {
        if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
        if (a->ifa_flags & IFF_LOOPBACK) continue;
        found = ((sockaddr_in*)a->ifa_addr)->sin_addr.s_addr;
        break;
    }
    freeifaddrs(list);
    return found;
}

std::vector<Device*>& devices() {
    std::lock_guard<std::mutex> guard(devices_lock);
    if (!devices_made) {
        devices_made = new std::vector<Device*>();
        const char* text = getenv("COLLC_SOFT_IB_DEVICES");
        std::string names = text && *text ? text : "soft_ib0";
        size_t start = 0;
        while (start <= names.size()) {
            size_t end = names.find(',', start);
            if (end == std::string::npos) end = names.size();
            std::string name = names.substr(start, end - start);
            if (!name.empty()) {
                Device* d = new Device();
                memset(&d->dev, 0, sizeof d->dev);
                d->dev.node_type = IBV_NODE_CA;
                d->dev.transport_type = IBV_TRANSPORT_IB;
                snprintf(d->dev.name, sizeof d->dev.name, "%s", name.c_str());
                snprintf(d->dev.dev_name, sizeof d->dev.dev_name, "uverbs%zu", devices_made->size());
                d->guid = 0x0c011c0000000000ull + devices_made->size();
                devices_made->push_back(d);
            }
            start = end + 1;
        }
    }
    return *devices_made;
}

// --- objects -----------------------------------------------------------------------------------------------------

struct Ctx;

struct Mr {
    ibv_mr mr;
    int access;
};

struct Cq {
    ibv_cq cq;
    std::mutex lock;
    std::deque<ibv_wc> entries;
};

// A request as posted, until its completion.
struct Request {
    uint64_t wr_id;
    ibv_wr_opcode opcode;
    bool signaled;
    std::vector<ibv_sge> sges;
    std::string inline_data;  // IBV_SEND_INLINE: copied at post time
    bool is_inline;
    uint64_t remote_addr;
    uint32_t rkey, imm;
    uint64_t seq = 0;
    uint32_t len = 0;
    int rnr_tries = 0;
    uint64_t sent_at = 0;
};

struct Recv {
    uint64_t wr_id;
    std::vector<ibv_sge> sges;
};

struct Conn {
    int fd = -1;
    std::string out;
    std::string in;
    bool dead = false;
    // A peer's connection: the QP its hello named (destination, source), taken once that QP is ready to receive
    // from that source (a NIC drops what reaches a QP before RTR, and the requester sends it again; here it waits).
    bool hello = false;
    uint32_t hello_dst = 0, hello_src = 0;
    struct Qp* qp = nullptr;
};

struct Qp {
    ibv_qp qp;
    Ctx* ctx;
    ibv_qp_cap cap;
    int sig_all;
    unsigned access = 0;
    uint32_t dest_qpn = 0;
    uint32_t dest_ip = 0;
    uint8_t timeout = 14, retry_cnt = 7, rnr_retry = 7, min_rnr_timer = 0;
    std::deque<Request> queued;    // posted, not yet sent
    std::deque<Request> inflight;  // sent, awaiting an answer
    std::deque<Recv> recvs;
    uint64_t next_seq = 1;         // requester
    uint64_t expected = 1;         // responder
    uint64_t resend_at = 0;        // an RNR wait
    Conn* out = nullptr;           // its requests (and their answers)
    Conn* in = nullptr;            // its peer's requests (and this QP's answers)
};

struct Ctx {
    ibv_context ctx;
    Device* device;
    uint32_t ip;
    uint16_t port;
    int listener = -1;
    int wake = -1;
    std::mutex lock;
    std::vector<Qp*> qps;  // by index
    std::map<uint32_t, Mr*> mrs;
    uint32_t next_key = 0x100;
    std::vector<Conn*> conns;  // accepted, before their hello names a QP
    std::thread progress;
    std::atomic<bool> stop{false};
};

Ctx* ctx_of(ibv_context* c) { return (Ctx*)c; }
Qp* qp_of(ibv_qp* q) { return (Qp*)q; }
Cq* cq_of(ibv_cq* c) { return (Cq*)c; }

void wake(Ctx* c) {
    uint64_t one = 1;
    ssize_t n = write(c->wake, &one, 8);
    (void)n;
}

void complete(ibv_cq* cq, uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode, uint32_t qpn, uint32_t len,
              uint32_t imm = 0, bool with_imm = false, uint32_t src_qp = 0) {
    ibv_wc wc;
    memset(&wc, 0, sizeof wc);
    wc.wr_id = wr_id;
    wc.status = status;
    wc.opcode = opcode;
    wc.qp_num = qpn;
    wc.byte_len = len;
    wc.imm_data = imm;
    wc.wc_flags = with_imm ? IBV_WC_WITH_IMM : 0;
    wc.src_qp = src_qp;
    Cq* q = cq_of(cq);
    std::lock_guard<std::mutex> guard(q->lock);
    q->entries.push_back(wc);
}

ibv_wc_opcode send_opcode(ibv_wr_opcode op) {
    switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    default: return IBV_WC_SEND;
    }
}

// Moves `q` to the error state: `first` (if any) completes with `status`, every other request and receive with
// IBV_WC_WR_FLUSH_ERR. Called with the context's lock held.
void fail_qp(Qp* q, Request* first, ibv_wc_status status) {
    q->qp.state = IBV_QPS_ERR;
    uint32_t qpn = q->qp.qp_num;
    if (first) complete(q->qp.send_cq, first->wr_id, status, send_opcode(first->opcode), qpn, 0);
    for (auto* list : {&q->inflight, &q->queued})
        for (Request& r : *list)
            if (!first || &r != first) complete(q->qp.send_cq, r.wr_id, IBV_WC_WR_FLUSH_ERR, send_opcode(r.opcode), qpn, 0);
    q->inflight.clear();
    q->queued.clear();
    for (Recv& r : q->recvs) complete(q->qp.recv_cq, r.wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, qpn, 0);
    q->recvs.clear();
}

Mr* find_mr(Ctx* c, uint32_t key) {
    auto it = c->mrs.find(key);
    return it == c->mrs.end() ? nullptr : it->second;
}

// Whether [addr, addr + len) lies in `m`.
bool within(Mr* m, uint64_t addr, uint64_t len) {
    uint64_t lo = (uint64_t)m->mr.addr;
    return addr >= lo && addr + len >= addr && addr + len <= lo + m->mr.length;
}

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
    fcntl(fd, F_SETFL, O_NONBLOCK);
    Conn* conn = new Conn();
    conn->fd = fd;
    send_packet(conn, header(HELLO, q->qp.qp_num, q->dest_qpn, 0));
    (void)c;
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
        data.append((const char*)(uintptr_t)s.addr, s.length);
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
        if (p.len) memcpy((void*)(uintptr_t)p.remote_addr, body, p.len);
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
            uint64_t at = 0;
            for (const ibv_sge& s : r.sges) {
                Mr* m = find_mr(c, s.lkey);
                uint64_t take = std::min<uint64_t>(s.length, p.len - at);
                if (!m || !within(m, s.addr, take) || !(m->access & IBV_ACCESS_LOCAL_WRITE)) {
                    complete(q->qp.recv_cq, r.wr_id, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, q->qp.qp_num, 0);
                    fail_qp(q, nullptr, IBV_WC_SUCCESS);
                    return;
                }
                memcpy((void*)(uintptr_t)s.addr, body + at, take);
                at += take;
                if (at == p.len) break;
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
            conn->in.append(buf, (size_t)n);
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) conn->dead = true;
        break;
    }
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
        } else if (p.kind == HELLO) {
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
                    fds.push_back({conn->fd, (short)(POLLIN | (conn->out.empty() ? 0 : POLLOUT)), 0});
                }
            };
            for (Qp* q : c->qps)
                if (q) add(q->out);
            for (Conn* conn : c->conns) add(conn);
        }
        poll(fds.data(), fds.size(), 1);
        std::lock_guard<std::mutex> guard(c->lock);
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
    for (Conn* conn : c->conns) {
        close(conn->fd);
        delete conn;
    }
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

// A dma-buf (on the CUDA driver for the CPU, device memory's memfd), registered at `iova`, the address the peer
// writes to: where this process sees that memory (the device pointer).
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
    (void)offset;
    if (fcntl(fd, F_GETFD) == -1) return nullptr;  // errno: EBADF
    return register_mr(pd, iova, length, access);
}

int ibv_dereg_mr(ibv_mr* mr) {
    Ctx* c = ctx_of(mr->context);
    std::lock_guard<std::mutex> guard(c->lock);
    Mr* m = find_mr(c, mr->lkey);
    if (!m) return EINVAL;
    c->mrs.erase(mr->lkey);
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
    if (q->out) {
        close(q->out->fd);
        delete q->out;
    }
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
