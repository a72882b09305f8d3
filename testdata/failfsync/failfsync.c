// failfsync is an LD_PRELOAD shim for petstore's tests. Once the file
// named by FAIL_FSYNC_WHEN exists, fsync and fdatasync of a file whose
// path ends in FAIL_FSYNC_SUFFIX fail with EIO, as on a failing disk.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failing(int fd) {
	const char *when = getenv("FAIL_FSYNC_WHEN"), *suffix = getenv("FAIL_FSYNC_SUFFIX");
	char link[64], path[4096];
	if (when == NULL || suffix == NULL || access(when, F_OK) != 0)
		return 0;
	snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, path, sizeof path - 1);
	if (n < 0)
		return 0;
	path[n] = '\0';
	size_t len = strlen(suffix);
	return (size_t)n >= len && strcmp(path + n - len, suffix) == 0;
}

int fsync(int fd) {
	if (failing(fd)) {
		errno = EIO;
		return -1;
	}
	return ((int (*)(int))dlsym(RTLD_NEXT, "fsync"))(fd);
}

int fdatasync(int fd) {
	if (failing(fd)) {
		errno = EIO;
		return -1;
	}
	return ((int (*)(int))dlsym(RTLD_NEXT, "fdatasync"))(fd);
}
