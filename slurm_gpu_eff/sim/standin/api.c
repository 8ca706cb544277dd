/* The NVML API that pynvml calls for a per-job sampler: init, identity, readings,
 * processes, MIG. GPM and events are in gpm_events.c. Each exported function takes the
 * model's lock and calls a static function that does the work. */
#define _GNU_SOURCE
#include "standin.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The pid NVML lists for a job sharing the GPU: pid 1 is in no Slurm job's cgroup. */
#define SHARING_PID 1
/* The pid listed when the state file names none. */
#define DEFAULT_PID 100000

/* --- handles -------------------------------------------------------------------------- */

static struct nvmlDevice_st *in_table(uintptr_t p, struct nvmlDevice_st *table, int n)
{
    uintptr_t base = (uintptr_t)table, size = sizeof *table;
    if (p < base || p >= base + (uintptr_t)n * size || (p - base) % size != 0)
        return NULL;
    return table + (p - base) / size;
}

/* The device a handle points to, without dereferencing anything that is not ours. */
struct nvmlDevice_st *lookup_handle(nvmlDevice_t handle)
{
    uintptr_t p = (uintptr_t)handle;
    struct nvmlDevice_st *found = in_table(p, model.gpus, model.n_gpus);
    return found ? found : in_table(p, model.migs, model.n_migs);
}

struct nvmlDevice_st *parent_of(struct nvmlDevice_st *target)
{
    return target->is_mig ? &model.gpus[target->parent] : target;
}

static bool unsupported(const struct nvmlDevice_st *gpu, const char *function)
{
    char name[128];
    strip_version(function, name, sizeof name);
    for (int i = 0; i < gpu->n_unsupported; i++)
        if (strcmp(gpu->unsupported[i], name) == 0)
            return true;
    return false;
}

/* The checks, in their order: initialised, a handle of ours; a MIG instance answers for
 * its GPU ("mig" unsupported, lost) and, for whole-GPU queries, is NOT_SUPPORTED; a GPU
 * says NOT_SUPPORTED for the functions its spec lists, then GPU_IS_LOST where asked. Last,
 * a device in an nvml_error phase (or a MIG instance of a GPU in one) answers UNKNOWN, a
 * passing error, to all but its identity (minor number, UUID: the node's other GPUs
 * still bind). */
