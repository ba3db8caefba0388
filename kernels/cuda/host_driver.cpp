// A CUDA driver for the CPU: the entry points of libcuda.so that collc calls, over host memory, running the
// kernels compiled for the CPU (host.h, host_launch.cpp). Built as a libcuda.so of its own and put first on
// LD_LIBRARY_PATH, it lets the whole cuda transport (the fabrics, the launcher, the CLI, tests/gpu/run.sh) run
// where no GPU is. It is a test double, not an emulator of a GPU's speed or memory model.
//
// What it models: COLLC_HOST_GPUS devices (default 1) of COLLC_HOST_GPU_SMS SMs (default 4), each SM holding 16
// interpreter blocks; device memory is memfd-backed shared memory, so CUDA IPC handles name a process and a file
// descriptor, which another process maps through /proc; host-mapped memory is the same address on both sides; a
// stream is a worker thread running its launches and copies in order; a kernel runs min(block, 4) threads a block.
// COLLC_HOST_GPU_PEER=0 makes every pair of devices refuse peer access; COLLC_HOST_GPU_MEMORY (bytes) bounds each
// device's memory, beyond which cuMemAlloc is out of memory. GPUDirect RDMA: an allocation's dma-buf is its memfd
// (cuMemGetHandleForAddressRange, for a range from the allocation's start), which a verbs library maps; a flush of
// RDMA writes is a fence, host memory being coherent; COLLC_HOST_GPU_DMABUF=0 makes the devices not support dma-buf.

#include <fcntl.h>
#include <map>
#include <mutex>
#include <condition_variable>
#include <deque>
#include <set>
#include <stdio.h>
#include <string>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

namespace {

typedef int CUresult;
const CUresult SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101,
               INVALID_CONTEXT = 201, INVALID_PTX = 218, INVALID_HANDLE = 400, NOT_FOUND = 500, NOT_READY = 600,
               PEER_ACCESS_ALREADY_ENABLED = 704, COOPERATIVE_LAUNCH_TOO_LARGE = 720, NOT_SUPPORTED = 801;
const int BLOCKS_PER_SM = 16;
const unsigned MAX_THREADS = 4;
const unsigned long long IPC_MAGIC = 0x4350495f434c4c43ull;  // "CLLC_IPC"

int env_int(const char* name, int fallback) {
    const char* text = getenv(name);
    return text && *text ? atoi(text) : fallback;
}
// At most 64: the contexts and the memory counts are fixed arrays of 64.
int devices() {
    int n = env_int("COLLC_HOST_GPUS", 1);
    return n < 64 ? n : 64;
}
int sms() { return env_int("COLLC_HOST_GPU_SMS", 4); }

bool initialised = false;
thread_local int current = -1;

struct Context {
    int device;
};
Context contexts[64];

enum Kind { DEVICE, HOST, MAPPED };
struct Allocation {
    size_t bytes;
    int device;
    Kind kind;
    int fd;  // DEVICE: the memfd; -1 otherwise
};
std::mutex allocations_lock;
std::map<unsigned long long, Allocation> allocations;
std::set<std::pair<int, int>> peers_enabled;
unsigned long long allocated[64];

// The allocation holding `addr`, if any (under the lock).
const std::pair<const unsigned long long, Allocation>* find(unsigned long long addr) {
    auto it = allocations.upper_bound(addr);
    if (it == allocations.begin()) return nullptr;
    --it;
    if (addr >= it->first + (it->second.bytes ? it->second.bytes : 1)) return nullptr;
    return &*it;
}

struct Module {
    int device;
};
struct Function {
    const char* name;
    int device;
};

struct Stream {
    std::mutex lock;
    std::condition_variable changed;
    std::deque<std::function<void()>> queue;
    bool busy = false;
    std::thread worker;

