/*
 * backend.c — the backend registry, plugin loading and spec parsing.
 *
 * Design notes
 *  - Registered backends live in a small fixed table under one mutex;
 *    entries are never removed, so a looked-up ops pointer stays valid for
 *    the life of the process (plugins are never dlclose'd).
 *  - Names are compared case-insensitively everywhere ("TCP" == "tcp").
 *  - A name that is not registered is looked for as a plugin,
 *    libcollie_<name>.so in the COLLIE_PLUGIN_PATH directories or, when it
 *    is unset, beside the running libcollie (found with dladdr, so a
 *    relocated or DESTDIR install works): collie/ and then the directory of
 *    libcollie.so itself, or for a program linked with libcollie.a,
 *    ../lib/collie and ../lib from the program (an installed tool in bin/,
 *    the build tree's build/bin); then the default library search path.
 *    Its collie_backend_plugin_v3() must return
 *    ops with the ABI version this core speaks (checked before use). A
 *    plugin exporting only the ABI-2 entry point (collie_backend_plugin_v1)
 *    is refused with a message naming both versions: ABI 2 handed plugins
 *    libevent's event_base, which no longer exists in the services table.
 *  - The registry holds the core's copy of each ops table, zero-filled past
 *    the size the backend declared: optional hooks appended after the
 *    backend was built read as NULL.
 *  - Spec grammar: "name" (the backend's own device) or a comma list of
 *    "device:name" with devices cpu and cuda, each at most once.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>

#include "comm/comm.h"
#include "engine/engine.h"

#define CL_MAX_BACKENDS 32
/* the entry point of plugins built for ABI 1 and 2 (refused, by name) */
#define CL_OLD_PLUGIN_SYMBOL "collie_backend_plugin_v1"

static pthread_mutex_t cl_backends_mu = PTHREAD_MUTEX_INITIALIZER;
/* the core's copies of the registered tables, zero-filled past their size */
static collie_backend_ops cl_backend_copies[CL_MAX_BACKENDS];
static const collie_backend_ops *cl_backends[CL_MAX_BACKENDS];
static size_t cl_nbackends;

/* The smallest table a backend may hand over: every required hook. */
#define CL_OPS_MIN_SIZE offsetof(collie_backend_ops, wait_stream)
static bool cl_builtins_done;

static const collie_backend_ops *backend_find_locked(const char *name) {
    for (size_t i = 0; i < cl_nbackends; i++)
        if (strcasecmp(cl_backends[i]->name, name) == 0) return cl_backends[i];
    return NULL;
}

static int backend_check_ops(const collie_backend_ops *ops, const char *origin) {
    if (!ops) return cl_set_last_error(COLLIE_EINVAL, "%s: backend ops are NULL", origin);
    if (ops->abi_version != COLLIE_BACKEND_ABI_VERSION)
        return cl_set_last_error(COLLIE_ENOTSUP,
                                 "%s: backend ABI version %u, but this collie speaks version %u",
                                 origin, ops->abi_version, COLLIE_BACKEND_ABI_VERSION);
    if (ops->size < CL_OPS_MIN_SIZE)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "%s: backend ops size %u is too small (set .size = "
                                 "sizeof(collie_backend_ops); at least %zu)",
                                 origin, ops->size, (size_t)CL_OPS_MIN_SIZE);
    if (!ops->name || !ops->name[0] || strlen(ops->name) > 32)
        return cl_set_last_error(COLLIE_EINVAL, "%s: backend has no valid name", origin);
    for (const char *p = ops->name; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-')
            return cl_set_last_error(COLLIE_EINVAL, "%s: backend name '%s' has a '%c'", origin,
                                     ops->name, *p);
    if (!ops->device || (strcmp(ops->device, "cpu") != 0 && strcmp(ops->device, "cuda") != 0))
        return cl_set_last_error(COLLIE_EINVAL, "%s: backend '%s' device must be cpu or cuda",
                                 origin, ops->name);
    if (!ops->init || !ops->start || !ops->detach || !ops->abort || !ops->destroy)
        return cl_set_last_error(COLLIE_EINVAL,
                                 "%s: backend '%s' lacks a hook (init, start, detach, abort "
                                 "and destroy are required)",
                                 origin, ops->name);
    return COLLIE_OK;
}

static int backend_add_locked(const collie_backend_ops *ops, const char *origin) {
    int r = backend_check_ops(ops, origin);
    if (r != COLLIE_OK) return r;
    if (backend_find_locked(ops->name))
        return cl_set_last_error(COLLIE_EEXIST, "%s: a backend named '%s' is already registered",
                                 origin, ops->name);
    if (cl_nbackends == CL_MAX_BACKENDS)
        return cl_set_last_error(COLLIE_ELIMIT, "%s: too many backends (%d)", origin,
                                 CL_MAX_BACKENDS);
    /* our own copy: hooks past the backend's size are NULL, not whatever
     * follows its table in memory */
    collie_backend_ops *copy = &cl_backend_copies[cl_nbackends];
    memset(copy, 0, sizeof *copy);
    memcpy(copy, ops, ops->size < sizeof *copy ? ops->size : sizeof *copy);
    copy->size = sizeof *copy;
    cl_backends[cl_nbackends++] = copy;
    return COLLIE_OK;
}

