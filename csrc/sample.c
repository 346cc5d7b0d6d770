/* sample.c — the sampler chain's hot spots, so that a token's sampling costs microseconds rather than dozens of
 * numpy calls: the top-k cut over a whole vocabulary in one pass (pi2/runtime/sampling.py's top_k_order_np is its
 * specification), and on candidates sorted largest first (what top-k leaves) top-p, min-p and the final draw with
 * llama.cpp's float arithmetic (expf, logf, float and double running sums: src/llama-sampler.cpp), and the usual
 * chain (top-k, then top-p / min-p / temperature in the order given, then the draw) in one call. Owns pi2_top_k,
 * pi2_top_p_sorted, pi2_min_p_sorted, pi2_dist, pi2_sample_top_k_chain. Does not: decide which stages run or
 * draw random numbers (Python does). */
#include <math.h>
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

int32_t pi2_top_p_sorted(const float *vals, int32_t n, float p, int32_t min_keep)
{
    if (!vals || n < 1)
        return n < 0 || !vals ? PI2_ERR_INVALID : 0;
    float sum = 0.0f;           /* llama_sampler_softmax_impl: expf(l - max), a float running sum, divide */
    for (int32_t i = 0; i < n; i++)
        sum += expf(vals[i] - vals[0]);
    float cum = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        cum += expf(vals[i] - vals[0]) / sum;
        if (cum >= p && i + 1 >= min_keep)
            return i + 1;
    }
    return n;
}

int32_t pi2_min_p_sorted(const float *vals, int32_t n, float p, int32_t min_keep)
{
    if (!vals || n < 1)
        return n < 0 || !vals ? PI2_ERR_INVALID : 0;
    const float min_logit = vals[0] + logf(p);
    int32_t i = 1;              /* the first token always stays */
    for (; i < n; i++)
        if (vals[i] < min_logit && i >= min_keep)
            break;
    return i;
}

int32_t pi2_dist(const float *vals, int32_t n, int32_t sorted, double u)
{
    if (!vals || n < 1)
        return PI2_ERR_INVALID;
    float max_l = vals[0];
    if (!sorted)
        for (int32_t i = 1; i < n; i++)
            max_l = max_l < vals[i] ? vals[i] : max_l;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += expf(vals[i] - max_l);
    const double target = sum * u;
    double run = 0.0;
    for (int32_t i = 0; i < n; i++) {
        run += expf(vals[i] - max_l);
        if (run >= target)
            return i;
    }
    return n - 1;
}

int32_t pi2_sample_top_k_chain(const float *logits, int32_t n, int32_t k, const int32_t *stages, const float *params,
                               int32_t n_stages, int32_t min_keep, double u, int32_t *ids, float *vals, int32_t *n_left)
{
    if (!logits || !ids || !vals || n < 0 || k < 1 || n_stages < 0 || (n_stages && (!stages || !params)))
        return PI2_ERR_INVALID;
    int32_t m = pi2_top_k(logits, n, k, ids, vals);
    if (m != k)
        return PI2_SAMPLE_FEW;      /* fewer than k numbers: the step-by-step chain decides */
    for (int32_t s = 0; s < n_stages; s++) {
        const float p = params[s];
        switch (stages[s]) {
        case PI2_SAMPLE_TOP_P:
            m = pi2_top_p_sorted(vals, m, p, min_keep);
            break;
        case PI2_SAMPLE_MIN_P:
            m = pi2_min_p_sorted(vals, m, p, min_keep);
            break;
        case PI2_SAMPLE_TEMP:       /* llama_sampler_temp_impl: divide; temp <= 0 keeps the first largest only */
            for (int32_t i = 0; i < m; i++)
                vals[i] = p <= 0.0f ? (i ? -INFINITY : vals[i]) : vals[i] / p;
            break;
        default:
            return PI2_ERR_INVALID;
        }
    }
    if (n_left)
        *n_left = m;
    const int32_t i = pi2_dist(vals, m, 1, u);
    return i < 0 ? i : ids[i];
}
