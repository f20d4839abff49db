/*
 * bench_data.c — collie-bench's --check (bench/mpi_bench.c's too): the input
 * every rank puts in its buffers, the reference each rank recomputes for its
 * own result, and the count of elements that differ; where each call's
 * buffers are.
 *
 * Design notes
 *  - Inputs are a deterministic function of (row seed, rank, index) and
 *    the reference is recomputed locally from that function, so no rank
 *    needs another's data. Reductions use small integers (sum, min, max,
 *    avg: [-4, 4], uint8 [0, 8]; prod: {-2, -1, 1, 2}, uint8 {1, 2, 3})
 *    whose partial results are exact in every dtype up to 64 ranks (the
 *    bf16 sums; fp16 products overflow to Inf on both sides alike), so the
 *    order of reduction does not matter and results compare bit-exactly:
 *    integers wrap and avg truncates as collie specifies; floating avg is
 *    one correctly rounded division. Data movement uses hashed values exact
 *    in the dtype.
 *  - In place (nccl-tests' second set of columns) the input sits where the
 *    call reads it: allreduce, reduce, broadcast and reduce_scatter in the
 *    receive slot itself, allgather and gather at rank*count of it; the
 *    reduce_scatter result is block `rank` of the slot.
 *  - Every wrong element is counted (nccl-tests' #wrong); the first wrong
 *    result of a row is reported on stderr with its index, the value got
 *    and the value expected, so a failure says where without flooding.
 *  - No libm: fp16/bf16 rounding is integer code, plus float arithmetic in
 *    the default rounding mode for fp16 subnormals.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "bench.h"

#define BENCH_POISON 0xA5

static bool bench_dtype_is_float(collie_dtype dt) {
    return dt == COLLIE_FP16 || dt == COLLIE_BF16 || dt == COLLIE_FP32 || dt == COLLIE_FP64;
}

/* ---- fp16 / bf16 without libm ---------------------------------------------- */

/* Round a float to IEEE binary16, to nearest even (Inf on overflow). */
static uint16_t bench_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return sign | 0x7e00;   /* NaN */
    if (ax >= 0x477ff000) return sign | 0x7c00;  /* >= 65520 rounds to Inf */
    if (ax >= 0x38800000) {                      /* normal: rebias 127 -> 15 */
        uint32_t r = ax - ((uint32_t)112 << 23); /* exponent - 112 */
        r += 0xfff + ((r >> 13) & 1);
        return sign | (uint16_t)(r >> 13);
    }
    /* subnormal: |f| * 2^24 is exact; round it to an integer, ties to even */
    float a;
    memcpy(&a, &ax, 4);
    float t = a * 16777216.0f;
    float r = (t + 8388608.0f) - 8388608.0f;
    return sign | (uint16_t)r;
}

static uint16_t bench_f2bf(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* Widen for messages only. */
static double bench_h2d(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) return m ? __builtin_nan("") : ((h & 0x8000) ? -__builtin_inf() : __builtin_inf());
    v = e ? (double)(1024 + m) : (double)m;
    for (int k = 0; k < (e ? e - 1 : 0); k++)
        v *= 2.0;
    v /= 16777216.0; /* 2^-24 */
    return (h & 0x8000) ? -v : v;
}

