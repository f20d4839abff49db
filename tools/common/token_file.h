/*
 * token_file.h — reading a job's secret from a --token-file, the one way
 * every tool does it (collie-run, collie-store).
 *
 * Design notes: a secret others can read is none, so a file that group or
 * others can read or write is refused, as ssh refuses such a key; the mode
 * is checked on the opened file (fstat), so a rename between a check and the
 * open cannot swap it. Trailing whitespace (the newline) is dropped; an
 * empty secret, one longer than TOOL_TOKEN_MAX bytes, or one holding a NUL
 * byte is refused. Every refusal names the file and what to do; the secret
 * itself is never printed, and the read buffer is cleansed on refusal.
 */
#ifndef COLLIE_TOOLS_TOKEN_FILE_H
#define COLLIE_TOOLS_TOKEN_FILE_H

#include <stddef.h>

#define TOOL_TOKEN_MAX 4096 /* longest secret (the store's CL_STORE_TOKEN_MAX) */

/* Read the secret in `path` into buf (at least TOOL_TOKEN_MAX + 2 bytes),
 * NUL-terminated. Returns 0, or after printing "<prog>: <why>" to stderr:
 * 1 when the file cannot be opened or examined, 2 when it is refused
 * (loose mode, empty, too long, a NUL byte). */
int tool_token_file_read(const char *prog, const char *path, char *buf, size_t cap);

#endif
