#!/usr/bin/env bash
# Installs what zeropp needs from the distribution, if it is missing:
# a C compiler, CMake, Open MPI, OpenBLAS, cJSON, PCRE2 and gnuplot. (CUDA is optional: when
# nvcc is on the PATH the GPU code is compiled in.)
set -euo pipefail

need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
dpkg -s libopenblas-dev >/dev/null 2>&1 || need+=(libopenblas-dev)
dpkg -s libcjson-dev >/dev/null 2>&1 || need+=(libcjson-dev)
dpkg -s libpcre2-dev >/dev/null 2>&1 || need+=(libpcre2-dev) # the tokenizer's regex
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v gnuplot >/dev/null 2>&1 || need+=(gnuplot-nox) # zeropp plot, scripts/demo.sh's picture

if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
echo "zeropp: installing ${need[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
