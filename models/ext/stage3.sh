#!/bin/sh
# Stage 3 of the context extension: 2048 and 8192 in alternating phases (stage 2 trained at 8192
# only and niah_multikey at 2048 slipped to 77 %), more weight on niah_multikey_1 (the evaluated
# generator), a lower learning rate, steps 600-900.
# usage: stage3.sh CKPT OUT.gguf [extra flags]  (CKPT: a copy of stage2.sh's checkpoint to start; resumes it)
# Environment: KVP (default build/kvpred), KVP_SHARED_DIR (default ../shared). The haystacks need
# the Debian packages fortunes and perl (perldiag.pod).
S=${KVP_SHARED_DIR:-../shared}/data
CK=$1; OUT=$2; shift 2
exec "${KVP:-build/kvpred}" train-lm --resume "$CK" \
  --data $S/tinystories/tinystories_val.txt $S/tinyshakespeare/input.txt \
  --hay $S/tinyshakespeare/input.txt /usr/share/common-licenses /usr/share/games/fortunes \
        /usr/share/perl/5.36/pod/perldiag.pod \
  --ctx 8192 --rope-base 160000 --batch 2 --steps 900 \
  --curriculum 2048:1,8192:1,2048:1,8192:1,2048:1,8192:1,2048:1,8192:1 \
  --lr 3e-4 --lr-min 3e-5 --answer-weight 8 --hay-frac 0.5 --fill-min 0.85 --edge-frac 0.35 \
  --mix copy:0.08,passkey:0.12,niah_single_1:0.03,niah_single_2:0.20,niah_single_3:0.03,niah_multikey_1:0.36,niah_multikey_2:0.05,niah_multikey_3:0.03,niah_multivalue:0.04,niah_multiquery:0.04,vt:0.02 \
  --ckpt "$CK" --ckpt-every 10 --threads 2 -o "$OUT" "$@"
