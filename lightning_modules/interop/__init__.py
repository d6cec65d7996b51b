"""The interop layer: Hugging Face transformers checkpoints in and out (pre-trained models, fine-tuned
classifiers, the weight maps between them, exports with model cards)."""