static void backend_builtins_locked(void) {
    if (cl_builtins_done) return;
    cl_builtins_done = true;
    for (size_t i = 0; cl_builtin_backends[i]; i++)
        backend_add_locked(cl_builtin_backends[i](), "built-in");
}

int collie_backend_register(const collie_backend_ops *ops) {
    pthread_mutex_lock(&cl_backends_mu);
    backend_builtins_locked();
    int r = backend_add_locked(ops, "collie_backend_register");
    pthread_mutex_unlock(&cl_backends_mu);
    return r;
}

/* Try dlopen of one candidate path; on success register and return ops. */
static int backend_try_plugin(const char *path, const collie_backend_ops **out, char *why,
                              size_t whylen) {
    bool has_dir = strchr(path, '/') != NULL;
    if (has_dir && access(path, F_OK) != 0) return COLLIE_ENOENT; /* not in this directory */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *err = dlerror();
        if (!err) err = "dlopen failed";
        /* searched by name: is it the plugin that is missing, or something
         * the plugin needs (libnccl.so.2, libcudart.so.13)? */
        if (!has_dir && strncmp(err, path, strlen(path)) == 0 && strstr(err, "No such file"))
            return COLLIE_ENOENT;
        snprintf(why, whylen, "%s%s", err,
                 strstr(err, "cannot open shared object")
                     ? " (a library the plugin needs is not installed or not on the library path)"
                     : "");
        return COLLIE_EBACKEND;
    }
    const collie_backend_ops *(*entry)(void);
    *(void **)&entry = dlsym(h, COLLIE_BACKEND_PLUGIN_SYMBOL);
    if (!entry) {
        if (dlsym(h, CL_OLD_PLUGIN_SYMBOL)) {
            snprintf(why, whylen,
                     "%s was built for backend ABI 2 or older (it exports %s); this collie "
                     "speaks backend ABI %d (%s): rebuild it against this collie_backend.h",
                     path, CL_OLD_PLUGIN_SYMBOL, COLLIE_BACKEND_ABI_VERSION,
                     COLLIE_BACKEND_PLUGIN_SYMBOL);
            dlclose(h);
            return COLLIE_ENOTSUP;
        }
        snprintf(why, whylen, "%s does not export %s", path, COLLIE_BACKEND_PLUGIN_SYMBOL);
        dlclose(h);
        return COLLIE_EINVAL;
    }
    const collie_backend_ops *ops = entry();
    int r = backend_check_ops(ops, path);
    if (r != COLLIE_OK) {
        snprintf(why, whylen, "%s", collie_last_error());
        dlclose(h);
        return r;
    }
    r = backend_add_locked(ops, path);
    if (r == COLLIE_EEXIST) { /* same plugin found twice: use the registered one */
        *out = backend_find_locked(ops->name);
        return COLLIE_OK;
    }
    if (r != COLLIE_OK) {
        snprintf(why, whylen, "%s", collie_last_error());
        dlclose(h);
        return r;
    }
    CL_INFO("backend", "loaded plugin '%s' from %s", ops->name, path);
    *out = backend_find_locked(ops->name); /* our copy; never dlclose'd: it points into it */
    return COLLIE_OK;
}

/* The plugin directories when COLLIE_PLUGIN_PATH is unset, ':'-separated,
 * from where the code of this function was loaded. */
static void backend_default_dirs(char *dirs, size_t len) {
    dirs[0] = '\0';
    Dl_info info;
    char path[4096];
    if (!dladdr((void *)&backend_default_dirs, &info) || !info.dli_fname) return;
    const char *base = strrchr(info.dli_fname, '/');
    bool shared = strncmp(base ? base + 1 : info.dli_fname, "libcollie", 9) == 0;
    if (shared) {
        if (!realpath(info.dli_fname, path)) return;
    } else { /* linked into the program: dli_fname is argv[0], maybe relative */
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
        if (n <= 0) return;
        path[n] = '\0';
    }
    char *slash = strrchr(path, '/');
    if (!slash) return;
    *slash = '\0';
    if (shared)
        snprintf(dirs, len, "%s/collie:%s", path, path);
    else
        snprintf(dirs, len, "%s/../lib/collie:%s/../lib", path, path);
}

