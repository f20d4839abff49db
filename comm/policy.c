/*
 * policy.c — the error policy from the environment.
 *
 * COLLIE_BLOCKING_WAIT=1 selects BLOCKING_WAIT; COLLIE_ASYNC_ERROR_HANDLING
 * takes a name or PyTorch's numbers (0 none, 1 and 3 abort_process,
 * 2 abort_comm). Asking for both blocking-wait and a non-zero async mode is
 * a conflict, reported as such — never resolved silently.
 */
#include <string.h>
#include <strings.h>

#include "comm/comm.h"
#include "engine/engine.h"

int cl_comm_policy_from_env(collie_error_policy *out) {
    const cl_config *cfg = cl_config_get();
    bool blocking = false;
    if (cfg->blocking_wait) {
        const char *v = cfg->blocking_wait;
        if (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"))
            blocking = true;
        else if (strcmp(v, "0") && strcasecmp(v, "false") && strcasecmp(v, "no"))
            return cl_set_last_error(COLLIE_EINVAL,
                                     "COLLIE_BLOCKING_WAIT='%s' is invalid: expected 0 or 1", v);
    }
    collie_error_policy async = COLLIE_POLICY_ABORT_COMM;
    bool async_set = false;
    if (cfg->async_error) {
        static const struct {
            const char *name;
            collie_error_policy p;
        } names[] = {{"0", COLLIE_POLICY_NONE},
                     {"none", COLLIE_POLICY_NONE},
                     {"1", COLLIE_POLICY_ABORT_PROCESS},
                     {"3", COLLIE_POLICY_ABORT_PROCESS},
                     {"abort_process", COLLIE_POLICY_ABORT_PROCESS},
                     {"2", COLLIE_POLICY_ABORT_COMM},
                     {"abort_comm", COLLIE_POLICY_ABORT_COMM}};
        size_t i;
        for (i = 0; i < sizeof names / sizeof names[0]; i++)
            if (!strcasecmp(cfg->async_error, names[i].name)) break;
        if (i == sizeof names / sizeof names[0])
            return cl_set_last_error(COLLIE_EINVAL,
                                     "COLLIE_ASYNC_ERROR_HANDLING='%s' is invalid: expected "
                                     "abort_comm, abort_process, none, 0, 1, 2 or 3",
                                     cfg->async_error);
        async = names[i].p;
        async_set = async != COLLIE_POLICY_NONE;
    }
    if (blocking && async_set)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "COLLIE_BLOCKING_WAIT=1 conflicts with "
                                 "COLLIE_ASYNC_ERROR_HANDLING='%s': choose one error policy",
                                 cfg->async_error);
    *out = blocking ? COLLIE_POLICY_BLOCKING_WAIT : async;
    return COLLIE_OK;
}
