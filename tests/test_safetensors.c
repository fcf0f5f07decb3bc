/* test_safetensors.c — Hugging Face safetensors files (src/train/safetensors.h):
 * random tensors written and read back byte for byte, whole and in random
 * ranges, single and sharded; the written files checked against the
 * format's rules by parsing their bytes here (not with the reader); and
 * every rule the reader enforces, each broken by a crafted file. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/dtype.h"
#include "testlib.h"
#include "train/safetensors.h"

#define EXPECT_MSG(sub)                                                        \
    EXPECT(strstr(zpp_last_error(), (sub)) != NULL, "message '%s' lacks '%s'", \
           zpp_last_error(), (sub))

static size_t urand(zpp_rng *r, size_t n) { return n ? (size_t)(zpp_rng_u64(r) % n) : 0; }

/* ---- Random tensors ------------------------------------------------------------ */

typedef struct rand_set {
    size_t n;
    zpp_st_source *s;
    uint8_t **bytes; /* tensor i's bytes */
    size_t *size;    /* and their count */
    char **names;
} rand_set;

/* n tensors of random dtypes, ranks 0..4 and small dimensions (some 0), with
 * random bytes and distinct names in a random order. */
static rand_set rand_tensors(zpp_rng *r, size_t n) {
    rand_set t = {n, zpp_test_malloc(n * sizeof(zpp_st_source)),
                  zpp_test_malloc(n * sizeof(uint8_t *)), zpp_test_malloc(n * sizeof(size_t)),
                  zpp_test_malloc(n * sizeof(char *))};
    for (size_t i = 0; i < n; i++) {
        zpp_st_source *s = &t.s[i];
        t.names[i] = zpp_test_malloc(64);
        snprintf(t.names[i], 64, "model.layers.%zu.w%zu", urand(r, 1000), i);
        s->name = t.names[i];
        s->dtype = (zpp_st_dtype)urand(r, ZPP_ST_DTYPES);
        s->ndim = (int)urand(r, 5);
        size_t numel = 1;
        for (int d = 0; d < s->ndim; d++) {
            s->shape[d] = urand(r, 10) == 0 ? 0 : 1 + (int64_t)urand(r, 9);
            numel *= (size_t)s->shape[d];
        }
        t.size[i] = numel * zpp_st_dtype_size(s->dtype);
        t.bytes[i] = zpp_test_malloc(t.size[i]);
        for (size_t b = 0; b < t.size[i]; b++) t.bytes[i][b] = (uint8_t)zpp_rng_u64(r);
        s->data = t.bytes[i];
    }
    return t;
}

static void rand_free(rand_set *t) {
    for (size_t i = 0; i < t->n; i++) free(t->bytes[i]), free(t->names[i]);
    free(t->s), free(t->bytes), free(t->size), free(t->names);
}

/* Tensor i of t read back from f: its dtype, shape and bytes, whole and in
 * a few random ranges. */
static void expect_tensor(zpp_st_file *f, const rand_set *t, size_t i, zpp_rng *r) {
    const zpp_st_tensor *x = zpp_st_find(f, t->s[i].name);
    EXPECT(x, "tensor '%s' is missing", t->s[i].name);
    EXPECT(x->dtype == t->s[i].dtype && x->ndim == t->s[i].ndim, "'%s'", x->name);
    for (int d = 0; d < x->ndim; d++) EXPECT(x->shape[d] == t->s[i].shape[d]);
    EXPECT(x->end - x->begin == t->size[i]);
    uint8_t *got = zpp_test_malloc(t->size[i]);
    EXPECT_OK(zpp_st_read(f, x, 0, t->size[i], got));
    EXPECT(!memcmp(got, t->bytes[i], t->size[i]), "'%s' differs", x->name);
    for (int k = 0; k < 3 && t->size[i]; k++) {
        const size_t lo = urand(r, t->size[i]), n = urand(r, t->size[i] - lo + 1);
        memset(got, 0, t->size[i]);
        EXPECT_OK(zpp_st_read(f, x, lo, n, got));
        EXPECT(!memcmp(got, t->bytes[i] + lo, n), "'%s' bytes [%zu, +%zu)", x->name, lo, n);
    }
    free(got);
}

