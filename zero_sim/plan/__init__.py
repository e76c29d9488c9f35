"""Planning: which configuration to run, searched by simulating candidates.

* :mod:`~zero_sim.plan.planner`: the candidates (each strategy at its defaults and with each
  main knob changed) and ``plan()``, which simulates and ranks them;
* :mod:`~zero_sim.plan.bounds`: a candidate's memory and throughput bounds, milliseconds each;
* :mod:`~zero_sim.plan.search`: the bounded search ``zero-sim plan`` runs;
* :mod:`~zero_sim.plan.fit_advice`: what would fit when a scenario does not;
* :mod:`~zero_sim.plan.sweep` and :mod:`~zero_sim.plan.executors`: many scenarios at once, here
  or on an executor;
* :mod:`~zero_sim.plan.cli`: ``zero-sim plan``.

Nothing is imported here, so a caller that needs only one piece loads only what it needs.
"""