    Stream() : worker([this] { run(); }) { worker.detach(); }
    void run() {
        for (;;) {
            std::function<void()> job;
            {
                std::unique_lock<std::mutex> guard(lock);
                changed.wait(guard, [this] { return !queue.empty(); });
                job = std::move(queue.front());
                busy = true;
            }
            job();
            std::lock_guard<std::mutex> guard(lock);
            queue.pop_front();
            busy = false;
            changed.notify_all();
        }
    }
    void push(std::function<void()> job) {
        std::lock_guard<std::mutex> guard(lock);
        queue.push_back(std::move(job));
        changed.notify_all();
    }
    bool idle() {
        std::lock_guard<std::mutex> guard(lock);
        return queue.empty() && !busy;
    }
    void wait() {
        std::unique_lock<std::mutex> guard(lock);
        changed.wait(guard, [this] { return queue.empty() && !busy; });
    }
};

// The kernel of `f` with the parameters `params` points at, as a job for a stream.
CUresult job_of(const Function* f, unsigned grid, unsigned block, void** params, std::function<void()>* job) {
    unsigned threads = block < MAX_THREADS ? block : MAX_THREADS;
    auto u64_at = [&](int i) { return *(const u64*)params[i]; };
    auto u32_at = [&](int i) { return *(const u32*)params[i]; };
    std::string name = f->name;
    if (name == "collc_interpret") {
        const u64* table = (const u64*)u64_at(0);
        volatile u64* control = (volatile u64*)u64_at(1);
        u64* stop = (u64*)u64_at(2);
        u64 seq = u64_at(3), timeout = u64_at(4);
        u32 system = u32_at(5);
        *job = [=] { collc_host_interpret(grid, threads, table, control, stop, seq, timeout, system); };
    } else if (name == "collc_copy") {
        u8* dst = (u8*)u64_at(0);
        const u8* src = (const u8*)u64_at(1);
        u64 bytes = u64_at(2);
        *job = [=] { collc_host_copy(grid, threads, dst, src, bytes); };
    } else if (name == "collc_reduce") {
        u32 dtype = u32_at(0), op = u32_at(1);
        void* dst = (void*)u64_at(2);
        const void* a = (const void*)u64_at(3);
        const void* b = (const void*)u64_at(4);
        u64 n = u64_at(5);
        *job = [=] { collc_host_reduce(grid, threads, dtype, op, dst, a, b, n); };
    } else if (name == "collc_divide") {
        u32 dtype = u32_at(0);
        void* buf = (void*)u64_at(1);
        u64 n = u64_at(2);
        u32 ranks = u32_at(3);
        *job = [=] { collc_host_divide(grid, threads, dtype, buf, n, ranks); };
    } else if (name == "collc_empty") {
        *job = [] {};
    } else {
        return NOT_FOUND;
    }
    return SUCCESS;
}

const char* ENTRIES[] = {"collc_interpret", "collc_copy", "collc_reduce", "collc_divide", "collc_empty"};

}  // namespace

extern "C" {

CUresult cuInit(unsigned flags) {
    if (flags != 0) return INVALID_VALUE;
    initialised = true;
    return SUCCESS;
}

// NVRTC looks this private table up in whatever libcuda.so.1 the process has (and crashes where the symbol is
// missing); it has nothing to find here.
CUresult cuGetExportTable(const void** table, const void* id) {
    (void)id;
    *table = nullptr;
    return NOT_FOUND;
}

CUresult cuDriverGetVersion(int* version) {
    *version = 13000;
    return SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char** text) {
    switch (error) {
    case SUCCESS: *text = "no error"; break;
    case INVALID_VALUE: *text = "invalid argument"; break;
    case OUT_OF_MEMORY: *text = "out of memory"; break;
    case NOT_INITIALIZED: *text = "initialization error"; break;
    case INVALID_DEVICE: *text = "invalid device ordinal"; break;
    case INVALID_CONTEXT: *text = "invalid device context"; break;
    case INVALID_PTX: *text = "a PTX JIT compilation failed"; break;
    case INVALID_HANDLE: *text = "invalid resource handle"; break;
    case NOT_FOUND: *text = "named symbol not found"; break;
    case NOT_READY: *text = "device not ready"; break;
    case PEER_ACCESS_ALREADY_ENABLED: *text = "peer access is already enabled"; break;
    case COOPERATIVE_LAUNCH_TOO_LARGE: *text = "too many blocks in cooperative launch"; break;
    default: *text = nullptr; return INVALID_VALUE;
    }
    return SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
    if (!initialised) return NOT_INITIALIZED;
    *count = devices();
    return SUCCESS;
}

CUresult cuDeviceGet(int* device, int ordinal) {
    if (!initialised) return NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= devices()) return INVALID_DEVICE;
    *device = ordinal;
    return SUCCESS;
}

