/* nvmlInit's work: the settings (config file, node name) and the devices file. */
#define _GNU_SOURCE
#include "standin.h"
#include "json.h"

#include <ctype.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_CONFIG "/etc/slurm-gpu-eff/gpueff.toml"
#define MAX_CONFIG_BYTES (1 << 20)
#define MAX_DEVICES_BYTES (4 << 20)

struct model model; /* zeroed (.bss): the device tables are large */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

void model_lock(void)
{
    pthread_mutex_lock(&lock);
}

void model_unlock(void)
{
    pthread_mutex_unlock(&lock);
}

/* --- settings ------------------------------------------------------------------------ */

struct settings {
    char devices[4096];
    char state_dir[4096];
    char time_scale[64];
    char node[256];
};

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

static void lower(char *s)
{
    for (; *s; s++)
        *s = (char)tolower((unsigned char)*s);
}

static void copy_setting(char *to, size_t size, const char *value)
{
    snprintf(to, size, "%s", value);
}

/* A TOML value as far as [sim] needs one: a basic string "..." (with its \" and \\
 * escapes), or a bare number, a # comment after it not part of it. */
static char *toml_value(char *value)
{
    if (value[0] == '"') {
        char *out = value, *in = value + 1;
        while (*in != '\0' && *in != '"') {
            if (*in == '\\' && in[1] != '\0')
                in++;
            *out++ = *in++;
        }
        *out = '\0';
        return value;
    }
    value[strcspn(value, "#")] = '\0';
    return trim(value);
}

/* One line of the TOML file: a [section] header or key = value under [sim] (what the
 * package's config module reads there; other sections are not ours). */
static void settings_line(char *line, char *section, size_t section_size, struct settings *out)
{
    line = trim(line);
    size_t n = strlen(line);
    if (n == 0 || line[0] == '#' || line[0] == ';')
        return;
    if (line[0] == '[' && line[n - 1] == ']') {
        line[n - 1] = '\0';
        copy_setting(section, section_size, trim(line + 1));
        lower(section);
        return;
    }
    char *equals = strchr(line, '=');
    if (equals == NULL || strcmp(section, "sim") != 0)
        return;
    *equals = '\0';
    char *key = trim(line), *value = toml_value(trim(equals + 1));
    lower(key);
    if (strcmp(key, "devices") == 0)
        copy_setting(out->devices, sizeof out->devices, value);
    else if (strcmp(key, "state_dir") == 0)
        copy_setting(out->state_dir, sizeof out->state_dir, value);
    else if (strcmp(key, "time_scale") == 0)
        copy_setting(out->time_scale, sizeof out->time_scale, value);
}

static void node_name(char *out, size_t size)
{
    const char *env = getenv("SLURMD_NODENAME");
    if (env != NULL && env[0] != '\0') {
        snprintf(out, size, "%s", env);
        return;
    }
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0)
        host[0] = '\0';
    host[strcspn(host, ".")] = '\0';
    snprintf(out, size, "%s", host);
}

static bool read_settings(struct settings *out)
{
    memset(out, 0, sizeof *out);
    const char *path = getenv("GPUEFF_CONFIG");
    if (path == NULL || path[0] == '\0')
        path = DEFAULT_CONFIG;
    size_t length;
    char *text = read_text_file(path, MAX_CONFIG_BYTES, &length);
    if (text == NULL)
        return false;
    char section[128] = "";
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save))
        settings_line(line, section, sizeof section, out);
    free(text);
    node_name(out->node, sizeof out->node);
    return out->devices[0] != '\0' && out->state_dir[0] != '\0' && out->node[0] != '\0';
}

static bool parse_time_scale(const char *text, double *out)
{
    *out = 1.0;
    if (text[0] == '\0')
        return true;
    locale_t c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (c == (locale_t)0)
        return false;
    char *end;
    *out = strtod_l(text, &end, c);
    freelocale(c);
    return *end == '\0' && isfinite(*out) && *out > 0;
}

/* --- the devices file ---------------------------------------------------------------- */

static bool opt_number(const struct json *spec, const char *key, double fallback, double *out)
{
    const struct json *value = json_get(spec, key);
    if (value == NULL) {
        *out = fallback;
        return true;
    }
    if (value->type != JSON_NUMBER)
        return false;
    *out = value->number;
    return true;
}

