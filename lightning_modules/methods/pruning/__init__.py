"""schuBERT: per-layer dimensions found by pruning a trained encoder with learned gates."""
