/*
 * test_docs.c — the tables of the documentation that mirror the code are
 * the code's, and the guide's examples and links are real.
 *
 * Design notes
 *  - Each check reads the files a reader reads (README.md, docs/ pages) and
 *    compares them with what the code says, in both directions where a row
 *    could go stale: the settings table is cl_config_print_table's output
 *    verbatim (docs/settings.md); every status of COLLIE_STATUS_MAP has its
 *    row `| COLLIE_X | value | collie_strerror text |` in docs/api.md and the
 *    Statuses table has no other row; every function declared in
 *    the headers of include/ is named in docs/api.md, and every collie_* name in the
 *    docs exists in the headers of include/.
 *  - Links: every relative Markdown link in README.md and docs/ pages points at
 *    a file that exists (and at a heading of it, for #anchors), and every
 *    path of the source tree named in backquotes exists.
 *  - The README's C and Python examples are examples/hello.c and
 *    examples/hello.py verbatim (from their first #include / import line);
 *    both are run under collie-run and their sums checked.
 *  - Tests run from the repository root (as the runner starts them).
 */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/config.h"
#include "harness.h"
#include "runner.h"
#include "spawn.h"

#define README_MAX_LINES 250
#define JOB_TIMEOUT_MS   60000

/* The whole file, NUL-terminated; fails the test when it cannot be read. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot read %s (tests run from the repository root)", path);
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    char chunk[8192];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        fwrite(chunk, 1, n, mem);
    fclose(f);
    fclose(mem);
    return buf;
}

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* `word` occurs in `text` as a whole identifier. */
static bool has_word(const char *text, const char *word) {
    size_t n = strlen(word);
    for (const char *p = strstr(text, word); p; p = strstr(p + 1, word))
        if ((p == text || !ident_char(p[-1])) && !ident_char(p[n])) return true;
    return false;
}

/* The documentation pages: README.md and docs/ pages (NULL-terminated; the
 * strings and the array are the caller's to free with free_pages). */
static char **doc_pages(void) {
    char **v = calloc(64, sizeof *v);
    int n = 0;
    v[n++] = strdup("README.md");
    DIR *d = opendir("docs");
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) && n < 63) {
        size_t l = strlen(e->d_name);
        if (l > 3 && strcmp(e->d_name + l - 3, ".md") == 0) {
            char *p = malloc(l + 6);
            sprintf(p, "docs/%s", e->d_name);
            v[n++] = p;
        }
    }
    closedir(d);
    return v;
}

static void free_pages(char **v) {
    for (int i = 0; v[i]; i++)
        free(v[i]);
    free(v);
}

/* ---- tables ------------------------------------------------------------------ */

static void test_settings_table(void **state) {
    (void)state;
    char *table = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&table, &len);
    cl_config_print_table(mem);
    fclose(mem);
    char *doc = slurp("docs/settings.md");
    if (!strstr(doc, table)) fail_msg("docs/settings.md lacks the settings table:\n%s", table);
    free(doc);
    free(table);
}

/* The rows of the "## Statuses" section of docs/api.md, one per code. */
static void test_statuses_table(void **state) {
    (void)state;
    char *doc = slurp("docs/api.md");
    int ncodes = 0;
#define DOC_STATUS_ROW_(name, value, text)                                                         \
    do {                                                                                           \
        char row[256];                                                                             \
        snprintf(row, sizeof row, "| `COLLIE_%s` | %d | %s |", #name, value, text);                \
        if (!strstr(doc, row)) fail_msg("docs/api.md lacks the status row\n%s", row);              \
        ncodes++;                                                                                  \
    } while (0);
    COLLIE_STATUS_MAP(DOC_STATUS_ROW_)
#undef DOC_STATUS_ROW_
    char *sec = strstr(doc, "\n## Statuses\n");
    if (!sec) {
        fail_msg("docs/api.md has no '## Statuses' section");
        return;
    }
    char *end = strstr(sec + 1, "\n## ");
    if (end) *end = '\0';
    int rows = 0;
    for (const char *p = strstr(sec, "\n| `COLLIE_"); p; p = strstr(p + 1, "\n| `COLLIE_"))
        rows++;
    if (rows != ncodes)
        fail_msg("docs/api.md's Statuses table has %d rows, COLLIE_STATUS_MAP %d codes", rows,
                 ncodes);
    free(doc);
}

/* The text of a header without comments and preprocessor lines: what is
 * left of `collie_x(` there is a declaration (or an inline definition). */
static void strip_c(char *s) {
    char *w = s;
    bool bol = true;
    for (char *p = s; *p;) {
        if (p[0] == '/' && p[1] == '*') {
            char *e = strstr(p + 2, "*/");
            p = e ? e + 2 : p + strlen(p);
            *w++ = ' ';
        } else if (p[0] == '/' && p[1] == '/') {
            p += strcspn(p, "\n");
        } else if (bol && *p == '#') { /* a directive, with its continuation lines */
            while (*p && !(*p == '\n' && p[-1] != '\\'))
                p++;
        } else {
            if (*p == '\n')
                bol = true;
            else if (!isspace((unsigned char)*p))
                bol = false;
            *w++ = *p++;
        }
    }
    *w = '\0';
}

static const char *const HEADERS[] = {"include/collie.h", "include/collie_store.h",
                                      "include/collie_comm.h", "include/collie_cuda.h",
                                      "include/collie_backend.h"};
#define NHEADERS (sizeof HEADERS / sizeof *HEADERS)

/* Every header file of include/ is one of HEADERS (a new one must be added). */
static void check_header_list(void) {
    DIR *d = opendir("include");
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 3 || strcmp(e->d_name + l - 2, ".h") != 0) continue;
        bool known = false;
        for (size_t i = 0; i < NHEADERS; i++)
            known |= strcmp(HEADERS[i] + strlen("include/"), e->d_name) == 0;
        if (!known) fail_msg("include/%s is not in test_docs.c's HEADERS", e->d_name);
    }
    closedir(d);
}

