/* nnapi/graph.c — NNAPI graphs of FULLY_CONNECTED operations over F16 (or F32) weight copies: a group of
 * products sharing an input (prompt batches) and the hot prefix of an FFN layer (pi2.h, "NNAPI delegate").
 * Does: convert weights once per graph; build and compile one NNAPI model per batch size (cached, least
 *       recently used dropped); start runs with ANeuralNetworksExecution_startCompute and wait on the
 *       event; mark a graph failed (CPU from then on) at its first build, compile or run failure.
 * SiLU: NNAPI has no SiLU operation, so act(g) = g * LOGISTIC(g) is a LOGISTIC and a MUL.
 * Products are FULLY_CONNECTED (level 1; F16 from level 3) with zero bias, or, when asked for and every
 * selected device is at level 6, BATCH_MATMUL(x, W, adj_x false, adj_y true) with RELU as its own operation. */
#include "kernels/traits.h"
#include "nnapi/delegate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_W 4

typedef struct {
    int32_t n_tok;
    ANeuralNetworksModel *model;
    ANeuralNetworksCompilation *comp;
    uint64_t last_use;
} nn_shape;

enum { GRAPH_FC = 0, GRAPH_FFN = 1 };

struct pi2_nnapi_graph {
    pi2_nnapi *d;
    int32_t kind, act, n_w;           /* FC: n_w matrices; FFN: n_w = 3 (gate, up, down) */
    int64_t n_in, n_out[MAX_W];       /* input width; FC output widths (FFN: n_out[0] = n_embd) */
    int64_t n_hot;                    /* FFN: hot neurons */
    size_t es;                        /* bytes per value: 2 (F16) or 4 (F32) */
    void *w[MAX_W];                   /* weight copies [units][inputs] for FULLY_CONNECTED */
    void *bias;                       /* zeros, as long as the widest unit count */
    size_t bytes;
    nn_shape shape[MAX_SHAPES];
    int32_t n_shapes;
    uint64_t clock;
    int32_t failed;
    /* the pending run */
    ANeuralNetworksExecution *exec;
    ANeuralNetworksEvent *event;
    float *out[MAX_W];
    int32_t run_tok;
    void *xbuf, *obuf[MAX_W];         /* staging in the graph's type */
    size_t xcap, ocap[MAX_W];
};

/* ---- graphs: weight copies ---- */

static void store(const pi2_nnapi_graph *g, void *dst, size_t i, float v) {
    if (g->es == 2) ((pi2_fp16 *)dst)[i] = pi2_f32_to_fp16(v);
    else ((float *)dst)[i] = v;
}

static int check_matrix(const pi2_nnapi_matrix *m) {
    return m && m->data && m->n_rows > 0 && m->n_cols > 0 && m->row_bytes > 0;
}

/* dst[r][c] (ld columns, from column c0) = rows r0..r0+n_rows-1 of m, or the transpose of them. */
static pi2_status convert(pi2_nnapi_graph *g, const pi2_nnapi_matrix *m, int64_t r0, int64_t n_rows, int64_t n_cols,
                          int transpose, void *dst) {
    float *row = malloc((size_t)m->n_cols * sizeof(float));
    if (!row) return pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    for (int64_t r = 0; r < n_rows; r++) {
        pi2_status s = pi2_dequantize_rows(m->type, (const uint8_t *)m->data + (size_t)(r0 + r) * m->row_bytes,
                                           m->row_bytes, row, 1, m->n_cols, PI2_IMPL_REF);
        if (s) { free(row); return s; }
        for (int64_t c = 0; c < n_cols; c++)
            store(g, dst, transpose ? (size_t)c * n_rows + r : (size_t)r * n_cols + c, row[c]);
    }
    free(row);
    return PI2_OK;
}

static pi2_nnapi_graph *graph_new(pi2_nnapi *d) {
    pi2_nnapi_graph *g = calloc(1, sizeof *g);
    if (g) { g->d = d; g->es = d->p.weight_type == 1 ? 2 : 4; }
    return g;
}

static void *graph_alloc(pi2_nnapi_graph *g, size_t n) {
    void *p = calloc(n ? n : 1, g->es);
    if (p) g->bytes += n * g->es;
    return p;
}

