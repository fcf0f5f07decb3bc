# Trainer configuration (JSON) and data loading: src/train/config.c, data.c.
zpp_test(test_config SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_config.c TIMEOUT 60
         ENV ZPP_SOURCE_DIR=${CMAKE_SOURCE_DIR})
zpp_test(test_data SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_data.c TIMEOUT 120)
