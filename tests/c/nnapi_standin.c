/* nnapi_standin.c — a stand-in libneuralnetworks.so for the tests (built by tests/standin.py with cc from this file and
 * nnapi_standin_exec.c; nnapi_standin.h holds what they share).
 * Owns: the subset of the NNAPI C ABI that csrc/nnapi/nnapi.c uses, with reference semantics on the CPU
 *       (FULLY_CONNECTED, BATCH_MATMUL, LOGISTIC, MUL, RELU over TENSOR_FLOAT32 / TENSOR_FLOAT16; F16 results rounded per
 *       operation), NNAPI's result codes for bad calls, two devices (a fake accelerator and a CPU one),
 *       asynchronous runs on a thread per execution, a record of every finished model as JSON, and
 *       failure injection through standin_set(). This file: the control functions, the devices and the models (operand
 *       rules, the JSON record); compilations and executions (the evaluation, the threads) are nnapi_standin_exec.c's.
 * Build variants: -DSTANDIN_NO_EVENT_WAIT leaves out ANeuralNetworksEvent_wait (a missing symbol).
 * Enum values come from csrc/nnapi/abi.h, the header the delegate uses. */
#include "nnapi_standin.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RECORDS 512

/* ---- control ---- */
struct standin_ctl ctl = {.accelerator = 1, .device_level = 31, .runtime_level = 31};
int executions_done;
pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int models_finished;
static char *records[MAX_RECORDS];
static int n_records;

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