pi2_status pi2_nnapi_fc_create(pi2_nnapi *d, const pi2_nnapi_matrix *w, int32_t n_w, pi2_nnapi_graph **out) {
    if (!out) return pi2_set_error(PI2_ERR_INVALID, "NULL output");
    *out = NULL;
    if (!d || !w || n_w < 1 || n_w > MAX_W) return pi2_set_error(PI2_ERR_INVALID, "bad NNAPI FC graph arguments");
    for (int32_t i = 0; i < n_w; i++)
        if (!check_matrix(&w[i]) || w[i].n_cols != w[0].n_cols)
            return pi2_set_error(PI2_ERR_INVALID, "NNAPI FC graph: matrix %d is empty or has another width", (int)i);
    if (!d->n_sel) return pi2_nnapi_note(d, "NNAPI: no device selected (no accelerator)");
    pi2_nnapi_graph *g = graph_new(d);
    if (!g) return pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    g->kind = GRAPH_FC;
    g->n_w = n_w;
    g->n_in = w[0].n_cols;
    int64_t widest = 0;
    pi2_status s = PI2_OK;
    for (int32_t i = 0; i < n_w && !s; i++) {
        g->n_out[i] = w[i].n_rows;
        widest = w[i].n_rows > widest ? w[i].n_rows : widest;
        g->w[i] = graph_alloc(g, (size_t)(w[i].n_rows * w[i].n_cols));
        s = g->w[i] ? convert(g, &w[i], 0, w[i].n_rows, w[i].n_cols, 0, g->w[i]) : pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    }
    if (!s && !(g->bias = graph_alloc(g, (size_t)widest))) s = pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    if (s) { pi2_nnapi_graph_free(g); return s; }
    *out = g;
    return PI2_OK;
}

pi2_status pi2_nnapi_ffn_create(pi2_nnapi *d, int32_t act, const pi2_nnapi_matrix *gate, const pi2_nnapi_matrix *up,
                                const pi2_nnapi_matrix *down, int32_t down_t, int64_t n_hot, pi2_nnapi_graph **out) {
    if (!out) return pi2_set_error(PI2_ERR_INVALID, "NULL output");
    *out = NULL;
    if (!d || !check_matrix(gate) || !check_matrix(up) || !check_matrix(down))
        return pi2_set_error(PI2_ERR_INVALID, "NNAPI FFN graph: NULL or empty matrices");
    const int64_t E = gate->n_cols;
    const int64_t n_ff = down_t ? down->n_rows : down->n_cols, down_e = down_t ? down->n_cols : down->n_rows;
    if (up->n_cols != E || down_e != E || gate->n_rows != up->n_rows || n_ff != gate->n_rows || n_hot < 1 ||
        n_hot > n_ff)
        return pi2_set_error(PI2_ERR_INVALID, "NNAPI FFN graph: shapes do not agree (n_embd %lld, n_hot %lld)",
                             (long long)E, (long long)n_hot);
    if (act != PI2_ACT_SILU && act != PI2_ACT_RELU)
        return pi2_nnapi_note(d, "NNAPI: the FFN activation %d has no NNAPI graph (SiLU and ReLU have)", (int)act);
    if (!d->n_sel) return pi2_nnapi_note(d, "NNAPI: no device selected (no accelerator)");
    pi2_nnapi_graph *g = graph_new(d);
    if (!g) return pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    g->kind = GRAPH_FFN;
    g->act = act;
    g->n_w = 3;
    g->n_in = E;
    g->n_out[0] = E;
    g->n_hot = n_hot;
    pi2_status s = PI2_OK;
    for (int i = 0; i < 3 && !s; i++)
        if (!(g->w[i] = graph_alloc(g, (size_t)(n_hot * E)))) s = pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    if (!s && !(g->bias = graph_alloc(g, (size_t)(E > n_hot ? E : n_hot)))) s = pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    if (!s) s = convert(g, gate, 0, n_hot, E, 0, g->w[0]);
    if (!s) s = convert(g, up, 0, n_hot, E, 0, g->w[1]);
    if (!s) s = down_t ? convert(g, down, 0, n_hot, E, 1, g->w[2])       /* rows of neurons -> [E][n_hot] */
                       : convert(g, down, 0, E, n_hot, 0, g->w[2]);      /* first n_hot columns of each row */
    if (s) { pi2_nnapi_graph_free(g); return s; }
    *out = g;
    return PI2_OK;
}

size_t pi2_nnapi_graph_bytes(const pi2_nnapi_graph *g) { return g ? g->bytes : 0; }

static void free_shape(pi2_nnapi *d, nn_shape *sh) {
    if (sh->comp) d->f.Compilation_free(sh->comp);
    if (sh->model) d->f.Model_free(sh->model);
    memset(sh, 0, sizeof *sh);
}

