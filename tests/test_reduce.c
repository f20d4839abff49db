/*
 * test_reduce.c — reduction kernels and fp16/bf16 conversions against a
 * plain reference: every dtype x op (odd counts, byte-offset buffers, guard
 * bytes), wrap-around, signedness, AVG truncation, every 16-bit pattern,
 * ties to even, IEEE special values, aliasing, invalid arguments.
 *
 * The references are written differently from the kernels on purpose:
 * integers in a wider type (__int128 for int64), fp16/bf16 decoded to
 * double, operated on exactly and rounded by integer arithmetic.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collie.h"
#include "base/dtype.h"
#include "transports/reduce.h"
#include "runner.h"

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint64_t f64_bits(double f) {
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static double bits_f64(uint64_t u) {
    double f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double pow2(int k) { return bits_f64((uint64_t)(k + 1023) << 52); } /* normal range */

/* A 16-bit float format: p significant bits (with the hidden one), e
 * exponent bits. */
typedef struct fmt16 {
    int p, ebits;
} fmt16;

static const fmt16 FP16 = {11, 5}, BF16 = {8, 8};

static bool f16_isnan(fmt16 f, uint16_t h) {
    unsigned expall = (1u << f.ebits) - 1;
    return ((h >> (f.p - 1)) & expall) == expall && (h & ((1u << (f.p - 1)) - 1)) != 0;
}

static double ref_decode(fmt16 f, uint16_t h) {
    int bias = (1 << (f.ebits - 1)) - 1;
    unsigned expall = (1u << f.ebits) - 1;
    unsigned e = (h >> (f.p - 1)) & expall;
    uint32_t m = h & ((1u << (f.p - 1)) - 1);
    double s = (h & 0x8000u) ? -1.0 : 1.0;
    if (e == expall) return m ? NAN : s * INFINITY;
    if (e == 0) return s * m * pow2(1 - bias - (f.p - 1));
    return s * (m + (1u << (f.p - 1))) * pow2((int)e - bias - (f.p - 1));
}

/* ref_encode: round v to the format, to nearest, ties to even. */
static uint16_t ref_encode(fmt16 f, double v) {
    int bias = (1 << (f.ebits - 1)) - 1, emin = 1 - bias, emax = bias;
    uint16_t expall = (uint16_t)(((1u << f.ebits) - 1) << (f.p - 1));
    uint16_t sign = signbit(v) ? 0x8000u : 0;
    if (isnan(v)) return sign | expall | (uint16_t)(1u << (f.p - 2));
    double a = signbit(v) ? -v : v;
    if (isinf(a)) return sign | expall;
    if (a == 0) return sign;
    uint64_t b = f64_bits(a), m = b & ((1ull << 52) - 1);
    int ex = (int)(b >> 52), e;
    if (ex == 0) {
        e = -1074;
    } else {
        m |= 1ull << 52;
        e = ex - 1075;
    }
    int lead = e + 63 - __builtin_clzll(m);                         /* exponent of the top bit */
    int q = (lead > emin ? lead : emin) - (f.p - 1), shift = q - e; /* q: exponent of the lsb */
    uint64_t n;
    if (shift <= 0) {
        n = m << -shift;
    } else if (shift >= 60) {
        n = 0; /* m < 2^53 is below half a unit */
    } else {
        n = m >> shift;
        uint64_t rem = m & ((1ull << shift) - 1), half = 1ull << (shift - 1);
        if (rem > half || (rem == half && (n & 1))) n++;
    }
    if (n == 1ull << f.p) {
        n >>= 1;
        q++;
    }
    if (n < 1ull << (f.p - 1)) return sign | (uint16_t)n; /* subnormal or zero */
    int top = q + f.p - 1;
    if (top > emax) return sign | expall;
    return sign | (uint16_t)((unsigned)(top + bias) << (f.p - 1)) |
           (uint16_t)(n - (1ull << (f.p - 1)));
}

/* ---- one element of any dtype ------------------------------------------------ */

typedef union elem {
    int8_t i8;
    uint8_t u8;
    int32_t i32;
    int64_t i64;
    uint16_t h;
    float f32;
    double f64;
} elem;

static elem get(collie_dtype dt, const void *buf, size_t i) {
    elem e;
    memset(&e, 0, sizeof e);
    size_t sz = collie_dtype_size(dt);
    memcpy(&e, (const char *)buf + i * sz, sz);
    return e;
}

static void put(collie_dtype dt, void *buf, size_t i, elem e) {
    size_t sz = collie_dtype_size(dt);
    memcpy((char *)buf + i * sz, &e, sz);
}

static double ref_minmax(double x, double y, bool is_min) {
    if (isnan(x) || isnan(y)) return NAN;
    if (x == y) return (signbit(x) == is_min) ? x : y; /* -0 < +0 */
    return (x < y) == is_min ? x : y;
}

static double ref_fp(double x, double y, collie_redop op) {
    switch (op) {
    case COLLIE_SUM:
    case COLLIE_AVG: return x + y;
    case COLLIE_PROD: return x * y;
    case COLLIE_MIN: return ref_minmax(x, y, true);
    case COLLIE_MAX: return ref_minmax(x, y, false);
    default: return NAN;
    }
}

/* ref_int: x op y on mathematical integers; the caller wraps. */
static __int128 ref_int(__int128 x, __int128 y, collie_redop op) {
    switch (op) {
    case COLLIE_SUM:
    case COLLIE_AVG: return x + y;
    case COLLIE_PROD: return x * y;
    case COLLIE_MIN: return x < y ? x : y;
    case COLLIE_MAX: return x > y ? x : y;
    default: return 0;
    }
}

