"""Postprocessing role: raw outputs in shared memory -> packed answers, through each model's chain of ops."""
