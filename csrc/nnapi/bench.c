/* nnapi/bench.c — pi2_nnapi_bench_ffn: the planner's measure of how fast the delegate runs a hot-FFN graph
 *       (pi2/plan/npu_plan.py turns the time into GB/s of F16 weights).
 * Does: random F32 weights (a fixed seed), one graph, one compiling run, then the timed runs; the fastest.
 * Does not: decide anything (the planner does). */
#define _GNU_SOURCE
#include "internal.h"

#include <stdlib.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

pi2_status pi2_nnapi_bench_ffn(pi2_nnapi *d, int32_t act, int32_t n_embd, int32_t n_hot, int32_t runs,
                               double *best_seconds) {
    if (!d || !best_seconds || n_embd < 1 || n_hot < 1 || runs < 1)
        return pi2_set_error(PI2_ERR_INVALID, "bad NNAPI bench arguments");
    const size_t n = (size_t)n_embd * (size_t)n_hot;
    float *w = malloc(3 * n * sizeof(float)), *x = malloc((size_t)n_embd * sizeof(float));
    float *y = malloc((size_t)n_embd * sizeof(float));
    if (!w || !x || !y) {
        free(w), free(x), free(y);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for the NNAPI bench");
    }
    uint32_t state = 12345;
    for (size_t i = 0; i < 3 * n; i++) w[i] = (float)((state = state * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    for (int32_t i = 0; i < n_embd; i++) x[i] = w[i];
    const size_t rb = (size_t)n_embd * sizeof(float), hb = (size_t)n_hot * sizeof(float);
    const pi2_nnapi_matrix gate = {w, 0, n_hot, n_embd, rb}, up = {w + n, 0, n_hot, n_embd, rb};
    const pi2_nnapi_matrix down = {w + 2 * n, 0, n_embd, n_hot, hb};
    pi2_nnapi_graph *g = NULL;
    float *out[1] = {y};
    pi2_status s = pi2_nnapi_ffn_create(d, act, &gate, &up, &down, 0, n_hot, &g);
    if (!s && !(s = pi2_nnapi_start(g, x, 1, out))) s = pi2_nnapi_wait(g);   /* compiles the graph */
    double best = 1e30;
    for (int32_t r = 0; r < runs && !s; r++) {
        const double t0 = now_s();
        if (!(s = pi2_nnapi_start(g, x, 1, out))) s = pi2_nnapi_wait(g);
        const double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    pi2_nnapi_graph_free(g);
    free(w), free(x), free(y);
    if (!s) *best_seconds = best;
    return s;
}
