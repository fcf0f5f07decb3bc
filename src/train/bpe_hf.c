/* train/bpe_hf.c — Hugging Face's tokenizer.json (bpe.h, zpp_bpe_load_hf),
 * read into the BPE core.
 *
 * A tokenizer.json is one JSON object; of it we read
 *   model            {"type": "BPE", "vocab": {token: id}, "merges": [...],
 *                    "ignore_merges": bool, "byte_fallback": bool,
 *                    "unk_token", "fuse_unk", ...}: merges ranked by
 *                    position, each "LEFT RIGHT" (older files) or
 *                    ["LEFT", "RIGHT"] (newer ones); tokens written in
 *                    GPT-2's printable byte alphabet (bpe_files.h) for a
 *                    byte-level BPE, in raw UTF-8 with "▁" for a space for
 *                    a SentencePiece-style one;
 *   added_tokens     [{"id", "content", "normalized", ...}]: tokens matched
 *                    in the text before it is split, their content raw
 *                    UTF-8 (not in the byte alphabet); they become the
 *                    core's special tokens, "normalized" ones matched in a
 *                    second pass (bpe.h);
 *   pre_tokenizer    how text is cut into pieces: ByteLevel (GPT-2's regex
 *                    when use_regex), or Sequence [Split, ByteLevel] where
 *                    the Split's regex cuts and ByteLevel (use_regex false)
 *                    only maps bytes to the alphabet (Llama 3, Qwen2); or
 *                    Metaspace (SentencePiece-style: spaces as "▁", one
 *                    put in front, pieces starting at each "▁");
 *   normalizer       null; NFC (Qwen2's, GPT-NeoX's) before a byte-level
 *                    pre_tokenizer (nfc.h); or Llama 2's Sequence [Prepend
 *                    "▁", Replace " " -> "▁"] (SentencePiece-style,
 *                    pre_tokenizer null).
 * The kind is told by the normalizer and pre_tokenizer: the SentencePiece
 * forms make it SentencePiece-style (bpe.h, zpp_bpe_chars), the others
 * byte-level. post_processor (which adds <|begin_of_text|> or <s> in front)
 * and decoder are not read: encoding gives the text's tokens alone;
 * decoding is the core's for the kind (for SentencePiece-style files it is
 * what their decoder Sequence [Replace "▁" -> " ", ByteFallback, Fuse,
 * Strip one leading space] does). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "train/bpe.h"
#include "train/bpe_files.h"

/* What the file says beyond vocabulary and merges. */
typedef struct hf_form {
    const char *pattern; /* into the parsed JSON, or ZPP_BPE_GPT2_PATTERN; NULL: no split */
    int whole_pieces;    /* model.ignore_merges */
    /* SentencePiece-style (bpe.h, zpp_bpe_chars): tokens in raw UTF-8 with
     * "▁" for spaces; else byte-level */
    int sentencepiece;
    zpp_bpe_chars chars; /* prepend and split; the ids once the vocabulary is read */
    const char *unk;     /* model.unk_token, or NULL */
    int nfc;             /* the normalizer NFC (zpp_bpe_desc.nfc) */
} hf_form;

/* The tokens, their bytes in one block. */
typedef struct hf_vocab {
    zpp_bpe_token *tokens;
    size_t n;
    uint8_t *arena;
    size_t arena_used;
} hf_vocab;

static const cJSON *item(const cJSON *j, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(j, key);
}

