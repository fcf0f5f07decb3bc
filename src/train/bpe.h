/* train/bpe.h — byte-level BPE tokenization: GPT-2's tokenizer, and the core
 * that other byte-level BPE vocabularies (Hugging Face tokenizer.json) reuse.
 *
 * THE MODEL. A byte-level BPE tokenizer is three things:
 *   - a vocabulary: token id -> a string of bytes. Every single byte is a
 *     token (256 of them), so any text can be written with it;
 *   - a ranked list of merges: (left id, right id), rank = position in the
 *     list; the merged token is the one whose bytes are left's then right's;
 *   - a pre-tokenization regex that cuts text into pieces (words with their
 *     leading space, runs of digits, of punctuation, of whitespace). Merges
 *     never cross a piece boundary.
 * Special tokens (GPT-2's <|endoftext|>) are vocabulary entries that merges
 * never make; they enter the token stream only where text names them and
 * the caller asks for it (ZPP_BPE_SPECIAL).
 *
 * ENCODING ONE PIECE (GPT-2's encoder.py, `bpe()`): start from one symbol per
 * byte. Repeat: among adjacent symbol pairs, find the pair of lowest rank;
 * if none has a rank, stop; else merge every occurrence of that pair, left
 * to right without overlap ("a a a" under (a, a) gives "aa a"), in one pass.
 * The ids of the final symbols are the piece's tokens. We do exactly that
 * with a heap of (rank, position) over a linked list of symbols, popping a
 * whole rank at a time: O(n log n) per piece instead of GPT-2's O(n^2), and
 * equal to it for any merge table, also one where a merge's result pairs
 * with a neighbour at a lower rank than its own (merging one occurrence at a
 * time, as tokenizers' per-occurrence heap does, differs there; for tables a
 * trainer made the two agree). Encoded pieces are remembered in a bounded
 * cache, so a word met again costs a hash lookup.
 *
 * TEXT IS BYTES. GPT-2 works on Unicode strings; its tokens are UTF-8 bytes.
 * We take any bytes: PCRE2 runs with PCRE2_MATCH_INVALID_UTF, so an invalid
 * UTF-8 sequence matches no pattern item and acts as a boundary (as the
 * end of the text would), and every byte the regex leaves out (invalid
 * sequences; for other patterns, text no alternative matches) becomes a piece
 * of its own, one per maximal run, encoded like any piece. So decoding the
 * ids always gives the input back byte for byte, and valid UTF-8 text gets
 * GPT-2's tokens.
 *
 * SPECIAL TOKENS IN TEXT. By default the literal text "<|endoftext|>" is
 * ordinary text (GPT-2's encoder.py, tiktoken's encode_ordinary): it
 * becomes the tokens of "<", "|", "endoftext", "|", ">". With
 * ZPP_BPE_SPECIAL every occurrence of a special token's text is cut out and
 * becomes its id (llm.c's data preparation uses that to separate
 * documents); the text between is encoded as if each part stood alone (the
 * regex never sees across a special token), leftmost match first, the
 * longest where two start at one place. As in Hugging Face's tokenizers
 * this takes two passes: the tokens of zpp_bpe_token.special 1 are cut out
 * of the text first, those of special 2 ("normalized") out of the stretches
 * between. The second pass compares with the normalized stretch: the
 * stretch itself, or under ZPP_BPE_PREPEND_EVERY (Llama 2's normalizer)
 * "▁" + the stretch with each space a "▁", where the token "<s>" is
 * "▁<s>": it matches at the stretch's start or at a space (or "▁"), which
 * it covers, and the text after it gets no "▁" in front.
 *
 * STREAMING. With ZPP_BPE_PARTIAL the text is a prefix of a longer one:
 * only the tokens that no continuation can change are produced, and
 * *consumed_p says how many bytes they cover. The caller keeps the rest,
 * appends more text and calls again; the last call, without the flag,
 * encodes what is left. The tokens are those of encoding the whole text at
 * once, for any pattern: PCRE2's hard partial matching reports a piece whose
 * match reached the end of the buffer (it could grow, or a lookahead could
 * change), a trailing incomplete UTF-8 character is held back, and so is
 * text that may be the start of a special token.
 *
 * THREADS. zpp_bpe_encode and zpp_bpe_split use the object's scratch and
 * cache: one thread at a time per object. The look-ups and zpp_bpe_decode
 * only read it. */
