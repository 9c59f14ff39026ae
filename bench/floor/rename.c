/* RENAME back and forth, for bench/plain.py: redis-benchmark cannot repeat a RENAME (its source
 * is gone after the first), so this driver gives each of its clients a pair of keys of its own
 * and has it send RENAME a b, then RENAME b a, then again, one request in flight per client, over
 * non-blocking sockets and one epoll loop (as redis-benchmark -P 1 drives its clients).
 *
 *   rename PORT SECONDS PAIRS-FILE
 *
 * PAIRS-FILE holds one pair a line ("a b", names without spaces); one client per line. The
 * first tenth of SECONDS warms up; then the replies of SECONDS are counted. Prints one line:
 * "ops/s p50-ms p99-ms errors", and the first error reply on stderr. Exit status 1 when a client
 * could not connect or a connection closed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXC 1024
#define BUCKETS 100000 /* latency histogram: 10 us buckets up to 1 s */

struct client {
    int fd;
    char req[2][600];
    int reqlen[2];
    int turn; /* which of the two requests is in flight */
    double sent;
    char in[4096];
    int inlen;
};

static struct client cl[MAXC];
static long hist[BUCKETS];

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int build(char *out, const char *a, const char *b) {
    return snprintf(out, 600, "*3\r\n$6\r\nRENAME\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n", strlen(a), a,
                    strlen(b), b);
}

static int send_req(struct client *c) {
    int n = c->reqlen[c->turn], off = 0;
    c->sent = now_s();
    while (off < n) {
        ssize_t w = write(c->fd, c->req[c->turn] + off, n - off);
        if (w < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue; /* a 60-byte request: the socket buffer has room */
            return -1;
        }
        off += w;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: rename PORT SECONDS PAIRS-FILE\n");
        return 2;
    }
    int port = atoi(argv[1]);
    double seconds = atof(argv[2]);
    FILE *f = fopen(argv[3], "r");
    if (!f) {
        perror(argv[3]);
        return 2;
    }
    int n = 0;
    char a[256], b[256];
    while (n < MAXC && fscanf(f, "%255s %255s", a, b) == 2) {
        cl[n].reqlen[0] = build(cl[n].req[0], a, b);
        cl[n].reqlen[1] = build(cl[n].req[1], b, a);
        n++;
    }
    fclose(f);
    int ep = epoll_create1(0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    for (int i = 0; i < n; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
            perror("connect");
            return 1;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        cl[i].fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
    for (int i = 0; i < n; i++)
        if (send_req(&cl[i]) != 0) {
            perror("write");
            return 1;
        }
    double start = now_s(), warm = start + seconds / 10, end = warm + seconds;
    long done = 0, errors = 0;
    int counting = 0, first_error = 1;
    struct epoll_event evs[MAXC];
    for (;;) {
        int got = epoll_wait(ep, evs, MAXC, 100);
        double t = now_s();
        if (!counting && t >= warm) {
            counting = 1;
            done = errors = 0;
            memset(hist, 0, sizeof hist);
            warm = t;
        }
        if (t >= end)
            break;
        for (int e = 0; e < got; e++) {
            struct client *c = &cl[evs[e].data.u32];
            ssize_t r = read(c->fd, c->in + c->inlen, sizeof c->in - c->inlen - 1);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                fprintf(stderr, "a connection closed\n");
                return 1;
            }
            if (r < 0)
                continue;
            c->inlen += r;
            c->in[c->inlen] = 0;
            char *crlf = strstr(c->in, "\r\n");
            if (!crlf)
                continue; /* the reply is a line: wait for its end */
            if (c->in[0] == '-') {
                errors++;
                if (first_error) {
                    first_error = 0;
                    fprintf(stderr, "%.*s\n", (int)(crlf - c->in), c->in);
                }
            }
            c->inlen = 0;
            double lat = t - c->sent;
            long bucket = (long)(lat * 1e5);
            hist[bucket < BUCKETS ? bucket : BUCKETS - 1]++;
            done++;
            /* After an error (the source missing) the same request again would fail for
             * ever: the other one is sent either way. */
            c->turn ^= 1;
            if (send_req(c) != 0) {
                perror("write");
                return 1;
            }
        }
    }
    double elapsed = now_s() - warm;
    long seen = 0;
    double p50 = 0, p99 = 0;
    int have50 = 0;
    for (long i = 0; i < BUCKETS; i++) {
        seen += hist[i];
        if (!have50 && seen * 2 >= done) {
            p50 = (i + 1) / 100.0;
            have50 = 1;
        }
        if (seen * 100 >= done * 99) {
            p99 = (i + 1) / 100.0;
            break;
        }
    }
    printf("%.1f %.3f %.3f %ld\n", done / elapsed, p50, p99, errors);
    return 0;
}
