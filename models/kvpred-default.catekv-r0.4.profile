kvpred-head-profile 1
# CateKV head profile: rows = layers, columns = KV heads; adaptive 1 = full KV
model kvpred-trained
n_layer 4
n_head_kv 2
ratio 0.4
n_samples 16
n_prompt 2048
chunk 8
tail_tokens 32
sink 16
recent 16
window 32
percentile 0.995
alpha 1
n_adaptive 5
adaptive
1 0
1 0
1 1
0 1
cv
2.52633379 5.05474026
3.40411706 5.29441111
3.82111697 3.80598041
4.45540234 2.87751995
end
