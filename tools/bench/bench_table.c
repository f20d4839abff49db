/*
 * bench_table.c — what collie-bench (and bench/mpi_bench.c) prints, rank 0
 * only: the header, the column heads of each collective, one row per (op,
 * dtype, redop, root, size) in nccl-tests' columns plus collie's, the
 * footer; or --csv.
 *
 * Design notes
 *  - Output: only rank 0 (thread 0 of process 0) prints results, and only
 *    process 0 --help (one table under collie-run); every rank reports its
 *    own errors on stderr. --csv prints exactly one header line and the
 *    rows, in collie's own columns (the peers of bench/peers.sh print the
 *    same). Exit 0 ok, 1 error or wrong results, 2 usage.
 *  - busbw uses nccl-tests' factors (its *GetBw); time is nccl-tests'
 *    format, fewer decimals as it grows.
 */
#include <inttypes.h>
#include <stdio.h>

#include "bench.h"

/* nccl-tests' busbw factors (its *GetBw). */
static double bench_busbw_factor(bench_op op, int n) {
    switch (op) {
    case BENCH_ALLREDUCE: return 2.0 * (n - 1) / n;
    case BENCH_BROADCAST:
    case BENCH_REDUCE: return 1.0;
    case BENCH_BARRIER: return 0.0;
    default: return (double)(n - 1) / n;
    }
}

/* nccl-tests' time format: fewer decimals as the time grows. */
static void bench_fmt_time(char *buf, size_t len, double us) {
    snprintf(buf, len, us >= 10000.0 ? "%.0f" : us >= 100.0 ? "%.1f" : "%.2f", us);
}

void bench_print_header(bench *b) {
    const bench_opts *o = b->o;
    if (o->csv) {
        printf("op,bytes,ranks,lat_us,algbw_GBps,busbw_GBps,ops_per_s\n");
        fflush(stdout);
        return;
    }
    char layout[64] = "", inflight[32] = "off";
    if (o->threads > 1)
        snprintf(layout, sizeof layout, " (%d process%s x %d threads)", b->proc->nprocs,
                 b->proc->nprocs == 1 ? "" : "es", o->threads);
    if (o->inflight) snprintf(inflight, sizeof inflight, "%d", o->inflight);
    size_t lo = o->sizes[0], hi = o->sizes[0];
    for (size_t i = 1; i < o->nsizes; i++) {
        lo = bench_min(lo, o->sizes[i]);
        hi = o->sizes[i] > hi ? o->sizes[i] : hi;
    }
    printf("# %s %s: backend %s, %d ranks%s%s\n", bench_prog, collie_version_string(), o->spec,
           b->size, layout, o->cuda ? ", CUDA buffers" : "");
    printf("# minBytes %zu maxBytes %zu (%zu sizes) warmup iters: %d iters: %d inflight: %s "
           "validation: %d op timeout: %d ms\n",
           lo, hi, o->nsizes, o->warmup, o->iters, inflight, o->check ? 1 : 0, o->timeout_ms);
    printf("# columns as nccl-tests' (size: the op's largest buffer; time: per-op mean of iters\n"
           "# back-to-back ops, averaged over ranks; algbw = size/time; busbw = algbw * its\n"
           "# factor); collie's own: lat_us, the median of one op posted and waited alone (the\n"
           "# slowest rank), and ops/s with --inflight ops in flight\n");
    fflush(stdout);
}

/* The column heads, before each collective's rows. */
void bench_print_heads(bench_op op) {
    printf("#\n# %s\n", bench_op_names[op]);
    printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
           "                 collie\n",
           "", "", "", "", "");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s  %9s  %10s\n", "size",
           "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
           "busbw", "#wrong", "lat_us", "ops/s");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s  %9s  %10s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "",
           "(us)", "");
}

/* time, algbw, busbw and #wrong of one placement ("N/A" where none). */
typedef struct bench_cols {
    char time[16], algbw[16], busbw[16], wrong[24];
} bench_cols;

static bench_cols bench_placement(const bench *b, bench_op op, const bench_counts *k, bool ran,
                                  double time_s, int64_t wrong) {
    bench_cols c = {"N/A", "N/A", "N/A", "N/A"};
    if (!ran) return c;
    double algbw = time_s > 0 ? (double)k->bytes / 1e9 / time_s : 0;
    bench_fmt_time(c.time, sizeof c.time, time_s * 1e6);
    snprintf(c.algbw, sizeof c.algbw, "%.2f", algbw);
    snprintf(c.busbw, sizeof c.busbw, "%.2f", algbw * bench_busbw_factor(op, b->size));
    if (b->o->check && op != BENCH_BARRIER) snprintf(c.wrong, sizeof c.wrong, "%" PRId64, wrong);
    return c;
}

void bench_print_row(bench *b, bench_op op, const bench_counts *k, double lat_s, double ops_s) {
    bool bw = op != BENCH_BARRIER;
    double algbw = b->avg[0] > 0 ? (double)k->bytes / 1e9 / b->avg[0] : 0;
    double busbw = algbw * bench_busbw_factor(op, b->size);
    if (bw) {
        b->busbw_sum += busbw;
        b->busbw_rows++;
    }
    if (b->o->csv) {
        printf("%s,%zu,%d,%.3f,", bench_op_names[op], k->bytes, b->size, lat_s * 1e6);
        if (bw)
            printf("%.6f,%.6f", algbw, busbw);
        else
            printf(",");
        if (b->o->inflight)
            printf(",%.1f\n", ops_s);
        else
            printf(",\n");
        fflush(stdout);
        return;
    }
    bench_cols out = bench_placement(b, op, k, true, b->avg[0], b->wrong[0]);
    bench_cols in = bench_placement(b, op, k, b->o->inplace[op], b->avg[1], b->wrong[1]);
    char lat[16], opss[24] = "-";
    bench_fmt_time(lat, sizeof lat, lat_s * 1e6);
    if (b->o->inflight) snprintf(opss, sizeof opss, "%.0f", ops_s);
    printf("%12zu  %12zu  %8s  %6s  %6d  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s  %9s  %10s\n",
           k->bytes, k->param, bw ? bench_dtype_nccl_name(b->dt) : "none",
           bench_op_reduces(op) ? bench_redops[b->redop] : "none",
           bench_op_rooted(op) ? b->root : -1, out.time, out.algbw, out.busbw, out.wrong, in.time,
           in.algbw, in.busbw, in.wrong, lat, opss);
    fflush(stdout);
}

void bench_print_footer(bench *b) {
    if (b->o->csv) return;
    printf("#\n");
    if (b->o->check)
        printf("# Out of bounds values : %" PRId64 " %s\n", b->wrong_total,
               b->wrong_total ? "FAILED" : "OK");
    else
        printf("# Out of bounds values : N/A (no --check)\n");
    if (b->busbw_rows)
        printf("# Avg bus bandwidth    : %.3f GB/s (out of place, %d rows)\n",
               b->busbw_sum / b->busbw_rows, b->busbw_rows);
    printf("#\n");
}
