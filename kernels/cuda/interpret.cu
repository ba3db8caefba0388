// The device interpreter: one launch per collective call runs every block of an image (runtime/src/exec/device/
// encode.rs), a thread block per (rank, channel), as NCCL runs a channel per block. The host twin
// (runtime/src/exec/device/twin.rs) is this file in Rust, round for round: read it for the protocol.
//
// A round: thread 0 tries each instruction of the current tile not done yet; for one it may fire (every dependency
// done, next in order on its links, a message in its receive slot, room in its send slot) the block's threads move
// its data, then thread 0 publishes the send (stamp, fence, tail), the receive (fence, head) and its done word.
// A round that fires nothing checks the abort word, the first fault of the launch and the timeout.
//
// The blocks of a launch wait on each other, so they must all be resident at once: the host launches the grid
// cooperatively (cuLaunchCooperativeKernel), which fails rather than run them in turns.
//
// Compiled after elementwise.cu, with the layout macros (COLLC_*) the Rust encoder defines.

struct Header {
    u32 magic, version, n_plans, n_blocks, n_conns, blocks, plans, state_words, conn_table, bases_words;
};
struct BlockDesc {
    u32 plan, channel, first, count, plan_blocks, index_in_plan, lane, pad;
};
struct PlanDesc {
    u32 rank, n_ranks, dtype, op, elem, tile, n_tiles, capacity, n_instrs, n_links, n_bufs, avg, lanes, pad;
    u32 instrs, pieces, deps, order, links, bases_at, done_at, link_start_at, finished_at, out_buf;
    u64 out_lo, out_hi, fingerprint, factor;
    u32 unscaled, n_unscaled;
};
struct DInstr {
    u32 op;
    u16 send, recv;
    u32 n, first_piece, first_dep, n_deps, send_pos, recv_pos;
};
struct DPlace {
    u16 buf, raw;
    u32 valid;
    u64 offset;
};
struct DPiece {
    DPlace src, acc, dst;
};
struct DLink {
    u32 conn, per_tile, slot_bytes;
    u16 sending, channel;
};

static_assert(sizeof(Header) == COLLC_HEADER_BYTES, "Header differs from encode.rs");
static_assert(sizeof(BlockDesc) == COLLC_BLOCK_BYTES, "BlockDesc differs from encode.rs");
static_assert(sizeof(PlanDesc) == COLLC_PLAN_BYTES, "PlanDesc differs from encode.rs");
static_assert(sizeof(DInstr) == COLLC_INSTR_BYTES, "DInstr differs from encode.rs");
static_assert(sizeof(DPiece) == COLLC_PIECE_BYTES, "DPiece differs from encode.rs");
static_assert(sizeof(DLink) == COLLC_LINK_BYTES, "DLink differs from encode.rs");

#define NONE_LINK 0xffff
#define NO_BUF 0xffffu
// Connection record words (encode::conn) and control words (encode::control).
#define C_TAIL 0
#define C_HEAD 1
#define C_SLOTS_AT 2
#define C_STAMPS 4
#define K_CODE 0
#define K_RANK 1
#define K_INSTR 2
#define K_TILE 3
#define K_GOT_SEQ 4
#define K_GOT_FP 5
#define K_LINK 6
#define CODE_TIMEOUT 1
#define CODE_MISMATCH 2
#define CODE_ABORTED 3
#define CODE_BAD_IMAGE 4

__device__ __forceinline__ u64 load_acquire(const u64* p, bool system) {
    u64 v = *(const volatile u64*)p;
    if (system) __threadfence_system(); else __threadfence();
    return v;
}
__device__ __forceinline__ void store_release(u64* p, u64 v, bool system) {
    if (system) __threadfence_system(); else __threadfence();
    *(volatile u64*)p = v;
}
__device__ __forceinline__ u64 now_ns() {
#ifdef COLLC_HOST
    return collc_host_now_ns();
#else
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
#endif
}

// Where a block reports: its own fault slot in host-mapped memory (written with plain stores: no atomics on host
// memory), and the launch's stop word in device memory, which holds the sequence number of a call that must stop.
struct Faults {
    volatile u64* slot;
    u64* stop;
    u64 seq;
};