static elem ref_op(collie_dtype dt, collie_redop op, elem x, elem y) {
    elem r;
    memset(&r, 0, sizeof r);
    switch (dt) {
    case COLLIE_INT8: r.u8 = (uint8_t)ref_int(x.i8, y.i8, op); break;
    case COLLIE_UINT8: r.u8 = (uint8_t)ref_int(x.u8, y.u8, op); break;
    case COLLIE_INT32: r.i32 = (int32_t)(uint32_t)ref_int(x.i32, y.i32, op); break;
    case COLLIE_INT64: r.i64 = (int64_t)(uint64_t)ref_int(x.i64, y.i64, op); break;
    case COLLIE_FP16:
        r.h = ref_encode(FP16, ref_fp(ref_decode(FP16, x.h), ref_decode(FP16, y.h), op));
        break;
    case COLLIE_BF16:
        r.h = ref_encode(BF16, ref_fp(ref_decode(BF16, x.h), ref_decode(BF16, y.h), op));
        break;
    case COLLIE_FP32: /* via double: rounding twice is harmless as 53 >= 2 * 24 + 2 */
        r.f32 = (float)ref_fp(x.f32, y.f32, op);
        break;
    case COLLIE_FP64:
        if (op == COLLIE_SUM || op == COLLIE_AVG)
            r.f64 = x.f64 + y.f64;
        else if (op == COLLIE_PROD)
            r.f64 = x.f64 * y.f64;
        else
            r.f64 = ref_minmax(x.f64, y.f64, op == COLLIE_MIN);
        break;
    default: break;
    }
    return r;
}

/* ref_avg: x / n, integers truncating toward zero. */
static elem ref_avg(collie_dtype dt, elem x, int n) {
    elem r = x;
    __int128 v = 0;
    switch (dt) {
    case COLLIE_INT8: v = x.i8; break;
    case COLLIE_UINT8: v = x.u8; break;
    case COLLIE_INT32: v = x.i32; break;
    case COLLIE_INT64: v = x.i64; break;
    case COLLIE_FP16: r.h = ref_encode(FP16, ref_decode(FP16, x.h) / n); return r;
    case COLLIE_BF16: r.h = ref_encode(BF16, ref_decode(BF16, x.h) / n); return r;
    case COLLIE_FP32: r.f32 = x.f32 / (float)n; return r;
    case COLLIE_FP64: r.f64 = x.f64 / n; return r;
    default: return r;
    }
    __int128 q = (v < 0 ? -v : v) / n; /* magnitude first: truncation toward zero */
    if (v < 0) q = -q;
    switch (dt) {
    case COLLIE_INT8: r.i8 = (int8_t)q; break;
    case COLLIE_UINT8: r.u8 = (uint8_t)q; break;
    case COLLIE_INT32: r.i32 = (int32_t)q; break;
    default: r.i64 = (int64_t)q; break;
    }
    return r;
}

static bool elem_equal(collie_dtype dt, elem a, elem b) {
    switch (dt) {
    case COLLIE_FP16: return a.h == b.h || (f16_isnan(FP16, a.h) && f16_isnan(FP16, b.h));
    case COLLIE_BF16: return a.h == b.h || (f16_isnan(BF16, a.h) && f16_isnan(BF16, b.h));
    case COLLIE_FP32: return f32_bits(a.f32) == f32_bits(b.f32) || (isnan(a.f32) && isnan(b.f32));
    case COLLIE_FP64: return f64_bits(a.f64) == f64_bits(b.f64) || (isnan(a.f64) && isnan(b.f64));
    default: return memcmp(&a, &b, collie_dtype_size(dt)) == 0;
    }
}

static void elem_format(collie_dtype dt, elem e, char *buf, size_t len) {
    switch (dt) {
    case COLLIE_INT8: snprintf(buf, len, "%d", e.i8); break;
    case COLLIE_UINT8: snprintf(buf, len, "%u", e.u8); break;
    case COLLIE_INT32: snprintf(buf, len, "%d", e.i32); break;
    case COLLIE_INT64: snprintf(buf, len, "%lld", (long long)e.i64); break;
    case COLLIE_FP16: snprintf(buf, len, "0x%04x (%g)", e.h, ref_decode(FP16, e.h)); break;
    case COLLIE_BF16: snprintf(buf, len, "0x%04x (%g)", e.h, ref_decode(BF16, e.h)); break;
    case COLLIE_FP32: snprintf(buf, len, "0x%08x (%g)", f32_bits(e.f32), e.f32); break;
    default: snprintf(buf, len, "0x%016llx (%g)", (unsigned long long)f64_bits(e.f64), e.f64);
    }
}

/* expect_buf: got[i] == want[i] for i < n, reporting the first mismatch. */
static void expect_buf(const char *what, collie_dtype dt, collie_redop op, const void *got,
                       const void *want, size_t n) {
    for (size_t i = 0; i < n; i++) {
        elem g = get(dt, got, i), w = get(dt, want, i);
        if (!elem_equal(dt, g, w)) {
            char gs[64], ws[64];
            elem_format(dt, g, gs, sizeof gs);
            elem_format(dt, w, ws, sizeof ws);
            fail_msg("%s %s/%s count %zu: [%zu] = %s, want %s", what, collie_dtype_name(dt),
                     collie_redop_name(op), n, i, gs, ws);
        }
    }
}