CUresult cuDeviceGetName(char* name, int length, int device) {
    if (device < 0 || device >= devices()) return INVALID_DEVICE;
    snprintf(name, length, "collc host GPU %d (the CPU; kernels/cuda/host_driver.cpp)", device);
    return SUCCESS;
}

CUresult cuDeviceGetAttribute(int* value, int attribute, int device) {
    if (device < 0 || device >= devices()) return INVALID_DEVICE;
    switch (attribute) {
    case 16: *value = sms(); break;       // MULTIPROCESSOR_COUNT
    case 95: *value = 1; break;           // COOPERATIVE_LAUNCH
    case 75: *value = 9; break;           // COMPUTE_CAPABILITY_MAJOR
    case 76: *value = 0; break;           // COMPUTE_CAPABILITY_MINOR
    case 116: *value = 1; break;          // GPU_DIRECT_RDMA_SUPPORTED
    case 124: *value = env_int("COLLC_HOST_GPU_DMABUF", 1) != 0; break;  // DMA_BUF_SUPPORTED
    default: return INVALID_VALUE;
    }
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(void** ctx, int device) {
    if (device < 0 || device >= devices()) return INVALID_DEVICE;
    contexts[device].device = device;
    *ctx = &contexts[device];
    return SUCCESS;
}

CUresult cuCtxSetCurrent(void* ctx) {
    current = ctx ? ((Context*)ctx)->device : -1;
    return SUCCESS;
}

CUresult cuDeviceCanAccessPeer(int* can, int device, int peer) {
    if (device < 0 || device >= devices() || peer < 0 || peer >= devices()) return INVALID_DEVICE;
    *can = env_int("COLLC_HOST_GPU_PEER", 1) != 0 && device != peer;
    return SUCCESS;
}

CUresult cuCtxEnablePeerAccess(void* peer, unsigned flags) {
    if (current < 0) return INVALID_CONTEXT;
    if (flags != 0 || !peer) return INVALID_VALUE;
    std::lock_guard<std::mutex> guard(allocations_lock);
    return peers_enabled.insert({current, ((Context*)peer)->device}).second ? SUCCESS : PEER_ACCESS_ALREADY_ENABLED;
}

CUresult cuModuleLoadData(void** module, const void* image) {
    if (current < 0) return INVALID_CONTEXT;
    // The PTX is not run (the kernels are this library's own), but it must be the kernels'.
    if (!strstr((const char*)image, ".entry collc_interpret(")) return INVALID_PTX;
    // Kernels compiled with a user's operator: this library's own kernels have none (OP_USER traps in them).
    if (strstr((const char*)image, ".entry collc_user_operator(")) return NOT_SUPPORTED;
    *module = new Module{current};
    return SUCCESS;
}

CUresult cuModuleGetFunction(void** function, void* module, const char* name) {
    for (const char* entry : ENTRIES) {
        if (strcmp(entry, name) == 0) {
            *function = new Function{entry, ((Module*)module)->device};
            return SUCCESS;
        }
    }
    return NOT_FOUND;
}

CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, void* function, int block_size, size_t shared) {
    if (!function || block_size <= 0 || shared != 0) return INVALID_VALUE;
    *blocks = BLOCKS_PER_SM;
    return SUCCESS;
}

CUresult cuStreamCreate(void** stream, unsigned flags) {
    if (current < 0) return INVALID_CONTEXT;
    (void)flags;
    *stream = new Stream();
    return SUCCESS;
}

CUresult cuStreamQuery(void* stream) { return ((Stream*)stream)->idle() ? SUCCESS : NOT_READY; }

CUresult cuStreamSynchronize(void* stream) {
    ((Stream*)stream)->wait();
    return SUCCESS;
}

