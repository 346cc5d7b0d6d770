/* nnapi_standin_exec.c — the stand-in libneuralnetworks.so's compilations and executions (nnapi_standin.c has the
 * control functions, the devices and the models): inputs and outputs checked against the model, the evaluation in
 * operation order on the CPU (every tensor value in float, F16 tensors rounded to F16 unless the model is relaxed), one
 * thread per started execution, its event, and the failures standin_set() injects (compile, start, execute, delay).
 * Build variants: -DSTANDIN_NO_EVENT_WAIT leaves out ANeuralNetworksEvent_wait (a missing symbol). */
#include "nnapi_standin.h"

#include <math.h>
#include <stdlib.h>
#include <time.h>

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
