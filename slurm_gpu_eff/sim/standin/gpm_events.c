/* GPM samples and metrics (Hopper and newer), and XID events through event sets.
 * Samples and sets come from fixed pools, so a handle passed back is checked against
 * the pool (never dereferenced blindly) and a leaking caller cannot grow memory. */
#define _GNU_SOURCE
#include "standin.h"

#include <stdint.h>
#include <string.h>

#define MAX_GPM_SAMPLES 256
#define MAX_EVENT_SETS 32
#define MAX_REGISTRATIONS 64
#define MAX_PENDING 256

/* The index of `p` in a pool of `n` items of `size` bytes starting at `base`, or -1:
 * a pointer passed back is compared, never dereferenced, until it is known to be ours. */
static int pool_index(const void *base, size_t size, int n, const void *p)
{
    uintptr_t from = (uintptr_t)base, at = (uintptr_t)p;
    if (at < from || at >= from + (uintptr_t)n * size || (at - from) % size != 0)
        return -1;
    return (int)((at - from) / size);
}

#ifndef STANDIN_OLD_DRIVER

/* --- GPM -------------------------------------------------------------------------------- */

struct nvmlGpmSample_st {
    bool used, taken;
    double time;                       /* simulated time it was taken */
    struct nvmlDevice_st *target;      /* the GPU or MIG instance it was taken on */
};

static struct nvmlGpmSample_st gpm_samples[MAX_GPM_SAMPLES];

static struct nvmlGpmSample_st *find_sample(nvmlGpmSample_t p)
{
    int i = pool_index(gpm_samples, sizeof gpm_samples[0], MAX_GPM_SAMPLES, p);
    return i >= 0 && gpm_samples[i].used ? &gpm_samples[i] : NULL;
}

/* The profile metric each GPM metric reads (the rest: NOT_SUPPORTED). */
static int gpm_metric(unsigned id)
{
    switch (id) {
    case NVML_GPM_METRIC_SM_UTIL: return M_SM_ACTIVE;
    case NVML_GPM_METRIC_SM_OCCUPANCY: return M_SM_OCCUPANCY;
    case NVML_GPM_METRIC_ANY_TENSOR_UTIL: return M_TENSOR_ACTIVE;
    case NVML_GPM_METRIC_DRAM_BW_UTIL: return M_DRAM_ACTIVE;
    case NVML_GPM_METRIC_FP64_UTIL: return M_FP64_ACTIVE;
    case NVML_GPM_METRIC_FP32_UTIL: return M_FP32_ACTIVE;
    case NVML_GPM_METRIC_FP16_UTIL: return M_FP16_ACTIVE;
    case NVML_GPM_METRIC_PCIE_TX_PER_SEC: return M_PCIE_TX_MBPS;
    case NVML_GPM_METRIC_PCIE_RX_PER_SEC: return M_PCIE_RX_MBPS;
    case NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: return M_NVLINK_RX_MBPS;
    case NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: return M_NVLINK_TX_MBPS;
    default: return -1;
    }
}

