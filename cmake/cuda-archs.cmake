# cmake/cuda-archs.cmake — the CUDA architectures to build the kernels for
# when the user names none (docs/gpus.md, "Choosing architectures").
#
# A user's -DCMAKE_CUDA_ARCHITECTURES=... or CUDAARCHS environment variable
# always wins; CMakeLists.txt calls zpp_cuda_default_archs only without
# either. The default is, in order:
#   - the GPUs this machine shows (nvidia-smi), one real architecture each,
#     as CMake's `native` would (which needs CMake 3.24 and fails to
#     configure where no GPU is visible);
#   - otherwise a portable list: 75-real;80-real;90 (Turing, Ampere and Ada,
#     Hopper, and PTX of compute_90 that the driver compiles for anything
#     newer), with 70-real in front where nvcc still builds Volta (CUDA 12.x;
#     CUDA 13 dropped it).
# Architectures nvcc cannot build are left out, and said so.
#
# In script mode it prints the portable list for an nvcc (what
# bench/gpu/arch_check.sh builds as "portable" on a machine with a GPU):
#   cmake -DNVCC=/usr/local/cuda/bin/nvcc -P cmake/cuda-archs.cmake
if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  cmake_minimum_required(VERSION 3.22) # the project's policies (IN_LIST)
endif()

# The compute capabilities nvcc can build for, as numbers ("75;80;86;..."),
# from `nvcc --list-gpu-arch`; empty when it cannot say.
function(zpp_cuda_nvcc_archs nvcc out)
  execute_process(COMMAND ${nvcc} --list-gpu-arch OUTPUT_VARIABLE text RESULT_VARIABLE rc
                  ERROR_QUIET TIMEOUT 60)
  set(archs "")
  if(rc EQUAL 0)
    string(REGEX MATCHALL "compute_[0-9]+" found "${text}")
    foreach(f IN LISTS found)
      string(REPLACE "compute_" "" n "${f}")
      list(APPEND archs ${n})
    endforeach()
  endif()
  if(archs)
    list(REMOVE_DUPLICATES archs)
    list(SORT archs COMPARE NATURAL)
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# The compute capabilities of the GPUs visible here ("90" for an H200), from
# nvidia-smi; empty without a driver or a GPU.
function(zpp_cuda_visible_archs out)
  set(archs "")
  find_program(ZPP_NVIDIA_SMI nvidia-smi)
  if(ZPP_NVIDIA_SMI)
    execute_process(COMMAND ${ZPP_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE text RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 60)
    if(rc EQUAL 0)
      string(REGEX MATCHALL "[0-9]+\\.[0-9]+" caps "${text}")
      foreach(c IN LISTS caps)
        string(REPLACE "." "" n "${c}")
        list(APPEND archs ${n})
      endforeach()
    endif()
  endif()
  if(archs)
    list(REMOVE_DUPLICATES archs)
    list(SORT archs COMPARE NATURAL)
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# "9.0" for 90, as nvidia-smi and NVIDIA's tables write a compute capability.
function(zpp_cuda_dotted archs out)
  set(text "")
  foreach(n IN LISTS archs)
    math(EXPR major "${n} / 10")
    math(EXPR minor "${n} % 10")
    list(APPEND text "${major}.${minor}")
  endforeach()
  string(REPLACE ";" ", " text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# The portable list for an nvcc that builds the compute capabilities `can`
# (all of 75, 80, 90 when it cannot say): the last one carries PTX too, for
# GPUs newer than the list.
function(zpp_cuda_portable_archs can out)
  set(portable "")
  foreach(n 70 75 80 90)
    if((can AND n IN_LIST can) OR (NOT can AND NOT n EQUAL 70))
      list(APPEND portable ${n})
    endif()
  endforeach()
  if(NOT portable)
    list(GET can -1 portable)
  endif()
  list(GET portable -1 last)
  set(archs "")
  foreach(n IN LISTS portable)
    if(n EQUAL last)
      list(APPEND archs ${n})
    else()
      list(APPEND archs ${n}-real)
    endif()
  endforeach()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()

# ${out}: the default list; ${why}: where it came from, for the status line.
function(zpp_cuda_default_archs nvcc out why)
  zpp_cuda_nvcc_archs(${nvcc} can)
  if(can)
    list(GET can -1 newest)
  endif()
  zpp_cuda_visible_archs(gpus)
  set(archs "")
  set(cannot "")
  foreach(n IN LISTS gpus)
    if(NOT can OR n IN_LIST can)
      list(APPEND archs ${n}-real)
    elseif(n GREATER newest)
      # newer than this nvcc knows: its newest PTX, which the driver compiles
      list(APPEND archs ${newest})
    else()
      list(APPEND cannot ${n})
    endif()
  endforeach()
  if(cannot)
    zpp_cuda_dotted("${cannot}" cannot_text)
    zpp_cuda_dotted("${can}" can_text)
    message(WARNING "zeropp: this machine has a GPU of compute capability ${cannot_text}, "
                    "which ${nvcc} cannot build for (it builds ${can_text}); "
                    "zeropp will not run on it. Build with a CUDA that still does (CUDA 12.x "
                    "for Volta), see docs/gpus.md")
  endif()
  if(archs)
    list(REMOVE_DUPLICATES archs)
    zpp_cuda_dotted("${gpus}" gpus_text)
    set(${out} "${archs}" PARENT_SCOPE)
    set(${why} "the GPUs visible here, compute capability ${gpus_text} (nvidia-smi)"
        PARENT_SCOPE)
    return()
  endif()
  zpp_cuda_portable_archs("${can}" archs)
  set(${out} "${archs}" PARENT_SCOPE)
  if(gpus)
    set(${why} "portable default (no visible GPU that nvcc builds for)" PARENT_SCOPE)
  else()
    set(${why} "portable default (no GPU visible)" PARENT_SCOPE)
  endif()
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT NVCC)
    message(FATAL_ERROR "usage: cmake -DNVCC=<path of nvcc> -P ${CMAKE_CURRENT_LIST_FILE}")
  endif()
  zpp_cuda_nvcc_archs(${NVCC} can)
  zpp_cuda_portable_archs("${can}" archs)
  execute_process(COMMAND ${CMAKE_COMMAND} -E echo "${archs}")
endif()
