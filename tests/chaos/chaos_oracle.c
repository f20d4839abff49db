/*
 * chaos_oracle.c — inputs and reference outputs of the chaos rank
 * (chaos_oracle.h).
 *
 * Design notes
 *  - Element values come from one splitmix step of (stream key + index):
 *    cheap enough for the 8 MiB ops, and the stream key (the op's key mixed
 *    with the stream and the rank) is computed once per call.
 *  - The fp16/bf16 conversions here are written for exact values (the only
 *    ones the oracle makes): a value that is not exact in 16 bits is a bug
 *    of the oracle, caught by an assert.
 */
#include "tests/chaos/chaos_oracle.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static inline uint64_t el_hash(uint64_t k, size_t i) {
    uint64_t x = k + (uint64_t)i * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t stream_key(const ch_op *op, uint64_t stream, int r) {
    return ch_hash(op->key, stream, (uint64_t)r, 0x57ea);
}

double ch_half_to_double(uint16_t h, bool bf16) {
    if (bf16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0)
        v = ldexp(m, -24);
    else if (e == 31)
        v = m ? NAN : INFINITY;
    else
        v = ldexp(m + 1024, e - 25);
    return s ? -v : v;
}

uint16_t ch_double_to_half(double v, bool bf16) {
    if (bf16) {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        assert((u & 0xffff) == 0); /* exact values only */
        return (uint16_t)(u >> 16);
    }
    uint16_t s = signbit(v) ? 0x8000 : 0;
    double a = fabs(v);
    if (a == 0) return s;
    int e;
    double fr = frexp(a, &e); /* a = fr * 2^e, fr in [0.5, 1) */
    int be = e - 1 + 15;      /* biased exponent of 1.xxx * 2^(e-1) */
    if (be <= 0) {            /* subnormal: m * 2^-24 */
        double m = ldexp(a, 24);
        assert(m == floor(m) && m < 1024);
        return (uint16_t)(s | (uint16_t)m);
    }
    assert(be < 31);
    double m = ldexp(fr, 11) - 1024; /* 10 fraction bits */
    assert(m == floor(m));
    return (uint16_t)(s | (uint16_t)(be << 10) | (uint16_t)m);
}

static bool dt_float(collie_dtype dt) { return dt >= COLLIE_FP16; }
static bool dt_signed(collie_dtype dt) {
    return dt == COLLIE_INT8 || dt == COLLIE_INT32 || dt == COLLIE_INT64;
}

static void store_double(void *dst, size_t i, collie_dtype dt, double v) {
    switch (dt) {
    case COLLIE_FP16: ((uint16_t *)dst)[i] = ch_double_to_half(v, false); break;
    case COLLIE_BF16: ((uint16_t *)dst)[i] = ch_double_to_half(v, true); break;
    case COLLIE_FP32: {
        float f = (float)v;
        assert((double)f == v);
        memcpy((float *)dst + i, &f, 4);
        break;
    }
    case COLLIE_FP64: memcpy((double *)dst + i, &v, 8); break;
    default: assert(0);
    }
}

static double load_double(const void *src, size_t i, collie_dtype dt) {
    switch (dt) {
    case COLLIE_FP16: return ch_half_to_double(((const uint16_t *)src)[i], false);
    case COLLIE_BF16: return ch_half_to_double(((const uint16_t *)src)[i], true);
    case COLLIE_FP32: {
        float f;
        memcpy(&f, (const float *)src + i, 4);
        return f;
    }
    case COLLIE_FP64: {
        double d;
        memcpy(&d, (const double *)src + i, 8);
        return d;
    }
    default: assert(0); return 0;
    }
}

static void store_int(void *dst, size_t i, collie_dtype dt, uint64_t v) {
    size_t es = collie_dtype_size(dt);
    memcpy((uint8_t *)dst + i * es, &v, es); /* little endian: the low bytes */
}

static uint64_t load_uint(const void *src, size_t i, collie_dtype dt) {
    size_t es = collie_dtype_size(dt);
    uint64_t v = 0;
    memcpy(&v, (const uint8_t *)src + i * es, es);
    return v;
}

static int64_t sext(uint64_t v, size_t bits) {
    if (bits < 64 && (v >> (bits - 1)) & 1) v |= ~0ull << bits;
    return (int64_t)v;
}

static int64_t load_sint(const void *src, size_t i, collie_dtype dt) {
    return sext(load_uint(src, i, dt), collie_dtype_size(dt) * 8);
}

