/* nnapi.c — the NNAPI delegate's library: libneuralnetworks.so opened with dlopen, its devices, and the
 * notes of why the delegate fell back to the CPU (pi2.h, "NNAPI delegate").
 * Does: resolve only the functions pi2 calls (a missing one makes NNAPI unavailable); list devices and
 *       select them (every device, or GPUs and accelerators only); fall back to F32 weights when a
 *       selected device predates F16 FULLY_CONNECTED (feature level 3).
 * Does not: build graphs (nnapi/graph.c) or decide when to use NNAPI (Python's policy, pi2/runtime/npu.py). */
#define _GNU_SOURCE
#include "nnapi/delegate.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *pi2_nnapi_result_name(int rc) {
    static const char *names[] = {"NO_ERROR", "OUT_OF_MEMORY", "INCOMPLETE", "UNEXPECTED_NULL", "BAD_DATA",
                                  "OP_FAILED", "BAD_STATE", "UNMAPPABLE", "OUTPUT_INSUFFICIENT_SIZE",
                                  "UNAVAILABLE_DEVICE", "MISSED_DEADLINE_TRANSIENT", "MISSED_DEADLINE_PERSISTENT",
                                  "RESOURCE_EXHAUSTED_TRANSIENT", "RESOURCE_EXHAUSTED_PERSISTENT", "DEAD_OBJECT"};
    return rc >= 0 && rc < (int)(sizeof names / sizeof names[0]) ? names[rc] : "unknown result";
}

pi2_status pi2_nnapi_note(pi2_nnapi *d, const char *fmt, ...) {
    char line[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    const size_t used = strlen(d->notes), n = strlen(line);
    if (!strstr(d->notes, line) && used + n + 2 < sizeof d->notes) {
        memcpy(d->notes + used, line, n);
        d->notes[used + n] = '\n';
        d->notes[used + n + 1] = '\0';
    }
    return pi2_set_error(PI2_ERR_UNSUPPORTED, "%s", line);
}

static pi2_nnapi_params default_params(void) {
    return (pi2_nnapi_params){.lib_path = NULL, .accelerators_only = 0, .weight_type = 1, .max_shapes = 4,
                                .batch_matmul = 0};
}

static pi2_status resolve(pi2_nnapi *d) {
#define REQ(name, sym) if (!(*(void **)&d->f.name = dlsym(d->lib, sym))) \
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "NNAPI unavailable: the library lacks %s", sym)
    REQ(Model_create, "ANeuralNetworksModel_create");
    REQ(Model_free, "ANeuralNetworksModel_free");
    REQ(Model_addOperand, "ANeuralNetworksModel_addOperand");
    REQ(Model_setOperandValue, "ANeuralNetworksModel_setOperandValue");
    REQ(Model_addOperation, "ANeuralNetworksModel_addOperation");
    REQ(Model_identifyInputsAndOutputs, "ANeuralNetworksModel_identifyInputsAndOutputs");
    REQ(Model_finish, "ANeuralNetworksModel_finish");
    REQ(Model_getSupportedOperationsForDevices, "ANeuralNetworksModel_getSupportedOperationsForDevices");
    REQ(Compilation_createForDevices, "ANeuralNetworksCompilation_createForDevices");
    REQ(Compilation_setPreference, "ANeuralNetworksCompilation_setPreference");
    REQ(Compilation_finish, "ANeuralNetworksCompilation_finish");
    REQ(Compilation_free, "ANeuralNetworksCompilation_free");
    REQ(Execution_create, "ANeuralNetworksExecution_create");
    REQ(Execution_setInput, "ANeuralNetworksExecution_setInput");
    REQ(Execution_setOutput, "ANeuralNetworksExecution_setOutput");
    REQ(Execution_startCompute, "ANeuralNetworksExecution_startCompute");
    REQ(Execution_free, "ANeuralNetworksExecution_free");
    REQ(Event_wait, "ANeuralNetworksEvent_wait");
    REQ(Event_free, "ANeuralNetworksEvent_free");
    REQ(getDeviceCount, "ANeuralNetworks_getDeviceCount");
    REQ(getDevice, "ANeuralNetworks_getDevice");
    REQ(Device_getName, "ANeuralNetworksDevice_getName");
    REQ(Device_getType, "ANeuralNetworksDevice_getType");
    REQ(Device_getFeatureLevel, "ANeuralNetworksDevice_getFeatureLevel");
#undef REQ
    *(void **)&d->f.Model_relaxComputationFloat32toFloat16 = dlsym(d->lib, "ANeuralNetworksModel_relaxComputationFloat32toFloat16");
    *(void **)&d->f.getRuntimeFeatureLevel = dlsym(d->lib, "ANeuralNetworks_getRuntimeFeatureLevel");
    return PI2_OK;
}