static const char *type_of(const cJSON *j) {
    const cJSON *t = item(j, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static int type_is(const cJSON *j, const char *type) {
    const char *t = type_of(j);
    return t && !strcmp(t, type);
}

/* A key that is set to something other than null, false, 0 or "" (the
 * values that leave BPE as it is). */
static int is_set(const cJSON *j, const char *key) {
    const cJSON *v = item(j, key);
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsString(v)) return v->valuestring[0] != 0;
    return 1;
}

/* model: a BPE whose tokens are exactly what merging bytes makes. */
static zpp_status check_model(const cJSON *model, const char *path, hf_form *form) {
    if (!cJSON_IsObject(model))
        return zpp_error(ZPP_ERR_FORMAT,
                         "tokenizer '%s' has no \"model\" object; is it a Hugging Face "
                         "tokenizer.json?",
                         path);
    if (!type_is(model, "BPE"))
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "tokenizer '%s': model.type is \"%s\"; only \"BPE\" (byte-level, as "
                         "GPT-2, Llama 3 and Qwen2 have) is supported",
                         path, type_of(model) ? type_of(model) : "(none)");
    if (is_set(model, "byte_fallback") && !form->sentencepiece)
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "tokenizer '%s': model.byte_fallback is set (SentencePiece-style "
                         "<0x41> byte tokens) but the text is not written SentencePiece's way; "
                         "byte fallback is supported with the normalizer Sequence [Prepend "
                         "\"\u2581\", Replace \" \" -> \"\u2581\"] or the pre_tokenizer Metaspace",
                         path);
    if (form->sentencepiece && cJSON_IsTrue(item(model, "ignore_merges")))
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "tokenizer '%s': model.ignore_merges is true in a SentencePiece-style "
                         "tokenizer; only false is supported there",
                         path);
    const cJSON *unk = item(model, "unk_token");
    form->unk = cJSON_IsString(unk) ? unk->valuestring : NULL;
    form->chars.byte_fallback = cJSON_IsTrue(item(model, "byte_fallback"));
    form->chars.fuse_unk = cJSON_IsTrue(item(model, "fuse_unk"));
    /* each of these changes which tokens come out */
    static const char *const changes[] = {"dropout", "continuing_subword_prefix",
                                          "end_of_word_suffix"};
    for (size_t k = 0; k < sizeof changes / sizeof *changes; k++)
        if (is_set(model, changes[k]))
            return zpp_error(ZPP_ERR_UNSUPPORTED,
                             "tokenizer '%s': model.%s is set; only null (or empty) is "
                             "supported",
                             path, changes[k]);
    if (!cJSON_IsObject(item(model, "vocab")) || !cJSON_IsArray(item(model, "merges")))
        return zpp_error(ZPP_ERR_FORMAT,
                         "tokenizer '%s': model.vocab is not an object or model.merges not an "
                         "array",
                         path);
    form->whole_pieces = cJSON_IsTrue(item(model, "ignore_merges"));
    return ZPP_OK;
}

static zpp_status read_byte_level(const cJSON *j, const char *path, int *use_regex) {
    if (is_set(j, "add_prefix_space"))
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "tokenizer '%s': pre_tokenizer ByteLevel has add_prefix_space (a space "
                         "put before the text); only false is supported",
                         path);
    *use_regex = !cJSON_IsFalse(item(j, "use_regex")); /* default true */
    return ZPP_OK;
}

/* Split, as Llama 3 and Qwen2 write it: each match of a regex is a piece,
 * and so is each run of text between matches ("Isolated"), which is how the
 * core splits. */
static zpp_status read_split(const cJSON *j, const char *path, const char **pattern) {
    const cJSON *re = item(item(j, "pattern"), "Regex"), *behavior = item(j, "behavior");
    if (!cJSON_IsString(re))
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "tokenizer '%s': pre_tokenizer Split has no pattern {\"Regex\": ...}; "
                         "only a Regex pattern is supported",
                         path);
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated"))
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "tokenizer '%s': pre_tokenizer Split has behavior \"%s\"; only "
                         "\"Isolated\" is supported",
                         path, cJSON_IsString(behavior) ? behavior->valuestring : "(none)");
    if (is_set(j, "invert"))
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "tokenizer '%s': pre_tokenizer Split has invert true; only false is "
                         "supported",
                         path);
    *pattern = re->valuestring;
    return ZPP_OK;
}

#define SPACE_MARK "\u2581" /* "▁", SentencePiece's space (ZPP_BPE_SPACE) */

static int string_is(const cJSON *j, const char *s) {
    return cJSON_IsString(j) && !strcmp(j->valuestring, s);
}

