# What runs on which NVIDIA GPU (device/device_caps.h, model/attention_path.h),
# decided on the CPU: runs in every build, no GPU needed (docs/gpus.md).
zpp_test(test_gpu_arch SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_gpu_arch.c CASES_FROM_SOURCE)
