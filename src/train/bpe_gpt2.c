/* train/bpe_gpt2.c — GPT-2's tokenizer files, vocab.json and merges.txt
 * (bpe.h, zpp_bpe_load_gpt2), read into the byte-level core. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"
#include "train/bpe.h"
#include "train/bpe_files.h"
#include "train/utf8.h"

/* Tokenizer files are a few MB; anything past this is not one. */
#define MAX_FILE_BYTES ((size_t)1 << 30)

/* (bpe_files.h) */
zpp_status zpp_bpe_read_file(const char *path, const char *what, char **buf_p, size_t *len_p) {
    int fd = -1;
    struct stat sb;
    ZPP_CHECK(zpp_open_regular(path, what, &fd, &sb));
    const size_t len = (size_t)sb.st_size;
    if (len > MAX_FILE_BYTES) {
        close(fd);
        return zpp_error(ZPP_ERR_FORMAT, "%s '%s' is %zu bytes, too large for a tokenizer file",
                         what, path, len);
    }
    char *buf = malloc(len + 1);
    if (!buf) {
        close(fd);
        return zpp_error(ZPP_ERR_NOMEM, "out of memory reading %s '%s'", what, path);
    }
    size_t got = 0;
    while (got < len) {
        const ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            const int e = r < 0 ? errno : 0;
            close(fd);
            free(buf);
            return zpp_error(ZPP_ERR_IO, "cannot read %s '%s': %s", what, path,
                             e ? strerror(e) : "it shrank while being read");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[len] = 0;
    *buf_p = buf;
    *len_p = len;
    return ZPP_OK;
}

int64_t zpp_bpe_gpt2_string_bytes(const char *s, size_t n, uint8_t *out, size_t *out_n) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        const size_t k = zpp_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (!k) return -1;
        const int b = zpp_bpe_gpt2_char_byte(cp);
        if (b < 0) return (int64_t)cp + 1;
        out[o++] = (uint8_t)b;
        i += k;
    }
    *out_n = o;
    return 0;
}

zpp_status zpp_bpe_alphabet_error(int64_t r, const char *what, const char *path,
                                  const char *where, const char *tok) {
    if (r < 0)
        return zpp_error(ZPP_ERR_FORMAT, "%s '%s': %s \"%.40s\" is not valid UTF-8", what, path,
                         where, tok);
    return zpp_error(ZPP_ERR_FORMAT,
                     "%s '%s': %s \"%.40s\" holds U+%04X, which is not in GPT-2's byte alphabet "
                     "(each byte is written as one printable character, a space as U+0120 'G' "
                     "with a dot); is this a GPT-2 byte-level BPE file?",
                     what, path, where, tok, (unsigned)(r - 1));
}

