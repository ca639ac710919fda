"""Oracle: verl's own response mask and position ids for a batch written by the C++ test.
usage: rollout_verl_layout.py IN.safetensors EOS OUT.safetensors"""
import sys

from safetensors.torch import load_file, save_file
from verl.utils.model import compute_position_id_with_mask
from verl.utils.torch_functional import get_response_mask

t = load_file(sys.argv[1])
save_file({"response_mask": get_response_mask(t["responses"], eos_token=int(sys.argv[2])).contiguous(),
           "position_ids": compute_position_id_with_mask(t["attention_mask"]).contiguous()}, sys.argv[3])
