/* io/probe.c — pi2_io_probe: which read backends this process may use, and whether they overlap reads.
 * Does: for each backend (uring, aio, pread, mmap) fork a child that opens the file with it, checks
 *       its bytes against pread, times single reads and batches of 16 (medians), writes a report to a pipe and
 *       _exits; the parent reads the report, or the signal that killed the child (Android's seccomp
 *       filter: SIGSYS on io_uring_setup), and kills a child that hangs. Clears io_uring for
 *       pi2_io_open only after a child used it and lived.
 * Does not: call io_uring in the calling process; pick a backend against a user's choice (Python). */
#define _GNU_SOURCE
#include "io.h"
#include "../internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BATCH 16
#define SINGLES 9
#define REPS 5            /* batches timed; the median counts */
#define SPEEDUP 0.55      /* concurrent: a batch takes at most this share of the same reads one by one */
#define MEMORY_US 20.0       /* a single read faster than this came from memory */
#define TIMEOUT_MS 10000

static const char *last_message(void) {
    pi2_error e = {.size = sizeof e};
    pi2_last_error(&e);
    return e.message;
}

static const int32_t ORDER[PI2_IO_N_BACKENDS] = {PI2_IO_URING, PI2_IO_AIO, PI2_IO_PREAD, PI2_IO_MMAP};

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Test mode: trap io_uring_setup like Android's app filter does (SECCOMP_RET_TRAP -> SIGSYS). */
static int install_uring_trap(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* Read `n` (<= SINGLES) blocks at `blk` one at a time (submit 1, reap 1): median wall time per read and
 * median time inside submit, µs; -1 on error. */
static double time_singles(pi2_io *io, char *buf, const uint64_t *blk, int n, double *submit_us) {
    double t[SINGLES], ts[SINGLES];
    for (int i = 0; i < n; i++) {
        pi2_io_request r = {blk[i] * PI2_IO_ALIGN, PI2_IO_ALIGN, buf, 0};
        pi2_io_completion c;
        int32_t k;
        double t0 = now_us();
        if (pi2_io_submit(io, &r, 1, &k) != PI2_OK) return -1;
        double t1 = now_us();
        if (pi2_io_reap(io, &c, 1, 1, &k) != PI2_OK || c.error) return -1;
        t[i] = now_us() - t0, ts[i] = t1 - t0;
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) { double x = t[j]; t[j] = t[j - 1]; t[j - 1] = x; }
        for (int j = i; j > 0 && ts[j] < ts[j - 1]; j--) { double x = ts[j]; ts[j] = ts[j - 1]; ts[j - 1] = x; }
    }
    *submit_us = ts[n / 2];
    return t[n / 2];
}

/* 16 reads submitted at once: time inside submit and until the last completion, µs; 0 ok. */
static int time_batch(pi2_io *io, char *bufs, const uint64_t *blk, double *submit_us, double *batch_us) {
    pi2_io_request r[BATCH];
    pi2_io_completion c[BATCH];
    for (int i = 0; i < BATCH; i++) r[i] = (pi2_io_request){blk[i] * PI2_IO_ALIGN, PI2_IO_ALIGN, bufs + i * PI2_IO_ALIGN, 0};
    int32_t k, got = 0;
    double t0 = now_us();
    if (pi2_io_submit(io, r, BATCH, &k) != PI2_OK || k != BATCH) return -1;
    *submit_us = now_us() - t0;
    while (got < BATCH) {
        if (pi2_io_reap(io, c + got, BATCH - got, 1, &k) != PI2_OK) return -1;
        for (int i = got; i < got + k; i++) if (c[i].error) return -1;
        got += k;
    }
    *batch_us = now_us() - t0;
    return 0;
}

static int report(int wfd, pi2_io_verdict *v, int32_t verdict, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int report(int wfd, pi2_io_verdict *v, int32_t verdict, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->reason, sizeof v->reason, fmt, ap);
    va_end(ap);
    v->verdict = verdict;
    ssize_t w = write(wfd, v, sizeof *v);
    (void)w;
    return verdict;
}