#ifndef ZPP_TRAIN_BPE_H
#define ZPP_TRAIN_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "zeropp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GPT-2's pre-tokenization regex (as in its encoder.py and tiktoken's
 * "gpt2"), compiled with PCRE2_UTF | PCRE2_UCP: contractions, an optional
 * space and letters, an optional space and digits, an optional space and
 * other symbols, whitespace not followed by a non-space (so "  x" gives " "
 * and " x"), whitespace. Letters, numbers and spaces are those of the
 * Unicode tables PCRE2 was built with (Debian 12's 10.42: Unicode 14), and
 * so are Python's regex module's (GPT-2's) and Rust's (tiktoken's) for
 * their own versions. Checked over every code point against regex 2026.11
 * (Unicode 16): they differ only on characters assigned after Unicode 14
 * (to PCRE2 they are "other") and on U+180E, a space to PCRE2. */
#define ZPP_BPE_GPT2_PATTERN                                                   \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* GPT-2's one special token, id 50256 in its vocab.json. */
#define ZPP_BPE_GPT2_EOT "<|endoftext|>"
/* Pieces the cache remembers by default (about 40 MB at most). */
#define ZPP_BPE_CACHE_DEFAULT (1u << 19)
/* The most it can keep (its offsets are 32-bit). */
#define ZPP_BPE_CACHE_MAX (1u << 24)

typedef struct zpp_bpe zpp_bpe;

/* The largest token id (2^24 - 1): tables are indexed by id, and real
 * vocabularies are far smaller (GPT-2 50,257; Llama 3 128,256). */
#define ZPP_BPE_MAX_ID ((1 << 24) - 1)

/* One vocabulary entry: its raw bytes (not GPT-2's printable rendering). */
typedef struct zpp_bpe_token {
    const uint8_t *bytes;
    size_t len;    /* >= 1 */
    int32_t id;    /* in [0, ZPP_BPE_MAX_ID], each id once; gaps are allowed */
    /* 1: a special token (never the result of a merge); 2: one matched in
     * the second pass, in the normalized text (Hugging Face's "normalized":
     * true; SPECIAL TOKENS IN TEXT above). */
    int special;
    /* A special token of kind 1 whose match takes the whitespace around it
     * (Hugging Face's lstrip, rstrip: Phi-3's "<|end|>" swallows the
     * newline after it): ZPP_BPE_LSTRIP, all the whitespace before it back
     * to the previous special token or the text's start; ZPP_BPE_RSTRIP,
     * all after it. Whitespace: Unicode's White_Space characters. */
    int strip;
} zpp_bpe_token;
#define ZPP_BPE_LSTRIP 1
#define ZPP_BPE_RSTRIP 2

/* A merge of two token ids; its rank is its index in the list. */
typedef struct zpp_bpe_merge {
    int32_t left, right;
} zpp_bpe_merge;

/* What zpp_bpe_create copies (the caller's arrays may go afterwards). */
/* SentencePiece-style BPE (Hugging Face's conversions of Llama 2, TinyLlama,
 * Mistral 7B v0.1): tokens are raw UTF-8 text whose spaces are written
 * ZPP_BPE_SPACE ("\u2581", "▁"), and a piece starts as one symbol per
 * Unicode character, not per byte:
 *   - a space is the character "▁"; a character that is a token is that
 *     token; one that is not becomes its UTF-8 bytes as the byte tokens
 *     "<0x00>".."<0xFF>" (byte fallback), or, without them, the unknown
 *     token (consecutive unknown characters one token with fuse_unk). A
 *     byte that is not valid UTF-8 counts as a character of its own, so
 *     with byte fallback any bytes decode back to themselves;
 *   - the text between special tokens (a segment) may get a "▁" put in
 *     front (prepend, below), and with `split` it is cut before each space
 *     (each "▁" starts a piece: "a b" -> "▁a", "▁b");
 *   - the merges then run over the symbols as for bytes.
 * Decoding gives each token's text ("▁" as a space, a byte token as its
 * byte, a special token its content) and, when a "▁" is prepended, drops
 * one leading space of the whole (Hugging Face's decoder Sequence
 * [Replace, ByteFallback, Fuse, Strip]). */
#define ZPP_BPE_SPACE "\xE2\x96\x81"
typedef enum zpp_bpe_prepend {
    ZPP_BPE_PREPEND_NEVER = 0,
    /* every segment that does not start with a space (Metaspace "always") */
    ZPP_BPE_PREPEND_ALWAYS,
    /* the segment at the start of the text only, if it does not start with
     * a space (Metaspace "first"); see ZPP_BPE_CONTINUED */
    ZPP_BPE_PREPEND_FIRST,
    /* every segment, even one starting with a space (the normalizer Prepend
     * of Llama 2's file); not with split */
    ZPP_BPE_PREPEND_EVERY,
} zpp_bpe_prepend;
typedef struct zpp_bpe_chars {
    /* the ids of "<0x00>".."<0xFF>", all 256 of them; or byte_fallback 0 */
    int byte_fallback;
    int32_t byte_tokens[256];
    int32_t unk;  /* the unknown token's id; -1: none (a character with no
                   * token and no byte fallback is then an error) */
    int fuse_unk; /* 1: a run of unknown characters is one unknown token */
    zpp_bpe_prepend prepend;
    int split;    /* 1: a piece starts at each space */
} zpp_bpe_chars;

typedef struct zpp_bpe_desc {
    const zpp_bpe_token *tokens;
    size_t n_tokens;
    const zpp_bpe_merge *merges; /* by rank, lowest first */
    size_t n_merges;
    const char *pattern;         /* PCRE2 pattern, UTF-8; NULL: text is not split */
    size_t cache_pieces;         /* 0: ZPP_BPE_CACHE_DEFAULT */
    /* 1: a text piece whose bytes are an ordinary token becomes that token
     * without merging (Hugging Face's model.ignore_merges, which Llama 3
     * sets: its merge list does not rebuild every token it holds). 0: every
     * piece goes through the merges (GPT-2). */
    int whole_pieces;
    /* NULL: byte-level (above). Else SentencePiece-style, copied; pattern
     * must be NULL and whole_pieces 0, and the 256 single bytes need not
     * be tokens. */
    const zpp_bpe_chars *chars;
    /* 1: byte-level text is put in Unicode NFC (train/nfc.h) before it is
     * cut, each stretch between special tokens (Hugging Face's normalizer
     * NFC: Qwen2, GPT-NeoX); then the regex and merges see the NFC text,
     * and a special token of special 2 matches its content's NFC. The
     * encoding is that of the NFC text, and decoding gives the NFC text. */
    int nfc;
} zpp_bpe_desc;

/* Builds a tokenizer. ZPP_ERR_FORMAT, naming the entry, when: a token is
 * empty; an id is negative or repeats; two tokens have the same bytes (but
 * a special token and an ordinary one may); one of the 256 single bytes
 * has no token (byte-level; but for the 13 UTF-8 never uses, 0xC0, 0xC1
 * and 0xF5..0xFF: encoding text that holds one is then ZPP_ERR_INVALID,
 * naming it); a merge names an id that is not a
 * token, or a special token; a pair is listed twice; a merge's result
 * (left's bytes then right's) is not in the vocabulary; the pattern does
 * not compile (PCRE2's message and offset); an id past ZPP_BPE_MAX_ID. */
zpp_status zpp_bpe_create(const zpp_bpe_desc *desc, zpp_bpe **bpe_p);

/* Loads GPT-2's tokenizer files (the public GPT-2 release's vocab.json and
 * merges.txt, also the Hugging Face "gpt2" repository's):
 *   vocab.json  a JSON object, token -> id, each token written in GPT-2's
 *               printable alphabet (bytes_to_unicode: the bytes '!'..'~',
 *               0xA1..0xAC and 0xAE..0xFF stand for themselves, the other 68
 *               bytes, in increasing order, for U+0100, U+0101, ...; so a
 *               space is "Ġ", U+0120);
 *   merges.txt  one merge a line, "LEFT RIGHT" in the same alphabet, rank =
 *               line order; a first line starting "#version" is a header.
 *               Blank lines are refused, except at the end; a trailing "\r"
 *               is dropped.
 * The pattern is ZPP_BPE_GPT2_PATTERN. A vocabulary entry "<|endoftext|>"
 * is the special token. Errors (ZPP_ERR_IO, ZPP_ERR_FORMAT) name the file,
 * and the line or entry, and what to do. */
zpp_status zpp_bpe_load_gpt2(const char *vocab_path, const char *merges_path, zpp_bpe **bpe_p);

/* Loads a Hugging Face tokenizer.json of a BPE (path: the file, or a
 * folder holding it, as a model's does; bpe_hf.c says which keys it
 * reads), of either kind:
 *   byte-level: model.type "BPE", its vocab (token -> id, tokens in GPT-2's
 *     byte alphabet as above) and merges (each "LEFT RIGHT" or ["LEFT",
 *     "RIGHT"]; rank = position), model.ignore_merges (whole_pieces); the
 *     pre_tokenizer ByteLevel (GPT-2's pattern with use_regex, no split
 *     without) or Sequence [Split (a {"Regex": ...} pattern, behavior
 *     "Isolated"), ByteLevel (use_regex false)], as Llama 3 and Qwen2 write
 *     it; normalizer null, or NFC (Qwen2's; zpp_bpe_desc.nfc);
 *   SentencePiece-style (zpp_bpe_chars; Llama 2, TinyLlama, Mistral 7B
 *     v0.1): vocab and merges in raw UTF-8 with "▁" for spaces,
 *     model.byte_fallback (the tokens <0x00>..<0xFF>), unk_token, fuse_unk;
 *     the normalizer Sequence [Prepend "▁", Replace " " -> "▁"] with a null
 *     pre_tokenizer (ZPP_BPE_PREPEND_EVERY), or a null normalizer with the
 *     pre_tokenizer Metaspace (replacement "▁", prepend_scheme "first",
 *     "always" or "never", split).
 * added_tokens are all special tokens (so their text is only matched with
 * ZPP_BPE_SPECIAL); one marked "normalized" is zpp_bpe_token.special 2,
 * lstrip and rstrip are its strip. ZPP_ERR_UNSUPPORTED naming the key for
 * anything else: another model type, dropout or subword affixes,
 * byte_fallback in a byte-level file, another normalizer (NFKC, say) or
 * pre-tokenizer, an added token with single_word, or with lstrip or rstrip
 * and normalized. ZPP_ERR_IO, ZPP_ERR_FORMAT naming the file and the
 * entry. The post_processor's tokens (a leading
 * <|begin_of_text|> or <s>) are not added, and the decoder is not read
 * (decoding is the one bpe.h describes for the kind). */
zpp_status zpp_bpe_load_hf(const char *path, zpp_bpe **bpe_p);

/* Frees; NULL is ignored. */
void zpp_bpe_destroy(zpp_bpe *bpe);

/* Largest id + 1 (GPT-2: 50257). */
int32_t zpp_bpe_vocab_size(const zpp_bpe *bpe);
/* Merges in the table (GPT-2: 50000). */
size_t zpp_bpe_merge_count(const zpp_bpe *bpe);
/* The id of the token whose bytes are these, or -1. */
int32_t zpp_bpe_find(const zpp_bpe *bpe, const void *bytes, size_t len);
/* The bytes token `id` decodes to (not NUL-terminated) and their count;
 * NULL when no token has that id. For printing tokens one at a time as they
 * come. Byte-level: the token's bytes; SentencePiece-style: its text (no
 * leading space is dropped here). */
const uint8_t *zpp_bpe_token_bytes(const zpp_bpe *bpe, int32_t id, size_t *len_p);
/* Sets how many encoded pieces the cache keeps (0: none, which the
 * benchmark uses to time the merging itself). Clears it. */
zpp_status zpp_bpe_set_cache(zpp_bpe *bpe, size_t pieces);

/* ---- Encoding ---- */
#define ZPP_BPE_SPECIAL 1u /* special tokens' text becomes their ids */
#define ZPP_BPE_PARTIAL 2u /* more text follows: produce only final tokens */
/* The text continues text encoded by an earlier call (streaming): it is not
 * the start of the text, for ZPP_BPE_PREPEND_FIRST. */
#define ZPP_BPE_CONTINUED 4u

/* A growing array of ids; start from {0} and free(ids) when done. */
typedef struct zpp_bpe_ids {
    int32_t *ids;
    size_t n, cap;
} zpp_bpe_ids;

/* Appends the tokens of text[0, len) to *out. Without ZPP_BPE_PARTIAL all
 * of the text is encoded (*consumed_p, if not NULL, = len); with it, see
 * STREAMING above (consumed_p required). On failure *out keeps what it held
 * before the call. ZPP_ERR_NOMEM; ZPP_ERR_INVALID for a regex that PCRE2
 * cannot run to the end (its match or depth limit, with PCRE2's message). */
zpp_status zpp_bpe_encode(zpp_bpe *bpe, const void *text, size_t len, unsigned flags,
                          zpp_bpe_ids *out, size_t *consumed_p);

/* The pre-tokenization alone: the pieces zpp_bpe_encode would encode, in
 * order, with the same flags and the same *consumed_p. Offsets are into
 * `text`; with zpp_bpe_desc.nfc a piece's tokens encode the NFC of what it
 * covers (pieces inside one run of reordered marks may cover no bytes). */
typedef struct zpp_bpe_piece {
    size_t start, len;
    int32_t special; /* the special token's id, or -1 for text */
    int prefixed;    /* SentencePiece-style: a "▁" goes in front of the piece */
} zpp_bpe_piece;
typedef struct zpp_bpe_pieces {
    zpp_bpe_piece *pieces;
    size_t n, cap;
} zpp_bpe_pieces;
zpp_status zpp_bpe_split(zpp_bpe *bpe, const void *text, size_t len, unsigned flags,
                         zpp_bpe_pieces *out, size_t *consumed_p);

/* ---- Decoding ---- */
/* The text of ids[0, n) (zpp_bpe_token_bytes end to end; SentencePiece-
 * style without the leading space a prepended "▁" gave), in a new buffer of *len_p + 1 bytes
 * (NUL-terminated for convenience; the text may hold NULs and, cut between
 * tokens, need not be valid UTF-8); free() it. Special tokens give their
 * text. ZPP_ERR_INVALID naming the first id that is no token. */
zpp_status zpp_bpe_decode(const zpp_bpe *bpe, const int32_t *ids, size_t n, char **text_p,
                          size_t *len_p);

/* GPT-2's printable rendering of one byte (bytes_to_unicode), a code point
 * in [33, 323]; and back: the byte a code point stands for, or -1. */
uint32_t zpp_bpe_gpt2_byte_char(uint8_t byte);
int zpp_bpe_gpt2_char_byte(uint32_t code_point);

#ifdef __cplusplus
}
#endif

#endif
