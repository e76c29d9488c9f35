"""FSDP: parameters, gradients and optimizer state all sharded (ZeRO stage 3), one layer at a time.

This is FSDP's algorithm (PyTorch's FullyShardedDataParallel with one unit per layer,
``reshard_after_forward=True``, backward prefetch before the current unit's gradients,
forward prefetch), written out by hand so every collective is recorded.  The simulator's
``fsdp`` models exactly this; its ``zero3`` is DeepSpeed's stage 3, whose prefetch and
parameter-fetch rules differ and which has no real counterpart here.

Each layer (embeddings, every block, the head) is one flat buffer padded to a multiple
of the world size N.  Between steps a rank holds only chunk r of each: the parameter
shard, its gradient shard and the Adam moments for it.  Full parameters exist only
while a layer is computing.

Communication phases of one step, in order:

1. **forward**, for each layer i: wait for ``all_gather L<i>`` (launched earlier as a
   prefetch), launch ``all_gather L<i+1>`` so the next layer's parameters travel while
   this one computes, run the layer, then free its full parameters.  The embeddings and
   the head stay gathered until their backward, as FSDP keeps its root unit: the head's
   backward starts at once, and re-gathering the embeddings would cost a collective
   that nothing else could overlap at the end of backward.
2. **backward**, for each layer i from last to first: when the gradient of the layer's
   output arrives, wait for its parameters (gathered again; prefetched), launch
   ``all_gather L<i-1>``, and give the layer a zeroed full-size gradient buffer.  When
   autograd has accumulated the last of the layer's gradients, launch
   ``reduce_scatter L<i>`` (average) into the gradient shard and free the full
   parameters.  The reduce-scatter of layer i overlaps the backward of layer i-1.
3. **optimizer**: per layer, from last to first (the order the reduce-scatters were
   launched), wait for the reduce-scatter, free the full-size gradient buffer and run
   AdamW on the shard.  No gather follows: the next forward gathers what it needs.

**Frozen weights** (LoRA, :mod:`real_runs.lora`), as FSDP2 shards per parameter: a layer's
trainable and frozen parameters lie in two flat buffers, each padded to a multiple of N, and
a rank's shard of the layer is its chunk of each, end to end, so one ``all_gather L<i>`` still
fetches the whole layer.  The gathered buffer then holds rank after rank's [trainable | frozen]
chunks, and ``copy_out L<i>`` copies them into the two flat buffers the parameters view (FSDP2's
copy-out).  Every weight is gathered, forward and backward; only the trainable ones get a
full-size gradient, a reduce-scatter, a gradient shard and Adam state.  A layer holding frozen
weights frees its gathered parameters when its backward is over (the layer below starts its
own, or backward ends), not at its last gradient: a frozen norm's backward may still read its
weight after the adapters' gradients are in.  A wholly frozen layer (the embeddings, the head)
reduces nothing.

Per-rank model states (fp32): (4 + 4 + 8)Ψ/N = 16Ψ/N; with LoRA (4Ψ + 4Ψ_t + 8Ψ_t)/N for Ψ_t
trainable adapter weights.  Gathered parameters, the all-gather's buffer where a copy-out
follows, and full-size gradient buffers are recorded as ``buffers``; with prefetch at most two
blocks' parameters, plus the embeddings and head, are live at once.  Communication is about
3Ψ per rank per step against DDP's 2Ψ: block parameters are gathered twice.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from zero_sim.vocabulary import ALL_GATHER, BUFFERS, REDUCE_SCATTER, copy_out, layer_collective, opt

from .base import AdamState, Flat, Strategy, free, gather_flat_chunks, model_state_bytes, realloc


class Unit:
    """One layer as FSDP holds it: its trainable parameters and its frozen ones, each kind in a
    :class:`Flat` padded to a multiple of N (a layer may have one kind only), and between steps
    this rank's chunk of each, end to end in ``shard``, trainable first."""

    def __init__(self, params: list[nn.Parameter], i: int, world: int, rank: int):
        trained = [p for p in params if p.requires_grad]
        frozen = [p for p in params if not p.requires_grad]
        self.index, self.world = i, world
        self.trained = Flat(trained, i, i, world, rank) if trained else None
        self.frozen = Flat(frozen, i, i, world, rank) if frozen else None
        self.flats = [f for f in (self.trained, self.frozen) if f is not None]
        self.n_trained = len(trained)
        self.shard = torch.cat([f.mine(f.data) for f in self.flats])
        # What Adam updates: a view of the shard, so the update lands in what the next gather sends.
        self.trained_shard = self.shard[:self.trained.chunk] if self.trained else None
        self.grad_shard = torch.zeros_like(self.trained_shard) if self.trained else None

    @property
    def nbytes(self) -> int:
        """Bytes of the whole layer, gathered."""
        return sum(f.nbytes for f in self.flats)

    def chunks(self) -> list[torch.Tensor]:
        """This rank's chunk of each flat buffer: views of ``shard``."""
        return list(self.shard.split([f.chunk for f in self.flats]))

    def place(self, gathered: torch.Tensor) -> None:
        """Copy rank after rank's [trainable | frozen] chunks out of ``gathered`` into the flats."""
        rows, start = gathered.view(self.world, -1), 0
        for f in self.flats:
            f.data.view(self.world, f.chunk).copy_(rows[:, start:start + f.chunk])
            start += f.chunk


