/* LD_PRELOAD shim for tests/contract/store/test_power_loss.py: a log of every write, truncate, sync
 * and unlink that a process makes to files under $POWERLOSS_DIR (except SQLite's -shm, which is a
 * shared-memory index rebuilt after a crash), appended in call order to $POWERLOSS_LOG.
 *
 * The calls themselves go through unchanged. The test replays the log keeping, per file, only what
 * preceded that file's last fsync/fdatasync: the disk as a power loss leaves it when the page cache
 * held everything that was not synced.
 *
 * Record: op (1 byte: W write, T truncate, S sync, U unlink), path length (u32), a (i64: offset for
 * W, length for T), data length (i64), path, data. Native byte order (the test runs on the same host).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;

static int tracked_path(const char *path) {
    const char *dir = getenv("POWERLOSS_DIR");
    size_t n = strlen(path);
    if (dir == NULL || strncmp(path, dir, strlen(dir)) != 0) return 0;
    return !(n >= 4 && strcmp(path + n - 4, "-shm") == 0);
}

static int tracked_fd(int fd, char *path, size_t cap) {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, cap - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    return tracked_path(path);
}

static void put(const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        long w = syscall(SYS_write, log_fd, p, n);
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void record(char op, const char *path, int64_t a, const void *data, int64_t len) {
    pthread_mutex_lock(&mu);
    if (log_fd < 0) {
        const char *lp = getenv("POWERLOSS_LOG");
        if (lp != NULL) log_fd = (int)syscall(SYS_openat, AT_FDCWD, lp, O_WRONLY | O_CREAT | O_APPEND, 0644);
    }
    if (log_fd >= 0) {
        uint32_t pl = (uint32_t)strlen(path);
        int64_t dl = data != NULL ? len : 0;
        put(&op, 1);
        put(&pl, 4);
        put(&a, 8);
        put(&dl, 8);
        put(path, pl);
        if (dl > 0) put(data, (size_t)dl);
    }
    pthread_mutex_unlock(&mu);
}

#define REAL(name) \
    static __typeof__(name) *real_##name; \
    if (real_##name == NULL) real_##name = (__typeof__(name) *)dlsym(RTLD_NEXT, #name)

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite64);
    ssize_t r = real_pwrite64(fd, buf, n, off);
    char path[4096];
    if (r > 0 && tracked_fd(fd, path, sizeof path)) record('W', path, off, buf, r);
    return r;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off) {
    REAL(pwrite);
    ssize_t r = real_pwrite(fd, buf, n, off);
    char path[4096];
    if (r > 0 && tracked_fd(fd, path, sizeof path)) record('W', path, off, buf, r);
    return r;
}

ssize_t write(int fd, const void *buf, size_t n) {
    REAL(write);
    char path[4096];
    int t = tracked_fd(fd, path, sizeof path);
    off_t off = t ? lseek(fd, 0, SEEK_CUR) : 0;
    ssize_t r = real_write(fd, buf, n);
    if (r > 0 && t) record('W', path, off, buf, r);
    return r;
}

static int synced(int fd, int r) {
    char path[4096];
    if (r == 0 && tracked_fd(fd, path, sizeof path)) record('S', path, 0, NULL, 0);
    return r;
}

int fsync(int fd) {
    REAL(fsync);
    return synced(fd, real_fsync(fd));
}

int fdatasync(int fd) {
    REAL(fdatasync);
    return synced(fd, real_fdatasync(fd));
}

static int truncated(int fd, off_t len, int r) {
    char path[4096];
    if (r == 0 && tracked_fd(fd, path, sizeof path)) record('T', path, len, NULL, 0);
    return r;
}

int ftruncate(int fd, off_t len) {
    REAL(ftruncate);
    return truncated(fd, len, real_ftruncate(fd, len));
}

int ftruncate64(int fd, off_t len) {
    REAL(ftruncate64);
    return truncated(fd, len, real_ftruncate64(fd, len));
}

int unlink(const char *p) {
    REAL(unlink);
    int r = real_unlink(p);
    if (r == 0 && tracked_path(p)) record('U', p, 0, NULL, 0);
    return r;
}
