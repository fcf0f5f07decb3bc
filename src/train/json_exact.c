/* train/json_exact.c — see json_exact.h. */
#include "train/json_exact.h"

#include <stdio.h>
#include <stdlib.h>

void zpp_json_number_text(double v, char *buf, size_t cap) {
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, cap, "%.*g", digits, v);
        if (strtod(buf, NULL) == v) break;
    }
}

int zpp_json_exact_numbers(cJSON *item) {
    for (cJSON *c = item->child; c; c = c->next) {
        if (cJSON_IsNumber(c)) {
            char text[40];
            zpp_json_number_text(c->valuedouble, text, sizeof text);
            cJSON *raw = cJSON_CreateRaw(text);
            if (!raw) return 0;
            /* the raw item takes over the number's key (replacing by pointer
             * does not carry it; replacing by name could hit a duplicate) */
            raw->string = c->string;
            raw->type |= c->type & cJSON_StringIsConst;
            c->string = NULL;
            c->type &= ~cJSON_StringIsConst;
            if (!cJSON_ReplaceItemViaPointer(item, c, raw)) { /* cannot fail: c is a child */
                cJSON_Delete(raw);
                return 0;
            }
            c = raw;
        } else if ((cJSON_IsObject(c) || cJSON_IsArray(c)) && !zpp_json_exact_numbers(c)) {
            return 0;
        }
    }
    return 1;
}
