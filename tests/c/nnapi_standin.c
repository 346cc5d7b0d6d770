/* nnapi_standin.c — a stand-in libneuralnetworks.so for the tests (built by tests/test_nnapi.py with cc).
 * One file on purpose: one cc command builds the shared library, like the real one a single .so.
 * Owns: the subset of the NNAPI C ABI that csrc/nnapi/nnapi.c uses, with reference semantics on the CPU
 *       (FULLY_CONNECTED, BATCH_MATMUL, LOGISTIC, MUL, RELU over TENSOR_FLOAT32 / TENSOR_FLOAT16; F16 results rounded per
 *       operation), NNAPI's result codes for bad calls, two devices (a fake accelerator and a CPU one),
 *       asynchronous runs on a thread per execution, a record of every finished model as JSON, and
 *       failure injection through standin_set().
 * Build variants: -DSTANDIN_NO_EVENT_WAIT leaves out ANeuralNetworksEvent_wait (a missing symbol).
 * Enum values come from csrc/nnapi/abi.h, the header the delegate uses. */
#include "nnapi/abi.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_OPERANDS 64
#define MAX_OPS 16
#define MAX_RECORDS 512

/* ---- control ---- */
static struct {
    int fail_compile, fail_start, fail_execute, unsupported, accelerator, device_level, runtime_level, delay_ms;
} ctl = {.accelerator = 1, .device_level = 31, .runtime_level = 31};
static int executions_done, models_finished;
static char *records[MAX_RECORDS];
static int n_records;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* key: fail_compile, fail_start, fail_execute, unsupported (0/1), accelerator (0: only the CPU device),
 * device_level (feature level of both devices), runtime_level (getRuntimeFeatureLevel), delay_ms (each
 * execution sleeps this long first). */
EXPORT int standin_set(const char *key, int value) {
    if (!strcmp(key, "fail_compile")) ctl.fail_compile = value;
    else if (!strcmp(key, "fail_start")) ctl.fail_start = value;
    else if (!strcmp(key, "fail_execute")) ctl.fail_execute = value;
    else if (!strcmp(key, "unsupported")) ctl.unsupported = value;
    else if (!strcmp(key, "accelerator")) ctl.accelerator = value;
    else if (!strcmp(key, "device_level")) ctl.device_level = value;
    else if (!strcmp(key, "runtime_level")) ctl.runtime_level = value;
    else if (!strcmp(key, "delay_ms")) ctl.delay_ms = value;
    else return -1;
    return 0;
}

EXPORT void standin_reset(void) {
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n_records; i++) free(records[i]);
    n_records = 0;
    executions_done = models_finished = 0;
    memset(&ctl, 0, sizeof ctl);
    ctl.accelerator = 1;
    ctl.device_level = ctl.runtime_level = 31;
    pthread_mutex_unlock(&lock);
}

EXPORT int standin_executions(void) {
    pthread_mutex_lock(&lock);
    int n = executions_done;
    pthread_mutex_unlock(&lock);
    return n;
}

EXPORT int standin_graph_count(void) { return n_records; }
EXPORT const char *standin_graph(int i) { return i >= 0 && i < n_records ? records[i] : NULL; }

/* ---- devices ---- */
struct ANeuralNetworksDevice { const char *name; int32_t type; };
static ANeuralNetworksDevice devices[2] = {{"standin-npu", NN_DEVICE_ACCELERATOR}, {"nnapi-reference", NN_DEVICE_CPU}};

