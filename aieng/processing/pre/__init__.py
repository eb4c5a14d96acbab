"""Preprocessing: the processors by ``preprocess.type`` (``processors.PROCESSORS``: ``text``, ``image``,
``tabular``, ``tensor``; drift facts in ``features``) and request reading (``request.read_request``)."""
