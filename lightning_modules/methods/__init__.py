"""The methods layer: one training path (TrainModule) and what configures it (pre-training,
distillation, fine-tuning, pruning, quantization, losses, the loop's callbacks). Uses config and model."""
