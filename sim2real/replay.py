"""The simulator scenario that stands for a real run: same model, ranks, batch, strategy, links.

A run directory written by ``real_runs.train`` says what was trained (``run.json``); this
module turns that into :func:`zero_sim.scenario.simulate` keywords, so a prediction can
be made *before* looking at any measured time.  Nothing measured in the run is read
here except its configuration.

The pieces, each a deliberate choice:

* **workload**: the real model's own layers, read off ``real_runs.model`` on the meta
  device (:func:`sim2real.module_workload.workload_from_module`): exact parameter counts per
  layer (the real lm head is untied), FLOPs, saved-activation bytes.  Layer kinds are
  labelled ``embedding`` / ``block`` / ``head`` so per-kind calibrated times apply.
* **precision**: the run's (``run.json`` ``precision``; fp32 for runs written before it):
  fp32 is the simulator's ``fp32`` (b = 4, K = 8), bf16 its ``mixed`` (b = 2, K = 12).
* **fine-tuning**: a LoRA run (``run.json`` ``lora_rank``, ``lora_targets``: the simulator's short
  names) is simulated with the same ``lora_rank`` and ``lora_targets``, so the same weights freeze
  and the same adapters train (:mod:`zero_sim.system.lora`); the workload read off the module is
  given the real GPT's shape, which names the projections the adapters sit beside.
* **strategy**: each real implementation maps to the simulated strategy and knobs that
  describe what it does (:data:`zero_sim.vocabulary.real_strategies.REAL_TO_SIM`).  Where they
  differ, the mapping says so.
* **machine**: a CPU run is ``gpu=CPU``, ``backend=gloo``; the topology is the emulated
  cluster's when the run has a ``cluster`` block, else ``cpu-gloo`` (loopback).  A CUDA run
  is ``backend=nccl`` on the GPU preset its stamp names (``run.json`` ``gpu.name``, see
  :mod:`zero_sim.system.device_names`), on one node: PCIe when its recorded
  ``nvidia-smi topo -m`` shows no NVLink, else the NVSwitch box of that GPU generation.
  Without a calibration its compute is the preset's per-op model: each layer also carries
  the GPU model's split of its work by kernel kind and the workload the GPT shape whose
  launches the host issues (:func:`real_shape_workload`), as a preset model would.
"""

from __future__ import annotations

from dataclasses import replace

from real_runs.precision import precision_of_run
from real_runs.presets import GPTConfig
from zero_sim.scenario import simulate
from zero_sim.system.device_names import node_topology, preset_for_device
from zero_sim.system.gpt_layers import GPTShape, gpt_workload
from zero_sim.system.lora import DEFAULT_TARGETS
from zero_sim.system.workload import Layer, Workload
from zero_sim.vocabulary.buckets import DEFAULT_BUCKET_MB
from zero_sim.vocabulary.real_strategies import BUCKETED_REAL, REAL_TO_SIM

# Emulated cluster shape (real_runs.cluster) -> topology preset that models it.
CLUSTER_TOPOLOGY = {"uniform": "emu-uniform", "two-nodes": "emu-two-nodes", "shared-bus": "emu-shared-bus"}


class ReplayError(ValueError):
    """A run that cannot be replayed; the message is one sentence saying why."""


def real_workload(model_config: dict, micro_batch: int, seq_len: int, name: str = "real",
                  per_op: bool = False) -> Workload:
    """The real GPT (``real_runs.model``) as a simulator workload, read on the meta device.

    ``per_op``: also give each layer the GPU model's split of its work by kernel kind (matrix
    products, attention, the eager element-wise chains, the fp32 loss) and the workload its GPT
    shape, from which the host's launches are counted, as for a preset model; the tensors and
    activations stay the ones read off the module.  GPU replays want it: FLOPs alone leave out
    the memory-bound kernels and the host that launches them, and price a small model on a fast
    GPU several times too fast."""
    # torch only here: replaying a run's workload builds its model on the meta device, and
    # nothing else in the bridge needs torch to be loaded.
    import torch

    from real_runs.model import GPT, GPTConfig
    from sim2real.module_workload import workload_from_module

    cfg = GPTConfig(**model_config)
    with torch.device("meta"):
        model = GPT(cfg)

    class _Inputs(torch.nn.Module):
        """The real model takes (tokens, targets); the workload reader feeds one tensor."""

        def __init__(self, gpt):
            super().__init__()
            self.gpt = gpt

        def forward(self, idx):
            return self.gpt(idx, idx)

    example = torch.zeros(micro_batch, seq_len, dtype=torch.long, device="meta")
    w = workload_from_module(_Inputs(model), example, layers=list(model.layers), name=name,
                             micro_batch=micro_batch)
    last = len(w.layers) - 1
    kinds = ["embedding" if i == 0 else "head" if i == last else "block" for i in range(len(w.layers))]
    shaped = real_shape_workload(cfg, micro_batch, seq_len) if per_op else None
    layers = tuple(Layer(lay.index, kind, lay.tensors, lay.fwd_flops, lay.activation_bytes,
                         lay.checkpointed_activation_bytes,
                         work=shaped.layers[lay.index].work if shaped else None)
                   for lay, kind in zip(w.layers, kinds, strict=True))
    if shaped is None:
        return Workload(w.name, layers, w.seq_len, w.micro_batch, w.recompute)
    return Workload(w.name, layers, w.seq_len, w.micro_batch, w.recompute, shaped.shape, shaped.attention,
                    shaped.elementwise)