static double bench_bf2d(uint16_t b) {
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ---- element values ------------------------------------------------------ */

static uint64_t bench_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t bench_hash(uint32_t seed, int q, size_t j) {
    return bench_mix((uint64_t)j * 0x9e3779b97f4a7c15ULL ^
                     ((uint64_t)(unsigned)q + 1) * 0xd1b54a32d192ed03ULL ^ seed);
}

/* Input of rank q at index j for a reduction: small integers (see notes). */
static int64_t bench_red_val(const bench *b, uint32_t seed, int q, size_t j) {
    uint64_t h = bench_hash(seed, q, j);
    if (b->redop == COLLIE_PROD) {
        static const int64_t f[4] = {-2, -1, 1, 2};
        return b->dt == COLLIE_UINT8 ? (int64_t)(1 + h % 3) : f[h % 4];
    }
    return b->dt == COLLIE_UINT8 ? (int64_t)(h % 9) : (int64_t)(h % 9) - 4;
}

/* Input of rank q at index j for data movement: exact in the dtype. */
static int64_t bench_move_val(const bench *b, uint32_t seed, int q, size_t j) {
    uint64_t h = bench_hash(seed, q, j);
    switch (b->dt) {
    case COLLIE_INT8: return (int64_t)(h & 0xff) - 128;
    case COLLIE_UINT8: return (int64_t)(h & 0xff);
    case COLLIE_INT32: return (int64_t)(h & 0xffffffff) - ((int64_t)1 << 31);
    case COLLIE_INT64: return (int64_t)(h >> 1) - ((int64_t)1 << 62);
    case COLLIE_FP16: return (int64_t)(h % 4095) - 2047;
    case COLLIE_BF16: return (int64_t)(h % 511) - 255;
    case COLLIE_FP32: return (int64_t)(h % (1u << 24)) - (1 << 23);
    default: return (int64_t)(h >> 12) - ((int64_t)1 << 51); /* FP64 */
    }
}

/* Store a float value (already exact or to be rounded once) as dtype dt. */
static void bench_store_fp(collie_dtype dt, void *p, double v) {
    switch (dt) {
    case COLLIE_FP16: {
        uint16_t h = bench_f2h((float)v);
        memcpy(p, &h, 2);
        break;
    }
    case COLLIE_BF16: {
        uint16_t h = bench_f2bf((float)v);
        memcpy(p, &h, 2);
        break;
    }
    case COLLIE_FP32: {
        float f = (float)v;
        memcpy(p, &f, 4);
        break;
    }
    default: memcpy(p, &v, 8); break;
    }
}

/* Store the low bits of an integer (two's complement) as dtype dt. */
static void bench_store_int(collie_dtype dt, void *p, uint64_t u) {
    switch (dt) {
    case COLLIE_INT8:
    case COLLIE_UINT8: {
        uint8_t v = (uint8_t)u;
        memcpy(p, &v, 1);
        break;
    }
    case COLLIE_INT32: {
        uint32_t v = (uint32_t)u;
        memcpy(p, &v, 4);
        break;
    }
    default: memcpy(p, &u, 8); break;
    }
}

static void bench_store(collie_dtype dt, void *p, int64_t v) {
    if (bench_dtype_is_float(dt))
        bench_store_fp(dt, p, (double)v);
    else
        bench_store_int(dt, p, (uint64_t)v);
}

/* The reference result at input index j of a reduction over all ranks. */
static void bench_red_ref(const bench *b, uint32_t seed, size_t j, void *out) {
    collie_dtype dt = b->dt;
    collie_redop op = b->redop;
    int n = b->size;
    if (bench_dtype_is_float(dt)) {
        double acc = 0;
        for (int q = 0; q < n; q++) {
            double v = (double)bench_red_val(b, seed, q, j);
            if (q == 0)
                acc = v;
            else if (op == COLLIE_PROD)
                acc *= v;
            else if (op == COLLIE_MIN)
                acc = v < acc ? v : acc;
            else if (op == COLLIE_MAX)
                acc = v > acc ? v : acc;
            else
                acc += v;
        }
        if (op == COLLIE_AVG) acc /= n; /* exact sum, one rounding (see notes) */
        bench_store_fp(dt, out, acc);
        return;
    }
    uint64_t acc = 0;
    int64_t mm = 0;
    for (int q = 0; q < n; q++) {
        int64_t v = bench_red_val(b, seed, q, j);
        if (q == 0) {
            acc = (uint64_t)v;
            mm = v;
        } else if (op == COLLIE_PROD) {
            acc *= (uint64_t)v;
        } else {
            acc += (uint64_t)v;
            if (op == COLLIE_MIN && v < mm) mm = v;
            if (op == COLLIE_MAX && v > mm) mm = v;
        }
    }
    if (op == COLLIE_MIN || op == COLLIE_MAX) {
        acc = (uint64_t)mm;
    } else if (op == COLLIE_AVG) {
        /* the wrapped sum, read as signed (unsigned for uint8), truncated */
        int64_t s;
        switch (dt) {
        case COLLIE_INT8: s = (int64_t)(int8_t)(uint8_t)acc; break;
        case COLLIE_UINT8: s = (int64_t)(uint8_t)acc; break;
        case COLLIE_INT32: s = (int64_t)(int32_t)(uint32_t)acc; break;
        default: s = (int64_t)acc; break;
        }
        acc = (uint64_t)(s / n);
    }
    bench_store_int(dt, out, acc);
}

/* ---- sizes --------------------------------------------------------------- */

/* nccl-tests' *GetCollByteCount for a requested size of S bytes. */
bench_counts bench_counts_for(bench_op op, size_t S, size_t es, int nranks) {
    size_t n = (size_t)nranks, count = S / es;
    size_t base = (count / n) & ~(16 / es - 1);
    bench_counts k = {0, 0, 0, 0};
    switch (op) {
    case BENCH_ALLREDUCE:
    case BENCH_BROADCAST:
    case BENCH_REDUCE: k.param = k.send = k.recv = count; break;
    case BENCH_ALLGATHER:
    case BENCH_GATHER:
        k.param = k.send = base;
        k.recv = base * n;
        break;
    case BENCH_REDUCE_SCATTER:
    case BENCH_SCATTER:
        k.param = k.recv = base;
        k.send = base * n;
        break;
    case BENCH_ALLTOALL:
        k.param = base;
        k.send = k.recv = base * n;
        break;
    case BENCH_ALLGATHERV:
    case BENCH_ALLTOALLV: /* the whole buffer, split unevenly (bench_v_count) */
        k.param = k.send = k.recv = base * n;
        break;
    default: break; /* barrier */
    }
    k.bytes = (k.send > k.recv ? k.send : k.recv) * es;
    return k;
}

/* Block p of `total` split over n blocks weighing 1, 2, ..., n. */
static size_t bench_v_block(size_t total, int n, int p) {
    uint64_t w = (uint64_t)n * (uint64_t)(n + 1) / 2, sum = 0;
    for (int q = 0; q < n - 1; q++) {
        uint64_t part = (uint64_t)total * (uint64_t)(q + 1) / w;
        if (q == p) return (size_t)part;
        sum += part;
    }
    return (size_t)(total - sum); /* the last block: the rest */
}

size_t bench_v_count(bench_op op, size_t total, int n, int from, int to) {
    return op == BENCH_ALLTOALLV ? bench_v_block(total, n, (from + to) % n)
                                 : bench_v_block(total, n, from);
}

size_t bench_v_offset(bench_op op, size_t total, int n, int from, int to) {
    size_t at = 0;
    if (op == BENCH_ALLTOALLV)
        for (int q = 0; q < to; q++)
            at += bench_v_count(op, total, n, from, q);
    else
        for (int q = 0; q < from; q++)
            at += bench_v_block(total, n, q);
    return at;
}

/* ---- fill and verify ----------------------------------------------------- */

void bench_call_bufs(const bench *b, bench_op op, const bench_counts *k, unsigned char *send,
                     unsigned char *arena, size_t slot, bool inplace, void **s, void **r) {
    unsigned char *at = arena + slot * b->slot_bytes;
    size_t at_rank = (size_t)b->rank * k->param * b->es;
    *s = send;
    *r = at;
    if (!inplace) return;
    switch (op) {
    case BENCH_ALLGATHER:
    case BENCH_GATHER: *s = at + at_rank; break;
    case BENCH_ALLGATHERV:
        *s = at + bench_v_offset(op, k->param, b->size, b->rank, 0) * b->es;
        break;
    case BENCH_REDUCE_SCATTER:
        *s = at;
        *r = at + at_rank;
        break;
    default: *s = at; break;
    }
}

void bench_fill(bench *b, bench_op op, const bench_counts *k, uint32_t seed, size_t slots,
                bool inplace) {
    size_t es = b->es;
    int r = b->rank;
    void *call_s, *call_r;
    bench_call_bufs(b, op, k, b->sendbuf, b->arena, 0, inplace, &call_s, &call_r);
    unsigned char *in = call_s; /* where the call reads its input */
    memset(bench_slot(b, 0), BENCH_POISON, (inplace ? k->bytes / es : k->recv) * es);
    switch (op) {
    case BENCH_ALLREDUCE:
    case BENCH_REDUCE:
    case BENCH_REDUCE_SCATTER:
        for (size_t j = 0; j < k->send; j++)
            bench_store(b->dt, in + j * es, bench_red_val(b, seed, r, j));
        break;
    case BENCH_BROADCAST: /* one buffer: in place either way */
        if (r == b->root)
            for (size_t sl = 0; sl < slots; sl++)
                for (size_t j = 0; j < k->recv; j++)
                    bench_store(b->dt, bench_slot(b, sl) + j * es, bench_move_val(b, seed, r, j));
        break;
    case BENCH_ALLGATHER:
    case BENCH_GATHER:
    case BENCH_ALLTOALL:
    case BENCH_SCATTER:
    case BENCH_ALLTOALLV: /* packed by peer: element j of the buffer */
        for (size_t j = 0; j < k->send; j++)
            bench_store(b->dt, in + j * es, bench_move_val(b, seed, r, j));
        break;
    case BENCH_ALLGATHERV:
        for (size_t j = 0; j < bench_v_count(op, k->param, b->size, r, 0); j++)
            bench_store(b->dt, in + j * es, bench_move_val(b, seed, r, j));
        break;
    default: break;
    }
}

static void bench_print_elem(const bench *b, const unsigned char *p, char *buf, size_t len) {
    switch (b->dt) {
    case COLLIE_INT8: snprintf(buf, len, "%d", (int)(int8_t)p[0]); break;
    case COLLIE_UINT8: snprintf(buf, len, "%u", (unsigned)p[0]); break;
    case COLLIE_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        snprintf(buf, len, "%" PRId32, v);
        break;
    }
    case COLLIE_INT64: {
        int64_t v;
        memcpy(&v, p, 8);
        snprintf(buf, len, "%" PRId64, v);
        break;
    }
    case COLLIE_FP16:
    case COLLIE_BF16: {
        uint16_t h;
        memcpy(&h, p, 2);
        snprintf(buf, len, "%g (0x%04x)", b->dt == COLLIE_FP16 ? bench_h2d(h) : bench_bf2d(h),
                 (unsigned)h);
        break;
    }
    case COLLIE_FP32: {
        float f;
        memcpy(&f, p, 4);
        snprintf(buf, len, "%.9g", (double)f);
        break;
    }
    default: {
        double d;
        memcpy(&d, p, 8);
        snprintf(buf, len, "%.17g", d);
        break;
    }
    }
}

