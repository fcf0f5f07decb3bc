/* train/checkpoint.c — atomic, reshardable checkpoints (checkpoint.h). */
#define _DEFAULT_SOURCE /* flock */
#include "train/checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core/error.h"
#include "core/checksum.h"
#include "core/file.h"
#include "train/ckpt_manifest.h"

/* The files' magic by format: 3 added the run id to the header, 4 sums the
 * bytes with zpp_checksum instead of FNV-1a (core/checksum.h). */
static const char *const kCkptMagic[ZPP_CKPT_FORMAT + 1] = {
    [2] = "ZPPCKPT2", [3] = "ZPPCKPT3", [4] = "ZPPCKPT4"};
static const char *const kLocoMagic[ZPP_CKPT_FORMAT + 1] = {
    [2] = "ZPPLOCO1", [3] = "ZPPLOCO2", [4] = "ZPPLOCO3"};
#define CKPT_POINTER "checkpoint.json"
#define CKPT_MANIFEST "manifest.json"
#define CKPT_PATH 4096
#define FNV_INIT ZPP_FNV1A_INIT

/* ---- Small file-system helpers --------------------------------------------- */

static zpp_status join(char *buf, const char *a, const char *b) {
    if (snprintf(buf, CKPT_PATH, "%s/%s", a, b) >= CKPT_PATH)
        return zpp_error(ZPP_ERR_INVALID, "checkpoint: path too long: %s/%s", a, b);
    return ZPP_OK;
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static zpp_status fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0 || fsync(fd) != 0) {
        int err = errno;
        if (fd >= 0) close(fd);
        return zpp_error(ZPP_ERR_IO, "checkpoint: cannot sync directory %s: %s", dir,
                         strerror(err));
    }
    close(fd);
    return ZPP_OK;
}

/* mkdir -p */
static zpp_status make_dirs(const char *dir) {
    char p[CKPT_PATH];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return zpp_error(ZPP_ERR_INVALID, "checkpoint: path too long: %s", dir);
    for (char *s = p + 1;; s++) {
        int end = *s == '\0';
        if (*s == '/' || end) {
            *s = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST)
                return zpp_error(ZPP_ERR_IO, "cannot create checkpoint directory %s: %s", p,
                                 strerror(errno));
            if (!is_dir(p))
                return zpp_error(ZPP_ERR_IO,
                                 "cannot create checkpoint directory %s: %s is not a directory",
                                 dir, p);
            if (end) break;
            *s = '/';
        }
    }
    return ZPP_OK;
}

/* Removes a step folder: its files, then itself (a folder holds no
 * folders). Errors are ignored: what stays is pruned after the next save. */
static void remove_folder(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *de;
        char f[CKPT_PATH];
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
                join(f, path, de->d_name) == ZPP_OK)
                remove(f);
        closedir(d);
    }
    rmdir(path);
}

/* Writes `text` to `path`, fsynced (through path.tmp and a rename when
 * `atomic`). */
static zpp_status write_synced(const char *path, const char *text, int atomic) {
    char tmp[CKPT_PATH + 8];
    snprintf(tmp, sizeof tmp, "%s%s", path, atomic ? ".tmp" : "");
    FILE *f = fopen(tmp, "w");
    size_t n = strlen(text);
    int ok = f && fwrite(text, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (f && fclose(f) != 0 && ok) ok = 0, err = errno;
    if (ok && atomic && rename(tmp, path) != 0) ok = 0, err = errno;
    if (!ok) {
        if (f) remove(tmp);
        return zpp_error(ZPP_ERR_IO, "checkpoint: cannot write %s: %s", path, strerror(err));
    }
    return ZPP_OK;
}

/* Whether this rank can write in `dir`: a file of its own made, written,
 * closed and removed. */
static zpp_status probe_write(const char *dir, int world_rank) {
    char probe[CKPT_PATH], name[48];
    snprintf(name, sizeof name, ".zeropp-probe-%d", world_rank);
    ZPP_CHECK(join(probe, dir, name));
    FILE *f = fopen(probe, "w");
    int ok = f && fputc('x', f) != EOF;
    int err = errno;
    if (f && fclose(f) != 0 && ok) ok = 0, err = errno;
    remove(probe);
    if (!ok)
        return zpp_error(ZPP_ERR_IO, "cannot write in checkpoint directory %s%s: %s", dir,
                         world_rank ? " from this rank" : "", strerror(err));
    return ZPP_OK;
}

/* Whether this rank sees the file rank 0 wrote in `dir` with `token` in
 * it: the ranks save into one folder, and rank 0 reads all their files. */
static zpp_status probe_shared(const char *dir, int world_rank, long long token) {
    char probe[CKPT_PATH], host[64] = "?";
    ZPP_CHECK(join(probe, dir, ".zeropp-probe-shared"));
    FILE *f = fopen(probe, "r");
    long long seen = -1;
    if (f) {
        if (fscanf(f, "%lld", &seen) != 1) seen = -1;
        fclose(f);
    }
    if (seen == token) return ZPP_OK;
    gethostname(host, sizeof host - 1);
    return zpp_error(ZPP_ERR_IO,
                     "checkpoint directory %s is not shared: rank %d (host %s) does not see the "
                     "file rank 0 wrote there. Every rank writes its part of a checkpoint into "
                     "the one folder; give --save a folder on a filesystem all nodes mount",
                     dir, world_rank, host);
}

zpp_status zpp_checkpoint_check_dir(const char *dir, int world_rank) {
    /* Rank 0 makes the folder and leaves a token there; every rank then
     * checks that it sees that token (one shared folder, not one per node)
     * and that it can write a file of its own. */
    char shared[CKPT_PATH];
    double token = 0.0;
    zpp_status st = join(shared, dir, ".zeropp-probe-shared");
    if (st == ZPP_OK && world_rank == 0) {
        st = make_dirs(dir);
        /* A number no earlier run left there: the time and the pid. */
        token = (double)(((long long)time(NULL) % 100000000LL) * 100000LL + getpid() % 100000);
        if (st == ZPP_OK) {
            char text[32];
            snprintf(text, sizeof text, "%lld\n", (long long)token);
            st = write_synced(shared, text, 0);
            /* (the message's own buffer cannot be an argument of zpp_error) */
            if (st != ZPP_OK)
                st = zpp_error_context(st, "cannot write in checkpoint directory %s", dir);
        }
    }
    st = zpp_comm_agree_world(st);
    if (st == ZPP_OK) st = zpp_comm_max_world(&token); /* rank 0's; the others hold 0 */
    if (st != ZPP_OK) return st;
    st = probe_shared(dir, world_rank, (long long)token);
    if (st == ZPP_OK) st = probe_write(dir, world_rank);
    st = zpp_comm_agree_world(st);
    if (world_rank == 0) remove(shared);
    return st;
}

/* ---- The run lock (checkpoint.h) -------------------------------------------- */

#define LOCK_NAME ".zeropp.lock"

struct zpp_ckpt_lock {
    int fd;
    time_t started;
    char path[CKPT_PATH];
};

/* Who holds (or held) a lock, from its file's one JSON line. */
typedef struct lock_holder {
    int known; /* the file named a run */
    char run[24], host[256], since[40];
    long pid;
} lock_holder;

static void holder_parse(const char *text, lock_holder *h) {
    memset(h, 0, sizeof *h);
    cJSON *j = cJSON_Parse(text);
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(j, "run_id");
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(j, "host");
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(j, "pid");
    const cJSON *since = cJSON_GetObjectItemCaseSensitive(j, "since");
    if (cJSON_IsString(run) && cJSON_IsString(host) && cJSON_IsNumber(pid) &&
        pid->valuedouble >= 1 && pid->valuedouble <= 4194304.0) {
        h->known = 1;
        snprintf(h->run, sizeof h->run, "%.16s", run->valuestring);
        snprintf(h->host, sizeof h->host, "%s", host->valuestring);
        h->pid = (long)pid->valuedouble;
        snprintf(h->since, sizeof h->since, "%s",
                 cJSON_IsString(since) ? since->valuestring : "an unknown time");
    }
    cJSON_Delete(j);
}

static void holder_read(int fd, lock_holder *h) {
    char buf[1024];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    holder_parse(buf, h);
}

/* "run X (pid P on host H, since T)" */
static const char *holder_str(const lock_holder *h, char *out, size_t cap) {
    if (h->known)
        snprintf(out, cap, "run %s (pid %ld on host %s, since %s)", h->run, h->pid, h->host,
                 h->since);
    else snprintf(out, cap, "another run");
    return out;
}

/* Whether the holder is a process of this host that no longer exists. */
static int holder_gone(const lock_holder *h) {
    char host[256] = "";
    if (!h->known || gethostname(host, sizeof host) != 0) return 0;
    host[sizeof host - 1] = '\0';
    return !strcmp(host, h->host) && kill((pid_t)h->pid, 0) != 0 && errno == ESRCH;
}

static zpp_status lock_write(int fd, const char *path, uint64_t run_id, time_t now) {
    char host[256] = "?", since[40] = "", text[512];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    struct tm tm;
    if (gmtime_r(&now, &tm)) strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S UTC", &tm);
    cJSON *j = cJSON_CreateObject();
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)run_id);
    cJSON_AddStringToObject(j, "run_id", hex);
    cJSON_AddStringToObject(j, "host", host);
    cJSON_AddNumberToObject(j, "pid", (double)getpid());
    cJSON_AddNumberToObject(j, "started", (double)now);
    cJSON_AddStringToObject(j, "since", since);
    char *line = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!line) return zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    int n = snprintf(text, sizeof text, "%s\n", line);
    cJSON_free(line);
    if (n >= (int)sizeof text) n = (int)sizeof text - 1;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n || fsync(fd) != 0)
        return zpp_error(ZPP_ERR_IO, "cannot write in checkpoint directory: %s: %s", path,
                         strerror(errno));
    return ZPP_OK;
}

