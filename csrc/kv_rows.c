/* kv_rows.c — the F16 keys' rows grow with the positions a context holds. The keys are transposed (one row per
 * dimension of a KV head over the positions), so a decode reads every row's first n_past halves: with rows
 * pi2_kv_k_ld(n_ctx) apart, a short sequence in a large context read a few lines from each of thousands of pages
 * (n_ctx 4096: 8 KiB apart), about 7 % of a small model's decode. Rows are instead k_ld halves apart, the smallest
 * of 64 · 2^k that holds the positions in use (at most pi2_kv_k_ld(n_ctx)), and move apart when a decode needs more.
 * Does not: allocate the cache (context.c, kv_mem.c) or index it (each loop takes k_ld: ops.h's pi2_attn). */
#include "forward.h"
#include "kv_quant.h"
#include "pi2_test.h"

#include <string.h>

#define ROWS_MIN 64    /* halves: two 64-byte lines, one score loop's block of keys */

/* The rows' spacing for `need` positions in a context of n_ctx. */
static int32_t rows_ld(int32_t need, int32_t n_ctx) {
    const int32_t full = pi2_kv_k_ld(n_ctx);
    int32_t ld = ROWS_MIN;
    while (ld < need && ld < full) ld *= 2;
    return ld < full ? ld : full;
}

void kv_rows_fit(pi2_ctx *c, int32_t need) {
    if (c->k_blocks || need <= c->k_ld) return;     /* quantized keys are cells: no rows */
    const int32_t ld = rows_ld(need, c->p.n_ctx);
    const size_t rows = (size_t)c->m->hp.n_layer * c->m->hp.n_head_kv * c->m->hp.head_dim, old = (size_t)c->k_ld;
    /* Last row first: row r's new place ends before row r+1's (already moved), and starts at or after the end of
     * row r-1's old place (not moved yet). */
    for (size_t r = rows; r-- > 1;)
        memmove(c->k_cache + r * (size_t)ld, c->k_cache + r * old, (size_t)c->n_past * sizeof *c->k_cache);
    c->k_ld = ld;
}

void kv_rows_reset(pi2_ctx *c) {
    if (c->k_blocks) c->k_ld = pi2_kv_k_ld(c->p.n_ctx);    /* not used: quantized keys are cells */
    else if (c->n_past == 0) c->k_ld = rows_ld(1, c->p.n_ctx);
}

int32_t pi2_test_ctx_k_ld(const pi2_ctx *c) { return c->k_ld; }
