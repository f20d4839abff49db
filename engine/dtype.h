/*
 * dtype.h — element types and reduction operators: validity (sizes and
 * names are public: collie_dtype_size, collie_dtype_name, collie_redop_name).
 * The lowest layer owns them: the collectives' core checks arguments with
 * them and every transport sizes buffers with them.
 */
#ifndef CL_ENGINE_DTYPE_H
#define CL_ENGINE_DTYPE_H

#include <stdbool.h>

/* cl_dtype_valid / cl_redop_valid: whether `dt` / `op` names a member of
 * collie_dtype / collie_redop (not the COLLIE_NUM_* sentinels). */
bool cl_dtype_valid(int dt);
bool cl_redop_valid(int op);

#endif
