/*
 * reduce.h — element-wise reduction kernels and fp16/bf16 conversions for
 * transports that reduce CPU buffers (the TCP transport's progress thread).
 *
 * All functions are pure: no locks, no allocation, no logging; any thread
 * may call them on buffers it owns. Buffers may have any alignment (byte
 * offsets included). dtype and op are validated by the caller (at post
 * time, with cl_dtype_valid / cl_redop_valid of base/dtype.h); the kernels treat an invalid
 * dtype or op as a no-op rather than failing on the progress thread.
 */
#ifndef CL_TRANSPORTS_REDUCE_H
#define CL_TRANSPORTS_REDUCE_H

#include <stdbool.h>
#include <stddef.h>

#include "collie.h"

/* cl_reduce: dst[i] = dst[i] op src[i] for i < count. For COLLIE_AVG this
 * accumulates a sum; the caller divides once at the end with
 * cl_reduce_finalize_avg. dst == src is allowed; any other overlap is not.
 * Integer SUM/PROD wrap; fp16/bf16 are computed in float and rounded to
 * nearest-even; fp MIN/MAX propagate NaN and order -0 below +0. count 0
 * touches nothing (the pointers may then be NULL). */
void cl_reduce(void *dst, const void *src, size_t count, collie_dtype dt, collie_redop op);

/* cl_reduce3: dst[i] = a[i] op b[i] for i < count, in one pass (saves the
 * transport a copy of `a` into `dst`). dst may be a, b, both or neither, but
 * must not partially overlap either. The result does not depend on which
 * operands alias (up to NaN payloads). */
void cl_reduce3(void *dst, const void *a, const void *b, size_t count, collie_dtype dt,
                collie_redop op);

/* cl_reduce_finalize_avg: buf[i] /= nranks, turning a SUM accumulated for
 * COLLIE_AVG into the average. Integers truncate toward zero, reading the
 * (possibly wrapped) sum as signed for int8/int32/int64 and unsigned for
 * uint8; fp16/bf16 divide in float; fp32/fp64 divide natively. nranks <= 1
 * or an invalid dtype leaves buf unchanged. */
void cl_reduce_finalize_avg(void *buf, size_t count, collie_dtype dt, int nranks);

/* cl_fp16_to_float / cl_bf16_to_float: widen `count` IEEE binary16 /
 * bfloat16 values (2 bytes each, any alignment) at src into dst. Exact for
 * every bit pattern; NaN payloads are kept. */
void cl_fp16_to_float(float *dst, const void *src, size_t count);
void cl_bf16_to_float(float *dst, const void *src, size_t count);

/* cl_float_to_fp16 / cl_float_to_bf16: narrow `count` floats into dst (2
 * bytes each, any alignment), rounding to nearest, ties to even; overflow
 * gives Inf; NaN gives a quiet NaN keeping the payload's top bits. */
void cl_float_to_fp16(void *dst, const float *src, size_t count);
void cl_float_to_bf16(void *dst, const float *src, size_t count);

#endif
