/*
 * token_file.c — a job's secret from a --token-file (token_file.h has the
 * design notes).
 */
#include "tools/common/token_file.h"

#include <errno.h>
#include <stdbool.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int tool_token_file_read(const char *prog, const char *path, char *buf, size_t cap) {
    if (cap < TOOL_TOKEN_MAX + 2) {
        fprintf(stderr, "%s: internal error: token buffer of %zu bytes\n", prog, cap);
        return 1;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "%s: cannot open the token file %s: %s\n", prog, path, strerror(errno));
        return 1;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        fprintf(stderr, "%s: cannot stat the token file %s: %s\n", prog, path, strerror(errno));
        fclose(f);
        return 1;
    }
    if ((sb.st_mode & 077) != 0) {
        fprintf(stderr,
                "%s: the token file %s can be read or written by group or others (mode %04o): "
                "keep it readable by its owner only (chmod 600 %s)\n",
                prog, path, (unsigned)(sb.st_mode & 07777), path);
        fclose(f);
        return 2;
    }
    size_t n = fread(buf, 1, TOOL_TOKEN_MAX + 1, f);
    bool more = fgetc(f) != EOF; /* more than a secret and its newline */
    fclose(f);
    while (n > 0 &&
           (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    if (more || n == 0 || n > TOOL_TOKEN_MAX || memchr(buf, '\0', n)) {
        fprintf(stderr, "%s: the token file %s must hold 1 to %d bytes, without NUL\n", prog, path,
                TOOL_TOKEN_MAX);
        OPENSSL_cleanse(buf, cap);
        return 2;
    }
    buf[n] = '\0';
    return 0;
}