/* The child's work; returns its exit code (the verdict). */
static int child(const char *path, int32_t backend, int32_t flags, int wfd, char *bufs) {   /* flags: test bits too */
    pi2_io_verdict v = {.backend = backend};
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    signal(SIGSYS, SIG_DFL);
    if (backend == PI2_IO_URING) {
        if (flags & PI2_IO_PROBE_TEST_RAISE_SIGSYS) raise(SIGSYS);
        if ((flags & PI2_IO_PROBE_TEST_SECCOMP_URING) && install_uring_trap() != 0)
            return report(wfd, &v, PI2_IO_VERDICT_FAILED, "cannot install the test seccomp filter: %s", strerror(errno));
        io_uring_set_cleared();    /* in this child only: the call below is the probe */
    }
    pi2_io_params p = {.backend = backend, .queue_depth = BATCH, .direct = !(flags & PI2_IO_PROBE_BUFFERED),
                       .drop_cache = 1};
    pi2_io *io;
    pi2_status st = pi2_io_open(path, &p, &io, NULL);
    if (st != PI2_OK)
        return report(wfd, &v, st == PI2_ERR_UNSUPPORTED ? PI2_IO_VERDICT_UNAVAILABLE : PI2_IO_VERDICT_FAILED,
                      "%s", last_message());
    v.direct = io->direct;
    int ref = open(path, O_RDONLY | O_CLOEXEC);
    if (ref < 0) return report(wfd, &v, PI2_IO_VERDICT_FAILED, "cannot open %s: %s", path, strerror(errno));
    const uint64_t n_blk = ((uint64_t)io->size + PI2_IO_ALIGN - 1) / PI2_IO_ALIGN;
    char *want = bufs + BATCH * PI2_IO_ALIGN;
    uint64_t check[3] = {0, n_blk / 2, n_blk ? n_blk - 1 : 0};
    for (int i = 0; i < 3 && n_blk; i++) {      /* first, middle and last (maybe partial) block */
        pi2_io_request r = {check[i] * PI2_IO_ALIGN, PI2_IO_ALIGN, bufs, 0};
        pi2_io_completion c;
        int32_t k;
        if (pi2_io_submit(io, &r, 1, &k) != PI2_OK || pi2_io_reap(io, &c, 1, 1, &k) != PI2_OK)
            return report(wfd, &v, PI2_IO_VERDICT_FAILED, "%s", last_message());
        ssize_t n = pread(ref, want, PI2_IO_ALIGN, (off_t)r.offset);
        if (c.error && !(c.error == ENODATA && c.nbytes == n))
            return report(wfd, &v, PI2_IO_VERDICT_FAILED, "a 4 KiB read at %llu failed: %s",
                          (unsigned long long)r.offset, strerror(c.error));
        if (n < 0 || c.nbytes != n || memcmp(bufs, want, (size_t)n) != 0)
            return report(wfd, &v, PI2_IO_VERDICT_FAILED, "bytes at %llu differ from pread's", (unsigned long long)r.offset);
    }
    const uint64_t whole = (uint64_t)io->size / PI2_IO_ALIGN;   /* full blocks to time */
    if (whole == 0) return report(wfd, &v, PI2_IO_VERDICT_OK, "reads correct; the file is too small to time");
    uint64_t s = 0x2545F4914F6CDD1Dull;
    const char *how = v.direct ? "O_DIRECT" : "buffered";
    for (int round = 0; round < 2; round++) {     /* a second round when the first saw no overlap (noise) */
        uint64_t blk[REPS * BATCH + SINGLES];
        for (int i = 0; i < REPS * BATCH + SINGLES; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            blk[i] = s % whole;
        }
        pi2_io_drop_cache(io);
        v.read_us = time_singles(io, bufs, blk, SINGLES, &v.read_submit_us);
        double sub[REPS], all[REPS];
        for (int rep = 0; rep < REPS; rep++) {
            pi2_io_drop_cache(io);
            if (v.read_us < 0 || time_batch(io, bufs, blk + SINGLES + rep * BATCH, &sub[rep], &all[rep]) != 0)
                return report(wfd, &v, PI2_IO_VERDICT_FAILED, "timed reads failed: %s", last_message());
            for (int j = rep; j > 0 && all[j] < all[j - 1]; j--) {
                double x = all[j]; all[j] = all[j - 1]; all[j - 1] = x;
                x = sub[j]; sub[j] = sub[j - 1]; sub[j - 1] = x;
            }
        }
        v.submit_us = sub[REPS / 2], v.batch_us = all[REPS / 2];
        if (v.read_us < MEMORY_US)
            return report(wfd, &v, PI2_IO_VERDICT_OK, "%s reads come from memory (%.1f us each): nothing to overlap",
                          how, v.read_us);
        /* Concurrent: the batch is much faster than the same reads one by one. Where reads happen inside
         * submit (Linux AIO without O_DIRECT in effect) they run one after another; time inside submit
         * alone does not tell (a hypervisor may complete a direct read during the submitting call). */
        if (v.batch_us < SPEEDUP * BATCH * v.read_us)
            return report(wfd, &v, PI2_IO_VERDICT_OK, "%s: %d reads overlap (%.0f us together, %.0f us each alone, "
                          "%.0f us of one inside submit)", how, BATCH, v.batch_us, v.read_us, v.read_submit_us);
    }
    return report(wfd, &v, PI2_IO_VERDICT_SERIAL, "%s: %d reads do not overlap (%.0f us together, %.0f us each alone, "
                  "%.0f us of one inside submit)", how, BATCH, v.batch_us, v.read_us, v.read_submit_us);
}

