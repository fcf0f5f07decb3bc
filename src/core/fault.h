/* core/fault.h — fault injection for the tests, one switch for every layer.
 *
 * ZPP_FAULT=KIND@FIRST or KIND@FIRST-LAST, read once by whoever injects
 * that kind (each ignores the others' kinds):
 *   nonfinite@S[-E]  the engine writes a NaN into rank 0's gradient before
 *                    the norm at 1-based steps S..E (engine.h);
 *   save_fail@S      the trainer's save after S steps fails on the last rank;
 *   save_kill@S      rank 1 dies halfway through writing that save
 *                    (trainer.h).
 * Unset or empty: no fault, and the checks cost one comparison a step. */
#ifndef ZPP_CORE_FAULT_H
#define ZPP_CORE_FAULT_H

#include "zeropp.h"

typedef enum zpp_fault_kind {
    ZPP_FAULT_NONE = 0,
    ZPP_FAULT_NONFINITE,
    ZPP_FAULT_SAVE_FAIL,
    ZPP_FAULT_SAVE_KILL
} zpp_fault_kind;

typedef struct zpp_fault {
    zpp_fault_kind kind;
    int first, last; /* steps, first <= last */
} zpp_fault;

/* Reads ZPP_FAULT into *f_p (kind NONE when unset). A malformed value is
 * ZPP_ERR_CONFIG with a message listing the forms. */
zpp_status zpp_fault_from_env(zpp_fault *f_p);

#endif