/* Llama 2's normalizer: Sequence [Prepend "▁", Replace " " -> "▁"] (in
 * either order: the prepended "▁" is no space), every segment of text
 * between special tokens prefixed. 1 when `norm` is that. */
static int is_llama2_normalizer(const cJSON *norm) {
    const cJSON *list = item(norm, "normalizers");
    if (!type_is(norm, "Sequence") || cJSON_GetArraySize(list) != 2) return 0;
    int prepend = 0, replace = 0;
    for (const cJSON *n = list->child; n; n = n->next) {
        if (type_is(n, "Prepend") && string_is(item(n, "prepend"), SPACE_MARK)) prepend++;
        if (type_is(n, "Replace") && string_is(item(item(n, "pattern"), "String"), " ") &&
            string_is(item(n, "content"), SPACE_MARK))
            replace++;
    }
    return prepend == 1 && replace == 1;
}

/* Metaspace: spaces as "▁", a "▁" put in front as prepend_scheme says
 * (older files: add_prefix_space true is "always"), and with split (the
 * default) a piece starting at each "▁". */
static zpp_status read_metaspace(const cJSON *pt, const char *path, hf_form *form) {
    const cJSON *scheme = item(pt, "prepend_scheme"), *split = item(pt, "split");
    if (!string_is(item(pt, "replacement"), SPACE_MARK))
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "tokenizer '%s': pre_tokenizer Metaspace has a replacement other than "
                         "\"" SPACE_MARK "\"; only \"" SPACE_MARK "\" is supported",
                         path);
    if (string_is(scheme, "first")) form->chars.prepend = ZPP_BPE_PREPEND_FIRST;
    else if (string_is(scheme, "always")) form->chars.prepend = ZPP_BPE_PREPEND_ALWAYS;
    else if (string_is(scheme, "never")) form->chars.prepend = ZPP_BPE_PREPEND_NEVER;
    else if (scheme)
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "tokenizer '%s': pre_tokenizer Metaspace has prepend_scheme \"%s\"; "
                         "only \"first\", \"always\" or \"never\" is supported",
                         path, cJSON_IsString(scheme) ? scheme->valuestring : "?");
    else
        form->chars.prepend = is_set(pt, "add_prefix_space") ? ZPP_BPE_PREPEND_ALWAYS
                                                             : ZPP_BPE_PREPEND_NEVER;
    form->chars.split = !cJSON_IsFalse(split); /* default true */
    form->sentencepiece = 1;
    return ZPP_OK;
}

/* normalizer and pre_tokenizer -> form->pattern, or SentencePiece's
 * spaces (form->sentencepiece, form->chars). */
