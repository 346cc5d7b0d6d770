/* model_pack.c — pi2_model_repack: the loaded model's dense matrices copied into the x8 layout
 * (kernels/pack.h) that the packed kernels stream, llama.cpp's CPU_REPACK idea in a layout of pi2's own.
 * Does: choose the matrices (attention and output; the FFN's gate, up and down when asked: a dense FFN run in
 *       memory), copy them once into one block (2 MiB-aligned on huge pages when it is that large), point each
 *       weight's `packed` at its copy,
 *       release the mapped pages the copies replace (MADV_DONTNEED on whole pages: the sparse paths and the
 *       embeddings read the file's rows again if they need them).
 * Does not: change any result (each packed kernel returns its plain kernel's bits), pack types or
 *       tables without a packed kernel, or pack matrices whose rows are not 8-row groups of tight rows. */
#define _GNU_SOURCE
#include "ffn/down_pack.h"
#include "ffn/moe.h"
#include "internal.h"
#include "kernels/pack.h"
#include "model.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Whether w can be packed for table impl, and its bytes. */
static size_t packable(const pi2_weight *w, int32_t impl) {
    if (!w->data || w->packed || w->n_out % PI2_PACK_ROWS) return 0;
    const pi2_type_traits *t = pi2_traits(w->type, impl);
    int32_t f[4];
    if (!t || !t->vec_dot_pack || !pi2_pack_fields(w->type, f)) return 0;
    if (w->row_bytes != (size_t)(w->n_in / t->block_size) * (size_t)t->type_size || w->row_bytes > PI2_PACK_MAX_ROW_BYTES)
        return 0;
    return (size_t)w->n_out * w->row_bytes;
}

/* The weights of pass `ffn` (0: attention and output, 1: the FFN), up to 3 per layer + 1. */
/* The MoE family multiplies F32, F16 and Q4_0 in ggml's own orders (ffn/moe_mm.c), not the packed kernels'. */
static int own_order(const pi2_model *m, const pi2_weight *w) {
    return m->hp.arch == PI2_ARCH_MOE && (w->type == PI2_T_F32 || w->type == PI2_T_F16 || w->type == PI2_T_Q4_0);
}

static int32_t list(pi2_model *m, int ffn, pi2_weight **w) {
    int32_t n = 0;
#define ADD(x) do { if (!own_order(m, (x))) w[n++] = (x); } while (0)
    for (int32_t il = 0; il < m->hp.n_layer; il++) {
        pi2_layer *L = &m->layers[il];
        if (ffn) {
            ADD(&L->gate); ADD(&L->up); ADD(&L->down);
        } else {
            ADD(&L->q); ADD(&L->k); ADD(&L->v); ADD(&L->o);
        }
    }
    if (!ffn) ADD(&m->output);
#undef ADD
    return n;
}

static void release_pages(const uint8_t *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) / page * page,
                    b = ((uintptr_t)p + n) / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
}

pi2_status pi2_model_repack(pi2_model *m, int32_t impl, int32_t ffn, int64_t *bytes) {
    if (!m || impl < PI2_IMPL_AUTO || impl > PI2_IMPL_BASE) return pi2_set_error(PI2_ERR_INVALID, "NULL model or unknown impl");
    for (int pass = 0; pass <= (ffn != 0); pass++) {
        if (m->packs[pass]) continue;
        pi2_weight **w = malloc(sizeof *w * (4 * (size_t)m->hp.n_layer + 1));
        if (!w) return pi2_set_error(PI2_ERR_NOMEM, "out of memory");
        const int32_t n = list(m, pass, w);
        size_t total = 0;
        for (int32_t i = 0; i < n; i++) total += (packable(w[i], impl) + 63) / 64 * 64;
        /* 2 MiB-aligned and huge pages where the kernel grants them: the kernels stream the whole arena every
         * token, and 4 KiB pages cost a TLB miss per 64 lines */
        const size_t huge = (size_t)2 << 20;
        total = total >= huge ? (total + huge - 1) / huge * huge : total;
        uint8_t *arena = total ? aligned_alloc(total >= huge ? huge : 64, total) : NULL;
#ifdef MADV_HUGEPAGE
        if (arena && total >= huge) madvise(arena, total, MADV_HUGEPAGE);
#endif
        if (total && !arena) {
            free(w);
            return pi2_set_error(PI2_ERR_NOMEM, "out of memory for %zu bytes of repacked weights", total);
        }
        size_t off = 0;
        for (int32_t i = 0; i < n; i++) {
            const size_t sz = packable(w[i], impl);
            if (!sz) continue;
            pi2_pack_rows(w[i]->type, w[i]->data, w[i]->n_out, w[i]->n_in / pi2_traits(w[i]->type, impl)->block_size,
                          arena + off);
            w[i]->packed = arena + off;
            off += (sz + 63) / 64 * 64;
            /* each copy's pages released as soon as it is made (the peak holds one matrix twice, not a pass);
             * the tied output's rows stay mapped: embeddings read a row per token */
            if (w[i]->data != m->token_embd.data && !m->in_memory)   /* file pages only: */
                release_pages(w[i]->data, (size_t)w[i]->n_out * w[i]->row_bytes);   /* memory would read zeros */
        }
        free(w);
        m->packs[pass] = arena;
        m->packed_bytes += (int64_t)total;
    }
    if (ffn) {   /* a MoE model's experts, and a pi2 file's Q4_1/Q5_1 down rows, in their own layouts' kernels */
        pi2_status s = pi2_moe_repack(m, impl);
        if (s == PI2_OK) s = pi2_ffn_down_pack(m, impl);
        if (s != PI2_OK) return s;
    }
    if (bytes) *bytes = m->packed_bytes;
    return PI2_OK;
}
