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
n_adaptive 3
adaptive
1 0
1 0
0 0
0 1
cv
2.09352831 4.6656708
3.26961311 4.86131304
3.85579718 3.78897658
4.75161011 2.62310114
end