/* random_elem: random bits half the time (every sign, NaN, Inf, subnormal),
 * otherwise small exact values or special values, so sums and products
 * also land in the interesting middle of the range. */
static elem random_elem(collie_dtype dt) {
    elem e;
    memset(&e, 0, sizeof e);
    uint64_t r = rng(), pick = rng() % 16;
    double nice = (double)((int64_t)(r % 4001) - 2000) / 16.0;
    static const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0, 0.5};
    double special = specials[r % 8];
    switch (dt) {
    case COLLIE_INT8:
    case COLLIE_UINT8: e.u8 = (uint8_t)r; break;
    case COLLIE_INT32: e.i32 = (int32_t)(uint32_t)(pick < 8 ? r : r % 7 - 3); break;
    case COLLIE_INT64: e.i64 = (int64_t)(pick < 8 ? r : r % 7 - 3); break;
    case COLLIE_FP16:
    case COLLIE_BF16: {
        fmt16 f = dt == COLLIE_FP16 ? FP16 : BF16;
        e.h = pick < 8 ? (uint16_t)r : ref_encode(f, pick < 14 ? nice : special);
        break;
    }
    case COLLIE_FP32:
        e.f32 = pick < 6    ? bits_f32((uint32_t)r)
                : pick < 14 ? (float)(nice * pow2((int)(rng() % 41) - 20))
                            : (float)special;
        break;
    default:
        e.f64 = pick < 6 ? bits_f64(r) : pick < 14 ? nice * pow2((int)(rng() % 41) - 20) : special;
        break;
    }
    return e;
}

static void fill_random(collie_dtype dt, void *buf, size_t n) {
    for (size_t i = 0; i < n; i++)
        put(dt, buf, i, random_elem(dt));
}

/* A buffer at a byte offset inside guard bytes that must survive. */
#define GUARD      64
#define GUARD_BYTE 0xa5

typedef struct gbuf {
    unsigned char *mem;
    void *p;
    size_t bytes, off;
} gbuf;

static gbuf gbuf_alloc(size_t bytes, size_t off) {
    gbuf g = {malloc(bytes + off + 2 * GUARD), NULL, bytes, off};
    assert_non_null(g.mem);
    memset(g.mem, GUARD_BYTE, bytes + off + 2 * GUARD);
    g.p = g.mem + GUARD + off;
    return g;
}

static void gbuf_check_free(gbuf *g) {
    for (size_t i = 0; i < GUARD + g->off; i++)
        assert_int_equal(g->mem[i], GUARD_BYTE);
    for (size_t i = 0; i < GUARD; i++)
        assert_int_equal(g->mem[GUARD + g->off + g->bytes + i], GUARD_BYTE);
    free(g->mem);
}

/* ---- the full matrix ------------------------------------------------------- */

static const size_t counts[] = {0, 1, 7, 4096 + 3};
static const size_t offsets[][3] = {{0, 0, 0}, {1, 3, 5}, {4, 0, 8}, {7, 2, 1}}; /* dst, a, b */

static void check_case(collie_dtype dt, collie_redop op, size_t n, const size_t off[3]) {
    size_t sz = collie_dtype_size(dt), bytes = n * sz;
    void *a = malloc(bytes + 1), *b = malloc(bytes + 1), *want = malloc(bytes + 1);
    assert_true(a && b && want);
    fill_random(dt, a, n);
    fill_random(dt, b, n);
    for (size_t i = 0; i < n; i++)
        put(dt, want, i, ref_op(dt, op, get(dt, a, i), get(dt, b, i)));

    gbuf d = gbuf_alloc(bytes, off[0]), ua = gbuf_alloc(bytes, off[1]),
         ub = gbuf_alloc(bytes, off[2]);
    memcpy(ua.p, a, bytes);
    memcpy(ub.p, b, bytes);

    /* cl_reduce: dst op= src */
    memcpy(d.p, a, bytes);
    cl_reduce(d.p, ub.p, n, dt, op);
    expect_buf("cl_reduce", dt, op, d.p, want, n);

    /* cl_reduce3 out of place; the inputs stay untouched */
    memset(d.p, 0, bytes);
    cl_reduce3(d.p, ua.p, ub.p, n, dt, op);
    expect_buf("cl_reduce3", dt, op, d.p, want, n);
    assert_memory_equal(ua.p, a, bytes);
    assert_memory_equal(ub.p, b, bytes);

    if (op == COLLIE_AVG) {
        for (int nranks = 2; nranks <= 7; nranks += 5) {
            memcpy(d.p, want, bytes);
            cl_reduce_finalize_avg(d.p, n, dt, nranks);
            for (size_t i = 0; i < n; i++) {
                elem w = ref_avg(dt, get(dt, want, i), nranks), g = get(dt, d.p, i);
                if (!elem_equal(dt, g, w)) {
                    char gs[64], ws[64];
                    elem_format(dt, g, gs, sizeof gs);
                    elem_format(dt, w, ws, sizeof ws);
                    fail_msg("finalize_avg %s /%d: [%zu] = %s, want %s", collie_dtype_name(dt),
                             nranks, i, gs, ws);
                }
            }
        }
    }
    gbuf_check_free(&d);
    gbuf_check_free(&ua);
    gbuf_check_free(&ub);
    free(a);
    free(b);
    free(want);
}