/* A whole number in [low, high], as Python's int() of a number would take it. */
static bool opt_integer(const struct json *spec, const char *key, double fallback, double low,
                        double high, long long *out)
{
    double value;
    if (!opt_number(spec, key, fallback, &value) || value != floor(value) || value < low || value > high)
        return false;
    *out = (long long)value;
    return true;
}

static bool opt_string(const struct json *spec, const char *key, const char *fallback,
                       char *out, size_t size)
{
    const struct json *value = json_get(spec, key);
    const char *text = fallback;
    if (value != NULL && value->type != JSON_STRING)
        return false;
    if (value != NULL)
        text = value->string;
    if (text == NULL || text[0] == '\0' || strlen(text) >= size)
        return false;
    memcpy(out, text, strlen(text) + 1);
    return true;
}

/* Gibibytes to bytes, as Python's int(float(x) * GIB). */
static bool opt_bytes(const struct json *spec, const char *key, double fallback, unsigned long long *out)
{
    double gib;
    if (!opt_number(spec, key, fallback, &gib) || gib < 0 || gib > 1e9)
        return false;
    *out = (unsigned long long)(gib * GIB);
    return true;
}

/* "nvmlDeviceGetTemperatureV", "..._v2", "..._v3" all name the same function here. */
void strip_version(const char *name, char *out, size_t size)
{
    snprintf(out, size, "%s", name);
    size_t n = strlen(out);
    if (n >= 3 && out[n - 3] == '_' && out[n - 2] == 'v' && isdigit((unsigned char)out[n - 1]))
        out[n - 3] = '\0';
    else if (n >= 1 && out[n - 1] == 'V')
        out[n - 1] = '\0';
}

static bool read_unsupported(const struct json *spec, struct nvmlDevice_st *gpu)
{
    const struct json *list = json_get(spec, "unsupported");
    if (list == NULL)
        return true;
    if (list->type != JSON_ARRAY || list->count > 256)
        return false;
    gpu->unsupported = calloc(list->count ? list->count : 1, sizeof *gpu->unsupported);
    if (gpu->unsupported == NULL)
        return false;
    for (size_t i = 0; i < list->count; i++) {
        if (list->items[i].type != JSON_STRING)
            return false;
        char name[128];
        strip_version(list->items[i].string, name, sizeof name);
        gpu->unsupported[gpu->n_unsupported] = strdup(name);
        if (gpu->unsupported[gpu->n_unsupported] == NULL)
            return false;
        gpu->n_unsupported++;
    }
    return true;
}

static bool read_quirks(const struct json *spec, struct nvmlDevice_st *gpu)
{
    static const struct { const char *name; unsigned bit; } known[] = {
        { "samples_reversed", Q_SAMPLES_REVERSED }, { "samples_jitter", Q_SAMPLES_JITTER },
        { "boot_clock", Q_BOOT_CLOCK }, { "empty_success", Q_EMPTY_SUCCESS },
        { "process_util_over_100", Q_PROCESS_UTIL_OVER_100 },
    };
    const struct json *list = json_get(spec, "quirks");
    if (list == NULL)
        return true;
    if (list->type != JSON_ARRAY)
        return false;
    for (size_t i = 0; i < list->count; i++) {
        size_t k = 0, n = sizeof known / sizeof known[0];
        while (k < n && (list->items[i].type != JSON_STRING || strcmp(list->items[i].string, known[k].name) != 0))
            k++;
        if (k == n)
            return false; /* a misspelt quirk must not silently do nothing */
        gpu->quirks |= known[k].bit;
    }
    return true;
}

static char *state_file(const struct settings *s, const char *name)
{
    char *path = NULL;
    const char *slash = s->state_dir[strlen(s->state_dir) - 1] == '/' ? "" : "/";
    if (asprintf(&path, "%s%s%s/%s.json", s->state_dir, slash, s->node, name) < 0)
        return NULL;
    return path;
}

