/* Checkpoint folders on disk: publishing a written folder so that a crash at
 * any instant leaves the old or the new checkpoint in place (never neither),
 * start-up recovery of what a crash left behind, and the fault-injection hook
 * that proves it (TWK_CRASH_AT). Design: server/README.md, "Crash consistency". */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "svc.h"

void svc_crash_point(const char *mode, const char *step) {
    const char *want = getenv("TWK_CRASH_AT"); /* nobody sets the environment after start-up */
    if (!want || !*want) return;
    char here[96];
    snprintf(here, sizeof here, "%s:%s", mode, step);
    if (strcmp(want, here)) return;
    fprintf(stderr, "twinkle serve: TWK_CRASH_AT=%s: exiting here\n", here);
    _exit(86);
}

/* fsync of one file or folder; 0 or -1 (errno set). */
static int sync_path(const char *path, int dir) {
    int fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

/* fsyncs every regular file in dir (one level: checkpoints are flat), then dir. */
static int sync_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    char p[2048];
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && lstat(p, &sb) == 0 && S_ISREG(sb.st_mode)) rc = sync_path(p, 0);
    }
    closedir(d);
    return rc == 0 ? sync_path(dir, 1) : rc;
}

/* The folder holding path (up = 1), its parent (2), ... */
static void parent_of(const char *path, int up, char *out, size_t len) {
    snprintf(out, len, "%s", path);
    for (int i = 0; i < up; i++) {
        char *slash = strrchr(out, '/');
        if (!slash || slash == out) {
            snprintf(out, len, "%s", slash == out ? "/" : ".");
            return;
        }
        *slash = 0;
    }
}

/* Swaps two folders atomically; -1 with errno EINVAL/ENOSYS/... where the file system cannot. */
static int exchange(const char *a, const char *b) {
    const char *off = getenv("TWK_NO_RENAME_EXCHANGE"); /* tests: take the fallback path */
    if (off && *off && strcmp(off, "0")) {
        errno = EINVAL;
        return -1;
    }
    return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
}

int svc_ckpt_publish(const char *tmp, const char *dir, const char *old, int existed, char *err, size_t err_len) {
    return svc_ckpt_publish_mode(existed ? "overwrite" : "save", tmp, dir, old, existed, err, err_len);
}

int svc_ckpt_publish_mode(const char *mode, const char *tmp, const char *dir, const char *old, int existed, char *err,
                          size_t err_len) {
    svc_crash_point(mode, "written");
    if (sync_tree(tmp) != 0) {
        snprintf(err, err_len, "cannot sync %s: %s", tmp, strerror(errno));
        return -1;
    }
    svc_crash_point(mode, "synced");
    char parent[1600];
    parent_of(dir, 1, parent, sizeof parent);
    int exchanged = 0;
    if (!existed) {
        /* rename(2) refuses to replace a non-empty folder, so a racing publish cannot clobber one */
        if (rename(tmp, dir) != 0) {
            snprintf(err, err_len, "cannot publish %s: %s", dir, strerror(errno));
            return -1;
        }
        svc_crash_point(mode, "published");
    } else if (exchange(tmp, dir) == 0) {
        exchanged = 1; /* dir holds the new checkpoint, tmp the old one */
        svc_crash_point(mode, "exchanged");
    } else {
        /* no RENAME_EXCHANGE here: old aside, new in; start-up recovery puts .old-* back if a crash
         * comes between the two renames */
        if (rename(dir, old) != 0) {
            snprintf(err, err_len, "cannot replace %s: %s", dir, strerror(errno));
            return -1;
        }
        svc_crash_point(mode, "old-aside");
        if (sync_path(parent, 1) != 0 || rename(tmp, dir) != 0) {
            int e = errno;
            rename(old, dir); /* if this fails too, start-up recovery puts .old-* back */
            snprintf(err, err_len, "cannot publish %s: %s", dir, strerror(e));
            return -1;
        }
        svc_crash_point(mode, "published");
    }
    /* the renames are durable once the folder holding them is synced (and, for a new run or kind
     * folder, the folders above it) */
    char up[1600];
    for (int i = 1; i <= 3; i++) {
        parent_of(dir, i, up, sizeof up);
        if (sync_path(up, 1) != 0 && i == 1) {
            snprintf(err, err_len, "cannot sync %s: %s", up, strerror(errno));
            return -1;
        }
    }
    svc_crash_point(mode, "dir-synced");
    if (existed) {
        svc_rm_tree(exchanged ? tmp : old);
        svc_crash_point(mode, "old-removed");
    }
    return 0;
}

/* ".tmp-<name>-req-<hex>" / ".old-<name>-req-<hex>" → name; 0 if e is not such a leftover. */
static int leftover_name(const char *e, const char *prefix, char *name, size_t len) {
    size_t pl = strlen(prefix);
    if (strncmp(e, prefix, pl)) return 0;
    const char *req = NULL;
    for (const char *p = strstr(e + pl, "-req-"); p; p = strstr(p + 1, "-req-")) req = p;
    if (!req || req == e + pl || (size_t)(req - e - pl) >= len) return 0;
    memcpy(name, e + pl, (size_t)(req - e - pl));
    name[req - e - pl] = 0;
    return 1;
}

