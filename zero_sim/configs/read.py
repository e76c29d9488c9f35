"""Which configuration file a simulation was given, read by its reader.

``simulate()`` takes at most one of ``deepspeed_config``, ``fsdp_config`` and
``torchtitan_config``; :func:`read_config` reads it and overlays the settings given beside it.
A peft adapter configuration (``peft_config``) says only what trains, so it may go beside one:
its settings come first, the run's file and the flags given over them.
"""

from __future__ import annotations

from typing import Any

from zero_sim.configs import ConfigError, ConfigReading, merge
from zero_sim.configs.deepspeed import read_deepspeed
from zero_sim.configs.fsdp import read_fsdp
from zero_sim.configs.peft import read_peft
from zero_sim.configs.torchtitan import read_torchtitan

READERS = {"deepspeed_config": read_deepspeed, "fsdp_config": read_fsdp, "torchtitan_config": read_torchtitan}


def read_config(kwargs: dict[str, Any]) -> tuple[ConfigReading | None, dict[str, Any]]:
    """The reading of the one configuration in ``kwargs`` (or None), and the settings to simulate."""
    adapters = None
    if kwargs.get("peft_config") is not None:
        adapters = read_peft(kwargs["peft_config"])
        kwargs = merge(adapters, {k: v for k, v in kwargs.items() if k != "peft_config"})
    given = [key for key in READERS if kwargs.get(key) is not None]
    if not given:
        return adapters, kwargs
    if len(given) > 1:
        flags = " and ".join("--" + key.replace("_", "-") for key in given)
        raise ConfigError(f"{flags} each describe the whole run; give only one")
    rest = {k: v for k, v in kwargs.items() if k not in READERS}
    reading = READERS[given[0]](kwargs[given[0]])
    settings = merge(reading, rest)
    if adapters is not None:
        reading.notes += adapters.notes
    return reading, settings