/* the float value of a reducing op's input (see the header) */
static double fvalue(const ch_op *op, int r, int n, size_t i, const uint64_t *keys) {
    uint64_t h = el_hash(keys[r], i);
    int amp = n <= 8 ? 8 : 4;
    switch (op->op) {
    case COLLIE_SUM: return (double)((int)(h % (uint64_t)(2 * amp + 1)) - amp);
    case COLLIE_PROD: {
        static const double v[6] = {1, 2, -1, -2, 0.5, -0.5};
        return v[h % 6];
    }
    case COLLIE_MIN:
    case COLLIE_MAX: return ((int)(h % 129) - 64) * 0.25;
    case COLLIE_AVG:
    default:
        if (r < n - 1 || n == 1) return (double)((int)(h % (uint64_t)(2 * amp + 1)) - amp);
        {
            double s = 0;
            for (int q = 0; q < n - 1; q++)
                s += (double)((int)(el_hash(keys[q], i) % (uint64_t)(2 * amp + 1)) - amp);
            int t = (int)(h % 9) - 4;
            return (double)t * n - s;
        }
    }
}

static uint64_t ivalue(const ch_op *op, int r, size_t i, const uint64_t *keys) {
    uint64_t h = el_hash(keys[r], i);
    if (op->op != COLLIE_AVG) return h;
    if (dt_signed(op->dt)) return (uint64_t)(int64_t)((int)(h % 41) - 20);
    return h % 41;
}

void ch_fill(const ch_op *op, uint64_t stream, int r, int n, size_t first, size_t count,
             void *dst) {
    collie_dtype dt = op->dt;
    size_t es = collie_dtype_size(dt);
    if (!ch_kind_reduces(op->kind)) {
        uint64_t k = stream_key(op, stream, r);
        uint8_t *d = dst;
        for (size_t i = 0; i < count; i++) {
            uint64_t h = el_hash(k, first + i);
            memcpy(d + i * es, &h, es);
        }
        return;
    }
    uint64_t keys[CH_MAX_RANKS];
    for (int q = 0; q < n; q++)
        keys[q] = stream_key(op, stream, q);
    for (size_t i = 0; i < count; i++) {
        if (dt_float(dt))
            store_double(dst, i, dt, fvalue(op, r, n, first + i, keys));
        else
            store_int(dst, i, dt, ivalue(op, r, first + i, keys));
    }
}

void ch_expect_reduce(const ch_op *op, int n, size_t first, size_t count, void *dst) {
    collie_dtype dt = op->dt;
    uint64_t keys[CH_MAX_RANKS];
    for (int q = 0; q < n; q++)
        keys[q] = stream_key(op, 0, q);
    size_t bits = collie_dtype_size(dt) * 8;
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    for (size_t i = 0; i < count; i++) {
        size_t ix = first + i;
        if (dt_float(dt)) {
            double acc = fvalue(op, 0, n, ix, keys);
            for (int r = 1; r < n; r++) {
                double v = fvalue(op, r, n, ix, keys);
                switch (op->op) {
                case COLLIE_SUM:
                case COLLIE_AVG: acc += v; break;
                case COLLIE_PROD: acc *= v; break;
                case COLLIE_MIN: acc = v < acc ? v : acc; break;
                case COLLIE_MAX: acc = v > acc ? v : acc; break;
                default: break;
                }
            }
            if (op->op == COLLIE_AVG) acc /= n;
            store_double(dst, i, dt, acc);
            continue;
        }
        uint64_t u = ivalue(op, 0, ix, keys) & mask;
        for (int r = 1; r < n; r++) {
            uint64_t v = ivalue(op, r, ix, keys) & mask;
            int64_t sa, sv;
            switch (op->op) {
            case COLLIE_SUM:
            case COLLIE_AVG: u = (u + v) & mask; break;
            case COLLIE_PROD: u = (u * v) & mask; break;
            case COLLIE_MIN:
            case COLLIE_MAX:
                if (dt_signed(dt)) {
                    sa = sext(u, bits);
                    sv = sext(v, bits);
                    if (op->op == COLLIE_MIN ? sv < sa : sv > sa) u = v;
                } else if (op->op == COLLIE_MIN ? v < u : v > u) {
                    u = v;
                }
                break;
            default: break;
            }
        }
        if (op->op == COLLIE_AVG && n > 1) {
            if (dt_signed(dt)) {
                u = (uint64_t)(sext(u, bits) / n) & mask;
            } else {
                u = u / (uint64_t)n;
            }
        }
        store_int(dst, i, dt, u);
    }
}

size_t ch_first_diff(const void *a, const void *b, size_t count, collie_dtype dt) {
    size_t es = collie_dtype_size(dt);
    if (memcmp(a, b, count * es) == 0) return (size_t)-1;
    for (size_t i = 0; i < count; i++)
        if (memcmp((const uint8_t *)a + i * es, (const uint8_t *)b + i * es, es) != 0) return i;
    return (size_t)-1;
}

void ch_elem_str(const void *buf, size_t i, collie_dtype dt, char *out, size_t cap) {
    uint64_t u = load_uint(buf, i, dt);
    if (dt_float(dt))
        snprintf(out, cap, "0x%llx(%g)", (unsigned long long)u, load_double(buf, i, dt));
    else if (dt_signed(dt))
        snprintf(out, cap, "0x%llx(%lld)", (unsigned long long)u, (long long)load_sint(buf, i, dt));
    else
        snprintf(out, cap, "0x%llx(%llu)", (unsigned long long)u, (unsigned long long)u);
}