static zpp_status read_pre_tokenizer(const cJSON *root, const char *path, hf_form *form) {
    const cJSON *norm = item(root, "normalizer");
    const cJSON *pt = item(root, "pre_tokenizer"), *list = item(pt, "pretokenizers");
    form->nfc = type_is(norm, "NFC");
    if (form->nfc && type_is(pt, "Metaspace"))
        return zpp_error(ZPP_ERR_UNSUPPORTED,
                         "tokenizer '%s': normalizer NFC before pre_tokenizer Metaspace; NFC is "
                         "supported before the byte-level pre_tokenizers only",
                         path);
    if (norm && !cJSON_IsNull(norm) && !form->nfc) {
        if (!is_llama2_normalizer(norm))
            return zpp_error(ZPP_ERR_UNSUPPORTED,
                             "tokenizer '%s': normalizer \"%s\" rewrites the text before it is "
                             "split; only a null normalizer, NFC, or Sequence [Prepend \""
                             SPACE_MARK "\", Replace \" \" -> \"" SPACE_MARK "\"] (Llama 2's), is "
                             "supported",
                             path, type_of(norm) ? type_of(norm) : "?");
        if (pt && !cJSON_IsNull(pt))
            return zpp_error(ZPP_ERR_UNSUPPORTED,
                             "tokenizer '%s': pre_tokenizer %s after Llama 2's normalizer "
                             "(Prepend, Replace); only a null pre_tokenizer is supported there",
                             path, type_of(pt) ? type_of(pt) : "?");
        form->sentencepiece = 1;
        form->chars.prepend = ZPP_BPE_PREPEND_EVERY;
        form->chars.split = 0;
        return ZPP_OK;
    }
    if (type_is(pt, "Metaspace")) return read_metaspace(pt, path, form);
    int use_regex = 0;
    if (type_is(pt, "ByteLevel")) {
        ZPP_CHECK(read_byte_level(pt, path, &use_regex));
        form->pattern = use_regex ? ZPP_BPE_GPT2_PATTERN : NULL;
        return ZPP_OK;
    }
    if (type_is(pt, "Sequence") && cJSON_GetArraySize(list) == 2 &&
        type_is(cJSON_GetArrayItem(list, 0), "Split") &&
        type_is(cJSON_GetArrayItem(list, 1), "ByteLevel")) {
        ZPP_CHECK(read_split(cJSON_GetArrayItem(list, 0), path, &form->pattern));
        ZPP_CHECK(read_byte_level(cJSON_GetArrayItem(list, 1), path, &use_regex));
        if (use_regex) /* a second split of the Split's pieces */
            return zpp_error(ZPP_ERR_UNSUPPORTED,
                             "tokenizer '%s': pre_tokenizer Sequence [Split, ByteLevel] has "
                             "ByteLevel use_regex true; only false is supported",
                             path);
        return ZPP_OK;
    }
    return zpp_error(ZPP_ERR_UNSUPPORTED,
                     "tokenizer '%s': pre_tokenizer %s%s is not supported; only ByteLevel, "
                     "Sequence [Split (a Regex, Isolated), ByteLevel (use_regex false)] or "
                     "Metaspace",
                     path, type_of(pt) ? type_of(pt) : "null",
                     type_is(pt, "Sequence") ? " (of other steps)" : "");
}

/* An id as JSON gives it: a whole number in [0, ZPP_BPE_MAX_ID], else -1. */
static int32_t json_id(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return -1;
    const double d = v->valuedouble;
    return d >= 0 && d <= ZPP_BPE_MAX_ID && d == (double)(int32_t)d ? (int32_t)d : -1;
}

/* model.vocab -> v (room is made for the added tokens too). */
static zpp_status read_model_vocab(const cJSON *vocab, const cJSON *added, const char *path,
                                   int raw, hf_vocab *v) {
    size_t n = 0, bytes = 0;
    for (const cJSON *e = vocab->child; e; e = e->next) n++, bytes += strlen(e->string);
    for (const cJSON *e = cJSON_IsArray(added) ? added->child : NULL; e; e = e->next) {
        const cJSON *c = item(e, "content");
        n++, bytes += cJSON_IsString(c) ? strlen(c->valuestring) : 0;
    }
    v->tokens = calloc(n ? n : 1, sizeof *v->tokens);
    v->arena = malloc(bytes ? bytes : 1);
    if (!v->tokens || !v->arena)
        return zpp_error(ZPP_ERR_NOMEM, "out of memory for tokenizer '%s'", path);
    for (const cJSON *e = vocab->child; e; e = e->next) {
        const int32_t id = json_id(e);
        if (id < 0)
            return zpp_error(ZPP_ERR_FORMAT,
                             "tokenizer '%s': model.vocab: the id of \"%.40s\" is not a whole "
                             "number in [0, %d]",
                             path, e->string, ZPP_BPE_MAX_ID);
        uint8_t *at = v->arena + v->arena_used;
        size_t len = 0;
        if (raw) { /* SentencePiece-style: the text itself */
            len = strlen(e->string);
            memcpy(at, e->string, len);
        } else {
            const int64_t r = zpp_bpe_gpt2_string_bytes(e->string, strlen(e->string), at, &len);
            if (r != 0) return zpp_bpe_alphabet_error(r, "tokenizer", path, "model.vocab token",
                                                      e->string);
        }
        if (!len)
            return zpp_error(ZPP_ERR_FORMAT,
                             "tokenizer '%s': model.vocab: an empty token has id %d", path,
                             (int)id);
        v->tokens[v->n++] = (zpp_bpe_token){at, len, id, 0, 0};
        v->arena_used += len;
    }
    return ZPP_OK;
}