static void test_public_functions_documented(void **state) {
    (void)state;
    check_header_list();
    char *doc = slurp("docs/api.md");
    int nfn = 0;
    for (size_t h = 0; h < NHEADERS; h++) {
        char *s = slurp(HEADERS[h]);
        strip_c(s);
        for (char *p = strstr(s, "collie_"); p; p = strstr(p + 1, "collie_")) {
            if (p > s && ident_char(p[-1])) continue;
            size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");
            const char *q = p + n;
            while (*q == ' ' || *q == '\n')
                q++;
            if (*q != '(') continue;
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)n, p);
            if (!has_word(doc, name))
                fail_msg("%s declares %s, which docs/api.md does not name", HEADERS[h], name);
            nfn++;
        }
        free(s);
    }
    assert_true(nfn > 100); /* the parse found the declarations */
    free(doc);
}

/* Names of the Python package's log records (docs/python.md), not C. */
static const char *const NOT_C[] = {"collie_module", "collie_rank"};

static void test_documented_names_exist(void **state) {
    (void)state;
    char *hdr = NULL;
    size_t hlen = 0;
    FILE *mem = open_memstream(&hdr, &hlen);
    for (size_t h = 0; h < NHEADERS; h++) {
        char *s = slurp(HEADERS[h]);
        fputs(s, mem);
        free(s);
    }
    fclose(mem);
    char **pages = doc_pages();
    for (int i = 0; pages[i]; i++) {
        char *t = slurp(pages[i]);
        for (char *p = strstr(t, "collie_"); p; p = strstr(p + 1, "collie_")) {
            if (p > t && (ident_char(p[-1]) || p[-1] == '.' || p[-1] == '/')) continue;
            size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyz0123456789_");
            if (p[n] == '<' || p[n - 1] == '_' || p[n] == '.') continue; /* a pattern, a file */
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)n, p);
            bool skip = false;
            for (size_t k = 0; k < sizeof NOT_C / sizeof *NOT_C; k++)
                skip |= strcmp(name, NOT_C[k]) == 0;
            if (!skip && !has_word(hdr, name))
                fail_msg("%s names %s, which no header of include/ has", pages[i], name);
        }
        free(t);
    }
    free_pages(pages);
    free(hdr);
}

/* ---- links --------------------------------------------------------------------- */

/* GitHub's anchor of a heading: lower case, punctuation dropped, spaces
 * to '-'. */
static void slug(const char *heading, size_t n, char *out, size_t cap) {
    size_t w = 0;
    for (size_t i = 0; i < n && w + 1 < cap; i++) {
        unsigned char c = (unsigned char)heading[i];
        if (isalnum(c) || c == '-' || c == '_')
            out[w++] = (char)tolower(c);
        else if (c == ' ')
            out[w++] = '-';
    }
    out[w] = '\0';
}

static bool has_anchor(const char *path, const char *anchor) {
    char *t = slurp(path);
    bool found = false;
    for (char *p = t; p && *p && !found; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (*p != '#') continue;
        char *h = p + strspn(p, "#");
        h += strspn(h, " ");
        char s[256];
        slug(h, strcspn(h, "\n"), s, sizeof s);
        found = strcmp(s, anchor) == 0;
    }
    free(t);
    return found;
}

/* Broken links found so far: every one is reported, then the test fails. */
static int links_bad;

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* `target` of a link on page `page`: relative to the page's folder. */
static void check_link(const char *page, const char *target, size_t n) {
    char t[512], path[1024];
    snprintf(t, sizeof t, "%.*s", (int)n, target);
    if (strncmp(t, "http://", 7) == 0 || strncmp(t, "https://", 8) == 0 ||
        strncmp(t, "mailto:", 7) == 0)
        return;
    char *hash = strchr(t, '#');
    if (hash) *hash++ = '\0';
    if (t[0] == '\0')
        snprintf(path, sizeof path, "%s", page);
    else if (strchr(page, '/'))
        snprintf(path, sizeof path, "%.*s/%s", (int)(strrchr(page, '/') - page), page, t);
    else
        snprintf(path, sizeof path, "%s", t);
    if (!exists(path)) {
        print_error("%s links to %s: no such file (%s)\n", page, t, path);
        links_bad++;
    } else if (hash && *hash && strstr(path, ".md") && !has_anchor(path, hash)) {
        print_error("%s links to %s#%s: no such heading there\n", page, t, hash);
        links_bad++;
    }
}

