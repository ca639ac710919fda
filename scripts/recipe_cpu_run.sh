#!/usr/bin/env bash
# A 20-step run of a paper recipe on the CPU, from nothing: recipes/rpg_reinforce_ufkl_clip_0.2_0.28.yaml
# (RPG-REINFORCE-UFKL, RPG-Style Clip (0.2, 0.28), iterative reference, DAPO dynamic sampling
# and overlong shaping) shrunk to a tiny model by command-line overrides.
#
# Task: the 25 single-digit additions "What is a + b?" (a, b in 0..4) in the paper's prompt
# template and schema, scored by the DAPO math scorer (+1 / -1). A byte-level BPE tokenizer and
# a freshly initialised small Qwen2 model are trained here; a short SFT warm start makes the
# policy partly competent, then 20 RL steps; sampled accuracy (temperature 1, 8 samples x 4
# repeats of each of the 25 problems) is measured before and after. The problems RL is
# measured on are the ones it trains on: this shows the loop learning, not generalisation.
#
# Usage: scripts/recipe_cpu_run.sh [OUT_DIR]   (default runs/recipe_cpu; RPG=path/to/rpg)
set -euo pipefail
OUT=${1:-runs/recipe_cpu}
RPG=$(realpath "${RPG:-build/rpg}")  # absolute: the script works inside OUT_DIR
RECIPE=$(realpath "$(dirname "$0")/../recipes/rpg_reinforce_ufkl_clip_0.2_0.28.yaml")
rm -rf "$OUT"
mkdir -p "$OUT"
cd "$OUT"

python3 - <<'EOF'
import json, random
r = random.Random(0)
pre = ("Solve the following math problem step by step. The last line of your response should be of the form "
       "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
post = "\n\nRemember to put your answer on its own line after \"Answer:\"."
pairs = [(a, b) for a in range(5) for b in range(5)]
with open("problems.jsonl", "w") as f, open("sft.jsonl", "w") as g, open("corpus.txt", "w") as c:
    for _ in range(500):
        a, b = r.choice(pairs)
        q, resp = f"What is {a} + {b}?", f"{a} + {b} = {a + b}.\nAnswer: {a + b}"
        f.write(json.dumps({"problem": q, "answer": str(a + b)}) + "\n")
        g.write(json.dumps({"prompt": pre + q + post, "response": resp}) + "\n")
        c.write(pre + q + post + "\n" + resp + "\n")
with open("eval.jsonl", "w") as f:
    for a, b in pairs:
        f.write(json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n")
EOF
"$RPG" data prepare problems.jsonl train.parquet --data-source math_dapo
"$RPG" data prepare eval.jsonl eval.parquet --data-source math_dapo --repeat 4
"$RPG" tokenizer train --corpus corpus.txt --vocab-size 1024 --chat-template chatml --output tok
"$RPG" model init --tokenizer tok --output init --max-positions 512 --intermediate 384
"$RPG" sft --model init --data sft.jsonl --output sft --steps 60 --lr 3e-3 --batch-size 16 --micro-batch-size 16 --no-progress
"$RPG" eval --model sft/model --data eval.parquet --n 8 --temperature 1 --max-new-tokens 24 --no-progress \
  --output eval_before.json
start=$(date +%s)
"$RPG" train "$RECIPE" \
  actor_rollout_ref.model.path=sft/model data.train_files=train.parquet "data.val_files=[eval.parquet]" \
  data.max_prompt_length=256 data.max_response_length=24 data.train_batch_size=16 data.gen_batch_size=32 \
  actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.val_kwargs.n=2 actor_rollout_ref.rollout.val_kwargs.top_p=1.0 \
  actor_rollout_ref.actor.ppo_mini_batch_size=8 actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192 \
  actor_rollout_ref.actor.optim.lr=6e-4 actor_rollout_ref.actor.optim.lr_warmup_steps=0 \
  actor_rollout_ref.model.enable_gradient_checkpointing=false reward_model.overlong_buffer.len=8 \
  trainer.total_training_steps=20 trainer.test_freq=10 trainer.save_freq=-1 trainer.device=cpu \
  trainer.default_local_dir=rl
echo "rpg train: $(( $(date +%s) - start )) s"
"$RPG" eval --model rl/global_step_20/actor --data eval.parquet --n 8 --temperature 1 --max-new-tokens 24 --no-progress \
  --output eval_after.json

python3 - <<'EOF'
import json
steps = [json.loads(l) for l in open("rl/metrics.jsonl")]
train = [s for s in steps if "acc/mean" in s]
val = [(s["step"], s[k]) for s in steps for k in s if k.startswith("val-core/") and k.endswith("/acc/mean@8")]
first, last = train[:5], train[-5:]
mean = lambda xs: sum(xs) / len(xs)
print(f"training acc/mean (all generated responses), steps 1-5: {mean([s['acc/mean'] for s in first]):.3f}, "
      f"steps 16-20: {mean([s['acc/mean'] for s in last]):.3f}")
print("validation mean@8 (step, acc):", ", ".join(f"({s}, {a:.3f})" for s, a in val))
for name in ("eval_before.json", "eval_after.json"):
    m = json.load(open(name))["math_dapo"]
    print(f"{name}: acc/mean@32 = {m['acc/mean@32']:.4f}")
EOF
