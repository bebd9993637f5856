#!/bin/sh
# Stage 1 of the context extension, as in models/kvpred-default.md.
# usage: stage1.sh CKPT OUT.gguf [extra flags, e.g. --stop-after 16]
# Starts from the 2048-token model (KVP_INIT: its GGUF, e.g.
# `git show 8144489:models/kvpred-default.gguf > kvpred-default-2k.gguf`) when CKPT does not
# exist yet, else resumes CKPT (same settings: the same stage, bit-exact). The checkpoint (10 MB,
# Adam moments included) is what stage2.sh resumes; it is not kept in the repository.
# Environment: KVP (default build/kvpred), KVP_SHARED_DIR (default ../shared), KVP_INIT. The
# haystacks need the Debian packages fortunes and perl (perldiag.pod).
S=${KVP_SHARED_DIR:-../shared}/data
CK=$1; OUT=$2; shift 2
if [ -f "$CK" ]; then
  START="--resume $CK"
elif [ -n "$KVP_INIT" ]; then
  START="--init-from $KVP_INIT"
else
  echo "stage1.sh: $CK does not exist; set KVP_INIT to the 2048-token model to start" >&2
  exit 1
fi
exec nice -n 5 "${KVP:-build/kvpred}" train-lm $START \
  --data $S/tinystories/tinystories_val.txt $S/tinyshakespeare/input.txt \
  --hay $S/tinyshakespeare/input.txt /usr/share/common-licenses /usr/share/games/fortunes \
        /usr/share/perl/5.36/pod/perldiag.pod \
  --ctx 8192 --rope-base 160000 --curriculum 4096:0.4,8192:0.6 --batch 2 --steps 300 \
  --lr 6e-4 --lr-min 6e-5 --warmup 0.03 --answer-weight 8 --hay-frac 0.5 --fill-min 0.5 --edge-frac 0.35 \
  --mix copy:0.12,passkey:0.20,niah_single_1:0.04,niah_single_2:0.20,niah_single_3:0.04,niah_multikey_1:0.22,niah_multikey_2:0.04,niah_multikey_3:0.02,niah_multivalue:0.04,niah_multiquery:0.04,vt:0.02 \
  --ckpt "$CK" --ckpt-every 10 --eval-every 50 --eval-samples 3 --threads 2 --seed 19 -o "$OUT" "$@"
