#!/bin/sh
# Stage 2 of the 32K extension: 16384 then 32768 tokens, same RoPE base (2560000), resuming
# stage 1's checkpoint (its optimiser moments kept; a new stage with its own warm-up and cosine).
# usage: stage2.sh CKPT OUT.gguf [extra flags]  (CKPT: a copy of stage1.sh's checkpoint to
# start; resumes it)
# Environment: KVP (default build/kvpred), KVP_SHARED_DIR (default ../shared), KVP_NICE
# (default 5). The haystacks need the Debian packages fortunes and perl (perldiag.pod).
S=${KVP_SHARED_DIR:-../shared}/data
CK=$1; OUT=$2; shift 2
exec nice -n "${KVP_NICE:-5}" "${KVP:-build/kvpred}" train-lm --resume "$CK" \
  --data $S/tinystories/tinystories_val.txt $S/tinyshakespeare/input.txt \
  --hay $S/tinyshakespeare/input.txt /usr/share/common-licenses /usr/share/games/fortunes \
        /usr/share/perl/5.36/pod/perldiag.pod \
  --ctx 32768 --rope-base 2560000 --curriculum 16384:0.3,32768:0.7 --batch 1 --steps 350 \
  --lr 4e-4 --lr-min 4e-5 --warmup 0.05 --answer-weight 8 --hay-frac 0.5 --fill-min 0.6 --edge-frac 0.3 \
  --mix lm:0.08,copy:0.06,passkey:0.16,niah_single_1:0.04,niah_single_2:0.22,niah_single_3:0.04,niah_multikey_1:0.26,niah_multikey_2:0.04,niah_multikey_3:0.02,niah_multivalue:0.03,niah_multiquery:0.03,vt:0.02 \
  --ckpt "$CK" --ckpt-every 5 --eval-every 0 --eval-samples 2 --threads 2 --seed 29 -o "$OUT" "$@"
