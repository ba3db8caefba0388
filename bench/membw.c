/* Memory bandwidth for the allreduce bound in bench/allreduce_vs_mpi.sh: memcpy between two 512 MiB arrays (both
 * touched first so no page faults are timed), best of 5 (MEMBW_REPS overrides). Prints
 *   copy_GBps <bytes copied per second / 1e9>
 *   traffic_GBps <2 x copy_GBps: each copied byte is read once and written once>
 * Build: cc -O2 -o membw bench/membw.c */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void) {
    const size_t bytes = (size_t)512 << 20;
    int reps = 5;
    const char *env = getenv("MEMBW_REPS");
    if (env && atoi(env) > 0) reps = atoi(env);
    char *a = NULL, *b = NULL;
    if (posix_memalign((void **)&a, 4096, bytes) || posix_memalign((void **)&b, 4096, bytes)) {
        fprintf(stderr, "membw: cannot allocate 2 x %zu bytes\n", bytes);
        return 1;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        memcpy(b, a, bytes);
        double t = now() - t0;
        if (t < best) best = t;
        a[(size_t)r * 4096 % bytes] ^= b[bytes - 1 - (size_t)r]; /* keep the copies observable */
    }
    double copy = (double)bytes / best / 1e9;
    printf("copy_GBps %.2f\n", copy);
    printf("traffic_GBps %.2f\n", 2 * copy);
    free(a);
    free(b);
    return 0;
}
