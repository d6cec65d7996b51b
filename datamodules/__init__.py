"""Data pipeline: corpora and their sources, the data catalog, the tokenizer, segment pairs,
masking, and the DataModules of pre-training and of fine-tuning tasks. Its modules are imported
explicitly, so ``import datamodules`` stays cheap (docs/data.md)."""
