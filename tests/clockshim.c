/* clockshim: an LD_PRELOAD shim that moves the wall clock of a process, for tests.
 *
 * libfaketime hangs Debian's redis-server (its dlsym-based interposition and jemalloc's
 * start-up do not get along), so this shim is minimal: it interposes clock_gettime (only
 * CLOCK_REALTIME and CLOCK_REALTIME_COARSE are moved; CLOCK_MONOTONIC and the others pass
 * through), gettimeofday and time, reads the real time with the raw system call (no dlsym, no
 * malloc), and adds an offset in milliseconds.
 *
 * The offset is read on every call from the file named by SHARD_CLOCK_OFFSET_FILE: a signed
 * decimal integer of milliseconds; a missing variable, a missing or empty file, or text that
 * is not a number mean 0. Rewriting the file moves the clock of the running process.
 *
 * gcc -shared -fPIC -O2 -o clockshim.so tests/clockshim.c
 */

#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ms(void) {
    const char *path = getenv("SHARD_CLOCK_OFFSET_FILE");
    if (path == NULL || path[0] == '\0') {
        return 0;
    }
    int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return 0;
    }
    char buf[64];
    long n = (long)syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n <= 0) {
        return 0;
    }
    buf[n] = '\0';
    const char *p = buf;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
        p++;
    }
    int negative = 0;
    if (*p == '-' || *p == '+') {
        negative = *p == '-';
        p++;
    }
    long long value = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 18) {
        value = value * 10 + (*p - '0');
        p++;
        digits++;
    }
    return negative ? -value : value;
}

static void shift(struct timespec *ts, long long ms) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + ms * 1000000LL;
    long long sec = ns / 1000000000LL;
    long long rem = ns % 1000000000LL;
    if (rem < 0) {
        rem += 1000000000LL;
        sec -= 1;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)rem;
}

static int real_clock_gettime(clockid_t clk, struct timespec *ts) {
    return (int)syscall(SYS_clock_gettime, clk, ts);
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int rc = real_clock_gettime(clk, ts);
    if (rc == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) {
        long long ms = offset_ms();
        if (ms != 0) {
            shift(ts, ms);
        }
    }
    return rc;
}

/* glibc's internal name, in case a caller links against it directly. */
int __clock_gettime(clockid_t clk, struct timespec *ts) {
    return clock_gettime(clk, ts);
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc != 0) {
        return rc;
    }
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    if (out != NULL) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
