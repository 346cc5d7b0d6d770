/* io/pread_pool.c — the pread thread-pool backend: min(queue_depth, 64) threads, each taking a slot,
 * reading it with pread (continued after short reads until the length, end of file or an error) and
 * posting the result; the owner thread finishes slots in wait. Works wherever pread does.
 * Invariants: only the owner thread touches io's slots and counters; workers touch their slot's
 *       request (written before it was queued) and the queues, under the pool's lock. */
#define _GNU_SOURCE
#include "io.h"
#include "../internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_THREADS 64

typedef struct { int32_t slot; int64_t res; } fin_t;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    int32_t *todo;             /* [qd] ring of slots to read */
    int32_t todo_head, n_todo;
    fin_t *fin, *fin_copy;     /* [qd] results not yet finished by the owner */
    int32_t n_fin;
    int stop, n_threads;
    pthread_t threads[MAX_THREADS];
    pi2_io *io;
} pool;

static int64_t read_full(int fd, const pi2_io_request *r) {
    uint64_t got = 0;
    while (got < r->length) {
        ssize_t k = pread(fd, (char *)r->dest + got, r->length - got, (off_t)(r->offset + got));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return -errno;
        if (k == 0) break;
        got += (uint64_t)k;
    }
    return (int64_t)got;
}

static void *worker(void *arg) {
    pool *p = arg;
    pi2_io *io = p->io;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->n_todo == 0) pthread_cond_wait(&p->work_cv, &p->mu);
        if (p->n_todo == 0) break;
        int32_t s = p->todo[p->todo_head];
        p->todo_head = (p->todo_head + 1) % io->qd;
        p->n_todo--;
        pthread_mutex_unlock(&p->mu);
        int64_t res = read_full(io->fd, &io->slots[s].req);
        pthread_mutex_lock(&p->mu);
        p->fin[p->n_fin++] = (fin_t){s, res};
        pthread_cond_signal(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void stop_threads(pool *p) {
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
}

static void free_pool(pool *p) {
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->work_cv);
    pthread_cond_destroy(&p->done_cv);
    free(p->todo), free(p->fin), free(p->fin_copy), free(p);
}

static pi2_status init(pi2_io *io) {
    pool *p = calloc(1, sizeof *p);
    if (!p) return pi2_set_error(PI2_ERR_NOMEM, "no memory for the pread pool");
    p->io = io;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->todo = calloc((size_t)io->qd, sizeof *p->todo);
    p->fin = calloc((size_t)io->qd, sizeof *p->fin);
    p->fin_copy = calloc((size_t)io->qd, sizeof *p->fin_copy);
    if (!p->todo || !p->fin || !p->fin_copy) {
        free_pool(p);
        return pi2_set_error(PI2_ERR_NOMEM, "no memory for the pread pool");
    }
    int want = io->qd < MAX_THREADS ? io->qd : MAX_THREADS;
    for (; p->n_threads < want; p->n_threads++) {
        int e = pthread_create(&p->threads[p->n_threads], NULL, worker, p);
        if (e) {
            stop_threads(p);
            free_pool(p);
            return pi2_set_error(PI2_ERR_NOMEM, "cannot start a pread thread: %s", strerror(e));
        }
    }
    io->be = p;
    return PI2_OK;
}

static int32_t start(pi2_io *io, const int32_t *slots, int32_t n) {
    pool *p = io->be;
    pthread_mutex_lock(&p->mu);
    for (int32_t i = 0; i < n; i++) {
        p->todo[(p->todo_head + p->n_todo++) % io->qd] = slots[i];
        pthread_cond_signal(&p->work_cv);     /* one worker per read, not the whole pool */
    }
    pthread_mutex_unlock(&p->mu);
    io->n_started += n;
    return n;
}

static pi2_status wait_done(pi2_io *io, int32_t min) {
    pool *p = io->be;
    int32_t got = 0;
    do {
        pthread_mutex_lock(&p->mu);
        while (p->n_fin < min - got) pthread_cond_wait(&p->done_cv, &p->mu);
        int32_t k = p->n_fin;
        memcpy(p->fin_copy, p->fin, (size_t)k * sizeof *p->fin);
        p->n_fin = 0;
        pthread_mutex_unlock(&p->mu);
        for (int32_t i = 0; i < k; i++) {
            io->n_started--;
            io_finish(io, p->fin_copy[i].slot, p->fin_copy[i].res);
        }
        got += k;
    } while (got < min);
    return PI2_OK;
}

static void fini(pi2_io *io) {
    pool *p = io->be;
    if (!p) return;
    stop_threads(p);
    free_pool(p);
    io->be = NULL;
}

const io_backend_ops pi2_io_pread_ops = {init, start, wait_done, fini};
