#!/usr/bin/env bash
# Speculative decoding against plain decoding, alternately, 2 threads by
# default: decode tok/s of the same greedy continuation (identical tokens
# either way), the acceptance rate and tokens per verify step, for prompts in
# each model's chat format:
#   repeat  "Repeat the following text exactly:" and a ~300-token passage;
#   code    a function to restate with one change (input-grounded);
#   rename  the same function with its variable `total` renamed to `acc`;
#   free    an open question, where lookup rarely hits;
#   freecode  an open coding question.
# Drafters: prompt lookup (--lookup) on the two small real models, and on
# Qwen2.5-Coder-1.5B-Instruct both lookup and the 0.5B as a draft model
# (--draft; same vocabulary), when scripts/fetch-models.sh --bench has
# fetched the 1.5B.
#
#   scripts/bench-spec.sh        THREADS (2)  TG (128)  ROUNDS (3)  LOOKUP (3)  DRAFT_MAX (8)
#                                ONLY (unset: every row; "coder" the 1.5B rows,
#                                "small" the two small models' rows)
#
# Prints the CPU's flags line and the load average before and after: on a
# shared machine, repeat when the load is high. Uses target/release/onebit
# (BIN overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${THREADS:-2}"; tg="${TG:-128}"; rounds="${ROUNDS:-3}"
lookup="${LOOKUP:-3}"; draft_max="${DRAFT_MAX:-8}"
bin="${BIN:-target/release/onebit}"
models="${ONEBIT_MODELS:-$HOME/.cache/onebit/models}"

passage="The old harbour town wakes slowly. Before the sun clears the hills, the fishing boats are already out past the breakwater, their lamps still burning against the grey water. On the quay, a baker carries trays of bread to the cafe on the corner, where the owner sets out chairs that nobody will sit in for another hour. The gulls know the routine better than anyone: they wait on the roof of the fish market, watching the doors, ready for the first crates to come in. By seven the streets fill with children on their way to school, their bags bouncing as they run down the steep lanes toward the square. The church bell rings the hour a little late, as it has for as long as anyone can remember, and the clockmaker who lives beside it has long since given up trying to fix it. At the market, prices are called out in a rhythm that sounds almost like singing. Tourists arrive on the morning ferry, blinking in the light, holding maps they will not need, because every street in the town leads back down to the water. In the afternoon the wind turns, the boats come home, and the whole town smells of salt, diesel and frying fish. When evening falls, the lamps along the harbour wall are lit one by one, and the old men who sit on the benches there argue, as they do every night, about the weather that will come tomorrow."
code='def moving_average(values, window):
    """Return the averages of each run of `window` consecutive values."""
    if window <= 0:
        raise ValueError("window must be positive")
    averages = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            averages.append(total / window)
    return averages'
repeat_q="Repeat the following text exactly:

$passage"
code_q="Here is a Python function:

$code

Rewrite the whole function with the parameter \`window\` renamed to \`size\`, changing nothing else."
free_q="What are three good habits for staying healthy? Explain each one in a few sentences."
rename_q="Rename the variable total to acc in this function:

$code"
freecode_q="Write a Python function that merges two sorted lists into one sorted list, with a docstring, and explain how it works."

field() { # json key
  python3 -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"
}
chat() { # model-file question -> the question in the model's chat format
  case "$1" in
    gemma*) printf '<start_of_turn>user\n%s<end_of_turn>\n<start_of_turn>model\n' "$2" ;;
    *) printf '<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n' "$2" ;;
  esac
}

grep -m1 '^flags' /proc/cpuinfo
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| model | task | plain tok/s | lookup tok/s | speed-up | accepted | tokens/step |"
echo "|---|---|---|---|---|---|---|"
coder05="$models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
coder15="$models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
# model | drafter (lookup, or draft: the 0.5B) | tasks
runs=()
if [ "${ONLY:-}" != coder ]; then
  for m in SmolLM2-135M-Instruct.Q4_1.gguf gemma-3-270m-q4_k_m.gguf; do
    runs+=("$m|lookup|repeat code free")
  done
fi
if [ "${ONLY:-}" != small ]; then
  if [ -f "$coder15" ] && [ -f "$coder05" ]; then
    runs+=("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf|lookup|rename code freecode free")
    runs+=("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf|draft|rename code freecode free")
  else
    echo "note: no $coder15 or $coder05 (scripts/fetch-models.sh --bench); the draft-model rows are left out" >&2
  fi
fi
echo "| model | drafter | task | plain tok/s | speculative tok/s | speed-up | accepted | tokens/step |"
echo "|---|---|---|---|---|---|---|---|"
med() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
for run in "${runs[@]}"; do
  IFS='|' read -r m drafter tasks <<< "$run"
  if [ "$drafter" = lookup ]; then
    how=(--lookup "$lookup" --draft-max "$draft_max"); label="lookup $lookup"
  else
    how=(--draft "$coder05" --draft-max "$draft_max"); label="0.5B draft"
  fi
  for task in $tasks; do
    q="${task}_q"; p="$(chat "$m" "${!q}")"
    plain=(); spec=(); acc=""; tps=""
    for _ in $(seq "$rounds"); do
      a=$("$bin" bench --model "$models/$m" --threads "$threads" --prompt-text "$p" \
          --gen-tokens "$tg" --repetitions 1 --json "${how[@]}" 2>/dev/null)
      # Plain decode after the same prompt.
      b=$("$bin" bench --model "$models/$m" --threads "$threads" --prompt-text "$p" \
          --gen-tokens "$tg" --repetitions 1 --json 2>/dev/null)
      spec+=("$(field "$a" decode_tps)"); plain+=("$(field "$b" decode_tps)")
      acc=$(field "$a" draft_acceptance); tps=$(field "$a" tokens_per_step)
    done
    ps=$(med "${plain[@]}"); ss=$(med "${spec[@]}")
    awk -v m="$m" -v d="$label" -v t="$task" -v p="$ps" -v s="$ss" -v a="$acc" -v k="$tps" \
      'BEGIN {printf "| %s | %s | %s | %.1f | %.1f | %.2fx | %.0f %% | %.2f |\n", m, d, t, p, s, s/p, 100*a, k}'
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
