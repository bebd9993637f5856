#!/bin/sh
# Stage 1 of the 32K extension: from the shipped 8K model (models/kvpred-default.gguf) to a
# 16384-token context, RoPE base 2560000 (16x the 8K model's 160000, the ratio the 2048 -> 8192
# extension used). Retrieval samples at 8192 then 16384 tokens, haystacks half from other texts.
# usage: stage1.sh CKPT OUT.gguf [extra flags]
#   CKPT missing: starts from KVP_INIT (default models/kvpred-default.gguf); present: resumes it.
# Environment: KVP (default build/kvpred), KVP_SHARED_DIR (default ../shared). The haystacks need
# the Debian packages fortunes and perl (perldiag.pod).
S=${KVP_SHARED_DIR:-../shared}/data
CK=$1; OUT=$2; shift 2
if [ -f "$CK" ]; then
  START="--resume $CK"
else
  START="--init-from ${KVP_INIT:-models/kvpred-default.gguf}"
fi
exec nice -n "${KVP_NICE:-5}" "${KVP:-build/kvpred}" train-lm $START \
  --data $S/tinystories/tinystories_val.txt $S/tinyshakespeare/input.txt \
  --hay $S/tinyshakespeare/input.txt /usr/share/common-licenses /usr/share/games/fortunes \
        /usr/share/perl/5.36/pod/perldiag.pod \
  --ctx 16384 --rope-base 2560000 --curriculum 8192:0.3,16384:0.7 --batch 1 --steps 150 \
  --lr 5e-4 --lr-min 5e-5 --warmup 0.05 --answer-weight 8 --hay-frac 0.5 --fill-min 0.5 --edge-frac 0.3 \
  --mix lm:0.08,copy:0.08,passkey:0.16,niah_single_1:0.04,niah_single_2:0.20,niah_single_3:0.04,niah_multikey_1:0.24,niah_multikey_2:0.04,niah_multikey_3:0.02,niah_multivalue:0.04,niah_multiquery:0.04,vt:0.02 \
  --ckpt "$CK" --ckpt-every 10 --eval-every 0 --eval-samples 2 --threads 2 --seed 23 -o "$OUT" "$@"
