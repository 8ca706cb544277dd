/* The stand-in libnvidia-ml.so.1: internal declarations shared by its source files.
 *
 * The model: a node's simulated GPUs (the devices file) and what each one does (the
 * workload's state file per GPU or MIG instance). Readings are computed from the state
 * at the time of the call, the way the driver would have measured them. Everything
 * here runs under the one lock (model_lock), taken by each exported function. */
#ifndef STANDIN_H
#define STANDIN_H

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Only the NVML API (and the test hook) leaves the library; see build.sh. */
#define EXPORT __attribute__((visibility("default")))

#define GIB 1073741824.0
#define MAX_DEVICES 64
#define MAX_MIGS_PER_GPU 7 /* what NVML reports as the maximum MIG device count */
#define MAX_PHASES 10000
#define MAX_XIDS_PER_PHASE 32
#define MAX_PROCESSES 64    /* processes a phase may list on one GPU */
#define MAX_SAMPLE_BUFFER 100000
#define NAME_LIMIT 64       /* longest device name we accept (leaves room for " MIG NNg") */
#define UUID_LIMIT 80

/* The profile's metrics, in the order of their names (metric_names). */
enum metric {
    M_UTIL, M_MEM_UTIL, M_SM_ACTIVE, M_SM_OCCUPANCY, M_TENSOR_ACTIVE, M_DRAM_ACTIVE,
    M_FP16_ACTIVE, M_FP32_ACTIVE, M_FP64_ACTIVE, M_MEM_USED_GIB, M_POWER_W, M_TEMP_C,
    M_SM_CLOCK_MHZ, M_PCIE_RX_MBPS, M_PCIE_TX_MBPS, M_NVLINK_RX_MBPS, M_NVLINK_TX_MBPS,
    M_SHARED_UTIL, M_COUNT
};

/* Per-device quirks of real drivers, switched on in the devices file. */
enum quirk {
    Q_SAMPLES_REVERSED = 1 << 0,
    Q_SAMPLES_JITTER = 1 << 1,
    Q_BOOT_CLOCK = 1 << 2,
    Q_EMPTY_SUCCESS = 1 << 3,
    Q_PROCESS_UTIL_OVER_100 = 1 << 4,
};

/* A constant (period <= 0: low) or a square wave over time since its phase began. */
struct level {
    double low, high, period, duty;
};

/* Phase-start events (xid, lost, energy_reset) and phase-long states (throttle,
 * processes, nvml_error). */
enum event_kind { EV_XID, EV_LOST, EV_ENERGY_RESET };

struct phase {
    double start, seconds;           /* since the workload started */
    unsigned has_level;              /* bit per metric the phase names */
    struct level levels[M_COUNT];
    unsigned long long throttle;     /* clock-event reason bits */
    int n_xid;
    unsigned xid[MAX_XIDS_PER_PHASE];
    int processes;                   /* -1: the phase does not say */
    int lost;                        /* -1: not named, else 0/1 */
    bool energy_reset;
    bool nvml_error;                 /* every query on the device fails while it runs */
};

struct workload {
    double started, ended;           /* ended: +inf while it runs */
    double prior_extra_j;
    bool has_pid, has_pid_start;
    long long pid;
    long long pid_start;             /* the process's start, clock ticks since boot */
    int n_phases;
    struct phase *phases;
};

