#!/bin/sh
# Judges a committed model through the lab's real Ollama: imports it with
# `ollama create` in its folder, scores it with `hapilot calibrate` at
# --interval 10s and 1s, and runs `hapilot-bench bench --policy rules,llm`
# with it. Every command's output is kept under OUT.
#
#   internal/lab/models/judge.sh MODEL OUT [bench flags...]
#
# HAPILOT_OLLAMA_BIN names the ollama binary (default bin/ollama);
# bin/hapilot and bin/hapilot-bench are used (make build).
set -eu
model=$1
out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
# The prompt's style the model was trained on (recipe.env's PROMPT).
prompt=$(. "$here/recipe.env" && echo "${PROMPT:-full}")
# Absolute: ollama create runs in the model's folder.
ollama=$(readlink -f "${HAPILOT_OLLAMA_BIN:-bin/ollama}")
hapilot=${HAPILOT_BIN:-bin/hapilot}
bench=${HAPILOT_BENCH_BIN:-bin/hapilot-bench}
mkdir -p "$out"
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
host=127.0.0.1:$port
env -i PATH="$PATH" HOME="$tmp" OLLAMA_HOST=$host OLLAMA_MODELS="$tmp/models" CUDA_VISIBLE_DEVICES=-1 "$ollama" serve >"$tmp/ollama.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 60); do curl -sf "http://$host/api/version" >/dev/null && break; sleep 1; done
(cd "$here/$model" && env -i PATH="$PATH" HOME="$tmp" OLLAMA_HOST=$host "$ollama" create "$model" -f Modelfile) >"$out/create.txt" 2>&1
for iv in 10s 1s; do
	echo "\$ hapilot calibrate --model $model --llm-prompt $prompt --interval $iv" >"$out/calibrate-$iv.txt"
	"$hapilot" calibrate --model "$model" --llm-prompt "$prompt" --ollama-host "http://$host" --calibration-dir "$tmp/cal" --interval "$iv" >>"$out/calibrate-$iv.txt" 2>&1 || true
	tail -2 "$out/calibrate-$iv.txt"
done
if [ $# -gt 0 ]; then
	echo "\$ hapilot-bench bench --policy rules,llm --model $model --llm-prompt $prompt $*" >"$out/bench.txt"
	"$bench" bench --policy rules,llm --model "$model" --llm-prompt "$prompt" --ollama-host "http://$host" --out "$out/bench" "$@" >>"$out/bench.txt" 2>&1 || echo "bench failed: see $out/bench.txt"
	cp "$tmp/ollama.log" "$out/ollama.log" 2>/dev/null || true
fi