CUresult cuMemAlloc_v2(unsigned long long* ptr, size_t bytes) {
    if (current < 0) return INVALID_CONTEXT;
    if (bytes == 0) return INVALID_VALUE;
    {
        std::lock_guard<std::mutex> guard(allocations_lock);
        const char* limit = getenv("COLLC_HOST_GPU_MEMORY");
        if (limit && *limit && allocated[current] + bytes > strtoull(limit, nullptr, 10)) return OUT_OF_MEMORY;
        allocated[current] += bytes;
    }
    int fd = memfd_create("collc-host-gpu", MFD_CLOEXEC);
    void* memory = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0)
        memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    std::lock_guard<std::mutex> guard(allocations_lock);
    if (memory == MAP_FAILED) {
        if (fd >= 0) close(fd);
        allocated[current] -= bytes;
        return OUT_OF_MEMORY;
    }
    allocations[(unsigned long long)memory] = {bytes, current, DEVICE, fd};
    *ptr = (unsigned long long)memory;
    return SUCCESS;
}

// A dma-buf of device memory: a duplicate of the allocation's memfd, for a page-aligned range that starts where the
// allocation does (a real driver also takes ranges inside one; collc registers whole allocations).
CUresult cuMemGetHandleForAddressRange(void* handle, unsigned long long ptr, size_t bytes, int type,
                                       unsigned long long flags) {
    const int DMA_BUF_FD = 1, NOT_SUPPORTED = 801;
    if (!env_int("COLLC_HOST_GPU_DMABUF", 1)) return NOT_SUPPORTED;
    if (type != DMA_BUF_FD || flags != 0 || !handle || bytes == 0 || ptr % 4096 || bytes % 4096) return INVALID_VALUE;
    std::lock_guard<std::mutex> guard(allocations_lock);
    auto it = allocations.find(ptr);
    if (it == allocations.end() || it->second.kind != DEVICE || bytes > ((it->second.bytes + 4095) & ~4095ull))
        return INVALID_VALUE;
    int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return OUT_OF_MEMORY;
    *(int*)handle = fd;
    return SUCCESS;
}

CUresult cuFlushGPUDirectRDMAWrites(int target, int scope) {
    if (target != 0 || (scope != 100 && scope != 200)) return INVALID_VALUE;
    if (current < 0) return INVALID_CONTEXT;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return SUCCESS;
}

CUresult cuMemFree_v2(unsigned long long ptr) {
    std::lock_guard<std::mutex> guard(allocations_lock);
    auto it = allocations.find(ptr);
    if (it == allocations.end() || it->second.kind != DEVICE) return INVALID_VALUE;
    munmap((void*)ptr, it->second.bytes);
    close(it->second.fd);
    allocated[it->second.device] -= it->second.bytes;
    allocations.erase(it);
    return SUCCESS;
}

// Host-mapped memory allocated so far; `COLLC_HOST_GPU_PINNED` bounds it (bytes), as a host short of pinnable
// memory would.
unsigned long long pinned;

CUresult cuMemHostAlloc(void** host, size_t bytes, unsigned flags) {
    (void)flags;
    {
        std::lock_guard<std::mutex> guard(allocations_lock);
        const char* limit = getenv("COLLC_HOST_GPU_PINNED");
        if (limit && *limit && pinned + bytes > strtoull(limit, nullptr, 10)) return OUT_OF_MEMORY;
        pinned += bytes;
    }
    void* memory = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    std::lock_guard<std::mutex> guard(allocations_lock);
    if (!memory) {
        pinned -= bytes;
        return OUT_OF_MEMORY;
    }
    allocations[(unsigned long long)memory] = {bytes, current, HOST, -1};
    *host = memory;
    return SUCCESS;
}

CUresult cuMemHostGetDevicePointer_v2(unsigned long long* device, void* host, unsigned flags) {
    if (flags != 0) return INVALID_VALUE;
    std::lock_guard<std::mutex> guard(allocations_lock);
    auto found = find((unsigned long long)host);
    if (!found || found->second.kind != HOST) return INVALID_VALUE;
    *device = (unsigned long long)host;
    return SUCCESS;
}

