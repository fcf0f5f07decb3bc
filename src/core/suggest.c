/* core/suggest.c — the closest known name to a mistyped one (suggest.h). */
#include "core/suggest.h"

#include <string.h>

#define ZPP__SUGGEST_MAX 256

/* Optimal string alignment distance: Levenshtein plus the transposition of
 * two adjacent characters, on three rolling rows. */
size_t zpp_edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n >= ZPP__SUGGEST_MAX || m >= ZPP__SUGGEST_MAX) return (size_t)-1;
    size_t rows[3][ZPP__SUGGEST_MAX + 1];
    size_t *prev2 = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= m; j++) prev[j] = j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t cost = a[i - 1] != b[j - 1];
            size_t d = prev[j] + 1;                          /* delete */
            if (cur[j - 1] + 1 < d) d = cur[j - 1] + 1;      /* insert */
            if (prev[j - 1] + cost < d) d = prev[j - 1] + cost; /* substitute */
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                prev2[j - 2] + 1 < d)
                d = prev2[j - 2] + 1; /* transpose */
            cur[j] = d;
        }
        size_t *t = prev2;
        prev2 = prev;
        prev = cur;
        cur = t;
    }
    return prev[m];
}

int zpp_suggest_close(const char *word, const char *candidate, size_t *distance_p) {
    size_t len = strlen(word), limit = len / 3 > 1 ? len / 3 : 1;
    size_t d = zpp_edit_distance(word, candidate);
    if (distance_p) *distance_p = d;
    return d <= limit && d < strlen(candidate);
}

const char *zpp_suggest(const char *word, const char *const *candidates, size_t n) {
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        size_t d = 0;
        if (!candidates[i] || !zpp_suggest_close(word, candidates[i], &d)) continue;
        if (d < best_d) best = candidates[i], best_d = d;
    }
    return best;
}