/* Rank 0's part of zpp_checkpoint_lock. */
static zpp_status lock_take(const char *dir, uint64_t run_id, zpp_ckpt_lock *l, char *note,
                            size_t cap) {
    ZPP_CHECK(make_dirs(dir));
    ZPP_CHECK(join(l->path, dir, LOCK_NAME));
    char who[600];
    lock_holder h;
    for (int attempt = 0; attempt < 16; attempt++) {
        int fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return zpp_error(ZPP_ERR_IO, "cannot write in checkpoint directory %s: %s: %s", dir,
                             l->path, strerror(errno));
        int locks = 1;
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int err = errno;
            if (err == EWOULDBLOCK) { /* held: a live run */
                holder_read(fd, &h);
                close(fd);
                return zpp_error(ZPP_ERR_STATE, "%s is in use by %s; wait for it or pass another "
                                 "--save", dir, holder_str(&h, who, sizeof who));
            }
            if (err != ENOLCK && err != EOPNOTSUPP && err != ENOSYS && err != EINVAL) {
                close(fd);
                return zpp_error(ZPP_ERR_IO, "cannot lock %s: %s", l->path, strerror(err));
            }
            locks = 0; /* no file locks here (an NFS mount without them): the file alone */
        }
        /* The file locked must still be the one at the path: a holder that
         * ended removed it, and the next run makes a new one. */
        struct stat a, b;
        if (fstat(fd, &a) != 0 || stat(l->path, &b) != 0 || a.st_dev != b.st_dev ||
            a.st_ino != b.st_ino) {
            close(fd);
            continue;
        }
        holder_read(fd, &h);
        if (!locks && h.known && !holder_gone(&h)) {
            close(fd);
            return zpp_error(ZPP_ERR_STATE,
                             "%s is in use by %s, as far as %s says (file locks do not work "
                             "on this file system, so whether it still runs cannot be told); "
                             "wait for it, remove %s if it has ended, or pass another --save",
                             dir, holder_str(&h, who, sizeof who), l->path, l->path);
        }
        if (h.known)
            snprintf(note, cap,
                     "took over the stale lock %s of %s: %s", l->path,
                     holder_str(&h, who, sizeof who),
                     holder_gone(&h) ? "that process is gone" : "it was no longer held");
        l->started = time(NULL);
        zpp_status st = lock_write(fd, l->path, run_id, l->started);
        if (st != ZPP_OK) {
            close(fd);
            return st;
        }
        l->fd = fd;
        return ZPP_OK;
    }
    return zpp_error(ZPP_ERR_STATE, "cannot take %s: other runs keep replacing it", l->path);
}

zpp_status zpp_checkpoint_lock(const char *dir, int world_rank, uint64_t run_id,
                               zpp_ckpt_lock **lock_p, char *note, size_t cap) {
    zpp_status st = ZPP_OK;
    zpp_ckpt_lock *l = NULL;
    *lock_p = NULL;
    if (cap) note[0] = '\0';
    if (world_rank == 0) {
        l = calloc(1, sizeof *l);
        if (!l) st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
        if (st == ZPP_OK) l->fd = -1, st = lock_take(dir, run_id, l, note, cap);
    }
    st = zpp_comm_agree_world(st);
    /* Every rank, not rank 0 alone: one folder they all share and write in
     * (a node-local folder would fail only at the first save). */
    if (st == ZPP_OK) st = zpp_checkpoint_check_dir(dir, world_rank);
    if (st == ZPP_OK) *lock_p = l;
    else zpp_checkpoint_unlock(l);
    return st;
}

zpp_status zpp_checkpoint_lock_set_run(zpp_ckpt_lock *l, uint64_t run_id) {
    return l && l->fd >= 0 ? lock_write(l->fd, l->path, run_id, l->started) : ZPP_OK;
}

void zpp_checkpoint_unlock(zpp_ckpt_lock *l) {
    if (!l) return;
    if (l->fd >= 0) {
        unlink(l->path); /* while held: the next run makes a new file */
        close(l->fd);
    }
    free(l);
}

/* ---- The manifest ---------------------------------------------------------- */

typedef zpp_ckpt_manifest manifest; /* ckpt_manifest.h parses it */

/* Whether the engine keeps qgZ error-feedback buffers (engine.h, loco). */
static int loco_on(const zpp_engine *e) {
    size_t li = 0, le = 0;
    return zpp_engine_unit_count(e) > 0 && zpp_engine_loco_lens(e, 0, &li, &le) == ZPP_OK &&
           li > 0;
}

static void hex64(char *out, uint64_t v) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

/* key: v with the fewest digits (15 to 17) that read back as v: a resumed
 * llama must compare its rope_theta and norm_eps bit for bit. */
static void add_exact(cJSON *o, const char *key, double v) {
    char s[32];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(s, sizeof s, "%.*g", digits, v);
        if (strtod(s, NULL) == v) break;
    }
    cJSON_AddRawToObject(o, key, s);
}

/* "model"'s family and, for a llama, its knobs (ckpt_manifest.h). */
static void add_family(cJSON *mo, const zpp_ckpt_meta *m) {
    const char *family = m->family ? m->family : "gpt2";
    cJSON_AddStringToObject(mo, "family", family);
    if (strcmp(family, "llama")) return;
    const zpp_decoder_shape *x = &m->ext;
    cJSON_AddNumberToObject(mo, "n_kv_head", x->n_kv_head);
    cJSON_AddNumberToObject(mo, "n_ffn", x->n_ffn);
    add_exact(mo, "rope_theta", x->rope_theta);
    add_exact(mo, "norm_eps", x->norm_eps);
    cJSON_AddBoolToObject(mo, "untied_head", x->untied_head);
    cJSON_AddBoolToObject(mo, "qkv_bias", x->qkv_bias);
    cJSON_AddBoolToObject(mo, "o_bias", x->o_bias);
    add_exact(mo, "rope_factor", x->rope_factor);
    add_exact(mo, "rope_low_freq_factor", x->rope_low_freq_factor);
    add_exact(mo, "rope_high_freq_factor", x->rope_high_freq_factor);
    cJSON_AddNumberToObject(mo, "rope_original_max_pos", x->rope_original_max_pos);
}