static bool read_mig(const struct json *spec, const struct settings *s, struct nvmlDevice_st *mig)
{
    long long gi_id;
    if (spec->type != JSON_OBJECT || !opt_integer(spec, "gi_id", 1, 0, 4294967295.0, &gi_id)
        || !opt_string(spec, "uuid", NULL, mig->uuid, sizeof mig->uuid)
        || !opt_bytes(spec, "memory_total_gib", 10, &mig->memory_total)
        || !opt_bytes(spec, "reserved_mem_gib", 0, &mig->reserved))
        return false;
    mig->is_mig = true;
    mig->gi_id = (unsigned)gi_id;
    if (mig->reserved > mig->memory_total)
        mig->reserved = mig->memory_total;
    mig->state_path = state_file(s, mig->uuid);
    return mig->state_path != NULL;
}

/* The links: PCIe Gen4 x16 and no NVLink unless the spec says (an H100 SXM: pcie_gen 5,
 * nvlinks 18, nvlink_version 6). */
static bool read_links(const struct json *spec, struct nvmlDevice_st *gpu)
{
    long long gen, width, gpu_gen, idle_gen, links, active, version;
    if (!opt_integer(spec, "pcie_gen", 4, 1, 32, &gen)
        || !opt_integer(spec, "pcie_width", 16, 1, 64, &width)
        || !opt_integer(spec, "pcie_gpu_max_gen", (double)gen, 1, 32, &gpu_gen)
        || !opt_integer(spec, "pcie_idle_gen", 1, 1, (double)gen, &idle_gen)
        || !opt_integer(spec, "nvlinks", 0, 0, NVML_NVLINK_MAX_LINKS, &links)
        || !opt_integer(spec, "nvlinks_active", (double)links, 0, (double)links, &active)
        || !opt_integer(spec, "nvlink_version", NVML_NVLINK_VERSION_4_0, 1, 255, &version))
        return false;
    gpu->pcie_max_gen = (unsigned)gen;
    gpu->pcie_max_width = (unsigned)width;
    gpu->pcie_gpu_max_gen = (unsigned)gpu_gen;
    gpu->pcie_idle_gen = (unsigned)idle_gen;
    gpu->nvlinks = (unsigned)links;
    gpu->nvlinks_active = (unsigned)active;
    gpu->nvlink_version = (unsigned)version;
    return true;
}

static bool read_gpu_numbers(const struct json *spec, struct nvmlDevice_st *gpu)
{
    double idle_mem;
    long long minor, buffer;
    const struct json *gpm = json_get(spec, "gpm");
    if (gpm != NULL && gpm->type != JSON_BOOL)
        return false;
    gpu->gpm = gpm == NULL || gpm->boolean;
    if (!opt_integer(spec, "minor", NAN, 0, 4294967295.0, &minor)
        || !opt_bytes(spec, "memory_total_gib", 80, &gpu->memory_total)
        || !opt_bytes(spec, "reserved_mem_gib", 0, &gpu->reserved)
        || !opt_number(spec, "power_limit_w", 700, &gpu->power_limit_w)
        || !opt_number(spec, "idle_power_w", 60, &gpu->idle[M_POWER_W])
        || !opt_number(spec, "idle_mem_used_gib", 0, &idle_mem)
        || !opt_number(spec, "idle_temp_c", 32, &gpu->idle[M_TEMP_C])
        || !opt_number(spec, "idle_sm_clock_mhz", 345, &gpu->idle[M_SM_CLOCK_MHZ])
        || !opt_number(spec, "sample_period_s", 1.0 / 6, &gpu->sample_period)
        || !opt_integer(spec, "sample_buffer", 120, 1, MAX_SAMPLE_BUFFER, &buffer)
        || !read_links(spec, gpu))
        return false;
    gpu->minor = (unsigned)minor;
    gpu->sample_buffer = (int)buffer;
    gpu->idle[M_MEM_USED_GIB] = idle_mem;
    if (gpu->reserved > gpu->memory_total)
        gpu->reserved = gpu->memory_total;
    /* A sample period must be positive (it divides), and not so small that the driver's
     * buffer of windows would be meaningless. */
    return gpu->sample_period >= 1e-3 && gpu->power_limit_w >= 0 && gpu->power_limit_w < 4e6;
}