class FSDP(Strategy):
    name = "fsdp"
    stage = 3

    def setup(self) -> None:
        self.units = [Unit(list(layer.parameters()), i, self.world, self.rank)
                      for i, layer in enumerate(self.layers)]
        trained = [u for u in self.units if u.trained]
        self.flats = [u.trained for u in trained]  # what Adam updates, for reading its state back
        self.adam = [AdamState(u.trained_shard, self.hp) for u in trained]
        self.adam_of = {u.index: a for u, a in zip(trained, self.adam, strict=True)}
        for u in self.units:
            for f in u.flats:
                f.bind()
                if f is u.trained:
                    f.bind_grads()
                free(f.data)
                free(f.grad)
        self.live = [False] * self.n_layers
        self.gathers: dict[int, tuple[object, torch.Tensor | None]] = {}
        self.reductions: dict[int, object] = {}
        self.missing = [0] * self.n_layers

    # --- parameters in and out ---------------------------------------------------

    def outgoing(self, u: Unit) -> torch.Tensor:
        """What this rank sends of layer ``u`` in its all-gather: its shard."""
        return u.shard

    def gathers_in_place(self, u: Unit) -> bool:
        """A layer of one kind of parameter is gathered straight into its flat buffer."""
        return len(u.flats) == 1

    def unpack(self, u: Unit, gathered: torch.Tensor) -> None:
        """The gathered chunks into the parameters (``copy_out``)."""
        u.place(gathered)

    def gather(self, i: int) -> None:
        if not 0 <= i < self.n_layers or self.live[i]:
            return
        u = self.units[i]
        for f in u.flats:
            realloc(f.data)
        self.rec.add_memory(BUFFERS, u.nbytes)
        self.live[i] = True
        send = self.outgoing(u)
        staging = None
        if not self.gathers_in_place(u):
            staging = torch.empty(self.world * send.numel(), dtype=send.dtype, device=send.device)
            self.rec.add_memory(BUFFERS, staging.nbytes)
        into = u.flats[0].data if staging is None else staging
        self.gathers[i] = (self.all_gather(into, send, layer_collective(ALL_GATHER, i), i), staging)

    def ensure_gathered(self, i: int) -> None:
        self.gather(i)
        pending = self.gathers.pop(i, None)
        if pending is None:
            return
        work, staging = pending
        work.wait()
        if staging is not None:
            with self.rec.span(copy_out(i), i, staging.nbytes):
                self.unpack(self.units[i], staging)
            self.rec.add_memory(BUFFERS, -staging.nbytes)

    def release(self, i: int) -> None:
        for f in self.units[i].flats:
            free(f.data)
        self.rec.add_memory(BUFFERS, -self.units[i].nbytes)
        self.live[i] = False

    # --- hooks ---------------------------------------------------------------------

    def zero_grad(self) -> None:
        self.missing = [u.n_trained for u in self.units]
        self.gather(0)  # the first forward's parameters start travelling at once

    def before_forward(self, i: int) -> None:
        self.ensure_gathered(i)
        self.gather(i + 1)

    def after_forward(self, i: int) -> None:
        if 0 < i < self.n_layers - 1:
            self.release(i)

    def before_backward(self, i: int) -> None:
        # Layer i+1's backward is over: if it holds frozen weights, its gathered copy goes now.
        if i + 1 < self.n_layers and self.live[i + 1] and self.units[i + 1].frozen:
            self.release(i + 1)
        self.ensure_gathered(i)
        self.gather(i - 1)
        f = self.units[i].trained
        if f is not None:
            realloc(f.grad)
            f.grad.zero_()
            self.rec.add_memory(BUFFERS, f.nbytes)

    def grad_ready(self, p) -> None:
        i = self.layer_of[p]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            u = self.units[i]
            name = layer_collective(REDUCE_SCATTER, i)
            self.reductions[i] = self.reduce_scatter(u.grad_shard, u.trained.grad, name, i)
            if not u.frozen:  # its last gradient is the last thing its backward computes
                self.release(i)

    def backward_done(self) -> None:
        for i in range(self.n_layers):  # layers holding frozen weights whose backward ended last
            if self.live[i]:
                self.release(i)

    def step(self) -> None:
        for i in reversed(range(self.n_layers)):
            u = self.units[i]
            if u.trained is None:  # a wholly frozen layer has nothing to update
                continue
            self.reductions.pop(i).wait()
            free(u.trained.grad)
            self.rec.add_memory(BUFFERS, -u.trained.nbytes)
            with self.rec.span(opt(i), i, u.trained_shard.nbytes):
                self.adam_of[i].update(u.trained_shard, u.grad_shard)

    # --- reading state back ------------------------------------------------------------

    def full_params(self) -> dict[str, torch.Tensor]:
        out = {}
        for u in self.units:
            for f, whole in zip(u.flats, gather_flat_chunks(u.flats, u.chunks()), strict=True):
                out.update({self.names[p]: t for p, t in f.read(whole).items()})
        return out

    def full_optimizer_state(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return self.gathered_moments()

    def model_state_bytes(self) -> dict[str, int]:
        return model_state_bytes(
            params=sum(u.shard.nbytes for u in self.units),
            grads=sum(u.grad_shard.nbytes for u in self.units if u.trained),
            optimizer=sum(a.nbytes for a in self.adam),
        )
