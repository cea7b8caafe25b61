/* Assertions shared by the C test programs run under LD_PRELOAD: a failed check prints where
 * and what, counts itself in `failures` and leaves the current scenario (a void function). */
#ifndef CACHEALLOC_TEST_CHECK_H
#define CACHEALLOC_TEST_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
            failures++;                                                               \
            return;                                                                   \
        }                                                                             \
    } while (0)

#define CHECK_CODE(expr, want)                                                        \
    do {                                                                              \
        int got_ = (int)(expr);                                                       \
        if (got_ != (int)(want)) {                                                    \
            fprintf(stderr, "FAIL %s:%d: %s returned %d, want %d\n", __FILE__, __LINE__, \
                    #expr, got_, (int)(want));                                        \
            failures++;                                                               \
            return;                                                                   \
        }                                                                             \
    } while (0)

#endif