/* ---- Checking a written file by its bytes -------------------------------------- */

static uint8_t *read_whole(const char *path, size_t *len_p) {
    FILE *f = fopen(path, "rb");
    EXPECT(f, "cannot open '%s'", path);
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = zpp_test_malloc((size_t)len);
    EXPECT(fread(b, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *len_p = (size_t)len;
    return b;
}

/* The file at `path` follows the format as the reference writes it: N a
 * multiple of 8 (the buffer 8-aligned), the JSON padded with spaces,
 * "__metadata__" {"format": "pt"} first, then the tensor keys in byte order
 * with offsets that tile the buffer in that order (no gap, to its end), and
 * the bytes of each where its offsets say. Returns the tensor count. */
static size_t expect_format(const char *path, const rand_set *t) {
    size_t len;
    uint8_t *b = read_whole(path, &len);
    EXPECT(len >= 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    EXPECT(n % 8 == 0 && 8 + n <= len, "header length %llu", (unsigned long long)n);
    size_t json_end = (size_t)n;
    while (json_end > 0 && b[8 + json_end - 1] == ' ') json_end--;
    EXPECT(json_end > 0 && b[8 + json_end - 1] == '}' && n - json_end < 8, "padding");
    cJSON *j = cJSON_ParseWithLength((const char *)b + 8, json_end);
    EXPECT(cJSON_IsObject(j) && j->child, "header of '%s'", path);
    const cJSON *meta = j->child;
    EXPECT(!strcmp(meta->string, "__metadata__"), "first key '%s'", meta->string);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(meta, "format");
    EXPECT(cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "pt"));
    size_t at = 0, count = 0;
    const char *prev = NULL;
    for (const cJSON *e = meta->next; e; e = e->next, count++) {
        EXPECT(!prev || strcmp(prev, e->string) < 0, "'%s' after '%s'", e->string, prev);
        prev = e->string;
        const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        const size_t lo = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
        const size_t hi = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        EXPECT(lo == at && hi >= lo, "'%s' at [%zu, %zu), expected to start at %zu", e->string,
               lo, hi, at);
        at = hi;
        size_t i = 0;
        while (i < t->n && strcmp(t->s[i].name, e->string)) i++;
        EXPECT(i < t->n && t->size[i] == hi - lo, "'%s' is no tensor given", e->string);
        const char *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring;
        EXPECT(!strcmp(dt, zpp_st_dtype_name(t->s[i].dtype)), "'%s' dtype %s", e->string, dt);
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        EXPECT(cJSON_GetArraySize(sh) == t->s[i].ndim);
        for (int d = 0; d < t->s[i].ndim; d++)
            EXPECT(cJSON_GetArrayItem(sh, d)->valuedouble == (double)t->s[i].shape[d]);
        EXPECT(!memcmp(b + 8 + n + lo, t->bytes[i], hi - lo), "'%s' bytes", e->string);
    }
    EXPECT(8 + n + at == len, "the buffer ends at %zu, the file at %zu", (size_t)(8 + n + at),
           len);
    cJSON_Delete(j);
    free(b);
    return count;
}

/* ---- Round trips --------------------------------------------------------------- */

static void test_roundtrip(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(1));
    char path[512];
    zpp_test_tmp_path("one.safetensors", path);
    for (int rep = 0; rep < 5; rep++) {
        rand_set t = rand_tensors(&r, 1 + urand(&r, 40));
        EXPECT_OK(zpp_st_write(path, t.s, t.n));
        EXPECT(expect_format(path, &t) == t.n);
        zpp_st_file *f = NULL;
        EXPECT_OK(zpp_st_open(path, &f));
        EXPECT(zpp_st_count(f) == t.n);
        EXPECT(zpp_st_metadata(f, "format") && !strcmp(zpp_st_metadata(f, "format"), "pt"));
        for (size_t i = 0; i < t.n; i++) expect_tensor(f, &t, i, &r);
        EXPECT(!zpp_st_find(f, "no.such.tensor"));
        zpp_st_close(f);
        rand_free(&t);
    }
}

/* bytes [offset, offset + n) of a tensor whose bytes are (offset + k) * 7. */
static zpp_status fill_pattern(void *ctx, size_t offset, size_t n, void *out) {
    (void)ctx;
    for (size_t k = 0; k < n; k++) ((uint8_t *)out)[k] = (uint8_t)((offset + k) * 7);
    return ZPP_OK;
}

/* A tensor from a fill callback (past one chunk) equals the same bytes
 * given whole; a failing fill leaves no file. */
static void test_fill(void) {
    const size_t numel = ZPP_ST_FILL_CHUNK / 2 + 1000; /* F32: two chunks */
    uint8_t *want = zpp_test_malloc(4 * numel);
    fill_pattern(NULL, 0, 4 * numel, want);
    zpp_st_source s = {.name = "big", .dtype = ZPP_ST_F32, .ndim = 1, .shape = {(int64_t)numel},
                       .fill = fill_pattern};
    char path[512];
    zpp_test_tmp_path("fill.safetensors", path);
    EXPECT_OK(zpp_st_write(path, &s, 1));
    zpp_st_file *f = NULL;
    EXPECT_OK(zpp_st_open(path, &f));
    uint8_t *got = zpp_test_malloc(4 * numel);
    EXPECT_OK(zpp_st_read(f, zpp_st_find(f, "big"), 0, 4 * numel, got));
    EXPECT(!memcmp(got, want, 4 * numel));
    zpp_st_close(f);
    free(got);
    free(want);
}

/* zpp_st_read_f32 widens BF16 and F16 exactly and passes F32 through, for
 * any element range; other dtypes are refused. */
static void test_read_f32(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(2));
    const size_t n = 70000 + urand(&r, 1000); /* past the staging chunk */
    const zpp_st_dtype dts[3] = {ZPP_ST_BF16, ZPP_ST_F16, ZPP_ST_F32};
    const zpp_dtype ours[3] = {ZPP_BF16, ZPP_FP16, ZPP_FP32};
    zpp_st_source s[4];
    void *data[3];
    for (int k = 0; k < 3; k++) {
        data[k] = zpp_test_malloc(4 * n);
        for (size_t i = 0; i < n; i++)
            zpp_store_f32(data[k], ours[k], i, (float)zpp_rng_normal(&r));
        s[k] = (zpp_st_source){.name = (const char *[]){"a", "b", "c"}[k], .dtype = dts[k],
                               .ndim = 1, .shape = {(int64_t)n}, .data = data[k]};
    }
    s[3] = (zpp_st_source){.name = "d", .dtype = ZPP_ST_I32, .ndim = 1, .shape = {4},
                           .data = data[0]};
    char path[512];
    zpp_test_tmp_path("f32.safetensors", path);
    EXPECT_OK(zpp_st_write(path, s, 4));
    zpp_st_file *f = NULL;
    EXPECT_OK(zpp_st_open(path, &f));
    float *out = zpp_test_malloc(4 * n);
    for (int k = 0; k < 3; k++) {
        const size_t lo = urand(&r, n), cnt = urand(&r, n - lo + 1);
        EXPECT_OK(zpp_st_read_f32(f, zpp_st_find(f, s[k].name), lo, cnt, out));
        for (size_t i = 0; i < cnt; i++) {
            const float want = zpp_load_f32(data[k], ours[k], lo + i);
            EXPECT(!memcmp(&out[i], &want, 4), "%s element %zu", s[k].name, lo + i);
        }
        EXPECT_STATUS(zpp_st_read_f32(f, zpp_st_find(f, s[k].name), n, 1, out), ZPP_ERR_INVALID);
    }
    EXPECT_STATUS(zpp_st_read_f32(f, zpp_st_find(f, "d"), 0, 1, out), ZPP_ERR_UNSUPPORTED);
    EXPECT_MSG("I32");
    EXPECT_STATUS(zpp_st_read(f, zpp_st_find(f, "d"), 8, 9, out), ZPP_ERR_INVALID);
    zpp_st_close(f);
    free(out);
    for (int k = 0; k < 3; k++) free(data[k]);
}

