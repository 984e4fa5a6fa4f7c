#!/bin/sh
# Trains hapilot-tiny and hapilot-tiny-penalty from a seed (`make model`):
# the dataset from `hapilot-bench dataset`, then the recipe's trainer
# (recipe.env's TRAINER) at nice 10, the two models at once on one thread
# each (on 2 cores twice as fast as one after the other: neither trainer
# gains much from a second thread at this size).
#
#   torch           train.py, PyTorch from Debian (python3-torch, with
#                   OpenBLAS): the loss on the answer's tokens only; the
#                   penalty model weighs an example that flags a healthy
#                   server PENALTY times, on the same examples and steps;
#                   both weigh one that acts after a history line HISTORY
#                   times (1 where recipe.env has none).
#                   check.py then compares its greedy answers with
#                   llama-server's on the same token ids.
#   llama-finetune  llama.cpp's, from Debian sid (the first two attempts):
#                   the loss on every token of train.txt, and the penalty
#                   as repetition in train-penalty.txt.
#
#   [RECIPE=FILE] internal/lab/models/train.sh HAPILOT_BENCH OUT_DIR WORK_DIR
#
# OUT_DIR gets NAME/NAME.gguf, NAME/Modelfile and NAME/training.log for
# each of the recipe's models (MODEL, and PENALTY_MODEL where it names
# one); WORK_DIR the dataset, the weights and the raw logs. RECIPE is
# recipe.env unless set (recipe-grey.env trains hapilot-grey alone, on two
# threads).
set -eu
bench=$1
out=$2
work=$3
here=$(dirname "$0")
. "${RECIPE:-$here/recipe.env}"
# The models a recipe trains: recipe.env's two, unless it names others.
MODEL=${MODEL:-hapilot-tiny}
PENALTY_MODEL=${PENALTY_MODEL-hapilot-tiny-penalty}
THREADS=${THREADS:-1}
STATS=${STATS:-dataset-stats.json}
llama=${HAPILOT_LLAMA_DIR:-bin/llama.cpp}
python=${HAPILOT_PYTHON:-/usr/bin/python3}
TRAINER=${TRAINER:-llama-finetune}
case $TRAINER in
torch) "$python" -c 'import torch' 2>/dev/null || { echo "no PyTorch for $python: apt-get install python3-torch libopenblas0-pthread" >&2; exit 1; } ;;
llama-finetune) [ -x "$llama/llama-finetune" ] || { echo "no $llama/llama-finetune: run internal/lab/modelserver/fetch-llama.sh first" >&2; exit 1; } ;;
*) echo "recipe.env: TRAINER=$TRAINER: torch or llama-finetune" >&2; exit 1 ;;
esac
mkdir -p "$work"
start=$(date +%s)
"$bench" dataset --out "$work" --seed "$SEED" --examples "$EXAMPLES" --vocab "$VOCAB" --prompt "$PROMPT" --pack "$CTX" \
	--width "$WIDTH" --layers "$LAYERS" --ff "$FF" --heads "$HEADS" --penalty "$PENALTY" --frozen "${FROZEN:-0}" --unlimited "${UNLIMITED:-0}" --slow-below "${SLOW_BELOW:-0}"
