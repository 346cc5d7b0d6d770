/* pool_bench.c — what one pool job costs beyond its work: the time from pi2_pool_run's start to its return
 * for jobs whose tasks do (almost) nothing, at 1..N threads, jobs back to back as a decode issues them
 * (one per matrix group and per row op: ~5 per layer). Built and run by scripts/bench_pool.sh.
 * Prints per thread count: ns per job (median of 15 runs of 2000 jobs), and how often the caller ran every
 * task itself (a worker that did not wake in time). */
#define _POSIX_C_SOURCE 200809L
#include "../../csrc/threadpool.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Atomic int64_t by_caller, total;

static void task(void *arg, int32_t t, int32_t thread) {
    (void)arg; (void)t;
    atomic_fetch_add_explicit(&total, 1, memory_order_relaxed);
    if (!thread) atomic_fetch_add_explicit(&by_caller, 1, memory_order_relaxed);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp(const void *a, const void *b) { return (*(const double *)a > *(const double *)b) - (*(const double *)a < *(const double *)b); }

int main(int argc, char **argv) {
    const int max_threads = argc > 1 ? atoi(argv[1]) : 2, tasks = argc > 2 ? atoi(argv[2]) : 16;
    printf("threads  tasks/job  ns/job (median)  tasks run by the caller\n");
    for (int nt = 1; nt <= max_threads; nt++) {
        pi2_pool *p;
        if (pi2_pool_create(nt, &p) != PI2_OK) return 1;
        double runs[15];
        atomic_store(&by_caller, 0);
        atomic_store(&total, 0);
        for (int r = 0; r < 15; r++) {
            const double t0 = now();
            for (int j = 0; j < 2000; j++) pi2_pool_run(p, task, NULL, tasks);
            runs[r] = (now() - t0) / 2000;
        }
        qsort(runs, 15, sizeof runs[0], cmp);
        printf("%7d  %9d  %15.0f  %.1f %%\n", nt, tasks, runs[7], 100.0 * (double)by_caller / (double)total);
        pi2_pool_free(p);
    }
    return 0;
}
