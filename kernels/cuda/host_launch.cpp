// Launches of the kernels compiled for the CPU (see host.h): a grid of blocks, each an OS thread running its
// threads as coroutines. The entry points take the grid and block sizes, then the kernel's own parameters.

#include <functional>
#include <memory>
#include <thread>
#include <ucontext.h>
#include <vector>

thread_local collc_dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace {

// Enough for the interpreter's frames, which are small: no recursion, no large locals.
const size_t STACK_BYTES = 256 << 10;

struct Block {
    ucontext_t scheduler;
    std::vector<ucontext_t> threads;
    std::vector<std::unique_ptr<char[]>> stacks;
    std::vector<bool> finished;
    unsigned current = 0;
    const std::function<void()>* body = nullptr;
};

thread_local Block* running;

void thread_main() {
    (*running->body)();
    running->finished[running->current] = true;
    // Returning resumes the scheduler (uc_link).
}

void run_block(unsigned index, unsigned grid, unsigned threads, const std::function<void()>& body) {
    blockIdx = {index, 0, 0};
    gridDim = {grid, 1, 1};
    blockDim = {threads, 1, 1};
    Block block;
    block.body = &body;
    block.threads.resize(threads);
    block.finished.assign(threads, false);
    for (unsigned t = 0; t < threads; t++) {
        block.stacks.emplace_back(new char[STACK_BYTES]);
        ucontext_t* context = &block.threads[t];
        getcontext(context);
        context->uc_stack.ss_sp = block.stacks[t].get();
        context->uc_stack.ss_size = STACK_BYTES;
        context->uc_link = &block.scheduler;
        makecontext(context, thread_main, 0);
    }
    running = &block;
    // A round runs every live thread to its next barrier (or its end): the threads of one barrier interval.
    for (unsigned round = 0;; round++) {
        bool live = false;
        for (unsigned k = 0; k < threads; k++) {
            unsigned t = round % 2 == 0 ? k : threads - 1 - k;
            if (block.finished[t]) continue;
            block.current = t;
            threadIdx = {t, 0, 0};
            swapcontext(&block.scheduler, &block.threads[t]);
            live = live || !block.finished[t];
        }
        if (!live) break;
    }
    running = nullptr;
}

void run_grid(unsigned grid, unsigned threads, const std::function<void()>& body) {
    std::vector<std::thread> blocks;
    for (unsigned b = 0; b < grid; b++) blocks.emplace_back(run_block, b, grid, threads, std::cref(body));
    for (std::thread& block : blocks) block.join();
}

}  // namespace

void __syncthreads() {
    Block* block = running;
    swapcontext(&block->threads[block->current], &block->scheduler);
}

extern "C" void collc_host_interpret(unsigned grid, unsigned threads, const u64* table, volatile u64* control,
                                     u64* stop, u64 seq, u64 timeout_ns, u32 system_scope) {
    run_grid(grid, threads, [=] { collc_interpret(table, control, stop, seq, timeout_ns, system_scope); });
}

extern "C" void collc_host_copy(unsigned grid, unsigned threads, u8* dst, const u8* src, u64 bytes) {
    run_grid(grid, threads, [=] { collc_copy(dst, src, bytes); });
}

extern "C" void collc_host_reduce(unsigned grid, unsigned threads, u32 dtype, u32 op, void* dst, const void* a,
                                  const void* b, u64 n) {
    run_grid(grid, threads, [=] { collc_reduce(dtype, op, dst, a, b, n); });
}

extern "C" void collc_host_divide(unsigned grid, unsigned threads, u32 dtype, void* buf, u64 n, u32 ranks) {
    run_grid(grid, threads, [=] { collc_divide(dtype, buf, n, ranks); });
}
