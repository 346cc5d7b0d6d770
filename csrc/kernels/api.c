/* api.c — the public kernel entry points of pi2.h: argument checks, then loops over rows.
 * Does: validate types, sizes and pointers (every error leaves a message); run to_float,
 *       quantize_act and vec_dot from the traits table row by row.
 * Does not: contain kernels or choose them (traits.c), use threads (a forward pass will split
 *       rows between its own threads and call the traits table directly). */
#include "../internal.h"
#include "pack.h"
#include "traits.h"

uint32_t pi2_kernel_isa(void) { return pi2_kernels_isa(); }

static pi2_status lookup(int32_t type, int32_t impl, const pi2_type_traits **out) {
    if (impl < PI2_IMPL_AUTO || impl > PI2_IMPL_BASE)
        return pi2_set_error(PI2_ERR_INVALID, "unknown kernel impl %d (0 auto, 1 ref, 2 base)", (int)impl);
    *out = pi2_traits(type, impl);
    if (!*out) return pi2_set_error(PI2_ERR_UNSUPPORTED, "ggml type %d is not supported by pi2's kernels", (int)type);
    return PI2_OK;
}

static pi2_status check_shape(const pi2_type_traits *t, size_t row_bytes, int64_t n_rows, int64_t n_cols) {
    if (n_cols <= 0 || n_cols % t->block_size)
        return pi2_set_error(PI2_ERR_INVALID, "%s rows need a positive multiple of %d values, got %lld",
                             t->name, (int)t->block_size, (long long)n_cols);
    if (n_rows < 0) return pi2_set_error(PI2_ERR_INVALID, "negative row count %lld", (long long)n_rows);
    const size_t need = (size_t)(n_cols / t->block_size) * (size_t)t->type_size;
    if (row_bytes < need)
        return pi2_set_error(PI2_ERR_INVALID, "%s row of %lld values needs %zu bytes, row_bytes is %zu",
                             t->name, (long long)n_cols, need, row_bytes);
    return PI2_OK;
}

pi2_status pi2_kernel_type_info(int32_t type, int32_t impl, pi2_type_info *out) {
    const pi2_type_traits *t;
    pi2_status st = lookup(type, impl, &t);
    if (st) return st;
    if (!out) return pi2_set_error(PI2_ERR_INVALID, "NULL output");
    const pi2_cpu_variant *v = pi2_kernels_variant();
    if (v->error[0]) return pi2_set_error(PI2_ERR_INVALID, "%s", v->error);   /* a bad PI2_CPU_VARIANT */
    *out = (pi2_type_info){t->name, t->block_size, t->type_size, t->vec_dot_type, t->vec_dot != NULL,
                           t->vec_dot_impl, 0, t->vec_dot != NULL && t->vec_dot_pack != NULL, v->name, v->why};
    return PI2_OK;
}

pi2_status pi2_dequantize_rows(int32_t type, const void *src, size_t row_bytes, float *dst,
                               int64_t n_rows, int64_t n_cols, int32_t impl) {
    const pi2_type_traits *t;
    pi2_status st = lookup(type, impl, &t);
    if (st || (st = check_shape(t, row_bytes, n_rows, n_cols))) return st;
    if ((!src || !dst) && n_rows) return pi2_set_error(PI2_ERR_INVALID, "NULL buffer");
    for (int64_t r = 0; r < n_rows; r++)
        t->to_float((const uint8_t *)src + (size_t)r * row_bytes, dst + r * n_cols, n_cols);
    return PI2_OK;
}

pi2_status pi2_quantize_act(int32_t vdt, const float *x, int64_t n, void *out) {
    const pi2_type_traits *t;
    pi2_status st = lookup(vdt, PI2_IMPL_REF, &t);
    if (st) return st;
    if (!t->quantize_act)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "%s has no activation format (its rows are only summed by axpy_group)",
                             t->name);
    if (t->vec_dot_type != vdt)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "%s is not an activation format (use %s)", t->name,
                             pi2_traits(t->vec_dot_type, PI2_IMPL_REF)->name);
    if ((st = check_shape(t, (size_t)-1, 1, n))) return st;
    if (!x || !out) return pi2_set_error(PI2_ERR_INVALID, "NULL buffer");
    t->quantize_act(x, out, n);
    return PI2_OK;
}