/* added_tokens -> special tokens in v: an entry model.vocab already holds
 * (GPT-2's "<|endoftext|>") is marked special; the others (Llama 3's
 * "<|begin_of_text|>") are added. One matched in the normalized text
 * ("normalized": true) is special 2 (bpe.h, zpp_bpe_token). */
static zpp_status read_added_tokens(const cJSON *added, const char *path, hf_vocab *v) {
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added))
        return zpp_error(ZPP_ERR_FORMAT, "tokenizer '%s': added_tokens is not an array", path);
    const size_t n_model = v->n;
    size_t k = 0;
    for (const cJSON *e = added ? added->child : NULL; e; e = e->next, k++) {
        const cJSON *content = item(e, "content");
        const int32_t id = json_id(item(e, "id"));
        if (id < 0 || !cJSON_IsString(content) || !content->valuestring[0])
            return zpp_error(ZPP_ERR_FORMAT,
                             "tokenizer '%s': added_tokens[%zu] has no id in [0, %d] or no "
                             "content",
                             path, k, ZPP_BPE_MAX_ID);
        /* matched after the raw ones, in the normalized text (bpe.h) */
        const int special = is_set(e, "normalized") ? 2 : 1;
        /* the whitespace around it taken into its match (bpe.h): for the
         * raw ones; single_word (a match only between words) not at all */
        const int strip = (is_set(e, "lstrip") ? ZPP_BPE_LSTRIP : 0) |
                          (is_set(e, "rstrip") ? ZPP_BPE_RSTRIP : 0);
        if (is_set(e, "single_word") || (strip && special == 2))
            return zpp_error(ZPP_ERR_UNSUPPORTED,
                             "tokenizer '%s': added token \"%.40s\" has %s true; it is "
                             "supported false%s",
                             path, content->valuestring,
                             is_set(e, "single_word") ? "single_word" : "normalized",
                             is_set(e, "single_word") ? "" : " where lstrip or rstrip is true");
        const char *text = content->valuestring;
        const size_t len = strlen(text);
        size_t i = 0;
        while (i < n_model && v->tokens[i].id != id) i++;
        if (i < n_model) { /* in model.vocab too: the same token, now special */
            if (v->tokens[i].len != len || memcmp(v->tokens[i].bytes, text, len))
                return zpp_error(ZPP_ERR_FORMAT,
                                 "tokenizer '%s': added token \"%.40s\" has id %d, which "
                                 "model.vocab gives to another token",
                                 path, text, (int)id);
            v->tokens[i].special = special;
            v->tokens[i].strip = strip;
            continue;
        }
        uint8_t *at = v->arena + v->arena_used;
        memcpy(at, text, len);
        v->arena_used += len;
        v->tokens[v->n++] = (zpp_bpe_token){at, len, id, special, strip};
    }
    return ZPP_OK;
}

/* The two tokens of merge k, decoded to bytes end to end in *tmp (grown as
 * needed), with their lengths. */
