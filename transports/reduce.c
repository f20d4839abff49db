/*
 * reduce.c — element-wise reduction kernels for CPU buffers, and the
 * fp16/bf16 <-> float conversions they use.
 *
 * Design notes
 *  - One dispatch per call: a [dtype][op] table of kernels, each a flat loop
 *    over restrict pointers with no branch per element. AVG runs the SUM
 *    kernel; cl_reduce_finalize_avg divides once at the end.
 *  - Vectorised at the Makefile's -O2 with portable C: gcc's -O2 cost model
 *    ("very cheap") only vectorises a loop whose trip count is a known
 *    multiple of the vector width, so RED_FOR walks a buffer in fixed
 *    256-byte blocks (that inner loop vectorises; clang does it regardless)
 *    and finishes the < 256-byte tail with the scalar loop. Per-element
 *    choices are written as selects of values computed unconditionally;
 *    a branch around anything that may trap (with -ftrapping-math) stays a
 *    branch and blocks vectorisation. On x86-64 glibc the fp16/bf16
 *    conversions, which are compute bound, also get an AVX2 clone chosen at
 *    load time (RED_CLONES); everything else is baseline x86-64 (SSE2).
 *  - Any alignment: buffers are accessed through aligned(1) typedefs, which
 *    compile to unaligned vector loads (no slower on x86-64) and keep UBSan
 *    quiet for byte-offset pointers.
 *  - Integers: SUM/PROD run on the unsigned type of the same width (a signed
 *    buffer may be read through it), so wrap-around is defined; MIN/MAX
 *    compare in the buffer's own signedness.
 *  - fp MIN/MAX are IEEE 754-2019 minimum/maximum: NaN propagates and -0 <
 *    +0. With that every op commutes, so cl_reduce3 may compute b op a when
 *    dst == b and still produce the same bits (up to NaN payloads).
 *  - fp16/bf16: blocks of 256 elements are widened into float arrays on the
 *    stack, reduced by the fp32 kernel and narrowed, rounding to nearest
 *    even. float has >= 2p+2 significant bits for both (p = 11 and 8), so
 *    rounding to float and then to 16 bits equals rounding once: SUM, PROD
 *    and the AVG division are correctly rounded. Widening is exact integer
 *    code; bf16 narrowing is integer code; fp16 narrowing lets the FPU round
 *    and so, like all float arithmetic here, assumes the default rounding
 *    mode (the progress thread never changes it).
 *  - Aliasing: the restrict kernels need dst to be exactly a, exactly b, or
 *    disjoint from both; dst == a == b copies b to the stack block by block.
 *    The 16-bit path reads both inputs of a block before writing it, so it
 *    needs no special case.
 */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "transports/reduce.h"

#include "base/dtype.h"

/* Buffer element types: any alignment. fp16/bf16 are read as their bits.
 * (may_alias on red_u16 would stop gcc vectorising the conversions.) */
typedef int8_t red_i8;
typedef uint8_t red_u8;
typedef int32_t red_i32 __attribute__((aligned(1)));
typedef uint32_t red_u32 __attribute__((aligned(1)));
typedef int64_t red_i64 __attribute__((aligned(1)));
typedef uint64_t red_u64 __attribute__((aligned(1)));
typedef uint16_t red_u16 __attribute__((aligned(1)));
typedef float red_f32 __attribute__((aligned(1)));
typedef double red_f64 __attribute__((aligned(1)));

/* RED_CLONES: also build an AVX2 copy of the function, picked at load time
 * (an ifunc). The fp16/bf16 conversions are compute bound and run 2-3x
 * faster with AVX2 (packusdw, 8 lanes); the kernels are memory bound and
 * stay baseline x86-64. Elsewhere it expands to nothing, and so under the
 * sanitizers: an ifunc resolver runs before their runtime is initialised
 * (TSan crashes in it at start-up). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define RED_NO_CLONES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define RED_NO_CLONES 1
#endif
#endif
#if !defined(RED_NO_CLONES) && defined(__x86_64__) && defined(__GLIBC__) &&                        \
    (defined(__clang__) ? __clang_major__ >= 14 : __GNUC__ >= 6)
#define RED_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define RED_CLONES
#endif

#define RED_BLOCK_BYTES 256 /* one vectorised inner loop; a multiple of any vector width */
#define RED_HALF_BLOCK  256 /* fp16/bf16 elements widened per step (2 KiB of floats) */
#define RED_SELF_BYTES  4096

