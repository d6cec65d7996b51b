"""Quantization of a built model (``quant`` section): which layers, how (torch.ao / torchao),
what it stores (:func:`~.apply.stored_bytes`) and Q-BERT's mixed precision by sensitivity."""