nvmlReturn_t get_target(nvmlDevice_t handle, const char *function, int flags, struct nvmlDevice_st **out)
{
    if (model.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    struct nvmlDevice_st *target = lookup_handle(handle);
    if (target == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (target->is_mig) {
        struct nvmlDevice_st *gpu = parent_of(target);
        if (unsupported(gpu, "mig"))
            return NVML_ERROR_NOT_SUPPORTED;
        if (device_lost(gpu, sim_now()))
            return NVML_ERROR_GPU_IS_LOST;
        if (flags & WHOLE_GPU)
            return NVML_ERROR_NOT_SUPPORTED;
    } else {
        if (unsupported(target, function))
            return NVML_ERROR_NOT_SUPPORTED;
        if ((flags & CHECK_LOST) && device_lost(target, sim_now()))
            return NVML_ERROR_GPU_IS_LOST;
    }
    if (!(flags & IDENTITY) && target_failing(target, sim_now()))
        return NVML_ERROR_UNKNOWN;
    *out = target;
    return NVML_SUCCESS;
}

#define TARGET(handle, function, flags)                                          \
    struct nvmlDevice_st *d;                                                     \
    do {                                                                         \
        nvmlReturn_t checked_ = get_target((handle), (function), (flags), &d);   \
        if (checked_ != NVML_SUCCESS)                                            \
            return checked_;                                                     \
    } while (0)

/* Python's int(round(x)) (half to even), clamped to an unsigned int. */
static unsigned round_uint(double x)
{
    double r = nearbyint(x);
    return r <= 0 ? 0 : r >= (double)UINT_MAX ? UINT_MAX : (unsigned)r;
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned length)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

/* --- init and system ------------------------------------------------------------------- */

static nvmlReturn_t init(void)
{
    nvmlReturn_t r = model_load();
    if (r == NVML_SUCCESS)
        model.refcount++;
    return r;
}

static nvmlReturn_t shutdown(void)
{
    if (model.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (--model.refcount == 0) {
        pools_clear();
        model_clear();
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* no GPU init to skip or defer here */
    LOCKED(init());
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    LOCKED(init());
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    LOCKED(shutdown());
}

/* The texts pynvml has for these codes, so messages read the same either way. */
EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t driver_version(char *version, unsigned length)
{
    if (model.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    return copy_text("simulated", version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    LOCKED(driver_version(version, length));
}

/* --- the device list and identity -------------------------------------------------------- */

static nvmlReturn_t device_count(unsigned *count)
{
    if (model.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)model.n_gpus;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    LOCKED(device_count(deviceCount));
}

static nvmlReturn_t handle_by_index(unsigned index, nvmlDevice_t *device)
{
    if (model.refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= (unsigned)model.n_gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &model.gpus[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    LOCKED(handle_by_index(index, device));
}

static nvmlReturn_t minor_number(nvmlDevice_t handle, unsigned *minor)
{
    TARGET(handle, "nvmlDeviceGetMinorNumber", WHOLE_GPU | IDENTITY);
    if (minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minor = d->minor;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    LOCKED(minor_number(device, minorNumber));
}

static nvmlReturn_t device_uuid(nvmlDevice_t handle, char *uuid, unsigned length)
{
    TARGET(handle, "nvmlDeviceGetUUID", IDENTITY);
    return copy_text(d->uuid, uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    LOCKED(device_uuid(device, uuid, length));
}

static nvmlReturn_t device_name(nvmlDevice_t handle, char *name, unsigned length)
{
    TARGET(handle, "nvmlDeviceGetName", 0);
    if (!d->is_mig)
        return copy_text(d->name, name, length);
    char mig[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    snprintf(mig, sizeof mig, "%s MIG %llug", parent_of(d)->name, d->memory_total / (1ULL << 30));
    return copy_text(mig, name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    LOCKED(device_name(device, name, length));
}

static nvmlReturn_t power_limit(nvmlDevice_t handle, unsigned *limit)
{
    TARGET(handle, "nvmlDeviceGetEnforcedPowerLimit", WHOLE_GPU | CHECK_LOST);
    if (limit == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *limit = (unsigned)(d->power_limit_w * 1000);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    LOCKED(power_limit(device, limit));
}

/* --- memory ---------------------------------------------------------------------------- */

/* What the workload allocated now, within what the driver's reservation leaves. */
static unsigned long long allocated_bytes(struct nvmlDevice_st *d)
{
    double t = sim_now();
    double used = target_mean(d, M_MEM_USED_GIB, t, t) * GIB;
    unsigned long long room = d->memory_total - d->reserved;
    if (!(used > 0))
        return 0;
    return used >= (double)room ? room : (unsigned long long)used;
}

/* v1: the driver's reserved memory counts as used, as the real v1 has it. */
static nvmlReturn_t memory_v1(nvmlDevice_t handle, nvmlMemory_t *memory)
{
    TARGET(handle, "nvmlDeviceGetMemoryInfo", CHECK_LOST);
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = d->memory_total;
    memory->used = allocated_bytes(d) + d->reserved;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    LOCKED(memory_v1(device, memory));
}

#ifndef STANDIN_OLD_DRIVER
/* v2: reserved apart; used is what processes allocated. */
static nvmlReturn_t memory_v2(nvmlDevice_t handle, nvmlMemory_v2_t *memory)
{
    TARGET(handle, "nvmlDeviceGetMemoryInfo_v2", CHECK_LOST);
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = d->memory_total;
    memory->reserved = d->reserved;
    memory->used = allocated_bytes(d);
    memory->free = memory->total - memory->reserved - memory->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    LOCKED(memory_v2(device, memory));
}
#endif

/* --- utilisation, power, energy, temperature, clocks ---------------------------------------- */

/* The latest complete driver sample window ends here. */
static double last_window_end(const struct nvmlDevice_st *d)
{
    return floor(sim_now() / d->sample_period) * d->sample_period;
}

static nvmlReturn_t utilization(nvmlDevice_t handle, nvmlUtilization_t *rates)
{
    TARGET(handle, "nvmlDeviceGetUtilizationRates", WHOLE_GPU | CHECK_LOST);
    if (rates == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    double end = last_window_end(d), period = d->sample_period;
    rates->gpu = round_uint(device_busy(d, end - period, end));
    rates->memory = round_uint(target_mean(d, M_MEM_UTIL, end - period, end));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization_)
{
    LOCKED(utilization(device, utilization_));
}

/* A 1 s average, as on Ampere and newer. */
static nvmlReturn_t power_usage(nvmlDevice_t handle, unsigned *milliwatts)
{
    TARGET(handle, "nvmlDeviceGetPowerUsage", WHOLE_GPU | CHECK_LOST);
    if (milliwatts == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    double t = sim_now();
    *milliwatts = round_uint(target_mean(d, M_POWER_W, t - 1.0, t) * 1000);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    LOCKED(power_usage(device, power));
}

static nvmlReturn_t total_energy(nvmlDevice_t handle, unsigned long long *millijoules)
{
    TARGET(handle, "nvmlDeviceGetTotalEnergyConsumption", WHOLE_GPU | CHECK_LOST);
    if (millijoules == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    double mj = device_energy_j(d, sim_now()) * 1000;
    *millijoules = mj > 0 ? (unsigned long long)mj : 0; /* truncated, as Python's int() */
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy)
{
    LOCKED(total_energy(device, energy));
}

static double temperature_now(struct nvmlDevice_st *d)
{
    double t = sim_now();
    return nearbyint(target_mean(d, M_TEMP_C, t, t));
}

static nvmlReturn_t temperature(nvmlDevice_t handle, nvmlTemperatureSensors_t sensor, unsigned *celsius)
{
    TARGET(handle, "nvmlDeviceGetTemperature", WHOLE_GPU | CHECK_LOST);
    if (celsius == NULL || (unsigned)sensor >= NVML_TEMPERATURE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *celsius = round_uint(temperature_now(d));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                             unsigned int *temp)
{
    LOCKED(temperature(device, sensorType, temp));
}

#ifndef STANDIN_OLD_DRIVER
static nvmlReturn_t temperature_v(nvmlDevice_t handle, nvmlTemperature_t *reading)
{
    TARGET(handle, "nvmlDeviceGetTemperatureV", WHOLE_GPU | CHECK_LOST);
    if (reading == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (reading->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if ((unsigned)reading->sensorType >= NVML_TEMPERATURE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    double celsius = temperature_now(d);
    reading->temperature = celsius > INT_MAX ? INT_MAX : celsius < INT_MIN ? INT_MIN : (int)celsius;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature_)
{
    LOCKED(temperature_v(device, temperature_));
}
#endif

/* Every clock domain reads the SM clock, as sim/nvml.py answers. */
static nvmlReturn_t clock_info(nvmlDevice_t handle, nvmlClockType_t type, unsigned *mhz)
{
    TARGET(handle, "nvmlDeviceGetClockInfo", WHOLE_GPU | CHECK_LOST);
    if (mhz == NULL || (unsigned)type >= NVML_CLOCK_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    double t = sim_now();
    *mhz = round_uint(target_mean(d, M_SM_CLOCK_MHZ, t, t));
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock)
{
    LOCKED(clock_info(device, type, clock));
}

/* The phase's throttle reasons; GpuIdle when there are none and no kernel runs now. */
static nvmlReturn_t clock_reasons(nvmlDevice_t handle, const char *function, unsigned long long *mask)
{
    TARGET(handle, function, WHOLE_GPU | CHECK_LOST);
    if (mask == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    double t = sim_now();
    const struct phase *phase = target_phase_at(d, t);
    *mask = phase ? phase->throttle : 0;
    if (*mask == 0 && target_mean(d, M_UTIL, t, t) == 0)
        *mask |= nvmlClocksEventReasonGpuIdle;
    return NVML_SUCCESS;
}

#ifndef STANDIN_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    LOCKED(clock_reasons(device, "nvmlDeviceGetCurrentClocksEventReasons", reasons));
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    LOCKED(clock_reasons(device, "nvmlDeviceGetCurrentClocksThrottleReasons", reasons));
}

/* Uncorrected errors: one per XID 48 (double-bit ECC error) so far; none corrected. */
static nvmlReturn_t ecc_errors(nvmlDevice_t handle, nvmlMemoryErrorType_t type, nvmlEccCounterType_t counter,
                               unsigned long long *count)
{
    TARGET(handle, "nvmlDeviceGetTotalEccErrors", WHOLE_GPU | CHECK_LOST);
    if (count == NULL || (unsigned)type >= NVML_MEMORY_ERROR_TYPE_COUNT
        || (unsigned)counter >= NVML_ECC_COUNTER_TYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED ? device_ecc_uncorrected(d, sim_now()) : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                                nvmlEccCounterType_t counterType, unsigned long long *eccCounts)
{
    LOCKED(ecc_errors(device, errorType, counterType, eccCounts));
}

/* --- buffered samples ------------------------------------------------------------------ */

/* Deterministic noise in [-0.2, 0.2] from the window number alone (splitmix64). */
static double jitter(long long k)
{
    uint64_t z = (uint64_t)k + 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return ((double)(z >> 11) / 9007199254740992.0) * 0.4 - 0.2;
}

/* Driver window k: [t0, t1]. With jitter, its end moves by up to 20% of a period (so the
 * windows still tile time, with uneven lengths). */
static void window(const struct nvmlDevice_st *d, long long k, double *t0, double *t1)
{
    double p = d->sample_period;
    if (!(d->quirks & Q_SAMPLES_JITTER)) {
        *t1 = (double)k * p;
        *t0 = *t1 - p;
        return;
    }
    *t1 = (double)k * p + jitter(k) * p;
    *t0 = (double)(k - 1) * p + jitter(k - 1) * p;
}

/* A time as the caller's timestamps are: µs since the epoch, or since boot. */
static long long stamp_us(const struct nvmlDevice_st *d, double t)
{
    return llrint(((d->quirks & Q_BOOT_CLOCK) ? t - model.boot : t) * 1e6);
}

static bool newer(long long stamp, unsigned long long last_seen)
{
    return last_seen <= (unsigned long long)LLONG_MAX && stamp > (long long)last_seen;
}

/* The buffered windows newer than last_seen: k in [*first, *last] (empty: first > last). */
static void new_windows(const struct nvmlDevice_st *d, unsigned long long last_seen, long long *first,
                        long long *last)
{
    double p = d->sample_period, t = sim_now(), t0, t1;
    *last = (long long)floor(t / p);
    if (d->quirks & Q_SAMPLES_JITTER) { /* the newest window that has ended by now */
        for (*last += 1, window(d, *last, &t0, &t1); t1 > t; window(d, *last, &t0, &t1))
            --*last;
    }
    double after = (double)last_seen / 1e6 + ((d->quirks & Q_BOOT_CLOCK) ? model.boot : 0);
    long long from = (long long)floor(after / p) - 1; /* a little early: stamps decide */
    *first = *last - d->sample_buffer + 1;
    if (from > *first)
        *first = from;
    for (; *first <= *last; ++*first) {
        window(d, *first, &t0, &t1);
        if (newer(stamp_us(d, t1), last_seen))
            break;
    }
}

static unsigned sample_value(struct nvmlDevice_st *d, nvmlSamplingType_t type, double t0, double t1)
{
    if (type == NVML_GPU_UTILIZATION_SAMPLES)
        return round_uint(device_busy(d, t0, t1));
    if (type == NVML_MEMORY_UTILIZATION_SAMPLES)
        return round_uint(target_mean(d, M_MEM_UTIL, t0, t1));
    return round_uint(target_mean(d, M_POWER_W, t0, t1) * 1000);
}

/* Fills the oldest `n` new windows (the caller asks again from the newest it got, so a
 * short buffer loses nothing), newest first under the samples_reversed quirk. */
static void fill_samples(struct nvmlDevice_st *d, nvmlSamplingType_t type, long long first, unsigned n,
                         nvmlSample_t *out)
{
    for (unsigned i = 0; i < n; i++) {
        double t0, t1;
        window(d, first + i, &t0, &t1);
        nvmlSample_t *s = &out[(d->quirks & Q_SAMPLES_REVERSED) ? n - 1 - i : i];
        memset(s, 0, sizeof *s);
        s->timeStamp = (unsigned long long)stamp_us(d, t1);
        s->sampleValue.uiVal = sample_value(d, type, t0, t1);
    }
}

static nvmlReturn_t samples(nvmlDevice_t handle, nvmlSamplingType_t type, unsigned long long last_seen,
                            nvmlValueType_t *value_type, unsigned *count, nvmlSample_t *out)
{
    TARGET(handle, "nvmlDeviceGetSamples", WHOLE_GPU | CHECK_LOST);
    if (count == NULL || value_type == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (type != NVML_GPU_UTILIZATION_SAMPLES && type != NVML_MEMORY_UTILIZATION_SAMPLES
        && type != NVML_TOTAL_POWER_SAMPLES)
        return NVML_ERROR_NOT_SUPPORTED;
    long long first, last;
    new_windows(d, last_seen, &first, &last);
    unsigned found = first <= last ? (unsigned)(last - first + 1) : 0;
    if (found == 0) { /* the driver's answer when nothing is newer than last_seen */
        *count = 0;
        return (d->quirks & Q_EMPTY_SUCCESS) ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
    }
    *value_type = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (out == NULL) { /* the sizing call */
        *count = found;
        return NVML_SUCCESS;
    }
    if (*count == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = found < *count ? found : *count;
    fill_samples(d, type, first, *count, out);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type,
                                         unsigned long long lastSeenTimeStamp, nvmlValueType_t *sampleValType,
                                         unsigned int *sampleCount, nvmlSample_t *samples_)
{
    LOCKED(samples(device, type, lastSeenTimeStamp, sampleValType, sampleCount, samples_));
}

/* --- processes ---------------------------------------------------------------------------- */

/* The processes on a GPU or MIG instance now (at most MAX_PROCESSES + 1): the workload's
 * while it runs, as many as its phase says (one by default, none once lost), and a
 * sharing job's while shared_util is above 0. */
static unsigned list_processes(struct nvmlDevice_st *d, double t, nvmlProcessInfo_t *out)
{
    const struct phase *phase = target_phase_at(d, t);
    const struct workload *load = target_workload(d);
    if (phase == NULL && load != NULL && load->n_phases > 0)
        /* past its phases, before the workload has written its end: as its last phase left it
         * (a GPU the job never opened is not opened as the job's work ends) */
        phase = &load->phases[load->n_phases - 1];
    int count = 0;
    if (target_running(d, t)) {
        if (phase != NULL && phase->processes >= 0)
            count = phase->processes;
        else
            count = phase != NULL && phase->lost >= 0 ? 0 : 1;
    }
    long long pid = load != NULL && load->has_pid && load->pid != 0 ? load->pid : DEFAULT_PID;
    double used = target_mean(d, M_MEM_USED_GIB, t, t) * GIB;
    unsigned long long bytes = used > 0 ? (used < 1.8e19 ? (unsigned long long)used : 0) : 0;
    unsigned n = 0;
    for (; n < (unsigned)count; n++)
        out[n] = (nvmlProcessInfo_t){ (unsigned)pid, bytes / (unsigned)count, NO_INSTANCE, NO_INSTANCE };
    if (target_mean(d, M_SHARED_UTIL, t, t) > 0) /* another job's process */
        out[n++] = (nvmlProcessInfo_t){ SHARING_PID, (unsigned long long)GIB, NO_INSTANCE, NO_INSTANCE };
    return n;
}

/* Sizing call (*count 0, infos may be NULL): INSUFFICIENT_SIZE with the count, SUCCESS
 * when there are none; a buffer too small: INSUFFICIENT_SIZE with the count (nvml.h). */
static nvmlReturn_t running_processes(nvmlDevice_t handle, const char *function, unsigned *count,
                                      nvmlProcessInfo_t *infos)
{
    TARGET(handle, function, CHECK_LOST);
    if (count == NULL || (infos == NULL && *count != 0))
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessInfo_t found[MAX_PROCESSES + 1];
    unsigned n = list_processes(d, sim_now(), found);
    if (n > *count) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(infos == NULL ? found : infos, found, n * sizeof *found);
    *count = n;
    return NVML_SUCCESS;
}

#ifndef STANDIN_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    LOCKED(running_processes(device, "nvmlDeviceGetComputeRunningProcesses_v3", infoCount, infos));
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                            nvmlProcessInfo_v2_t *infos)
{
    LOCKED(running_processes(device, "nvmlDeviceGetComputeRunningProcesses_v2", infoCount, infos));
}

/* The simulator's workloads are CUDA compute processes: a GPU lists no graphics ones
 * (unless the devices file marks the call unsupported, as some drivers would). */
static nvmlReturn_t no_graphics_processes(nvmlDevice_t handle, const char *function, unsigned *count)
{
    TARGET(handle, function, CHECK_LOST);
    (void)d;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}

#ifndef STANDIN_OLD_DRIVER
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos)
{
    (void)infos;
    LOCKED(no_graphics_processes(device, "nvmlDeviceGetGraphicsRunningProcesses_v3", infoCount));
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_v2_t *infos)
{
    (void)infos;
    LOCKED(no_graphics_processes(device, "nvmlDeviceGetGraphicsRunningProcesses_v2", infoCount));
}

/* One sample per process busy (smUtil > 0) in the last complete driver window, stamped
 * with the window's end; with process_util_over_100, each doubled with 100 added. */
static unsigned process_samples(struct nvmlDevice_st *d, unsigned long long last_seen,
                                nvmlProcessUtilizationSample_t *out)
{
    double t = sim_now(), end = last_window_end(d), start = end - d->sample_period;
    long long stamp = stamp_us(d, end);
    if (!newer(stamp, last_seen))
        return 0;
    nvmlProcessInfo_t processes[MAX_PROCESSES + 1];
    unsigned n = list_processes(d, t, processes), kept = 0;
    unsigned own = round_uint(target_mean(d, M_UTIL, start, end));
    unsigned shared = round_uint(target_mean(d, M_SHARED_UTIL, start, end));
    for (unsigned i = 0; i < n; i++) {
        unsigned pid = processes[i].pid, sm = pid == SHARING_PID ? shared : own, seen = 0;
        while (seen < i && processes[seen].pid != pid)
            seen++;
        if (seen < i || sm == 0) /* listed once; idle processes are not reported */
            continue;
        out[kept++] = (nvmlProcessUtilizationSample_t){ pid, (unsigned long long)stamp, sm, 0, 0, 0 };
        if (d->quirks & Q_PROCESS_UTIL_OVER_100)
            out[kept++] = (nvmlProcessUtilizationSample_t){ pid, (unsigned long long)stamp, sm + 100, 0, 0, 0 };
    }
    return kept;
}

static nvmlReturn_t process_utilization(nvmlDevice_t handle, nvmlProcessUtilizationSample_t *utilization_,
                                        unsigned *count, unsigned long long last_seen)
{
    TARGET(handle, "nvmlDeviceGetProcessUtilization", WHOLE_GPU | CHECK_LOST);
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlProcessUtilizationSample_t found[2 * (MAX_PROCESSES + 1)];
    unsigned n = process_samples(d, last_seen, found);
    if (n == 0) {
        *count = 0;
        return (d->quirks & Q_EMPTY_SUCCESS) ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
    }
    if (utilization_ == NULL || *count == 0) { /* the sizing call */
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = n < *count ? n : *count;
    memcpy(utilization_, found, *count * sizeof *found);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization_,
                                                    unsigned int *processSamplesCount,
                                                    unsigned long long lastSeenTimeStamp)
{
    LOCKED(process_utilization(device, utilization_, processSamplesCount, lastSeenTimeStamp));
}

/* --- links: PCIe and NVLink --------------------------------------------------------------- */

/* An idle link drops to a lower generation to save power and comes back under load, as
 * real ones do: the current generation is the most while the workload keeps the GPU busy. */
static nvmlReturn_t pcie_link(nvmlDevice_t handle, const char *function, unsigned *out)
{
    TARGET(handle, function, WHOLE_GPU | CHECK_LOST);
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strcmp(function, "nvmlDeviceGetMaxPcieLinkGeneration") == 0)
        *out = d->pcie_max_gen;
    else if (strcmp(function, "nvmlDeviceGetGpuMaxPcieLinkGeneration") == 0)
        *out = d->pcie_gpu_max_gen;
    else if (strcmp(function, "nvmlDeviceGetMaxPcieLinkWidth") == 0
             || strcmp(function, "nvmlDeviceGetCurrPcieLinkWidth") == 0)
        *out = d->pcie_max_width;
    else {
        double t = sim_now();
        *out = target_mean(d, M_UTIL, t, t) > 0 ? d->pcie_max_gen : d->pcie_idle_gen;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGen)
{
    LOCKED(pcie_link(device, "nvmlDeviceGetMaxPcieLinkGeneration", maxLinkGen));
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *maxLinkGenDevice)
{
    LOCKED(pcie_link(device, "nvmlDeviceGetGpuMaxPcieLinkGeneration", maxLinkGenDevice));
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *maxLinkWidth)
{
    LOCKED(pcie_link(device, "nvmlDeviceGetMaxPcieLinkWidth", maxLinkWidth));
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen)
{
    LOCKED(pcie_link(device, "nvmlDeviceGetCurrPcieLinkGeneration", currLinkGen));
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth)
{
    LOCKED(pcie_link(device, "nvmlDeviceGetCurrPcieLinkWidth", currLinkWidth));
}

/* A GPU without NVLink: NOT_SUPPORTED; a link past the GPU's own (NVML_NVLINK_MAX_LINKS is a
 * ceiling over every architecture): INVALID_ARGUMENT, as the driver answers. */
static nvmlReturn_t nvlink_target(nvmlDevice_t handle, const char *function, unsigned link,
                                  struct nvmlDevice_st **out)
{
    TARGET(handle, function, WHOLE_GPU | CHECK_LOST);
    if (d->nvlinks == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= d->nvlinks)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = d;
    return NVML_SUCCESS;
}

static nvmlReturn_t nvlink_state(nvmlDevice_t handle, unsigned link, nvmlEnableState_t *active)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t r = nvlink_target(handle, "nvmlDeviceGetNvLinkState", link, &d);
    if (r != NVML_SUCCESS)
        return r;
    if (active == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *active = link < d->nvlinks_active ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
    LOCKED(nvlink_state(device, link, isActive));
}

static nvmlReturn_t nvlink_version(nvmlDevice_t handle, unsigned link, unsigned *version)
{
    struct nvmlDevice_st *d;
    nvmlReturn_t r = nvlink_target(handle, "nvmlDeviceGetNvLinkVersion", link, &d);
    if (r != NVML_SUCCESS)
        return r;
    if (version == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *version = d->nvlink_version;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link, unsigned int *version)
{
    LOCKED(nvlink_version(device, link, version));
}

/* --- MIG --------------------------------------------------------------------------------- */

static nvmlReturn_t mig_mode(nvmlDevice_t handle, unsigned *current, unsigned *pending)
{
    TARGET(handle, "nvmlDeviceGetMigMode", WHOLE_GPU);
    if (current == NULL || pending == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = d->n_migs > 0 ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    LOCKED(mig_mode(device, currentMode, pendingMode));
}

static nvmlReturn_t max_mig_count(nvmlDevice_t handle, unsigned *count)
{
    TARGET(handle, "nvmlDeviceGetMaxMigDeviceCount", WHOLE_GPU);
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = d->n_migs > 0 ? MAX_MIGS_PER_GPU : 0;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    LOCKED(max_mig_count(device, count));
}

static nvmlReturn_t mig_by_index(nvmlDevice_t handle, unsigned index, nvmlDevice_t *mig)
{
    TARGET(handle, "nvmlDeviceGetMigDeviceHandleByIndex", WHOLE_GPU);
    if (mig == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (index >= (unsigned)d->n_migs)
        return NVML_ERROR_NOT_FOUND;
    *mig = &model.migs[d->first_mig + (int)index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                        nvmlDevice_t *migDevice)
{
    LOCKED(mig_by_index(device, index, migDevice));
}

static nvmlReturn_t is_mig_handle(nvmlDevice_t handle, unsigned *is_mig)
{
    TARGET(handle, "nvmlDeviceIsMigDeviceHandle", 0);
    if (is_mig == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *is_mig = d->is_mig;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    LOCKED(is_mig_handle(device, isMigDevice));
}

static nvmlReturn_t gpu_instance_id(nvmlDevice_t handle, unsigned *id)
{
    TARGET(handle, "nvmlDeviceGetGpuInstanceId", 0);
    if (id == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->is_mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = d->gi_id;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    LOCKED(gpu_instance_id(device, id));
}

static nvmlReturn_t mig_parent(nvmlDevice_t handle, nvmlDevice_t *gpu)
{
    TARGET(handle, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", 0);
    if (gpu == NULL || !d->is_mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *gpu = parent_of(d);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    LOCKED(mig_parent(migDevice, device));
}

/* --- the test hook ------------------------------------------------------------------------ */

/* t > 0 fixes the simulated "now" at t (epoch seconds); t <= 0 returns to the clock. */
EXPORT void gpueffSimSetClock(double t)
{
    model_lock();
    model.fixed_clock = t > 0 ? t : 0;
    model_unlock();
}