static bool read_gpu(const struct json *spec, const struct settings *s, struct model *m, int index)
{
    struct nvmlDevice_st *gpu = &m->gpus[index];
    if (spec->type != JSON_OBJECT || !read_gpu_numbers(spec, gpu)
        || !opt_string(spec, "uuid", NULL, gpu->uuid, sizeof gpu->uuid)
        || !opt_string(spec, "name", "NVIDIA simulated GPU", gpu->name, sizeof gpu->name)
        || !read_unsupported(spec, gpu) || !read_quirks(spec, gpu))
        return false;
    char name[32];
    snprintf(name, sizeof name, "gpu%u", gpu->minor);
    gpu->state_path = state_file(s, name);
    if (gpu->state_path == NULL)
        return false;
    const struct json *migs = json_get(spec, "mig");
    if (migs == NULL)
        return true;
    if (migs->type != JSON_ARRAY || migs->count > MAX_MIGS_PER_GPU)
        return false;
    gpu->first_mig = m->n_migs;
    for (size_t i = 0; i < migs->count; i++) {
        struct nvmlDevice_st *mig = &m->migs[m->n_migs++];
        mig->parent = index;
        if (!read_mig(&migs->items[i], s, mig))
            return false;
        gpu->n_migs++;
    }
    return true;
}

static const struct json *node_specs(const struct json *table, const char *node)
{
    if (table->type == JSON_ARRAY)
        return table; /* a bare list: this node's */
    const struct json *specs = json_get(table, node);
    return specs != NULL && specs->type == JSON_ARRAY ? specs : NULL;
}

/* The devices and the boot time (the file's mtime, ns precision) into `m`. */
static bool read_devices(const struct settings *s, struct model *m)
{
    struct stat info;
    size_t length;
    char *text = read_text_file(s->devices, MAX_DEVICES_BYTES, &length);
    if (text == NULL || stat(s->devices, &info) != 0) {
        free(text);
        return false;
    }
    long long mtime_ns = (long long)info.st_mtim.tv_sec * 1000000000LL + info.st_mtim.tv_nsec;
    m->boot = (double)mtime_ns / 1e9;
    struct json *table = json_parse(text, length);
    free(text);
    const struct json *specs = table ? node_specs(table, s->node) : NULL;
    bool ok = specs != NULL && specs->count <= MAX_DEVICES;
    for (size_t i = 0; ok && i < specs->count; i++) {
        m->n_gpus = (int)i + 1;
        ok = read_gpu(&specs->items[i], s, m, (int)i);
    }
    json_free(table);
    return ok;
}

/* --- the model's lifetime -------------------------------------------------------------- */

void target_forget(struct nvmlDevice_st *target)
{
    workload_free(target->load);
    target->load = NULL;
    target->cached = false;
}

static void device_free(struct nvmlDevice_st *d)
{
    target_forget(d);
    free(d->state_path);
    for (int i = 0; i < d->n_unsupported; i++)
        free(d->unsupported[i]);
    free(d->unsupported);
    memset(d, 0, sizeof *d);
}

static void devices_free(struct model *m)
{
    for (int i = 0; i < m->n_gpus; i++)
        device_free(&m->gpus[i]);
    for (int i = 0; i < m->n_migs; i++)
        device_free(&m->migs[i]);
    m->n_gpus = m->n_migs = 0;
}

void model_clear(void)
{
    devices_free(&model);
}

/* Reads the settings and devices afresh (at every nvmlInit, so a changed config takes
 * effect). On failure the model is left as it was: a library already initialised keeps
 * serving its devices. Runs under the lock. */
nvmlReturn_t model_load(void)
{
    struct settings s;
    struct model *fresh = calloc(1, sizeof *fresh);
    if (fresh == NULL)
        return NVML_ERROR_MEMORY;
    bool ok = read_settings(&s) && parse_time_scale(s.time_scale, &fresh->time_scale)
              && read_devices(&s, fresh);
    if (!ok) {
        devices_free(fresh);
        free(fresh);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    devices_free(&model);
    /* The handles callers hold point into model.gpus/model.migs: copy into them. */
    memcpy(model.gpus, fresh->gpus, sizeof model.gpus);
    memcpy(model.migs, fresh->migs, sizeof model.migs);
    model.n_gpus = fresh->n_gpus;
    model.n_migs = fresh->n_migs;
    model.boot = fresh->boot;
    model.time_scale = fresh->time_scale;
    free(fresh); /* its heap parts now belong to model */
    return NVML_SUCCESS;
}
