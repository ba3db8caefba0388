// The software verbs library's objects (soft/mod.rs builds objects.h, progress.cpp and verbs.cpp as one unit, in
// that order): the wire's packet, the injected faults, the devices, and the verbs objects as they extend rdma-core's.
//
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
// only what a valid rkey allows. Memory registered from a dma-buf (ibv_reg_dmabuf_mr: on the CUDA driver for the
// CPU, a device allocation's memfd) is mapped by the library and reached through that mapping, never through the
// iova the requests name it by, as a NIC reaches a GPU's memory. The connection is TCP between network namespaces;
// to a context in this one (this host) the requester offers a shared-memory pipe in its hello (a memfd of two byte
// rings, which the responder maps through /proc), and once accepted the packets go through it, the TCP connection
// staying as the doorbell of a sleeping reader and to see the peer's process end (`COLLC_SOFT_IB_SHM=0`: TCP only).
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
#include <sys/mman.h>
#include <sys/stat.h>
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
    // A dma-buf's: this process's mapping of it (`map_len` bytes), where iova `mr.addr` is `local`.
    char* map = nullptr;
    size_t map_len = 0;
    char* local = nullptr;
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

// A connection's shared-memory pipe, between two contexts of one host (same network namespace): a byte ring each
// way in a memfd the requester makes and the responder maps through /proc. The TCP connection stays, for the
// handshake, as the doorbell of a reader that sleeps, and to see the peer's process end.
const uint64_t SHM_RING = 1 << 20;
struct ShmRing {
    std::atomic<uint64_t> head;      // bytes read (the reader's)
    std::atomic<uint64_t> tail;      // bytes written (the writer's)
    std::atomic<uint32_t> sleeping;  // the reader may block in poll: the writer rings the doorbell
    char pad[44];
    char data[SHM_RING];
};
struct ShmPipe {
    ShmRing to_responder, to_requester;
};

struct Conn {
    int fd = -1;
    std::string out;
    std::string in;
    bool dead = false;
    // The shared-memory pipe, once both ends use it (`shm_pending`: offered, not answered yet; until then, and if
    // refused, TCP carries everything).
    ShmPipe* shm = nullptr;
    bool shm_pending = false;
    bool shm_requester = false;
    int shm_fd = -1;
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

// Closes a connection: its socket and its pipe.
void close_conn(Conn* conn) {
    if (conn->fd >= 0) close(conn->fd);
    if (conn->shm) munmap(conn->shm, sizeof(ShmPipe));
    if (conn->shm_fd >= 0) close(conn->shm_fd);
    delete conn;
}

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

// Where this process reaches address `addr` of `m` (a dma-buf's iova is not a pointer here).
char* at(Mr* m, uint64_t addr) {
    return m->local ? m->local + (addr - (uint64_t)m->mr.addr) : (char*)(uintptr_t)addr;
}

// Whether [addr, addr + len) lies in `m`.
bool within(Mr* m, uint64_t addr, uint64_t len) {
    uint64_t lo = (uint64_t)m->mr.addr;
    return addr >= lo && addr + len >= addr && addr + len <= lo + m->mr.length;
}

}  // namespace
