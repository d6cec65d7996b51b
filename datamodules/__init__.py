"""Data pipeline: corpora, tokenizer, segment pairs, masking and the DataModules.

Modules (imported explicitly, so ``import datamodules`` stays cheap):

* :mod:`datamodules.sources` resolves ``data.corpus`` (builtin, local files, hub name);
* :mod:`datamodules.corpus` streams documents, split train/validation by hash and
  sharded across DDP ranks and DataLoader workers;
* :mod:`datamodules.tokenizer` trains and caches the WordPiece tokenizer;
* :mod:`datamodules.pairs` builds SOP/NSP segment pairs;
* :mod:`datamodules.masking` does dynamic token / whole-word / n-gram masking;
* :mod:`datamodules.stream` turns documents into masked, padded batches;
* :mod:`datamodules.pretrain` holds :class:`PretrainDataModule`.
"""
