/* ffn/down_pack.c — pi2_ffn_down_pack: a pi2 file's Q4_1/Q5_1 down rows copied, once at load, into the
 * per-group layout whose kernel streams them (kernels/axpy_qx1_pack.h), for decoding in memory.
 * Does: size, allocate (2 MiB-aligned on huge pages when large), pack group by group, point each layer at its copy.
 * Does not: release the file's pages (the bundles hold each neuron's up row beside its down row, and batches
 *       read the file's rows), or change any result (the kernel returns axpy_group's bits). */
#define _GNU_SOURCE
#include "ffn/down_pack.h"

#include "internal.h"
#include "kernels/axpy_qx1_pack.h"

#include <stdlib.h>
#include <sys/mman.h>

_Static_assert(PI2_QX1P_ROWS == PI2_FFN_GROUP, "the packed groups are the sparse FFN's groups");

static size_t layer_bytes(const pi2_layer *L, int32_t impl, int64_t n_ff) {
    const pi2_weight *w = &L->down_rows;
    if (!w->data || L->down_qx1p || !pi2_kernels_axpy_qx1p(w->type, impl) || w->n_in % 32) return 0;
    return (size_t)((n_ff + PI2_QX1P_ROWS - 1) / PI2_QX1P_ROWS) * pi2_qx1p_group_bytes(w->type, w->n_in / 32);
}

pi2_status pi2_ffn_down_pack(pi2_model *m, int32_t impl) {
    if (!m) return pi2_set_error(PI2_ERR_INVALID, "NULL model");
    if (m->down_pack) return PI2_OK;
    const int64_t n_ff = m->hp.n_ff;
    size_t total = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) total += layer_bytes(&m->layers[il], impl, n_ff);
    if (!total) return PI2_OK;
    const size_t huge = (size_t)2 << 20;
    if (total >= huge) total = (total + huge - 1) / huge * huge;
    uint8_t *arena = aligned_alloc(total >= huge ? huge : 64, (total + 63) / 64 * 64);
    if (!arena) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for %zu bytes of repacked down rows", total);
#ifdef MADV_HUGEPAGE
    if (total >= huge) madvise(arena, total, MADV_HUGEPAGE);
#endif
    size_t off = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        pi2_layer *L = &m->layers[il];
        const size_t sz = layer_bytes(L, impl, n_ff);
        if (!sz) continue;
        const pi2_weight *w = &L->down_rows;
        const int64_t nb = w->n_in / 32;
        const size_t gb = pi2_qx1p_group_bytes(w->type, nb);
        for (int64_t r0 = 0; r0 < n_ff; r0 += PI2_QX1P_ROWS)
            pi2_qx1p_pack_group(w->type, w->data + (size_t)r0 * w->row_bytes, w->row_bytes,
                                (int32_t)(n_ff - r0 < PI2_QX1P_ROWS ? n_ff - r0 : PI2_QX1P_ROWS), nb,
                                arena + off + (size_t)(r0 / PI2_QX1P_ROWS) * gb);
        L->down_qx1p = arena + off;
        off += sz;
    }
    m->down_pack = arena;
    m->packed_bytes += (int64_t)total;
    return PI2_OK;
}