/* The folder's entries, into names (a NULL-ended list of 64 at most). */
static int list_dir(const char *dir, char names[64][256]) {
    DIR *d = opendir(dir);
    EXPECT(d, "opendir '%s'", dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.' && n < 64) snprintf(names[n++], 256, "%s", e->d_name);
    closedir(d);
    return n;
}

/* Sharded at a small limit: each shard within the limit (or one tensor
 * larger than it), follows the format, and every tensor comes back byte for
 * byte through the index; at a limit above the total, one file, no index. */
static void test_sharded(void) {
    zpp_rng r = zpp_rng_make(zpp_test_seed(3));
    rand_set t = rand_tensors(&r, 20 + urand(&r, 30));
    size_t total = 0;
    for (size_t i = 0; i < t.n; i++) total += t.size[i];
    /* Below the total, so at least two shards (n >= 20: a tensor that
     * crosses the limit always has another before or after it). */
    const size_t limit = 1 + urand(&r, total - 1);
    char dir[512], path[1024];
    zpp_test_tmp_path("sharded", dir);
    EXPECT(mkdir(dir, 0777) == 0);
    int shards = 0;
    EXPECT_OK(zpp_st_write_dir(dir, t.s, t.n, limit, &shards));
    EXPECT(shards > 1, "%d shards of %zu bytes for %zu", shards, limit, total);
    snprintf(path, sizeof path, "%s/%s", dir, ZPP_ST_INDEX_NAME);
    zpp_st_index *x = NULL;
    EXPECT_OK(zpp_st_index_open(path, &x));
    EXPECT(zpp_st_index_count(x) == t.n && zpp_st_index_total_size(x) == total);
    EXPECT(zpp_st_index_files(x) == (size_t)shards);
    size_t in_shards = 0;
    for (int k = 0; k < shards; k++) {
        char want[64];
        snprintf(want, sizeof want, "model-%05d-of-%05d.safetensors", k + 1, shards);
        EXPECT(!strcmp(zpp_st_index_file(x, (size_t)k), want), "file %d is '%s'", k,
               zpp_st_index_file(x, (size_t)k));
        snprintf(path, sizeof path, "%s/%s", dir, want);
        in_shards += expect_format(path, &t);
        zpp_st_file *f = NULL;
        EXPECT_OK(zpp_st_open(path, &f));
        size_t bytes = 0;
        for (size_t i = 0; i < zpp_st_count(f); i++) {
            const zpp_st_tensor *y = zpp_st_tensor_at(f, i);
            EXPECT(!strcmp(zpp_st_index_find(x, y->name), want), "'%s'", y->name);
            bytes += y->end - y->begin;
        }
        EXPECT(bytes <= limit || zpp_st_count(f) == 1, "shard %d holds %zu bytes", k, bytes);
        for (size_t i = 0; i < t.n; i++)
            if (!strcmp(zpp_st_index_find(x, t.s[i].name), want)) expect_tensor(f, &t, i, &r);
        zpp_st_close(f);
    }
    EXPECT(in_shards == t.n);
    EXPECT(!zpp_st_index_find(x, "no.such.tensor"));
    zpp_st_index_close(x);
    char names[64][256];
    EXPECT(list_dir(dir, names) == shards + 1, "stray files beside the shards");
    /* Above the total: model.safetensors alone. */
    zpp_test_tmp_path("single", dir);
    EXPECT(mkdir(dir, 0777) == 0);
    EXPECT_OK(zpp_st_write_dir(dir, t.s, t.n, total, &shards));
    EXPECT(shards == 1 && list_dir(dir, names) == 1 && !strcmp(names[0], ZPP_ST_SINGLE_NAME));
    snprintf(path, sizeof path, "%s/%s", dir, ZPP_ST_SINGLE_NAME);
    EXPECT(expect_format(path, &t) == t.n);
    rand_free(&t);
}

/* ---- Refusals ------------------------------------------------------------------ */

/* A file of header length `n_field`, the text `json` padded with spaces to
 * `pad`, and `buffer` bytes after it. */
static const char *craft(const char *json, uint64_t n_field, size_t buffer, char *path) {
    static int k;
    char name[64];
    snprintf(name, sizeof name, "bad%d.safetensors", k++);
    zpp_test_tmp_path(name, path);
    const size_t jl = strlen(json), len = 8 + jl + buffer;
    uint8_t *b = zpp_test_malloc(len);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(n_field >> (8 * i));
    memcpy(b + 8, json, jl);
    zpp_test_write_file(path, b, len);
    free(b);
    return path;
}

/* `json` as a whole header over `buffer` bytes must be refused with a
 * message holding `why`. */
static void expect_refused(const char *json, size_t buffer, const char *why) {
    char path[512];
    zpp_st_file *f = NULL;
    EXPECT_STATUS(zpp_st_open(craft(json, strlen(json), buffer, path), &f), ZPP_ERR_FORMAT);
    EXPECT(!f);
    EXPECT_MSG(why);
}

static void test_refusals(void) {
    char path[512];
    zpp_st_file *f = NULL;
    /* The header length: past the file, over the limit, a file too short. */
    EXPECT_STATUS(zpp_st_open(craft("{}", 3, 0, path), &f), ZPP_ERR_FORMAT);
    EXPECT_MSG("past the end of the file");
    EXPECT_STATUS(zpp_st_open(craft("{}", 200000000, 0, path), &f), ZPP_ERR_FORMAT);
    EXPECT_MSG("limit of 100000000");
    zpp_test_write_file(path, "abc", 3);
    EXPECT_STATUS(zpp_st_open(path, &f), ZPP_ERR_FORMAT);
    EXPECT_MSG("shorter than the 8-byte");
    /* The JSON. */
    expect_refused("[1, 2]", 0, "not a JSON object");
    expect_refused("{\"a\": ", 0, "not a JSON object");
    expect_refused("{}  x  ", 0, "not a space");
    expect_refused("{\"__metadata__\": {\"format\": 1}}", 0, "'format' is not a string");
    expect_refused("{\"a\": 3}", 0, "tensor 'a' is not a JSON object");
    /* One tensor's entry. */
    const char *T = "{\"a\": {\"dtype\": \"%s\", \"shape\": %s, \"data_offsets\": [%s]}}";
    char j[512];
    snprintf(j, sizeof j, T, "F17", "[2]", "0, 8");
    expect_refused(j, 8, "unknown dtype 'F17'");
    snprintf(j, sizeof j, T, "F32", "[-2]", "0, 8");
    expect_refused(j, 8, "dimension 0 is not a non-negative integer");
    snprintf(j, sizeof j, T, "F32", "[2, 1.5]", "0, 8");
    expect_refused(j, 8, "dimension 1 is not a non-negative integer");
    snprintf(j, sizeof j, T, "F32", "\"2\"", "0, 8");
    expect_refused(j, 8, "shape that is not an array");
    snprintf(j, sizeof j, T, "F32", "[2]", "0, 12");
    expect_refused(j, 12, "spans 12 bytes");
    snprintf(j, sizeof j, T, "F32", "[2]", "8, 0");
    expect_refused(j, 8, "data_offsets");
    snprintf(j, sizeof j, T, "F32", "[2]", "8, 16");
    expect_refused(j, 8, "out of the 8-byte buffer");
    /* The layout: overlap, holes, duplicates. */
    const char *two = "{\"a\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [%d, %d]}, "
                      "\"%s\": {\"dtype\": \"U8\", \"shape\": [4], \"data_offsets\": [%d, %d]}}";
    snprintf(j, sizeof j, two, 0, 4, "b", 2, 6);
    expect_refused(j, 6, "overlaps tensor 'a'");
    snprintf(j, sizeof j, two, 0, 4, "b", 5, 9);
    expect_refused(j, 9, "hole of bytes [4, 5)");
    snprintf(j, sizeof j, two, 0, 4, "b", 4, 8);
    expect_refused(j, 10, "hole of bytes [8, 10)");
    snprintf(j, sizeof j, two, 1, 5, "b", 5, 9);
    expect_refused(j, 9, "hole of bytes [0, 1)");
    snprintf(j, sizeof j, two, 0, 4, "a", 4, 8);
    expect_refused(j, 8, "duplicate tensor name 'a'");
    /* And a good one of the same shape opens. */
    snprintf(j, sizeof j, two, 4, 8, "b", 0, 4);
    EXPECT_OK(zpp_st_open(craft(j, strlen(j), 8, path), &f));
    EXPECT(!strcmp(zpp_st_tensor_at(f, 0)->name, "b")); /* in the order of the buffer */
    zpp_st_close(f);
}

/* The writer's refusals leave nothing behind. */
static void test_write_refusals(void) {
    uint8_t data[16] = {0};
    zpp_st_source s[2] = {{.name = "x", .dtype = ZPP_ST_U8, .ndim = 1, .shape = {4}, .data = data},
                          {.name = "x", .dtype = ZPP_ST_U8, .ndim = 1, .shape = {4}, .data = data}};
    char dir[512], path[1024], names[64][256];
    zpp_test_tmp_path("refused", dir);
    EXPECT(mkdir(dir, 0777) == 0);
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    EXPECT_STATUS(zpp_st_write(path, s, 2), ZPP_ERR_INVALID);
    EXPECT_MSG("'x' is given twice");
    s[1].name = "__metadata__";
    EXPECT_STATUS(zpp_st_write(path, s, 2), ZPP_ERR_INVALID);
    EXPECT_MSG("other than __metadata__");
    s[1].name = "y";
    s[1].shape[0] = -1;
    EXPECT_STATUS(zpp_st_write(path, s, 2), ZPP_ERR_INVALID);
    EXPECT_MSG("dimension 0");
    s[1].shape[0] = 4;
    s[1].data = NULL;
    EXPECT_STATUS(zpp_st_write_dir(dir, s, 2, 0, NULL), ZPP_ERR_INVALID);
    EXPECT_MSG("neither data nor fill");
    EXPECT(list_dir(dir, names) == 0, "'%s' was left behind", names[0]);
}

/* An index that is not one is refused naming the problem. */
static void test_index_refusals(void) {
    char path[512];
    zpp_st_index *x = NULL;
    const struct {
        const char *json, *why;
    } bad[] = {
        {"[]", "\"weight_map\" object"},
        {"{\"metadata\": {}}", "\"weight_map\" object"},
        {"{\"weight_map\": {\"a\": \"../x.safetensors\"}}", "weight_map['a']"},
        {"{\"weight_map\": {\"a\": 7}}", "weight_map['a']"},
        {"{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}", "duplicate tensor name 'a'"},
        {"{\"metadata\": {\"total_size\": -4}, \"weight_map\": {}}", "total_size"},
    };
    zpp_test_tmp_path("index.json", path);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zpp_test_write_file(path, bad[i].json, strlen(bad[i].json));
        EXPECT_STATUS(zpp_st_index_open(path, &x), ZPP_ERR_FORMAT);
        EXPECT_MSG(bad[i].why);
    }
}

ZPP_TESTS(
    ZPP_TEST(test_roundtrip),
    ZPP_TEST(test_fill),
    ZPP_TEST(test_read_f32),
    ZPP_TEST(test_sharded),
    ZPP_TEST(test_refusals),
    ZPP_TEST(test_write_refusals),
    ZPP_TEST(test_index_refusals),
)
