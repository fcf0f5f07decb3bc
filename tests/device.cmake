# The compute backend (src/device/): the host backend; the same program on
# GPU 0 with ZPP_TEST_DEVICE=gpu (label gpu: ctest -L gpu).
zpp_test(test_device SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_device.c)
if(ZPP_HAVE_CUDA)
  zpp_test(test_device_gpu SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_device.c LABELS gpu
           ENV ZPP_TEST_DEVICE=gpu)
endif()
