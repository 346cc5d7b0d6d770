/* pack_k.c — the x8 repacked layout of the 256-value K-quant types (pack.h, "x8 in 4-byte units"): pack and
 * unpack, field by field and 4-byte unit by unit (the scalar twin of pi2/reference/quants.py pack_rows).
 * Layout: like the 32-value types, groups of 8 rows and per block column each field of the 8 rows side by
 *   side, but a field longer than 2 bytes is interleaved in 4-byte units: unit a of rows 0..7, then unit a+1...
 *   Q4_K = d[8], dmin[8], scales[3][8][4], qs[32][8][4]; Q6_K = ql[32][8][4], qh[16][8][4], scales[4][8][4],
 *   d[8]. A 32-byte load of qs unit a holds 4 codes of each of the 8 rows: the kernels' lanes are the rows.
 * Does not: compute, or decide what to pack. */
#include "pack.h"
#include "traits.h"

int pi2_pack_k_fields(int32_t type, int32_t f[4]) {
    switch (type) {
    case PI2_T_Q4_K: f[0] = 2; f[1] = 2; f[2] = 12; f[3] = 128; return 4;
    case PI2_T_Q6_K: f[0] = 128; f[1] = 64; f[2] = 16; f[3] = 2; return 4;
    }
    return 0;
}

/* One group: plain rows (row_bytes apart) <-> packed bytes, in the direction `pack`. */
static void convert_group_k(int32_t type, uint8_t *plain, size_t row_bytes, uint8_t *packed, int64_t n_blocks, int pack) {
    int32_t f[4];
    const int nf = pi2_pack_k_fields(type, f);
    size_t ts = 0;
    for (int k = 0; k < nf; k++) ts += (size_t)f[k];
    for (int64_t i = 0; i < n_blocks; i++) {
        uint8_t *col = packed + (size_t)i * PI2_PACK_ROWS * ts;
        size_t off = 0;
        for (int k = 0; k < nf; k++) {
            const int32_t u = f[k] == 2 ? 2 : 4;
            for (int32_t a = 0; a < f[k] / u; a++)
                for (int r = 0; r < PI2_PACK_ROWS; r++) {
                    uint8_t *p = plain + (size_t)r * row_bytes + (size_t)i * ts + off + (size_t)a * u;
                    uint8_t *q = col + off * PI2_PACK_ROWS + ((size_t)a * PI2_PACK_ROWS + (size_t)r) * u;
                    if (u == 2) memcpy(pack ? q : p, pack ? p : q, 2);
                    else memcpy(pack ? q : p, pack ? p : q, 4);
                }
            off += (size_t)f[k];
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
