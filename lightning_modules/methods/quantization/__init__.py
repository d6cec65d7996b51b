"""Quantization of a built model (``quant`` section): which layers, how (torch.ao / torchao),
what it stores (:func:`~ablate.lightning_modules.measure.accounting.stored_bytes`) and Q-BERT's mixed
precision by sensitivity."""