static void test_every_dtype_op_count_offset(void **state) {
    (void)state;
    for (int dt = 0; dt < COLLIE_NUM_DTYPES; dt++)
        for (int op = 0; op < COLLIE_NUM_REDOPS; op++)
            for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
                for (size_t o = 0; o < sizeof offsets / sizeof offsets[0]; o++)
                    check_case((collie_dtype)dt, (collie_redop)op, counts[c], offsets[o]);
}

/* ---- aliasing ---------------------------------------------------------------- */

static void test_reduce3_aliasing(void **state) {
    (void)state;
    const size_t n = 4096 + 3; /* several stack blocks for dst == a == b, even for int8 */
    for (int dt = 0; dt < COLLIE_NUM_DTYPES; dt++) {
        for (int op = 0; op < COLLIE_NUM_REDOPS; op++) {
            size_t bytes = n * collie_dtype_size((collie_dtype)dt);
            void *a = malloc(bytes), *b = malloc(bytes), *want = malloc(bytes),
                 *buf = malloc(bytes);
            assert_true(a && b && want && buf);
            fill_random((collie_dtype)dt, a, n);
            fill_random((collie_dtype)dt, b, n);
            cl_reduce3(want, a, b, n, (collie_dtype)dt, (collie_redop)op);

            memcpy(buf, a, bytes); /* dst == a */
            cl_reduce3(buf, buf, b, n, (collie_dtype)dt, (collie_redop)op);
            expect_buf("dst==a", (collie_dtype)dt, (collie_redop)op, buf, want, n);

            memcpy(buf, b, bytes); /* dst == b: computed as b op a */
            cl_reduce3(buf, a, buf, n, (collie_dtype)dt, (collie_redop)op);
            expect_buf("dst==b", (collie_dtype)dt, (collie_redop)op, buf, want, n);

            cl_reduce3(want, a, a, n, (collie_dtype)dt, (collie_redop)op); /* a op a */
            for (size_t i = 0; i < n; i++) {
                elem x = get((collie_dtype)dt, a, i);
                assert_true(elem_equal((collie_dtype)dt, get((collie_dtype)dt, want, i),
                                       ref_op((collie_dtype)dt, (collie_redop)op, x, x)));
            }
            memcpy(buf, a, bytes); /* dst == a == b */
            cl_reduce3(buf, buf, buf, n, (collie_dtype)dt, (collie_redop)op);
            expect_buf("dst==a==b", (collie_dtype)dt, (collie_redop)op, buf, want, n);
            memcpy(buf, a, bytes);
            cl_reduce(buf, buf, n, (collie_dtype)dt, (collie_redop)op);
            expect_buf("cl_reduce dst==src", (collie_dtype)dt, (collie_redop)op, buf, want, n);
            free(a);
            free(b);
            free(want);
            free(buf);
        }
    }
}

/* ---- integers: wrap, signedness, truncation ------------------------------------ */

static void test_integer_wraparound(void **state) {
    (void)state;
    int8_t i8a[] = {127, -128, 16, -128, 100, 11}, i8b[] = {1, -1, 16, -1, 100, 13};
    int8_t i8d[6];
    cl_reduce3(i8d, i8a, i8b, 6, COLLIE_INT8, COLLIE_SUM);
    int8_t i8sum[] = {-128, 127, 32, 127, -56, 24};
    assert_memory_equal(i8d, i8sum, sizeof i8d);
    cl_reduce3(i8d, i8a, i8b, 6, COLLIE_INT8, COLLIE_PROD);
    int8_t i8prod[] = {127, -128, 0, -128, 16, -113}; /* 10000 = 39*256+16; 143-256 */
    assert_memory_equal(i8d, i8prod, sizeof i8d);

    uint8_t u8a[] = {255, 200, 16, 255}, u8b[] = {1, 100, 17, 255}, u8d[4];
    cl_reduce3(u8d, u8a, u8b, 4, COLLIE_UINT8, COLLIE_SUM);
    uint8_t u8sum[] = {0, 44, 33, 254};
    assert_memory_equal(u8d, u8sum, sizeof u8d);
    cl_reduce3(u8d, u8a, u8b, 4, COLLIE_UINT8, COLLIE_PROD);
    uint8_t u8prod[] = {255, 32, 16, 1}; /* 20000 % 256 = 32, 272 % 256 = 16, 65025 % 256 = 1 */
    assert_memory_equal(u8d, u8prod, sizeof u8d);

    int32_t i32a[] = {INT32_MAX, INT32_MIN, 65536, INT32_MIN, -7};
    int32_t i32b[] = {1, -1, 65536, -1, 3};
    int32_t i32d[5];
    cl_reduce3(i32d, i32a, i32b, 5, COLLIE_INT32, COLLIE_SUM);
    int32_t i32sum[] = {INT32_MIN, INT32_MAX, 131072, INT32_MAX, -4};
    assert_memory_equal(i32d, i32sum, sizeof i32d);
    cl_reduce3(i32d, i32a, i32b, 5, COLLIE_INT32, COLLIE_PROD);
    int32_t i32prod[] = {INT32_MAX, INT32_MIN, 0, INT32_MIN, -21};
    assert_memory_equal(i32d, i32prod, sizeof i32d);

    int64_t i64a[] = {INT64_MAX, INT64_MIN, INT64_C(1) << 32, INT64_MIN, -5};
    int64_t i64b[] = {1, -1, INT64_C(1) << 32, -1, -5};
    int64_t i64d[5];
    cl_reduce3(i64d, i64a, i64b, 5, COLLIE_INT64, COLLIE_SUM);
    int64_t i64sum[] = {INT64_MIN, INT64_MAX, INT64_C(1) << 33, INT64_MAX, -10};
    assert_memory_equal(i64d, i64sum, sizeof i64d);
    cl_reduce3(i64d, i64a, i64b, 5, COLLIE_INT64, COLLIE_PROD);
    int64_t i64prod[] = {INT64_MAX, INT64_MIN, 0, INT64_MIN, 25};
    assert_memory_equal(i64d, i64prod, sizeof i64d);
}

