/* collectives/qgz_bound.c — qgZ's error bound (derivation: qgz_bound.h). */
#include "collectives/qgz_bound.h"

double zpp_qgz_error_bound(double sum_absmax, int world, int node_size, int nodes,
                           const zpp_quant_spec *spec) {
    const int levels = (node_size > 1 && nodes > 1) ? 2 : 1;
    /* half the widest gap (a whole gap stochastic), in units of absmax */
    const double half_gap = spec->format == ZPP_QUANT_E2M1 ? 6.0 : 14.0;
    const double gap = spec->stochastic ? half_gap / 2 : half_gap;
    return levels * sum_absmax / gap / world * (1 + 1e-3);
}
