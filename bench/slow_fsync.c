/* Emulates a slower disk for bench/broker_bench.py --fsync-delay-us: preloaded into
 * every process of a run (LD_PRELOAD), it sleeps SLOW_FSYNC_US microseconds before each
 * fsync and fdatasync, then calls the real one. This machine's virtual disk syncs in
 * about 0.8 ms; a SATA SSD or a disk behind a RAID controller takes several. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

static void delay(void) {
    const char *text = getenv("SLOW_FSYNC_US");
    long us = text ? atol(text) : 0;
    if (us > 0) {
        struct timespec t = {us / 1000000, (us % 1000000) * 1000};
        nanosleep(&t, 0);
    }
}

int fdatasync(int fd) {
    static int (*real)(int) = 0;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    delay();
    return real(fd);
}

int fsync(int fd) {
    static int (*real)(int) = 0;
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    delay();
    return real(fd);
}