static void test_integer_min_max_signedness(void **state) {
    (void)state;
    int8_t i8a[] = {-5, 3, -128, 127}, i8b[] = {3, -5, 127, -1}, i8d[4];
    cl_reduce3(i8d, i8a, i8b, 4, COLLIE_INT8, COLLIE_MIN);
    assert_memory_equal(i8d, ((int8_t[]){-5, -5, -128, -1}), 4);
    cl_reduce3(i8d, i8a, i8b, 4, COLLIE_INT8, COLLIE_MAX);
    assert_memory_equal(i8d, ((int8_t[]){3, 3, 127, 127}), 4);

    uint8_t u8a[] = {200, 100, 128, 0}, u8b[] = {100, 200, 127, 255}, u8d[4];
    cl_reduce3(u8d, u8a, u8b, 4, COLLIE_UINT8, COLLIE_MIN); /* signed, 200 would be -56 */
    assert_memory_equal(u8d, ((uint8_t[]){100, 100, 127, 0}), 4);
    cl_reduce3(u8d, u8a, u8b, 4, COLLIE_UINT8, COLLIE_MAX);
    assert_memory_equal(u8d, ((uint8_t[]){200, 200, 128, 255}), 4);

    int32_t i32a[] = {-1, INT32_MIN, 5}, i32b[] = {1, INT32_MAX, -5}, i32d[3];
    cl_reduce3(i32d, i32a, i32b, 3, COLLIE_INT32, COLLIE_MIN);
    assert_memory_equal(i32d, ((int32_t[]){-1, INT32_MIN, -5}), sizeof i32d);
    cl_reduce3(i32d, i32a, i32b, 3, COLLIE_INT32, COLLIE_MAX);
    assert_memory_equal(i32d, ((int32_t[]){1, INT32_MAX, 5}), sizeof i32d);

    int64_t i64a[] = {-1, INT64_MIN, 5}, i64b[] = {1, INT64_MAX, -5}, i64d[3];
    cl_reduce3(i64d, i64a, i64b, 3, COLLIE_INT64, COLLIE_MIN);
    assert_memory_equal(i64d, ((int64_t[]){-1, INT64_MIN, -5}), sizeof i64d);
    cl_reduce3(i64d, i64a, i64b, 3, COLLIE_INT64, COLLIE_MAX);
    assert_memory_equal(i64d, ((int64_t[]){1, INT64_MAX, 5}), sizeof i64d);
}

static void test_avg_truncates_toward_zero(void **state) {
    (void)state;
    /* int8: 100 + 100 wraps to -56; the average is of the wrapped sum */
    int8_t i8[] = {-7, 7, -1, 100, -128, 127};
    int8_t i8s[] = {-7, 7, -1, 100, -128, 127};
    cl_reduce(i8, i8s, 6, COLLIE_INT8, COLLIE_AVG); /* -14 14 -2 -56 0 -2 */
    cl_reduce_finalize_avg(i8, 6, COLLIE_INT8, 4);
    assert_memory_equal(i8, ((int8_t[]){-3, 3, 0, -14, 0, 0}), 6);

    uint8_t u8[] = {250, 255, 3}; /* unsigned: 250 / 4 = 62, not (-6) / 4 */
    cl_reduce_finalize_avg(u8, 3, COLLIE_UINT8, 4);
    assert_memory_equal(u8, ((uint8_t[]){62, 63, 0}), 3);

    int32_t i32[] = {-7, 7, INT32_MIN, INT32_MAX, -1};
    cl_reduce_finalize_avg(i32, 5, COLLIE_INT32, 2);
    assert_memory_equal(i32, ((int32_t[]){-3, 3, INT32_MIN / 2, INT32_MAX / 2, 0}), sizeof i32);

    int64_t i64[] = {-7, 7, INT64_MIN, -2};
    cl_reduce_finalize_avg(i64, 4, COLLIE_INT64, 3);
    assert_memory_equal(i64, ((int64_t[]){-2, 2, INT64_MIN / 3, 0}), sizeof i64);

    float f[] = {7.0f, -1.0f};
    cl_reduce_finalize_avg(f, 2, COLLIE_FP32, 2);
    assert_true(f[0] == 3.5f && f[1] == -0.5f);
    double d[] = {1.0, -9.0};
    cl_reduce_finalize_avg(d, 2, COLLIE_FP64, 3);
    assert_true(d[0] == 1.0 / 3 && d[1] == -3.0);
    uint16_t h[] = {0x4700 /* 7 */, 0xbc00 /* -1 */};
    cl_reduce_finalize_avg(h, 2, COLLIE_FP16, 2);
    assert_int_equal(h[0], 0x4300); /* 3.5 */
    assert_int_equal(h[1], 0xb800); /* -0.5 */
    uint16_t bf[] = {0x40e0 /* 7 */, 0x3f80 /* 1 */};
    cl_reduce_finalize_avg(bf, 2, COLLIE_BF16, 2);
    assert_int_equal(bf[0], 0x4060);
    assert_int_equal(bf[1], 0x3f00);

    /* nranks <= 1 leaves the buffer alone */
    int32_t keep[] = {-7, 9};
    cl_reduce_finalize_avg(keep, 2, COLLIE_INT32, 1);
    cl_reduce_finalize_avg(keep, 2, COLLIE_INT32, 0);
    cl_reduce_finalize_avg(keep, 2, COLLIE_INT32, -4);
    assert_memory_equal(keep, ((int32_t[]){-7, 9}), sizeof keep);
}

