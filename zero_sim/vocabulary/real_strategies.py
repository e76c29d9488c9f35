"""The real runs' strategies (``real_runs.strategies``) as the simulator knows them: the simulated
strategy and knobs each is replayed as, which keep gradient buckets, which the validation samples,
and which cannot fine-tune with LoRA.

Declared once here, in the shared vocabulary, so that the bridge (``sim2real``), the calibration
and the real runs read the same table rather than each listing names of its own.  Each real
implementation maps to the simulated strategy and knobs that describe what it does; where they
differ, the third field says how.
"""

from __future__ import annotations

# The hand-written FSDP's schedule (real_runs.strategies.fsdp), as the simulated fsdp's knobs.
FSDP_KNOBS = {"wrap": "blocks", "root": "per_layer", "reshard_after_forward": True,
              "backward_prefetch": "pre", "forward_prefetch": True, "limit_all_gathers": False,
              "update": "per_unit", "copies": "none"}

# real strategy -> (simulated strategy, knobs, what the mapping leaves out)
REAL_TO_SIM: dict[str, tuple[str, dict, str]] = {
    "ddp": ("ddp", {"gradient_as_bucket_view": True}, ""),
    "ddp-torch": ("ddp", {"gradient_as_bucket_view": True}, "torch DDP with gradient_as_bucket_view=True"),
    "zero1": ("zero1", {"zero1_reduce": "all_reduce"}, "the real ZeRO-1 all-reduces whole buckets (3 Psi)"),
    "zero2": ("zero2", {"zero2_launch": "hook"}, ""),
    "zero2-step": ("zero2", {"zero2_launch": "step", "bucket_mb": 0.0}, ""),
    "zero2-hook": ("zero2", {"zero2_launch": "hook", "bucket_mb": 0.0}, ""),
    "fsdp": ("fsdp", FSDP_KNOBS,
             "the real FSDP keeps embeddings and head gathered from forward to backward, as FSDP's root "
             "unit, but as two flat buffers, each padded, gathered and reduced on its own"),
    "fsdp-qwz": ("fsdp", FSDP_KNOBS,
                 "the real run gathers int8 weights and a scale per 4,096 (a quarter of fp32's bytes, a half "
                 "of bf16's); the simulated fsdp gathers them in their own precision"),
    "fsdp-torch": ("fsdp", {"wrap": "blocks", "reshard_after_forward": True, "copies": "fsdp2"},
                   "FSDP2's collectives are not recorded in the real run, only its compute"),
}
# The real strategies whose gradients travel in buckets of a size the run sets (--bucket-mb).
BUCKETED_REAL = ("ddp", "ddp-torch", "zero1", "zero2")
# The real strategies the validation samples: every one that records its collectives.
SAMPLED_STRATEGIES = ("ddp", "ddp-torch", "zero1", "zero2", "zero2-step", "zero2-hook", "fsdp")
# Real strategies that cannot train with frozen weights, and why (one sentence each).
NO_LORA = {"fsdp-qwz": "fsdp-qwz gathers int8 shards of every weight and has no frozen-weight layout yet; "
                       "fine-tune with LoRA under fsdp instead."}
