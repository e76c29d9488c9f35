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

Per-rank model states (fp32): (4 + 4 + 8)Ψ/N = 16Ψ/N.  Gathered parameters and
full-size gradient buffers are recorded as ``buffers``; with prefetch at most two
blocks' parameters, plus the embeddings and head, are live at once.  Communication
is about 3Ψ per rank per step against DDP's 2Ψ: block parameters are gathered twice.
"""

from __future__ import annotations

import torch

from zero_sim.vocabulary import ALL_GATHER, BUFFERS, REDUCE_SCATTER, layer_collective, opt

from .base import AdamState, Flat, Strategy, free, gather_flat_chunks, model_state_bytes, realloc


class FSDP(Strategy):
    name = "fsdp"
    stage = 3

    def setup(self) -> None:
        self.flats = [Flat(list(layer.parameters()), i, i, self.world, self.rank)
                      for i, layer in enumerate(self.layers)]
        self.shards = [f.mine(f.data).clone() for f in self.flats]
        self.grad_shards = [torch.zeros_like(s) for s in self.shards]
        self.adam = [AdamState(s, self.hp) for s in self.shards]
        for f in self.flats:
            f.bind()
            f.bind_grads()
            free(f.data)
            free(f.grad)
        self.live = [False] * self.n_layers
        self.gathers: dict[int, object] = {}
        self.reductions: dict[int, object] = {}
        self.missing = [0] * self.n_layers

    # --- parameters in and out ---------------------------------------------------

    def gather(self, i: int) -> None:
        if not 0 <= i < self.n_layers or self.live[i]:
            return
        f = self.flats[i]
        realloc(f.data)
        self.rec.add_memory(BUFFERS, f.nbytes)
        self.live[i] = True
        self.gathers[i] = self.all_gather(f.data, self.shards[i], layer_collective(ALL_GATHER, i), i)

    def ensure_gathered(self, i: int) -> None:
        self.gather(i)
        pending = self.gathers.pop(i, None)
        if pending is not None:
            pending.wait()

    def release(self, i: int) -> None:
        free(self.flats[i].data)
        self.rec.add_memory(BUFFERS, -self.flats[i].nbytes)
        self.live[i] = False

    # --- hooks ---------------------------------------------------------------------

    def zero_grad(self) -> None:
        self.missing = [len(f.params) for f in self.flats]
        self.gather(0)  # the first forward's parameters start travelling at once

    def before_forward(self, i: int) -> None:
        self.ensure_gathered(i)
        self.gather(i + 1)

    def after_forward(self, i: int) -> None:
        if 0 < i < self.n_layers - 1:
            self.release(i)

    def before_backward(self, i: int) -> None:
        self.ensure_gathered(i)
        self.gather(i - 1)
        f = self.flats[i]
        realloc(f.grad)
        f.grad.zero_()
        self.rec.add_memory(BUFFERS, f.nbytes)

    def grad_ready(self, p) -> None:
        i = self.layer_of[p]
        self.missing[i] -= 1
        if self.missing[i] == 0:
            f = self.flats[i]
            name = layer_collective(REDUCE_SCATTER, i)
            self.reductions[i] = self.reduce_scatter(self.grad_shards[i], f.grad, name, i)
            self.release(i)

    def step(self) -> None:
        for i in reversed(range(self.n_layers)):
            self.reductions.pop(i).wait()
            f = self.flats[i]
            free(f.grad)
            self.rec.add_memory(BUFFERS, -f.nbytes)
            with self.rec.span(opt(i), i, self.shards[i].nbytes):
                self.adam[i].update(self.shards[i], self.grad_shards[i])

    # --- reading state back ------------------------------------------------------------

    def full_params(self) -> dict[str, torch.Tensor]:
        out = {}
        for f, whole in zip(self.flats, gather_flat_chunks(self.flats, self.shards), strict=True):
            out.update({self.names[p]: t for p, t in f.read(whole).items()})
        return out

    def full_optimizer_state(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return self.gathered_moments()

    def model_state_bytes(self) -> dict[str, int]:
        return model_state_bytes(
            params=sum(s.nbytes for s in self.shards),
            grads=sum(g.nbytes for g in self.grad_shards),
            optimizer=sum(a.nbytes for a in self.adam),
        )