/* The manifest of a save, sealed with its checksum: `rank_sums` and
 * `loco_sums` (NULL: no loco files) are the files' checksums. */
static char *manifest_text(const zpp_ckpt_meta *m, const char *folder, const zpp_engine *e,
                           const uint64_t *rank_sums, const uint64_t *loco_sums) {
    char hex[17];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", m->step);
    cJSON_AddNumberToObject(j, "format", ZPP_CKPT_FORMAT);
    cJSON_AddStringToObject(j, "folder", folder);
    cJSON_AddNumberToObject(j, "world_size", m->world_size);
    cJSON_AddNumberToObject(j, "node_size", m->node_size);
    cJSON_AddStringToObject(j, "mode", m->mode);
    cJSON_AddStringToObject(j, "dtype", zpp_dtype_name(m->dtype));
    zpp_engine_counters c = zpp_engine_counters_get(e);
    cJSON *en = cJSON_AddObjectToObject(j, "engine");
    cJSON_AddNumberToObject(en, "updates", c.updates);
    cJSON_AddNumberToObject(en, "skipped_total", c.skipped_total);
    cJSON_AddNumberToObject(en, "loss_scale", (double)c.loss_scale);
    cJSON_AddNumberToObject(en, "scaler_hysteresis", c.scaler_hysteresis);
    cJSON_AddNumberToObject(en, "scaler_iter", c.scaler_iter);
    cJSON_AddNumberToObject(en, "scaler_last_overflow", c.scaler_last_overflow);
    cJSON *mo = cJSON_AddObjectToObject(j, "model");
    cJSON_AddNumberToObject(mo, "n_layer", m->model.n_layer);
    cJSON_AddNumberToObject(mo, "n_head", m->model.n_head);
    cJSON_AddNumberToObject(mo, "n_embd", m->model.n_embd);
    cJSON_AddNumberToObject(mo, "seq_len", m->model.seq_len);
    cJSON_AddNumberToObject(mo, "vocab_size", m->model.vocab_size);
    cJSON_AddNumberToObject(mo, "real_vocab_size", zpp_gpt2_real_vocab(&m->model));
    add_family(mo, m);
    cJSON_AddNumberToObject(j, "train_batch_size", m->train_batch_size);
    cJSON_AddNumberToObject(j, "seed", (double)m->seed);
    cJSON *units = cJSON_AddArrayToObject(j, "units");
    for (int u = 0; u < zpp_engine_unit_count(e); u++) {
        size_t numel = 0, b = 0, c = 0;
        zpp_engine_shard_range(e, u, &numel, &b, &c);
        cJSON_AddItemToArray(units, cJSON_CreateNumber((double)numel));
    }
    if (loco_on(e)) cJSON_AddBoolToObject(j, "loco", 1);
    if (m->config) { /* the whole config, for a resume without --config */
        char *text = zpp_train_config_to_json(m->config); /* exact numbers: raw */
        cJSON *c = text ? cJSON_AddRawToObject(j, "config", text) : NULL;
        free(text);
        if (!c) {
            cJSON_Delete(j);
            return NULL;
        }
    }
    if (m->data_kind) {
        cJSON *d = cJSON_AddObjectToObject(j, "data");
        if (m->data_path) cJSON_AddStringToObject(d, "path", m->data_path);
        else cJSON_AddNullToObject(d, "path");
        cJSON_AddStringToObject(d, "kind", m->data_kind);
        cJSON_AddNumberToObject(d, "tokens", (double)m->data_tokens);
    }
    if (m->init_from) cJSON_AddStringToObject(j, "init_from", m->init_from);
    hex64(hex, m->run_id);
    cJSON_AddStringToObject(j, "run_id", hex);
    cJSON *files = cJSON_AddArrayToObject(j, "files");
    cJSON *sums = cJSON_AddObjectToObject(j, "sums");
    cJSON *rs = cJSON_AddArrayToObject(sums, "rank");
    cJSON *ls = loco_sums ? cJSON_AddArrayToObject(sums, "loco") : NULL;
    for (int r = 0; r < m->world_size; r++) {
        char name[32];
        snprintf(name, sizeof name, "rank-%05d.ckpt", r);
        cJSON_AddItemToArray(files, cJSON_CreateString(name));
        hex64(hex, rank_sums[r]);
        cJSON_AddItemToArray(rs, cJSON_CreateString(hex));
        if (ls) hex64(hex, loco_sums[r]), cJSON_AddItemToArray(ls, cJSON_CreateString(hex));
    }
    cJSON_AddStringToObject(j, "checksum", "0000000000000000"); /* last: sealed below */
    char *text = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!text) return NULL;
    /* one line, newline-terminated */
    size_t n = strlen(text);
    char *out = malloc(n + 2);
    if (out) memcpy(out, text, n), out[n] = '\n', out[n + 1] = '\0';
    cJSON_free(text);
    if (out && !zpp_ckpt_manifest_seal(out)) { /* cannot fail: the field is last */
        free(out);
        return NULL;
    }
    return out;
}

/* Reads and parses a manifest file; *found_p = 0 when the file does not
 * exist (no error set then). With text_p, *text_p is its text (free it). */
static zpp_status manifest_read_text(const char *path, manifest *m, int *found_p,
                                     char **text_p) {
    memset(m, 0, sizeof *m);
    *found_p = 0;
    if (text_p) *text_p = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) return ZPP_OK;
        return zpp_error(ZPP_ERR_IO, "cannot read checkpoint manifest %s: %s", path,
                         strerror(errno));
    }
    FILE *f = NULL; /* a FIFO or a folder in its place is refused, not read */
    ZPP_CHECK(zpp_fopen_regular(path, "checkpoint manifest", &f));
    *found_p = 1;
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!buf) return zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    buf[n] = '\0';
    zpp_status st = zpp_ckpt_manifest_parse(buf, ZPP_CKPT_FORMAT, path, m);
    if (st == ZPP_OK && text_p) *text_p = buf;
    else free(buf);
    return st;
}

static zpp_status manifest_read(const char *path, manifest *m, int *found_p) {
    return manifest_read_text(path, m, found_p, NULL);
}

/* The folder of the published checkpoint of DIR ("" if none). */
static void published_folder(const char *dir, char *out, size_t cap) {
    char path[CKPT_PATH];
    manifest m;
    int found = 0;
    out[0] = '\0';
    if (join(path, dir, CKPT_POINTER) == ZPP_OK && manifest_read(path, &m, &found) == ZPP_OK &&
        found)
        snprintf(out, cap, "%s", m.folder);
    zpp_ckpt_manifest_free(&m);
}

/* ---- Rank files -------------------------------------------------------------- */

typedef struct ckpt_file {
    FILE *f;
    uint64_t hash; /* FNV-1a of the bytes so far (formats 2, 3) */
    const char *path;
    size_t written, kill_at; /* kill_at: the save_kill hook ends the rank here */
    int words;               /* format 4: `sum` is the file's checksum, not `hash` */
    zpp_checksum sum;
} ckpt_file;

static void sum_add(ckpt_file *c, const void *p, size_t n) {
    if (c->words) zpp_checksum_add(&c->sum, p, n);
    else c->hash = zpp_fnv1a(c->hash, p, n);
}

static uint64_t sum_value(const ckpt_file *c) {
    return c->words ? zpp_checksum_value(&c->sum) : c->hash;
}

static zpp_status file_write(ckpt_file *c, const void *p, size_t n) {
    if (c->kill_at && c->written + n >= c->kill_at) /* returns only without hooks */
        return zpp_fault_kill_mid_write(c->f, p, c->kill_at - c->written);
    if (fwrite(p, 1, n, c->f) != n)
        return zpp_error(ZPP_ERR_IO, "checkpoint: cannot write %s: %s", c->path, strerror(errno));
    sum_add(c, p, n);
    c->written += n;
    return ZPP_OK;
}

/* Ends a file being written: its checksum (the hash of every byte before
 * it), then flushed to the disk. */
