/* threadpool.c — the persistent worker pool of threadpool.h.
 * Does: hand out the tasks of a job through one atomic claim word (tag | n_tasks | next index),
 *       so whoever is running takes the next task; count finished tasks; workers spin up to
 *       SPIN_NS for the next job, then sleep on a condvar; between marks, run jobs shared or on
 *       the caller alone, whichever was measured faster (intervals of LONG_NS and more: shared).
 * Does not: touch the tasks' data; keep any global state.
 * The caller never waits for a worker to check in, only for claimed tasks to finish: a worker
 * that another process keeps off its core delays a job by at most the one task it holds.
 * Invariants: fn/arg of a job are written before its claim word is published (release) and are
 *       rewritten only after every task of the job finished, so a worker that claimed a task
 *       (acquire) reads the job's own fn/arg; a stale worker's claim fails on the tag. */
#define _GNU_SOURCE
#include "threadpool.h"
#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPIN_NS 50000                /* spin at most this long before sleeping */
#define EXPLORE 8                    /* intervals timed in each mode per comparison */
#define EXPLOIT_MIN 256              /* intervals run in the faster mode before comparing again, */
#define EXPLOIT_MAX 2048             /* doubling up to this while the choice stays the same */
#define LONG_NS 20000000             /* a shared interval this long is not compared with running alone */
#define IDX_BITS 20                  /* claim word: tag (24 bits) | n_tasks (20) | next index (20) */
#define MAX_TASKS ((1 << IDX_BITS) - 1)
#define IDX(v) ((int32_t)((v) & MAX_TASKS))
#define NTASKS(v) ((int32_t)(((v) >> IDX_BITS) & MAX_TASKS))
#define TAG(v) ((uint32_t)((v) >> (2 * IDX_BITS)))

struct pi2_pool {
    int32_t n_threads;
    pthread_t *threads;              /* [n_threads - 1] workers */
    pthread_mutex_t mu;
    pthread_cond_t wake, done_cv;
    pi2_task_fn fn;                  /* the current job */
    void *arg;
    uint32_t tag;                    /* the current job's tag (caller only) */
    _Atomic uint32_t job;            /* tag of the latest job: workers wait for it to change */
    _Atomic int32_t stop;
    _Atomic int32_t sleeping;        /* the caller sleeps on done_cv */
    /* caller only: sharing or running alone, whichever is measured faster (pi2_pool_mark) */
    int32_t alone;                   /* the current interval runs its jobs on the caller alone */
    int32_t warm;                    /* it follows an interval in the same mode without a gap (it is timed) */
    int64_t mark_t;                  /* start of the current interval (0: none) */
    int32_t key, explore_key;        /* the current interval's key; the key being compared */
    int64_t sum[2];                  /* comparison: time in intervals [shared, alone] */
    int32_t cnt[2];
    int32_t exploit_left, exploit_len, choice;
    _Alignas(64) _Atomic uint64_t claim;   /* tag | n_tasks | next index, alone on its cache line */
    _Alignas(64) _Atomic int32_t done;     /* finished tasks of the current job */
    char pad[60];
};

typedef struct { pi2_pool *pool; int32_t id; } worker_start;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Claim and run tasks of the job tagged `tag` until none is left. */
static void run_tasks(pi2_pool *p, uint32_t tag, int32_t thread) {
    uint64_t v = atomic_load_explicit(&p->claim, memory_order_acquire);
    while (TAG(v) == (tag & 0xFFFFFF) && IDX(v) < NTASKS(v)) {
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &v, v + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        p->fn(p->arg, IDX(v), thread);
        /* seq_cst pairs with the caller's store to `sleeping` then load of `done` (no lost wakeup) */
        if (atomic_fetch_add(&p->done, 1) + 1 == NTASKS(v) && atomic_load(&p->sleeping)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
        v = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

/* Spin up to SPIN_NS until cond(p, x) holds; 1 if it did. */
#define SPIN_UNTIL(cond)                                                    \
    do {                                                                    \
        int64_t t0_ = 0;                                                    \
        for (uint32_t s_ = 1; !(cond); s_++) {                              \
            cpu_relax();                                                    \
            if (s_ % 64) continue;                                          \
            if (!t0_) t0_ = now_ns();                                       \
            else if (now_ns() - t0_ > SPIN_NS) break;                       \
        }                                                                   \
    } while (0)

static void *worker_main(void *a) {
    worker_start *s = a;
    pi2_pool *p = s->pool;
    const int32_t id = s->id;
    free(s);
    uint32_t seen = 0;
    for (;;) {
        SPIN_UNTIL(atomic_load_explicit(&p->job, memory_order_acquire) != seen || atomic_load(&p->stop));
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->job, memory_order_acquire) == seen && !atomic_load(&p->stop))
            pthread_cond_wait(&p->wake, &p->mu);
        pthread_mutex_unlock(&p->mu);
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load_explicit(&p->job, memory_order_acquire);
        run_tasks(p, seen, id);
    }
}

void pi2_pool_run(pi2_pool *p, pi2_task_fn fn, void *arg, int32_t n_tasks) {
    if (p->n_threads == 1 || p->alone || n_tasks <= 1 || n_tasks > MAX_TASKS) {
        for (int32_t i = 0; i < n_tasks; i++) fn(arg, i, 0);
        return;
    }
    const uint32_t tag = p->tag = (p->tag + 1) & 0xFFFFFF;
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->claim, ((uint64_t)tag << (2 * IDX_BITS)) | ((uint64_t)n_tasks << IDX_BITS),
                          memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->job, tag, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, tag, 0);
    SPIN_UNTIL(atomic_load_explicit(&p->done, memory_order_acquire) == n_tasks);
    if (atomic_load_explicit(&p->done, memory_order_acquire) != n_tasks) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->sleeping, 1);
        while (atomic_load(&p->done) != n_tasks) pthread_cond_wait(&p->done_cv, &p->mu);
        atomic_store(&p->sleeping, 0);
        pthread_mutex_unlock(&p->mu);
    }
}