EXPORT int ANeuralNetworks_getDeviceCount(uint32_t *n) {
    if (!n) return NN_UNEXPECTED_NULL;
    *n = ctl.accelerator ? 2 : 1;
    return NN_NO_ERROR;
}
EXPORT int ANeuralNetworks_getDevice(uint32_t i, ANeuralNetworksDevice **d) {
    uint32_t n;
    ANeuralNetworks_getDeviceCount(&n);
    if (!d) return NN_UNEXPECTED_NULL;
    if (i >= n) return NN_BAD_DATA;
    *d = &devices[ctl.accelerator ? i : 1];
    return NN_NO_ERROR;
}
EXPORT int ANeuralNetworksDevice_getName(const ANeuralNetworksDevice *d, const char **name) {
    if (!d || !name) return NN_UNEXPECTED_NULL;
    *name = d->name;
    return NN_NO_ERROR;
}
EXPORT int ANeuralNetworksDevice_getType(const ANeuralNetworksDevice *d, int32_t *type) {
    if (!d || !type) return NN_UNEXPECTED_NULL;
    *type = d->type;
    return NN_NO_ERROR;
}
EXPORT int ANeuralNetworksDevice_getFeatureLevel(const ANeuralNetworksDevice *d, int64_t *level) {
    if (!d || !level) return NN_UNEXPECTED_NULL;
    *level = ctl.device_level;
    return NN_NO_ERROR;
}
EXPORT int64_t ANeuralNetworks_getRuntimeFeatureLevel(void) { return ctl.runtime_level; }

/* ---- models ---- */
typedef struct {
    int32_t type;
    uint32_t n_dims, dims[4];
    const void *value;        /* constant data (copied when <= 128 bytes, else the caller's pointer) */
    size_t length;
    uint8_t copy[NN_MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES];
} operand;

typedef struct { int32_t type; uint32_t n_in, in[4], out; } operation;

struct ANeuralNetworksModel {
    int finished, relaxed;
    uint32_t n_operands, n_ops, n_inputs, n_outputs, inputs[4], outputs[4];
    operand opd[MAX_OPERANDS];
    operation op[MAX_OPS];
};

static size_t elem_size(int32_t t) { return t == NN_TENSOR_FLOAT16 ? 2 : 4; }
static size_t n_elems(const operand *o) {
    size_t n = 1;
    for (uint32_t i = 0; i < o->n_dims; i++) n *= o->dims[i];
    return n;
}

EXPORT int ANeuralNetworksModel_create(ANeuralNetworksModel **m) {
    if (!m) return NN_UNEXPECTED_NULL;
    return (*m = calloc(1, sizeof **m)) ? NN_NO_ERROR : NN_OUT_OF_MEMORY;
}
EXPORT void ANeuralNetworksModel_free(ANeuralNetworksModel *m) { free(m); }

EXPORT int ANeuralNetworksModel_addOperand(ANeuralNetworksModel *m, const ANeuralNetworksOperandType *t) {
    if (!m || !t) return NN_UNEXPECTED_NULL;
    if (m->finished) return NN_BAD_STATE;
    if (m->n_operands == MAX_OPERANDS || t->dimensionCount > 4 || (t->dimensionCount && !t->dimensions))
        return NN_BAD_DATA;
    operand *o = &m->opd[m->n_operands++];
    o->type = t->type;
    o->n_dims = t->dimensionCount;
    for (uint32_t i = 0; i < o->n_dims; i++) o->dims[i] = t->dimensions[i];
    return NN_NO_ERROR;
}

EXPORT int ANeuralNetworksModel_setOperandValue(ANeuralNetworksModel *m, int32_t i, const void *v, size_t len) {
    if (!m || !v) return NN_UNEXPECTED_NULL;
    if (m->finished) return NN_BAD_STATE;
    if (i < 0 || (uint32_t)i >= m->n_operands) return NN_BAD_DATA;
    operand *o = &m->opd[i];
    const size_t need = o->n_dims ? n_elems(o) * elem_size(o->type) : o->type == NN_BOOL ? 1 : 4;
    if (len != need) return NN_BAD_DATA;
    if (len <= NN_MAX_SIZE_OF_IMMEDIATELY_COPIED_VALUES) { memcpy(o->copy, v, len); o->value = o->copy; }
    else o->value = v;
    o->length = len;
    return NN_NO_ERROR;
}

static int is_tensor(int32_t t) { return t == NN_TENSOR_FLOAT32 || t == NN_TENSOR_FLOAT16; }

