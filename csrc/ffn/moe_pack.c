/* moe_pack.c — pi2_moe_repack: a Mixture-of-Experts model's in-memory Q4_0, Q4_K, Q6_K and Q8_0 experts copied once
 * into the x8 layout (kernels/pack.h) that the packed kernels stream, with the same bits as the plain rows' product:
 * Q4_0 for the x8 kernels (kernels/ggml_x8.c), Q4_K, Q6_K and Q8_0 for the table's vec_dot_pack (vec_dot's order:
 * the GEMV ggml's repacked q4_K_8x8 runs on each expert's rows one token at a time; Q6_K's vec_dot, and its tiled
 * order by vec_dot_pack_batch for an expert's 8+ rows of a batch; Q8_0's plain vec_dot).
 * Does: choose the expert tensors (whole 8-row groups, tight rows; Q4_0: n_in ≤ 32·PI2_X8_MAX_BLOCKS and an x8
 *       kernel on this CPU; Q4_K, Q6_K, Q8_0: a packed kernel in table `impl`), copy them into one 2 MiB-aligned block (huge
 *       pages where the kernel allows them),
 *       point each tensor's `packed` at its copy, and release each tensor's mapped pages right after its copy (the
 *       peak stays near one copy of the experts, not two).
 * Does not: touch experts streamed from flash (they keep the file's layout: moe_mm.c reads each expert in the
 *       layout its pointer has), or change any result. */
#define _GNU_SOURCE
#include "ffn/moe.h"
#include "internal.h"
#include "kernels/ggml_x8.h"
#include "kernels/pack.h"
#include "model.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

enum { HUGE_PAGE = 1 << 21 };

/* Bytes of w's x8 copy (all n_expert experts) if w is Q4_0 with an x8 kernel on this CPU, else 0. */
static size_t packable_q4_0(const pi2_weight *w, int64_t n_expert) {
    if (!w->data || w->packed || w->type != PI2_T_Q4_0 || w->n_out % PI2_PACK_ROWS || w->n_in % 32 ||
        w->n_in / 32 > PI2_X8_MAX_BLOCKS || w->row_bytes != (size_t)(w->n_in / 32) * sizeof(blk_q4_0) ||
        !pi2_go_q4_0_x8())
        return 0;
    return (size_t)n_expert * (size_t)w->n_out * w->row_bytes;
}

/* The same for Q4_K, Q6_K and Q8_0 with a packed one-token kernel in table impl (moe_mm.c unpacks a group where a
 * context's table has none, so the rows stay within PI2_PACK_MAX_ROW_BYTES). */
static size_t packable_k(const pi2_weight *w, int64_t n_expert, int32_t impl) {
    const pi2_type_traits *t = pi2_traits(w->type, impl);
    if (!w->data || w->packed || (w->type != PI2_T_Q4_K && w->type != PI2_T_Q6_K && w->type != PI2_T_Q8_0) || !t ||
        !t->vec_dot_pack ||
        w->n_out % PI2_PACK_ROWS || w->n_in % t->block_size ||
        w->row_bytes != (size_t)(w->n_in / t->block_size) * (size_t)t->type_size || w->row_bytes > PI2_PACK_MAX_ROW_BYTES)
        return 0;
    return (size_t)n_expert * (size_t)w->n_out * w->row_bytes;
}

static size_t packable(const pi2_weight *w, int64_t n_expert, int32_t impl) {
    return w->type == PI2_T_Q4_0 ? packable_q4_0(w, n_expert) : packable_k(w, n_expert, impl);
}

static void release_pages(const uint8_t *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) / page * page,
                    b = ((uintptr_t)p + n) / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

pi2_status pi2_moe_repack(pi2_model *m, int32_t impl) {
    const int64_t X = m->hp.n_expert;
    if (m->hp.arch != PI2_ARCH_MOE || !X || m->moe_pack) return PI2_OK;
    size_t total = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        pi2_layer *L = &m->layers[il];
        total += packable(&L->gate_exps, X, impl) + packable(&L->up_exps, X, impl) + packable(&L->down_exps, X, impl);
    }
    if (!total) return PI2_OK;
    total = (total + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    uint8_t *arena = aligned_alloc(HUGE_PAGE, total);
    if (!arena) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for %zu bytes of repacked experts", total);
    madvise(arena, total, MADV_HUGEPAGE);   /* fewer TLB misses over the experts' stream; advice only */
    size_t off = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        pi2_weight *w[3] = {&m->layers[il].gate_exps, &m->layers[il].up_exps, &m->layers[il].down_exps};
        for (int i = 0; i < 3; i++) {
            const size_t sz = packable(w[i], X, impl);
            if (!sz) continue;
            pi2_pack_rows(w[i]->type, w[i]->data, X * w[i]->n_out,
                          w[i]->n_in / pi2_traits(w[i]->type, PI2_K_IMPL_REF)->block_size, arena + off);
            if (!m->in_memory)      /* file pages only: a context on the file layout (another kernel table) would
                                     * read zeros from released anonymous memory */
                release_pages(w[i]->data, sz);
            w[i]->packed = arena + off;
            off += sz;
        }
    }
    m->moe_pack = arena;
    m->packed_bytes += (int64_t)total;
    return PI2_OK;
}
