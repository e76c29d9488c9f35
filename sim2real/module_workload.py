"""A simulator workload read off a ``torch.nn.Module``: the bridge from any torch model to
:class:`zero_sim.system.workload.Workload`.

Run on the meta device, nothing is allocated: parameter counts come from each layer's
parameters (a tied weight belongs to the first layer that owns it), forward FLOPs from
torch's ``FlopCounterMode``, and saved-activation bytes from the tensors autograd saves
(``saved_tensors_hooks``) while each layer runs forward.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from zero_sim.system.workload import Layer, Tensor, Workload, WorkloadError


def _default_layers(module) -> list:
    """The module's children, with ``ModuleList`` / ``Sequential`` children expanded."""
    layers = []
    for child in module.children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
            layers.extend(child.children())
        else:
            layers.append(child)
    return layers


def _forward_measured(module, example_input, layers: list) -> tuple[dict[int, int], dict]:
    """Run one forward: the bytes each layer saves for backward (a saved-tensors hook charges
    each saved tensor to the innermost layer running), and FlopCounterMode's counts by module."""
    saved: dict[int, int] = {i: 0 for i in range(len(layers))}
    current: list[int] = []

    def pack(t):
        if current:
            saved[current[-1]] += t.numel() * t.element_size()
        return t

    def enter(i):
        def hook(module, args):
            current.append(i)  # returning None keeps the inputs as they are
        return hook

    def leave(module, args, output):
        current.pop()  # returning None keeps the output as it is

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(enter(i)))
        handles.append(layer.register_forward_hook(leave))
    flop_counter = FlopCounterMode(display=False)
    try:
        with flop_counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            module(example_input)
    finally:
        for h in handles:
            h.remove()
    return saved, flop_counter.get_flop_counts()


def workload_from_module(module, example_input, *, layers=None, name: str | None = None,
                         micro_batch: int | None = None, recompute: str = "none") -> Workload:
    """Read a workload off a ``torch.nn.Module`` (ideally on the meta device, so nothing is allocated).

    ``layers`` lists the child modules that are layers, in forward order; by default the
    module's children are used, with ``ModuleList`` / ``Sequential`` children expanded.
    ``example_input`` is one micro-batch (e.g. ``torch.empty(b, s, dtype=torch.long, device='meta')``).
    FLOPs come from ``torch.utils.flop_counter.FlopCounterMode``; saved-activation bytes
    from ``torch.autograd.graph.saved_tensors_hooks`` while each layer runs forward.
    """
    layers = list(layers) if layers is not None else _default_layers(module)
    if not layers:
        raise WorkloadError("the module has no child layers to simulate; pass layers=[...] explicitly")
    saved, flops_by_module = _forward_measured(module, example_input, layers)
    # FlopCounterMode names modules "<RootClass>.<path>" (e.g. "GPT.blocks.0").
    root = type(module).__name__
    names = {id(m): (f"{root}.{n}" if n else root) for n, m in module.named_modules()}
    result = []
    seen: set[int] = set()
    for i, layer in enumerate(layers):
        tensors = []
        for pname, p in layer.named_parameters():
            if id(p) in seen:  # tied weights belong to the first layer that owns them
                continue
            seen.add(id(p))
            tensors.append(Tensor(pname, p.numel()))
        fqn = names.get(id(layer), "")
        flops = float(sum(flops_by_module.get(fqn, {}).values())) if fqn else 0.0
        # FlopCounterMode counts forward and backward together only when backward runs; here
        # only forward ran, so this is forward FLOPs.
        result.append(Layer(i, "module", tuple(tensors), flops, saved[i], saved[i]))
    shape_s = example_input.shape[-1] if example_input.dim() > 1 else 1
    mb = micro_batch if micro_batch is not None else int(example_input.shape[0])
    return Workload(name or type(module).__name__, tuple(result), int(shape_s), mb, recompute)
