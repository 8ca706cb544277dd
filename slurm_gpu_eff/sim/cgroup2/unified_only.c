/* Test-environment code, like the stand-in libnvidia-ml: no site ever runs it.
 *
 * Why it exists: the development cluster runs Slurm's cgroup/v2 plugin on machines whose
 * host mounts cgroup v1 (CI's and ours). scripts/cluster.sh gives each slurmd a private
 * mount and cgroup namespace with a cgroup2 mount at /sys/fs/cgroup, which is all v2 needs
 * to work; but the plugin also reads /proc/1/cgroup and /proc/self/cgroup and refuses to
 * start ("Hybrid mode is not supported") unless every line starts with "0", and the kernel
 * lists every mounted v1 hierarchy there, whatever the namespace. And it builds its
 * system.slice beside init's cgroup, which from inside the namespace is above its root.
 * slurmstepd checks the same, and slurmd starts it with an environment of its own, so
 * cluster.sh preloads this into every process of the release's root (/etc/ld.so.preload
 * there, only while a cgroup v2 cluster runs): each reader of /proc/PID/cgroup sees only
 * its "0::" line, as on a host that mounts cgroup v2 alone. Jobs, prologs, epilogs and our
 * sampler see what they would see on such a site.
 *
 * Built by scripts/cluster.sh: gcc -shared -fPIC -O2 -o libunified_only.so unified_only.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Whether PATH is /proc/self/cgroup, /proc/thread-self/cgroup, /proc/N/cgroup or
 * /proc/N/task/M/cgroup. */
static int proc_cgroup(const char *path)
{
    const char *rest;
    size_t len;

    if (path == NULL || strncmp(path, "/proc/", 6) != 0)
        return 0;
    rest = path + 6;
    len = strlen(rest);
    return len > 7 && strcmp(rest + len - 7, "/cgroup") == 0 && strchr(rest, '.') == NULL;
}

static int reading(int flags) { return (flags & O_ACCMODE) == O_RDONLY; }

/* A memory file holding only the "0::" lines of the real file, or -1 (errno set). */
static int unified_only(int real_fd)
{
    char buf[65536], out[65536];
    size_t have = 0, kept = 0;
    ssize_t got;
    char *line, *end;
    int fd;

    while (have < sizeof(buf) - 1 && (got = read(real_fd, buf + have, sizeof(buf) - 1 - have)) > 0)
        have += (size_t)got;
    close(real_fd);
    buf[have] = '\0';
    for (line = buf; *line; line = end) {
        end = strchr(line, '\n');
        end = end ? end + 1 : line + strlen(line);
        if (strncmp(line, "0::/..", 6) == 0) {
            /* A process outside slurmd's cgroup namespace (/proc/1/cgroup: the host's
             * init) shows as above its root; slurmd builds its system.slice beside
             * init's cgroup, so show it at the namespace's root, where slurmd can. */
            memcpy(out + kept, "0::/\n", 5);
            kept += 5;
        } else if (strncmp(line, "0::", 3) == 0) {
            memcpy(out + kept, line, (size_t)(end - line));
            kept += (size_t)(end - line);
        }
    }
    fd = memfd_create("unified-only-cgroup", MFD_CLOEXEC);
    if (fd < 0)
        return -1;
    if (write(fd, out, kept) != (ssize_t)kept || lseek(fd, 0, SEEK_SET) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef FILE *(*fopen_fn)(const char *, const char *);

static int wrap_open(const char *name, const char *path, int flags, mode_t mode)
{
    open_fn real = (open_fn)dlsym(RTLD_NEXT, name);
    int fd = real(path, flags, mode);

    if (fd < 0 || !reading(flags) || !proc_cgroup(path))
        return fd;
    return unified_only(fd);
}

static mode_t mode_of(int flags, va_list args)
{
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(args, int) : 0;
}

/* open() and open64() alike (a mode argument comes only with O_CREAT or O_TMPFILE) */
#define WRAP_OPEN(fn)                                  \
    int fn(const char *path, int flags, ...)           \
    {                                                  \
        va_list args;                                  \
        mode_t mode;                                   \
                                                       \
        va_start(args, flags);                         \
        mode = mode_of(flags, args);                   \
        va_end(args);                                  \
        return wrap_open(#fn, path, flags, mode);      \
    }

WRAP_OPEN(open)
WRAP_OPEN(open64)

/* What _FORTIFY_SOURCE builds (Debian's) call for open(path, flags) */
int __open_2(const char *path, int flags) { return wrap_open("open", path, flags, 0); }
int __open64_2(const char *path, int flags) { return wrap_open("open64", path, flags, 0); }

int openat(int dirfd, const char *path, int flags, ...)
{
    openat_fn real = (openat_fn)dlsym(RTLD_NEXT, "openat");
    va_list args;
    mode_t mode;
    int fd;

    va_start(args, flags);
    mode = mode_of(flags, args);
    va_end(args);
    fd = real(dirfd, path, flags, mode);
    if (fd < 0 || !reading(flags) || !proc_cgroup(path))
        return fd;
    return unified_only(fd);
}

static FILE *wrap_fopen(const char *name, const char *path, const char *how)
{
    fopen_fn real = (fopen_fn)dlsym(RTLD_NEXT, name);
    int fd;

    if (!proc_cgroup(path) || how[0] != 'r' || strchr(how, '+') != NULL)
        return real(path, how);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    return fd < 0 ? NULL : fdopen(fd, "r");
}

FILE *fopen(const char *path, const char *how) { return wrap_fopen("fopen", path, how); }
FILE *fopen64(const char *path, const char *how) { return wrap_fopen("fopen64", path, how); }