static zpp_status file_seal(ckpt_file *c) {
    uint64_t sum = sum_value(c);
    ZPP_CHECK(file_write(c, &sum, sizeof sum));
    if (fflush(c->f) != 0 || fsync(fileno(c->f)) != 0)
        return zpp_error(ZPP_ERR_IO, "checkpoint: cannot write %s: %s", c->path,
                         strerror(errno));
    return ZPP_OK;
}

/* Closes a file being written; a failed close is an error unless one came
 * first (st). */
static zpp_status file_close(ckpt_file *c, zpp_status st) {
    if (c->f && fclose(c->f) != 0 && st == ZPP_OK)
        st = zpp_error(ZPP_ERR_IO, "checkpoint: cannot write %s: %s", c->path, strerror(errno));
    c->f = NULL;
    return st;
}

static zpp_status file_read(ckpt_file *c, void *p, size_t n) {
    if (fread(p, 1, n, c->f) != n)
        return zpp_error(ZPP_ERR_FORMAT, "checkpoint file %s is truncated", c->path);
    sum_add(c, p, n);
    return ZPP_OK;
}

static zpp_status write_rank_file(zpp_engine *e, const zpp_ckpt_meta *meta, const char *path,
                                  int kill) {
    const int n_units = zpp_engine_unit_count(e);
    size_t max_count = 1, total = 48;
    for (int u = 0; u < n_units; u++) {
        size_t numel = 0, b = 0, c = 0;
        ZPP_CHECK(zpp_engine_shard_range(e, u, &numel, &b, &c));
        if (c > max_count) max_count = c;
        total += 24 + 12 * c;
    }
    float *host = malloc(3 * max_count * sizeof(float));
    if (!host) return zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    ckpt_file c = {.f = fopen(path, "wb"), .hash = FNV_INIT, .path = path,
                   .kill_at = kill ? total / 2 : 0, .words = 1};
    zpp_status st = ZPP_OK;
    if (!c.f) {
        st = zpp_error(ZPP_ERR_IO, "checkpoint: cannot create %s: %s", path, strerror(errno));
        goto out;
    }
    uint32_t head[4] = {(uint32_t)meta->world_size, (uint32_t)meta->world_rank,
                        (uint32_t)n_units, 0};
    uint64_t step = (uint64_t)meta->step, run = meta->run_id;
    ZPP_CHECK_GOTO(file_write(&c, kCkptMagic[ZPP_CKPT_FORMAT], 8), st, out);
    ZPP_CHECK_GOTO(file_write(&c, head, sizeof head), st, out);
    ZPP_CHECK_GOTO(file_write(&c, &step, sizeof step), st, out);
    ZPP_CHECK_GOTO(file_write(&c, &run, sizeof run), st, out);
    for (int u = 0; u < n_units; u++) {
        size_t numel = 0, begin = 0, count = 0;
        ZPP_CHECK_GOTO(zpp_engine_shard_range(e, u, &numel, &begin, &count), st, out);
        uint64_t r[3] = {numel, begin, count};
        ZPP_CHECK_GOTO(file_write(&c, r, sizeof r), st, out);
        ZPP_CHECK_GOTO(zpp_engine_state_get(e, u, host, host + count, host + 2 * count), st, out);
        ZPP_CHECK_GOTO(file_write(&c, host, 3 * count * sizeof(float)), st, out);
    }
    st = file_seal(&c);
out:
    st = file_close(&c, st);
    free(host);
    return st;
}

/* The error-feedback file of a rank (checkpoint.h): its buffers are laid
 * out for this world and node size and are not resharded. */
static zpp_status write_loco_file(zpp_engine *e, const zpp_ckpt_meta *meta, const char *path) {
    const int n_units = zpp_engine_unit_count(e);
    size_t max_len = 1;
    for (int u = 0; u < n_units; u++) {
        size_t li = 0, le = 0;
        ZPP_CHECK(zpp_engine_loco_lens(e, u, &li, &le));
        if (li + le > max_len) max_len = li + le;
    }
    float *host = malloc(max_len * sizeof(float));
    if (!host) return zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    ckpt_file c = {.f = fopen(path, "wb"), .hash = FNV_INIT, .path = path, .words = 1};
    zpp_status st = ZPP_OK;
    if (!c.f) {
        st = zpp_error(ZPP_ERR_IO, "checkpoint: cannot create %s: %s", path, strerror(errno));
        goto out;
    }
    uint32_t head[4] = {(uint32_t)meta->world_size, (uint32_t)meta->world_rank,
                        (uint32_t)meta->node_size, (uint32_t)n_units};
    uint64_t step = (uint64_t)meta->step, run = meta->run_id;
    ZPP_CHECK_GOTO(file_write(&c, kLocoMagic[ZPP_CKPT_FORMAT], 8), st, out);
    ZPP_CHECK_GOTO(file_write(&c, head, sizeof head), st, out);
    ZPP_CHECK_GOTO(file_write(&c, &step, sizeof step), st, out);
    ZPP_CHECK_GOTO(file_write(&c, &run, sizeof run), st, out);
    for (int u = 0; u < n_units; u++) {
        size_t li = 0, le = 0;
        ZPP_CHECK_GOTO(zpp_engine_loco_lens(e, u, &li, &le), st, out);
        uint64_t r[2] = {li, le};
        ZPP_CHECK_GOTO(file_write(&c, r, sizeof r), st, out);
        ZPP_CHECK_GOTO(zpp_engine_loco_get(e, u, host, host + li), st, out);
        ZPP_CHECK_GOTO(file_write(&c, host, (li + le) * sizeof(float)), st, out);
    }
    st = file_seal(&c);
out:
    st = file_close(&c, st);
    free(host);
    return st;
}

/* The manifest beside a file of a step folder (messages name it). */
static const char *manifest_beside(const char *path, char *out) {
    const char *slash = strrchr(path, '/');
    int n = slash ? (int)(slash - path) : 0;
    snprintf(out, CKPT_PATH, "%.*s%s" CKPT_MANIFEST, n, path, slash ? "/" : "");
    return out;
}

/* The magic of a file of a step folder: magics[format] for its manifest's
 * format; another format's magic means files of two saves. */
static zpp_status check_magic(const char *path, const char *got, const manifest *m,
                              const char *const magics[ZPP_CKPT_FORMAT + 1], const char *what) {
    if (memcmp(got, magics[m->format], 8) == 0) return ZPP_OK;
    char mp[CKPT_PATH];
    for (int f = 2; f <= ZPP_CKPT_FORMAT; f++)
        if (memcmp(got, magics[f], 8) == 0)
            return zpp_error(ZPP_ERR_FORMAT,
                             "checkpoint file %s is of format %d, its manifest %s of format %d: "
                             "the folder holds files of two saves",
                             path, f, manifest_beside(path, mp), m->format);
    return zpp_error(ZPP_ERR_FORMAT, "%s is not a zeropp %s (bad magic)", path, what);
}

/* Format 3: the run that wrote a file must be the manifest's. */
static zpp_status check_run(const char *path, const manifest *m, uint64_t run, uint64_t step) {
    if (run == m->run_id) return ZPP_OK;
    char mp[CKPT_PATH];
    return zpp_error(ZPP_ERR_FORMAT,
                     "checkpoint file %s was saved by run %016llx (step %llu), its manifest %s "
                     "by run %016llx (step %d): the folder mixes two runs' files (two jobs "
                     "saving into one --save folder?); resume from a checkpoint of one run",
                     path, (unsigned long long)run, (unsigned long long)step,
                     manifest_beside(path, mp), (unsigned long long)m->run_id, m->step);
}

/* Format 3: a file's checksum must be the one its manifest records. */
static zpp_status check_sum(const char *path, const manifest *m, const uint64_t *sums, int q,
                            uint64_t got) {
    if (!sums || sums[q] == got) return ZPP_OK;
    char mp[CKPT_PATH];
    return zpp_error(ZPP_ERR_FORMAT,
                     "checkpoint file %s has checksum %016llx, its manifest %s records "
                     "%016llx: it is not the file saved with that manifest",
                     path, (unsigned long long)got, manifest_beside(path, mp),
                     (unsigned long long)sums[q]);
}

