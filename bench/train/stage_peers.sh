#!/usr/bin/env bash
# Copies the peers of the race (bench/train/race.sh) into .peers/ of this tree:
# PyTorch FSDP2's fsdp_gpt.py and fsdp_llama.py, coll_bw.py (NCCL bandwidth), deepspeed/ (ds_gpt.py, emu_rank.sh, the
# DeepSpeed 0.19.8 wheels, Python 3.12 headers for its JIT-built op) and llmc/ (llm.c's pinned
# sources and llmc_peer.sh). They live
# outside the repository (../shared/bench by default, or the folder given), and
# a GPU call only sees this tree, so .peers/ (git-ignored) is carried with it:
#   bash bench/train/stage_peers.sh [SRC]     then run(carry: .deps .peers)
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${1:-../shared/bench}
if ! [ -f "$SRC/fsdp_gpt.py" ] || ! [ -f "$SRC/deepspeed/ds_gpt.py" ]; then echo "no peers in $SRC"; exit 1; fi
rm -rf .peers && mkdir .peers
cp -rL "$SRC/fsdp_gpt.py" "$SRC/coll_bw.py" "$SRC/deepspeed" .peers/
[ -f "$SRC/fsdp_llama.py" ] && cp -L "$SRC/fsdp_llama.py" .peers/
[ -d "$SRC/llmc" ] && cp -rL "$SRC/llmc" .peers/
chmod -R u+w .peers  # the source is read-only; the next staging must be able to replace the copy
echo "staged $(du -sh .peers | cut -f1) into .peers/ from $SRC"
