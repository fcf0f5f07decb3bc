# `zeropp train` end to end under mpirun (the test program launches it).
set(zpp_train_env ZPP_CLI=$<TARGET_FILE:zeropp_cli> ZPP_MPIEXEC=${MPIEXEC_EXECUTABLE})
foreach(case test_bad_inputs_fail_cleanly test_zero3_matches_single_rank_fp32
             test_zero3_matches_single_rank_bf16 test_same_seed_same_losses_bitwise test_checkpoint_resume_bitwise
             test_zeropp_options_match_zero3_validation_loss test_demo_summary
             test_zero3_matches_single_rank_params test_qgz_grad_norm_matches_single_rank
             test_adamw_first_step test_save_every
             test_nonfinite_gradient_fails_cleanly)
  zpp_test(test_train SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_train.c CASE ${case}
           ENV ${zpp_train_env} LABELS train TIMEOUT 900)
  # each case launches up to 4 ranks on CI's 2 cores: run them one at a time
  set_tests_properties(test_train.${case} PROPERTIES PROCESSORS 2)
endforeach()
# The same trainer on 2 GPUs against the CPU (label gpu: `ctest -L gpu`).
if(ZPP_HAVE_CUDA)
  zpp_test(test_train SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_train.c CASE test_gpu_matches_cpu
           ENV ${zpp_train_env} LABELS gpu TIMEOUT 300)
endif()
