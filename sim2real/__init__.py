"""The bridge between the simulator and the real runs: what needs both halves.

- :mod:`sim2real.measure`: calibrate this machine by launching ``real_runs.microbench``;
- :mod:`sim2real.replay`: the simulator scenario that stands for a real run;
- :mod:`sim2real.overlay`: load a run directory and compare measured with predicted;
- :mod:`sim2real.validate`: predict a grid of cases, run them, report the error;
- :mod:`sim2real.panels`: notebook panels that run real things;
- :mod:`sim2real.cli`: the ``zero-sim`` command, the simulator's subcommands plus these.
"""
