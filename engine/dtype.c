/*
 * dtype.c — the public names of base/dtype.h's helpers (collie.h):
 * collie_dtype_size, collie_dtype_name, collie_redop_name.
 */
#include "base/dtype.h"

size_t collie_dtype_size(collie_dtype dt) { return cl_dtype_size(dt); }

const char *collie_dtype_name(collie_dtype dt) { return cl_dtype_name(dt); }

const char *collie_redop_name(collie_redop op) { return cl_redop_name(op); }
