/* The raw TCP stream rate between two hosts (or over the loopback): the limit an allreduce over that link is
 * measured against by bench/tcp_vs_mpi.sh. One connection, one direction, writes of 1 MiB; the receiver prints
 * GB/s (1e9 B) from the first byte it reads to the last.
 *
 * Build: cc -O2 -o tcp_stream bench/tcp_stream.c
 * Run:   tcp_stream recv PORT BYTES            (prints "stream_GBps X")
 *        tcp_stream send HOST PORT BYTES
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1 << 20)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    static char buf[CHUNK];
    memset(buf, 0x5a, sizeof buf);
    if (argc == 4 && strcmp(argv[1], "recv") == 0) {
        long long want = atoll(argv[3]);
        int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2])), .sin_addr.s_addr = INADDR_ANY};
        if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1)) {
            perror("bind/listen");
            return 1;
        }
        int s = accept(l, NULL, NULL);
        long long got = 0;
        double start = 0;
        while (got < want) {
            ssize_t n = read(s, buf, sizeof buf);
            if (n <= 0) break;
            if (got == 0) start = now();
            got += n;
        }
        double took = now() - start;
        printf("stream_GBps %.3f\n", got / took / 1e9);
        return got == want ? 0 : 1;
    }
    if (argc == 5 && strcmp(argv[1], "send") == 0) {
        long long left = atoll(argv[4]);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
        inet_pton(AF_INET, argv[2], &a.sin_addr);
        int s = -1;
        for (int tries = 0; tries < 200; tries++) { /* the receiver may not listen yet */
            s = socket(AF_INET, SOCK_STREAM, 0);
            if (connect(s, (struct sockaddr *)&a, sizeof a) == 0) break;
            close(s);
            s = -1;
            usleep(20000);
        }
        if (s < 0) {
            perror("connect");
            return 1;
        }
        while (left > 0) {
            ssize_t n = write(s, buf, left < CHUNK ? left : CHUNK);
            if (n <= 0) return 1;
            left -= n;
        }
        close(s);
        return 0;
    }
    fprintf(stderr, "usage: %s recv PORT BYTES | %s send HOST PORT BYTES\n", argv[0], argv[0]);
    return 2;
}