/* vocab.json -> tokens, their bytes in one block (*arena_p). */
static zpp_status read_vocab(const char *path, zpp_bpe_token **tokens_p, size_t *n_p,
                             uint8_t **arena_p) {
    char *buf = NULL;
    size_t len = 0;
    ZPP_CHECK(zpp_bpe_read_file(path, "vocab", &buf, &len));
    cJSON *root = cJSON_ParseWithLength(buf, len);
    zpp_status st = ZPP_OK;
    if (!root) {
        /* where the parser stopped, as line:column; a file cut short (the
         * usual damage) no longer ends with the object's '}' */
        const char *at = cJSON_GetErrorPtr();
        const size_t off = at && at >= buf && at <= buf + len ? (size_t)(at - buf) : len;
        size_t line = 1, col = 1, last = len;
        for (size_t i = 0; i < off; i++) line += buf[i] == '\n', col = buf[i] == '\n' ? 1 : col + 1;
        while (last > 0 && strchr(" \t\r\n", buf[last - 1])) last--;
        st = zpp_error(ZPP_ERR_FORMAT,
                       "vocab '%s' is not valid JSON (the parser stopped at line %zu, column "
                       "%zu)%s; download GPT-2's vocab.json again",
                       path, line, col,
                       last && buf[last - 1] == '}' ? "" : "; it ends early (truncated?)");
        free(buf);
        return st;
    }
    free(buf);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return zpp_error(ZPP_ERR_FORMAT,
                         "vocab '%s' is JSON but not an object of token -> id; is it GPT-2's "
                         "vocab.json?",
                         path);
    }
    size_t n = 0, bytes = 0;
    for (const cJSON *e = root->child; e; e = e->next) n++, bytes += strlen(e->string);
    zpp_bpe_token *tokens = calloc(n ? n : 1, sizeof *tokens);
    uint8_t *arena = malloc(bytes ? bytes : 1);
    if (!tokens || !arena) st = zpp_error(ZPP_ERR_NOMEM, "out of memory for vocab '%s'", path);
    size_t i = 0, off = 0;
    for (const cJSON *e = root->child; e && st == ZPP_OK; e = e->next, i++) {
        const double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!cJSON_IsNumber(e) || v < 0 || v > ZPP_BPE_MAX_ID || v != (double)(int32_t)v) {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "vocab '%s': the id of \"%.40s\" is not a whole number in [0, %d]",
                           path, e->string, ZPP_BPE_MAX_ID);
            break;
        }
        const size_t klen = strlen(e->string);
        size_t blen = 0;
        const int64_t r = zpp_bpe_gpt2_string_bytes(e->string, klen, arena + off, &blen);
        if (r != 0) {
            st = zpp_bpe_alphabet_error(r, "vocab", path, "token", e->string);
            break;
        }
        if (!blen) {
            st = zpp_error(ZPP_ERR_FORMAT, "vocab '%s': an empty token has id %d", path, (int)v);
            break;
        }
        tokens[i] = (zpp_bpe_token){arena + off, blen, (int32_t)v,
                                    !strcmp(e->string, ZPP_BPE_GPT2_EOT), 0};
        off += blen;
    }
    cJSON_Delete(root);
    if (st != ZPP_OK) {
        free(tokens);
        free(arena);
        return st;
    }
    *tokens_p = tokens;
    *n_p = n;
    *arena_p = arena;
    return ZPP_OK;
}

/* merges.txt -> id pairs, looked up in `vocab` (the vocabulary alone). Each
 * merge's result must be a token; *made marks which tokens some merge makes. */
static zpp_status read_merges(const char *path, const zpp_bpe *vocab, zpp_bpe_merge **merges_p,
                              size_t *n_p, size_t *first_line_p, uint8_t *made) {
    char *buf = NULL;
    size_t len = 0;
    ZPP_CHECK(zpp_bpe_read_file(path, "merges", &buf, &len));
    size_t cap = 1;
    for (size_t i = 0; i < len; i++) cap += buf[i] == '\n';
    zpp_bpe_merge *merges = malloc(cap * sizeof *merges);
    uint8_t *tmp = malloc(2 * len + 1);
    zpp_status st = ZPP_OK;
    if (!merges || !tmp) st = zpp_error(ZPP_ERR_NOMEM, "out of memory for merges '%s'", path);
    size_t n = 0, line = 0, first_line = 1, blank_at = 0;
    for (size_t pos = 0; pos < len && st == ZPP_OK;) {
        char *s = buf + pos;
        char *eol = memchr(s, '\n', len - pos);
        size_t l = eol ? (size_t)(eol - s) : len - pos;
        pos += l + (eol != NULL);
        line++;
        if (l && s[l - 1] == '\r') l--;
        s[l] = 0;
        if (line == 1 && l >= 8 && !memcmp(s, "#version", 8)) {
            first_line = 2;
            continue;
        }
        if (!l) { /* blank: only trailing blank lines are fine */
            if (!blank_at) blank_at = line;
            continue;
        }
        if (blank_at) {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "merges '%s': line %zu is blank but merges follow it (line %zu)", path,
                           blank_at, line);
            break;
        }
        char *sp = memchr(s, ' ', l);
        if (!sp || sp == s || sp == s + l - 1 || memchr(sp + 1, ' ', (size_t)(s + l - sp - 1))) {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "merges '%s': line %zu \"%.60s\" is not two tokens separated by one "
                           "space%s",
                           path, line, s, eol ? "" : " (the file may be truncated)");
            break;
        }
        *sp = 0;
        const char *part[2] = {s, sp + 1};
        int32_t id[2];
        size_t blen[2];
        for (int k = 0; k < 2 && st == ZPP_OK; k++) {
            const int64_t r = zpp_bpe_gpt2_string_bytes(part[k], strlen(part[k]),
                                                        tmp + (k ? blen[0] : 0), &blen[k]);
            char where[48];
            snprintf(where, sizeof where, "line %zu: token", line);
            if (r != 0) {
                st = zpp_bpe_alphabet_error(r, "merges", path, where, part[k]);
                break;
            }
            id[k] = zpp_bpe_find(vocab, tmp + (k ? blen[0] : 0), blen[k]);
            if (id[k] < 0)
                st = zpp_error(ZPP_ERR_FORMAT,
                               "merges '%s': line %zu: token \"%.40s\" is not in the vocabulary; "
                               "are vocab.json and merges.txt from the same tokenizer?",
                               path, line, part[k]);
        }
        if (st != ZPP_OK) break;
        const int32_t result = zpp_bpe_find(vocab, tmp, blen[0] + blen[1]);
        if (result < 0) {
            st = zpp_error(ZPP_ERR_FORMAT,
                           "merges '%s': line %zu merges \"%s\" and \"%.40s\" into a token that "
                           "is not in the vocabulary; are vocab.json and merges.txt from the "
                           "same tokenizer?",
                           path, line, part[0], part[1]);
            break;
        }
        made[result] = 1;
        merges[n++] = (zpp_bpe_merge){id[0], id[1]};
    }
    free(tmp);
    free(buf);
    if (st != ZPP_OK) {
        free(merges);
        return st;
    }
    *merges_p = merges;
    *n_p = n;
    *first_line_p = first_line;
    return ZPP_OK;
}

