"""What the machine and the model are: the workload's layers (:mod:`.workload`), the GPU's
compute (:mod:`.hardware`), links and their sharing (:mod:`.topology`), and what a
collective costs on them (:mod:`.collectives`)."""
