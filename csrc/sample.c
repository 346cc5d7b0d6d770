/* sample.c — the sampler chain's hot spot over a whole vocabulary: the top-k cut (pi2/runtime/sampling.py's
 * _top_k_order, the numpy specification) in one pass over the logits, so a token's sampling costs microseconds
 * rather than a dozen passes over n_vocab floats. Owns pi2_top_k. Does not: any later stage of the chain (they run
 * on the k survivors in Python). */
#include <string.h>

#include "pi2.h"

enum { BLOCK = 32 };
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

/* put (x, id) into the m sorted candidates (largest first; equal logits keep the lower id first, as ids arrive in
 * increasing order), dropping the last when m == k; returns the new count */
static int32_t insert(float *vals, int32_t *ids, int32_t m, int32_t k, float x, int32_t id)
{
    int32_t p = m < k ? m : k - 1;
    while (p > 0 && vals[p - 1] < x) {
        vals[p] = vals[p - 1];
        ids[p] = ids[p - 1];
        p--;
    }
    vals[p] = x;
    ids[p] = id;
    return m < k ? m + 1 : k;
}

int32_t pi2_top_k(const float *logits, int32_t n, int32_t k, int32_t *ids, float *vals)
{
    if (!logits || !ids || !vals || n < 0 || k < 1)
        return PI2_ERR_INVALID;
    int32_t m = 0, i = 0;
    while (i < n && m < k) {            /* the first k logits that are numbers */
        float x = logits[i];
        if (x == x)
            m = insert(vals, ids, m, k, x, i);
        i++;
    }
    if (m < k)
        return m;
    float thr = vals[k - 1];
    while (i < n) {
        /* most blocks hold nothing above the k-th largest so far: a vector test skips them (GCC / clang vector
         * extensions: SSE or NEON compares, no per-ISA code) */
        const v4f t = {thr, thr, thr, thr};
        while (i + BLOCK <= n) {
            v4i any = {0, 0, 0, 0};
            for (int j = 0; j < BLOCK; j += 4) {
                v4f x;
                memcpy(&x, logits + i + j, sizeof x);
                any |= x > t;
            }
            if (any[0] | any[1] | any[2] | any[3])
                break;
            i += BLOCK;
        }
        int32_t end = i + BLOCK < n ? i + BLOCK : n;
        for (; i < end; i++) {
            if (logits[i] > thr) {      /* strictly: a later equal logit loses the tie */
                insert(vals, ids, k, k, logits[i], i);
                thr = vals[k - 1];
            }
        }
    }
    return k;
}