/* Run one backend's child; fill *v from its report or its fate. */
static pi2_status probe_one(const char *path, int32_t backend, int32_t flags, char *bufs, pi2_io_verdict *v) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return pi2_set_io_error(errno, "", "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]), close(fds[1]);
        return pi2_set_io_error(errno, "", "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(fds[0]);
        _exit(child(path, backend, flags, fds[1], bufs));
    }
    close(fds[1]);
    int status = 0, waited = 0;
    pid_t r;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && waited < TIMEOUT_MS) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        waited++;
    }
    if (r == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    pi2_io_verdict got;
    ssize_t n = read(fds[0], &got, sizeof got);
    close(fds[0]);
    *v = (pi2_io_verdict){.backend = backend};
    if (r == 0) {
        v->verdict = PI2_IO_VERDICT_FAILED;
        snprintf(v->reason, sizeof v->reason, "the probe child hung for %d s and was killed", TIMEOUT_MS / 1000);
    } else if (WIFSIGNALED(status)) {
        v->verdict = PI2_IO_VERDICT_REFUSED;
        v->signal = WTERMSIG(status);
        snprintf(v->reason, sizeof v->reason, "refused: the probe child was killed by signal %d (%s)%s", v->signal,
                 strsignal(v->signal), v->signal == SIGSYS ? ", a seccomp filter forbids it" : "");
    } else if (n == (ssize_t)sizeof got) {
        *v = got;
        v->reason[sizeof v->reason - 1] = '\0';
    } else {
        v->verdict = PI2_IO_VERDICT_FAILED;
        snprintf(v->reason, sizeof v->reason, "the probe child exited with %d and no report", WEXITSTATUS(status));
    }
    return PI2_OK;
}

pi2_status pi2_io_probe(const char *path, int32_t flags, pi2_io_verdict *out, int32_t *chosen) {
    if (flags & ~PI2_IO_PROBE_BUFFERED) return pi2_set_error(PI2_ERR_INVALID, "unknown probe flags %d", (int)flags);
    return pi2_test_io_probe(path, flags, 0, out, chosen);
}

pi2_status pi2_test_io_probe(const char *path, int32_t flags, int32_t test_flags, pi2_io_verdict *out,
                             int32_t *chosen) {
    if (!path || !out || !chosen) return pi2_set_error(PI2_ERR_INVALID, "NULL path or output");
    flags |= test_flags;
    *chosen = PI2_IO_AUTO;
    struct stat sb;
    if (stat(path, &sb) != 0) return pi2_set_io_error(errno, path, "cannot stat %s: %s", path, strerror(errno));
    char *bufs = NULL;   /* allocated before fork: the child need not allocate these */
    if (posix_memalign((void **)&bufs, PI2_IO_ALIGN, (BATCH + 1) * PI2_IO_ALIGN) != 0)
        return pi2_set_error(PI2_ERR_NOMEM, "no memory for probe buffers");
    pi2_status st = PI2_OK;
    for (int i = 0; i < PI2_IO_N_BACKENDS && st == PI2_OK; i++) st = probe_one(path, ORDER[i], flags, bufs, &out[i]);
    free(bufs);
    if (st != PI2_OK) return st;
    for (int pass = 0; pass < 2 && *chosen == PI2_IO_AUTO; pass++)
        for (int i = 0; i < PI2_IO_N_BACKENDS && *chosen == PI2_IO_AUTO; i++)
            if (out[i].verdict == (pass ? PI2_IO_VERDICT_SERIAL : PI2_IO_VERDICT_OK)) *chosen = out[i].backend;
    if (out[0].verdict == PI2_IO_VERDICT_OK || out[0].verdict == PI2_IO_VERDICT_SERIAL) io_uring_set_cleared();
    return PI2_OK;
}
