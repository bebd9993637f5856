kvpred-head-profile 1
# CateKV head profile: rows = layers, columns = KV heads; adaptive 1 = full KV
model kvpred-trained
n_layer 4
n_head_kv 2
ratio 0.4
n_samples 16
n_prompt 8192
chunk 8
tail_tokens 32
sink 16
recent 16
window 32
percentile 0.995
alpha 1
n_adaptive 4
adaptive
1 0
1 0
0 1
0 1
cv
2.50870932 5.38930636
3.91204768 5.15915308
4.28096203 3.74079441
5.08597491 4.20939606
end
