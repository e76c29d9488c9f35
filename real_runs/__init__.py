"""Real training runs under each strategy, recorded in the simulator's vocabulary.

- :mod:`real_runs.model`: a small GPT with simulator-numbered layers, and synthetic data;
- :mod:`real_runs.strategies`: one file per strategy (``ddp``, ``zero1``, ``zero2`` and
  its ``-step``/``-hook`` variants, ``fsdp``, ``fsdp-qwz`` with int8 weight gathers) beside
  torch's own DDP and FSDP2;
- :mod:`real_runs.lora`: LoRA fine-tuning, frozen weights and trainable adapters
  (:mod:`real_runs.lora_targets` names where they go);
- :mod:`real_runs.record`: per-rank op and memory records;
- :mod:`real_runs.train`: the ``torchrun`` entry point;
- :mod:`real_runs.launch`: start a run from Python and get its ``run.json``.
"""
