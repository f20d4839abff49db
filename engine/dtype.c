/*
 * dtype.c — element types and reduction operators: sizes, names, validity.
 * The tables are indexed by the enum values, so adding a member to
 * collie_dtype or collie_redop without a row here fails to compile.
 */
#include "engine/dtype.h"

#include "collie.h"

static const struct {
    size_t size;
    const char *name;
} dtype_table[] = {
    [COLLIE_INT8] = {1, "int8"},   [COLLIE_UINT8] = {1, "uint8"}, [COLLIE_INT32] = {4, "int32"},
    [COLLIE_INT64] = {8, "int64"}, [COLLIE_FP16] = {2, "fp16"},   [COLLIE_BF16] = {2, "bf16"},
    [COLLIE_FP32] = {4, "fp32"},   [COLLIE_FP64] = {8, "fp64"},
};

static const char *const redop_names[] = {
    [COLLIE_SUM] = "sum", [COLLIE_PROD] = "prod", [COLLIE_MIN] = "min",
    [COLLIE_MAX] = "max", [COLLIE_AVG] = "avg",
};

_Static_assert(sizeof dtype_table / sizeof dtype_table[0] == COLLIE_NUM_DTYPES,
               "dtype_table must have one row per collie_dtype");
_Static_assert(sizeof redop_names / sizeof redop_names[0] == COLLIE_NUM_REDOPS,
               "redop_names must have one row per collie_redop");

bool cl_dtype_valid(int dt) { return dt >= 0 && dt < COLLIE_NUM_DTYPES; }

bool cl_redop_valid(int op) { return op >= 0 && op < COLLIE_NUM_REDOPS; }

size_t collie_dtype_size(collie_dtype dt) {
    return cl_dtype_valid((int)dt) ? dtype_table[dt].size : 0;
}

const char *collie_dtype_name(collie_dtype dt) {
    return cl_dtype_valid((int)dt) ? dtype_table[dt].name : "?";
}

const char *collie_redop_name(collie_redop op) {
    return cl_redop_valid((int)op) ? redop_names[op] : "?";
}