/* The operand rules of reference/nnapi.md §5 (float types). */
static int check_op(const ANeuralNetworksModel *m, const operation *op) {
    const operand *o = &m->opd[op->out];
    if (op->type == NN_OP_FULLY_CONNECTED) {
        if (op->n_in != 4) return NN_BAD_DATA;
        const operand *x = &m->opd[op->in[0]], *w = &m->opd[op->in[1]], *b = &m->opd[op->in[2]], *f = &m->opd[op->in[3]];
        if (!is_tensor(x->type) || w->type != x->type || b->type != x->type || o->type != x->type) return NN_BAD_DATA;
        if (x->n_dims != 2 || w->n_dims != 2 || b->n_dims != 1 || o->n_dims != 2) return NN_BAD_DATA;
        if (w->dims[1] != x->dims[1] || b->dims[0] != w->dims[0] || o->dims[0] != x->dims[0] || o->dims[1] != w->dims[0])
            return NN_BAD_DATA;
        if (f->type != NN_INT32 || f->n_dims || !f->value) return NN_BAD_DATA;
        return NN_NO_ERROR;
    }
    if (op->type == NN_OP_BATCH_MATMUL) {   /* rank 2 here; adj_x / adj_y optional BOOL scalars */
        if (op->n_in < 2 || op->n_in > 4) return NN_BAD_DATA;
        const operand *x = &m->opd[op->in[0]], *y = &m->opd[op->in[1]];
        int adj[2] = {0, 0};
        for (uint32_t k = 2; k < op->n_in; k++) {
            const operand *a = &m->opd[op->in[k]];
            if (a->type != NN_BOOL || a->n_dims || !a->value) return NN_BAD_DATA;
            adj[k - 2] = *(const uint8_t *)a->value != 0;
        }
        if (!is_tensor(x->type) || y->type != x->type || o->type != x->type) return NN_BAD_DATA;
        if (x->n_dims != 2 || y->n_dims != 2 || o->n_dims != 2) return NN_BAD_DATA;
        const uint32_t rx = x->dims[adj[0]], cx = x->dims[!adj[0]], ry = y->dims[adj[1]], cy = y->dims[!adj[1]];
        if (cx != ry || o->dims[0] != rx || o->dims[1] != cy) return NN_BAD_DATA;
        return NN_NO_ERROR;
    }
    if (op->type == NN_OP_LOGISTIC || op->type == NN_OP_MUL || op->type == NN_OP_RELU) {
        if (op->n_in != (op->type == NN_OP_MUL ? 3u : 1u)) return NN_BAD_DATA;
        for (uint32_t k = 0; k < (op->type == NN_OP_MUL ? 2u : 1u); k++) {
            const operand *a = &m->opd[op->in[k]];
            if (!is_tensor(a->type) || a->type != o->type || a->n_dims != o->n_dims || n_elems(a) != n_elems(o))
                return NN_BAD_DATA;
        }
        if (op->type == NN_OP_MUL && (m->opd[op->in[2]].type != NN_INT32 || !m->opd[op->in[2]].value)) return NN_BAD_DATA;
        return NN_NO_ERROR;
    }
    return NN_BAD_DATA;   /* an operation this stand-in does not implement */
}

EXPORT int ANeuralNetworksModel_addOperation(ANeuralNetworksModel *m, int32_t type, uint32_t n_in, const uint32_t *in,
                                             uint32_t n_out, const uint32_t *out) {
    if (!m || !in || !out) return NN_UNEXPECTED_NULL;
    if (m->finished) return NN_BAD_STATE;
    if (m->n_ops == MAX_OPS || n_in > 4 || n_out != 1 || out[0] >= m->n_operands) return NN_BAD_DATA;
    operation op = {.type = type, .n_in = n_in, .out = out[0]};
    for (uint32_t i = 0; i < n_in; i++) {
        if (in[i] >= m->n_operands) return NN_BAD_DATA;
        op.in[i] = in[i];
    }
    int rc = check_op(m, &op);
    if (rc) return rc;
    m->op[m->n_ops++] = op;
    return NN_NO_ERROR;
}

