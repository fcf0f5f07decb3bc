/* mpi_main.c — link into MPI tests: MPI_Init before the tests, one agreed
 * seed across ranks, MPI_Finalize after. */
#include <mpi.h>

#include "testlib.h"

void zpp_test_init(int *argc, char ***argv) {
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &zpp_test_rank);
}

uint64_t zpp_test_agree_seed(uint64_t seed) {
    unsigned long long s = seed;
    MPI_Bcast(&s, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    return s;
}

void zpp_test_finalize(void) { MPI_Finalize(); }
