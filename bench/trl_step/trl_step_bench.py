"""A full RL step, side by side: `rpg train` vs TRL's GRPOTrainer on the same tiny Qwen2,
prompts, batch, group size and lengths, in one run. Prints the median seconds per step of
each, wall and CPU seconds (the first step of every run is dropped as warm-up), rpg's phases
(timing_s/* and perf/cpu_s/*), and the ratios. CPU seconds are the measure on a shared,
loaded machine: wall time there mostly measures the other processes.

  .venv/bin/python bench/trl_step/trl_step_bench.py [--rpg build/rpg] [--steps 4] [--rounds 2]
      [--threads 2] [--prompts 16] [--n 8] [--max-new-tokens 64] [--packed]
      [--omp-wait-policy default|passive|active] [--work DIR [--only-inputs]] [--device cpu|cuda]
      [--json] [--model DIR] [--ignore-eos] [--bf16-rollout] [--bf16]

--model DIR: a real checkpoint (its tokenizer and chat template) instead of the random tiny
Qwen2, e.g. SmolLM2-135M-Instruct; the step is then also printed in model GFLOP/s and % of
the machine's 2048^3 GEMM peak (bench/roofline's measure). --ignore-eos: responses of exactly
--max-new-tokens on both sides (rpg rollout.ignore_eos, TRL min_new_tokens), so both do the
same work whatever the model emits.

--device cuda (scripts/gpu_check.sh): both sides on the GPU (rpg trainer.device=cuda, TRL
without use_cpu), still fp32; --json adds one JSON line with the medians for a results file.
--bf16: mixed precision on both sides instead (TRL's bf16=True autocast; rpg's bf16 compute
copy and bf16 rollouts), fp32 master weights and optimizer on both: on a CPU with AMX the
bf16 products are several times the fp32 ones on either side.

GRPO on both sides: group-normalised advantages, PPO-clip token loss, k3 KL to the fixed
initial policy with beta 1e-3, one optimizer step per batch (one mini-batch, one epoch:
on-policy), fp32 (unless --bf16), no gradient checkpointing, temperature 1. The model: a random Qwen2 with
4 layers, hidden 256 (intermediate 1024, 4 heads, 2 KV heads) over the byte-level BPE
vocabulary of tests/oracles/tiny_chat_model.py (its tokenizer and chat template). Random
weights rarely emit EOS, so responses run to --max-new-tokens on both sides. Runs alternate
(rpg, with --packed rpg with use_remove_padding, TRL) --rounds times; each is a fresh process.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

ap = argparse.ArgumentParser()
ap.add_argument("--rpg", default=os.path.join(REPO, "build", "rpg"))
ap.add_argument("--steps", type=int, default=4, help="steps per run (the first is warm-up)")
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--prompts", type=int, default=16)
ap.add_argument("--n", type=int, default=8)
ap.add_argument("--max-new-tokens", type=int, default=64)
ap.add_argument("--packed", action="store_true", help="also run rpg with actor_rollout_ref.model.use_remove_padding")
ap.add_argument("--bf16-rollout", action="store_true",
                help="also run rpg with actor_rollout_ref.rollout.dtype=bfloat16 (training stays fp32)")
ap.add_argument("--bf16", action="store_true",
                help="mixed precision on both sides: TRL with bf16=True (autocast), rpg with "
                     "actor_rollout_ref.actor.compute_dtype=bfloat16 and bf16 rollouts (fp32 master weights "
                     "on both); the default is fp32 on both")
ap.add_argument("--omp-wait-policy", choices=["default", "passive", "active"], default="default",
                help="OMP_WAIT_POLICY for both sides (passive: no spinning at OpenMP barriers, which on a loaded "
                     "machine burns CPU while a descheduled thread is waited for)")
ap.add_argument("--work", help="keep the inputs and runs in this folder (made if missing; reused if it has them)")
ap.add_argument("--only-inputs", action="store_true", help="with --work: make the inputs and stop")
ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
ap.add_argument("--json", action="store_true", help="end with one JSON line of the medians")
ap.add_argument("--model", help="a real model directory instead of the random tiny Qwen2")
ap.add_argument("--ignore-eos", action="store_true", help="fixed-length responses on both sides")
ap.add_argument("--trl-worker", nargs=2, metavar=("WORKDIR", "OUT"), help=argparse.SUPPRESS)
args = ap.parse_args()


def trl_worker(work, out):
    """One TRL GRPOTrainer run in this process: seconds of every step to OUT (JSON)."""
    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    rows = pq.read_table(os.path.join(work, "p.parquet")).to_pylist()
    prompts = [[{"role": m["role"], "content": m["content"]} for m in r["prompt"]] for r in rows]
    dataset = Dataset.from_dict({"prompt": prompts})

    def reward(completions, **kw):  # timing only: the reward does not change the work
        return [float(len(c[0]["content"]) % 2) for c in completions]

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times, self.cpu, self.t0, self.c0 = [], [], None, None

        def on_step_begin(self, a, state, control, **kw):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, a, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)
            self.cpu.append(time.process_time() - self.c0)  # user + sys of the process, every thread

    model_dir = os.path.join(work, "model")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = GRPOConfig(output_dir=os.path.join(work, "trl_out"), per_device_train_batch_size=args.prompts * args.n,
                     gradient_accumulation_steps=1, num_generations=args.n, max_completion_length=args.max_new_tokens,
                     beta=1e-3, learning_rate=1e-6, max_steps=args.steps, logging_steps=1, report_to="none",
                     use_cpu=args.device == "cpu", bf16=args.bf16, save_strategy="no", temperature=1.0, num_iterations=1, seed=1,
                     loss_type="grpo", gradient_checkpointing=False, dataloader_num_workers=0,
                     generation_kwargs={"min_new_tokens": args.max_new_tokens} if args.ignore_eos else None)
    times = StepTimes()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=dataset, processing_class=tok,
                          callbacks=[times])
    trainer.train()
    json.dump({"step_s": times.times, "step_cpu_s": times.cpu}, open(out, "w"))


if args.trl_worker:
    trl_worker(*args.trl_worker)
    sys.exit(0)


def run_checked(argv, env=None):
    """Runs a child; on failure exits with its command and the end of its stderr."""
    r = subprocess.run(argv, capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"trl_step_bench: {' '.join(map(str, argv[:3]))} ... exited {r.returncode}:\n{r.stderr[-3000:]}")
    return r


def make_inputs(work):
    if os.path.exists(os.path.join(work, "p.parquet")):
        return
    if args.model:
        os.symlink(os.path.abspath(args.model), os.path.join(work, "model"))
        write_prompts(work)
        return
    sys.path.insert(0, os.path.join(REPO, "tests", "oracles"))
    run_checked([sys.executable, os.path.join(REPO, "tests", "oracles", "tiny_chat_model.py"), work])
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, Qwen2Config

    model_dir = os.path.join(work, "model")
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(model_dir)  # over the tiny one, tokenizer kept
    write_prompts(work)


def write_prompts(work):
    with open(os.path.join(work, "p.jsonl"), "w") as f:
        for i in range(args.prompts):
            f.write(json.dumps({"problem": f"What is {i} + {i + 1}?", "answer": str(2 * i + 1)}) + "\n")
    run_checked([args.rpg, "data", "prepare", os.path.join(work, "p.jsonl"), os.path.join(work, "p.parquet"),
                 "--data-source", "math_dapo"])


def child_env():
    env = dict(os.environ)
    if args.omp_wait_policy != "default":
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    return env


def rpg_run(work, name, extra):
    run = os.path.join(work, name)
    shutil.rmtree(run, ignore_errors=True)  # a run folder left by an earlier --work run would resume, not train
    argv = [args.rpg, "--threads", str(args.threads), "train", "-",
            f"actor_rollout_ref.model.path={work}/model", f"data.train_files={work}/p.parquet",
            f"data.train_batch_size={args.prompts}", "data.max_prompt_length=256",
            f"data.max_response_length={args.max_new_tokens}", f"actor_rollout_ref.rollout.n={args.n}",
            f"actor_rollout_ref.rollout.max_num_seqs={args.prompts * args.n}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.prompts * args.n}",
            "actor_rollout_ref.actor.policy_loss=vanilla", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
            f"trainer.total_training_steps={args.steps}", "trainer.save_freq=-1", "trainer.test_freq=-1",
            "trainer.val_before_train=false", f"trainer.device={args.device}", "trainer.seed=1",
            f"trainer.default_local_dir={run}"] + (["actor_rollout_ref.rollout.ignore_eos=true"] if args.ignore_eos else []) + extra
    run_checked(argv, env=child_env())
    return [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if "timing_s/step" in line]


def cpu_seconds_of(fn):
    """fn() runs child processes; returns (its value, their user+sys CPU seconds)."""
    before = os.times()
    value = fn()
    after = os.times()
    return value, (after.children_user - before.children_user) + (after.children_system - before.children_system)


with (tempfile.TemporaryDirectory() if not args.work else open(os.devnull)) as tmp:
    work = args.work or tmp
    os.makedirs(work, exist_ok=True)
    make_inputs(work)
    if args.only_inputs:
        sys.exit(0)
    bf16 = ["actor_rollout_ref.actor.compute_dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16"]
    variants = {"rpg": bf16 if args.bf16 else []}
    if args.packed:
        variants["rpg use_remove_padding"] = ["actor_rollout_ref.model.use_remove_padding=true"]
    if args.bf16_rollout:
        variants["rpg rollout bf16"] = ["actor_rollout_ref.rollout.dtype=bfloat16"]
    rpg_rows = {k: [] for k in variants}
    trl_steps, trl_cpu = [], []
    for r in range(args.rounds):
        for name, extra in variants.items():
            rpg_rows[name] += rpg_run(work, f"{name.replace(' ', '_')}_{r}", extra)[1:]
        out = os.path.join(work, f"trl_{r}.json")
        run_checked([sys.executable, __file__, "--threads", str(args.threads), "--steps", str(args.steps),
                     "--prompts", str(args.prompts), "--n", str(args.n), "--max-new-tokens", str(args.max_new_tokens),
                     "--device", args.device] + (["--ignore-eos"] if args.ignore_eos else []) +
                    (["--bf16"] if args.bf16 else []) +
                    ["--trl-worker", work, out], env=child_env())
        trl_run = json.load(open(out))
        trl_steps += trl_run["step_s"][1:]
        trl_cpu += trl_run["step_cpu_s"][1:]

med = statistics.median
print(f"{args.prompts} prompts x n={args.n}, {args.max_new_tokens} new tokens, {args.threads} threads, "
      f"OMP_WAIT_POLICY {args.omp_wait_policy}, {args.rounds} rounds x {args.steps - 1} timed steps; "
      f"median seconds per step, wall and CPU (user + sys of the process, every thread); load average "
      f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
trl, trl_c = med(trl_steps), med(trl_cpu)
print(f"TRL GRPOTrainer                wall {trl:7.2f} s  cpu {trl_c:7.2f} s")


def step_model_flops(rows):
    """Model FLOPs of one GRPO step from rpg's logged lengths: generation, the reference pass
    (2 per weight per token each) and the update (6) over each prompt once and every response
    (the least work a step needs: the n responses of a prompt share its keys and values; TRL
    recomputes the prompt for each of them, rpg does not)."""
    if not args.model:
        return None
    c = json.load(open(os.path.join(args.model, "config.json")))
    C, L, V, H = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["num_attention_heads"]
    Hkv, I = c.get("num_key_value_heads", H), c["intermediate_size"]
    D = c.get("head_dim") or C // H
    weights = L * (2 * C * H * D + 2 * C * Hkv * D + 3 * C * I) + C * V
    tokens = args.prompts * (med([x["prompt_length/mean"] for x in rows]) +
                             args.n * med([x["response_length/mean"] for x in rows]))
    return 10 * weights * tokens


def gemm_peak():
    import torch
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.bf16 else torch.float32  # the products' dtype on both sides
    a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
    a @ b
    t = time.perf_counter()
    for _ in range(5):
        a @ b
    return 2 * 2048 ** 3 * 5 / (time.perf_counter() - t) / 1e9
for name, rows in rpg_rows.items():
    step = med([x["timing_s/step"] for x in rows])
    cpu = {k: med([x.get(f"perf/cpu_s/{k}", 0.0) for x in rows]) for k in ("gen", "old_log_prob", "ref", "update_actor")}
    phases = " ".join(f"{k.split('/')[1]} {med([x.get(k, 0.0) for x in rows]):.2f}"
                      for k in ("timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor"))
    cpu_total = med([x["perf/cpu_s/step"] for x in rows])
    print(f"{name:30s} wall {step:7.2f} s ({phases})  ratio TRL/rpg {trl / step:.2f}x")
    flops = step_model_flops(rows)
    if flops:
        peak = gemm_peak()
        print(f"{'':30s} model {flops / 1e9:.0f} GFLOP per step: rpg {flops / step / 1e9:.1f} GFLOP/s "
              f"({100 * flops / step / 1e9 / peak:.1f}% of the {'bf16' if args.bf16 else 'fp32'} 2048^3 GEMM's {peak:.0f}), TRL {flops / trl / 1e9:.1f} "
              f"({100 * flops / trl / 1e9 / peak:.1f}%)")
    print(f"{'':30s} cpu  {cpu_total:7.2f} s (" + " ".join(f"{k} {v:.2f}" for k, v in cpu.items()) +
          f")  ratio TRL/rpg {trl_c / cpu_total:.2f}x")
    if args.json:
        import trl as trl_module
        print(json.dumps({"bench": "trl_step", "device": args.device, "variant": name, "prompts": args.prompts,
                          "n": args.n, "max_new_tokens": args.max_new_tokens, "trl_version": trl_module.__version__,
                          "trl_seconds_per_step": trl, "rpg_seconds_per_step": step, "ratio": trl / step,
                          "rpg_phases": {k.split('/')[1]: med([x.get(k, 0.0) for x in rows])
                                         for k in ("timing_s/gen", "timing_s/old_log_prob", "timing_s/ref",
                                                   "timing_s/update_actor")}}), flush=True)
