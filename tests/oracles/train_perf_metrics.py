"""Oracle: verl's perf metrics of one training step, from verl's own functions
(verl.trainer.ppo.metric_utils.compute_timing_metrics / compute_throughout_metrics,
verl.utils.seqlen_balancing.log_seqlen_unbalance, verl.utils.flops_counter.FlopsCounter).
usage: train_perf_metrics.py STEP.json -> a JSON object of the metrics on stdout
STEP.json: {"model_dir", "attention_mask": [[0/1...]...], "response_width", "timing_s": {name: s},
            "n_gpus", "partitions": [[row...]...], "ppo_epochs"}"""
import json
import sys

import torch
from transformers import AutoConfig

from verl import DataProto
from verl.trainer.ppo.metric_utils import compute_throughout_metrics, compute_timing_metrics
import verl.utils.flops_counter as flops_counter
from verl.utils.flops_counter import FlopsCounter
from verl.utils.seqlen_balancing import log_seqlen_unbalance

step = json.load(open(sys.argv[1]))
attention_mask = torch.tensor(step["attention_mask"], dtype=torch.long)
rows, width = attention_mask.shape
responses = torch.zeros(rows, step["response_width"], dtype=torch.long)
batch = DataProto.from_dict(tensors={"attention_mask": attention_mask, "responses": responses})
seqlens = attention_mask.sum(-1).tolist()
batch.meta_info["global_token_num"] = seqlens
timing = step["timing_s"]
out = {}
out.update(compute_timing_metrics(batch, timing))
out.update(compute_throughout_metrics(batch, timing, n_gpus=step["n_gpus"]))
out.update(log_seqlen_unbalance(seqlen_list=seqlens, partitions=step["partitions"], prefix="global_seqlen"))
# verl's fsdp worker (update_actor): estimated * ppo_epochs / promised / world_size; the
# old-log-prob pass (compute_log_prob, forward only): a third of the training FLOPs.
# verl names a CPU device "CPU" when its torch device module is torch.cpu; on a machine
# without a GPU driver its platform probe still picks torch.cuda, so the name is passed.
device_flops = flops_counter.get_device_flops
flops_counter.get_device_flops = lambda unit="T", device_name=None: device_flops(unit, device_name or "CPU")
counter = FlopsCounter(AutoConfig.from_pretrained(step["model_dir"]))
achieved, promised = counter.estimate_flops(seqlens, timing["update_actor"])
out["perf/mfu/actor"] = achieved * step["ppo_epochs"] / promised / step["n_gpus"]
if "old_log_prob" in timing:
    achieved, promised = counter.estimate_flops(seqlens, timing["old_log_prob"])
    out["perf/mfu/actor_infer"] = achieved / 3 / promised / step["n_gpus"]
out["promised_tflops"] = promised
print(json.dumps({k: float(v) for k, v in out.items()}))
