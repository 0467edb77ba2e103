"""C51: a categorical distribution of returns per action (Bellemare, Dabney & Munos 2017).

The return of each action is a distribution on a fixed support of ``n_atoms`` atoms
``z_i = v_min + i * dz`` (``dz = (v_max - v_min) / (n_atoms - 1)``). Default support: 51 atoms
on ``[-20, 20]`` reward units (ticks per contract, summed over the n-step horizon with
discount); the backtest scales rewards by ``1 / reward_scale`` into it.

* :func:`project` — the categorical projection of the Bellman target ``r + gamma^n z`` onto the
  support (Algorithm 1 of the paper), vectorised; an atom that lands exactly on a support point
  (``l == u``) keeps its whole mass there (the classic floor/ceil bug drops it);
  :func:`project_slow` is a per-sample, per-atom loop written from Algorithm 1, for tests.
* :class:`C51Net` — MLP -> (B, A, n_atoms) logits, plus a K = 3 auxiliary head (trade outcome),
  trained with :func:`aux_loss` (cross-entropy weighted by :func:`class_weights`, inverse class
  frequency) and scored by :func:`balanced_accuracy`.
* :func:`thompson` — one sample from each action's distribution, argmax over actions;
  :func:`greedy` — argmax of the means.
* :class:`Replay` — a uniform ring buffer of n-step transitions stored as tensors;
  :class:`NStep` — turns per-step rewards of N parallel environments into n-step transitions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["support", "project", "project_slow", "C51Net", "thompson", "greedy", "Replay", "NStep",
           "c51_loss", "class_weights", "aux_loss", "balanced_accuracy"]


def support(n_atoms: int, v_min: float, v_max: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """Atoms ``z`` (n_atoms,) float32, evenly spaced from ``v_min`` to ``v_max``."""
    return torch.linspace(v_min, v_max, n_atoms, device=device)


def project(p: torch.Tensor, r: torch.Tensor, disc: torch.Tensor, z: torch.Tensor,
            bounds: tuple[float, float] | None = None) -> torch.Tensor:
    """Project the target distribution onto the support ``z``.

    Parameters
    ----------
    p : (B, n) next-state probabilities of the chosen action (rows sum to 1).
    r : (B,) (n-step discounted) reward.
    disc : (B,) discount of the bootstrap, ``gamma^n * (1 - done)`` (0 at a terminal state).
    z : (n,) support.
    bounds : ``(float(z[0]), float(z[-1]))`` when the caller has them (no read of a GPU's ``z``,
        which would wait for the device).

    Returns
    -------
    m : (B, n) float32, rows sum to 1 (mass kept), ``sum m z = sum p clip(r + disc z)``.
    """
    n = z.numel()
    v_min, v_max = bounds if bounds is not None else (float(z[0]), float(z[-1]))
    dz = (v_max - v_min) / (n - 1)
    tz = (r[:, None] + disc[:, None] * z[None, :]).clamp(v_min, v_max)
    b = (tz - v_min) / dz
    lo = b.floor().clamp(0, n - 1)
    hi = b.ceil().clamp(0, n - 1)
    same = (lo == hi).to(p.dtype)
    m = torch.zeros_like(p)
    m.scatter_add_(1, lo.long(), p * (hi - b + same))
    m.scatter_add_(1, hi.long(), p * (b - lo))
    return m


def project_slow(p: list[list[float]], r: list[float], disc: list[float], z: list[float]) -> list[list[float]]:
    """Per-sample, per-atom reference of :func:`project` (Algorithm 1 of Bellemare et al. 2017)."""
    n = len(z)
    v_min, v_max = z[0], z[-1]
    dz = (v_max - v_min) / (n - 1)
    out = []
    for pi, ri, di in zip(p, r, disc):
        m = [0.0] * n
        for j in range(n):
            tz = min(max(ri + di * z[j], v_min), v_max)
            b = (tz - v_min) / dz
            lo, hi = int(b // 1), -int(-b // 1)
            if lo == hi:
                m[lo] += pi[j]
            else:
                m[lo] += pi[j] * (hi - b)
                m[hi] += pi[j] * (b - lo)
        out.append(m)
    return out


class C51Net(nn.Module):
    """``forward(obs (B, D)) -> (logits (B, A, n_atoms), aux logits (B, 3))``.

    Two hidden layers (LayerNorm + SiLU); the auxiliary K=3 head reads the same hidden state.
    """

    def __init__(self, obs_dim: int, n_actions: int = 3, n_atoms: int = 51, hidden: int = 128) -> None:
        super().__init__()
        self.n_actions, self.n_atoms = n_actions, n_atoms
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.LayerNorm(hidden), nn.SiLU(),
                                  nn.Linear(hidden, hidden), nn.SiLU())
        self.q = nn.Linear(hidden, n_actions * n_atoms)
        self.aux = nn.Linear(hidden, 3)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(obs)
        return self.q(h).view(-1, self.n_actions, self.n_atoms), self.aux(h)


def greedy(probs: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Action with the largest mean return: probs (B, A, n) -> (B,) int64."""
    return (probs * z).sum(-1).argmax(-1)


