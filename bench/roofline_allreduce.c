/* The host roofline of an allreduce between threads of one process (issue 34): for two threads a hand-written
 * one-shot in which each reads its own and its peer's input in place, writes the sum into its own output, and
 * meets the other at a barrier (one flag; spinning, then yielding, then sleeping on it) per call:
 * one read of every input and one write per rank, the least memory traffic an allreduce of threads can do. For
 * more threads, the two-shot that is the least traffic there (see `allreduce`). It prints the nccl-tests all_reduce_perf table (out-of-place columns; the
 * in-place ones are "-", a one-shot in place needs a copy), so bench/host_roofline.sh parses it as collc's and
 * MPI's tables.
 *
 * Build: cc -O3 -march=native -pthread -o roofline_allreduce bench/roofline_allreduce.c
 * Run:   ./roofline_allreduce -t 2 -b 8 -e 256M -f 4 -n 20 -w 5 -c 1
 *
 * Flags as bench/mpi_allreduce.c's, plus -t THREADS (the ranks). dtype float, op sum; every thread adds the inputs
 * in rank order, so all outputs are the same bits. Per size: -w calls, then -n calls timed by thread 0 from the
 * barrier before the first to the barrier after the last; time = elapsed / n. algbw = size / time (GB = 1e9 B),
 * busbw = algbw * 2(p-1)/p. Inputs are small integers, so the check (-c 1) is exact. */
#define _GNU_SOURCE
#include <pthread.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int threads = 2;
static size_t min_bytes = 8, max_bytes = 256u << 20, increment = 0;
static long factor = 4, iters = 20, warmup = 5, check = 0;
static float **in, **out;
static _Atomic long arrived;
static _Atomic int generation;
static long wrong;

static int parse_size(const char *s, size_t *v) {
    char *end;
    double d = strtod(s, &end);
    if (end == s || d < 0) return -1;
    double m = 1;
    if (*end == 'k' || *end == 'K') m = 1024.0, end++;
    else if (*end == 'm' || *end == 'M') m = 1024.0 * 1024, end++;
    else if (*end == 'g' || *end == 'G') m = 1024.0 * 1024 * 1024, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    *v = (size_t)(d * m);
    return 0;
}

static inline float input_value(int rank, size_t i) {
    return (float)((long)((i * (size_t)(2 * rank + 1) + (size_t)rank * 7u) % 61u) - 30);
}

/* A counting barrier: the last thread to arrive opens the next generation and wakes the sleepers. A waiter spins a
 * little, then yields its core, then sleeps on the generation (futex): with more threads than cores a spinning
 * waiter would hold the core the last arriver needs (collc's waits spin, then yield, then sleep alike). */
