"""Oracle: verl's AdaptiveKLController over a sequence of (current_kl, n_steps) updates.
usage: train_kl_ctrl.py INIT TARGET HORIZON kl:n kl:n ...  -> the coefficient after each update"""
import sys

from verl.trainer.ppo.core_algos import AdaptiveKLController

ctrl = AdaptiveKLController(init_kl_coef=float(sys.argv[1]), target_kl=float(sys.argv[2]), horizon=int(sys.argv[3]))
for pair in sys.argv[4:]:
    kl, n = pair.split(":")
    ctrl.update(current_kl=float(kl), n_steps=int(n))
    print(repr(float(ctrl.value)))
