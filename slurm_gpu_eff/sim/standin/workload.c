/* What a GPU does: the workload's state file, and readings computed from it exactly
 * (integrals in closed form, as sim/profile.py's Signal and Profile do). */
#define _GNU_SOURCE
#include "standin.h"
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_STATE_BYTES (16 << 20)

const char *const metric_names[M_COUNT] = {
    "util", "mem_util", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "fp16_active", "fp32_active", "fp64_active", "mem_used_gib", "power_w", "temp_c",
    "sm_clock_mhz", "pcie_rx_mbps", "pcie_tx_mbps", "nvlink_rx_mbps", "nvlink_tx_mbps",
    "shared_util",
};

/* The simulated clock: the test hook's fixed time, else the wall clock, run `time_scale`
 * times faster since the simulated driver's load. */
double sim_now(void)
{
    if (model.fixed_clock > 0)
        return model.fixed_clock;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    double wall = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
    double scale = model.time_scale > 0 ? model.time_scale : 1; /* 0: not loaded yet */
    return scale == 1 ? wall : model.boot + (wall - model.boot) * scale;
}

/* --- reading the state file ------------------------------------------------------------ */

static bool read_level(const struct json *value, struct level *out)
{
    if (value->type == JSON_NUMBER) {
        *out = (struct level){ value->number, 0, 0, 1 };
        return true;
    }
    if (value->type != JSON_ARRAY || value->count != 4)
        return false;
    double v[4];
    for (int i = 0; i < 4; i++) {
        if (value->items[i].type != JSON_NUMBER)
            return false;
        v[i] = value->items[i].number;
    }
    *out = (struct level){ v[0], v[1], v[2], v[3] };
    return out->period <= 0 || (out->duty >= 0 && out->duty <= 1);
}

/* Unknown metric names are skipped: a newer workload may know more than we do. */
static bool read_levels(const struct json *levels, struct phase *phase)
{
    if (levels == NULL || levels->type == JSON_NULL)
        return true;
    if (levels->type != JSON_OBJECT)
        return false;
    for (size_t i = 0; i < levels->count; i++)
        for (int m = 0; m < M_COUNT; m++)
            if (strcmp(levels->keys[i], metric_names[m]) == 0) {
                if (!read_level(&levels->items[i], &phase->levels[m]))
                    return false;
                phase->has_level |= 1u << m;
            }
    return true;
}

static bool read_throttle(const struct json *list, struct phase *phase)
{
    /* nvml.h 13.5 names the three hardware reasons only as ClocksThrottleReason (the
     * same bits as pynvml's nvmlClocksEventReasonHw...). */
    static const struct { const char *name; unsigned long long bit; } reasons[] = {
        { "power_cap", nvmlClocksEventReasonSwPowerCap },
        { "hw_slowdown", nvmlClocksThrottleReasonHwSlowdown },
        { "sw_thermal", nvmlClocksEventReasonSwThermalSlowdown },
        { "hw_thermal", nvmlClocksThrottleReasonHwThermalSlowdown },
        { "power_brake", nvmlClocksThrottleReasonHwPowerBrakeSlowdown },
    };
    if (list == NULL || list->type == JSON_NULL)
        return true;
    if (list->type != JSON_ARRAY)
        return false;
    for (size_t i = 0; i < list->count; i++) {
        if (list->items[i].type != JSON_STRING)
            return false;
        for (size_t r = 0; r < sizeof reasons / sizeof reasons[0]; r++)
            if (strcmp(list->items[i].string, reasons[r].name) == 0)
                phase->throttle |= reasons[r].bit;
    }
    return true;
}

static bool is_count(const struct json *v, double max)
{
    return v->type == JSON_NUMBER && v->number == floor(v->number) && v->number >= 0 && v->number <= max;
}

/* XID codes beyond MAX_XIDS_PER_PHASE in one phase are dropped (bounded memory). */
static bool read_xids(const struct json *list, struct phase *phase)
{
    if (list == NULL || list->type == JSON_NULL)
        return true;
    if (list->type != JSON_ARRAY)
        return false;
    for (size_t i = 0; i < list->count; i++) {
        if (!is_count(&list->items[i], 4294967295.0))
            return false;
        if (phase->n_xid < MAX_XIDS_PER_PHASE)
            phase->xid[phase->n_xid++] = (unsigned)list->items[i].number;
    }
    return true;
}

/* An optional boolean: -1 when absent or null. */
static int read_flag(const struct json *value, bool *ok)
{
    if (value == NULL || value->type == JSON_NULL)
        return -1;
    if (value->type != JSON_BOOL)
        *ok = false;
    return value->boolean;
}