pi2_status pi2_matvec(int32_t type, const void *w, size_t row_bytes, int64_t n_rows, int64_t n_cols,
                      const void *x_q, float *out, int32_t impl) {
    const pi2_type_traits *t;
    pi2_status st = lookup(type, impl, &t);
    if (st || (st = check_shape(t, row_bytes, n_rows, n_cols))) return st;
    if (!t->vec_dot)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, t->quantize_act ? "%s is an activation format, not a weight type"
                             : "%s rows have no vec_dot (only the sparse FFN's grouped row sum)", t->name);
    if ((!w || !x_q || !out) && n_rows) return pi2_set_error(PI2_ERR_INVALID, "NULL buffer");
    for (int64_t r = 0; r < n_rows; r++)
        t->vec_dot(n_cols, &out[r], (const uint8_t *)w + (size_t)r * row_bytes, x_q);
    return PI2_OK;
}

static pi2_status pack_shape(int32_t type, int64_t n_rows, int64_t n_cols, const pi2_type_traits **t) {
    int32_t f[4];
    pi2_status st = lookup(type, PI2_IMPL_REF, t);
    if (st) return st;
    if (!pi2_pack_fields(type, f))
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "%s rows have no packed layout", (*t)->name);
    if ((st = check_shape(*t, (size_t)-1, n_rows, n_cols))) return st;
    if (n_rows % PI2_PACK_ROWS)
        return pi2_set_error(PI2_ERR_INVALID, "packed rows come in groups of %d, got %lld rows", PI2_PACK_ROWS,
                             (long long)n_rows);
    return PI2_OK;
}

pi2_status pi2_repack_rows(int32_t type, const void *src, int64_t n_rows, int64_t n_cols, void *dst, int32_t unpack) {
    const pi2_type_traits *t;
    pi2_status st = pack_shape(type, n_rows, n_cols, &t);
    if (st) return st;
    if ((!src || !dst) && n_rows) return pi2_set_error(PI2_ERR_INVALID, "NULL buffer");
    const int64_t nb = n_cols / t->block_size;
    const size_t rb = (size_t)nb * (size_t)t->type_size;
    if (!unpack) pi2_pack_rows(type, src, n_rows, nb, dst);
    else
        for (int64_t g = 0; g < n_rows / PI2_PACK_ROWS; g++)
            pi2_unpack_group(type, (const uint8_t *)src + (size_t)g * PI2_PACK_ROWS * rb, nb,
                             (uint8_t *)dst + (size_t)g * PI2_PACK_ROWS * rb, rb);
    return PI2_OK;
}

pi2_status pi2_matvec_packed(int32_t type, const void *packed, int64_t n_rows, int64_t n_cols, const void *x_q,
                             float *out, int32_t impl) {
    const pi2_type_traits *t;
    pi2_status st = pack_shape(type, n_rows, n_cols, &t);
    if (st || (st = lookup(type, impl, &t))) return st;
    if (!t->vec_dot_pack)
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "no packed %s kernel in this table (%s)", t->name, t->vec_dot_impl);
    if ((!packed || !x_q || !out) && n_rows) return pi2_set_error(PI2_ERR_INVALID, "NULL buffer");
    const size_t rb = (size_t)(n_cols / t->block_size) * (size_t)t->type_size;
    for (int64_t g = 0; g < n_rows / PI2_PACK_ROWS; g++)
        t->vec_dot_pack(n_cols, out + g * PI2_PACK_ROWS, (const uint8_t *)packed + (size_t)g * PI2_PACK_ROWS * rb, x_q);
    return PI2_OK;
}
