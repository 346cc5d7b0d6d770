/* ffn/down_pack.c — pi2_ffn_down_pack: a pi2 file's bundles with Q4_1/Q5_1 down rows copied, once at load, for
 * decoding in memory: the down rows into the per-group layout whose kernel streams them (kernels/axpy_qx1_pack.h),
 * the up rows back to back (a bundle's up row and down row side by side make the hardware prefetcher fetch both
 * when one token reads only the up rows there), of which the dense prefix (pi2_model_ffn_prefix: the hottest
 * neurons, active for nearly every token) in the x8 layout the dense kernels stream (kernels/pack.h), in place.
 * Does: size, allocate (2 MiB-aligned on huge pages when large), copy layer by layer, point each layer at its
 *       copies, release the bundles' mapped pages (as model_pack.c does for the matrices it packs).
 * Does not: change any result (the down kernel returns axpy_group's bits; the up rows are the same bytes). */
#define _GNU_SOURCE
#include "ffn/down_pack.h"

#include "internal.h"
#include "kernels/axpy_qx1_pack.h"
#include "kernels/pack.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

_Static_assert(PI2_QX1P_ROWS == PI2_FFN_GROUP, "the packed groups are the sparse FFN's groups");

/* bytes of one tight up row of L */
static size_t up_bytes(const pi2_layer *L, int32_t impl) {
    const pi2_type_traits *t = pi2_traits(L->up.type, impl);
    return t ? (size_t)(L->up.n_in / t->block_size) * (size_t)t->type_size : 0;
}

static size_t down_bytes(const pi2_layer *L, int64_t n_ff) {
    return (size_t)((n_ff + PI2_QX1P_ROWS - 1) / PI2_QX1P_ROWS) * pi2_qx1p_group_bytes(L->down_rows.type, L->down_rows.n_in / 32);
}

static size_t layer_bytes(const pi2_layer *L, int32_t impl, int64_t n_ff) {
    const pi2_weight *w = &L->down_rows;
    if (!w->data || !L->up.data || L->down_qx1p || !pi2_kernels_axpy_qx1p(w->type, impl) || w->n_in % 32 ||
        !up_bytes(L, impl))
        return 0;
    return (down_bytes(L, n_ff) + (size_t)n_ff * up_bytes(L, impl) + 63) / 64 * 64;
}

static void release_pages(const uint8_t *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) / page * page,
                    b = ((uintptr_t)p + n) / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

pi2_status pi2_model_ffn_prefix(pi2_model *m, const int32_t *n_dense, int32_t n_layer) {
    if (!m || !n_dense || n_layer != m->hp.n_layer) return pi2_set_error(PI2_ERR_INVALID, "NULL or wrong layer count");
    if (m->down_pack) return pi2_set_error(PI2_ERR_INVALID, "the FFN's copies are made already");
    for (int32_t il = 0; il < n_layer; il++) {
        const int64_t n = n_dense[il] < 0 ? 0 : n_dense[il] > m->hp.n_ff ? m->hp.n_ff : n_dense[il];
        m->layers[il].up_dense = (int32_t)(n / PI2_PACK_ROWS * PI2_PACK_ROWS);
    }
    return PI2_OK;
}

/* The bytes of L's dense prefix in the x8 layout: 0 where none is asked for or the up type has no packed kernel. */
static size_t prefix_bytes(const pi2_layer *L, int32_t impl) {
    const pi2_type_traits *t = pi2_traits(L->up.type, impl);
    int32_t f[4];
    if (L->up_dense <= 0 || !t || !t->vec_dot_pack || !pi2_pack_fields(L->up.type, f) ||
        up_bytes(L, impl) > PI2_PACK_MAX_ROW_BYTES)
        return 0;
    return (size_t)L->up_dense * up_bytes(L, impl);
}

/* The first L->up_dense tight up rows (at up) into the x8 layout in place (through tmp), and L->up_x8 at them. */
static void pack_prefix(pi2_layer *L, int32_t impl, uint8_t *up, uint8_t *tmp) {
    const size_t n = prefix_bytes(L, impl), ub = up_bytes(L, impl);
    if (!n) return;
    pi2_pack_rows(L->up.type, up, L->up_dense, L->up.n_in / pi2_traits(L->up.type, impl)->block_size, tmp);
    memcpy(up, tmp, n);
    L->up_x8 = (pi2_weight){.data = up, .type = L->up.type, .n_in = L->up.n_in, .n_out = L->up_dense, .row_bytes = ub,
                            .packed = up};
}

pi2_status pi2_ffn_down_pack(pi2_model *m, int32_t impl) {
    if (!m) return pi2_set_error(PI2_ERR_INVALID, "NULL model");
    if (m->down_pack) return PI2_OK;
    const int64_t n_ff = m->hp.n_ff;
    size_t total = 0, tmp_bytes = 0;
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        const size_t sz = layer_bytes(&m->layers[il], impl, n_ff), pb = sz ? prefix_bytes(&m->layers[il], impl) : 0;
        total += sz;
        tmp_bytes = pb > tmp_bytes ? pb : tmp_bytes;
    }
    if (!total) return PI2_OK;
    uint8_t *tmp = tmp_bytes ? malloc(tmp_bytes) : NULL;   /* where a prefix is packed before it goes in place */
    if (tmp_bytes && !tmp) return pi2_set_error(PI2_ERR_NOMEM, "out of memory for %zu bytes", tmp_bytes);
    const size_t huge = (size_t)2 << 20;
    if (total >= huge) total = (total + huge - 1) / huge * huge;
    uint8_t *arena = aligned_alloc(total >= huge ? huge : 64, (total + 63) / 64 * 64);
    if (!arena) {
        free(tmp);
        return pi2_set_error(PI2_ERR_NOMEM, "out of memory for %zu bytes of repacked down rows", total);
    }
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
        uint8_t *up = arena + off + down_bytes(L, n_ff);
        const size_t ub = up_bytes(L, impl);
        for (int64_t r = 0; r < n_ff; r++) memcpy(up + (size_t)r * ub, L->up.data + (size_t)r * L->up.row_bytes, ub);
        L->up_tight = up;
        pack_prefix(L, impl, up, tmp);
        off += sz;
        /* the bundles' pages (bundle-ud: up row, down row; a gud bundle's gate rows are read every token) */
        const uint8_t *b0 = L->up.data, *b1 = b0 + (size_t)n_ff * L->up.row_bytes;
        if (!m->in_memory && !(L->gate.data >= b0 && L->gate.data < b1) && L->down_rows.data >= b0 && L->down_rows.data < b1)
            release_pages(b0, (size_t)(b1 - b0));
    }
    free(tmp);
    m->down_pack = arena;
    m->packed_bytes += (int64_t)total;
    return PI2_OK;
}
