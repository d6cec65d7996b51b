"""Tests of the one-run engine (:mod:`ablate.sweeps.engine`), one file per module it tests."""
