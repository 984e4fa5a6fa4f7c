#!/bin/sh
# Trains hapilot-tiny and hapilot-tiny-penalty from a seed (`make model`):
# the dataset and the initial weights from `hapilot-bench dataset`, then
# llama-finetune from Debian sid at nice 10, the same recipe on train.txt
# and on train-penalty.txt (the same examples and the same number of
# tokens, the suspicious ones repeated). The two models train at once, one
# thread each: on 2 cores that is twice as fast as one after the other,
# since one llama-finetune gains little from a second thread. Every 50th
# progress line of each is printed as it comes; the output is also kept
# as the training log.
#
#   internal/lab/models/train.sh HAPILOT_BENCH OUT_DIR WORK_DIR
#
# OUT_DIR gets NAME/NAME.gguf, NAME/Modelfile and NAME/training.log for
# both models; WORK_DIR the dataset, the initial weights and the raw logs.
set -eu
bench=$1
out=$2
work=$3
here=$(dirname "$0")
. "$here/recipe.env"
finetune=${HAPILOT_LLAMA_DIR:-bin/llama.cpp}/llama-finetune
[ -x "$finetune" ] || { echo "no $finetune: run internal/lab/modelserver/fetch-llama.sh first" >&2; exit 1; }
mkdir -p "$work"
start=$(date +%s)
"$bench" dataset --out "$work" --seed "$SEED" --examples "$EXAMPLES" --vocab "$VOCAB" --prompt "$PROMPT" --pack "$CTX" \
	--width "$WIDTH" --layers "$LAYERS" --ff "$FF" --heads "$HEADS" --penalty "$PENALTY"
train() { # MODEL TEXT
	echo "training $1 on $2 ($(wc -c <"$2") bytes): llama-finetune -c $CTX -b $BATCH -lr $LR -lr-min $LR_MIN -epochs $EPOCHS -t 1"
	nice -n 10 "$finetune" -m "$work/init.gguf" -f "$2" -c "$CTX" -b "$BATCH" -ub "$CTX" \
		-lr "$LR" -lr-min "$LR_MIN" -decay-epochs "$EPOCHS" -epochs "$EPOCHS" -opt adamw -val-split "$VAL" -t 1 \
		-o "$work/$1.finetune.gguf" 2>&1 |
		tee "$work/$1.raw.log" | stdbuf -oL tr '\r' '\n' | grep --line-buffered -a '^train:\|^val:' | awk -v m="$1" 'NR % 50 == 1 { print m ": " $0; fflush() }' || true
}
train hapilot-tiny "$work/train.txt" &
plain=$!
train hapilot-tiny-penalty "$work/train-penalty.txt" &
penalty=$!
wait $plain $penalty
for model in hapilot-tiny hapilot-tiny-penalty; do
	mkdir -p "$out/$model"
	[ -s "$work/$model.finetune.gguf" ] || { echo "llama-finetune wrote no $model.finetune.gguf: see $work/$model.raw.log" >&2; exit 1; }
	# Ollama cannot serve llama-finetune's own file (it holds
	# llama.pooling_type): the recipe's keys, the trained weights.
	"$bench" dataset --out "$work" --trained "$work/$model.finetune.gguf" --gguf "$out/$model/$model.gguf"
	# The log kept: the recipe's lines and every 25th progress line of each
	# epoch, with the last of train and val.
	{ grep -a -- '-optimizer\|^main:\|system_info' "$work/$model.raw.log" || true
	  tr '\r' '\n' <"$work/$model.raw.log" | grep -a '^train:\|^val:' | awk '{ l[NR] = $0 } END { for (i = 1; i <= NR; i++) if (i % 25 == 1 || i == NR) print l[i] }'
	} >"$out/$model/training.log"
	cp "$here/Modelfile.in" "$out/$model/Modelfile"
	sed -i "s/@NAME@/$model/" "$out/$model/Modelfile"
done
cp "$work/stats.json" "$out/dataset-stats.json"
echo "trained in $(( ($(date +%s) - start) / 60 )) min"
