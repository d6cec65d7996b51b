"""Data pipeline: corpora, tokenizer, segment pairs, masking and the DataModules.

Modules (imported explicitly, so ``import datamodules`` stays cheap):

* :mod:`ablate.datamodules.sources` resolves ``data.corpus`` (builtin, local files, hub name);
* :mod:`ablate.datamodules.corpus` streams documents, split train/validation by hash and
  sharded across DDP ranks and DataLoader workers;
* :mod:`ablate.datamodules.tokenizer` trains and caches the WordPiece tokenizer;
* :mod:`ablate.datamodules.pairs` builds SOP/NSP segment pairs;
* :mod:`ablate.datamodules.masking` does dynamic token / whole-word / n-gram masking;
* :mod:`ablate.datamodules.stream` turns documents into masked, padded batches;
* :mod:`ablate.datamodules.pretrain` holds :class:`PretrainDataModule`.
"""
