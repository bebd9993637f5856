# Shared by scripts/fuzz.sh and scripts/fuzz_campaign.sh (sourced, not run): the fuzz targets,
# their libFuzzer flags, the build and the seed corpus.

# Every target; its seeds are in SEEDS/<name without fuzz_>.
FUZZ_TARGETS=(fuzz_gguf fuzz_llama2c fuzz_predictor fuzz_trace fuzz_head_profile fuzz_spm fuzz_bpe
              fuzz_chat fuzz_policy_opts fuzz_corpus_json fuzz_server_request fuzz_server_http
              fuzz_prefill_gate)

# libFuzzer flags of one target (ROOT the checkout): input size limit (files need room, texts stay
# short so each input runs fast), per-input timeout, memory limit, and the target's dictionary
# (fuzz/<name without fuzz_>.dict) when it has one.
fuzz_flags() {
    local max_len dict="$2/fuzz/${1#fuzz_}.dict"
    case "$1" in
        fuzz_gguf|fuzz_llama2c|fuzz_predictor) max_len=65536 ;;
        fuzz_trace|fuzz_head_profile|fuzz_prefill_gate) max_len=16384 ;;
        *) max_len=4096 ;;
    esac
    echo "-max_len=$max_len -timeout=10 -rss_limit_mb=2048"
    [ -f "$dict" ] && echo "-dict=$dict"
    return 0
}

# fuzz_build ROOT BUILD JOBS: configure with clang and build every target and the seed generator.
fuzz_build() {
    local cc="${CC:-clang}"
    case "$cc" in *clang*) ;; *) cc=clang ;; esac
    CC="$cc" cmake -S "$1" -B "$2" -DKVP_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$2" -j"$3" --target fuzz_seedgen "${FUZZ_TARGETS[@]}"
}

# fuzz_seeds ROOT BUILD DIR: write the generated seed corpus to DIR (replacing it), plus the
# extra seeds: GGUF files from ../shared/models when present, the repo's predictor files and head
# profiles.
fuzz_seeds() {
    local root="$1" build="$2" seeds="$3"
    rm -rf "$seeds"
    "$build/fuzz_seedgen" "$seeds"
    local shared="$root/../shared/models"
    if [ -d "$shared" ]; then
        # read in place at run time (libFuzzer truncates them to -max_len)
        find "$shared" -maxdepth 2 -name '*.gguf' -size -4M -exec cp {} "$seeds/gguf/" \; || true
    fi
    cp "$root"/models/*.kvpp "$seeds/predictor/" 2>/dev/null || true
    cp "$root"/models/*.profile "$seeds/head_profile/" 2>/dev/null || true
    cp "$root"/models/*.kvpg "$seeds/prefill_gate/" 2>/dev/null || true
}