/* RED_FOR(n, T, k, STMT): run STMT for k = 0 .. n-1, in blocks of a fixed
 * element count (so the block loop vectorises at -O2) plus a scalar tail. */
#define RED_FOR(n, T, k, STMT)                                                                     \
    do {                                                                                           \
        const size_t red_b_ = RED_BLOCK_BYTES / sizeof(T);                                         \
        size_t red_i_ = 0;                                                                         \
        for (; (n)-red_i_ >= red_b_; red_i_ += red_b_)                                             \
            for (size_t red_j_ = 0; red_j_ < red_b_; red_j_++) {                                   \
                size_t k = red_i_ + red_j_;                                                        \
                STMT;                                                                              \
            }                                                                                      \
        for (size_t k = red_i_; k < (n); k++) {                                                    \
            STMT;                                                                                  \
        }                                                                                          \
    } while (0)

/* ---- element operations --------------------------------------------------- */

static inline uint32_t red_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float red_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint64_t red_f64_bits(double f) {
    uint64_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline double red_bits_f64(uint64_t u) {
    double f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Integer SUM/PROD operands are unsigned (uint8_t promotes to int, but
 * 255 * 255 fits). */
#define RED_SUM(x, y)  ((x) + (y))
#define RED_PROD(x, y) ((x) * (y))
#define RED_MIN(x, y)  ((y) < (x) ? (y) : (x))
#define RED_MAX(x, y)  ((x) < (y) ? (y) : (x))

/* IEEE minimum/maximum. When x == y the two differ at most in the sign of a
 * zero, and OR / AND of the bits picks -0 / +0. An unordered compare is
 * false, so a NaN x survives the first select; `y != y` catches a NaN y. */
static inline float red_f32_min(float x, float y) {
    float r = y < x ? y : x;
    r = x == y ? red_bits_f32(red_f32_bits(x) | red_f32_bits(y)) : r;
    return y != y ? y : r;
}

static inline float red_f32_max(float x, float y) {
    float r = x < y ? y : x;
    r = x == y ? red_bits_f32(red_f32_bits(x) & red_f32_bits(y)) : r;
    return y != y ? y : r;
}

static inline double red_f64_min(double x, double y) {
    double r = y < x ? y : x;
    r = x == y ? red_bits_f64(red_f64_bits(x) | red_f64_bits(y)) : r;
    return y != y ? y : r;
}

static inline double red_f64_max(double x, double y) {
    double r = x < y ? y : x;
    r = x == y ? red_bits_f64(red_f64_bits(x) & red_f64_bits(y)) : r;
    return y != y ? y : r;
}

/* ---- kernels -------------------------------------------------------------- */

typedef void (*red2_fn)(void *restrict d, const void *restrict s, size_t n);
typedef void (*red3_fn)(void *restrict d, const void *restrict a, const void *restrict b, size_t n);

/* RED_KERNELS(name, T, OP): red2_<name>: d = d OP s; red3_<name>: d = a OP b. */
#define RED_KERNELS(name, T, OP)                                                                   \
    static void red2_##name(void *restrict dv, const void *restrict sv, size_t n) {                \
        T *restrict d = dv;                                                                        \
        const T *restrict s = sv;                                                                  \
        RED_FOR(n, T, k, d[k] = OP(d[k], s[k]));                                                   \
    }                                                                                              \
    static void red3_##name(void *restrict dv, const void *restrict av, const void *restrict bv,   \
                            size_t n) {                                                            \
        T *restrict d = dv;                                                                        \
        const T *restrict a = av;                                                                  \
        const T *restrict b = bv;                                                                  \
        RED_FOR(n, T, k, d[k] = OP(a[k], b[k]));                                                   \
    }

