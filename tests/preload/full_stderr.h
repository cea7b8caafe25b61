/*
 * full_stderr.h — fd 2 as a pipe nobody reads, filled to the brim: the next write to stderr
 * waits for ever (the program ends with _exit or exit, never waiting for the writer).
 */
#ifndef FULL_STDERR_H
#define FULL_STDERR_H

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

/* 0, or -1 when the pipe cannot be made. */
static int fill_stderr(void) {
    int fds[2];
    if (pipe(fds) != 0 || dup2(fds[1], 2) < 0) return -1;
    int flags = fcntl(2, F_GETFL);
    if (fcntl(2, F_SETFL, flags | O_NONBLOCK) != 0) return -1;
    char block[4096];
    memset(block, 'x', sizeof block);
    while (write(2, block, sizeof block) > 0) {
    }
    while (write(2, block, 1) > 0) {
    }
    return fcntl(2, F_SETFL, flags);
}

#endif