static pi2_status list_devices(pi2_nnapi *d) {
    uint32_t n = 0;
    int rc = d->f.getDeviceCount(&n);
    if (rc) return pi2_set_error(PI2_ERR_UNSUPPORTED, "NNAPI: getDeviceCount failed (%s)", pi2_nnapi_result_name(rc));
    d->n_dev = n < MAX_DEVICES ? (int32_t)n : MAX_DEVICES;
    int64_t min_level = 0;
    for (int32_t i = 0; i < d->n_dev; i++) {
        ANeuralNetworksDevice *dev = NULL;
        const char *name = NULL;
        pi2_nnapi_device *o = &d->dev[i];
        if ((rc = d->f.getDevice((uint32_t)i, &dev)) || (rc = d->f.Device_getName(dev, &name)) ||
            (rc = d->f.Device_getType(dev, &o->type)) || (rc = d->f.Device_getFeatureLevel(dev, &o->feature_level)))
            return pi2_set_error(PI2_ERR_UNSUPPORTED, "NNAPI: device %d cannot be queried (%s)", (int)i, pi2_nnapi_result_name(rc));
        snprintf(d->names[i], sizeof d->names[i], "%s", name ? name : "?");
        o->name = d->names[i];
        d->handle[i] = dev;
        o->selected = !d->p.accelerators_only || o->type == NN_DEVICE_GPU || o->type == NN_DEVICE_ACCELERATOR;
        if (o->selected) {
            d->sel[d->n_sel++] = dev;
            if (!min_level || o->feature_level < min_level) min_level = o->feature_level;
        }
    }
    d->runtime_level = d->f.getRuntimeFeatureLevel ? d->f.getRuntimeFeatureLevel() : NN_FEATURE_LEVEL_3;
    if (d->p.batch_matmul && (d->runtime_level < NN_FEATURE_LEVEL_6 || min_level < NN_FEATURE_LEVEL_6)) {
        d->p.batch_matmul = 0;
        pi2_nnapi_note(d, "NNAPI: BATCH_MATMUL needs feature level 6 (runtime %lld, devices from %lld): using "
                       "FULLY_CONNECTED", (long long)d->runtime_level, (long long)min_level);
    }
    if (d->p.weight_type == 1 && d->n_sel && min_level < NN_FEATURE_LEVEL_3) {   /* TENSOR_FLOAT16 FC: level 3 */
        d->p.weight_type = 0;
        pi2_nnapi_note(d, "NNAPI: a device has feature level %lld < 29 (no F16 FULLY_CONNECTED): using F32 weights",
             (long long)min_level);
    }
    return PI2_OK;
}

pi2_status pi2_nnapi_open(const pi2_nnapi_params *params, pi2_nnapi **out) {
    if (!out) return pi2_set_error(PI2_ERR_INVALID, "NULL output");
    *out = NULL;
    const pi2_nnapi_params p = params ? *params : default_params();
    if ((p.weight_type != 0 && p.weight_type != 1) || p.max_shapes < 1 || p.max_shapes > MAX_SHAPES ||
        (p.batch_matmul != 0 && p.batch_matmul != 1))
        return pi2_set_error(PI2_ERR_INVALID, "bad NNAPI parameters: weight_type %d, max_shapes %d",
                             (int)p.weight_type, (int)p.max_shapes);
    const char *path = p.lib_path ? p.lib_path : "libneuralnetworks.so";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        return pi2_set_error(PI2_ERR_UNSUPPORTED, "NNAPI unavailable: %s", e ? e : path);
    }
    pi2_nnapi *d = calloc(1, sizeof *d);
    if (!d) { dlclose(lib); return pi2_set_error(PI2_ERR_NOMEM, "out of memory"); }
    d->lib = lib;
    d->p = p;
    d->p.lib_path = NULL;   /* not kept: the caller's string */
    pi2_status s = resolve(d);
    if (!s) s = list_devices(d);
    if (s) { dlclose(lib); free(d); return s; }
    *out = d;
    return PI2_OK;
}

void pi2_nnapi_close(pi2_nnapi *d) {
    if (!d) return;
    dlclose(d->lib);
    free(d);
}

_Static_assert(MAX_DEVICES == PI2_NNAPI_MAX_DEVICES && MAX_DEVICES == sizeof(((pi2_nnapi_info *)0)->devices) /
               sizeof(pi2_nnapi_device), "pi2_nnapi_info holds every device");

pi2_status pi2_nnapi_get_info(const pi2_nnapi *d, pi2_nnapi_info *out) {
    if (!d || !out || !out->size) return pi2_set_error(PI2_ERR_INVALID, "NULL delegate or output");
    pi2_nnapi_info info = {.runtime_feature_level = d->runtime_level, .notes = d->notes, .n_devices = d->n_dev};
    for (int32_t i = 0; i < d->n_dev; i++) info.devices[i] = d->dev[i];
    info.size = out->size < sizeof info ? out->size : (uint32_t)sizeof info;
    memcpy(out, &info, info.size);
    return PI2_OK;
}