/* Reads this rank's error-feedback file into host arrays (bufs[u]: the
 * unit's intra then inter buffer), checking that it was written by rank
 * `rank` of the same layout at the manifest's step. */
static zpp_status read_loco_file(const char *path, const manifest *m, const zpp_ckpt_meta *r,
                                 zpp_engine *e, float **bufs) {
    ckpt_file c = {.hash = FNV_INIT, .path = path, .words = m->format >= 4};
    ZPP_CHECK(zpp_fopen_regular(path, "checkpoint error-feedback file", &c.f));
    zpp_status st = ZPP_OK;
    char magic[8];
    uint32_t head[4];
    uint64_t step;
    uint64_t run = 0;
    ZPP_CHECK_GOTO(file_read(&c, magic, 8), st, out);
    ZPP_CHECK_GOTO(check_magic(path, magic, m, kLocoMagic, "error-feedback file"), st, out);
    ZPP_CHECK_GOTO(file_read(&c, head, sizeof head), st, out);
    ZPP_CHECK_GOTO(file_read(&c, &step, sizeof step), st, out);
    if (m->format >= 3) {
        ZPP_CHECK_GOTO(file_read(&c, &run, sizeof run), st, out);
        ZPP_CHECK_GOTO(check_run(path, m, run, step), st, out);
    }
    if (head[0] != (uint32_t)m->world_size || head[1] != (uint32_t)r->world_rank ||
        head[2] != (uint32_t)m->node_size || head[3] != (uint32_t)m->n_units ||
        step != (uint64_t)m->step) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint error-feedback file %s (rank %u of %u, node size %u, %u "
                       "units, step %llu) does not belong to its manifest",
                       path, head[1], head[0], head[2], head[3], (unsigned long long)step);
        goto out;
    }
    for (int u = 0; u < m->n_units; u++) {
        size_t li = 0, le = 0;
        uint64_t lens[2];
        ZPP_CHECK_GOTO(zpp_engine_loco_lens(e, u, &li, &le), st, out);
        ZPP_CHECK_GOTO(file_read(&c, lens, sizeof lens), st, out);
        if (lens[0] != li || lens[1] != le) {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "checkpoint error-feedback file %s: unit %d holds %llu + %llu "
                           "elements, this run keeps %zu + %zu",
                           path, u, (unsigned long long)lens[0], (unsigned long long)lens[1],
                           li, le);
            goto out;
        }
        ZPP_CHECK_GOTO(file_read(&c, bufs[u], (li + le) * sizeof(float)), st, out);
    }
    uint64_t want = sum_value(&c), got = 0;
    if (fread(&got, 1, sizeof got, c.f) != sizeof got || got != want || fgetc(c.f) != EOF)
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint file %s is damaged (checksum or length mismatch)", path);
    else st = check_sum(path, m, m->loco_sums, r->world_rank, got);
out:
    fclose(c.f);
    return st;
}

/* ---- Save ------------------------------------------------------------------ */

/* The checksums the rank and error-feedback files of a finished save end
 * with (their last 8 bytes), for the manifest: sums[r], and sums[W + r]
 * with loco files. */
static zpp_status read_sums(const char *folder, int W, int loco, uint64_t *sums) {
    for (int k = 0; k < (loco ? 2 : 1) * W; k++) {
        char fname[32], path[CKPT_PATH];
        snprintf(fname, sizeof fname, "%s-%05d.ckpt", k < W ? "rank" : "loco", k % W);
        ZPP_CHECK(join(path, folder, fname));
        FILE *f = fopen(path, "rb");
        int ok = f && fseek(f, -(long)sizeof sums[k], SEEK_END) == 0 &&
                 fread(&sums[k], sizeof sums[k], 1, f) == 1;
        int err = errno;
        if (f) fclose(f);
        if (!ok)
            return zpp_error(ZPP_ERR_IO, "checkpoint: cannot read back %s: %s", path,
                             f ? "too short" : strerror(err));
    }
    return ZPP_OK;
}

/* Deletes every step folder of DIR but the published one and the newest
 * keep - 1 other complete ones; leftovers of failed saves go too. */
/* Keeps the published folder `published` and the newest keep - 1 complete
 * folders before it, and deletes the rest. Folders of later steps than the
 * published one (left by a run that went further before this one resumed
 * from an older checkpoint) are another line of the run's history: they
 * stay, uncounted, unless prune_newer. */
static void prune(const char *dir, const char *published, int keep, int prune_newer) {
    DIR *d = opendir(dir);
    if (!d) return;
    typedef struct entry {
        char name[256];
        long step;
        int sub, complete;
    } entry;
    entry *ents = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        long step = -1;
        int sub = 0;
        char tail[8] = "";
        if (strncmp(de->d_name, "step-", 5) != 0 || strlen(de->d_name) >= 256) continue;
        int k = sscanf(de->d_name + 5, "%ld.%d%1s", &step, &sub, tail);
        if (k < 1 || tail[0]) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            entry *g = realloc(ents, cap * sizeof *g);
            if (!g) break;
            ents = g;
        }
        entry *x = &ents[n++];
        snprintf(x->name, sizeof x->name, "%s", de->d_name);
        x->step = step;
        x->sub = k >= 2 ? sub : 0;
        char m[CKPT_PATH], p[CKPT_PATH];
        x->complete = join(p, dir, x->name) == ZPP_OK && join(m, p, CKPT_MANIFEST) == ZPP_OK &&
                      access(m, F_OK) == 0;
    }
    closedir(d);
    long pub_step = -1;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ents[i].name, published)) pub_step = ents[i].step;
    for (size_t i = 0; i < n; i++)
        if (ents[i].step > pub_step) {
            if (prune_newer) ents[i].complete = 0; /* not kept: deleted below */
            else ents[i].name[0] = '\0';          /* stays */
        }
    int kept = 1; /* the published one */
    for (;;) {    /* the newest complete unpublished ones, keep - 1 of them */
        entry *best = NULL;
        for (size_t i = 0; i < n; i++) {
            entry *x = &ents[i];
            if (!x->complete || !x->name[0] || !strcmp(x->name, published)) continue;
            if (!best || x->step > best->step || (x->step == best->step && x->sub > best->sub))
                best = x;
        }
        if (!best) break;
        best->complete = 0;
        if (kept < keep) {
            kept++;
            best->name[0] = '\0'; /* stays */
        }
    }
    for (size_t i = 0; i < n; i++) {
        char p[CKPT_PATH];
        if (ents[i].name[0] && strcmp(ents[i].name, published) &&
            join(p, dir, ents[i].name) == ZPP_OK)
            remove_folder(p);
    }
    char tmp[CKPT_PATH];
    if (join(tmp, dir, CKPT_POINTER ".tmp") == ZPP_OK) remove(tmp);
    free(ents);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Bytes of the regular files of a folder (a step folder holds no
 * folders). */
static double folder_bytes(const char *path) {
    double sum = 0;
    DIR *d = opendir(path);
    if (!d) return 0;
    struct dirent *de;
    char f[CKPT_PATH];
    struct stat sb;
    while ((de = readdir(d)))
        if (join(f, path, de->d_name) == ZPP_OK && stat(f, &sb) == 0 && S_ISREG(sb.st_mode))
            sum += (double)sb.st_size;
    closedir(d);
    return sum;
}

/* How long the ranks wait for each other's disk work in a save: the run's
 * zeropp.save_timeout_s, not its collective deadline. A slow disk (a
 * network filesystem's fsync, one rank's writes queued behind another job's)
 * is not a stalled peer, and a save that took longer than a collective may
 * must not end the run. Without the run's config, the world's deadline. */
static double save_deadline(const zpp_ckpt_meta *meta) {
    return meta->config ? meta->config->save_timeout_s : zpp_comm_world_timeout();
}

