#!/bin/sh
# Stage 2 of the context extension: 8192 only, retrieval samples filling 85-100 % of the context.
# Its export is the shipped models/kvpred-default.gguf (byte for byte).
# usage: stage2.sh CKPT OUT.gguf [extra flags]  (CKPT: a copy of stage1.sh's checkpoint to
# start; resumes it)
# Environment: KVP (default build/kvpred), KVP_SHARED_DIR (default ../shared). The haystacks need
# the Debian packages fortunes and perl (perldiag.pod).
S=${KVP_SHARED_DIR:-../shared}/data
CK=$1; OUT=$2; shift 2
exec nice -n 5 "${KVP:-build/kvpred}" train-lm --resume "$CK" \
  --data $S/tinystories/tinystories_val.txt $S/tinyshakespeare/input.txt \
  --hay $S/tinyshakespeare/input.txt /usr/share/common-licenses /usr/share/games/fortunes \
        /usr/share/perl/5.36/pod/perldiag.pod \
  --ctx 8192 --rope-base 160000 --curriculum 8192:1 --batch 2 --steps 600 \
  --lr 4e-4 --lr-min 4e-5 --answer-weight 8 --hay-frac 0.5 --fill-min 0.85 --edge-frac 0.35 \
  --mix copy:0.10,passkey:0.16,niah_single_1:0.04,niah_single_2:0.24,niah_single_3:0.04,niah_multikey_1:0.26,niah_multikey_2:0.04,niah_multikey_3:0.02,niah_multivalue:0.04,niah_multiquery:0.04,vt:0.02 \
  --ckpt "$CK" --ckpt-every 10 --threads 2 -o "$OUT" "$@"
