"""Independent transcription of the RPG paper's losses (ICLR 2026; read from the paper's
text, not from rpg's C++), evaluated with torch autograd on the inputs the C++ test wrote.

usage: paper_formulas.py IN OUT
IN: log_probs [1, N] (log pi_theta of N samples), old_log_probs [1, N] (log pi_old, possibly
  unnormalised: mass Z), advantages [1, N] (R - b), config [beta, Z, eps1, eps2, c].
OUT, for form in fkl rkl ufkl urkl:
  table/<form>/loss, table/<form>/grad    Table 1 (UFKL, URKL) and Table 4 (FKL, RKL): the mean
                                          of the per-sample surrogate over the N samples, and
                                          its gradient w.r.t. log_probs
  rf/<form>/loss, rf/<form>/grad          Table 2 (UFKL, URKL) and Appendix F Props. F.1, F.4
                                          (FKL, RKL): -SG(Weight) log pi_theta
  alg1/<form>/loss, alg1/<form>/grad      Algorithm 1 with Dual Clip (Section 3.3), Z = 1
  alg2/<form>/loss, alg2/<form>/grad      Algorithm 2 (REINFORCE-style dual clip), Z = 1
  alg2/regions                            per sample: 0 psi>=0 & w<w_high, 1 psi>=0 & w>=w_high,
                                          2 psi<0 & w<=w_low, 3 psi<0 & w_low<w<c, 4 psi<0 & w>=c
Z enters the table/rf forms of UFKL/URKL only (Table 1/2: pi_old an unnormalised measure);
FKL/RKL are normalised (Table 4) and take Z = 1.
"""
import sys

import torch

from algo_verl_parity import read, write

FORMS = ("fkl", "rkl", "ufkl", "urkl")


def sg(x):
    return x.detach()


# ---- Table 1 (unnormalised, main text) and Table 4 (normalised, Appendix E) -------------
# R is the (baseline-subtracted) reward, w = pi_theta / pi_old.
def table_loss(form, log_pi, log_old, R, beta, Z):
    w = torch.exp(log_pi - log_old)
    log_w = log_pi - log_old
    if form == "fkl":   # Table 4, Forward KL:  E[-w R - beta log pi_theta]
        return -w * R - beta * log_pi
    if form == "rkl":   # Table 4, Reverse KL:  E[w (-R + beta log w)]
        return w * (-R + beta * log_w)
    if form == "ufkl":  # Table 1, UFKL:  Z_old E[-w R + beta (w - log w - 1)]
        return Z * (-w * R + beta * (w - log_w - 1))
    if form == "urkl":  # Table 1, URKL:  Z_old E[-w R + beta (w log w - w)]
        return Z * (-w * R + beta * (w * log_w - w))
    raise ValueError(form)


# ---- Table 2 and Appendix F: the Weight inside SG of -E[SG(Weight) log pi_theta] -------------
def rf_weight(form, w, log_w, R, beta, Z):
    if form == "fkl":   # Prop. F.1:  w R + beta
        return w * R + beta
    if form == "rkl":   # Prop. F.4 (F.2):  w (R - beta log w - beta)
        return w * (R - beta * log_w - beta)
    if form == "ufkl":  # Table 2 / Prop. F.3:  Z_old (w R - beta (w - 1))
        return Z * (w * R - beta * (w - 1))
    if form == "urkl":  # Table 2 / Prop. F.5:  Z_old w (R - beta log w)
        return Z * w * (R - beta * log_w)
    raise ValueError(form)


def rf_loss(form, log_pi, log_old, R, beta, Z):
    log_w = sg(log_pi - log_old)
    return -sg(rf_weight(form, torch.exp(log_w), log_w, R, beta, Z)) * log_pi


# ---- Algorithm 1: RPG with Dual-Clip ----------------------------------------------------------
# Section 3.3 gives A-hat for URKL: (R - b) - beta log w and RKL: (R - b) - beta (log w + 1);
# for the forward forms it only says A-hat "matches the gradients in Section 3". We take the
# A-hat for which line 27 (no clip: L = -w A-hat) IS the Table 1/4 loss, A-hat = -L_table / w,
# so inside the clip band line 14 reproduces the Table's gradient exactly (documented in
# docs/algorithms.md: the weight/w alternative A + beta/w would lose the KL gradient there).
def alg1_advantage(form, log_pi, log_old, A, beta):
    w = torch.exp(log_pi - log_old)
    log_w = log_pi - log_old
    if form == "urkl":
        return A - beta * log_w
    if form == "rkl":
        return A - beta * (log_w + 1)
    if form == "fkl":   # -w A-hat = -w A - beta log w  (Table 4 with log pi_theta -> log w: + const)
        return A + beta * log_w / w
    if form == "ufkl":  # -w A-hat = -w A + beta (w - log w - 1)  (Table 1, Z = 1)
        return A - beta * (w - log_w - 1) / w
    raise ValueError(form)


