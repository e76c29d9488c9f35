"""Which configuration file a simulation was given, read by its reader.

``simulate()`` takes at most one of ``deepspeed_config``, ``fsdp_config`` and
``torchtitan_config``; :func:`read_config` reads it and overlays the settings given beside it.
"""

from __future__ import annotations

from typing import Any

from zero_sim.configs import ConfigError, ConfigReading, merge
from zero_sim.configs.deepspeed import read_deepspeed
from zero_sim.configs.fsdp import read_fsdp
from zero_sim.configs.torchtitan import read_torchtitan

READERS = {"deepspeed_config": read_deepspeed, "fsdp_config": read_fsdp, "torchtitan_config": read_torchtitan}


def read_config(kwargs: dict[str, Any]) -> tuple[ConfigReading | None, dict[str, Any]]:
    """The reading of the one configuration in ``kwargs`` (or None), and the settings to simulate."""
    given = [key for key in READERS if kwargs.get(key) is not None]
    if not given:
        return None, kwargs
    if len(given) > 1:
        flags = " and ".join("--" + key.replace("_", "-") for key in given)
        raise ConfigError(f"{flags} each describe the whole run; give only one")
    rest = {k: v for k, v in kwargs.items() if k not in READERS}
    reading = READERS[given[0]](kwargs[given[0]])
    return reading, merge(reading, rest)
