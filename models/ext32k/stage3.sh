#!/bin/sh
# Stage 3 of the 32K extension: stage 2 lost 7-10 points of niah_multikey at 2048-8192 tokens,
# so this stage starts from stage2.gguf (fresh AdamW) and spends three quarters of its steps at
# 8192 tokens with samples from a quarter of the context up (2048-8192), niah_multikey_1 the
# largest share, then a quarter at 32768 so the long distances stay trained.
# usage: stage3.sh CKPT OUT.gguf [extra flags]  (CKPT: where the checkpoint goes; an existing
# one is resumed)
# Environment: KVP (default build/kvpred), KVP_SHARED_DIR (default ../shared), KVP_NICE
# (default 5). The haystacks need the Debian packages fortunes and perl (perldiag.pod).
S=${KVP_SHARED_DIR:-../shared}/data
CK=$1; OUT=$2; shift 2
if [ -f "$CK" ]; then START="--resume $CK"; else START="--init-from models/ext32k/stage2.gguf"; fi
exec nice -n "${KVP_NICE:-5}" "${KVP:-build/kvpred}" train-lm $START \
  --data $S/tinystories/tinystories_val.txt $S/tinyshakespeare/input.txt \
  --hay $S/tinyshakespeare/input.txt /usr/share/common-licenses /usr/share/games/fortunes \
        /usr/share/perl/5.36/pod/perldiag.pod \
  --ctx 32768 --rope-base 2560000 --curriculum 8192:0.75,32768:0.25 --batch 1 --steps 120 \
  --lr 2e-4 --lr-min 2e-5 --warmup 0.05 --answer-weight 8 --hay-frac 0.3 --fill-min 0.25 --edge-frac 0.3 \
  --mix lm:0.08,copy:0.06,passkey:0.12,niah_single_1:0.04,niah_single_2:0.18,niah_single_3:0.03,niah_multikey_1:0.36,niah_multikey_2:0.04,niah_multikey_3:0.02,niah_multivalue:0.03,niah_multiquery:0.02,vt:0.02 \
  --ckpt "$CK" --ckpt-every 10 --eval-every 0 --eval-samples 4 --threads 2 --seed 31 -o "$OUT" "$@"