def alg1_loss(form, log_pi, log_old, A, beta, eps1, eps2, c):
    w = torch.exp(log_pi - log_old)                          # line 10
    A_hat = alg1_advantage(form, log_pi, log_old, A, beta)   # line 11 (depends on theta via w)
    term1 = -w * A_hat                                       # line 14
    w_clipped = torch.clamp(w, 1 - eps1, 1 + eps2)           # line 15
    term2 = -w_clipped * A_hat                               # line 16
    L_clip = torch.maximum(term1, term2)                     # line 17
    lower = -c * A_hat                                       # line 21
    return torch.where(sg(A_hat) >= 0, L_clip, torch.minimum(L_clip, lower))  # lines 18-23


# ---- Algorithm 2: REINFORCE-style RPG with Dual-Clip -----------------------------------------
# Compute_KL_Component is left open by the paper; Weight = w A_R + C_KL with the Weights of
# Table 2 / Appendix F gives C_KL = Weight - w A_R, evaluated at the unclipped w (line 13 takes
# theta and pi_old; Remark F.2's w-bar variant is the fork's _clip_hard spelling).
def kl_component(form, w, log_w, beta):
    if form == "fkl":
        return torch.full_like(w, beta)
    if form == "rkl":
        return -beta * w * (log_w + 1)
    if form == "ufkl":
        return -beta * (w - 1)
    if form == "urkl":
        return -beta * w * log_w
    raise ValueError(form)


def alg2_loss(form, log_pi, log_old, A_R, beta, eps1, eps2, c):
    N = log_pi.numel()
    out, regions = [], []
    lp, lo, AR = log_pi.reshape(-1), log_old.reshape(-1), A_R.reshape(-1)
    for i in range(N):
        w = torch.exp(lp[i] - lo[i])                                   # line 10
        l = -lp[i]                                                     # line 11
        log_w = sg(lp[i] - lo[i])
        C = kl_component(form, sg(w), log_w, beta)                     # line 13
        A1 = AR[i] + sg(C) / sg(w)                                     # line 14
        psi = A1 * l                                                   # line 15
        if sg(psi) >= 0:                                               # line 16
            w_high = 1 + eps2
            if sg(w) < w_high:
                L = psi * sg(w); regions.append(0)                     # line 19
            else:
                A_high = AR[i] + sg(C) / w_high                        # line 21
                L = A_high * sg(l) * w_high; regions.append(1)         # lines 22-23
        else:
            w_low = 1 - eps1
            if sg(w) <= w_low:
                A_low = AR[i] + sg(C) / w_low                          # line 28
                L = A_low * sg(l) * w_low; regions.append(2)           # lines 29-30
            elif sg(w) < c:
                L = psi * sg(w); regions.append(3)                     # line 32
            else:
                L = AR[i] * sg(l) * c + sg(C) * sg(l); regions.append(4)  # line 34
        out.append(L)
    return torch.stack(out).reshape(log_pi.shape), torch.tensor(regions, dtype=torch.float64)


def main():
    t = read(sys.argv[1])
    beta, Z, eps1, eps2, c = t["config"].tolist()
    old, A = t["old_log_probs"], t["advantages"]
    out = {}
    for form in FORMS:
        z = Z if form in ("ufkl", "urkl") else 1.0
        for kind, fn in (("table", lambda lp: table_loss(form, lp, old, A, beta, z)),
                         ("rf", lambda lp: rf_loss(form, lp, old, A, beta, z)),
                         ("alg1", lambda lp: alg1_loss(form, lp, old, A, beta, eps1, eps2, c)),
                         ("alg2", lambda lp: alg2_loss(form, lp, old, A, beta, eps1, eps2, c)[0])):
            lp = t["log_probs"].clone().requires_grad_(True)
            loss = fn(lp).mean()  # L = (1/N) sum_i (Algorithms 1-2 line 31/39)
            loss.backward()
            out[f"{kind}/{form}/loss"] = loss.detach()
            out[f"{kind}/{form}/grad"] = lp.grad
        out[f"alg2/{form}/regions"] = alg2_loss(form, t["log_probs"], old, A, beta, eps1, eps2, c)[1]
    write(sys.argv[2], out)


if __name__ == "__main__":
    main()