EXPORT int ANeuralNetworksModel_identifyInputsAndOutputs(ANeuralNetworksModel *m, uint32_t n_in, const uint32_t *in,
                                                         uint32_t n_out, const uint32_t *out) {
    if (!m || (n_in && !in) || (n_out && !out)) return NN_UNEXPECTED_NULL;
    if (m->finished) return NN_BAD_STATE;
    if (n_in > 4 || n_out > 4) return NN_BAD_DATA;
    for (uint32_t i = 0; i < n_in; i++) if (in[i] >= m->n_operands || m->opd[in[i]].value) return NN_BAD_DATA;
    for (uint32_t i = 0; i < n_out; i++) if (out[i] >= m->n_operands) return NN_BAD_DATA;
    m->n_inputs = n_in;
    m->n_outputs = n_out;
    memcpy(m->inputs, in, n_in * sizeof *in);
    memcpy(m->outputs, out, n_out * sizeof *out);
    return NN_NO_ERROR;
}

EXPORT int ANeuralNetworksModel_relaxComputationFloat32toFloat16(ANeuralNetworksModel *m, bool allow) {
    if (!m) return NN_UNEXPECTED_NULL;
    if (m->finished) return NN_BAD_STATE;
    m->relaxed = allow;
    return NN_NO_ERROR;
}

static void record(const ANeuralNetworksModel *m) {
    size_t cap = 8192, n = 0;
    char *s = malloc(cap);
    if (!s) return;
#define PUT(...) do { int put_ = snprintf(s + n, cap - n, __VA_ARGS__); if (put_ > 0) n += (size_t)put_ < cap - n ? (size_t)put_ : cap - n - 1; } while (0)
    PUT("{\"relaxed\": %d, \"operands\": [", m->relaxed);
    for (uint32_t i = 0; i < m->n_operands; i++) {
        const operand *o = &m->opd[i];
        PUT("%s{\"type\": %d, \"dims\": [", i ? ", " : "", (int)o->type);
        for (uint32_t k = 0; k < o->n_dims; k++) PUT("%s%u", k ? ", " : "", o->dims[k]);
        PUT("], \"const\": %d", o->value != NULL);
        if (o->value && o->type == NN_INT32) PUT(", \"value\": %d", *(const int32_t *)o->value);
        if (o->value && o->type == NN_BOOL) PUT(", \"value\": %d", *(const uint8_t *)o->value);
        if (o->value && is_tensor(o->type)) {   /* all zero? (the bias operands) */
            int zero = 1;
            for (size_t k = 0; k < o->length && zero; k++) zero = ((const uint8_t *)o->value)[k] == 0;
            PUT(", \"zero\": %d", zero);
        }
        PUT("}");
    }
    PUT("], \"operations\": [");
    for (uint32_t i = 0; i < m->n_ops; i++) {
        PUT("%s{\"type\": %d, \"inputs\": [", i ? ", " : "", (int)m->op[i].type);
        for (uint32_t k = 0; k < m->op[i].n_in; k++) PUT("%s%u", k ? ", " : "", m->op[i].in[k]);
        PUT("], \"outputs\": [%u]}", m->op[i].out);
    }
    PUT("], \"inputs\": [");
    for (uint32_t i = 0; i < m->n_inputs; i++) PUT("%s%u", i ? ", " : "", m->inputs[i]);
    PUT("], \"outputs\": [");
    for (uint32_t i = 0; i < m->n_outputs; i++) PUT("%s%u", i ? ", " : "", m->outputs[i]);
    PUT("]}");
#undef PUT
    pthread_mutex_lock(&lock);
    if (n_records < MAX_RECORDS) records[n_records++] = s;
    else free(s);
    models_finished++;
    pthread_mutex_unlock(&lock);
}

EXPORT int ANeuralNetworksModel_finish(ANeuralNetworksModel *m) {
    if (!m) return NN_UNEXPECTED_NULL;
    if (m->finished) return NN_BAD_STATE;
    if (!m->n_inputs || !m->n_outputs) return NN_BAD_DATA;
    m->finished = 1;
    record(m);
    return NN_NO_ERROR;
}