__device__ void record_fault(const Faults& f, u64 what, u32 rank, u32 instr, u32 tile, u64 seq, u64 fp, u32 link) {
    f.slot[K_RANK] = rank;
    f.slot[K_INSTR] = instr;
    f.slot[K_TILE] = tile;
    f.slot[K_GOT_SEQ] = seq;
    f.slot[K_GOT_FP] = fp;
    f.slot[K_LINK] = link;
    __threadfence_system();
    f.slot[K_CODE] = what;
    *(volatile u64*)f.stop = f.seq;
    __threadfence();
}

__device__ __forceinline__ bool stopping(const Faults& f) { return *(volatile u64*)f.stop == f.seq; }

// State words of one lane (encode.rs): an instruction's done generation, a link's count at the call's start, and
// the address of a connection's record.
__device__ __forceinline__ u64* done_word(u64* state, const PlanDesc* plan, u32 lane, u32 i) {
    return &state[plan->done_at + lane * plan->n_instrs + i];
}
__device__ __forceinline__ u64* link_start_word(u64* state, const PlanDesc* plan, u32 lane, u32 l) {
    return &state[plan->link_start_at + lane * plan->n_links + l];
}
// Where a record's slots are: after its words, or (a record carried with GPUDirect RDMA) at `SLOTS_AT`.
__device__ __forceinline__ u8* slots_of(u64* conn) {
    u64 at = conn[C_SLOTS_AT];
    return at ? (u8*)at : (u8*)conn + COLLC_RECORD_BYTES;
}

__device__ __forceinline__ u64* conn_record(u64* state, const Header* h, u32 lane, u32 conn) {
    return (u64*)state[h->conn_table + lane * h->n_conns + conn];
}

__device__ __forceinline__ u64 generation(const PlanDesc* plan, u64 seq, u32 t) {
    return seq * ((u64)plan->n_tiles + 1) + t + 1;
}

// What thread 0 decided for the block this round.
struct Decision {
    int fire;          // 1: the threads move the instruction's data
    u32 instr;
    const u8* incoming;
    u8* outgoing;
    u64* recv_conn;    // the records to publish on, and the message counts
    u64* send_conn;
    u64 recv_m, send_m;
};

// Thread 0: may instruction `i` of tile `t` fire? On a stamp that is not this call's, records the mismatch.
__device__ bool ready(const u8* image, u64* state, const Faults& faults, const Header* h, const PlanDesc* plan,
                      u32 lane, u32 i, u32 t, u64 seq, bool system, Decision* d) {
    const DInstr* instr = (const DInstr*)(image + plan->instrs) + i;
    u64 gen = generation(plan, seq, t);
    const u32* deps = (const u32*)(image + plan->deps);
    for (u32 k = 0; k < instr->n_deps; k++)
        if (load_acquire(done_word(state, plan, lane, deps[instr->first_dep + k]), system) < gen) return false;
    const DLink* links = (const DLink*)(image + plan->links);
    d->incoming = 0;
    d->outgoing = 0;
    d->recv_conn = 0;
    d->send_conn = 0;
    if (instr->recv != NONE_LINK) {
        const DLink* link = &links[instr->recv];
        u64* conn = conn_record(state, h, lane, link->conn);
        u64 start = *link_start_word(state, plan, lane, instr->recv);
        u64 m = *(volatile u64*)&conn[C_HEAD];
        if (m - start != (u64)(t / plan->lanes) * link->per_tile + instr->recv_pos) return false;
        if (load_acquire(&conn[C_TAIL], system) <= m) return false;
        u32 slot = (u32)(m % COLLC_SLOTS);
        u64 got_seq = *(volatile u64*)&conn[C_STAMPS + 2 * slot];
        u64 got_fp = *(volatile u64*)&conn[C_STAMPS + 2 * slot + 1];
        if (got_seq != seq || got_fp != plan->fingerprint) {
            record_fault(faults, CODE_MISMATCH, plan->rank, i, t, got_seq, got_fp, instr->recv);
            return false;
        }
        d->incoming = slots_of(conn) + (u64)slot * link->slot_bytes;
        d->recv_conn = conn;
        d->recv_m = m;
    }
    if (instr->send != NONE_LINK) {
        const DLink* link = &links[instr->send];
        u64* conn = conn_record(state, h, lane, link->conn);
        u64 start = *link_start_word(state, plan, lane, instr->send);
        u64 m = *(volatile u64*)&conn[C_TAIL];
        if (m - start != (u64)(t / plan->lanes) * link->per_tile + instr->send_pos) return false;
        if (m - load_acquire(&conn[C_HEAD], system) >= COLLC_SLOTS) return false;
        u32 slot = (u32)(m % COLLC_SLOTS);
        d->outgoing = slots_of(conn) + (u64)slot * link->slot_bytes;
        d->send_conn = conn;
        d->send_m = m;
    }
    d->instr = i;
    return true;
}

