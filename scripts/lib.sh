# Helpers the benchmark and evaluation scripts share, sourced (not run) by them:
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# What every recorded result carries (date, commit, machine), the checks a script makes before it
# starts (tools installed, kvpred built), the model and the policy files beside it, the peer
# binary that runs here, and a throwaway Redis server or cluster on free loopback ports.
# Functions only: sourcing it sets KVP_ROOT (the repository) and changes nothing else.

KVP_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The UTC time of a result, ISO 8601 to the second.
kvp_date() { date -u +%Y-%m-%dT%H:%M:%SZ; }

# The commit the results were measured at (short hash; "unknown" outside a checkout).
kvp_commit() { git -C "$KVP_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown; }

# The machine in one line: host name, CPU model, cores and memory, what a reader needs to compare
# two results.
kvp_machine() {
    local cpu
    cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
    echo "$(uname -n) $cpu $(nproc) cores $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' \
        /proc/meminfo)"
}

# kvp_need SCRIPT TOOL...: exit with one message per missing tool, before any work is done.
kvp_need() {
    local script=$1 tool
    shift
    for tool in "$@"; do
        command -v "$tool" >/dev/null || { echo "$script: $tool not found" >&2; exit 1; }
    done
}

# kvp_need_built SCRIPT BINARY: exit unless the kvpred binary has been built.
kvp_need_built() {
    [ -x "$2" ] || { echo "$1: $2 not built" >&2; exit 1; }
}

# kvp_model_files: the model a script evaluates and the policy files beside it, as variables:
# m (MODEL, default the shipped model), name (its file name without .gguf), kvpp (KVPP, the
# predictor), qkvpp (QKVPP, the query-aware predictor), profile (PROFILE, the CateKV head
# profile at r 0.4).
kvp_model_files() {
    m="${MODEL:-models/kvpred-default.gguf}"
    name="$(basename "${m%.gguf}")"
    kvpp="${KVPP:-${m%.gguf}.kvpp}"
    qkvpp="${QKVPP:-${m%.gguf}.qkvpp}"
    profile="${PROFILE:-${m%.gguf}.catekv-r0.4.profile}"
}

# kvp_synth KVP FILE THREADS SHAPE: a `kvpred synth --shape SHAPE` model in Q8_0 with random
# weights at FILE, made unless it is there already.
kvp_synth() {
    [ -f "$2" ] && return
    mkdir -p "$(dirname "$2")"
    "$1" synth --shape "$4" --type Q8_0 -t "$3" -o "$2" >&2
}

# kvp_synth_smol KVP FILE THREADS: the same for the SmolLM2-135M shape.
kvp_synth_smol() { kvp_synth "$1" "$2" "$3" SmolLM2-135M; }

# kvp_synth_file SHAPE: where the scripts keep that shape's synth model (/tmp/kvp-long).
kvp_synth_file() {
    case $1 in
    SmolLM2-135M) echo /tmp/kvp-long/smol135m-q8_0.gguf ;;
    Llama-3.2-1B) echo /tmp/kvp-long/llama1b-q8_0.gguf ;;
    *) echo "/tmp/kvp-long/$1-q8_0.gguf" ;;
    esac
}

# kvp_prompt_text TEXT TOKENS FILE: a long prompt at FILE: TEXT's files (TEXT a file, or a folder
# of .txt files) one after another, repeated until FILE holds more than TOKENS tokens (6 bytes a
# token: English takes about 4 with a byte-pair vocabulary, so the model's tokenizer finds more).
kvp_prompt_text() {
    local src
    if [ -d "$1" ]; then src=("$1"/*.txt); else src=("$1"); fi
    [ -f "${src[0]}" ] || { echo "no text at $1" >&2; return 1; }
    : >"$3"
    while [ "$(stat -c %s "$3")" -lt $(($2 * 6)) ]; do cat "${src[@]}" >>"$3"; done
}

# kvp_llama_bench SCRIPT LLAMA_BIN MODEL THREADS: print the path of llama.cpp's llama-bench if it
# runs here on MODEL (the peer binaries may be built for another CPU), else print nothing and say
# so on stderr.
kvp_llama_bench() {
    if [ -x "$2/llama-bench" ] &&
        LD_LIBRARY_PATH="$2" "$2/llama-bench" -m "$3" -p 16 -n 0 -r 1 -t "$4" -o json \
            >/dev/null 2>&1; then
        echo "$2/llama-bench"
    else
        echo "$1: llama-bench missing or failing: kvpred rows only" >&2
    fi
}

# A loopback port nobody listens on, with its cluster bus port (+10000) free too.
kvp_free_port() {
    python3 -c 'import random, socket
for _ in range(1000):
    p = random.randint(20000, 39999)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
        print(p); break
    except OSError:
        pass'
}

# kvp_redis_start DIR PORT [FLAG...]: a redis-server without persistence on 127.0.0.1:PORT, its
# files in DIR; returns once it answers PING (exits if it does not). Its pid is appended to the
# caller's array PIDS, for the caller's cleanup to kill.
kvp_redis_start() {
    local dir=$1 port=$2
    shift 2
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
        "$@" >/dev/null 2>&1 &
    PIDS+=($!)
    for _ in $(seq 500); do redis-cli -p "$port" ping >/dev/null 2>&1 && return; sleep 0.01; done
    echo "redis-server on $port did not start" >&2
    exit 1
}

# kvp_redis_cluster DIR MASTERS REPLICAS: a Redis Cluster of MASTERS x (1 + REPLICAS) nodes on
# free ports (kvp_redis_start, pids in PIDS); returns once every node reports cluster_state:ok,
# with the nodes' host:port in the caller's array NODES.
kvp_redis_cluster() {
    local dir=$1 masters=$2 replicas=$3 q n ok
    NODES=()
    for _ in $(seq $((masters * (1 + replicas)))); do
        q=$(kvp_free_port)
        kvp_redis_start "$dir" "$q" --cluster-enabled yes --cluster-config-file "nodes-$q.conf"
        NODES+=("127.0.0.1:$q")
    done
    redis-cli --cluster create "${NODES[@]}" --cluster-replicas "$replicas" --cluster-yes \
        >/dev/null
    for _ in $(seq 3000); do
        ok=1
        for n in "${NODES[@]}"; do
            redis-cli -p "${n#*:}" cluster info | grep -q cluster_state:ok || ok=0
        done
        [ $ok = 1 ] && return
        sleep 0.01
    done
}