/* One DATA_DIR/checkpoints/<run>/<kind> folder (run NULL: a folder whose entries have no store
 * rows, DATA_DIR/spill: only the leftovers are handled). */
static void recover_kind(svc *s, const char *run, const char *kind, const char *kdir, int *n_fixed) {
    DIR *d = opendir(kdir);
    if (!d) return;
    /* names first (the loop below renames and removes entries) */
    char (*names)[256] = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || strlen(e->d_name) >= 256) continue;
        if (n == cap) {
            int old = cap;
            cap = cap ? 2 * cap : 16;
            void *p = twk_host_realloc(names, (size_t)old * sizeof *names, (size_t)cap * sizeof *names, "folder names");
            if (!p) break;
            names = p;
        }
        snprintf(names[n++], 256, "%s", e->d_name);
    }
    closedir(d);
    /* .old-* first: a crash between "old aside" and "new in" must put the old one back before the
     * .tmp-* (the unpublished new one) goes */
    for (int pass = 0; pass < 3; pass++)
        for (int i = 0; i < n; i++) {
            char name[256], path[2000], target[2000];
            snprintf(path, sizeof path, "%s/%s", kdir, names[i]);
            struct stat sb;
            if (lstat(path, &sb) != 0) continue;
            if (pass == 0 && leftover_name(names[i], ".old-", name, sizeof name)) {
                snprintf(target, sizeof target, "%s/%s", kdir, name);
                if (lstat(target, &sb) != 0 && rename(path, target) == 0) {
                    twk_log_info("recovery: %s was missing; restored the previous checkpoint from %s",
                            target, names[i]);
                } else {
                    svc_rm_tree(path);
                    twk_log_info("recovery: removed %s (replaced checkpoint left by a crash)", path);
                }
                (*n_fixed)++;
            } else if (pass == 1 && leftover_name(names[i], ".tmp-", name, sizeof name)) {
                svc_rm_tree(path);
                twk_log_info("recovery: removed %s (a save interrupted by a crash)", path);
                (*n_fixed)++;
            } else if (pass == 2 && run && names[i][0] != '.' && S_ISDIR(sb.st_mode)) {
                char ckid[400];
                int listed = 1;
                snprintf(ckid, sizeof ckid, "%s/%s", kind, names[i]);
                if (twk_store_ckpt_listed(s->store, run, ckid, &listed) == TWK_OK && !listed) {
                    svc_rm_tree(path);
                    twk_log_info("recovery: removed %s (published, but the crash came before it was recorded)", path);
                    (*n_fixed)++;
                }
            }
        }
    twk_host_free(names);
    sync_path(kdir, 1);
}

void svc_ckpt_recover(svc *s) {
    char root[1100];
    snprintf(root, sizeof root, "%s/checkpoints", s->cfg.data_dir);
    DIR *d = opendir(root);
    if (!d) return;
    int fixed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        const char *kinds[3] = {"weights", "sampler_weights", "external_weights"};
        for (int k = 0; k < 3; k++) {
            char kdir[1600];
            snprintf(kdir, sizeof kdir, "%s/%s/%s", root, e->d_name, kinds[k]);
            recover_kind(s, e->d_name, kinds[k], kdir, &fixed);
        }
    }
    closedir(d);
    if (fixed)
        twk_log_info("recovery: %d leftover checkpoint folder(s) handled", fixed);
}

void svc_ckpt_recover_folder(svc *s, const char *dir) {
    int fixed = 0;
    recover_kind(s, NULL, NULL, dir, &fixed);
}

/* The worker's half of a removal: the renamed-aside folder goes. */
static void rm_job_run(twk_job *j) { svc_rm_tree((const char *)j->arg); }
static void rm_job_done(twk_job *j) { twk_host_free(j); }

int svc_ckpt_remove(svc *s, const twk_store_ckpt *ck, char *err, size_t err_len) {
    if (twk_store_ckpt_delete(s->store, ck->tenant, ck->run_id, ck->checkpoint_id) != TWK_OK) {
        snprintf(err, err_len, "deleting checkpoint tinker://%s/%s failed: %s", ck->run_id, ck->checkpoint_id,
                 twk_last_error());
        return -1;
    }
    /* the row is gone (the commit point); ".tmp-<name>-req-del-<n>" is what recovery removes after a crash */
    char parent[1100], aside[2400];
    const char *name = strrchr(ck->path, '/');
    snprintf(parent, sizeof parent, "%.*s", name ? (int)(name - ck->path) : 0, ck->path);
    snprintf(aside, sizeof aside, "%s/.tmp-%s-req-del-%llu", parent, name ? name + 1 : ck->path, ++s->id_counter);
    const char *gone = rename(ck->path, aside) == 0 ? aside : ck->path;
    size_t n = strlen(gone) + 1;
    twk_job *j = twk_host_calloc(sizeof *j + n, "rm job");
    if (!j || !s->worker) {
        twk_host_free(j);
        svc_rm_tree(gone);
        return 0;
    }
    memcpy(j + 1, gone, n);
    j->arg = j + 1;
    twk_job_route(j, "", "checkpoint removal", 1);
    j->run = rm_job_run;
    j->done = rm_job_done;
    twk_worker_submit(s->worker, j);
    return 0;
}
