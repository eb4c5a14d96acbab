"""Preprocessing: a model's processors by ``preprocess.type`` (``processors.PROCESSORS``)."""
