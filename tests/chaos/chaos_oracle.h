/*
 * chaos_oracle.h — the chaos rank's inputs and reference outputs: what
 * every rank of a comm puts into an op, and what a reduction of them must
 * give, computed here independently of the library's kernels.
 *
 * Design notes
 *  - An input element is a pure function of (the op's key, a stream, the
 *    comm rank that owns it, its index): any rank can compute any other
 *    rank's input, so each rank checks its own outputs without talking.
 *    Streams tell apart the messages of one slot (alltoallv blocks, the
 *    k-th message of a sender, the two directions of an exchange).
 *  - Ops that only move data get raw random bytes (NaN patterns included:
 *    moving data must not touch them). Reducing ops get values whose
 *    results are exact in every dtype: integers wrap (computed unsigned, as
 *    collie.h says), so SUM/PROD/MIN/MAX take random bits, and AVG small
 *    values (its truncating division is applied to the wrapped sum by the
 *    library; small values keep that question out of the oracle); floats
 *    take small integers (SUM), +-1, +-2, +-1/2 (PROD), quarters (MIN/MAX),
 *    and for AVG the last rank's value makes every sum a multiple of the
 *    comm size, so the average is exact too. The reference folds in double
 *    (exact for these values) or in 64-bit integers masked to the width.
 *  - Comparison is bytewise: the first differing element is reported with
 *    both values.
 */
#ifndef CHAOS_ORACLE_H
#define CHAOS_ORACLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/chaos/chaos_prog.h"

/* ch_fill: elements [first, first+count) of comm rank `r`'s input for `op`
 * (comm size n) in stream `stream`, into dst. Reducing ops use op->op. */
void ch_fill(const ch_op *op, uint64_t stream, int r, int n, size_t first, size_t count, void *dst);

/* ch_expect_reduce: elements [first, first+count) of the reduction (op->op)
 * of every rank's stream-0 input, into dst. */
void ch_expect_reduce(const ch_op *op, int n, size_t first, size_t count, void *dst);

/* ch_first_diff: index of the first element where a and b differ, or
 * (size_t)-1 if equal. */
size_t ch_first_diff(const void *a, const void *b, size_t count, collie_dtype dt);

/* ch_elem_str: element i of buf as text (hex bits and value). */
void ch_elem_str(const void *buf, size_t i, collie_dtype dt, char *out, size_t cap);

/* fp16/bf16 <-> double for the values the oracle uses (exact ones). */
double ch_half_to_double(uint16_t h, bool bf16);
uint16_t ch_double_to_half(double v, bool bf16);

#endif
