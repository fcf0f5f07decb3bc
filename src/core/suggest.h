/* core/suggest.h — "did you mean ...?" for a mistyped name: the closest of a
 * list of known names by edit distance, if it is close enough to be the
 * likely intent. Used for unknown config keys (train/config.c) and for the
 * command line's unknown commands and flags (tools/). */
#ifndef ZPP_CORE_SUGGEST_H
#define ZPP_CORE_SUGGEST_H

#include <stddef.h>

/* Levenshtein distance (insertions, deletions, substitutions, each 1; an
 * exchange of two neighbouring characters, the commonest typo, also 1),
 * case-sensitive. Strings longer than 255 bytes compare as far apart. */
size_t zpp_edit_distance(const char *a, const char *b);

/* The candidate closest to `word`, or NULL when none is within
 * max(1, strlen(word) / 3) edits (so "x" suggests nothing and "--stpes"
 * suggests "--steps"). Ties go to the earlier candidate. NULL entries are
 * skipped. */
const char *zpp_suggest(const char *word, const char *const *candidates, size_t n);

/* Whether `candidate` is close enough to `word` to be suggested (the rule
 * of zpp_suggest), for callers that walk their own tables. */
int zpp_suggest_close(const char *word, const char *candidate, size_t *distance_p);

#endif
