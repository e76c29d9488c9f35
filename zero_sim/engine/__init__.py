"""The simpy engine: ranks with a host thread and FIFO streams (:mod:`.engine`), the
per-rank program of ops they run (:mod:`.program`), and the fluid network their
collectives share (:mod:`.network`)."""
