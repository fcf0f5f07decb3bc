# llm.c model files (src/train/llmc.c) through `zeropp train --init-from`,
# `zeropp export` and `zeropp eval`, against a double-precision reference
# GPT-2 written in the test; training parity (10 steps of `zeropp train
# --data-order sequential` on 1 and 4 ranks against a double-precision GPT-2
# training loop: backward, AdamW, decay mask, clipping; the GPU case is
# labelled gpu); and the padded vocabulary of the CPU model.
# Cases launch up to 3 ranks on CI's 2 cores: one at a time.
zpp_test(test_llmc SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_llmc.c CASES_FROM_SOURCE
         ENV ZPP_CLI=$<TARGET_FILE:zeropp_cli> ZPP_MPIEXEC=${MPIEXEC_EXECUTABLE}
         LABELS train_io TIMEOUT 600 GPU_TIMEOUT 120 PROCESSORS 2)