def thompson(probs: torch.Tensor, z: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Thompson-style exploration: draw one return from each action's distribution and take the
    action with the largest draw (first on ties). probs (B, A, n) -> (B,) int64."""
    B, A, n = probs.shape
    idx = torch.multinomial(probs.reshape(B * A, n), 1, generator=generator).view(B, A)
    return z[idx].argmax(-1)


def c51_loss(logits: torch.Tensor, action: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy between the projected target (B, n) and the chosen action's distribution."""
    logp = F.log_softmax(logits.float(), -1).gather(1, action.view(-1, 1, 1).expand(-1, 1, logits.shape[-1]))
    return -(target * logp.squeeze(1)).sum(-1).mean()


def class_weights(y: torch.Tensor, k: int = 3) -> torch.Tensor:
    """Inverse-frequency class weights ``w_c = n / (k n_c)`` of the labels ``y`` (int64, values
    in ``[0, k)``; negatives = undefined, ignored); a class absent from ``y`` gets weight 0.
    (The "balanced" weighting of King & Zeng 2001 / scikit-learn's ``class_weight``: each class
    then carries the same total weight ``n / k``.) Returns float32 (k,); all ones when ``y`` has
    no defined label."""
    y = y[y >= 0]
    if y.numel() == 0:
        return torch.ones(k, device=y.device)
    n_c = torch.bincount(y, minlength=k).float()
    return torch.where(n_c > 0, y.numel() / (k * n_c.clamp_min(1.0)), torch.zeros_like(n_c))


def aux_loss(logits: torch.Tensor, y: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Class-weighted cross-entropy of the K=3 head: logits (B, k), y (B,) int64 with negatives
    masked out, weights (k,) from :func:`class_weights` (None: unweighted). The weighted mean
    ``sum w_y l / sum w_y`` (``torch.nn.functional.cross_entropy``); 0 when no label is defined.
    Computed over all rows with the undefined ones weighted 0 (no boolean indexing: nothing waits
    for the device)."""
    ok = (y >= 0).float()
    yc = y.clamp_min(0)
    w = ok if weights is None else ok * weights[yc]
    nll = F.cross_entropy(logits.float(), yc, reduction="none")
    den = w.sum()
    return torch.where(den > 0, (w * nll).sum() / den.clamp_min(1e-30), (logits * 0.0).sum())


def balanced_accuracy(pred: torch.Tensor, y: torch.Tensor, k: int = 3) -> float:
    """Mean over the classes present in ``y`` of the recall ``P(pred = c | y = c)`` (Brodersen
    et al. 2010); a majority-class predictor scores ``1 / (classes present)``. NaN if ``y`` is
    empty."""
    rec = [float((pred[y == c] == c).float().mean()) for c in range(k) if bool((y == c).any())]
    return sum(rec) / len(rec) if rec else float("nan")


class Replay:
    """Uniform ring buffer of transitions; each field a tensor of shape (capacity, ...).

    ``add(**fields)`` with tensors of a common first dimension; ``sample(k, generator)`` returns
    a dict of (k, ...) tensors. Fields are fixed by the first ``add``.
    """

    def __init__(self, capacity: int, device: torch.device | str = "cpu") -> None:
        self.capacity, self.device = int(capacity), torch.device(device)
        self.data: dict[str, torch.Tensor] = {}
        self.size = 0
        self.pos = 0

    def add(self, **fields: torch.Tensor) -> None:
        k = next(iter(fields.values())).shape[0]
        if not self.data:
            self.data = {n: torch.empty((self.capacity,) + v.shape[1:], dtype=v.dtype, device=self.device)
                         for n, v in fields.items()}
        idx = (self.pos + torch.arange(k, device=self.device)) % self.capacity
        for n, v in fields.items():
            self.data[n][idx] = v.to(self.device)
        self.pos = (self.pos + k) % self.capacity
        self.size = min(self.capacity, self.size + k)

    def sample(self, k: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        i = torch.randint(0, self.size, (k,), device=self.device, generator=generator)
        return {n: v[i] for n, v in self.data.items()}


class NStep:
    """n-step returns for N parallel environments.

    ``push(state, action, reward, done, next_state)`` with per-env tensors (``state`` a dict of
    (N, ...) tensors). Once ``n`` steps are held it returns the transition that started ``n``
    steps ago: ``R = sum_k gamma^k r_k`` up to (and including) the first done, ``disc =
    gamma^n`` or 0 when a done came first, the state ``n`` steps later; else ``None``.
    """

    def __init__(self, n: int, gamma: float) -> None:
        self.n, self.gamma = int(n), float(gamma)
        self.hist: list[tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def push(self, state: dict[str, torch.Tensor], action: torch.Tensor, reward: torch.Tensor, done: torch.Tensor,
             next_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        self.hist.append((state, action, reward, done))
        if len(self.hist) < self.n:
            return None
        s0, a0, _, _ = self.hist[0]
        R = torch.zeros_like(reward)
        alive = torch.ones_like(reward)
        for k, (_, _, r, d) in enumerate(self.hist):
            R = R + alive * (self.gamma ** k) * r
            alive = alive * (1.0 - d.to(reward.dtype))
        self.hist.pop(0)
        out = {f"s_{k}": v for k, v in s0.items()}
        out.update({f"n_{k}": v for k, v in next_state.items()})
        out.update(action=a0, reward=R, disc=alive * self.gamma ** self.n)
        return out
