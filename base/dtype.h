/*
 * dtype.h — element types and reduction operators: validity, sizes, names.
 * Header-only, below every layer, so a backend sizes and names what it
 * moves without linking the core (the public collie_dtype_size,
 * collie_dtype_name and collie_redop_name, engine/dtype.c, are these).
 * The tables are indexed by the enum values: adding a member to
 * collie_dtype or collie_redop without a row here fails to compile.
 */
#ifndef CL_BASE_DTYPE_H
#define CL_BASE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>

#include "collie.h"

/* cl_dtype_valid / cl_redop_valid: whether `dt` / `op` names a member of
 * collie_dtype / collie_redop (not the COLLIE_NUM_* sentinels). */
static inline bool cl_dtype_valid(int dt) { return dt >= 0 && dt < COLLIE_NUM_DTYPES; }
static inline bool cl_redop_valid(int op) { return op >= 0 && op < COLLIE_NUM_REDOPS; }

/* cl_dtype_size: bytes per element; 0 for an invalid dtype. */
static inline size_t cl_dtype_size(collie_dtype dt) {
    static const size_t sizes[] = {
        [COLLIE_INT8] = 1, [COLLIE_UINT8] = 1, [COLLIE_INT32] = 4, [COLLIE_INT64] = 8,
        [COLLIE_FP16] = 2, [COLLIE_BF16] = 2,  [COLLIE_FP32] = 4,  [COLLIE_FP64] = 8,
    };
    _Static_assert(sizeof sizes / sizeof sizes[0] == COLLIE_NUM_DTYPES,
                   "one size per collie_dtype");
    return cl_dtype_valid((int)dt) ? sizes[dt] : 0;
}

/* cl_dtype_name / cl_redop_name: "fp32", "sum"; "?" for an invalid one. */
static inline const char *cl_dtype_name(collie_dtype dt) {
    static const char *const names[] = {
        [COLLIE_INT8] = "int8",   [COLLIE_UINT8] = "uint8", [COLLIE_INT32] = "int32",
        [COLLIE_INT64] = "int64", [COLLIE_FP16] = "fp16",   [COLLIE_BF16] = "bf16",
        [COLLIE_FP32] = "fp32",   [COLLIE_FP64] = "fp64",
    };
    _Static_assert(sizeof names / sizeof names[0] == COLLIE_NUM_DTYPES,
                   "one name per collie_dtype");
    return cl_dtype_valid((int)dt) ? names[dt] : "?";
}

static inline const char *cl_redop_name(collie_redop op) {
    static const char *const names[] = {
        [COLLIE_SUM] = "sum", [COLLIE_PROD] = "prod", [COLLIE_MIN] = "min",
        [COLLIE_MAX] = "max", [COLLIE_AVG] = "avg",
    };
    _Static_assert(sizeof names / sizeof names[0] == COLLIE_NUM_REDOPS,
                   "one name per collie_redop");
    return cl_redop_valid((int)op) ? names[op] : "?";
}

#endif
