"""Benchmarks, run on demand with ``ablate bench`` (never in the test suite).

- :mod:`benchmarks.train_speed`: ablate's training step against Hugging Face transformers'
  ``*ForPreTraining`` at the same configuration, same weights and same batches, alternated
  in one process.
- :mod:`benchmarks.data_speed`: the data pipeline's tokens/s per worker and the memory of
  streaming one shard against many.
- :mod:`benchmarks.sweep_pruning`: the wall time Optuna pruning saves on a 12-trial study.
"""