EXPORT int ANeuralNetworksModel_getSupportedOperationsForDevices(const ANeuralNetworksModel *m,
                                                                 const ANeuralNetworksDevice *const *devs, uint32_t n,
                                                                 bool *ok) {
    if (!m || !devs || !ok) return NN_UNEXPECTED_NULL;
    if (!m->finished) return NN_BAD_STATE;
    if (!n) return NN_BAD_DATA;
    for (uint32_t i = 0; i < m->n_ops; i++) ok[i] = !(ctl.unsupported && i == m->n_ops - 1);
    return NN_NO_ERROR;
}

/* ---- compilations ---- */
struct ANeuralNetworksCompilation { ANeuralNetworksModel *m; int finished; };

EXPORT int ANeuralNetworksCompilation_createForDevices(ANeuralNetworksModel *m, const ANeuralNetworksDevice *const *devs,
                                                       uint32_t n, ANeuralNetworksCompilation **c) {
    if (!m || !devs || !c) return NN_UNEXPECTED_NULL;
    if (!m->finished) return NN_BAD_STATE;
    if (!n) return NN_BAD_DATA;
    if (!(*c = calloc(1, sizeof **c))) return NN_OUT_OF_MEMORY;
    (*c)->m = m;
    return NN_NO_ERROR;
}
EXPORT int ANeuralNetworksCompilation_setPreference(ANeuralNetworksCompilation *c, int32_t pref) {
    if (!c) return NN_UNEXPECTED_NULL;
    if (c->finished) return NN_BAD_STATE;
    return pref >= NN_PREFER_LOW_POWER && pref <= NN_PREFER_SUSTAINED_SPEED ? NN_NO_ERROR : NN_BAD_DATA;
}
EXPORT int ANeuralNetworksCompilation_finish(ANeuralNetworksCompilation *c) {
    if (!c) return NN_UNEXPECTED_NULL;
    if (c->finished) return NN_BAD_STATE;
    if (ctl.fail_compile) return NN_OP_FAILED;
    c->finished = 1;
    return NN_NO_ERROR;
}
EXPORT void ANeuralNetworksCompilation_free(ANeuralNetworksCompilation *c) { free(c); }

/* ---- executions ---- */
struct ANeuralNetworksExecution {
    ANeuralNetworksCompilation *c;
    const void *in[4];
    void *out[4];
    int started;
};
struct ANeuralNetworksEvent { pthread_t th; int joined, rc; ANeuralNetworksExecution *e; };

EXPORT int ANeuralNetworksExecution_create(ANeuralNetworksCompilation *c, ANeuralNetworksExecution **e) {
    if (!c || !e) return NN_UNEXPECTED_NULL;
    if (!c->finished) return NN_BAD_STATE;
    if (!(*e = calloc(1, sizeof **e))) return NN_OUT_OF_MEMORY;
    (*e)->c = c;
    return NN_NO_ERROR;
}
EXPORT void ANeuralNetworksExecution_free(ANeuralNetworksExecution *e) { free(e); }

static int set_io(ANeuralNetworksExecution *e, int32_t i, const ANeuralNetworksOperandType *t, size_t len, int out) {
    const ANeuralNetworksModel *m = e->c->m;
    if (e->started) return NN_BAD_STATE;
    if (i < 0 || (uint32_t)i >= (out ? m->n_outputs : m->n_inputs) || t) return NN_BAD_DATA;
    const operand *o = &m->opd[out ? m->outputs[i] : m->inputs[i]];
    if (len != n_elems(o) * elem_size(o->type)) return out && len < n_elems(o) * elem_size(o->type) ? NN_OUTPUT_INSUFFICIENT_SIZE : NN_BAD_DATA;
    return NN_NO_ERROR;
}
EXPORT int ANeuralNetworksExecution_setInput(ANeuralNetworksExecution *e, int32_t i, const ANeuralNetworksOperandType *t,
                                             const void *buf, size_t len) {
    if (!e || !buf) return NN_UNEXPECTED_NULL;
    int rc = set_io(e, i, t, len, 0);
    if (!rc) e->in[i] = buf;
    return rc;
}
EXPORT int ANeuralNetworksExecution_setOutput(ANeuralNetworksExecution *e, int32_t i, const ANeuralNetworksOperandType *t,
                                              void *buf, size_t len) {
    if (!e || !buf) return NN_UNEXPECTED_NULL;
    int rc = set_io(e, i, t, len, 1);
    if (!rc) e->out[i] = buf;
    return rc;
}