RED_KERNELS(u8_sum, red_u8, RED_SUM)
RED_KERNELS(u8_prod, red_u8, RED_PROD)
RED_KERNELS(i8_min, red_i8, RED_MIN)
RED_KERNELS(i8_max, red_i8, RED_MAX)
RED_KERNELS(u8_min, red_u8, RED_MIN)
RED_KERNELS(u8_max, red_u8, RED_MAX)
RED_KERNELS(u32_sum, red_u32, RED_SUM)
RED_KERNELS(u32_prod, red_u32, RED_PROD)
RED_KERNELS(i32_min, red_i32, RED_MIN)
RED_KERNELS(i32_max, red_i32, RED_MAX)
RED_KERNELS(u64_sum, red_u64, RED_SUM)
RED_KERNELS(u64_prod, red_u64, RED_PROD)
RED_KERNELS(i64_min, red_i64, RED_MIN)
RED_KERNELS(i64_max, red_i64, RED_MAX)
RED_KERNELS(f32_sum, red_f32, RED_SUM)
RED_KERNELS(f32_prod, red_f32, RED_PROD)
RED_KERNELS(f32_min, red_f32, red_f32_min)
RED_KERNELS(f32_max, red_f32, red_f32_max)
RED_KERNELS(f64_sum, red_f64, RED_SUM)
RED_KERNELS(f64_prod, red_f64, RED_PROD)
RED_KERNELS(f64_min, red_f64, red_f64_min)
RED_KERNELS(f64_max, red_f64, red_f64_max)

typedef struct red_kernel {
    red2_fn in_place;     /* d = d op s */
    red3_fn out_of_place; /* d = a op b, all three disjoint */
} red_kernel;