/* ---- fp16 / bf16 conversions ---------------------------------------------------- */

static void check_every_pattern(fmt16 f, collie_dtype dt,
                                void (*widen)(float *, const void *, size_t),
                                void (*narrow)(void *, const float *, size_t)) {
    enum { N = 65536 };
    uint16_t *in = malloc(N * sizeof *in), *back = malloc(N * sizeof *back);
    float *wide = malloc(N * sizeof *wide);
    assert_true(in && back && wide);
    for (uint32_t i = 0; i < N; i++)
        in[i] = (uint16_t)i;
    widen(wide, in, N);
    narrow(back, wide, N);
    uint16_t quiet = (uint16_t)(1u << (f.p - 2));
    for (uint32_t i = 0; i < N; i++) {
        if (f16_isnan(f, in[i])) {
            /* NaN: sign and payload kept on the way in, quietened on the way out */
            uint32_t want =
                ((i & 0x8000u) << 16) | 0x7f800000u | ((i & (quiet * 2u - 1)) << (24 - f.p));
            assert_int_equal(f32_bits(wide[i]), want);
            assert_true(f16_isnan(f, back[i]));
            assert_int_equal(back[i], in[i] | quiet);
        } else {
            assert_int_equal(f32_bits(wide[i]), f32_bits((float)ref_decode(f, in[i])));
            assert_int_equal(back[i], in[i]);
        }
    }
    /* the same trip through the reduction path: max(x, x) and min(x, x) are x */
    for (int op = COLLIE_MIN; op <= COLLIE_MAX; op++) {
        cl_reduce3(back, in, in, N, dt, (collie_redop)op);
        for (uint32_t i = 0; i < N; i++)
            assert_true(back[i] == in[i] || (f16_isnan(f, in[i]) && f16_isnan(f, back[i])));
    }
    free(in);
    free(back);
    free(wide);
}

static void test_fp16_every_pattern_round_trips(void **state) {
    (void)state;
    check_every_pattern(FP16, COLLIE_FP16, cl_fp16_to_float, cl_float_to_fp16);
}

static void test_bf16_every_pattern_round_trips(void **state) {
    (void)state;
    check_every_pattern(BF16, COLLIE_BF16, cl_bf16_to_float, cl_float_to_bf16);
}

/* AVG of every 16-bit pattern: divide in float, round once (checked
 * against an exact division rounded by ref_encode). */
static void check_avg_every_pattern(fmt16 f, collie_dtype dt) {
    enum { N = 65536 };
    uint16_t *h = malloc(N * sizeof *h);
    assert_non_null(h);
    static const int divisors[] = {3, 6, 7, 1000};
    for (size_t k = 0; k < sizeof divisors / sizeof divisors[0]; k++) {
        for (uint32_t i = 0; i < N; i++)
            h[i] = (uint16_t)i;
        cl_reduce_finalize_avg(h, N, dt, divisors[k]);
        for (uint32_t i = 0; i < N; i++) {
            uint16_t want = ref_encode(f, ref_decode(f, (uint16_t)i) / divisors[k]);
            if (f16_isnan(f, want))
                assert_true(f16_isnan(f, h[i]));
            else if (h[i] != want)
                fail_msg("%s 0x%04x / %d = 0x%04x, want 0x%04x", collie_dtype_name(dt), i,
                         divisors[k], h[i], want);
        }
    }
    free(h);
}

static void test_fp16_bf16_avg_every_pattern(void **state) {
    (void)state;
    check_avg_every_pattern(FP16, COLLIE_FP16);
    check_avg_every_pattern(BF16, COLLIE_BF16);
}

static uint16_t narrow1(void (*narrow)(void *, const float *, size_t), float x) {
    uint16_t h;
    narrow(&h, &x, 1);
    return h;
}

/* Every midpoint between neighbouring finite values rounds to the even one;
 * one float ulp either side rounds to the nearer one; the midpoint above the
 * largest finite value rounds to Inf. Then random floats against ref_encode. */