static bool read_phase(const struct json *item, struct phase *phase)
{
    const struct json *start = json_get(item, "start_s"), *seconds = json_get(item, "seconds");
    const struct json *processes = json_get(item, "processes");
    bool ok = true;
    memset(phase, 0, sizeof *phase);
    if (start == NULL || start->type != JSON_NUMBER || seconds == NULL || seconds->type != JSON_NUMBER)
        return false;
    phase->start = start->number;
    phase->seconds = seconds->number;
    phase->processes = -1;
    if (processes != NULL && processes->type != JSON_NULL) {
        if (!is_count(processes, 1e9))
            return false;
        phase->processes = (int)fmin(processes->number, MAX_PROCESSES);
    }
    phase->lost = read_flag(json_get(item, "lost"), &ok);
    phase->energy_reset = read_flag(json_get(item, "energy_reset"), &ok) == 1;
    phase->nvml_error = read_flag(json_get(item, "nvml_error"), &ok) == 1;
    return ok && read_levels(json_get(item, "levels"), phase)
           && read_throttle(json_get(item, "throttle"), phase) && read_xids(json_get(item, "xid"), phase);
}

/* An optional whole number, 0 or more (null or absent: not there). */
static bool read_integer(const struct json *item, bool *has, long long *value)
{
    if (item == NULL || item->type == JSON_NULL)
        return true;
    if (item->type != JSON_NUMBER || item->number != floor(item->number) || item->number < 0
        || item->number > 1e15)
        return false;
    *has = true;
    *value = (long long)item->number;
    return true;
}

static bool read_times(const struct json *root, struct workload *load)
{
    const struct json *started = json_get(root, "started_at"), *ended = json_get(root, "ended_at");
    const struct json *prior = json_get(root, "prior_extra_j");
    if (started == NULL || started->type != JSON_NUMBER)
        return false;
    load->started = started->number;
    load->ended = INFINITY;
    if (ended != NULL && ended->type != JSON_NULL) {
        if (ended->type != JSON_NUMBER)
            return false;
        load->ended = ended->number;
    }
    if (prior != NULL && prior->type != JSON_NULL) {
        if (prior->type != JSON_NUMBER)
            return false;
        load->prior_extra_j = prior->number;
    }
    return read_integer(json_get(root, "pid"), &load->has_pid, &load->pid)
           && read_integer(json_get(root, "pid_start"), &load->has_pid_start, &load->pid_start);
}

void workload_free(struct workload *load)
{
    if (load == NULL)
        return;
    free(load->phases);
    free(load);
}

struct workload *workload_parse(const char *text, size_t length)
{
    struct json *root = json_parse(text, length);
    struct workload *load = calloc(1, sizeof *load);
    const struct json *phases = json_get(root, "phases");
    bool ok = load != NULL && phases != NULL && phases->type == JSON_ARRAY
              && phases->count <= MAX_PHASES && read_times(root, load);
    if (ok && phases->count > 0) {
        load->phases = calloc(phases->count, sizeof *load->phases);
        ok = load->phases != NULL;
    }
    for (size_t i = 0; ok && i < phases->count; i++) {
        ok = phases->items[i].type == JSON_OBJECT && read_phase(&phases->items[i], &load->phases[i]);
        load->n_phases = (int)i + 1;
    }
    json_free(root);
    if (!ok) {
        workload_free(load);
        return NULL;
    }
    return load;
}

/* The state file, re-read only when it changed (a new inode, size or time); a missing,
 * half-written or invalid file is no workload: the target reads idle. */
const struct workload *target_workload(struct nvmlDevice_st *target)
{
    if (target->checked_call == model.calls && model.calls != 0)
        return target->load; /* one stat per API call is enough */
    target->checked_call = model.calls;
    struct stat info;
    if (stat(target->state_path, &info) != 0) {
        target_forget(target);
        return NULL;
    }
    long long mtime = (long long)info.st_mtim.tv_sec * 1000000000LL + info.st_mtim.tv_nsec;
    long long ctime = (long long)info.st_ctim.tv_sec * 1000000000LL + info.st_ctim.tv_nsec;
    if (target->cached && target->cache_dev == info.st_dev && target->cache_ino == info.st_ino
        && target->cache_mtime_ns == mtime && target->cache_ctime_ns == ctime
        && target->cache_size == info.st_size)
        return target->load;
    target_forget(target);
    size_t length;
    char *text = read_text_file(target->state_path, MAX_STATE_BYTES, &length);
    target->load = text ? workload_parse(text, length) : NULL;
    free(text);
    target->cached = true;
    target->cache_dev = info.st_dev;
    target->cache_ino = info.st_ino;
    target->cache_mtime_ns = mtime;
    target->cache_ctime_ns = ctime;
    target->cache_size = info.st_size;
    return target->load;
}