# Each trainer writes WORK_DIR/MODEL.trained.gguf and MODEL.raw.log.
finetune() { # MODEL TEXT
	echo "training $1 on $2 ($(wc -c <"$2") bytes): llama-finetune -c $CTX -b $BATCH -lr $LR -lr-min $LR_MIN -epochs $EPOCHS -t 1"
	nice -n 10 "$llama/llama-finetune" -m "$work/init.gguf" -f "$2" -c "$CTX" -b "$BATCH" -ub "$CTX" \
		-lr "$LR" -lr-min "$LR_MIN" -decay-epochs "$EPOCHS" -epochs "$EPOCHS" -opt adamw -val-split "$VAL" -t 1 \
		-o "$work/$1.trained.gguf" 2>&1 |
		tee "$work/$1.raw.log" | stdbuf -oL tr '\r' '\n' | grep --line-buffered -a '^train:\|^val:' | awk -v m="$1" 'NR % 50 == 1 { print m ": " $0; fflush() }' || true
}
torch() { # MODEL PENALTY
	nice -n 10 "$python" "$here/train.py" --work "$work" --out "$work/$1.trained.gguf" --penalty "$2" --history "${HISTORY:-1}" \
		--epochs "$EPOCHS" --lr "$LR" --lr-min "$LR_MIN" --batch-tokens "$BATCH_TOKENS" --val "$VAL" --seed "$SEED" --threads "$THREADS" 2>&1 |
		tee "$work/$1.raw.log" | awk -v m="$1" '!/^train:/ || NR % 20 == 0 { print m ": " $0; fflush() }' || true
}
pids=""
if [ "$TRAINER" = torch ]; then
	torch "$MODEL" 1 &
	pids=$!
	[ -z "$PENALTY_MODEL" ] || { torch "$PENALTY_MODEL" "$PENALTY" & pids="$pids $!"; }
else
	finetune "$MODEL" "$work/train.txt" &
	pids=$!
	[ -z "$PENALTY_MODEL" ] || { finetune "$PENALTY_MODEL" "$work/train-penalty.txt" & pids="$pids $!"; }
fi
# shellcheck disable=SC2086 # one word a pid
wait $pids
for model in $MODEL $PENALTY_MODEL; do
	mkdir -p "$out/$model"
	[ -s "$work/$model.trained.gguf" ] || { echo "$TRAINER wrote no $model.trained.gguf: see $work/$model.raw.log" >&2; exit 1; }
	# The recipe's keys and vocabulary around the trained weights (Ollama
	# cannot serve llama-finetune's own file, which holds
	# llama.pooling_type; train.py's holds the tensors only).
	"$bench" dataset --out "$work" --trained "$work/$model.trained.gguf" --gguf "$out/$model/$model.gguf"
	if [ "$TRAINER" = torch ]; then
		# Every line but the training's progress, which is every 20th.
		awk '!/^train:/ || NR % 20 == 0' "$work/$model.raw.log" >"$out/$model/training.log"
		# The served model answers as the trained one did, or the GGUF
		# train.py wrote is wrong.
		port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
		"$llama/llama-server" -m "$out/$model/$model.gguf" --host 127.0.0.1 --port "$port" -c 2048 -np 1 -t 2 --no-webui >"$work/$model.llama-server.log" 2>&1 &
		server=$!
		for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
		ok=0
		"$python" "$here/check.py" --work "$work" --gguf "$work/$model.trained.gguf" --server "http://127.0.0.1:$port" --n 30 >"$work/$model.check.log" || ok=1
		tee -a "$out/$model/training.log" <"$work/$model.check.log"
		kill $server; wait $server 2>/dev/null || true
		[ $ok = 0 ] || { echo "$model: llama-server answers differently from PyTorch (check.py)" >&2; exit 1; }
	else
		# The recipe's lines and every 25th progress line of each epoch,
		# with the last of train and val.
		{ grep -a -- '-optimizer\|^main:\|system_info' "$work/$model.raw.log" || true
		  tr '\r' '\n' <"$work/$model.raw.log" | grep -a '^train:\|^val:' | awk '{ l[NR] = $0 } END { for (i = 1; i <= NR; i++) if (i % 25 == 1 || i == NR) print l[i] }'
		} >"$out/$model/training.log"
	fi
	cp "$here/Modelfile.in" "$out/$model/Modelfile"
	sed -i "s/@NAME@/$model/" "$out/$model/Modelfile"
done
cp "$work/stats.json" "$out/$STATS"
echo "trained in $(( ($(date +%s) - start) / 60 )) min"