/* A GPU or a MIG instance: both are what an nvmlDevice_t points to. */
struct nvmlDevice_st {
    bool is_mig;
    int parent;                      /* MIG: index of its GPU in model.gpus */
    int first_mig, n_migs;           /* GPU: its MIG instances in model.migs */
    char uuid[UUID_LIMIT + 1];
    char name[NAME_LIMIT + 1];
    unsigned minor, gi_id;
    unsigned long long memory_total, reserved;
    double power_limit_w, sample_period, idle[M_COUNT];
    int sample_buffer;
    /* The PCIe link: the most device and slot allow, the device's own most, and the
     * generation an idle link drops to (a busy one runs at the most). */
    unsigned pcie_max_gen, pcie_max_width, pcie_gpu_max_gen, pcie_idle_gen;
    /* NVLink: links the GPU has (0: no NVLink, NOT_SUPPORTED), how many are active, and
     * the version as NVML's nvmlNvlinkVersion_t numbers it (6: NVLink 4.0). */
    unsigned nvlinks, nvlinks_active, nvlink_version;
    bool gpm;
    unsigned quirks;
    int n_unsupported;
    char **unsupported;              /* function names, suffixes stripped */
    /* The workload's state file, re-read only when it changed. */
    char *state_path;
    unsigned long long checked_call; /* model.calls when last stat'ed: once per call */
    bool cached;
    dev_t cache_dev;
    ino_t cache_ino;
    long long cache_mtime_ns, cache_ctime_ns;
    off_t cache_size;
    struct workload *load;           /* NULL: no (valid) workload */
};

struct model {
    int refcount;                    /* nvmlInit calls not yet shut down */
    int n_gpus, n_migs;
    struct nvmlDevice_st gpus[MAX_DEVICES];
    struct nvmlDevice_st migs[MAX_DEVICES * MAX_MIGS_PER_GPU];
    double boot;                     /* the devices file's mtime: "driver load" */
    double time_scale;
    double fixed_clock;              /* > 0: the test hook's "now" */
    unsigned long long calls;        /* API calls so far (see checked_call) */
};

extern struct model model;

/* The body of every exported NVML function: the work under the model's lock. */
#define LOCKED(call)                        \
    do {                                    \
        model_lock();                       \
        model.calls++;                      \
        nvmlReturn_t result_ = (call);      \
        model_unlock();                     \
        return result_;                     \
    } while (0)

/* gpuInstanceId/computeInstanceId of what is not a MIG instance's. */
#define NO_INSTANCE 0xFFFFFFFFu

extern const char *const metric_names[M_COUNT];

void model_lock(void);
void model_unlock(void);

/* setup.c: nvmlInit's work (settings, devices file) and shutdown's. */
nvmlReturn_t model_load(void);
void model_clear(void);
void target_forget(struct nvmlDevice_st *target);
void strip_version(const char *name, char *out, size_t size);

/* workload.c: the state file and what it says. */
double sim_now(void);
const struct workload *target_workload(struct nvmlDevice_st *target);
double target_mean(struct nvmlDevice_st *target, enum metric m, double t0, double t1);
const struct phase *target_phase_at(struct nvmlDevice_st *target, double t);
bool target_running(struct nvmlDevice_st *target, double t);
bool device_lost(struct nvmlDevice_st *gpu, double t);
bool target_failing(struct nvmlDevice_st *target, double t);
double device_energy_j(struct nvmlDevice_st *gpu, double t);
double device_busy(struct nvmlDevice_st *gpu, double t0, double t1);
unsigned long long device_ecc_uncorrected(struct nvmlDevice_st *gpu, double t);
/* Calls `each(phase, absolute start, context)` for every phase setting `kind` that starts
 * in (t0, t1] while the workload runs. */
void target_events(struct nvmlDevice_st *target, enum event_kind kind, double t0, double t1,
                   void (*each)(const struct phase *, double, void *), void *context);
struct workload *workload_parse(const char *text, size_t length);
void workload_free(struct workload *load);

/* api.c: handle checks shared with gpm_events.c. */
enum check_flags {
    WHOLE_GPU = 1 << 0,   /* a MIG handle is NOT_SUPPORTED */
    CHECK_LOST = 1 << 1,  /* a GPU that fell off the bus answers GPU_IS_LOST */
    IDENTITY = 1 << 2,    /* answers in an nvml_error phase too (binding needs it) */
};
struct nvmlDevice_st *lookup_handle(nvmlDevice_t handle);
nvmlReturn_t get_target(nvmlDevice_t handle, const char *function, int flags,
                        struct nvmlDevice_st **out);
struct nvmlDevice_st *parent_of(struct nvmlDevice_st *target);

/* gpm_events.c: the GPM samples and event sets handed out, all freed at the last
 * nvmlShutdown (they belong to that initialisation). */
void pools_clear(void);

#endif