// The address of `place`'s element `lo` and the tile's valid elements there (`bases`: the plan's buffers).
__device__ __forceinline__ u8* local(const u64* bases, const PlanDesc* plan, DPlace place, u64 lo, u64 hi, u64* n) {
    if (place.buf == NO_BUF) {
        *n = 0;
        return 0;
    }
    u64 end = hi < (u64)place.valid ? hi : (u64)place.valid;
    *n = end > lo ? end - lo : 0;
    return (u8*)bases[place.buf] + (place.offset + lo) * plan->elem;
}

// Every thread of the block: the data movement of one instruction on tile t (the host executor's, element for
// element).
__device__ void execute(const u8* image, const u64* bases, const PlanDesc* plan, const Decision* d, u32 t) {
    const DInstr* instr = (const DInstr*)(image + plan->instrs) + d->instr;
    const DPiece* pieces = (const DPiece*)(image + plan->pieces);
    u32 tid = threadIdx.x, nt = blockDim.x;
    u64 elem = plan->elem;
    u64 lo = (u64)t * plan->tile;
    u64 hi = lo + plan->tile < plan->capacity ? lo + plan->tile : plan->capacity;
    u64 stride = (u64)plan->tile * elem;
    // Single copy (encode::SENDS_REFERENCES): a message holds the address of each chunk's tile at the sender.
    bool sends_refs = (instr->op & COLLC_SENDS_REFERENCES) != 0;
    bool receives_refs = (instr->op & COLLC_RECEIVES_REFERENCES) != 0;
    for (u32 k = 0; k < instr->n; k++) {
        DPiece piece = pieces[instr->first_piece + k];
        const u8* in = receives_refs ? (const u8*)((const volatile u64*)d->incoming)[k] : d->incoming + k * stride;
        u8* out = d->outgoing + k * stride;
        u64 n_src, n_acc, n_dst;
        u8* src = local(bases, plan, piece.src, lo, hi, &n_src);
        if (sends_refs) {
            if (tid == 0) ((volatile u64*)d->outgoing)[k] = (u64)src;
            continue;
        }
        u8* acc = local(bases, plan, piece.acc, lo, hi, &n_acc);
        u8* dst = local(bases, plan, piece.dst, lo, hi, &n_dst);
        // PreMulSum: a place holding the rank's input as it came is multiplied by the factor as it is read.
        bool premul = plan->op == OP_PREMULSUM;
        bool scale_src = premul && piece.src.raw, scale_acc = premul && piece.acc.raw;
        switch (instr->op & COLLC_OP_MASK) {
        case COLLC_OP_SEND:
            if (scale_src) premul_any(plan->dtype, out, src, true, 0, false, plan->factor, n_src, tid, nt);
            else copy_range(out, src, n_src * elem, tid, nt);
            break;
        case COLLC_OP_RECV: copy_range(dst, in, n_dst * elem, tid, nt); break;
        case COLLC_OP_RECV_REDUCE_COPY:
            if (scale_acc) premul_any(plan->dtype, dst, acc, true, in, false, plan->factor, n_dst, tid, nt);
            else reduce_any(plan->dtype, plan->op, dst, acc, in, n_dst, tid, nt);
            break;
        case COLLC_OP_RECV_REDUCE_SEND:
            if (scale_acc) premul_any(plan->dtype, out, acc, true, in, false, plan->factor, n_acc, tid, nt);
            else reduce_any(plan->dtype, plan->op, out, acc, in, n_acc, tid, nt);
            break;
        case COLLC_OP_RECV_REDUCE_COPY_SEND:
            // The reduce and the copy split the elements over the threads differently: the copy waits for the reduce.
            if (scale_acc) premul_any(plan->dtype, out, acc, true, in, false, plan->factor, n_dst, tid, nt);
            else reduce_any(plan->dtype, plan->op, out, acc, in, n_dst, tid, nt);
            __syncthreads();
            copy_range(dst, out, n_dst * elem, tid, nt);
            break;
        case COLLC_OP_RECV_COPY_SEND:
            copy_range(dst, in, n_dst * elem, tid, nt);
            // The whole tile goes on: a later rank may hold more of this chunk than this rank does.
            copy_range(out, in, (hi - lo) * elem, tid, nt);
            break;
        case COLLC_OP_COPY:
            if (scale_src) premul_any(plan->dtype, dst, src, true, 0, false, plan->factor, n_dst < n_src ? n_dst : n_src, tid, nt);
            else copy_range(dst, src, (n_dst < n_src ? n_dst : n_src) * elem, tid, nt);
            break;
        case COLLC_OP_REDUCE:
            if (scale_acc || scale_src) premul_any(plan->dtype, dst, acc, scale_acc, src, scale_src, plan->factor, n_dst, tid, nt);
            else reduce_any(plan->dtype, plan->op, dst, acc, src, n_dst, tid, nt);
            break;
        default: COLLC_TRAP();
        }
    }
}