static zpp_status merge_parts(const cJSON *e, size_t k, const char *path, int raw, uint8_t **tmp,
                              size_t *tmp_cap, size_t len[2]) {
    const char *part[2] = {NULL, NULL};
    size_t plen[2] = {0, 0};
    if (cJSON_IsString(e)) { /* "LEFT RIGHT": one space between two tokens */
        const char *s = e->valuestring, *sp = strchr(s, ' ');
        if (sp && sp != s && sp[1] && !strchr(sp + 1, ' '))
            part[0] = s, plen[0] = (size_t)(sp - s), part[1] = sp + 1, plen[1] = strlen(sp + 1);
    } else if (cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(e, 1))) { /* ["LEFT", "RIGHT"] */
        for (int i = 0; i < 2; i++)
            part[i] = cJSON_GetArrayItem(e, i)->valuestring, plen[i] = strlen(part[i]);
    }
    if (!part[0] || !plen[0] || !plen[1])
        return zpp_error(ZPP_ERR_FORMAT,
                         "tokenizer '%s': model.merges[%zu] is neither \"LEFT RIGHT\" nor "
                         "[\"LEFT\", \"RIGHT\"]",
                         path, k);
    if (plen[0] + plen[1] > *tmp_cap) { /* decoded bytes are never more than the text */
        uint8_t *t = realloc(*tmp, plen[0] + plen[1]);
        if (!t) return zpp_error(ZPP_ERR_NOMEM, "out of memory for tokenizer '%s'", path);
        *tmp = t, *tmp_cap = plen[0] + plen[1];
    }
    for (int i = 0; i < 2 && raw; i++) { /* SentencePiece-style: the text itself */
        memcpy(*tmp + (i ? len[0] : 0), part[i], plen[i]);
        len[i] = plen[i];
    }
    for (int i = 0; i < 2 && !raw; i++) {
        const int64_t r = zpp_bpe_gpt2_string_bytes(part[i], plen[i], *tmp + (i ? len[0] : 0),
                                                    &len[i]);
        if (r != 0) {
            char where[64], shown[48];
            snprintf(where, sizeof where, "model.merges[%zu]: token", k);
            snprintf(shown, sizeof shown, "%.*s", (int)(plen[i] < 40 ? plen[i] : 40), part[i]);
            return zpp_bpe_alphabet_error(r, "tokenizer", path, where, shown);
        }
    }
    return ZPP_OK;
}

/* model.merges -> id pairs, looked up in `vocab` (the vocabulary alone). */
static zpp_status read_merges(const cJSON *list, const zpp_bpe *vocab, const char *path, int raw,
                              zpp_bpe_merge **merges_p, size_t *n_p) {
    const size_t n = (size_t)cJSON_GetArraySize(list);
    zpp_bpe_merge *merges = malloc((n ? n : 1) * sizeof *merges);
    uint8_t *tmp = NULL;
    size_t tmp_cap = 0, k = 0;
    zpp_status st = merges ? ZPP_OK : zpp_error(ZPP_ERR_NOMEM, "out of memory for tokenizer '%s'",
                                                path);
    for (const cJSON *e = list->child; e && st == ZPP_OK; e = e->next, k++) {
        size_t len[2] = {0, 0};
        st = merge_parts(e, k, path, raw, &tmp, &tmp_cap, len);
        int32_t id[2] = {-1, -1};
        for (int i = 0; i < 2 && st == ZPP_OK; i++) {
            id[i] = zpp_bpe_find(vocab, tmp + (i ? len[0] : 0), len[i]);
            if (id[i] < 0)
                st = zpp_error(ZPP_ERR_FORMAT,
                               "tokenizer '%s': model.merges[%zu]: its %s token is not in "
                               "model.vocab",
                               path, k, i ? "right" : "left");
        }
        if (st == ZPP_OK) merges[k] = (zpp_bpe_merge){id[0], id[1]};
    }
    free(tmp);
    if (st != ZPP_OK) {
        free(merges);
        return st;
    }
    *merges_p = merges;
    *n_p = n;
    return ZPP_OK;
}

/* SentencePiece-style: the ids of "<0x00>".."<0xFF>" (with byte fallback)
 * and of model.unk_token, looked up in `vocab`. */
