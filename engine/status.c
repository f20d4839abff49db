/*
 * status.c — the one table of status codes: name and description.
 */
#include <stddef.h>

#include "collie.h"

static const struct {
    int code;
    const char *name;
    const char *text;
} cl_status_table[] = {
    {COLLIE_OK, "COLLIE_OK", "success"},
    {COLLIE_INPROGRESS, "COLLIE_INPROGRESS", "operation in progress"},
    {COLLIE_EINVAL, "COLLIE_EINVAL", "invalid argument"},
    {COLLIE_ENOMEM, "COLLIE_ENOMEM", "out of memory"},
    {COLLIE_ETIMEDOUT, "COLLIE_ETIMEDOUT", "operation timed out"},
    {COLLIE_ECANCELED, "COLLIE_ECANCELED", "operation cancelled"},
    {COLLIE_EABORTED, "COLLIE_EABORTED", "operation aborted"},
    {COLLIE_EPEER, "COLLIE_EPEER", "peer died or closed the connection"},
    {COLLIE_ECLOSED, "COLLIE_ECLOSED", "object closed"},
    {COLLIE_ENOTMEMBER, "COLLIE_ENOTMEMBER", "not a member of the group"},
    {COLLIE_EBACKEND, "COLLIE_EBACKEND", "backend error"},
    {COLLIE_EPROTO, "COLLIE_EPROTO", "protocol error or mismatch between ranks"},
    {COLLIE_EAUTH, "COLLIE_EAUTH", "authentication failed"},
    {COLLIE_ENOTSUP, "COLLIE_ENOTSUP", "not supported"},
    {COLLIE_ESTATE, "COLLIE_ESTATE", "invalid state for this call"},
    {COLLIE_ESYSTEM, "COLLIE_ESYSTEM", "system call failed"},
    {COLLIE_ELIMIT, "COLLIE_ELIMIT", "limit exceeded"},
    {COLLIE_EEXIST, "COLLIE_EEXIST", "already exists"},
    {COLLIE_ENOENT, "COLLIE_ENOENT", "no such object"},
};

#define CL_NSTATUS (sizeof cl_status_table / sizeof cl_status_table[0])

const char *collie_strerror(int status) {
    for (size_t i = 0; i < CL_NSTATUS; i++)
        if (cl_status_table[i].code == status) return cl_status_table[i].text;
    return "unknown status";
}

const char *collie_status_name(int status) {
    for (size_t i = 0; i < CL_NSTATUS; i++)
        if (cl_status_table[i].code == status) return cl_status_table[i].name;
    return "COLLIE_UNKNOWN";
}