/* --- signals and profiles (sim/profile.py's arithmetic, operation for operation, so the
 * figures agree to the last bit) ---------------------------------------------------------- */

/* Python's float %: the result takes the divisor's sign. */
static double py_mod(double t, double period)
{
    double m = fmod(t, period);
    if (m != 0 && ((period < 0) != (m < 0)))
        m += period;
    return m;
}

static double level_at(const struct level *s, double t)
{
    if (s->period <= 0)
        return s->low;
    return py_mod(t, s->period) < s->duty * s->period ? s->high : s->low;
}

/* Time spent high in [0, t]. */
static double high_time(const struct level *s, double t)
{
    double on = s->duty * s->period;
    double whole = floor(t / s->period);
    return whole * on + fmin(t - whole * s->period, on);
}

static double level_integral(const struct level *s, double t0, double t1)
{
    if (s->period <= 0)
        return s->low * (t1 - t0);
    return s->low * (t1 - t0) + (s->high - s->low) * (high_time(s, t1) - high_time(s, t0));
}

static double profile_value_at(const struct workload *load, enum metric m, double t, double idle)
{
    for (int i = 0; i < load->n_phases; i++) {
        const struct phase *p = &load->phases[i];
        if (p->start <= t && t < p->start + p->seconds)
            return (p->has_level & (1u << m)) ? level_at(&p->levels[m], t - p->start) : idle;
    }
    return idle;
}

/* Exact integral of a metric over [t0, t1] (seconds since the workload started). */
static double profile_integral(const struct workload *load, enum metric m, double t0, double t1, double idle)
{
    if (t1 <= t0)
        return 0.0;
    double total = 0.0, covered = 0.0;
    for (int i = 0; i < load->n_phases; i++) {
        const struct phase *p = &load->phases[i];
        double lo = fmax(t0, p->start), hi = fmin(t1, p->start + p->seconds);
        if (hi <= lo)
            continue;
        covered += hi - lo;
        if (p->has_level & (1u << m))
            total += level_integral(&p->levels[m], lo - p->start, hi - p->start);
        else
            total += idle * (hi - lo);
    }
    return total + idle * ((t1 - t0) - covered);
}

static double span_of(const struct workload *load)
{
    return isinf(load->ended) ? INFINITY : load->ended - load->started;
}

/* Mean of a metric over [t0, t1] (the instant value when t1 <= t0); idle outside the
 * workload. */
double target_mean(struct nvmlDevice_st *target, enum metric m, double t0, double t1)
{
    double idle = target->idle[m];
    const struct workload *load = target_workload(target);
    if (load == NULL)
        return idle;
    double rel0 = t0 - load->started, rel1 = t1 - load->started, stop = span_of(load);
    if (rel1 <= rel0)
        return 0 <= rel0 && rel0 < stop ? profile_value_at(load, m, rel0, idle) : idle;
    double inside = profile_integral(load, m, rel0, fmin(rel1, stop), idle);
    double after = idle * fmax(0.0, rel1 - fmax(rel0, stop));
    return (inside + after) / (rel1 - rel0);
}

/* The phase in force at t while the workload runs (for its states: throttle, processes). */
const struct phase *target_phase_at(struct nvmlDevice_st *target, double t)
{
    const struct workload *load = target_workload(target);
    if (load == NULL || !(0 <= t - load->started && t - load->started < span_of(load)))
        return NULL;
    double rel = t - load->started;
    for (int i = 0; i < load->n_phases; i++) {
        const struct phase *p = &load->phases[i];
        if (p->start <= rel && rel < p->start + p->seconds)
            return p;
    }
    return NULL;
}

static bool sets_event(const struct phase *p, enum event_kind kind)
{
    switch (kind) {
    case EV_XID:
        return p->n_xid > 0;
    case EV_LOST:
        return p->lost == 1;
    default:
        return p->energy_reset;
    }
}

void target_events(struct nvmlDevice_st *target, enum event_kind kind, double t0, double t1,
                   void (*each)(const struct phase *, double, void *), void *context)
{
    const struct workload *load = target_workload(target);
    if (load == NULL)
        return;
    double end = fmin(t1, load->started + span_of(load));
    double rel0 = t0 - load->started, rel1 = end - load->started;
    for (int i = 0; i < load->n_phases; i++) {
        const struct phase *p = &load->phases[i];
        if (rel0 < p->start && p->start <= rel1 && sets_event(p, kind))
            each(p, load->started + p->start, context);
    }
}