/* The folders of the source tree whose paths the docs name in backquotes. */
static const char *const TREE[] = {"base/",     "bench/",   "comm/",    "docs/",       "engine/",
                                   "examples/", "gpu-kit/", "include/", "python/",     "scripts/",
                                   "store/",    "tests/",   "tools/",   "transports/", "work/"};

static void check_quoted_path(const char *page, const char *q, size_t n) {
    for (size_t i = 0; i < sizeof TREE / sizeof *TREE; i++) {
        size_t l = strlen(TREE[i]);
        if (n < l || strncmp(q, TREE[i], l) != 0) continue;
        if (strcspn(q, " <>*{}$|,`") < n) return; /* a pattern or a command, not a path */
        char path[512];
        snprintf(path, sizeof path, "%.*s", (int)n, q);
        char *colon = strchr(path, ':'); /* tests/x.py::Class */
        if (colon) *colon = '\0';
        if (!exists(path)) {
            print_error("%s names `%s`: no such file or folder\n", page, path);
            links_bad++;
        }
        return;
    }
}

static void test_links_resolve(void **state) {
    (void)state;
    char **pages = doc_pages();
    for (int i = 0; pages[i]; i++) {
        char *t = slurp(pages[i]);
        bool fence = false;
        for (char *line = t; line && *line;) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            if (strncmp(line, "```", 3) == 0)
                fence = !fence;
            else if (!fence) {
                for (char *p = strstr(line, "]("); p; p = strstr(p + 2, "]("))
                    check_link(pages[i], p + 2, strcspn(p + 2, ") "));
                for (char *p = strchr(line, '`'); p; p = strchr(p + 1, '`')) {
                    char *e = strchr(p + 1, '`');
                    if (!e) break;
                    check_quoted_path(pages[i], p + 1, (size_t)(e - p - 1));
                    p = e;
                }
            }
            line = nl ? nl + 1 : NULL;
        }
        free(t);
    }
    free_pages(pages);
    if (links_bad) fail_msg("%d broken links or paths in README.md and docs/ (above)", links_bad);
}

/* ---- the README --------------------------------------------------------------- */

static void test_readme_is_a_guide(void **state) {
    (void)state;
    char *t = slurp("README.md");
    int lines = 0;
    for (char *p = t; (p = strchr(p, '\n')); p++)
        lines++;
    if (lines > README_MAX_LINES)
        fail_msg("README.md has %d lines; the guide keeps to %d (the reference lives in docs/)",
                 lines, README_MAX_LINES);
    free(t);
}

/* The README holds `file` from its first line starting with `from`. */
static void readme_holds(const char *file, const char *from) {
    char *readme = slurp("README.md");
    char *ex = slurp(file);
    char *start = strstr(ex, from);
    assert_non_null(start);
    if (!strstr(readme, start))
        fail_msg("README.md's example is not %s (from '%s' on):\n%s", file, from, start);
    free(ex);
    free(readme);
}

/* every rank of 3 printed the example's line with the sum `sum` */
static void assert_each_rank_printed(spawn_proc *l, const char *sum) {
    for (int r = 0; r < 3; r++) {
        char want[80];
        snprintf(want, sizeof want, "[%d] rank %d: x[0] = %s (the sum over 3 ranks)\n", r, r, sum);
        assert_spawn(l, strstr(l->text[0], want));
    }
}

static void test_readme_c_example_runs(void **state) {
    (void)state;
    readme_holds("examples/hello.c", "#include <collie.h>");
    spawn_proc *l = spawn_start(
        "collie-run",
        (const char *const[]){"-n", "3", "--", spawn_build_path("examples/hello"), NULL}, NULL,
        JOB_TIMEOUT_MS);
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    assert_each_rank_printed(l, "3");
}

static void test_readme_python_example_runs(void **state) {
    (void)state;
    readme_holds("examples/hello.py", "import collie");
    if (system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0)
        skip_because("no numpy for /usr/bin/python3 (python3-numpy)");
    char cwd[512], pypath[600];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(pypath, sizeof pypath, "PYTHONPATH=%s/python", cwd);
    spawn_proc *l = spawn_start(
        "collie-run",
        (const char *const[]){"-n", "3", "--", "/usr/bin/python3", "examples/hello.py", NULL},
        (const char *const[]){pypath, NULL}, JOB_TIMEOUT_MS);
    spawn_finish(l);
    assert_spawn(l, l->status == 0);
    assert_each_rank_printed(l, "6.0");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_settings_table),
        cmocka_unit_test(test_statuses_table),
        cmocka_unit_test(test_public_functions_documented),
        cmocka_unit_test(test_documented_names_exist),
        cmocka_unit_test(test_links_resolve),
        cmocka_unit_test(test_readme_is_a_guide),
        cmocka_unit_test_teardown(test_readme_c_example_runs, spawn_teardown),
        cmocka_unit_test_teardown(test_readme_python_example_runs, spawn_teardown),
    };
    return cltest_main(tests, NULL, NULL);
}
