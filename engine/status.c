/*
 * status.c — the library's identity and its status codes: collie_version,
 * and collie_strerror, collie_status_name and cl_status_is_error,
 * generated from the one table of status codes (COLLIE_STATUS_MAP in
 * collie.h).
 */
#include <stddef.h>

#include "collie.h"
#include "engine/common.h"

#define CL_STR_(x) #x
#define CL_STR(x)  CL_STR_(x)

int collie_version(void) { return COLLIE_VERSION; }

const char *collie_version_string(void) {
    return CL_STR(COLLIE_VERSION_MAJOR) "." CL_STR(COLLIE_VERSION_MINOR) "." CL_STR(
        COLLIE_VERSION_PATCH);
}

const char *collie_strerror(int status) {
    switch (status) {
#define CL_STATUS_TEXT(name, value, text)                                                          \
    case value: return text;
        COLLIE_STATUS_MAP(CL_STATUS_TEXT)
#undef CL_STATUS_TEXT
    }
    return "unknown status";
}

const char *collie_status_name(int status) {
    switch (status) {
#define CL_STATUS_NAME(name, value, text)                                                          \
    case value: return "COLLIE_" #name;
        COLLIE_STATUS_MAP(CL_STATUS_NAME)
#undef CL_STATUS_NAME
    }
    return "COLLIE_UNKNOWN";
}

bool cl_status_is_error(long status) {
    switch (status) {
#define CL_STATUS_KNOWN(name, value, text) case value:
        COLLIE_STATUS_MAP(CL_STATUS_KNOWN)
#undef CL_STATUS_KNOWN
        return status < 0;
    }
    return false;
}