static void check_rounding(fmt16 f, void (*narrow)(void *, const float *, size_t)) {
    uint16_t inf = (uint16_t)(((1u << f.ebits) - 1) << (f.p - 1));
    for (uint32_t s = 0; s <= 0x8000u; s += 0x8000u) {
        for (uint16_t h = 0; h < inf; h++) {
            double lo = ref_decode(f, (uint16_t)(s | h)), hi;
            hi = h + 1u < inf ? ref_decode(f, (uint16_t)(s | (h + 1u)))
                              : (s ? -1 : 1) * pow2((1 << (f.ebits - 1))); /* 2^(emax+1) */
            float mid = (float)((lo + hi) / 2);                            /* exact */
            assert_true((double)mid == (lo + hi) / 2);
            uint16_t even = (h & 1) ? (uint16_t)(h + 1u) : h;
            assert_int_equal(narrow1(narrow, mid), s | even);
            if (mid != 0) {
                /* |mid| - 1 ulp rounds toward h, + 1 ulp toward h + 1 */
                assert_int_equal(narrow1(narrow, bits_f32(f32_bits(mid) - 1)), s | h);
                assert_int_equal(narrow1(narrow, bits_f32(f32_bits(mid) + 1)), s | (h + 1u));
            }
        }
    }
    for (int i = 0; i < 1 << 18; i++) {
        float x = bits_f32((uint32_t)rng());
        uint16_t got = narrow1(narrow, x), want = ref_encode(f, x);
        if (isnan(x))
            assert_true(f16_isnan(f, got) && (got & 0x8000u) == (want & 0x8000u));
        else if (got != want)
            fail_msg("narrow 0x%08x (%g): 0x%04x, want 0x%04x", f32_bits(x), x, got, want);
    }
    assert_int_equal(narrow1(narrow, INFINITY), inf);
    assert_int_equal(narrow1(narrow, -INFINITY), 0x8000u | inf);
    assert_int_equal(narrow1(narrow, -0.0f), 0x8000u);
    assert_int_equal(narrow1(narrow, bits_f32(0x7f800001u)), inf | (1u << (f.p - 2))); /* sNaN */
    assert_int_equal(narrow1(narrow, bits_f32(0x00000001u)), 0); /* float subnormal */
}

static void test_fp16_rounding_ties_to_even(void **state) {
    (void)state;
    check_rounding(FP16, cl_float_to_fp16);
    assert_int_equal(narrow1(cl_float_to_fp16, 65519.99f), 0x7bff);
    assert_int_equal(narrow1(cl_float_to_fp16, 65520.0f), 0x7c00);
    assert_int_equal(narrow1(cl_float_to_fp16, 0x1p-25f), 0x0000);        /* tie: to even 0 */
    assert_int_equal(narrow1(cl_float_to_fp16, 0x1.000002p-25f), 0x0001); /* just above */
    assert_int_equal(narrow1(cl_float_to_fp16, 0x1.8p-24f), 0x0002);      /* 1.5 units */
    assert_int_equal(narrow1(cl_float_to_fp16, 0x1.ff8p-15f), 0x03ff);    /* top subnormal */
    assert_int_equal(narrow1(cl_float_to_fp16, 0x1.ffcp-15f), 0x0400);    /* tie: to normal */
    /* through a reduction: 2048 + 1 = 2049 ties to 2048, 2050 + 1 to 2052 */
    uint16_t a[] = {0x6800, 0x6801, 0x3c00}, b[] = {0x3c00, 0x3c00, 0x1000}, d[3];
    cl_reduce3(d, a, b, 3, COLLIE_FP16, COLLIE_SUM);
    assert_int_equal(d[0], 0x6800);
    assert_int_equal(d[1], 0x6802);
    assert_int_equal(d[2], 0x3c00); /* 1 + 2^-11 ties to 1 */
}

static void test_bf16_rounding_ties_to_even(void **state) {
    (void)state;
    check_rounding(BF16, cl_float_to_bf16);
    assert_int_equal(narrow1(cl_float_to_bf16, 3.4028235e38f), 0x7f80); /* FLT_MAX: Inf */
    /* through a reduction: 256 + 1 ties to 256, 258 + 1 to 260 */
    uint16_t a[] = {0x4380, 0x4381}, b[] = {0x3f80, 0x3f80}, d[2];
    cl_reduce3(d, a, b, 2, COLLIE_BF16, COLLIE_SUM);
    assert_int_equal(d[0], 0x4380);
    assert_int_equal(d[1], 0x4382);
}

/* ---- IEEE specials ------------------------------------------------------------ */