zpp_status zpp_checkpoint_save(zpp_engine *e, const zpp_ckpt_meta *meta, const char *dir,
                               int keep, const zpp_fault *fault, zpp_ckpt_saved *saved) {
    const int rank = meta->world_rank;
    const double deadline = save_deadline(meta);
    const double t0 = now_s();
    char published[256], name[64], folder[CKPT_PATH], path[CKPT_PATH];
    /* Every rank reads the published folder's name before rank 0 changes
     * anything, so all pick the same new one. */
    published_folder(dir, published, sizeof published);
    zpp_status st = zpp_comm_agree_world(ZPP_OK);
    ZPP_CHECK(st);
    snprintf(name, sizeof name, "step-%08d", meta->step);
    if (!strcmp(name, published)) snprintf(name, sizeof name, "step-%08d.1", meta->step);
    st = join(folder, dir, name);
    if (st == ZPP_OK && rank == 0) {
        st = make_dirs(dir);
        if (st == ZPP_OK) {
            remove_folder(folder); /* a leftover of a failed save */
            if (mkdir(folder, 0777) != 0)
                st = zpp_error(ZPP_ERR_IO, "checkpoint: cannot create %s: %s", folder,
                               strerror(errno));
        }
    }
    ZPP_CHECK(zpp_comm_agree_world_within(st, deadline));

    /* Every rank's file, written and fsynced (or the save_fail / save_kill
     * test hook on its rank; save_slow delays it). */
    const int W = meta->world_size;
    char fname[32];
    snprintf(fname, sizeof fname, "rank-%05d.ckpt", rank);
    st = join(path, folder, fname);
    if (st == ZPP_OK && zpp_fault_fires(fault, ZPP_FAULT_SAVE_SLOW, meta->step, rank, W))
        zpp_fault_slow_save();
    if (st == ZPP_OK && zpp_fault_fires(fault, ZPP_FAULT_SAVE_FAIL, meta->step, rank, W))
        st = zpp_fault_save_error(path, meta->step);
    else if (st == ZPP_OK)
        st = write_rank_file(e, meta, path,
                             zpp_fault_fires(fault, ZPP_FAULT_SAVE_KILL, meta->step, rank, W));
    if (st == ZPP_OK && loco_on(e)) {
        snprintf(fname, sizeof fname, "loco-%05d.ckpt", rank);
        st = join(path, folder, fname);
        if (st == ZPP_OK) st = write_loco_file(e, meta, path);
    }
    st = zpp_comm_agree_world_within(st, deadline);
    if (st != ZPP_OK) {
        if (rank == 0) remove_folder(folder); /* the previous checkpoint stays published */
        return st;
    }

    /* Publish: the folder's manifest, then the pointer, by one rename. */
    if (rank == 0) {
        const int loco = loco_on(e);
        uint64_t *sums = calloc(2 * (size_t)W, sizeof *sums);
        char *text = NULL;
        if (!sums) st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
        if (st == ZPP_OK) st = read_sums(folder, W, loco, sums);
        if (st == ZPP_OK && !(text = manifest_text(meta, name, e, sums, loco ? sums + W : NULL)))
            st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
        free(sums);
        if (st == ZPP_OK) st = join(path, folder, CKPT_MANIFEST);
        if (st == ZPP_OK) st = write_synced(path, text, 0);
        if (st == ZPP_OK) st = fsync_dir(folder);
        if (st == ZPP_OK) st = join(path, dir, CKPT_POINTER);
        if (st == ZPP_OK) st = write_synced(path, text, 1);
        if (st == ZPP_OK) st = fsync_dir(dir);
        free(text);
        if (st == ZPP_OK)
            prune(dir, name, keep < 1 ? 1 : keep, meta->config && meta->config->prune_newer);
        else remove_folder(folder);
    }
    st = zpp_comm_agree_world_within(st, deadline);
    if (st != ZPP_OK || !saved) return st;
    /* rank 0 counts (it published the folder); the largest of the ranks'
     * values is rank 0's, since the others hold 0 */
    double bytes = rank == 0 ? folder_bytes(folder) : 0.0, secs = rank == 0 ? now_s() - t0 : 0.0;
    st = zpp_comm_max_world(&bytes);
    if (st == ZPP_OK) st = zpp_comm_max_world(&secs);
    if (st == ZPP_OK) {
        snprintf(saved->folder, sizeof saved->folder, "%s", folder);
        saved->bytes = bytes;
        saved->seconds = secs;
    }
    return st;
}

/* ---- Load ------------------------------------------------------------------ */

/* This rank's part of the state, staged on the host. */
typedef struct stage {
    size_t numel, begin, count;
    float *x; /* master, m, v: 3 * count (masters_only: the master alone) */
    int masters_only;
} stage;

/* Reads saved rank file q (of `world` ranks) and copies what overlaps this
 * rank's ranges into the stage; checks the header and the checksum. */
static zpp_status read_rank_file(const char *path, const manifest *m, int q, stage *sg) {
    ckpt_file c = {.hash = FNV_INIT, .path = path, .words = m->format >= 4};
    ZPP_CHECK(zpp_fopen_regular(path, "checkpoint file", &c.f));
    float *buf = NULL;
    zpp_status st = ZPP_OK;
    char magic[8];
    uint32_t head[4];
    uint64_t step;
    uint64_t run = 0;
    ZPP_CHECK_GOTO(file_read(&c, magic, 8), st, out);
    ZPP_CHECK_GOTO(check_magic(path, magic, m, kCkptMagic, "checkpoint file"), st, out);
    ZPP_CHECK_GOTO(file_read(&c, head, sizeof head), st, out);
    ZPP_CHECK_GOTO(file_read(&c, &step, sizeof step), st, out);
    if (m->format >= 3) {
        ZPP_CHECK_GOTO(file_read(&c, &run, sizeof run), st, out);
        ZPP_CHECK_GOTO(check_run(path, m, run, step), st, out);
    }
    if (head[0] != (uint32_t)m->world_size || head[1] != (uint32_t)q ||
        head[2] != (uint32_t)m->n_units || step != (uint64_t)m->step) {
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint file %s (rank %u of %u, %u units, step %llu) does not "
                       "belong to its manifest (rank %d of %d, %d units, step %d)",
                       path, head[1], head[0], head[2], (unsigned long long)step, q,
                       m->world_size, m->n_units, m->step);
        goto out;
    }
    for (int u = 0; u < m->n_units; u++) {
        uint64_t r[3];
        ZPP_CHECK_GOTO(file_read(&c, r, sizeof r), st, out);
        size_t numel = m->numel[u], L = (numel + (size_t)m->world_size - 1) / m->world_size;
        size_t b = (size_t)q * L < numel ? (size_t)q * L : numel;
        size_t n = numel - b < L ? numel - b : L;
        if (r[0] != numel || r[1] != b || r[2] != n) {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "checkpoint file %s: unit %d holds [%llu, +%llu) of %llu elements, "
                           "expected [%zu, +%zu) of %zu",
                           path, u, (unsigned long long)r[1], (unsigned long long)r[2],
                           (unsigned long long)r[0], b, n, numel);
            goto out;
        }
        float *g = realloc(buf, (n ? n : 1) * sizeof(float));
        if (!g) {
            st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
            goto out;
        }
        buf = g;
        /* the overlap of [b, b + n) and this rank's [sb, sb + sc) */
        size_t lo = b > sg[u].begin ? b : sg[u].begin;
        size_t hi = b + n < sg[u].begin + sg[u].count ? b + n : sg[u].begin + sg[u].count;
        for (int k = 0; k < 3; k++) {
            ZPP_CHECK_GOTO(file_read(&c, buf, n * sizeof(float)), st, out);
            if (lo < hi && (k == 0 || !sg[u].masters_only))
                memcpy(sg[u].x + k * sg[u].count + (lo - sg[u].begin), buf + (lo - b),
                       (hi - lo) * sizeof(float));
        }
    }
    uint64_t want = sum_value(&c), got = 0;
    if (fread(&got, 1, sizeof got, c.f) != sizeof got || got != want || fgetc(c.f) != EOF)
        st = zpp_error(ZPP_ERR_FORMAT,
                       "checkpoint file %s is damaged (checksum or length mismatch)", path);
    else st = check_sum(path, m, m->rank_sums, q, got);
out:
    fclose(c.f);
    free(buf);
    return st;
}

