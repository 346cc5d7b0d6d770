/* forward_driver.c — runs pi2's C forward pass from a description file, without Python, so that the
 * engine can be tested where Python cannot run (aarch64 under qemu; tests/test_aarch64_forward.py).
 * Does: read DESC (written by that test from pi2.engine.c_model_structs), load the model through the
 *       public API (pi2.h), decode the first n_prompt tokens as one batch and every later token alone,
 *       and write the logits of every token (n_tokens x n_vocab float32, native byte order) to OUT.
 * Does not: tokenize, sample or read GGUF metadata (Python did all of that when it wrote DESC).
 * DESC layout (little-endian, the structs as cffi lays them out on an LP64 ABI, which x86-64 and
 * aarch64 share): "PI2D", u32 version 1, u32 sizeof(pi2_model_params), u32 sizeof(pi2_tensor_desc),
 * i32 n_tensors, i32 n_tokens, i32 n_prompt, i32 n_ctx, i32 n_threads, i32 impl, u32 path length,
 * the model path, pi2_model_params, pi2_tensor_desc[n_tensors], i32 tokens[n_tokens].
 * Usage: forward_driver DESC OUT. Exit status 0 on success, 1 with a message on stderr otherwise. */
#include "../../csrc/pi2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint32_t version, params_size, desc_size;
    int32_t n_tensors, n_tokens, n_prompt, n_ctx, n_threads, impl;
    uint32_t path_len;
} desc_header;

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "forward_driver: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    return 1;
}

static int read_all(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

static const char *last_message(void) {
    static pi2_error e;
    e.size = sizeof e;
    pi2_last_error(&e);
    return e.message;
}

int main(int argc, char **argv) {
    if (argc != 3) return fail("usage: forward_driver DESC OUT", NULL);
    FILE *f = fopen(argv[1], "rb");
    if (!f) return fail("cannot open", argv[1]);
    char magic[4];
    desc_header h;
    if (!read_all(f, magic, 4) || memcmp(magic, "PI2D", 4) || !read_all(f, &h, sizeof h) || h.version != 1)
        return fail("not a version 1 description file", argv[1]);
    if (h.params_size != sizeof(pi2_model_params) || h.desc_size != sizeof(pi2_tensor_desc))
        return fail("struct sizes differ from this build's pi2.h", NULL);
    if (h.n_tensors < 1 || h.n_tokens < 1 || h.n_prompt < 1 || h.n_prompt > h.n_tokens || h.path_len > 4096)
        return fail("bad counts in", argv[1]);
    char *path = calloc(h.path_len + 1, 1);
    pi2_model_params params;
    pi2_tensor_desc *descs = malloc(sizeof *descs * (size_t)h.n_tensors);
    int32_t *tokens = malloc(sizeof *tokens * (size_t)h.n_tokens);
    if (!path || !descs || !tokens) return fail("out of memory", NULL);
    if (!read_all(f, path, h.path_len) || !read_all(f, &params, sizeof params) ||
        !read_all(f, descs, sizeof *descs * (size_t)h.n_tensors) || !read_all(f, tokens, sizeof *tokens * (size_t)h.n_tokens))
        return fail("truncated", argv[1]);
    fclose(f);

    pi2_model *model;
    if (pi2_model_load(path, &params, descs, h.n_tensors, &model) != PI2_OK) return fail("model", last_message());
    pi2_ctx_params cp = pi2_ctx_default_params();
    cp.n_ctx = h.n_ctx, cp.n_threads = h.n_threads, cp.impl = h.impl;
    cp.n_batch = h.n_prompt > cp.n_batch ? h.n_prompt : cp.n_batch;
    pi2_ctx *ctx;
    if (pi2_ctx_init(model, &cp, &ctx) != PI2_OK) return fail("context", last_message());
    float *logits = malloc(sizeof(float) * (size_t)params.n_vocab * (size_t)h.n_tokens);
    if (!logits) return fail("out of memory", NULL);
    if (pi2_decode(ctx, tokens, h.n_prompt, logits, 1) != PI2_OK) return fail("decode", last_message());
    for (int32_t t = h.n_prompt; t < h.n_tokens; t++)
        if (pi2_decode(ctx, &tokens[t], 1, logits + (size_t)t * params.n_vocab, 0) != PI2_OK)
            return fail("decode", last_message());
    FILE *o = fopen(argv[2], "wb");
    if (!o || fwrite(logits, sizeof(float), (size_t)params.n_vocab * h.n_tokens, o) != (size_t)params.n_vocab * h.n_tokens ||
        fclose(o))
        return fail("cannot write", argv[2]);
    pi2_ctx_free(ctx);
    pi2_model_free(model);
    free(path); free(descs); free(tokens); free(logits);
    return 0;
}