static void test_fp_special_values(void **state) {
    (void)state;
    /* x, y pairs in both orders: inf-inf, NaN either side, -0 vs +0 */
    float fa[] = {INFINITY, NAN, 1.0f, -0.0f, 0.0f, -INFINITY};
    float fb[] = {-INFINITY, 1.0f, NAN, 0.0f, -0.0f, 3.0f};
    float fd[6];
    cl_reduce3(fd, fa, fb, 6, COLLIE_FP32, COLLIE_SUM);
    assert_true(isnan(fd[0]) && isnan(fd[1]) && isnan(fd[2]));
    cl_reduce3(fd, fa, fb, 6, COLLIE_FP32, COLLIE_MIN);
    assert_true(isnan(fd[1]) && isnan(fd[2]));
    assert_int_equal(f32_bits(fd[3]), f32_bits(-0.0f));
    assert_int_equal(f32_bits(fd[4]), f32_bits(-0.0f));
    assert_true(fd[0] == -INFINITY && fd[5] == -INFINITY);
    cl_reduce3(fd, fa, fb, 6, COLLIE_FP32, COLLIE_MAX);
    assert_true(isnan(fd[1]) && isnan(fd[2]));
    assert_int_equal(f32_bits(fd[3]), f32_bits(0.0f));
    assert_int_equal(f32_bits(fd[4]), f32_bits(0.0f));
    assert_true(fd[0] == INFINITY && fd[5] == 3.0f);

    double da[] = {NAN, 2.0, -0.0, 0.0}, db[] = {2.0, NAN, 0.0, -0.0}, dd[4];
    cl_reduce3(dd, da, db, 4, COLLIE_FP64, COLLIE_MIN);
    assert_true(isnan(dd[0]) && isnan(dd[1]));
    assert_true(signbit(dd[2]) && signbit(dd[3]));
    cl_reduce3(dd, da, db, 4, COLLIE_FP64, COLLIE_MAX);
    assert_true(isnan(dd[0]) && isnan(dd[1]));
    assert_true(!signbit(dd[2]) && !signbit(dd[3]));

    /* fp16: 65504 + 65504 overflows to Inf; NaN survives MIN; -0 < +0 */
    uint16_t ha[] = {0x7bff, 0x7e00, 0x8000, 0x0001}, hb[] = {0x7bff, 0x3c00, 0x0000, 0x0001};
    uint16_t hd[4];
    cl_reduce3(hd, ha, hb, 4, COLLIE_FP16, COLLIE_SUM);
    assert_int_equal(hd[0], 0x7c00);
    assert_true(f16_isnan(FP16, hd[1]));
    assert_int_equal(hd[3], 0x0002); /* subnormals add exactly */
    cl_reduce3(hd, hb, ha, 4, COLLIE_FP16, COLLIE_MIN);
    assert_true(f16_isnan(FP16, hd[1]));
    assert_int_equal(hd[2], 0x8000);

    /* bf16: a NaN whose payload is only in the low bits stays NaN */
    uint16_t ba[] = {0x7f81, 0xff81}, bb[] = {0x3f80, 0x3f80}, bd[2];
    cl_reduce3(bd, ba, bb, 2, COLLIE_BF16, COLLIE_SUM);
    assert_true(f16_isnan(BF16, bd[0]) && f16_isnan(BF16, bd[1]));
}

/* ---- helpers and invalid arguments ---------------------------------------------- */

static void test_dtype_helpers_and_invalid_arguments(void **state) {
    (void)state;
    static const size_t sizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
    static const char *const dnames[] = {"int8", "uint8", "int32", "int64",
                                         "fp16", "bf16",  "fp32",  "fp64"};
    static const char *const onames[] = {"sum", "prod", "min", "max", "avg"};
    for (int dt = 0; dt < COLLIE_NUM_DTYPES; dt++) {
        assert_true(cl_dtype_valid(dt));
        assert_int_equal(collie_dtype_size((collie_dtype)dt), sizes[dt]);
        assert_string_equal(collie_dtype_name((collie_dtype)dt), dnames[dt]);
    }
    for (int op = 0; op < COLLIE_NUM_REDOPS; op++) {
        assert_true(cl_redop_valid(op));
        assert_string_equal(collie_redop_name((collie_redop)op), onames[op]);
    }
    int bad[] = {-1, COLLIE_NUM_DTYPES, COLLIE_NUM_REDOPS, 1000, INT32_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bad[i] < 0 || bad[i] >= COLLIE_NUM_DTYPES) {
            assert_false(cl_dtype_valid(bad[i]));
            assert_int_equal(collie_dtype_size((collie_dtype)bad[i]), 0);
            assert_string_equal(collie_dtype_name((collie_dtype)bad[i]), "?");
        }
        assert_false(cl_redop_valid(bad[i]));
        assert_string_equal(collie_redop_name((collie_redop)bad[i]), "?");
    }

    /* invalid dtype or op: nothing is written */
    int32_t d[3] = {1, 2, 3}, s[3] = {4, 5, 6};
    cl_reduce(d, s, 3, (collie_dtype)COLLIE_NUM_DTYPES, COLLIE_SUM);
    cl_reduce(d, s, 3, (collie_dtype)-1, COLLIE_SUM);
    cl_reduce(d, s, 3, COLLIE_INT32, (collie_redop)COLLIE_NUM_REDOPS);
    cl_reduce3(d, s, s, 3, COLLIE_INT32, (collie_redop)-1);
    cl_reduce_finalize_avg(d, 3, (collie_dtype)99, 2);
    assert_memory_equal(d, ((int32_t[]){1, 2, 3}), sizeof d);

    /* count 0 touches nothing, so NULL is fine */
    for (int dt = 0; dt < COLLIE_NUM_DTYPES; dt++) {
        cl_reduce(NULL, NULL, 0, (collie_dtype)dt, COLLIE_SUM);
        cl_reduce3(NULL, NULL, NULL, 0, (collie_dtype)dt, COLLIE_MAX);
        cl_reduce_finalize_avg(NULL, 0, (collie_dtype)dt, 4);
    }
    cl_fp16_to_float(NULL, NULL, 0);
    cl_float_to_bf16(NULL, NULL, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_helpers_and_invalid_arguments),
        cmocka_unit_test(test_integer_wraparound),
        cmocka_unit_test(test_integer_min_max_signedness),
        cmocka_unit_test(test_avg_truncates_toward_zero),
        cmocka_unit_test(test_fp_special_values),
        cmocka_unit_test(test_fp16_every_pattern_round_trips),
        cmocka_unit_test(test_bf16_every_pattern_round_trips),
        cmocka_unit_test(test_fp16_bf16_avg_every_pattern),
        cmocka_unit_test(test_fp16_rounding_ties_to_even),
        cmocka_unit_test(test_bf16_rounding_ties_to_even),
        cmocka_unit_test(test_every_dtype_op_count_offset),
        cmocka_unit_test(test_reduce3_aliasing),
    };
    return cltest_main(tests, NULL, NULL);
}
