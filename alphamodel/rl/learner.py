"""The C51 agent's learning loop over a vectorised environment: its policy inputs
(:class:`Obs` from frozen embeddings, :class:`EncoderObs` through a trainable encoder), the
:class:`Learner` (one C51 step with the K = 3 trade-outcome head, :mod:`alphamodel.rl.c51`) and
:func:`train_policy` (Thompson exploration, n-step returns, a replay buffer)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from alphamodel.data.cache import CacheData, Window
from alphamodel.rl.c51 import C51Net, NStep, Replay, aux_loss, c51_loss, greedy, project, thompson
from alphamodel.rl.config import C51Config

__all__ = ["EncoderObs", "Learner", "Obs", "train_policy"]


@dataclass
class Obs:
    """Builds policy inputs ``[z-scored embedding, position, fee / fee_max]`` from rows."""

    emb: torch.Tensor  # (T, D) z-scored, rows outside the fold's segments are zeros
    fee_max: float

    def __call__(self, rows: torch.Tensor, pos: torch.Tensor, fee: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.emb[rows], torch.sign(pos)[:, None], (fee / max(self.fee_max, 1e-9))[:, None]], 1)


class EncoderObs(torch.nn.Module):
    """Policy inputs through the encoder (fine-tune path): the embedding of row t is computed
    from the window of the model's length ending at t (left-padded at a segment start)."""

    def __init__(self, model: torch.nn.Module, norm, data: CacheData, window: int, mean: torch.Tensor,
                 std: torch.Tensor, fee_max: float) -> None:
        super().__init__()
        self.model, self.norm, self.data, self.window = model, norm, data, window
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.fee_max = fee_max

    def forward(self, rows: torch.Tensor, pos: torch.Tensor, fee: torch.Tensor) -> torch.Tensor:
        r = rows.cpu().numpy()
        seg = self.data.segment_of(r)
        local = r - self.data.offsets[seg]
        wins = [Window(int(s), int(max(0, i - self.window + 1)), int(i) + 1) for s, i in zip(seg, local)]
        b = self.data.batch(wins, self.window, self.norm)
        dev = self.mean.device
        x, dt = torch.from_numpy(b.x).to(dev), torch.from_numpy(b.dt).to(dev)
        real = torch.from_numpy(b.rows >= 0).to(dev)  # left padding, masked: neutral for the real rows
        e = self.model.embedding(x, dt, real)[0][:, -1].float()
        e = (e - self.mean) / self.std
        return torch.cat([e, torch.sign(pos)[:, None], (fee / max(self.fee_max, 1e-9))[:, None]], 1)


@dataclass
class Learner:
    """A C51 learner: the online and target networks, the policy inputs (``obs``; ``target_obs``
    the target's, when the inputs learn too), the support ``z``, the optimiser, and the
    trade-outcome class of each row (``tb_class`` (T,) int64, -1 where undefined) with the
    auxiliary head's class weights ``aux_w`` (3,). :meth:`learn` takes one step on a batch of
    n-step transitions; the target is synced every ``c51.target_every`` steps."""

    net: C51Net
    target: C51Net
    obs: object
    z: torch.Tensor
    opt: torch.optim.Optimizer
    tb_class: torch.Tensor  # (T,) int64, -1 where undefined
    c51: C51Config
    aux_w: torch.Tensor | None = None  # (3,) inverse class frequency on the fold's training rows
    target_obs: object = None
    steps: int = 0
    losses: list = field(default_factory=list)  # per step, 0-d tensors (see loss_values)
    bounds: tuple[float, float] | None = None  # (z[0], z[-1]) as floats, once read

    def loss_values(self, last: int | None = None) -> list[float]:
        """The losses of the steps taken (the ``last`` ones), as floats."""
        xs = self.losses[-last:] if last else self.losses
        return torch.stack(xs).float().cpu().tolist() if xs else []

    def learn(self, batch: dict[str, torch.Tensor], gen: torch.Generator) -> None:
        c = self.c51
        logits, aux = self.net(self.obs(batch["s_row"], batch["s_pos"], batch["s_fee"]))
        with torch.no_grad():
            tobs = (self.target_obs or self.obs)(batch["n_row"], batch["n_pos"], batch["n_fee"])
            p_next = torch.softmax(self.target(tobs)[0].float(), -1)
            a_star = greedy(p_next, self.z)
            p_star = p_next[torch.arange(len(a_star), device=a_star.device), a_star]
            if self.bounds is None:  # read once: a read of a GPU tensor waits for the device
                self.bounds = (float(self.z[0]), float(self.z[-1]))
            m = project(p_star, batch["reward"], batch["disc"], self.z, self.bounds)
        loss = c51_loss(logits, batch["action"], m)
        if c.aux_weight > 0:
            loss = loss + c.aux_weight * aux_loss(aux, self.tb_class[batch["s_row"]], self.aux_w)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for g in self.opt.param_groups for p in g["params"]]
        torch.nn.utils.clip_grad_norm_(params, 10.0)
        self.opt.step()
        self.steps += 1
        self.losses.append(loss.detach())  # 0-d tensors: float() each step would wait for the device
        if self.steps % c.target_every == 0:
            self.sync()

    def sync(self) -> None:
        """Copy the online network (and inputs) into the target."""
        self.target.load_state_dict(self.net.state_dict())
        if self.target_obs is not None:
            self.target_obs.load_state_dict(self.obs.state_dict())


def train_policy(learner: Learner, env, pool: torch.Tensor, steps: int, gen: torch.Generator, *, fee_max: float,
                 reward_scale: float, bar=None, task=None) -> None:
    """Roll the ``env.n`` environments of ``env`` (a :class:`alphamodel.backtest.env.VecEnv`,
    freshly built) from random rows of ``pool`` with Thompson actions and learn after every
    step, ``steps`` steps (unit size, fees drawn from [0, fee_max] per episode, rewards divided
    by ``reward_scale``); ``bar``/``task``: a rich progress bar advanced per step."""
    c = learner.c51
    dev = env.m.device
    n_envs = env.n

    def draw(k: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = pool[torch.randint(0, pool.numel(), (k,), device=dev, generator=gen)]
        return rows, torch.rand(k, device=dev, generator=gen) * fee_max

    everyone = torch.ones(n_envs, dtype=torch.bool, device=dev)
    env.reset(everyone, *draw(n_envs))
    nstep = NStep(c.n_step, c.gamma)
    replay = Replay(min(c.replay, max(steps * n_envs, 1)), dev)
    for _ in range(steps):
        state = {"row": env.t, "pos": env.pos, "fee": env.fee}
        with torch.no_grad():
            probs = torch.softmax(learner.net(learner.obs(env.t, env.pos, env.fee))[0].float(), -1)
        a = thompson(probs, learner.z, gen)
        reward, done = env.step((a - 1).float())
        tr = nstep.push(state, a, reward / reward_scale, done.float(),
                        {"row": env.t, "pos": env.pos, "fee": env.fee})
        if tr is not None:
            replay.add(**tr)
        if done.any():
            rows, fee = draw(n_envs)
            env.reset(done, rows, fee)
        if replay.size >= min(c.batch_size, replay.capacity):
            learner.learn(replay.sample(c.batch_size, gen), gen)
        if bar is not None:
            bar.update(task, advance=1)