static zpp_status find_char_tokens(const zpp_bpe *vocab, const char *path, hf_form *form) {
    for (int b = 0; b < 256 && form->chars.byte_fallback; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        form->chars.byte_tokens[b] = zpp_bpe_find(vocab, name, 6);
        if (form->chars.byte_tokens[b] < 0)
            return zpp_error(ZPP_ERR_FORMAT,
                             "tokenizer '%s': model.byte_fallback is true but model.vocab has no "
                             "\"%s\"; byte fallback needs all 256 tokens <0x00>..<0xFF>",
                             path, name);
    }
    form->chars.unk = form->unk ? zpp_bpe_find(vocab, form->unk, strlen(form->unk)) : -1;
    if (form->unk && form->chars.unk < 0)
        return zpp_error(ZPP_ERR_FORMAT,
                         "tokenizer '%s': model.unk_token \"%.40s\" is in neither model.vocab nor "
                         "added_tokens",
                         path, form->unk);
    return ZPP_OK;
}

zpp_status zpp_bpe_load_hf(const char *path, zpp_bpe **bpe_p) {
    if (!path || !bpe_p) return zpp_error(ZPP_ERR_INVALID, "zpp_bpe_load_hf: NULL argument");
    /* a model's folder: its tokenizer.json */
    struct stat sb;
    char *in_folder = NULL;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (!(in_folder = malloc(strlen(path) + sizeof "/tokenizer.json")))
            return zpp_error(ZPP_ERR_NOMEM, "out of memory");
        path = strcat(strcpy(in_folder, path), "/tokenizer.json");
    }
    char *buf = NULL;
    size_t len = 0;
    zpp_status read = zpp_bpe_read_file(path, "tokenizer", &buf, &len);
    if (read != ZPP_OK) {
        free(in_folder);
        return read;
    }
    cJSON *root = cJSON_ParseWithLength(buf, len);
    free(buf);
    const cJSON *model = item(root, "model"), *added = item(root, "added_tokens");
    hf_form form = {0};
    hf_vocab v = {0};
    zpp_bpe_merge *merges = NULL;
    size_t n_merges = 0;
    zpp_bpe *vocab = NULL, *bpe = NULL;
    zpp_bpe_desc d = {0};
    zpp_status st = ZPP_OK;
    if (!cJSON_IsObject(root))
        st = zpp_error(ZPP_ERR_FORMAT,
                       "tokenizer '%s' is not a JSON object; is it a Hugging Face "
                       "tokenizer.json, whole (not cut short)?",
                       path);
    if (st == ZPP_OK) st = read_pre_tokenizer(root, path, &form);
    if (st == ZPP_OK) st = check_model(model, path, &form);
    if (st == ZPP_OK)
        st = read_model_vocab(item(model, "vocab"), added, path, form.sentencepiece, &v);
    if (st == ZPP_OK) st = read_added_tokens(added, path, &v);
    if (st != ZPP_OK) goto out;
    /* The vocabulary alone first, to look the merges' tokens up in. */
    d.tokens = v.tokens;
    d.n_tokens = v.n;
    const zpp_bpe_chars bare = {.unk = -1}; /* (SentencePiece-style: no byte check) */
    d.chars = form.sentencepiece ? &bare : NULL;
    st = zpp_bpe_create(&d, &vocab);
    if (st != ZPP_OK) {
        zpp_error_context(st, "tokenizer '%s' (model.vocab and added_tokens)", path);
        goto out;
    }
    if (form.sentencepiece) st = find_char_tokens(vocab, path, &form);
    if (st == ZPP_OK)
        st = read_merges(item(model, "merges"), vocab, path, form.sentencepiece, &merges,
                         &n_merges);
    if (st != ZPP_OK) goto out;
    d.chars = form.sentencepiece ? &form.chars : NULL;
    d.merges = merges;
    d.n_merges = n_merges;
    d.pattern = form.pattern;
    d.whole_pieces = form.whole_pieces;
    d.nfc = form.nfc;
    st = zpp_bpe_create(&d, &bpe);
    if (st != ZPP_OK) {
        /* (merge k is model.merges[k]) */
        zpp_error_context(st, "tokenizer '%s' (model.merges, pre_tokenizer)", path);
        goto out;
    }
    *bpe_p = bpe;
out:
    zpp_bpe_destroy(vocab);
    free(merges);
    free(v.tokens);
    free(v.arena);
    cJSON_Delete(root);
    free(in_folder);
    return st;
}
