/* MPI_Allreduce benchmark that prints the nccl-tests all_reduce_perf table, so that collc's own runs and an MPI
 * library's can be parsed by the same script (bench/allreduce_vs_mpi.sh).
 *
 * Build: mpicc -O2 -o mpi_allreduce bench/mpi_allreduce.c
 * Run:   mpirun -np 2 ./mpi_allreduce -b 8 -e 256M -f 4 -n 20 -w 5 -c 1
 *
 * Flags (nccl-tests meanings): -b min bytes, -e max bytes (K/M/G suffixes, powers of 1024), -f multiplication factor
 * between sizes (or -i increment in bytes when -f is 1), -n timed iterations, -w warmup iterations, -c 1|0 check
 * results. dtype float, op sum. Sizes run min, min*f, ... while <= max (like nccl-tests, max itself is only hit when
 * it is on that sequence). Per size: warmup, MPI_Barrier, n back-to-back calls timed with MPI_Wtime; the reported
 * time is elapsed/n, the maximum over ranks (before the sweep, -w calls at the largest and at the smallest size, as
 * nccl-tests does). algbw = size/time (GB = 1e9 B), busbw = algbw * 2(p-1)/p.
 * Out of place uses separate send/recv buffers, in place uses MPI_IN_PLACE. Buffers are allocated once at the
 * largest size and reused for every size.
 *
 * Check (-c 1): inputs are small integers that depend on rank and index, so float sums are exact and the check is
 * bit-exact; #wrong is the number of wrong elements summed over ranks. Exit status 1 when any is wrong. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [-b MIN] [-e MAX] [-f FACTOR] [-i INCREMENT] [-n ITERS] [-w WARMUP] [-c 0|1]\n"
            "  sizes in bytes, K/M/G suffixes are powers of 1024; dtype float, op sum\n",
            prog);
}

static int parse_size(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return -1;
    double mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b') end++;
    if (*end != '\0') return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *s, long *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0') return -1;
    *out = v;
    return 0;
}

/* Input of `rank` at element i: an integer in [-30, 30]. Sums over any realistic rank count stay far below 2^24,
 * so every partial sum is exact in float whatever order the reduction takes. */
static inline float input_value(int rank, size_t i) {
    return (float)((long)((i * (size_t)(2 * rank + 1) + (size_t)rank * 7u) % 61u) - 30);
}

static void fill(float *buf, size_t count, int rank) {
    for (size_t i = 0; i < count; i++) buf[i] = input_value(rank, i);
}

static long count_wrong(const float *buf, size_t count, int nranks) {
    long wrong = 0;
    for (size_t i = 0; i < count; i++) {
        float expect = 0;
        for (int r = 0; r < nranks; r++) expect += input_value(r, i);
        if (buf[i] != expect) wrong++;
    }
    return wrong;
}

/* Times `iters` back-to-back allreduces (after `warmup` untimed ones); returns seconds per call, max over ranks. */
static double time_allreduce(const void *send, float *recv, size_t count, int iters, int warmup) {
    for (int i = 0; i < warmup; i++) MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++) MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double mine = (MPI_Wtime() - t0) / (iters > 0 ? iters : 1), slowest = 0;
    MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    return slowest;
}

