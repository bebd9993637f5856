kvpred-head-profile 1
# CateKV head profile: rows = layers, columns = KV heads; adaptive 1 = full KV
model llama
n_layer 5
n_head_kv 4
ratio 0.2
n_samples 64
n_prompt 256
chunk 8
tail_tokens 8
sink 8
recent 8
window 32
percentile 0.980000019
alpha 1
n_adaptive 4
adaptive
1 0 0 0
0 1 0 0
0 0 0 1
0 0 0 0
1 0 0 0
cv
1.96146339 2.07657617 2.15208987 2.11054037
2.38136546 1.80055256 2.00736235 2.0647085
2.39252302 2.29969039 2.03956222 1.62631996
2.44977513 2.60361201 2.19180485 1.99192822
1.7039999 2.08229246 1.97343211 2.07264388
end
