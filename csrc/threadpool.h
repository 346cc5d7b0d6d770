/* threadpool.h — persistent compute threads that run one parallel job at a time.
 * Does: start n_threads - 1 workers once; run fn(arg, task, thread) for every task index of a job,
 *       the caller taking part as thread 0; return when every task is done.
 * Does not: decide how work is split (callers make each task write its own outputs, so results do
 *       not depend on which thread ran a task) or reduce across threads.
 * Waiting spins briefly, then sleeps on a condition variable: a core taken by another process
 * slows a job down instead of stalling it behind a spinning waiter. */
#ifndef PI2_THREADPOOL_H
#define PI2_THREADPOOL_H
#include <stdint.h>

#include "pi2.h"

typedef struct pi2_pool pi2_pool;
typedef void (*pi2_task_fn)(void *arg, int32_t task, int32_t thread);

/* A pool of n_threads threads in all (the caller included). PI2_ERR_INVALID, PI2_ERR_NOMEM. */
pi2_status pi2_pool_create(int32_t n_threads, pi2_pool **out);
void pi2_pool_free(pi2_pool *pool);
int32_t pi2_pool_n_threads(const pi2_pool *pool);
/* fn(arg, i, thread) for i in [0, n_tasks), each exactly once; thread in [0, n_threads). */
void pi2_pool_run(pi2_pool *pool, pi2_task_fn fn, void *arg, int32_t n_tasks);

/* Mark the start of an interval of comparable work (key >= 0: intervals with equal keys do the same
 * work, e.g. one layer of a step of `key` tokens) or, with key < 0, the end of the last one.
 * Within an interval every job runs either shared or on the caller alone: the pool times
 * intervals in both modes now and then and runs the faster one in between. A worker whose core
 * another process holds can be preempted in the middle of a task, and the caller then waits a
 * scheduler slice for it; running alone avoids that. Only speed depends on it: which thread runs
 * a task never changes its result. Without marks, jobs are always shared. */
void pi2_pool_mark(pi2_pool *pool, int32_t key);

#endif