static void barrier(void) {
    int gen = atomic_load_explicit(&generation, memory_order_acquire);
    if (atomic_fetch_add_explicit(&arrived, 1, memory_order_acq_rel) == threads - 1) {
        atomic_store_explicit(&arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&generation, gen + 1, memory_order_release);
        syscall(SYS_futex, &generation, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
        return;
    }
    for (long spins = 0; atomic_load_explicit(&generation, memory_order_acquire) == gen; spins++) {
        if (spins < 200) __builtin_ia32_pause();
        else if (spins < 20000) sched_yield();
        else syscall(SYS_futex, &generation, FUTEX_WAIT_PRIVATE, gen, NULL, NULL, 0);
    }
}

/* One call on rank `rank`. Two ranks: a one-shot (each reads both inputs in place and writes the sum). More: a
 * two-shot, the least traffic for p > 2 (a one-shot reads p inputs a rank): rank r sums block r of every input into
 * its output, then, after a barrier, copies block q of rank q's output for every other q. */
static void allreduce(int rank, size_t count) {
    float *restrict dst = out[rank];
    if (threads <= 2) {
        const float *restrict a = in[0], *restrict b = in[threads - 1];
        if (threads == 1) {
            for (size_t i = 0; i < count; i++) dst[i] = a[i];
            return;
        }
        for (size_t i = 0; i < count; i++) dst[i] = a[i] + b[i];
        return;
    }
    size_t block = (count + (size_t)threads - 1) / (size_t)threads;
    size_t lo = block * (size_t)rank < count ? block * (size_t)rank : count;
    size_t hi = lo + block < count ? lo + block : count;
    for (size_t i = lo; i < hi; i++) dst[i] = in[0][i];
    for (int r = 1; r < threads; r++) {
        const float *restrict b = in[r];
        for (size_t i = lo; i < hi; i++) dst[i] += b[i];
    }
    barrier();
    for (int q = 0; q < threads; q++) {
        if (q == rank) continue;
        size_t qlo = block * (size_t)q < count ? block * (size_t)q : count;
        size_t qhi = qlo + block < count ? qlo + block : count;
        memcpy(dst + qlo, out[q] + qlo, (qhi - qlo) * sizeof(float));
    }
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *rank_main(void *arg) {
    int rank = (int)(intptr_t)arg;
    size_t max_count = max_bytes / sizeof(float);
    /* Each rank touches its own pages first (on its own NUMA node, where there are several). */
    in[rank] = aligned_alloc(64, (max_count * sizeof(float) + 63) / 64 * 64 + 64);
    out[rank] = aligned_alloc(64, (max_count * sizeof(float) + 63) / 64 * 64 + 64);
    for (size_t i = 0; i < max_count; i++) in[rank][i] = input_value(rank, i), out[rank][i] = 0;
    barrier();
    for (size_t bytes = min_bytes; bytes <= max_bytes;
         bytes = factor > 1 ? bytes * (size_t)factor : bytes + (increment ? increment : bytes)) {
        size_t count = bytes / sizeof(float);
        for (long w = 0; w < warmup; w++) barrier(), allreduce(rank, count);
        barrier();
        double start = now();
        for (long k = 0; k < iters; k++) {
            allreduce(rank, count);
            barrier();
        }
        double elapsed = now() - start;
        if (check) {
            long bad = 0;
            for (size_t i = 0; i < count; i++) {
                float want = 0;
                for (int r = 0; r < threads; r++) want += input_value(r, i);
                bad += out[rank][i] != want;
            }
            __atomic_fetch_add(&wrong, bad, __ATOMIC_RELAXED);
        }
        barrier();
        if (rank == 0) {
            double t = elapsed / (double)iters, algbw = (double)bytes / t / 1e9;
            double busbw = algbw * 2.0 * (threads - 1) / threads;
            printf("%12zu  %12zu  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %6ld  %7s  %6s  %6s  %6s\n", bytes, count,
                   "float", "sum", -1, t * 1e6, algbw, busbw, wrong, "-", "-", "-", "-");
            wrong = 0;
        }
        barrier();
        if (factor <= 1 && !increment && bytes == max_bytes) break;
    }
    return NULL;
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        int bad = 0;
        if (!strcmp(f, "-t")) threads = atoi(v), bad = threads < 1;
        else if (!strcmp(f, "-b")) bad = parse_size(v, &min_bytes);
        else if (!strcmp(f, "-e")) bad = parse_size(v, &max_bytes);
        else if (!strcmp(f, "-i")) bad = parse_size(v, &increment);
        else if (!strcmp(f, "-f")) factor = atol(v);
        else if (!strcmp(f, "-n")) iters = atol(v), bad = iters < 1;
        else if (!strcmp(f, "-w")) warmup = atol(v);
        else if (!strcmp(f, "-c")) check = atol(v);
        else bad = 1;
        if (bad) {
            fprintf(stderr, "usage: %s [-t THREADS] [-b MIN] [-e MAX] [-f FACTOR] [-i INC] [-n ITERS] [-w WARMUP] "
                            "[-c 0|1]\n", argv[0]);
            return 2;
        }
    }
    in = calloc((size_t)threads, sizeof *in);
    out = calloc((size_t)threads, sizeof *out);
    printf("# roofline_allreduce: %s allreduce of %d threads reading each other's memory in place\n",
           threads <= 2 ? "one-shot" : "two-shot", threads);
    printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw "
           "  busbw #wrong\n");
    pthread_t *t = calloc((size_t)threads, sizeof *t);
    for (int r = 1; r < threads; r++) pthread_create(&t[r], NULL, rank_main, (void *)(intptr_t)r);
    rank_main(0);
    for (int r = 1; r < threads; r++) pthread_join(t[r], NULL);
    return 0;
}
