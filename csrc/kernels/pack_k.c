/* pack_k.c — the x8 repacked layout of the 256-value K-quant types (pack.h, "x8 in 4-byte units"): pack and
 * unpack, unit by unit (the scalar twin of pi2/reference/quants.py pack_rows).
 * Layout: like the 32-value types, groups of 8 rows and per block column the same unit of the 8 rows side by
 *   side, a unit being a 2-byte field or 4 bytes of a longer one: unit a of rows 0..7, then the next unit.
 *   Q4_K, field by field: d[8], dmin[8], scales[3][8][4], qs[32][8][4].
 *   Q6_K, in the order its kernels read them (one forward stream per column): d[8], scales[4][8][4], then
 *   for c in 0..7, h in 0..1: ql unit 16h+c, ql unit 16h+8+c, qh unit 8h+c (each [8][4]): the 4 codes of
 *   values 4c..4c+3 of the 4 32-value chunks of half h.
 *   Q5_K, in its kernels' read order: d[8], dmin[8], scales[3][8][4], then for c in 0..7: qh unit c, qs units
 *   8k+c for k in 0..3 (each [8][4]): the codes of values 4c..4c+3 of every 32-value sub-block.
 *   A 32-byte load of a unit holds 4 codes of each of the 8 rows: the kernels' lanes are the rows.
 * Does not: compute, or decide what to pack. */
#include "pack.h"
#include "traits.h"

int pi2_pack_k_fields(int32_t type, int32_t f[4]) {
    switch (type) {
    case PI2_T_Q4_K: f[0] = 2; f[1] = 2; f[2] = 12; f[3] = 128; return 4;
    case PI2_T_Q6_K: f[0] = 128; f[1] = 64; f[2] = 16; f[3] = 2; return 4;
    case PI2_T_Q5_K: f[0] = 4; f[1] = 12; f[2] = 32; f[3] = 128; return 4;   /* d and dmin as one field */
    }
    return 0;
}

/* The units of one block column in packed order: their byte offsets in the plain block and sizes; their count. */
static int k_units(int32_t type, int16_t off[64], int8_t size[64]) {
    int n = 0;
    if (type == PI2_T_Q6_K) {   /* d, scales, then (c, h): ql 16h+c, ql 16h+8+c, qh 8h+c */
        off[n] = 208; size[n++] = 2;
        for (int a = 0; a < 4; a++) { off[n] = (int16_t)(192 + 4 * a); size[n++] = 4; }
        for (int c = 0; c < 8; c++)
            for (int h = 0; h < 2; h++) {
                off[n] = (int16_t)(4 * (16 * h + c)); size[n++] = 4;
                off[n] = (int16_t)(4 * (16 * h + 8 + c)); size[n++] = 4;
                off[n] = (int16_t)(128 + 4 * (8 * h + c)); size[n++] = 4;
            }
        return n;
    }
    if (type == PI2_T_Q5_K) {   /* d, dmin, scales, then per c: qh unit c, qs units 8k + c for k = 0..3 */
        off[n] = 0; size[n++] = 2;
        off[n] = 2; size[n++] = 2;
        for (int a = 0; a < 3; a++) { off[n] = (int16_t)(4 + 4 * a); size[n++] = 4; }
        for (int c = 0; c < 8; c++) {
            off[n] = (int16_t)(16 + 4 * c); size[n++] = 4;
            for (int k = 0; k < 4; k++) { off[n] = (int16_t)(48 + 32 * k + 4 * c); size[n++] = 4; }
        }
        return n;
    }
    int32_t f[4];
    const int nf = pi2_pack_k_fields(type, f);
    int16_t o = 0;
    for (int k = 0; k < nf; k++) {   /* field by field */
        const int8_t u = f[k] == 2 ? 2 : 4;
        for (int32_t a = 0; a < f[k] / u; a++) { off[n] = (int16_t)(o + a * u); size[n++] = u; }
        o = (int16_t)(o + f[k]);
    }
    return n;
}

/* One group: plain rows (row_bytes apart) <-> packed bytes, in the direction `pack`. */
static void convert_group_k(int32_t type, uint8_t *plain, size_t row_bytes, uint8_t *packed, int64_t n_blocks, int pack) {
    int16_t off[64];
    int8_t size[64];
    const int nu = k_units(type, off, size);
    size_t ts = 0;
    for (int k = 0; k < nu; k++) ts += (size_t)size[k];
    for (int64_t i = 0; i < n_blocks; i++) {
        uint8_t *q = packed + (size_t)i * PI2_PACK_ROWS * ts;
        for (int k = 0; k < nu; k++)
            for (int r = 0; r < PI2_PACK_ROWS; r++, q += size[k]) {
                uint8_t *p = plain + (size_t)r * row_bytes + (size_t)i * ts + (size_t)off[k];
                if (size[k] == 2) memcpy(pack ? q : p, pack ? p : q, 2);
                else memcpy(pack ? q : p, pack ? p : q, 4);
            }
    }
}

void pi2_pack_k_rows(int32_t type, const uint8_t *src, int64_t n_rows, int64_t n_blocks, uint8_t *dst) {
    const size_t rb = (size_t)n_blocks * (size_t)pi2_traits(type, PI2_K_IMPL_REF)->type_size;
    for (int64_t g = 0; g < n_rows / PI2_PACK_ROWS; g++)
        convert_group_k(type, (uint8_t *)src + (size_t)g * PI2_PACK_ROWS * rb, rb, dst + (size_t)g * PI2_PACK_ROWS * rb,
                        n_blocks, 1);
}

void pi2_unpack_k_group(int32_t type, const uint8_t *group, int64_t n_blocks, uint8_t *dst, size_t row_bytes) {
    convert_group_k(type, dst, row_bytes, (uint8_t *)group, n_blocks, 0);
}
