/* train/json_exact.h — JSON numbers written back bit for bit.
 *
 * cJSON prints a number with 15 significant digits wherever those read
 * back within its tolerance, so a double can come back one ulp away.
 * Where a file read is written again (a checkpoint's saved config, a
 * model's config.json carried into an export) every number must read back
 * as itself. */
#ifndef ZPP_TRAIN_JSON_EXACT_H
#define ZPP_TRAIN_JSON_EXACT_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* v's text into buf[0..cap) (cap >= 32): the fewest significant digits, 15
 * to 17, that read back as v. */
void zpp_json_number_text(double v, char *buf, size_t cap);

/* Replaces every number under `item` (an object or array, at any depth) by
 * a raw item of its zpp_json_number_text. 0 when out of memory (item then holds some
 * numbers as raw items, each still the same value). */
int zpp_json_exact_numbers(cJSON *item);

#endif