/* Finds the manifest of DIR: its pointer, or DIR itself as a step folder. */
static zpp_status locate(const char *dir, manifest *m, char *folder) {
    char path[CKPT_PATH];
    int found = 0;
    char *text = NULL;
    ZPP_CHECK(join(path, dir, CKPT_POINTER));
    ZPP_CHECK(manifest_read_text(path, m, &found, &text));
    if (found) {
        /* The pointer is a copy of its folder's manifest: a folder that
         * another save replaced (another run's) is not resumed. */
        char *mine = NULL, *mpath = malloc(CKPT_PATH);
        manifest fm;
        int there = 0;
        memset(&fm, 0, sizeof fm);
        zpp_status st = mpath ? join(folder, dir, m->folder)
                              : zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
        if (st == ZPP_OK) st = join(mpath, folder, CKPT_MANIFEST);
        if (st == ZPP_OK) st = manifest_read_text(mpath, &fm, &there, &mine);
        if (st == ZPP_OK && !there)
            st = zpp_error(ZPP_ERR_FORMAT, "%s names folder %s, which has no %s", path,
                           m->folder, CKPT_MANIFEST);
        else if (st == ZPP_OK && strcmp(text, mine) != 0)
            st = zpp_error(ZPP_ERR_FORMAT,
                           "%s (run %016llx, step %d) and %s (run %016llx, step %d) differ: "
                           "the folder was replaced by another save (two jobs saving into "
                           "one --save folder?)",
                           path, (unsigned long long)m->run_id, m->step, mpath,
                           (unsigned long long)fm.run_id, fm.step);
        zpp_ckpt_manifest_free(&fm);
        free(mine);
        free(text);
        free(mpath);
        if (st != ZPP_OK) zpp_ckpt_manifest_free(m);
        return st;
    }
    ZPP_CHECK(join(path, dir, CKPT_MANIFEST));
    ZPP_CHECK(manifest_read(path, m, &found));
    if (found) {
        snprintf(folder, CKPT_PATH, "%s", dir);
        return ZPP_OK;
    }
    return zpp_error(ZPP_ERR_IO, "%s is not a checkpoint (no %s/%s: %s)", dir, dir,
                     CKPT_POINTER, is_dir(dir) ? "no checkpoint published yet"
                                               : "no such directory");
}

/* A llama's knobs must match (the family does, checked first): each
 * changes what the saved weights compute. */
static zpp_status compare_llama(const char *dir, const manifest *m, const zpp_ckpt_meta *r) {
    if (strcmp(m->family, "llama")) return ZPP_OK;
    const char *keys[ZPP_DECODER_KNOBS];
    double saved[ZPP_DECODER_KNOBS], now[ZPP_DECODER_KNOBS];
    zpp_decoder_shape_knobs(&m->ext, keys, saved);
    zpp_decoder_shape_knobs(&r->ext, keys, now);
    for (int i = 0; i < ZPP_DECODER_KNOBS; i++)
        if (saved[i] != now[i])
            return zpp_error(ZPP_ERR_CONFIG,
                             "checkpoint %s was saved with %s %.17g, this run has %.17g; resume "
                             "with the model shape it was saved with",
                             dir, keys[i], saved[i], now[i]);
    return ZPP_OK;
}

/* The model and dtype must match; the rest is noted. */
static zpp_status compare(const char *dir, const manifest *m, const zpp_ckpt_meta *r,
                          const zpp_engine *e, char *note, size_t cap) {
    const struct {
        const char *key;
        int saved, now;
    } shape[] = {{"model.n_layer", m->model.n_layer, r->model.n_layer},
                 {"model.n_head", m->model.n_head, r->model.n_head},
                 {"model.n_embd", m->model.n_embd, r->model.n_embd},
                 {"model.seq_len", m->model.seq_len, r->model.seq_len},
                 {"model.vocab_size", m->model.vocab_size, r->model.vocab_size},
                 {"model.real_vocab_size", zpp_gpt2_real_vocab(&m->model),
                  zpp_gpt2_real_vocab(&r->model)}};
    const char *family = r->family ? r->family : "gpt2";
    if (strcmp(m->family, family))
        return zpp_error(ZPP_ERR_CONFIG,
                         "checkpoint %s holds a %s, this run trains a %s; set 'model.family' to "
                         "\"%s\" (and its shape) to resume it",
                         dir, m->family, family, m->family);
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (shape[i].saved != shape[i].now)
            return zpp_error(ZPP_ERR_CONFIG,
                             "checkpoint %s was saved with %s %d, this run has %s %d; resume "
                             "with the model shape it was saved with",
                             dir, shape[i].key, shape[i].saved, shape[i].key, shape[i].now);
    ZPP_CHECK(compare_llama(dir, m, r));
    if (strcmp(m->dtype, zpp_dtype_name(r->dtype)) != 0)
        return zpp_error(ZPP_ERR_CONFIG,
                         "checkpoint %s was saved with working dtype %s, this run uses %s; set "
                         "bf16.enabled / fp16.enabled as when it was saved",
                         dir, m->dtype, zpp_dtype_name(r->dtype));
    if (m->n_units != zpp_engine_unit_count(e))
        return zpp_error(ZPP_ERR_CONFIG, "checkpoint %s has %d units, this model %d", dir,
                         m->n_units, zpp_engine_unit_count(e));
    for (int u = 0; u < m->n_units; u++) {
        size_t numel = 0, b = 0, c = 0;
        ZPP_CHECK(zpp_engine_shard_range(e, u, &numel, &b, &c));
        if (numel != m->numel[u])
            return zpp_error(ZPP_ERR_CONFIG,
                             "checkpoint %s: unit %d has %zu parameters, this model %zu", dir, u,
                             m->numel[u], numel);
    }
    note[0] = '\0';
    size_t k = 0;
    /* one line each, "what: saved -> now" */
#define NOTE(...)                                                                    \
    do {                                                                             \
        if (k < cap) k += (size_t)snprintf(note + k, cap - k, __VA_ARGS__);          \
        if (k < cap) k += (size_t)snprintf(note + k, cap - k, "\n");                 \
    } while (0)
    zpp_train_config saved;
    int have_saved = 0;
    if (m->config && r->config) {
        have_saved = zpp_train_config_defaults(&saved) == ZPP_OK &&
                     zpp_train_config_load_string(m->config, &saved) == ZPP_OK;
        if (have_saved && k < cap) {
            zpp_train_config_diff(&saved, r->config, note + k, cap - k);
            k += strlen(note + k);
        } else if (!have_saved) {
            NOTE("(the saved config could not be read, so its settings are not compared: %s)",
                 zpp_last_error());
        }
    } else if (r->config) {
        NOTE("(saved before checkpoints kept their config: only the model, dtype, ranks, mode, "
             "global batch and seed are compared)");
    }
    if (m->world_size != r->world_size) NOTE("ranks: %d -> %d", m->world_size, r->world_size);
    if (m->node_size != r->node_size) NOTE("node size: %d -> %d", m->node_size, r->node_size);
    if (strcmp(m->mode, r->mode)) NOTE("ZeRO++ mode: %s -> %s", m->mode, r->mode);
    if (m->train_batch_size != r->train_batch_size)
        NOTE("global batch: %d -> %d sequences", m->train_batch_size, r->train_batch_size);
    if (!have_saved && m->seed != r->seed)
        NOTE("zeropp.seed: %llu -> %llu", (unsigned long long)m->seed,
             (unsigned long long)r->seed);
    if (m->has_data && r->data_kind) {
        const char *was = m->data_path ? m->data_path : "the built-in synthetic corpus";
        const char *is = r->data_path ? r->data_path : "the built-in synthetic corpus";
        if (strcmp(was, is)) NOTE("data: %s -> %s", was, is);
        else if (m->data_tokens != (double)r->data_tokens)
            NOTE("data: %s changed: %.0f -> %zu tokens", is, m->data_tokens, r->data_tokens);
    }
    /* The learning rate of the first step trained now, under each config:
     * a schedule that takes its length from the run (total_num_steps 0)
     * stretches when --steps grows, and the lr jumps where it resumes. */
    if (have_saved) {
        const double was = zpp_train_lr(&saved, m->step), is = zpp_train_lr(r->config, m->step);
        const int n_was = zpp_train_schedule_length(&saved);
        const int n_is = zpp_train_schedule_length(r->config);
        if (was != is || n_was != n_is) {
            char ratio[32] = "";
            if (was > 0 && was != is) snprintf(ratio, sizeof ratio, " (x%.3g)", is / was);
            char len[160] = "";
            if (n_was && n_is && n_was != n_is)
                snprintf(len, sizeof len, "; the %s schedule's length: %d -> %d steps%s",
                         zpp_sched_type_name(r->config->scheduler.type), n_was, n_is,
                         r->config->scheduler.total_num_steps ? ""
                                                              : " (zeropp.train_steps, --steps)");
            NOTE("lr at step %d, the first trained now: %.6g -> %.6g%s%s", m->step + 1, was, is,
                 ratio, len);
        }
    }
#undef NOTE
    return ZPP_OK;
}