static nvmlReturn_t gpm_support(nvmlDevice_t handle, nvmlGpmSupport_t *support)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t r = get_target(handle, "nvmlGpmQueryDeviceSupport", WHOLE_GPU | CHECK_LOST, &d);
    if (r != NVML_SUCCESS)
        return r;
    if (support == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (support->version != NVML_GPM_SUPPORT_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    support->isSupportedDevice = d->gpm;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t device, nvmlGpmSupport_t *gpmSupport)
{
    LOCKED(gpm_support(device, gpmSupport));
}

static nvmlReturn_t gpm_alloc(nvmlGpmSample_t *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_GPM_SAMPLES; i++)
        if (!gpm_samples[i].used) {
            gpm_samples[i] = (struct nvmlGpmSample_st){ .used = true };
            *out = &gpm_samples[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *gpmSample)
{
    LOCKED(gpm_alloc(gpmSample));
}

static nvmlReturn_t gpm_free(nvmlGpmSample_t sample)
{
    struct nvmlGpmSample_st *s = find_sample(sample);
    if (s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *s = (struct nvmlGpmSample_st){ 0 };
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t gpmSample)
{
    LOCKED(gpm_free(gpmSample));
}

/* A GPM sample of the whole GPU, or (gi_id >= 0) of its GPU instance gi_id. */
static nvmlReturn_t gpm_take(nvmlDevice_t handle, const char *function, long long gi_id, nvmlGpmSample_t sample)
{
    struct nvmlDevice_st *d, *target;
    nvmlReturn_t r = get_target(handle, function, WHOLE_GPU | CHECK_LOST, &d);
    if (r != NVML_SUCCESS)
        return r;
    if (!d->gpm)
        return NVML_ERROR_NOT_SUPPORTED;
    struct nvmlGpmSample_st *s = find_sample(sample);
    if (s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    target = gi_id < 0 ? d : NULL;
    for (int i = 0; target == NULL && i < d->n_migs; i++)
        if (model.migs[d->first_mig + i].gi_id == (unsigned)gi_id)
            target = &model.migs[d->first_mig + i];
    if (target == NULL)
        return NVML_ERROR_NOT_FOUND;
    if (target != d && target_failing(target, sim_now())) /* its GPU's failing was checked */
        return NVML_ERROR_UNKNOWN;
    s->taken = true;
    s->time = sim_now();
    s->target = target;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t device, nvmlGpmSample_t gpmSample)
{
    LOCKED(gpm_take(device, "nvmlGpmSampleGet", -1, gpmSample));
}

EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t device, unsigned int gpuInstanceId, nvmlGpmSample_t gpmSample)
{
    LOCKED(gpm_take(device, "nvmlGpmMigSampleGet", gpuInstanceId, gpmSample));
}

/* Means of the profile's activity between the two samples, which must be of the same
 * target and MORE than 100 ms apart (the driver's refresh). */
static nvmlReturn_t gpm_metrics(nvmlGpmMetricsGet_t *request)
{
    if (model.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (request == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (request->version != NVML_GPM_METRICS_GET_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct nvmlGpmSample_st *first = find_sample(request->sample1);
    struct nvmlGpmSample_st *second = find_sample(request->sample2);
    if (first == NULL || second == NULL || !first->taken || !second->taken || first->target != second->target
        || lookup_handle(first->target) == NULL || !(second->time - first->time > 0.1)
        || request->numMetrics > NVML_GPM_METRIC_MAX)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < request->numMetrics; i++) {
        nvmlGpmMetric_t *metric = &request->metrics[i];
        int m = gpm_metric(metric->metricId);
        metric->nvmlReturn = m < 0 ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
        metric->value = m < 0 ? 0.0 : target_mean(first->target, (enum metric)m, first->time, second->time);
        memset(&metric->metricInfo, 0, sizeof metric->metricInfo);
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *metricsGet)
{
    LOCKED(gpm_metrics(metricsGet));
}

#endif /* STANDIN_OLD_DRIVER */

/* --- XID events ---------------------------------------------------------------------------- */

/* One registration of a GPU: events after `since` are still to be collected. Registering
 * a GPU twice makes two registrations, and each delivers its own copy of every event. */
struct registration {
    struct nvmlDevice_st *gpu;
    double since;
};

struct nvmlEventSet_st {
    bool used;
    int n_registered;
    struct registration registered[MAX_REGISTRATIONS];
    int head, n_pending;               /* a ring of events not yet handed out */
    nvmlEventData_t pending[MAX_PENDING];
};

static struct nvmlEventSet_st event_sets[MAX_EVENT_SETS];

static struct nvmlEventSet_st *find_set(nvmlEventSet_t p)
{
    int i = pool_index(event_sets, sizeof event_sets[0], MAX_EVENT_SETS, p);
    return i >= 0 && event_sets[i].used ? &event_sets[i] : NULL;
}

static nvmlReturn_t set_create(nvmlEventSet_t *out)
{
    if (model.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < MAX_EVENT_SETS; i++)
        if (!event_sets[i].used) {
            memset(&event_sets[i], 0, sizeof event_sets[i]);
            event_sets[i].used = true;
            *out = &event_sets[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_MEMORY;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    LOCKED(set_create(set));
}

static nvmlReturn_t set_register(nvmlDevice_t handle, unsigned long long types, nvmlEventSet_t set)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t r = get_target(handle, "nvmlDeviceRegisterEvents", WHOLE_GPU, &d);
    if (r != NVML_SUCCESS)
        return r;
    struct nvmlEventSet_st *s = find_set(set);
    if (s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!(types & nvmlEventTypeXidCriticalError))
        return NVML_SUCCESS; /* the only events modelled */
    if (s->n_registered == MAX_REGISTRATIONS)
        return NVML_ERROR_INSUFFICIENT_RESOURCES;
    s->registered[s->n_registered++] = (struct registration){ d, sim_now() };
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    LOCKED(set_register(device, eventTypes, set));
}

struct collecting {
    struct nvmlEventSet_st *set;
    struct nvmlDevice_st *gpu;
};

/* Queues a phase's XIDs; past MAX_PENDING unread events, newer ones are dropped. */
static void queue_xids(const struct phase *p, double at, void *context)
{
    struct collecting *c = context;
    (void)at;
    for (int i = 0; i < p->n_xid && c->set->n_pending < MAX_PENDING; i++) {
        int slot = (c->set->head + c->set->n_pending++) % MAX_PENDING;
        c->set->pending[slot] = (nvmlEventData_t){ c->gpu, nvmlEventTypeXidCriticalError, p->xid[i],
                                                   NO_INSTANCE, NO_INSTANCE };
    }
}

/* Never blocks: the next pending XID event, or TIMEOUT when there is none. */
static nvmlReturn_t set_wait(nvmlEventSet_t set, nvmlEventData_t *data)
{
    if (model.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    struct nvmlEventSet_st *s = find_set(set);
    if (s == NULL || data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    double t = sim_now();
    for (int i = 0; i < s->n_registered; i++) {
        struct registration *reg = &s->registered[i];
        struct collecting c = { s, reg->gpu };
        if (lookup_handle(reg->gpu) != NULL) /* a device of this initialisation */
            target_events(reg->gpu, EV_XID, reg->since, t, queue_xids, &c);
        reg->since = t;
    }
    if (s->n_pending == 0)
        return NVML_ERROR_TIMEOUT;
    *data = s->pending[s->head];
    s->head = (s->head + 1) % MAX_PENDING;
    s->n_pending--;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    (void)timeoutms;
    LOCKED(set_wait(set, data));
}

static nvmlReturn_t set_free(nvmlEventSet_t set)
{
    struct nvmlEventSet_st *s = find_set(set);
    if (s == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    s->used = false;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    LOCKED(set_free(set));
}

void pools_clear(void)
{
#ifndef STANDIN_OLD_DRIVER
    memset(gpm_samples, 0, sizeof gpm_samples);
#endif
    memset(event_sets, 0, sizeof event_sets);
}