zpp_status zpp_bpe_load_gpt2(const char *vocab_path, const char *merges_path, zpp_bpe **bpe_p) {
    if (!vocab_path || !merges_path || !bpe_p)
        return zpp_error(ZPP_ERR_INVALID, "zpp_bpe_load_gpt2: NULL argument");
    zpp_bpe_token *tokens = NULL;
    uint8_t *arena = NULL, *made = NULL;
    zpp_bpe_merge *merges = NULL;
    size_t n_tokens = 0, n_merges = 0, first_line = 1;
    zpp_bpe *vocab = NULL, *bpe = NULL;
    zpp_status st = read_vocab(vocab_path, &tokens, &n_tokens, &arena);
    if (st != ZPP_OK) return st;
    /* The vocabulary alone first, to look the merges' tokens up in. */
    zpp_bpe_desc d = {.tokens = tokens, .n_tokens = n_tokens};
    st = zpp_bpe_create(&d, &vocab);
    if (st != ZPP_OK) {
        zpp_error_context(st, "vocab '%s'", vocab_path);
        goto out;
    }
    made = calloc((size_t)zpp_bpe_vocab_size(vocab), 1);
    if (!made) {
        st = zpp_error(ZPP_ERR_NOMEM, "out of memory for vocab '%s'", vocab_path);
        goto out;
    }
    st = read_merges(merges_path, vocab, &merges, &n_merges, &first_line, made);
    if (st != ZPP_OK) goto out;
    /* Every entry longer than a byte but the special token is some merge's
     * result: an entry no merge makes could never be produced, and is what
     * a truncated merges.txt leaves behind. */
    for (size_t i = 0; i < n_tokens; i++)
        if (tokens[i].len > 1 && !tokens[i].special && !made[tokens[i].id]) {
            const uint8_t *b = tokens[i].bytes;
            char shown[64];
            size_t o = 0;
            for (size_t k = 0; k < tokens[i].len && o < 40; k++)
                o += (size_t)snprintf(shown + o, sizeof shown - o, b[k] > 0x20 && b[k] < 0x7F
                                      ? "%c" : "\\x%02X", b[k]);
            st = zpp_error(ZPP_ERR_FORMAT,
                           "vocab '%s': token \"%s\" (id %d) is made by none of the %zu merges "
                           "in '%s'; is merges.txt truncated, or from another tokenizer?",
                           vocab_path, shown, (int)tokens[i].id, n_merges, merges_path);
            goto out;
        }
    d.merges = merges;
    d.n_merges = n_merges;
    d.pattern = ZPP_BPE_GPT2_PATTERN;
    st = zpp_bpe_create(&d, &bpe);
    if (st != ZPP_OK) {
        /* (a pair listed twice: the core counts merges from 0) */
        zpp_error_context(st, "merges '%s' (merge k is on line k + %zu)", merges_path, first_line);
        goto out;
    }
    *bpe_p = bpe;
out:
    zpp_bpe_destroy(vocab);
    free(made);
    free(merges);
    free(tokens);
    free(arena);
    return st;
}
