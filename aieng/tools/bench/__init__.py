"""``aieng bench``: the server beside the in-process limit and a plain baseline (``run``), and its variants:
front doors (``transports``), tracing's cost (``tracing``), page models (``ocr``, ``layout``, ``pages``);
``limit`` measures in process, ``kit`` starts and stops what is measured."""