static float h2f(uint16_t h) {
    const uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    float f;
    if (e == 0) f = ldexpf((float)m, -24);
    else if (e == 31) f = m ? NAN : INFINITY;
    else f = ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -f : f;
}
static uint16_t f2h(float f) {   /* round to nearest even (through the C library's rounding) */
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    f = fabsf(f);
    if (isnan(f)) return sign | 0x7e00;
    if (f >= 65520.0f) return sign | 0x7c00;
    if (f < ldexpf(1, -14)) return sign | (uint16_t)nearbyintf(f * ldexpf(1, 24));
    int e;
    frexpf(f, &e);                                          /* f = m * 2^e, m in [0.5, 1) */
    float q = nearbyintf(ldexpf(f, 11 - e));                /* 11 significant bits */
    if (q >= 2048.0f) { q /= 2; e++; }
    if (e - 1 + 15 >= 31) return sign | 0x7c00;
    return sign | (uint16_t)((uint32_t)(e - 1 + 15) << 10 | ((uint32_t)q & 1023));
}

/* Evaluate the model in operation order; every tensor value in float, F16 tensors rounded to F16. */
static int evaluate(ANeuralNetworksExecution *e) {
    const ANeuralNetworksModel *m = e->c->m;
    float *val[MAX_OPERANDS] = {0};
    int rc = NN_NO_ERROR;
    for (uint32_t i = 0; i < m->n_operands; i++) {
        const operand *o = &m->opd[i];
        if (!o->n_dims || !is_tensor(o->type)) continue;
        const size_t n = n_elems(o);
        if (!(val[i] = calloc(n ? n : 1, sizeof(float)))) { rc = NN_OUT_OF_MEMORY; goto done; }
        const void *src = o->value;
        for (uint32_t k = 0; k < m->n_inputs; k++) if (m->inputs[k] == i) src = e->in[k];
        if (src)
            for (size_t k = 0; k < n; k++)
                val[i][k] = o->type == NN_TENSOR_FLOAT16 ? h2f(((const uint16_t *)src)[k]) : ((const float *)src)[k];
    }
    for (uint32_t i = 0; i < m->n_ops; i++) {
        const operation *op = &m->op[i];
        const operand *o = &m->opd[op->out];
        float *y = val[op->out];
        const size_t n = n_elems(o);
        if (op->type == NN_OP_FULLY_CONNECTED) {
            const operand *w = &m->opd[op->in[1]];
            const uint32_t B = o->dims[0], U = w->dims[0], K = w->dims[1];
            const int32_t fuse = *(const int32_t *)m->opd[op->in[3]].value;
            const float *x = val[op->in[0]], *W = val[op->in[1]], *b = val[op->in[2]];
            for (uint32_t t = 0; t < B; t++)
                for (uint32_t u = 0; u < U; u++) {
                    double acc = b[u];
                    for (uint32_t k = 0; k < K; k++) acc += (double)x[(size_t)t * K + k] * W[(size_t)u * K + k];
                    float v = (float)acc;
                    if (fuse == NN_FUSED_RELU) v = v > 0 ? v : 0;
                    else if (fuse == NN_FUSED_RELU1) v = v > 1 ? 1 : v < -1 ? -1 : v;
                    else if (fuse == NN_FUSED_RELU6) v = v > 6 ? 6 : v < 0 ? 0 : v;
                    y[(size_t)t * U + u] = v;
                }
        } else if (op->type == NN_OP_BATCH_MATMUL) {
            const operand *xo = &m->opd[op->in[0]], *yo = &m->opd[op->in[1]];
            const int ax = op->n_in > 2 && *(const uint8_t *)m->opd[op->in[2]].value;
            const int ay = op->n_in > 3 && *(const uint8_t *)m->opd[op->in[3]].value;
            const uint32_t R = o->dims[0], C = o->dims[1], K = xo->dims[!ax];
            const float *X = val[op->in[0]], *Y = val[op->in[1]];
            for (uint32_t r = 0; r < R; r++)
                for (uint32_t c = 0; c < C; c++) {
                    double acc = 0;
                    for (uint32_t k = 0; k < K; k++)
                        acc += (double)X[ax ? (size_t)k * xo->dims[1] + r : (size_t)r * xo->dims[1] + k] *
                               Y[ay ? (size_t)c * yo->dims[1] + k : (size_t)k * yo->dims[1] + c];
                    y[(size_t)r * C + c] = (float)acc;
                }
        } else if (op->type == NN_OP_RELU) {
            for (size_t k = 0; k < n; k++) y[k] = val[op->in[0]][k] > 0 ? val[op->in[0]][k] : 0;
        } else if (op->type == NN_OP_LOGISTIC) {
            for (size_t k = 0; k < n; k++) y[k] = 1.0f / (1.0f + expf(-val[op->in[0]][k]));
        } else if (op->type == NN_OP_MUL) {
            const int32_t fuse = *(const int32_t *)m->opd[op->in[2]].value;
            for (size_t k = 0; k < n; k++) {
                float v = val[op->in[0]][k] * val[op->in[1]][k];
                y[k] = fuse == NN_FUSED_RELU && v < 0 ? 0 : v;
            }
        }
        if (o->type == NN_TENSOR_FLOAT16 && !m->relaxed)
            for (size_t k = 0; k < n; k++) y[k] = h2f(f2h(y[k]));
    }
    for (uint32_t k = 0; k < m->n_outputs; k++) {
        const operand *o = &m->opd[m->outputs[k]];
        const size_t n = n_elems(o);
        for (size_t j = 0; j < n; j++) {
            if (o->type == NN_TENSOR_FLOAT16) ((uint16_t *)e->out[k])[j] = f2h(val[m->outputs[k]][j]);
            else ((float *)e->out[k])[j] = val[m->outputs[k]][j];
        }
    }
done:
    for (uint32_t i = 0; i < m->n_operands; i++) free(val[i]);
    return rc;
}

