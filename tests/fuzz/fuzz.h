/*
 * fuzz.h — what the libFuzzer targets in tests/fuzz share (docs/fuzzing.md).
 *
 * A target is one file, tests/fuzz/fuzz_<name>.c, with LLVMFuzzerTestOneInput
 * and a `fuzz_seeds(dir)` that writes its seed inputs (valid messages of
 * every kind, made by the library's own encoders) when the target runs with
 * COLLIE_FUZZ_SEEDS=dir (`make fuzz-seeds`): FUZZ_SEEDS_MAIN wires that up.
 * Invariants are checked with FUZZ_CHECK, which names the broken contract
 * and traps: libFuzzer keeps the input as a crash.
 */
#ifndef CL_FUZZ_H
#define CL_FUZZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz invariant broken at %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            __builtin_trap();                                                                      \
        }                                                                                          \
    } while (0)

/* a message a parser wrote for a rejected input: set, NUL-terminated, within its buffer */
#define FUZZ_CHECK_WHY(why)                                                                        \
    FUZZ_CHECK((why)[0] != '\0' && memchr((why), '\0', sizeof(why)) != NULL,                       \
               "a rejection without a message")

/* [p, p + len) lies within [base, base + size) */
static inline bool fuzz_within(const void *p, size_t len, const void *base, size_t size) {
    const uint8_t *q = p, *b = base;
    if (len == 0) return true;
    return q && q >= b && len <= size && (size_t)(q - b) <= size - len;
}

/* A cursor over the fuzzer's input: reads past the end give zeros. */
typedef struct fuzz_in {
    const uint8_t *p;
    size_t len, pos;
} fuzz_in;

static inline uint8_t fuzz_u8(fuzz_in *in) { return in->pos < in->len ? in->p[in->pos++] : 0; }
static inline size_t fuzz_left(const fuzz_in *in) { return in->len - in->pos; }
/* little-endian, from the next 2 / 8 bytes */
static inline uint16_t fuzz_u16(fuzz_in *in) {
    uint16_t lo = fuzz_u8(in);
    return (uint16_t)(lo | fuzz_u8(in) << 8);
}
static inline uint64_t fuzz_u64(fuzz_in *in) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)fuzz_u8(in) << (8 * i);
    return v;
}

/* A seed input being built, byte by byte, for the readers above (the
 * targets that take a program of steps: fuzz_shm_*.c). */
typedef struct fuzz_seed {
    uint8_t b[256];
    size_t n;
} fuzz_seed;

static inline void fuzz_put8(fuzz_seed *s, unsigned v) {
    if (s->n >= sizeof s->b) {
        fprintf(stderr, "fuzz seeds: a seed longer than %zu bytes\n", sizeof s->b);
        exit(1);
    }
    s->b[s->n++] = (uint8_t)v;
}
static inline void fuzz_put16(fuzz_seed *s, unsigned v) {
    fuzz_put8(s, v & 0xff);
    fuzz_put8(s, (v >> 8) & 0xff);
}

/* Write one seed input into dir (as name); exits on failure. */
static inline void fuzz_seed_write(const char *dir, const char *name, const void *buf, size_t len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(buf, 1, len, f) != len) || fclose(f) != 0) {
        fprintf(stderr, "fuzz seeds: cannot write %s\n", path);
        exit(1);
    }
}

/* The target's seeds: COLLIE_FUZZ_SEEDS=dir writes them there and exits. */
#define FUZZ_SEEDS_MAIN(seeds_fn)                                                                  \
    int LLVMFuzzerInitialize(int *argc, char ***argv);                                             \
    int LLVMFuzzerInitialize(int *argc, char ***argv) {                                            \
        (void)argc;                                                                                \
        (void)argv;                                                                                \
        const char *dir = getenv("COLLIE_FUZZ_SEEDS");                                             \
        if (dir && *dir) {                                                                         \
            seeds_fn(dir);                                                                         \
            exit(0);                                                                               \
        }                                                                                          \
        return 0;                                                                                  \
    }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