CUresult cuMemFreeHost(void* host) {
    std::lock_guard<std::mutex> guard(allocations_lock);
    auto it = allocations.find((unsigned long long)host);
    if (it == allocations.end() || it->second.kind != HOST) return INVALID_VALUE;
    pinned -= it->second.bytes;
    free(host);
    allocations.erase(it);
    return SUCCESS;
}

CUresult cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
    std::lock_guard<std::mutex> guard(allocations_lock);
    auto found = find(ptr);
    if (!found) return INVALID_VALUE;
    switch (attribute) {
    case 2: *(unsigned*)data = found->second.kind == HOST ? 1 : 2; break;  // MEMORY_TYPE: HOST 1, DEVICE 2
    case 9: *(int*)data = found->second.device; break;                     // DEVICE_ORDINAL
    default: return INVALID_VALUE;
    }
    return SUCCESS;
}

CUresult cuMemsetD8_v2(unsigned long long ptr, unsigned char value, size_t bytes) {
    memset((void*)ptr, value, bytes);
    return SUCCESS;
}

CUresult cuMemcpyHtoD_v2(unsigned long long dst, const void* src, size_t bytes) {
    memcpy((void*)dst, src, bytes);
    return SUCCESS;
}

CUresult cuMemcpyDtoH_v2(void* dst, unsigned long long src, size_t bytes) {
    memcpy(dst, (const void*)src, bytes);
    return SUCCESS;
}

CUresult cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, size_t bytes, void* stream) {
    ((Stream*)stream)->push([=] { memcpy((void*)dst, (const void*)src, bytes); });
    return SUCCESS;
}

CUresult cuLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, void* stream, void** params, void** extra) {
    if (gy != 1 || gz != 1 || by != 1 || bz != 1 || shared != 0 || extra || !stream) return INVALID_VALUE;
    std::function<void()> job;
    CUresult result = job_of((const Function*)function, gx, bx, params, &job);
    if (result == SUCCESS) ((Stream*)stream)->push(std::move(job));
    return result;
}

CUresult cuLaunchCooperativeKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned shared, void* stream, void** params) {
    if (gx > (unsigned)(sms() * BLOCKS_PER_SM)) return COOPERATIVE_LAUNCH_TOO_LARGE;
    return cuLaunchKernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, nullptr);
}

struct IpcHandle {
    unsigned long long magic, pid, fd, bytes;
    char pad[32];
};
static_assert(sizeof(IpcHandle) == 64, "CUipcMemHandle is 64 bytes");

CUresult cuIpcGetMemHandle(IpcHandle* handle, unsigned long long ptr) {
    std::lock_guard<std::mutex> guard(allocations_lock);
    auto it = allocations.find(ptr);
    if (it == allocations.end() || it->second.kind != DEVICE || it->second.fd < 0) return INVALID_VALUE;
    memset(handle, 0, sizeof *handle);
    *handle = {IPC_MAGIC, (unsigned long long)getpid(), (unsigned long long)it->second.fd, it->second.bytes, {}};
    return SUCCESS;
}

CUresult cuIpcOpenMemHandle_v2(unsigned long long* ptr, IpcHandle handle, unsigned flags) {
    (void)flags;
    if (current < 0) return INVALID_CONTEXT;
    // As the driver: a process cannot open its own handle.
    if (handle.magic != IPC_MAGIC || handle.pid == (unsigned long long)getpid()) return INVALID_VALUE;
    char path[64];
    snprintf(path, sizeof path, "/proc/%llu/fd/%llu", handle.pid, handle.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return INVALID_HANDLE;
    void* memory = mmap(nullptr, handle.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (memory == MAP_FAILED) return INVALID_HANDLE;
    std::lock_guard<std::mutex> guard(allocations_lock);
    allocations[(unsigned long long)memory] = {handle.bytes, current, MAPPED, -1};
    *ptr = (unsigned long long)memory;
    return SUCCESS;
}

CUresult cuIpcCloseMemHandle(unsigned long long ptr) {
    std::lock_guard<std::mutex> guard(allocations_lock);
    auto it = allocations.find(ptr);
    if (it == allocations.end() || it->second.kind != MAPPED) return INVALID_VALUE;
    munmap((void*)ptr, it->second.bytes);
    allocations.erase(it);
    return SUCCESS;
}

}  // extern "C"