static void *run(void *arg) {
    ANeuralNetworksEvent *ev = arg;
    if (ctl.delay_ms) nanosleep(&(struct timespec){ctl.delay_ms / 1000, (long)(ctl.delay_ms % 1000) * 1000000L}, NULL);
    ev->rc = ctl.fail_execute ? NN_OP_FAILED : evaluate(ev->e);
    pthread_mutex_lock(&lock);
    executions_done++;
    pthread_mutex_unlock(&lock);
    return NULL;
}

EXPORT int ANeuralNetworksExecution_startCompute(ANeuralNetworksExecution *e, ANeuralNetworksEvent **ev) {
    if (!e || !ev) return NN_UNEXPECTED_NULL;
    if (e->started) return NN_BAD_STATE;
    const ANeuralNetworksModel *m = e->c->m;
    for (uint32_t i = 0; i < m->n_inputs; i++) if (!e->in[i]) return NN_BAD_DATA;
    for (uint32_t i = 0; i < m->n_outputs; i++) if (!e->out[i]) return NN_BAD_DATA;
    if (ctl.fail_start) return NN_UNAVAILABLE_DEVICE;
    if (!(*ev = calloc(1, sizeof **ev))) return NN_OUT_OF_MEMORY;
    (*ev)->e = e;
    e->started = 1;
    if (pthread_create(&(*ev)->th, NULL, run, *ev)) { free(*ev); *ev = NULL; return NN_OP_FAILED; }
    return NN_NO_ERROR;
}

#ifndef STANDIN_NO_EVENT_WAIT
EXPORT int ANeuralNetworksEvent_wait(ANeuralNetworksEvent *ev) {
    if (!ev) return NN_UNEXPECTED_NULL;
    if (!ev->joined) pthread_join(ev->th, NULL);
    ev->joined = 1;
    return ev->rc;
}
#endif

EXPORT void ANeuralNetworksEvent_free(ANeuralNetworksEvent *ev) {
    if (ev && !ev->joined) pthread_join(ev->th, NULL);
    free(ev);
}