/* An interval of `dt` ns in mode p->alone ended: count it in the comparison, or in the exploitation.
 * Only warm intervals are compared: the first one after the other mode or after a gap (the caller's own
 * work between steps) finds the worker asleep past SPIN_NS and pays its wake-up, which running shared
 * pays once a step, not once a layer (counted, it made alone look faster on small models). */
static void interval_done(pi2_pool *p, int64_t dt) {
    if (p->exploit_left > 0) {
        p->exploit_left--;
        return;
    }
    if (p->key != p->explore_key) {   /* different work: start comparing afresh */
        p->explore_key = p->key;
        p->sum[0] = p->sum[1] = 0;
        p->cnt[0] = p->cnt[1] = 0;
    }
    if (!p->warm) return;
    /* A long interval (a layer of a prompt batch) runs many tasks, and a preempted worker delays it by at most the
     * one task it holds, a small part of the interval: sharing stays, without timing alone intervals that each cost
     * about as much as the interval again (8 of them were a third of a 512-token prompt's 24 layers). */
    if (!p->alone && dt >= LONG_NS) {
        p->choice = 0;
        p->exploit_len = p->exploit_left = EXPLOIT_MIN;
        p->explore_key = -1;
        return;
    }
    p->sum[p->alone] += dt;
    p->cnt[p->alone]++;
    if (p->cnt[0] < EXPLORE || p->cnt[1] < EXPLORE) return;
    const int32_t choice = p->sum[1] * p->cnt[0] < p->sum[0] * p->cnt[1];   /* alone is faster */
    p->exploit_len = choice == p->choice && p->exploit_len ? (p->exploit_len * 2 > EXPLOIT_MAX ? EXPLOIT_MAX : p->exploit_len * 2)
                                                            : EXPLOIT_MIN;
    p->exploit_left = p->exploit_len;
    p->choice = choice;
    p->explore_key = -1;
}

void pi2_pool_mark(pi2_pool *p, int32_t key) {
    if (p->n_threads == 1) return;
    const int64_t t = now_ns();
    const int32_t follows = p->mark_t != 0, was_alone = p->alone;   /* an interval ends here */
    if (follows) interval_done(p, t - p->mark_t);
    p->mark_t = key >= 0 ? t : 0;
    p->key = key;
    if (key < 0) return;
    /* comparing: each mode twice in a row, the second one timed (the mode flips once an interval counted) */
    p->alone = p->exploit_left > 0 ? p->choice : (p->cnt[0] + p->cnt[1]) & 1;
    p->warm = follows && p->alone == was_alone;
}

int32_t pi2_pool_n_threads(const pi2_pool *p) { return p->n_threads; }

pi2_status pi2_pool_create(int32_t n_threads, pi2_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 512)
        return pi2_set_error(PI2_ERR_INVALID, "thread count %d is out of range 1..512", (int)n_threads);
    pi2_pool *p = aligned_alloc(64, sizeof *p);
    if (p) memset(p, 0, sizeof *p);
    if (!p || !(p->threads = calloc((size_t)n_threads, sizeof *p->threads))) {
        free(p);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for a pool of %d threads", (int)n_threads);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->explore_key = -1;
    p->n_threads = 1;   /* counts the threads started so far, so pi2_pool_free can join them */
    for (int32_t i = 1; i < n_threads; i++) {
        worker_start *s = malloc(sizeof *s);
        if (s) *s = (worker_start){p, i};
        if (!s || pthread_create(&p->threads[i - 1], NULL, worker_main, s) != 0) {
            free(s);
            pi2_pool_free(p);
            return pi2_set_error(PI2_ERR_NOMEM, "could not start compute thread %d of %d", (int)i, (int)n_threads);
        }
        p->n_threads++;
    }
    *out = p;
    return PI2_OK;
}

void pi2_pool_free(pi2_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done_cv);
    free(p->threads);
    free(p);
}
