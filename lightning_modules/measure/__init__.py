"""The measuring layer, between the model and the methods: counted cost (parameters, FLOPs, bytes),
latency, activation memory, the reference workload timed beside them, and FastBERT's early exit
measured. It reads models built by :mod:`ablate.lightning_modules.model`; nothing in the model
layer imports it."""