def real_shape(cfg, seq_len: int) -> GPTShape:
    """The real GPT as the simulator's GPT shape: pre-norm LayerNorm blocks, a 4x GELU MLP, learned
    positions, an untied head, no dropout, as ``real_runs.model`` writes them (its qkv projection has
    no bias, a 0.02% difference in size)."""
    return GPTShape(cfg.n_layer, cfg.d_model, cfg.n_head, cfg.vocab, seq_len, tied=False, dropout=False)


def real_shape_workload(cfg, micro_batch: int, seq_len: int) -> Workload:
    """The real GPT's shape (:func:`real_shape`) as a simulator workload, with SDPA attention and eager
    element-wise ops, as ``real_runs.model`` runs them."""
    return gpt_workload(real_shape(cfg, seq_len), micro_batch, seq_len, name="real", attention="flash",
                        elementwise="eager")


def scenario_for_run(run: dict, calibration=None) -> tuple[dict, Workload]:
    """``simulate`` keywords and the workload for a real run's ``run.json``."""
    try:
        strategy, world, gb = run["strategy"], int(run["world_size"]), int(run["global_batch"])
        seq_len, cfg = int(run["seq_len"]), dict(run["model_config"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplayError(f"run.json lacks the field {exc}; it was not written by real_runs.train") from None
    if strategy not in REAL_TO_SIM:
        raise ReplayError(f"unknown real strategy {strategy!r}; expected one of {', '.join(REAL_TO_SIM)}")
    sim_strategy, knobs, _ = REAL_TO_SIM[strategy]
    knobs = dict(knobs)
    if strategy in BUCKETED_REAL:
        knobs["bucket_mb"] = float(run.get("bucket_mb", DEFAULT_BUCKET_MB))
    micro = gb // world
    cluster = run.get("cluster")
    kw = dict(strategy=sim_strategy, gpus=world, precision=precision_of_run(run).simulator,
              micro_batch=micro, seq_len=seq_len, grad_accum=1, steps=3, explicit_ranks=True, **knobs)
    if run.get("device", "cpu") != "cpu":
        kw.update(gpu_machine(run, world))
    elif cluster:
        kind = cluster.get("kind")
        if kind not in CLUSTER_TOPOLOGY:
            raise ReplayError(f"the run's emulated cluster shape {kind!r} is unknown; "
                              f"expected one of {', '.join(CLUSTER_TOPOLOGY)}")
        kw.update(gpu="CPU", backend="gloo", topology=CLUSTER_TOPOLOGY[kind])
        kw["bandwidth_gbps"] = float(cluster["bandwidth_gbps"])
        if kind == "two-nodes":
            kw["gpus_per_node"] = world // 2
        elif kind == "uniform":
            kw["gpus_per_node"] = 1
    else:
        kw.update(gpu="CPU", backend="gloo", topology="cpu-gloo")
    if calibration is not None:
        kw["calibration"] = calibration
    name = f"{run.get('model', 'real')} (real_runs)"
    workload = real_workload(cfg, micro, seq_len, name, per_op=run.get("device", "cpu") != "cpu")
    if run.get("lora_rank") is not None:
        kw.update(lora_rank=int(run["lora_rank"]), lora_targets=run.get("lora_targets") or DEFAULT_TARGETS)
        if workload.shape is None:  # read off the module: LoRA needs the shape to find the projections
            workload = replace(workload, shape=real_shape(GPTConfig(**cfg), seq_len))
    return kw, workload


def gpu_machine(run: dict, world: int) -> dict:
    """``simulate`` keywords for the GPUs a CUDA run's stamp names (module docstring)."""
    stamp = run.get("gpu") or {}
    name = stamp.get("name")
    if not name:
        raise ReplayError("this CUDA run's run.json does not say which GPU it ran on (no 'gpu' stamp); "
                          "record it again with this version of real_runs.train")
    preset = preset_for_device(name)
    if preset is None:
        raise ReplayError(f"no GPU preset models a {name!r}; add its figures to zero_sim/system/gpus.py "
                          f"and a rule to zero_sim/system/device_names.py")
    topology = node_topology(preset, stamp.get("topology"))
    if topology is None and stamp.get("topology") is None:
        raise ReplayError(f"the run does not say how its {world} x {preset} are linked and no NVSwitch "
                          f"preset has {preset}s; record it with nvidia-smi on the path so its links are "
                          f"stamped")
    if topology is None:
        raise ReplayError(f"no topology preset has {preset}s linked by NVLink; simulate the run with "
                          f"zero-sim simulate --topology and a calibration measured on the box")
    return dict(gpu=preset, backend="nccl", topology=topology, gpus_per_node=world)


def predict_run(run: dict, calibration=None):
    """Simulate the scenario of a real run (see :func:`scenario_for_run`); a SimResult."""
    kw, workload = scenario_for_run(run, calibration)
    return simulate(workload=workload, **kw)