static long total_wrong(long mine) {
    long all = 0;
    MPI_Reduce(&mine, &all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    return all;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, nranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    size_t min_bytes = 32u << 20, max_bytes = 32u << 20, step_bytes = 1u << 20;
    double factor = 1;
    long iters = 20, warmup = 1, check = 1;
    for (int a = 1; a < argc; a++) {
        const char *f = argv[a];
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        int bad = v == NULL || f[0] != '-' || f[1] == '\0' || f[2] != '\0';
        if (!bad) {
            switch (f[1]) {
            case 'b': bad = parse_size(v, &min_bytes); break;
            case 'e': bad = parse_size(v, &max_bytes); break;
            case 'i': bad = parse_size(v, &step_bytes); break;
            case 'f': { char *end; factor = strtod(v, &end); bad = end == v || *end != '\0' || factor < 1; break; }
            case 'n': bad = parse_int(v, &iters) || iters < 1; break;
            case 'w': bad = parse_int(v, &warmup) || warmup < 0; break;
            case 'c': bad = parse_int(v, &check); break;
            default: bad = 1;
            }
        }
        if (bad) {
            if (rank == 0) {
                fprintf(stderr, "%s: bad argument '%s%s%s'\n", argv[0], f, v ? " " : "", v ? v : "");
                usage(argv[0]);
            }
            MPI_Finalize();
            return 2;
        }
        a++;
    }
    if (max_bytes < min_bytes) max_bytes = min_bytes;
    if (factor <= 1 && step_bytes == 0) step_bytes = 1;
    if ((max_bytes / sizeof(float)) > (size_t)INT32_MAX) {
        if (rank == 0) fprintf(stderr, "%s: -e too large for an int element count\n", argv[0]);
        MPI_Finalize();
        return 2;
    }

    size_t max_count = max_bytes / sizeof(float);
    size_t alloc = (max_count ? max_count : 1) * sizeof(float);
    float *send = NULL, *recv = NULL;
    if (posix_memalign((void **)&send, 4096, alloc) || posix_memalign((void **)&recv, 4096, alloc)) {
        fprintf(stderr, "rank %d: cannot allocate 2 x %zu bytes\n", rank, alloc);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(send, 0, alloc); /* fault every page in before timing */
    memset(recv, 0, alloc);

    if (rank == 0) {
        printf("# mpi_allreduce: nranks %d minBytes %zu maxBytes %zu step: %s%g iters: %ld warmup: %ld check: %ld\n",
               nranks, min_bytes, max_bytes, factor > 1 ? "x" : "+", factor > 1 ? factor : (double)step_bytes,
               iters, warmup, check);
        printf("#\n");
        printf("#                                                              out-of-place                       in-place          \n");
        printf("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n");
        printf("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n");
        fflush(stdout);
    }

    /* Like nccl-tests: warm up once at the largest and once at the smallest size before the sweep, so that the first
     * row does not pay for connection setup and first-touch costs. */
    for (int i = 0; i < warmup; i++)
        MPI_Allreduce(send, recv, (int)max_count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < warmup; i++)
        MPI_Allreduce(send, recv, (int)(min_bytes / sizeof(float)), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

    double bw_sum = 0;
    long bw_rows = 0, errors = 0;
    const double busbw_factor = 2.0 * (nranks - 1) / nranks;
    for (size_t size = min_bytes; size <= max_bytes;) {
        size_t count = size / sizeof(float), bytes = count * sizeof(float);
        double t[2];
        char wrong_str[2][24];
        for (int in_place = 0; in_place < 2; in_place++) {
            long wrong = 0;
            if (!in_place) {
                if (check) fill(send, count, rank);
                t[0] = time_allreduce(send, recv, count, (int)iters, (int)warmup);
                if (check) wrong = count_wrong(recv, count, nranks); /* every timed call wrote the same sums */
            } else {
                /* In place the data grows with every call; time it, then refill and check one call. */
                t[1] = time_allreduce(MPI_IN_PLACE, recv, count, (int)iters, (int)warmup);
                if (check) {
                    fill(recv, count, rank);
                    MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                    wrong = count_wrong(recv, count, nranks);
                }
            }
            if (check) {
                long all = total_wrong(wrong);
                errors += all;
                snprintf(wrong_str[in_place], sizeof wrong_str[in_place], "%ld", all);
            } else {
                snprintf(wrong_str[in_place], sizeof wrong_str[in_place], "N/A");
            }
        }
        if (rank == 0) {
            double algbw[2], busbw[2];
            for (int k = 0; k < 2; k++) {
                algbw[k] = t[k] > 0 ? (double)bytes / t[k] / 1e9 : 0;
                busbw[k] = algbw[k] * busbw_factor;
                bw_sum += busbw[k];
                bw_rows++;
            }
            printf("%12zu %13zu %9s %7s %7d %8.2f %7.2f %7.2f %6s %8.2f %7.2f %7.2f %6s\n", bytes, count, "float",
                   "sum", -1, t[0] * 1e6, algbw[0], busbw[0], wrong_str[0], t[1] * 1e6, algbw[1], busbw[1],
                   wrong_str[1]);
            fflush(stdout);
        }
        size_t next = factor > 1 ? (size_t)((double)size * factor) : size + step_bytes;
        if (next <= size) break;
        size = next;
    }
    if (rank == 0) {
        printf("# Out of bounds values : %ld %s\n", errors, errors ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n", bw_rows ? bw_sum / bw_rows : 0.0);
        printf("#\n");
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return errors ? 1 : 0;
}
