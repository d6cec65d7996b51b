"""The model layer: blocks (components/), the encoder built from a ModelConfig, heads, the classifier
with FastBERT's exits, the accounting of parameters, FLOPs, bytes and latency. Built from config only."""