/* When process `pid` started (/proc/PID/stat's 22nd field, clock ticks since boot), or
 * -1 when there is no such process: what tells the workload's process from a later one
 * that took its pid (sim/workload.py's process_start). */
static long long process_started_at(long long pid)
{
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%lld/stat", pid);
    FILE *file = fopen(path, "re");
    if (file == NULL)
        return -1;
    size_t length = fread(text, 1, sizeof text - 1, file);
    fclose(file);
    text[length] = '\0';
    const char *field = strrchr(text, ')'); /* the name, in parentheses, may hold anything */
    long long value = -1;
    for (int n = 2; field != NULL && n < 22; n++) /* field 2 ends at the ')' */
        field = strchr(field + 1, ' ');
    if (field != NULL && sscanf(field + 1, "%lld", &value) != 1)
        value = -1;
    return value;
}

/* The workload runs: started, not ended, and its process alive (NVML lists live
 * processes only; a workload killed with SIGKILL never wrote its end). */
bool target_running(struct nvmlDevice_st *target, double t)
{
    const struct workload *load = target_workload(target);
    if (load == NULL || !(load->started <= t) || t >= load->ended)
        return false;
    if (!load->has_pid)
        return true;
    if (!load->has_pid_start) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%lld", load->pid);
        return access(path, F_OK) == 0;
    }
    return process_started_at(load->pid) == load->pid_start;
}

static void note_found(const struct phase *p, double at, void *context)
{
    (void)p;
    (void)at;
    *(bool *)context = true;
}

/* Lost from the `lost` phase's start for as long as the workload runs. */
bool device_lost(struct nvmlDevice_st *gpu, double t)
{
    const struct workload *load = target_workload(gpu);
    if (load == NULL || t - load->started >= span_of(load))
        return false;
    bool found = false;
    target_events(gpu, EV_LOST, load->started - 1e-9, t, note_found, &found);
    return found;
}

/* In an nvml_error phase now: the target's own workload's, or for a MIG instance its
 * GPU's too (a failing GPU fails its instances; a failing instance leaves its GPU be). */
bool target_failing(struct nvmlDevice_st *target, double t)
{
    const struct phase *p = target_phase_at(target, t);
    if (p != NULL && p->nvml_error)
        return true;
    return target->is_mig && target_failing(parent_of(target), t);
}

/* Energy a workload drew above idle, from its start until t (or its end). */
static double extra_energy_j(struct nvmlDevice_st *gpu, double t)
{
    const struct workload *load = target_workload(gpu);
    if (load == NULL)
        return 0.0;
    double idle = gpu->idle[M_POWER_W];
    double stop = fmin(t, load->ended);
    double span = fmax(0.0, stop - load->started);
    return load->prior_extra_j + (profile_integral(load, M_POWER_W, 0.0, span, idle) - idle * span);
}

static void note_time(const struct phase *p, double at, void *context)
{
    (void)p;
    *(double *)context = at;
}

/* The counter: idle power since driver load plus what workloads added, from the latest
 * reset on. */
double device_energy_j(struct nvmlDevice_st *gpu, double t)
{
    double idle = gpu->idle[M_POWER_W];
    double total = idle * fmax(0.0, t - model.boot) + extra_energy_j(gpu, t);
    double reset = NAN;
    target_events(gpu, EV_ENERGY_RESET, -INFINITY, t, note_time, &reset);
    if (!isnan(reset))
        total -= idle * fmax(0.0, reset - model.boot) + extra_energy_j(gpu, reset);
    return total;
}

/* The GPU's utilisation: its job's work plus what a job sharing it adds (capped). */
double device_busy(struct nvmlDevice_st *gpu, double t0, double t1)
{
    return fmin(100.0, target_mean(gpu, M_UTIL, t0, t1) + target_mean(gpu, M_SHARED_UTIL, t0, t1));
}

static void count_ecc(const struct phase *p, double at, void *context)
{
    (void)at;
    for (int i = 0; i < p->n_xid; i++)
        if (p->xid[i] == 48) /* XID 48: a double-bit ECC error */
            ++*(unsigned long long *)context;
}

unsigned long long device_ecc_uncorrected(struct nvmlDevice_st *gpu, double t)
{
    unsigned long long count = 0;
    target_events(gpu, EV_XID, -INFINITY, t, count_ecc, &count);
    return count;
}