void pi2_nnapi_graph_free(pi2_nnapi_graph *g) {
    if (!g) return;
    if (g->event) pi2_nnapi_wait(g);
    for (int32_t i = 0; i < g->n_shapes; i++) free_shape(g->d, &g->shape[i]);
    for (int i = 0; i < MAX_W; i++) { free(g->w[i]); free(g->obuf[i]); }
    free(g->bias);
    free(g->xbuf);
    free(g);
}

/* ---- graphs: NNAPI models per batch size ---- */

typedef struct {
    const nn_api *f;
    ANeuralNetworksModel *m;
    uint32_t next, n_ops;
    uint32_t none, relu;      /* the FUSED_NONE and FUSED_RELU operands (relu made when first needed) */
    int rc;
} builder;

static uint32_t operand(builder *b, int32_t type, uint32_t n_dims, const uint32_t *dims) {
    const ANeuralNetworksOperandType t = {.type = type, .dimensionCount = n_dims, .dimensions = n_dims ? dims : NULL};
    if (!b->rc) b->rc = b->f->Model_addOperand(b->m, &t);
    return b->next++;
}

static uint32_t constant(builder *b, int32_t type, uint32_t n_dims, const uint32_t *dims, const void *v, size_t len) {
    const uint32_t i = operand(b, type, n_dims, dims);
    if (!b->rc) b->rc = b->f->Model_setOperandValue(b->m, (int32_t)i, v, len);   /* > 128 bytes: kept by pointer */
    return i;
}

static uint32_t scalar_i32(builder *b, int32_t v) { return constant(b, NN_INT32, 0, NULL, &v, sizeof v); }

static void operation(builder *b, int32_t op, uint32_t n_in, const uint32_t *in, uint32_t out) {
    if (!b->rc) b->rc = b->f->Model_addOperation(b->m, op, n_in, in, 1, &out);
    b->n_ops++;
}

static uint32_t scalar_bool(builder *b, uint8_t v) { return constant(b, NN_BOOL, 0, NULL, &v, 1); }

/* The FUSED_RELU or FUSED_NONE operand, made when first used (index 0 is the input, never a fuse code). */
static uint32_t fuse_code(builder *b, int relu) {
    uint32_t *slot = relu ? &b->relu : &b->none;
    if (!*slot) *slot = scalar_i32(b, relu ? NN_FUSED_RELU : NN_FUSED_NONE);
    return *slot;
}

/* output = FULLY_CONNECTED(x, w [units][n], bias zeros, FUSED_RELU or FUSED_NONE): a [T][units] tensor;
 * with batch_matmul, BATCH_MATMUL(x, w, false, true), then RELU when relu. */
static uint32_t fc(builder *b, pi2_nnapi_graph *g, int32_t tt, uint32_t x, uint32_t T, const void *w,
                   uint32_t units, uint32_t n, int relu) {
    const uint32_t wd[2] = {units, n}, bd[1] = {units}, od[2] = {T, units};
    const uint32_t wi = constant(b, tt, 2, wd, w, (size_t)units * n * g->es);
    if (g->d->p.batch_matmul) {
        const uint32_t no = scalar_bool(b, 0), yes = scalar_bool(b, 1);
        uint32_t o = operand(b, tt, 2, od);
        operation(b, NN_OP_BATCH_MATMUL, 4, (const uint32_t[]){x, wi, no, yes}, o);
        if (relu) {
            const uint32_t r = operand(b, tt, 2, od);
            operation(b, NN_OP_RELU, 1, &o, r);
            o = r;
        }
        return o;
    }
    const uint32_t bi = constant(b, tt, 1, bd, g->bias, (size_t)units * g->es);
    const uint32_t fuse = fuse_code(b, relu);
    const uint32_t o = operand(b, tt, 2, od);
    operation(b, NN_OP_FULLY_CONNECTED, 4, (const uint32_t[]){x, wi, bi, fuse}, o);
    return o;
}

