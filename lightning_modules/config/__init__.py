"""The config layer: frozen, validated dataclasses (ExperimentConfig and its sections), presets, the
YAML dialect, the metric names runs log, the errors a user can cause. Imports nothing above it, and
no torch."""
