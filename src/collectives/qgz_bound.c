/* collectives/qgz_bound.c — qgZ's error bound (derivation: qgz_bound.h). */
#include "collectives/qgz_bound.h"

double zpp_qgz_error_bound(double sum_absmax, int world, int node_size, int nodes,
                           int stochastic) {
    const int levels = (node_size > 1 && nodes > 1) ? 2 : 1;
    return levels * sum_absmax / (stochastic ? 7.0 : 14.0) / world * (1 + 1e-3);
}
