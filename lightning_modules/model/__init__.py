"""The model layer: blocks (components/), the encoder built from a ModelConfig, heads, the classifier
with FastBERT's exits. Built from config only; measuring lives a layer up
(:mod:`ablate.lightning_modules.measure`)."""