static int build(pi2_nnapi_graph *g, int32_t T_, ANeuralNetworksModel *m, uint32_t *n_ops) {
    builder b = {.f = &g->d->f, .m = m};
    const int32_t tt = g->es == 2 ? NN_TENSOR_FLOAT16 : NN_TENSOR_FLOAT32;
    const uint32_t T = (uint32_t)T_, E = (uint32_t)g->n_in, xd[2] = {T, E};
    const uint32_t x = operand(&b, tt, 2, xd);
    uint32_t outs[MAX_W], n_outs = 0;
    if (g->kind == GRAPH_FC) {
        for (int32_t i = 0; i < g->n_w; i++) outs[n_outs++] = fc(&b, g, tt, x, T, g->w[i], (uint32_t)g->n_out[i], E, 0);
    } else {
        const uint32_t H = (uint32_t)g->n_hot, hd[2] = {T, H};
        uint32_t a;
        if (g->act == PI2_ACT_RELU) {
            a = fc(&b, g, tt, x, T, g->w[0], H, E, 1);
        } else {                                   /* SiLU: g * LOGISTIC(g) */
            const uint32_t gi = fc(&b, g, tt, x, T, g->w[0], H, E, 0);
            const uint32_t s = operand(&b, tt, 2, hd);
            operation(&b, NN_OP_LOGISTIC, 1, &gi, s);
            a = operand(&b, tt, 2, hd);
            operation(&b, NN_OP_MUL, 3, (const uint32_t[]){gi, s, fuse_code(&b, 0)}, a);
        }
        const uint32_t u = fc(&b, g, tt, x, T, g->w[1], H, E, 0);
        const uint32_t h = operand(&b, tt, 2, hd);
        operation(&b, NN_OP_MUL, 3, (const uint32_t[]){a, u, fuse_code(&b, 0)}, h);
        outs[n_outs++] = fc(&b, g, tt, h, T, g->w[2], E, H, 0);
    }
    if (!b.rc) b.rc = b.f->Model_identifyInputsAndOutputs(m, 1, &x, n_outs, outs);
    if (!b.rc && g->es == 4 && b.f->Model_relaxComputationFloat32toFloat16)
        b.rc = b.f->Model_relaxComputationFloat32toFloat16(m, true);
    if (!b.rc) b.rc = b.f->Model_finish(m);
    *n_ops = b.n_ops;
    return b.rc;
}

static const char *graph_name(const pi2_nnapi_graph *g, char *buf, size_t n) {
    if (g->kind == GRAPH_FFN) snprintf(buf, n, "hot FFN [%lld x %lld]", (long long)g->n_hot, (long long)g->n_in);
    else snprintf(buf, n, "%d-matrix product [%lld in]", (int)g->n_w, (long long)g->n_in);
    return buf;
}

/* The compiled shape for T tokens, built now if needed; NULL after a failure (noted, graph failed). */
static nn_shape *shape_for(pi2_nnapi_graph *g, int32_t T) {
    pi2_nnapi *d = g->d;
    for (int32_t i = 0; i < g->n_shapes; i++)
        if (g->shape[i].n_tok == T) { g->shape[i].last_use = ++g->clock; return &g->shape[i]; }
    if (g->n_shapes == d->p.max_shapes) {   /* drop the least recently used */
        int32_t lru = 0;
        for (int32_t i = 1; i < g->n_shapes; i++) if (g->shape[i].last_use < g->shape[lru].last_use) lru = i;
        free_shape(d, &g->shape[lru]);
        g->shape[lru] = g->shape[--g->n_shapes];
    }
    nn_shape sh = {.n_tok = T, .last_use = ++g->clock};
    char name[80];
    uint32_t n_ops = 0;
    int rc = d->f.Model_create(&sh.model);
    if (!rc) rc = build(g, T, sh.model, &n_ops);
    if (rc) {
        pi2_nnapi_note(d, "NNAPI: building the %s graph failed (%s): computed on the CPU", graph_name(g, name, sizeof name), pi2_nnapi_result_name(rc));
        goto fail;
    }
    bool ok[16] = {0};   /* a graph has at most 6 operations */
    rc = d->f.Model_getSupportedOperationsForDevices(sh.model, d->sel, (uint32_t)d->n_sel, ok);
    for (uint32_t i = 0; !rc && i < n_ops; i++)
        if (!ok[i]) {
            pi2_nnapi_note(d, "NNAPI: the devices do not support operation %u of the %s graph: computed on the CPU", i,
                 graph_name(g, name, sizeof name));
            goto fail;
        }
    if (!rc) rc = d->f.Compilation_createForDevices(sh.model, d->sel, (uint32_t)d->n_sel, &sh.comp);
    if (!rc) rc = d->f.Compilation_setPreference(sh.comp, NN_PREFER_SUSTAINED_SPEED);
    if (!rc) rc = d->f.Compilation_finish(sh.comp);
    if (rc) {
        pi2_nnapi_note(d, "NNAPI: compiling the %s graph failed (%s): computed on the CPU", graph_name(g, name, sizeof name), pi2_nnapi_result_name(rc));
        goto fail;
    }
    g->shape[g->n_shapes] = sh;
    return &g->shape[g->n_shapes++];
fail:
    free_shape(d, &sh);
    g->failed = 1;
    return NULL;
}