#define RED_K(name)                                                                                \
    { red2_##name, red3_##name }
#define RED_ROW(sum, prod, min, max)                                                               \
    {                                                                                              \
        [COLLIE_SUM] = RED_K(sum), [COLLIE_PROD] = RED_K(prod), [COLLIE_MIN] = RED_K(min),         \
        [COLLIE_MAX] = RED_K(max), [COLLIE_AVG] = RED_K(sum)                                       \
    }

/* fp16/bf16 rows are absent: they go through red_half with the fp32 row. */
static const red_kernel red_table[COLLIE_NUM_DTYPES][COLLIE_NUM_REDOPS] = {
    [COLLIE_INT8] = RED_ROW(u8_sum, u8_prod, i8_min, i8_max),
    [COLLIE_UINT8] = RED_ROW(u8_sum, u8_prod, u8_min, u8_max),
    [COLLIE_INT32] = RED_ROW(u32_sum, u32_prod, i32_min, i32_max),
    [COLLIE_INT64] = RED_ROW(u64_sum, u64_prod, i64_min, i64_max),
    [COLLIE_FP32] = RED_ROW(f32_sum, f32_prod, f32_min, f32_max),
    [COLLIE_FP64] = RED_ROW(f64_sum, f64_prod, f64_min, f64_max),
};

/* ---- fp16 / bf16 conversions ---------------------------------------------- */

/* Each candidate result is computed for every element and one is picked
 * with a mask: a ternary around float arithmetic stays a branch (the
 * arithmetic might trap) and the loop would not vectorise. Comparisons are
 * on signed values known to be non-negative: SSE2 has no unsigned compare. */
static inline uint32_t red_sel(bool c, uint32_t if_true, uint32_t if_false) {
    uint32_t m = 0u - (uint32_t)c;
    return (if_true & m) | (if_false & ~m);
}

static inline float red_fp16_to_f32(uint16_t h) {
    int32_t em = h & 0x7fff;
    uint32_t r = ((uint32_t)em << 13) + ((127u - 15u) << 23); /* rebias the exponent */
    r += red_sel(em >= 0x7c00, (128u - 16u) << 23, 0u);       /* Inf/NaN: all ones, payload kept */
    float sub = (float)em * 0x1p-24f;                         /* exact, and a normal float */
    r = red_sel(em < 0x0400, red_f32_bits(sub), r);           /* subnormal or zero */
    return red_bits_f32(r | ((uint32_t)(h & 0x8000u) << 16));
}

/* Narrowing lets the FPU round (the method of Maratyszcza's FP16 library):
 * adding 2^(E+15), E = max(exponent of |f|, -14), to 4|f| leaves 4|f|
 * rounded to fp16's step at that exponent in the low mantissa bits, and the
 * low exponent bits of the sum plus those mantissa bits form the fp16 value
 * (a carry turns 65520 into Inf). |f| * 2^112 overflows to Inf exactly when
 * |f| >= 2^16, so larger values become Inf too. Exact in the default
 * rounding mode; under FTZ/DAZ only values that round to 0 are affected. */
static inline uint16_t red_f32_to_fp16(float f) {
    uint32_t x = red_f32_bits(f);
    int32_t ax = (int32_t)(x & 0x7fffffffu);
    float base = (red_bits_f32((uint32_t)ax) * 0x1p+112f) * 0x1p-110f;
    int32_t e = ax & 0x7f800000;
    e = e < 0x38800000 ? 0x38800000 : e; /* fp16 subnormals share the step 2^-24 */
    uint32_t b = red_f32_bits(red_bits_f32((uint32_t)e + (15u << 23)) + base);
    uint32_t r = ((b >> 13) & 0x7c00u) + (b & 0x0fffu);
    r = red_sel(ax > 0x7f800000, 0x7e00u | (((uint32_t)ax >> 13) & 0x3ffu), r); /* NaN: quiet */
    return (uint16_t)(r | ((x >> 16) & 0x8000u));
}

static inline float red_bf16_to_f32(uint16_t h) { return red_bits_f32((uint32_t)h << 16); }

static inline uint16_t red_f32_to_bf16(float f) {
    uint32_t x = red_f32_bits(f);
    /* NaN: set the quiet bit, so a payload only in the dropped bits stays
     * NaN. Otherwise round to nearest even; a carry runs on into Inf. */
    uint32_t y = red_sel((int32_t)(x & 0x7fffffffu) > 0x7f800000, x | 0x00400000u,
                         x + 0x7fffu + ((x >> 16) & 1u));
    return (uint16_t)(y >> 16);
}

/* The clones are static: clang 14 names a global clone's ifunc "f.ifunc",
 * which other files cannot link against, so the cl_ entry points wrap them. */
RED_CLONES static void red_widen_fp16(float *dst, const void *src, size_t count) {
    float *restrict d = dst;
    const red_u16 *restrict s = src;
    RED_FOR(count, float, k, d[k] = red_fp16_to_f32(s[k]));
}

RED_CLONES static void red_widen_bf16(float *dst, const void *src, size_t count) {
    float *restrict d = dst;
    const red_u16 *restrict s = src;
    RED_FOR(count, float, k, d[k] = red_bf16_to_f32(s[k]));
}

RED_CLONES static void red_narrow_fp16(void *dst, const float *src, size_t count) {
    red_u16 *restrict d = dst;
    const float *restrict s = src;
    RED_FOR(count, float, k, d[k] = red_f32_to_fp16(s[k]));
}

RED_CLONES static void red_narrow_bf16(void *dst, const float *src, size_t count) {
    red_u16 *restrict d = dst;
    const float *restrict s = src;
    RED_FOR(count, float, k, d[k] = red_f32_to_bf16(s[k]));
}

void cl_fp16_to_float(float *dst, const void *src, size_t count) {
    red_widen_fp16(dst, src, count);
}

void cl_bf16_to_float(float *dst, const void *src, size_t count) {
    red_widen_bf16(dst, src, count);
}

void cl_float_to_fp16(void *dst, const float *src, size_t count) {
    red_narrow_fp16(dst, src, count);
}

void cl_float_to_bf16(void *dst, const float *src, size_t count) {
    red_narrow_bf16(dst, src, count);
}

/* ---- dispatch ------------------------------------------------------------- */

typedef void (*red_widen_fn)(float *dst, const void *src, size_t count);
typedef void (*red_narrow_fn)(void *dst, const float *src, size_t count);

/* red_half: dst = a op b for fp16/bf16 via float, block by block. */
static void red_half(void *dst, const void *a, const void *b, size_t count, red_widen_fn widen,
                     red_narrow_fn narrow, red2_fn f32_op) {
    float fa[RED_HALF_BLOCK], fb[RED_HALF_BLOCK];
    unsigned char *d = dst;
    const unsigned char *pa = a, *pb = b;
    for (size_t i = 0; i < count; i += RED_HALF_BLOCK) {
        size_t m = count - i < RED_HALF_BLOCK ? count - i : RED_HALF_BLOCK;
        widen(fa, pa + 2 * i, m);
        widen(fb, pb + 2 * i, m);
        f32_op(fa, fb, m);
        narrow(d + 2 * i, fa, m);
    }
}

/* red_self: dst = dst op dst, through a stack copy so restrict holds. */
static void red_self(void *dst, size_t count, size_t size, red2_fn op) {
    unsigned char tmp[RED_SELF_BYTES];
    unsigned char *d = dst;
    size_t per = sizeof tmp / size;
    for (size_t i = 0; i < count; i += per) {
        size_t m = count - i < per ? count - i : per;
        memcpy(tmp, d + i * size, m * size);
        op(d + i * size, tmp, m);
    }
}

#ifndef NDEBUG
static bool red_same_or_disjoint(const void *p, const void *q, size_t bytes) {
    uintptr_t x = (uintptr_t)p, y = (uintptr_t)q;
    return x == y || x + bytes <= y || y + bytes <= x;
}
#endif

void cl_reduce3(void *dst, const void *a, const void *b, size_t count, collie_dtype dt,
                collie_redop op) {
    if (count == 0 || !cl_dtype_valid((int)dt) || !cl_redop_valid((int)op)) return;
    size_t size = cl_dtype_size(dt);
    assert(red_same_or_disjoint(dst, a, count * size) &&
           red_same_or_disjoint(dst, b, count * size));
    if (dt == COLLIE_FP16 || dt == COLLIE_BF16) {
        bool bf = dt == COLLIE_BF16;
        red_half(dst, a, b, count, bf ? red_widen_bf16 : red_widen_fp16,
                 bf ? red_narrow_bf16 : red_narrow_fp16, red_table[COLLIE_FP32][op].in_place);
        return;
    }
    const red_kernel *k = &red_table[dt][op];
    if (dst == a && dst == b)
        red_self(dst, count, size, k->in_place);
    else if (dst == a)
        k->in_place(dst, b, count);
    else if (dst == b)
        k->in_place(dst, a, count); /* every op commutes (see the design notes) */
    else
        k->out_of_place(dst, a, b, count);
}

void cl_reduce(void *dst, const void *src, size_t count, collie_dtype dt, collie_redop op) {
    cl_reduce3(dst, dst, src, count, dt, op);
}

/* ---- AVG ------------------------------------------------------------------ */

/* Integer division does not vectorise; this runs once per collective. */
#define RED_DIV_LOOP(T, buf, count, divisor)                                                       \
    do {                                                                                           \
        T *restrict p_ = (buf);                                                                    \
        for (size_t k_ = 0; k_ < (count); k_++)                                                    \
            p_[k_] = (T)(p_[k_] / (divisor));                                                      \
    } while (0)

static void red_half_div(void *buf, size_t count, red_widen_fn widen, red_narrow_fn narrow,
                         float divisor) {
    float f[RED_HALF_BLOCK];
    unsigned char *p = buf;
    for (size_t i = 0; i < count; i += RED_HALF_BLOCK) {
        size_t m = count - i < RED_HALF_BLOCK ? count - i : RED_HALF_BLOCK;
        widen(f, p + 2 * i, m);
        RED_FOR(m, float, k, f[k] = f[k] / divisor);
        narrow(p + 2 * i, f, m);
    }
}

void cl_reduce_finalize_avg(void *buf, size_t count, collie_dtype dt, int nranks) {
    if (count == 0 || nranks <= 1) return;
    switch (dt) {
    case COLLIE_INT8: RED_DIV_LOOP(red_i8, buf, count, nranks); break;
    case COLLIE_UINT8: RED_DIV_LOOP(red_u8, buf, count, (unsigned)nranks); break;
    case COLLIE_INT32: RED_DIV_LOOP(red_i32, buf, count, (int32_t)nranks); break;
    case COLLIE_INT64: RED_DIV_LOOP(red_i64, buf, count, (int64_t)nranks); break;
    case COLLIE_FP16:
        red_half_div(buf, count, red_widen_fp16, red_narrow_fp16, (float)nranks);
        break;
    case COLLIE_BF16:
        red_half_div(buf, count, red_widen_bf16, red_narrow_bf16, (float)nranks);
        break;
    case COLLIE_FP32: {
        red_f32 *restrict p = buf;
        float divisor = (float)nranks;
        RED_FOR(count, red_f32, k, p[k] = p[k] / divisor);
        break;
    }
    case COLLIE_FP64: {
        red_f64 *restrict p = buf;
        double divisor = (double)nranks;
        RED_FOR(count, red_f64, k, p[k] = p[k] / divisor);
        break;
    }
    default: break;
    }
}