static int backend_load_plugin_locked(const char *name, const collie_backend_ops **out) {
    char lower[40];
    size_t n = strlen(name);
    for (size_t i = 0; i <= n; i++)
        lower[i] = (char)tolower((unsigned char)name[i]);
    char file[64], path[4096], why[512] = "";
    snprintf(file, sizeof file, "libcollie_%s.so", lower);
    const char *dirs = cl_config_get()->plugin_path;
    char beside[2 * 4096 + 32];
    if (!dirs) {
        backend_default_dirs(beside, sizeof beside);
        dirs = beside;
    }
    int last = COLLIE_ENOENT;
    if (dirs) {
        const char *p = dirs;
        while (*p) {
            size_t len = strcspn(p, ":");
            if (len > 0) {
                snprintf(path, sizeof path, "%.*s/%s", (int)len, p, file);
                last = backend_try_plugin(path, out, why, sizeof why);
                if (last == COLLIE_OK) return COLLIE_OK;
                if (last != COLLIE_ENOENT) break; /* found but broken: report it */
            }
            p += len + (p[len] == ':');
        }
    }
    if (last == COLLIE_ENOENT) {
        last = backend_try_plugin(file, out, why, sizeof why);
        if (last == COLLIE_OK) return COLLIE_OK;
    }
    if (last == COLLIE_ENOENT)
        return cl_set_last_error(
            COLLIE_EINVAL,
            "unknown backend '%s': not built in, not registered, and no "
            "plugin %s in %s (%s) or the library path",
            name, file,
            dirs == beside ? "the directories beside libcollie (COLLIE_PLUGIN_PATH is unset)"
                           : "COLLIE_PLUGIN_PATH",
            dirs);
    return cl_set_last_error(last, "backend '%s': plugin %s is unusable: %s", name, file, why);
}

static int backend_get(const char *name, const collie_backend_ops **out) {
    pthread_mutex_lock(&cl_backends_mu);
    backend_builtins_locked();
    int r = COLLIE_OK;
    *out = backend_find_locked(name);
    if (!*out) r = backend_load_plugin_locked(name, out);
    pthread_mutex_unlock(&cl_backends_mu);
    return r;
}

static int device_index(const char *dev, size_t len) {
    if (len == 3 && strncasecmp(dev, "cpu", 3) == 0) return CL_DEV_CPU;
    if (len == 4 && strncasecmp(dev, "cuda", 4) == 0) return CL_DEV_CUDA;
    return -1;
}

int cl_backend_parse_spec(const char *spec, cl_backend_spec *out) {
    memset(out, 0, sizeof *out);
    if (!spec) spec = "auto";
    if (!spec[0]) return cl_set_last_error(COLLIE_EINVAL, "backend spec is empty");
    const char *p = spec;
    while (*p) {
        size_t len = strcspn(p, ",");
        char item[80];
        if (len == 0 || len >= sizeof item)
            return cl_set_last_error(COLLIE_EINVAL, "backend spec '%s': empty or overlong item",
                                     spec);
        memcpy(item, p, len);
        item[len] = '\0';
        char *colon = strchr(item, ':');
        const char *name = colon ? colon + 1 : item;
        int dev = -1;
        if (colon) {
            dev = device_index(item, (size_t)(colon - item));
            if (dev < 0)
                return cl_set_last_error(COLLIE_EINVAL,
                                         "backend spec '%s': unknown device '%.*s' (use cpu or "
                                         "cuda)",
                                         spec, (int)(colon - item), item);
        }
        if (!name[0])
            return cl_set_last_error(COLLIE_EINVAL, "backend spec '%s': missing backend name",
                                     spec);
        /* the name becomes part of a file name: letters, digits, '_', '-' */
        if (strlen(name) > 32)
            return cl_set_last_error(COLLIE_EINVAL, "backend spec '%s': name '%s' is too long",
                                     spec, name);
        for (const char *q = name; *q; q++)
            if (!isalnum((unsigned char)*q) && *q != '_' && *q != '-')
                return cl_set_last_error(COLLIE_EINVAL,
                                         "backend spec '%s': backend name '%s' has a '%c' (use "
                                         "letters, digits, '_' and '-')",
                                         spec, name, *q);
        const collie_backend_ops *ops;
        int r = backend_get(name, &ops);
        if (r != COLLIE_OK) return r;
        int own = device_index(ops->device, strlen(ops->device));
        if (dev < 0) dev = own;
        if (dev != own)
            return cl_set_last_error(COLLIE_EINVAL,
                                     "backend spec '%s': backend '%s' serves %s buffers, not "
                                     "%s",
                                     spec, ops->name, ops->device,
                                     dev == CL_DEV_CPU ? "cpu" : "cuda");
        if (out->ops[dev])
            return cl_set_last_error(COLLIE_EINVAL, "backend spec '%s': device %s given twice",
                                     spec, dev == CL_DEV_CPU ? "cpu" : "cuda");
        out->ops[dev] = ops;
        p += len + (p[len] == ',');
    }
    return COLLIE_OK;
}