size_t bench_verify(bench *b, bench_op op, const bench_counts *k, uint32_t seed, size_t slot,
                    bool inplace, const char *when) {
    size_t es = b->es, n = (size_t)b->size, c = k->param, len = 0;
    int r = b->rank;
    bool root = r == b->root;
    const unsigned char *res = bench_slot(b, slot);
    if (inplace && op == BENCH_REDUCE_SCATTER) res += (size_t)r * c * es;
    switch (op) {
    case BENCH_ALLREDUCE:
    case BENCH_BROADCAST:
    case BENCH_REDUCE_SCATTER:
    case BENCH_SCATTER: len = c; break;
    case BENCH_REDUCE: len = root ? c : 0; break;
    case BENCH_ALLGATHER:
    case BENCH_ALLTOALL: len = c * n; break;
    case BENCH_GATHER: len = root ? c * n : 0; break;
    case BENCH_ALLGATHERV:
    case BENCH_ALLTOALLV: len = c; break;
    default: return 0;
    }
    /* v ops: the block j is in (from rank vq), where it starts in the
     * result, and (alltoallv) where it started in vq's send buffer */
    int vq = 0;
    bool a2av = op == BENCH_ALLTOALLV;
    size_t vstart = 0, vend = len ? bench_v_count(op, c, (int)n, 0, r) : 0;
    size_t vsrc = len && a2av ? bench_v_offset(op, c, (int)n, 0, r) : 0;
    unsigned char want[8], first_want[8];
    size_t bad = 0, first = 0;
    for (size_t j = 0; j < len; j++) {
        size_t q = c ? j / c : 0, i = c ? j % c : 0;
        if (op == BENCH_ALLGATHERV || op == BENCH_ALLTOALLV) {
            while (j >= vend) { /* the next non-empty block: once per block */
                vstart = vend;
                vq++;
                vend += bench_v_count(op, c, (int)n, vq, r);
                vsrc = a2av ? bench_v_offset(op, c, (int)n, vq, r) : 0;
            }
            q = (size_t)vq;
            i = j - vstart + vsrc;
        }
        switch (op) {
        case BENCH_ALLREDUCE:
        case BENCH_REDUCE: bench_red_ref(b, seed, j, want); break;
        case BENCH_REDUCE_SCATTER: bench_red_ref(b, seed, (size_t)r * c + j, want); break;
        case BENCH_BROADCAST: bench_store(b->dt, want, bench_move_val(b, seed, b->root, j)); break;
        case BENCH_SCATTER:
            bench_store(b->dt, want, bench_move_val(b, seed, b->root, (size_t)r * c + j));
            break;
        case BENCH_ALLGATHER:
        case BENCH_GATHER:
        case BENCH_ALLGATHERV:
        case BENCH_ALLTOALLV: bench_store(b->dt, want, bench_move_val(b, seed, (int)q, i)); break;
        default: /* alltoall: block q came from rank q, its block r */
            bench_store(b->dt, want, bench_move_val(b, seed, (int)q, (size_t)r * c + i));
            break;
        }
        if (memcmp(want, res + j * es, es) != 0 && bad++ == 0) {
            first = j;
            memcpy(first_want, want, es);
        }
    }
    if (bad == 0 || b->said_wrong) return bad;
    b->said_wrong = true;
    char got_s[64], want_s[64], what[64];
    bench_print_elem(b, res + first * es, got_s, sizeof got_s);
    bench_print_elem(b, first_want, want_s, sizeof want_s);
    snprintf(what, sizeof what, "%s, %s", bench_dtype_name(b->dt),
             bench_op_reduces(op) ? bench_redops[b->redop] : "no redop");
    if (bench_op_rooted(op))
        snprintf(what + strlen(what), sizeof what - strlen(what), ", root %d", b->root);
    fprintf(stderr,
            "%s: rank %d: check failed for %s of %zu bytes (%s) %s: first bad index "
            "%zu of the result (receive slot %zu): got %s, expected %s (%zu of %zu elements "
            "wrong)\n",
            bench_prog, r, bench_op_names[op], k->bytes, what, when, first, slot, got_s, want_s,
            bad, len);
    return bad;
}
