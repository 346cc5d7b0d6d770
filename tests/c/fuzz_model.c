/* fuzz_model.c — libFuzzer target for the C entry points that take numbers read from a model file: the hyper-
 * parameters and tensor descriptors of pi2_model_load (roles, layers, types, shapes, offsets, sizes, strides), then
 * pi2_ctx_init and one pi2_decode when the model loads. The input edits a valid one-layer F32 llama (dims 32, vocab
 * 32, in a 160 KiB file written once): each 10-byte record picks a field (a byte), a target (a byte) and a value
 * (8 bytes, little-endian); a target past the descriptors duplicates or drops one.
 * What must hold: every load returns a status (no crash, no sanitizer report, no read outside the file), and a
 * loaded model decodes. Built and run by scripts/fuzz.sh (clang -fsanitize=fuzzer,address,undefined). */
#include "../../csrc/pi2.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { E = 32, V = 32, F = 64, H = 2, HKV = 1, HD = 16, MAXD = 32 };

static char path[64];
static uint64_t file_size;

static void write_file(void) {
    snprintf(path, sizeof path, "/tmp/pi2-fuzz-model-%d.bin", (int)getpid());
    file_size = 160 * 1024;
    float *w = malloc(file_size);
    for (uint64_t i = 0; i < file_size / 4; i++) w[i] = (float)((int)(i * 2654435761u % 2001) - 1000) * 1e-4f;
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(w, 1, file_size, f) != file_size) abort();
    fclose(f);
    free(w);
}

static int base(pi2_model_params *p, pi2_tensor_desc *d) {
    *p = (pi2_model_params){.arch = PI2_ARCH_LLAMA, .n_vocab = V, .n_embd = E, .n_layer = 1, .n_ff = F, .n_head = H,
                            .n_head_kv = HKV, .head_dim = HD, .head_dim_v = HD, .n_rot = HD, .rms_eps = 1e-5f,
                            .rope_base = 10000.f, .rope_freq_scale = 1.f, .embd_scale = 1.f, .attn_scale = 0.25f,
                            .ffn_act = PI2_ACT_SILU};
    const struct { int role, layer; int64_t cols, rows; } t[] = {
        {PI2_TENSOR_TOKEN_EMBD, -1, E, V}, {PI2_TENSOR_OUTPUT_NORM, -1, E, 1}, {PI2_TENSOR_OUTPUT, -1, E, V},
        {PI2_TENSOR_ATTN_NORM, 0, E, 1}, {PI2_TENSOR_ATTN_Q, 0, E, H * HD}, {PI2_TENSOR_ATTN_K, 0, E, HKV * HD},
        {PI2_TENSOR_ATTN_V, 0, E, HKV * HD}, {PI2_TENSOR_ATTN_OUTPUT, 0, H * HD, E}, {PI2_TENSOR_FFN_NORM, 0, E, 1},
        {PI2_TENSOR_FFN_GATE, 0, E, F}, {PI2_TENSOR_FFN_UP, 0, E, F}, {PI2_TENSOR_FFN_DOWN, 0, F, E}};
    uint64_t off = 0;
    int n = (int)(sizeof t / sizeof t[0]);
    for (int i = 0; i < n; i++) {
        const uint64_t nb = (uint64_t)t[i].cols * (uint64_t)t[i].rows * 4;
        d[i] = (pi2_tensor_desc){.role = t[i].role, .layer = t[i].layer, .type = 0,
                                 .ne = {t[i].cols, t[i].rows > 1 ? t[i].rows : 1, 1, 1}, .offset = off, .nbytes = nb};
        if (t[i].rows == 1) d[i].ne[1] = 1;
        off += (nb + 31) / 32 * 32;
    }
    return n;
}

static void edit_params(pi2_model_params *p, uint8_t field, uint64_t v) {
    int32_t *ints[] = {&p->arch, &p->n_vocab, &p->n_embd, &p->n_layer, &p->n_ff, &p->n_head, &p->n_head_kv,
                       &p->head_dim, &p->head_dim_v, &p->n_rot, &p->rope_neox, &p->qkv_bias, &p->qk_norm,
                       &p->post_norms, &p->ffn_act, &p->q_prescale, &p->sliding_window, &p->swa_period};
    float *floats[] = {&p->rms_eps, &p->rope_base, &p->rope_base_local, &p->rope_freq_scale, &p->embd_scale,
                       &p->attn_scale, &p->logit_softcap};
    const int ni = (int)(sizeof ints / sizeof ints[0]), nf = (int)(sizeof floats / sizeof floats[0]);
    if (field % (ni + nf) < ni) *ints[field % (ni + nf)] = (int32_t)v;
    else { uint32_t b = (uint32_t)v; memcpy(floats[field % (ni + nf) - ni], &b, 4); }
}

static void edit_desc(pi2_tensor_desc *d, uint8_t field, uint64_t v) {
    switch (field % 10) {
    case 0: d->role = (int32_t)v; break;
    case 1: d->layer = (int32_t)v; break;
    case 2: d->type = (int32_t)v; break;
    case 3: case 4: case 5: case 6: d->ne[field % 10 - 3] = (int64_t)v; break;
    case 7: d->offset = v; break;
    case 8: d->nbytes = v; break;
    default: d->row_stride = v; break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!path[0]) write_file();
    pi2_model_params p;
    pi2_tensor_desc d[MAXD];
    int n = base(&p, d);
    for (size_t at = 0; at + 10 <= size; at += 10) {
        const uint8_t field = data[at], target = data[at + 1];
        uint64_t v;
        memcpy(&v, data + at + 2, 8);
        if (target == 0xff) edit_params(&p, field, v);
        else if (target < n) edit_desc(&d[target], field, v);
        else if (target & 1 && n < MAXD) d[n++] = d[(size_t)v % (size_t)n];      /* a duplicate */
        else if (n > 0) d[(size_t)v % (size_t)n] = d[--n];                        /* one dropped */
    }
    pi2_model *m = NULL;
    if (pi2_model_load(path, &p, d, n, &m) == PI2_OK) {
        pi2_ctx_params cp = pi2_ctx_default_params();
        cp.n_ctx = 8;
        cp.n_batch = 4;
        pi2_ctx *c = NULL;
        if (pi2_ctx_init(m, &cp, &c) == PI2_OK) {
            const int32_t tok[2] = {size ? data[0] % (p.n_vocab > 0 ? p.n_vocab : 1) : 0, 1 % p.n_vocab};
            float *logits = malloc(sizeof(float) * 2 * (size_t)p.n_vocab);
            if (logits) pi2_decode(c, tok, 2, logits, 1);
            free(logits);
            pi2_ctx_free(c);
        }
        pi2_model_free(m);
    }
    return 0;
}
