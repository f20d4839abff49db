/*
 * builtin.c — the backends compiled into libcollie, in registration order.
 * comm/'s backend registry reads this list (declared in comm/comm.h); it is
 * the one place that names the built-in transports, so comm/ needs no
 * header of the layer above it.
 */
#include "collie_backend.h"
#include "transports/cpu/cpu.h"

const collie_backend_ops *(*const cl_builtin_backends[])(void) = {
    cl_auto_backend_ops,
    cl_tcp_backend_ops,
    cl_shm_backend_ops,
    NULL,
};
