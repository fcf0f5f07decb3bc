# The test-only fault hooks (docs/fault-hooks.md) are compiled into the
# library only with -DZPP_FAULT_HOOKS=ON. A library that leaves them out
# differs from one with them by its hook objects alone (the option picks the
# *_hooks.c files or their *_nohooks.c stand-ins, nothing else), so this build
# links the library the other setting would make from the same objects: a
# hooks build checks the release library without a second build, and a
# release build checks that the hooks are really there when asked for.
if(ZPP_FAULT_HOOKS)
  set(zpp_probe_hooks off)
else()
  set(zpp_probe_hooks on)
endif()
set(zpp_probe zeropp_probe_hooks_${zpp_probe_hooks})
add_library(${zpp_probe} SHARED $<TARGET_OBJECTS:zeropp_objects>
                                $<TARGET_OBJECTS:zeropp_hooks_${zpp_probe_hooks}_objects>)
target_link_libraries(${zpp_probe} PRIVATE ${ZPP_LINK_DEPS})
target_link_options(${zpp_probe} PRIVATE -Wl,--no-undefined)
if(ZPP_FAULT_HOOKS)
  set(zpp_release_lib $<TARGET_FILE:${zpp_probe}>)
  set(zpp_hooks_lib $<TARGET_FILE:zeropp_shared>)
else()
  set(zpp_release_lib $<TARGET_FILE:zeropp_shared>)
  set(zpp_hooks_lib $<TARGET_FILE:${zpp_probe}>)
endif()
add_test(NAME release_has_no_fault_hooks
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/test_fault_hooks.sh ${zpp_release_lib}
                 ${zpp_hooks_lib})
set_tests_properties(release_has_no_fault_hooks PROPERTIES LABELS "fault_hooks" TIMEOUT 60)