// The most buffers a plan names (a buffer id is one byte): their addresses are kept in shared memory.
#define MAX_BUFS 256

// `table`: per block of the grid, four words: its image, that image's state, its bases array (host-mapped memory
// the host writes each call), and the block's index in the image. Blocks of several images (ranks prepared apart,
// sharing a GPU) run in one launch. `control` (host-mapped): word 0 the abort request (the sequence number of the
// call to stop), then COLLC_CONTROL_WORDS words of fault report per block. `stop`: a device word, see Faults.
extern "C" __global__ void __launch_bounds__(COLLC_THREADS, 1) collc_interpret(const u64* table, volatile u64* control, u64* stop, u64 seq, u64 timeout_ns,
                                           u32 system_scope) {
    Faults faults = {control + 1 + (u64)COLLC_CONTROL_WORDS * blockIdx.x, stop, seq};
    const u8* image = (const u8*)table[4 * blockIdx.x];
    u64* state = (u64*)table[4 * blockIdx.x + 1];
    const u64* all_bases = (const u64*)table[4 * blockIdx.x + 2];
    u32 local_block = (u32)table[4 * blockIdx.x + 3];
    const Header* h = (const Header*)image;
    bool system = system_scope != 0;
    if (h->magic != COLLC_MAGIC || h->version != COLLC_VERSION) {
        if (threadIdx.x == 0) record_fault(faults, CODE_BAD_IMAGE, 0, 0, 0, h->magic, h->version, 0);
        return;
    }
    if (local_block >= h->n_blocks) return;
    const BlockDesc* block = (const BlockDesc*)(image + h->blocks) + local_block;
    const PlanDesc* plan = (const PlanDesc*)(image + h->plans) + block->plan;
    const u32* order = (const u32*)(image + plan->order);
    const u32 lane = block->lane;
    __shared__ Decision decision;
    __shared__ int halt, advance;
    __shared__ u64 bases[MAX_BUFS];
    for (u32 b = threadIdx.x; b < plan->n_bufs && b < MAX_BUFS; b += blockDim.x) bases[b] = all_bases[plan->bases_at + b];

    if (threadIdx.x == 0) {
        const DLink* links = (const DLink*)(image + plan->links);
        for (u32 l = 0; l < plan->n_links; l++) {
            if (links[l].channel != block->channel) continue;
            u64* conn = conn_record(state, h, lane, links[l].conn);
            *link_start_word(state, plan, lane, l) = *(volatile u64*)&conn[links[l].sending ? C_TAIL : C_HEAD];
        }
        halt = 0;
    }
    __syncthreads();
    u64 last_progress = now_ns();
    for (u32 t = lane; t < plan->n_tiles; t += plan->lanes) {
        u64 gen = generation(plan, seq, t);
        last_progress = now_ns();
        for (;;) {
            int fired = 0, pending = 0;
            for (u32 k = 0; k < block->count; k++) {
                u32 i = order[block->first + k];
                if (threadIdx.x == 0) {
                    decision.fire = 0;
                    if (*(volatile u64*)done_word(state, plan, lane, i) < gen) {
                        decision.fire = ready(image, state, faults, h, plan, lane, i, t, seq, system, &decision) ? 1 : -1;
                        // A mismatch was recorded: stop before anything else is sent.
                        if (decision.fire == -1 && stopping(faults)) halt = 1;
                    }
                }
                __syncthreads();
                if (halt) return;
                int fire = decision.fire;
                if (fire == 1) {
                    execute(image, bases, plan, &decision, t);
                    __syncthreads();
                    if (threadIdx.x == 0) {
                        if (decision.send_conn) {
                            u32 slot = (u32)(decision.send_m % COLLC_SLOTS);
                            decision.send_conn[C_STAMPS + 2 * slot] = seq;
                            decision.send_conn[C_STAMPS + 2 * slot + 1] = plan->fingerprint;
                            store_release(&decision.send_conn[C_TAIL], decision.send_m + 1, system);
                        }
                        if (decision.recv_conn) store_release(&decision.recv_conn[C_HEAD], decision.recv_m + 1, system);
                        store_release(done_word(state, plan, lane, i), gen, system);
                    }
                    fired = 1;
                } else if (fire == -1) {
                    pending = 1;
                }
                __syncthreads();
            }
            if (fired) last_progress = now_ns();
            if (!pending) break;
            if (threadIdx.x == 0) {
                u64 now = now_ns();
                if (stopping(faults)) {
                    halt = 1;
                } else if (control[0] == seq) {
                    record_fault(faults, CODE_ABORTED, plan->rank, order[block->first], t, 0, 0, 0);
                    halt = 1;
                } else if (now - last_progress > timeout_ns) {
                    u32 first = order[block->first];
                    for (u32 k = 0; k < block->count; k++) {
                        u32 i = order[block->first + k];
                        if (*(volatile u64*)done_word(state, plan, lane, i) < gen) { first = i; break; }
                    }
                    record_fault(faults, CODE_TIMEOUT, plan->rank, first, t, 0, 0, 0);
                    halt = 1;
                }
            }
            __syncthreads();
            if (halt) return;
        }
    }
    if (!plan->avg) return;
    // The epilogue (avg's division, or a premulsum's factor on an output window no instruction wrote): every block of
    // the plan arrives (its own word set to this call's sequence number), then each does its share of the window.
    if (threadIdx.x == 0) {
        store_release(&state[plan->finished_at + block->index_in_plan], seq, system);
        advance = 1;
        u64 since = now_ns();
        for (u32 b = 0; b < block->plan_blocks && advance;) {
            if (load_acquire(&state[plan->finished_at + b], system) >= seq) {
                b++;
            } else if (stopping(faults)) {
                advance = 0;
            } else if (control[0] == seq || now_ns() - since > timeout_ns) {
                u64 what = control[0] == seq ? CODE_ABORTED : CODE_TIMEOUT;
                record_fault(faults, what, plan->rank, order[block->first], plan->n_tiles - 1, 0, 0, 0);
                advance = 0;
            }
        }
    }
    __syncthreads();
    if (!advance) return;
    // Each block takes its share of each range: the window for avg, the unwritten ranges for premulsum.
    const u64* ranges = (const u64*)(image + plan->unscaled);
    u32 n_ranges = plan->avg == 2 ? plan->n_unscaled : 1;
    for (u32 r = 0; r < n_ranges; r++) {
        u64 lo = plan->avg == 2 ? ranges[2 * r] : plan->out_lo;
        u64 hi = plan->avg == 2 ? ranges[2 * r + 1] : plan->out_hi;
        u64 share = (hi - lo + block->plan_blocks - 1) / block->plan_blocks;
        u64 start = lo + share * block->index_in_plan;
        if (start > hi) start = hi;
        u64 end = start + share < hi ? start + share : hi;
        u8* base = (u8*)bases[plan->out_buf] + start * plan->elem;
        if (plan->avg == 2) premul_any(plan->dtype, base, base, true, 0, false, plan->factor, end - start, threadIdx.x, blockDim.x);
        else divide_range(plan->dtype, base, end - start, plan->n_ranks, threadIdx.x, blockDim.x);
    }
}