static int ensure(void **buf, size_t *cap, size_t need, pi2_nnapi_graph *g) {
    if (*cap >= need) return 1;
    void *p = realloc(*buf, need);
    if (!p) return 0;
    g->bytes += need - *cap;
    *buf = p;
    *cap = need;
    return 1;
}

pi2_status pi2_nnapi_start(pi2_nnapi_graph *g, const float *x, int32_t n_tok, float *const *out) {
    if (!g || !x || !out || n_tok < 1) return pi2_set_error(PI2_ERR_INVALID, "bad NNAPI run arguments");
    if (g->event) return pi2_set_error(PI2_ERR_INVALID, "an NNAPI run of this graph is pending");
    for (int32_t i = 0; i < (g->kind == GRAPH_FC ? g->n_w : 1); i++)
        if (!out[i]) return pi2_set_error(PI2_ERR_INVALID, "NULL NNAPI output %d", (int)i);
    if (g->failed) return pi2_set_error(PI2_ERR_UNSUPPORTED, "this NNAPI graph failed before: CPU");
    pi2_nnapi *d = g->d;
    nn_shape *sh = shape_for(g, n_tok);
    if (!sh) return PI2_ERR_UNSUPPORTED;
    const int32_t n_outs = g->kind == GRAPH_FC ? g->n_w : 1;
    const size_t xn = (size_t)n_tok * (size_t)g->n_in;
    if (!ensure(&g->xbuf, &g->xcap, xn * g->es, g)) return pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; i < n_outs; i++)
        if (!ensure(&g->obuf[i], &g->ocap[i], (size_t)n_tok * (size_t)g->n_out[i] * g->es, g))
            return pi2_set_error(PI2_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < xn; i++) store(g, g->xbuf, i, x[i]);
    char name[80];
    int rc = d->f.Execution_create(sh->comp, &g->exec);
    if (!rc) rc = d->f.Execution_setInput(g->exec, 0, NULL, g->xbuf, xn * g->es);
    for (int32_t i = 0; i < n_outs && !rc; i++)
        rc = d->f.Execution_setOutput(g->exec, i, NULL, g->obuf[i], (size_t)n_tok * (size_t)g->n_out[i] * g->es);
    if (!rc) rc = d->f.Execution_startCompute(g->exec, &g->event);
    if (rc) {
        if (g->exec) d->f.Execution_free(g->exec);
        g->exec = NULL;
        g->event = NULL;
        g->failed = 1;
        return pi2_nnapi_note(d, "NNAPI: starting the %s graph failed (%s): computed on the CPU", graph_name(g, name, sizeof name),
                    pi2_nnapi_result_name(rc));
    }
    for (int32_t i = 0; i < n_outs; i++) g->out[i] = out[i];
    g->run_tok = n_tok;
    return PI2_OK;
}

pi2_status pi2_nnapi_wait(pi2_nnapi_graph *g) {
    if (!g || !g->event) return pi2_set_error(PI2_ERR_INVALID, "no NNAPI run to wait for");
    pi2_nnapi *d = g->d;
    const int rc = d->f.Event_wait(g->event);
    d->f.Event_free(g->event);
    d->f.Execution_free(g->exec);
    g->event = NULL;
    g->exec = NULL;
    char name[80];
    if (rc) {
        g->failed = 1;
        return pi2_nnapi_note(d, "NNAPI: running the %s graph failed (%s): computed on the CPU", graph_name(g, name, sizeof name),
                    pi2_nnapi_result_name(rc));
    }
    for (int32_t i = 0; i < (g->kind == GRAPH_FC ? g->n_w : 1); i++) {
        const size_t n = (size_t)g->run_tok * (size_t)g->n_out[i];
        if (g->es == 2)
            for (size_t k = 0; k < n; k++) g->out[i][k] = pi2_fp16_to_f32(((const pi2_fp16 *)g->obuf[i])[k]);
        else
            memcpy(g->out[i], g->obuf[i], n * sizeof(float));
    }
    return PI2_OK;
}
