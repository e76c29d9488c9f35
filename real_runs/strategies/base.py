"""What every strategy shares: the step skeleton, per-layer hooks, flat padded buffers,
the AdamW update, and the collectives.

A strategy sees the model as the list ``model.layers`` (0 = embeddings, last = head) and
may act at four moments per layer, all called from hooks installed here:
``before_forward(i)``, ``after_forward(i)``, ``before_backward(i)`` (not for a layer whose
output needs no gradient, such as frozen embeddings) and ``grad_ready(param)`` (after
autograd has accumulated a parameter's gradient, for trainable parameters only), and once a
step at ``backward_done()`` (autograd has run its last node).  The hooks also time
``fwd L<i>`` / ``bwd L<i>``; the strategy's own work at those moments (waiting for a gather,
launching a reduce-scatter) is deliberately left outside the compute spans, so a stall shows
up as a gap rather than as slow compute.

Sharded strategies keep tensors in :class:`Flat` buffers: a group of parameters laid
end to end and padded to a multiple of the world size, so that ``reduce_scatter`` and
``all_gather`` get equal chunks on every rank whatever the model's sizes.  Rank ``r``
owns chunk ``r``.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.autograd import Variable

from zero_sim.vocabulary import (
    ACTIVATIONS,
    BACKWARD,
    FORWARD,
    GRADS,
    OPTIMIZER,
    OPTIMIZER_STATE,
    PARAMS,
    bwd,
    fwd,
)
from zero_sim.vocabulary.buckets import bucket_caps, fill_buckets

from ..precision import PRECISIONS
from ..record import Pending, Recorder

# torch 2.13 renamed the flat collectives; older versions only have the old names.
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class AdamW:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.01

    def torch_optimizer(self, params) -> torch.optim.AdamW:
        return torch.optim.AdamW(params, lr=self.lr, betas=self.betas, eps=self.eps,
                                 weight_decay=self.weight_decay, foreach=False)


class AdamState:
    """Adam moments for one flat tensor (a whole bucket, or this rank's shard of one).

    The arithmetic is torch's single-tensor AdamW, op for op, so a sharded update lands
    on the same numbers as ``torch.optim.AdamW`` on the whole parameter.  For bf16
    weights it also keeps their fp32 master copy: the update runs on the master with the
    gradient read in fp32, and the weights get the master rounded to bf16."""

    def __init__(self, like: torch.Tensor, hp: AdamW):
        self.hp = hp
        self.master = like.detach().float().clone() if like.dtype != torch.float32 else None
        self.m = torch.zeros_like(like, dtype=torch.float32)
        self.v = torch.zeros_like(like, dtype=torch.float32)
        self.t = 0

    @property
    def nbytes(self) -> int:
        return self.m.nbytes + self.v.nbytes + (self.master.nbytes if self.master is not None else 0)

    # Elements per slice of the update: 1 MiB of fp32.  The update reads and writes each
    # tensor several times; on a whole bucket every pass would go to main memory, while a
    # slice stays in cache between passes, and slicing does not change the numbers.
    SLICE = 1 << 18

    @torch.no_grad()
    def update(self, p: torch.Tensor, g: torch.Tensor) -> None:
        hp, (b1, b2) = self.hp, self.hp.betas
        self.t += 1
        step_size = hp.lr / (1 - b1 ** self.t)
        bias2_sqrt = math.sqrt(1 - b2 ** self.t)
        for s in range(0, p.numel(), self.SLICE):
            pp, gg = p[s:s + self.SLICE], g[s:s + self.SLICE].float()
            if self.master is not None:
                weights, pp = pp, self.master[s:s + self.SLICE]
            m, v = self.m[s:s + self.SLICE], self.v[s:s + self.SLICE]
            pp.mul_(1 - hp.lr * hp.weight_decay)
            m.lerp_(gg, 1 - b1)
            v.mul_(b2).addcmul_(gg, gg, value=1 - b2)
            pp.addcdiv_(m, (v.sqrt() / bias2_sqrt).add_(hp.eps), value=-step_size)
            if self.master is not None:
                weights.copy_(pp)


def free(t: torch.Tensor) -> None:
    """Drop a buffer's memory but keep the tensor (and every view of it) usable later."""
    t.untyped_storage().resize_(0)


def realloc(t: torch.Tensor) -> None:
    t.untyped_storage().resize_(t.numel() * t.element_size())


class Flat:
    """Parameters laid end to end in one buffer padded to a multiple of ``world``.

    After ``bind()`` each parameter's data (and, with ``bind_grads``, its ``.grad``) is a
    view into the flat buffer, so a collective on the buffer *is* a collective on the
    parameters, and autograd accumulates gradients straight into it."""

    def __init__(self, params: list[nn.Parameter], index: int, layer: int | None, world: int = 1,
                 rank: int = 0):
        self.params = params
        self.index, self.layer = index, layer
        self.numel = sum(p.numel() for p in params)
        self.padded = math.ceil(self.numel / world) * world
        self.chunk = self.padded // world
        self.rank = rank
        p0 = params[0]
        self.data = torch.zeros(self.padded, dtype=p0.dtype, device=p0.device)
        self.grad = torch.zeros_like(self.data)
        with torch.no_grad():
            torch.cat([p.detach().flatten() for p in params], out=self.data[:self.numel])

    @property
    def nbytes(self) -> int:
        return self.padded * self.data.element_size()

    @property
    def chunk_bytes(self) -> int:
        return self.chunk * self.data.element_size()

    def mine(self, buf: torch.Tensor) -> torch.Tensor:
        return buf[self.rank * self.chunk:(self.rank + 1) * self.chunk]

    def _views(self, buf: torch.Tensor):
        off = 0
        for p in self.params:
            yield p, buf[off:off + p.numel()].view_as(p)
            off += p.numel()

    def bind(self) -> None:
        # Assigning .data keeps each parameter's own autograd version counter, so
        # collectives writing into the buffer never trip autograd's in-place checks.
        for p, view in self._views(self.data):
            p.data = view

    def bind_grads(self) -> None:
        for p, view in self._views(self.grad):
            p.grad = view

    def read(self, buf: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
        return {p: view.detach().clone() for p, view in self._views(buf)}


def bucketize(params: list[nn.Parameter], cap_bytes: float, first_cap_bytes: float | None = None
              ) -> list[list[nn.Parameter]]:
    """Group parameters into gradient buckets by the shared rule (:mod:`zero_sim.vocabulary.buckets`):
    reverse order, at most ``cap_bytes`` each, ``first_cap_bytes`` for the first alone."""
    order = list(reversed(params))
    plan = fill_buckets([p.numel() * p.element_size() for p in order], cap_bytes, first_cap_bytes)
    return [[order[i] for i in bucket] for bucket in plan]


class InOrder:
    """Launch a bucket's collective once all its gradients are in, but never before the
    buckets ahead of it: every rank must issue the same collectives in the same order."""

    def __init__(self, flats: list[Flat], launch):
        self.flats, self.launch = flats, launch
        self.bucket_of = {p: f for f in flats for p in f.params}
        self.reset()

    def reset(self) -> None:
        self.missing = [len(f.params) for f in self.flats]
        self.next = 0

    def ready(self, p: nn.Parameter) -> None:
        self.missing[self.bucket_of[p].index] -= 1
        while self.next < len(self.flats) and self.missing[self.next] == 0:
            self.launch(self.flats[self.next])
            self.next += 1

    def flush(self) -> None:
        """Launch whatever is left (parameters that got no gradient this step)."""
        while self.next < len(self.flats):
            self.launch(self.flats[self.next])
            self.next += 1


class Strategy:
    """The step skeleton.  Subclasses fill in the hooks and ``step``."""

    name = ""
    stage = 0  # the ZeRO stage its model states follow (zero_sim.vocabulary.model_states)

    # bf16 runs: the strategy is handed an fp32 model and casts it to bf16 before ``setup``,
    # unless it applies the precision itself (torch's FSDP2 keeps fp32 shards as the master).
    casts_model = True

    def __init__(self, model: nn.Module, rec: Recorder, hp: AdamW, bucket_mb: float,
                 precision: str = "fp32"):
        self.model, self.rec, self.hp, self.precision = model, rec, hp, precision
        if precision == "bf16" and self.casts_model:
            model.to(torch.bfloat16)
        self.bucket_bytes, self.first_bucket_bytes = bucket_caps(bucket_mb)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.layers = list(model.layers)
        self.n_layers = len(self.layers)
        self.names = {p: n for n, p in model.named_parameters()}
        self.layer_of = {p: i for i, layer in enumerate(self.layers) for p in layer.parameters()}
        # Fine-tuning freezes weights (real_runs.lora): a frozen weight has no gradient, so it is in
        # no bucket and no reduction, and has no optimizer state; it is still held (and gathered).
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.frozen_bytes = sum(p.nbytes for p in model.parameters() if not p.requires_grad)
        self.setup()
        self._install_hooks()

    # --- to override ------------------------------------------------------------

    def setup(self) -> None: ...
    def before_forward(self, i: int) -> None: ...
    def after_forward(self, i: int) -> None: ...
    def before_backward(self, i: int) -> None: ...
    def grad_ready(self, p: nn.Parameter) -> None: ...
    def backward_done(self) -> None: ...
    def zero_grad(self) -> None: ...

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.model(x, y)

    def step(self) -> None:
        raise NotImplementedError

    def full_params(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole, on every rank (collective).  Here: replicated params."""
        return {self.names[p]: p.detach().clone() for p in self.model.parameters()}

    def full_optimizer_state(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Adam's (m, v) for every parameter, whole, on every rank (collective)."""
        raise NotImplementedError

    def model_state_bytes(self) -> dict[str, int]:
        """Exact bytes of params, grads and optimizer state this rank holds between steps."""
        raise NotImplementedError

    def moments_by_name(self, flats: list[Flat], ms: list[torch.Tensor], vs: list[torch.Tensor]):
        """Whole flat Adam moments, cut back into one (m, v) per parameter name."""
        out = {}
        for f, m, v in zip(flats, ms, vs, strict=True):
            mm, vv = f.read(m), f.read(v)
            out.update({self.names[p]: (mm[p], vv[p]) for p in f.params})
        return out

    def gathered_moments(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Sharded flat Adam moments (``self.flats``, ``self.adam``) gathered whole, per name (collective)."""
        ms = gather_flat_chunks(self.flats, [a.m for a in self.adam])
        vs = gather_flat_chunks(self.flats, [a.v for a in self.adam])
        return self.moments_by_name(self.flats, ms, vs)

    # --- the step -----------------------------------------------------------------

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        rec = self.rec
        self.zero_grad()
        rec.phase = FORWARD
        with rec.saved_activations(), self.autocast(x):
            loss = self.forward(x, y)
        rec.phase = BACKWARD
        loss.backward()  # layer 0's backward is closed inside it (see _loss_hook)
        rec.set_memory(ACTIVATIONS, 0)
        rec.phase = OPTIMIZER
        self.step()
        self.record_model_states()
        return loss.detach()

    def autocast(self, x: torch.Tensor):
        """The forward's precision context: ``torch.autocast`` in the precision's dtype under ``amp``
        (the weights stay fp32; each op on autocast's list casts them as it runs), else none.  The
        backward runs outside it, as torch.amp's recipe has it."""
        dtype = PRECISIONS[self.precision].autocast
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=x.device.type, dtype=getattr(torch, dtype))

    def record_model_states(self) -> None:
        for cat, nbytes in self.model_state_bytes().items():
            self.rec.set_memory(cat, nbytes)

    # --- hooks ------------------------------------------------------------------------

    def _install_hooks(self) -> None:
        rec, last = self.rec, self.n_layers - 1

        def on_output_grad(i):
            # The gradient of layer i's output is complete: layer i+1's backward is over
            # and layer i's is about to start.
            def hook(grad):
                rec.close(bwd(i + 1))
                self.before_backward(i)
                rec.open(bwd(i), i)
            return hook

        for i, layer in enumerate(self.layers):
            def pre(_m, _args, i=i):
                self.before_forward(i)
                rec.open(fwd(i), i)

            def post(_m, _args, out, i=i):
                rec.close(fwd(i))
                self.after_forward(i)
                if torch.is_grad_enabled() and out.requires_grad:
                    out.register_hook(on_output_grad(i) if i < last else self._loss_hook)

            layer.register_forward_pre_hook(pre)
            layer.register_forward_hook(post)
        for p in self.trainable:  # a frozen weight never gets a gradient, so never this hook
            p.register_post_accumulate_grad_hook(self.grad_ready)

    def _loss_hook(self, grad):
        last = self.n_layers - 1
        self.before_backward(last)
        self.rec.open(bwd(last), last)
        # The backward's compute ends when autograd has run its last node.  Queued now, this
        # callback runs before those queued later in the pass, such as torch DDP's wait for its
        # all-reduces, so that wait is recorded as communication, not as layer 0's backward.
        Variable._execution_engine.queue_callback(self._backward_over)

    def _backward_over(self) -> None:
        # Layer 0's backward ends here; with frozen embeddings (LoRA) it never ran, and the
        # lowest block's backward, which no output hook below it closes, ends here instead.
        for i in range(self.n_layers):
            self.rec.close(bwd(i))
        self.backward_done()

    # --- collectives, recorded (and labelled by name in a profiler trace) ---------

    def all_reduce(self, buf: torch.Tensor, name: str, layer: int | None = None) -> Pending:
        with self.rec.label(name):
            work = dist.all_reduce(buf, op=dist.ReduceOp.AVG, async_op=True)
        return self.rec.comm(work, name, buf.nbytes, layer)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, name: str,
                       layer: int | None = None) -> Pending:
        with self.rec.label(name):
            work = reduce_scatter_flat(out, inp, op=dist.ReduceOp.AVG, async_op=True)
        return self.rec.comm(work, name, inp.nbytes, layer)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, name: str,
                   layer: int | None = None) -> Pending:
        with self.rec.label(name):
            work = all_gather_flat(out, inp, async_op=True)
        return self.rec.comm(work, name, out.nbytes, layer)


def gather_flat_chunks(flats: list[Flat], bufs: list[torch.Tensor]) -> list[torch.Tensor]:
    """All-gather each rank's chunk of several flat buffers (used to read sharded state back)."""
    whole = []
    for f, chunk in zip(flats, bufs, strict=True):
        out = torch.empty(f.padded, dtype=chunk.dtype, device=chunk.device)
        all_gather_flat(out, chunk.contiguous())
        whole.append(out)
    return whole


def model_state_bytes(params: int, grads: int, optimizer: int) -> dict[str, int]:
    return {PARAMS: params, GRADS: grads, OPTIMIZER_STATE: optimizer}


def optimizer_moment_bytes(opt: torch.optim.Optimizer) -> int:
    """Adam's m and v as torch holds them (the scalar step counters are left out)."""
    total = 0
    for state in opt.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            t = state[key]
            total += (t.to_local() if hasattr(t, "to_local") else t).nbytes
    return total
