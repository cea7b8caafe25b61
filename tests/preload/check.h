/* Assertions shared by the C test programs run under LD_PRELOAD: a failed check prints where
 * and what, counts itself in `failures` and leaves the current scenario (a void function). */
#ifndef CACHEALLOC_TEST_CHECK_H
#define CACHEALLOC_TEST_CHECK_H

#include <stdio.h>
#include <string.h>

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

/* A test program's scenario: its name on the command line, and the function that runs it. */
struct scenario {
    const char *name;
    void (*run)(void);
};

/* Run the scenario of `list` named `name`: "ok NAME" on stdout when every check held. Returns
 * 0, 1 when a check failed, 2 for a name not in the list (said on stderr). */
static inline int run_scenario_named(const struct scenario *list, size_t count,
                                     const char *name) {
    for (size_t i = 0; i < count; i++) {
        if (strcmp(list[i].name, name) != 0)
            continue;
        failures = 0;
        list[i].run();
        if (failures == 0)
            printf("ok %s\n", name);
        fflush(stdout);
        return failures != 0;
    }
    fprintf(stderr, "unknown scenario %s\n", name);
    return 2;
}

/* The `main` of a program whose first argument names one of `list`'s scenarios. */
#define SCENARIO_MAIN(list)                                                           \
    int main(int argc, char **argv) {                                                 \
        if (argc < 2) {                                                               \
            fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);                        \
            return 2;                                                                 \
        }                                                                             \
        return run_scenario_named(list, sizeof list / sizeof list[0], argv[1]);       \
    }

#endif
