"""How sure a prediction is: the intervals printed beside the simulator's headline figures.

* :mod:`~zero_sim.intervals.speed`: the fields and the line of the 80% speed interval, MFU;
* :mod:`~zero_sim.intervals.sampling`: how that interval is propagated, each uncertain input's
  spread (:mod:`zero_sim.system.input_spreads`) sampled through a re-timing of the simulated step;
* :mod:`~zero_sim.intervals.memory`: reserved memory's 80% interval and the verdict it gives
  (fits, tight, does not fit), from the published memory points.

Nothing is imported here, so each piece loads only what it needs.
"""
