# The library as a user gets it (tests/test_install.sh): install into a
# fresh prefix, build examples/custom_model.c against it with pkg-config and
# with find_package, train it on 4 MPI ranks (2 nodes of 2) with ZeRO-3 and
# ZeRO++. Needs the whole build (cmake --install installs every target).
# Under the sanitizers the example is built with them too: an instrumented
# libzeropp.so must be loaded by an instrumented program.
set(zpp_install_cflags "")
if(ZPP_SANITIZE)
  set(zpp_install_cflags "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all")
endif()
string(REPLACE ";" " " zpp_install_mpiflags "${zpp_install_mpiflags}")
add_test(NAME test_install
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_install.sh ${CMAKE_BINARY_DIR}
                 ${CMAKE_SOURCE_DIR} ${CMAKE_COMMAND} ${MPI_C_COMPILER} ${MPIEXEC_EXECUTABLE}
                 "${zpp_install_mpiflags}" "${zpp_install_cflags}")
set_tests_properties(test_install PROPERTIES LABELS "install;mpi" TIMEOUT 600 PROCESSORS 2
                     ENVIRONMENT "${ZPP_TEST_ENV}")