zpp_status zpp_checkpoint_load(zpp_engine *e, const zpp_ckpt_meta *meta, const char *dir,
                               int *step_p, uint64_t *run_id_p, char *note, size_t cap) {
    manifest m;
    char *folder = malloc(CKPT_PATH), *path = malloc(CKPT_PATH);
    const int n_units = zpp_engine_unit_count(e);
    stage *sg = calloc((size_t)n_units, sizeof *sg);
    zpp_status st = ZPP_OK;
    memset(&m, 0, sizeof m);
    if (!folder || !path || !sg) st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    if (st == ZPP_OK) st = locate(dir, &m, folder);
    if (st == ZPP_OK) st = compare(dir, &m, meta, e, note, cap);
    st = zpp_comm_agree_world(st);
    /* this rank's ranges, then the saved files that overlap them */
    for (int u = 0; u < n_units && st == ZPP_OK; u++) {
        st = zpp_engine_shard_range(e, u, &sg[u].numel, &sg[u].begin, &sg[u].count);
        if (st == ZPP_OK && !(sg[u].x = malloc((3 * sg[u].count + 1) * sizeof(float))))
            st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    }
    for (int q = 0; q < m.world_size && st == ZPP_OK; q++) {
        int overlaps = 0;
        for (int u = 0; u < n_units && !overlaps; u++) {
            size_t L = (m.numel[u] + (size_t)m.world_size - 1) / m.world_size;
            size_t b = (size_t)q * L, end = b + L < m.numel[u] ? b + L : m.numel[u];
            overlaps = b < end && b < sg[u].begin + sg[u].count && sg[u].begin < end;
        }
        if (!overlaps) continue;
        char fname[32];
        snprintf(fname, sizeof fname, "rank-%05d.ckpt", q);
        st = join(path, folder, fname);
        if (st == ZPP_OK) st = read_rank_file(path, &m, q, sg);
    }
    /* Error feedback: this rank's buffers when the checkpoint has them in
     * this run's layout (same world and node size), else they start from
     * zero, as after a reset_T boundary; the note says so. */
    float **ef = NULL;
    const int ef_here = loco_on(e);
    const int ef_same = ef_here && m.loco && m.world_size == meta->world_size &&
                        m.node_size == meta->node_size;
    if (st == ZPP_OK && ef_same) {
        ef = calloc((size_t)n_units, sizeof *ef);
        if (!ef) st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
        for (int u = 0; u < n_units && st == ZPP_OK; u++) {
            size_t li = 0, le = 0;
            st = zpp_engine_loco_lens(e, u, &li, &le);
            if (st == ZPP_OK && !(ef[u] = malloc((li + le + 1) * sizeof(float))))
                st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
        }
        char fname[32];
        snprintf(fname, sizeof fname, "loco-%05d.ckpt", meta->world_rank);
        if (st == ZPP_OK) st = join(path, folder, fname);
        if (st == ZPP_OK) st = read_loco_file(path, &m, meta, e, ef);
    }
    if (st == ZPP_OK && ef_here != m.loco) {
        size_t k = strlen(note);
        snprintf(note + k, cap > k ? cap - k : 0, "error feedback %s\n",
                 ef_here ? "buffers start from zero (the checkpoint has none)"
                         : "buffers of the checkpoint not used (error feedback is off)");
    } else if (st == ZPP_OK && ef_here && !ef_same) {
        size_t k = strlen(note);
        snprintf(note + k, cap > k ? cap - k : 0,
                 "error feedback buffers start from zero (they were saved for %d rank%s, "
                 "node size %d)\n",
                 m.world_size, m.world_size == 1 ? "" : "s", m.node_size);
    }
    /* install only when every rank has everything */
    st = zpp_comm_agree_world(st);
    for (int u = 0; u < n_units && st == ZPP_OK; u++)
        st = zpp_engine_state_set(e, u, sg[u].x, sg[u].x + sg[u].count,
                                  sg[u].x + 2 * sg[u].count);
    if (st == ZPP_OK && ef_here && !ef_same) st = zpp_engine_loco_clear(e);
    for (int u = 0; u < n_units && st == ZPP_OK && ef; u++) {
        size_t li = 0, le = 0;
        st = zpp_engine_loco_lens(e, u, &li, &le);
        if (st == ZPP_OK) st = zpp_engine_loco_set(e, u, ef[u], ef[u] + li);
    }
    for (int u = 0; ef && u < n_units; u++) free(ef[u]);
    free(ef);
    if (st == ZPP_OK) st = zpp_engine_counters_set(e, &m.ctr);
    st = zpp_comm_agree_world(st);
    if (st == ZPP_OK) *step_p = m.step;
    if (st == ZPP_OK && run_id_p) *run_id_p = m.run_id;
    for (int u = 0; sg && u < n_units; u++) free(sg[u].x);
    free(sg);
    zpp_ckpt_manifest_free(&m);
    free(folder);
    free(path);
    return st;
}

zpp_status zpp_checkpoint_read_manifest(const char *dir, zpp_ckpt_manifest *m) {
    char *folder = malloc(CKPT_PATH);
    if (!folder) {
        memset(m, 0, sizeof *m);
        return zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    }
    zpp_status st = locate(dir, m, folder);
    free(folder);
    return st;
}

zpp_status zpp_checkpoint_read_masters(const char *dir, zpp_ckpt_manifest *m, float ***units_p) {
    char *folder = malloc(CKPT_PATH), *path = malloc(CKPT_PATH);
    stage *sg = NULL;
    zpp_status st = ZPP_OK;
    memset(m, 0, sizeof *m);
    if (!folder || !path) st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    if (st == ZPP_OK) st = locate(dir, m, folder);
    if (st == ZPP_OK && !(sg = calloc((size_t)m->n_units, sizeof *sg)))
        st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    /* one stage per unit covering all of it: every rank file lands there */
    for (int u = 0; st == ZPP_OK && u < m->n_units; u++) {
        sg[u] = (stage){m->numel[u], 0, m->numel[u], malloc((m->numel[u] + 1) * sizeof(float)), 1};
        if (!sg[u].x) st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    }
    for (int q = 0; q < m->world_size && st == ZPP_OK; q++) {
        char fname[32];
        snprintf(fname, sizeof fname, "rank-%05d.ckpt", q);
        st = join(path, folder, fname);
        if (st == ZPP_OK) st = read_rank_file(path, m, q, sg);
    }
    float **units = NULL;
    if (st == ZPP_OK && !(units = calloc((size_t)m->n_units, sizeof *units)))
        st = zpp_error(ZPP_ERR_NOMEM, "checkpoint: out of memory");
    for (int u = 0; st == ZPP_OK && u < m->n_units; u++) units[u] = sg[u].x, sg[u].x = NULL;
    if (st == ZPP_OK) *units_p = units;
    for (int u = 0; sg && u < m->n_units; u++) free(sg[u].x);
    free(sg);
    free(folder);
    free(path);
    if (st != ZPP_OK) zpp_ckpt_manifest_free(m);
    return st;
}
